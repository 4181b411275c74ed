"""Held-out generation in batches (grpo_jax/evaluation/generate.py)."""

import jax
import numpy as np

from grpo_jax import evaluation
from grpo_jax import models


def test_prompt_chunks_generate_the_same_completions(tmp_path):
  """6 prompts in batches of 4 (the last one padded), 2 samples each, sampled: the sampler taking each batch 2
  prompts at a time (`prompt_chunk`) gives the same texts and lengths as all 4 at once."""
  path = models.build_default_checkpoint(tmp_path / "model", seed=0, num_hidden_layers=1, hidden_size=32,
                                         intermediate_size=64)
  params, config = models.load_hf(path)
  params = jax.tree.map(lambda x: 4.0 * x if x.ndim > 1 else x, params)  # peaked, varied distributions
  tokenizer = models.load_tokenizer(path)
  prompts = ["1+2=", "3*4=", "9-5=", "12+7=", "2*2*2=", "8-1="]
  kwargs = dict(batch_size=4, max_prompt_len=8, max_new_tokens=6, num_samples=2, temperature=1.0)
  whole = evaluation.generate(params, config, tokenizer, prompts, jax.random.key(1), **kwargs)
  chunked = evaluation.generate(params, config, tokenizer, prompts, jax.random.key(1), prompt_chunk=2, **kwargs)
  assert chunked[0] == whole[0] and len(whole[0]) == 6 and all(len(t) == 2 for t in whole[0])
  np.testing.assert_array_equal(chunked[1], whole[1])
  assert len({t for texts in whole[0] for t in texts}) > 3  # really sampled: the completions differ
