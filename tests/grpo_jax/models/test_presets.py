"""grpo_jax.models.presets: the named shapes against the models' published parameter counts, worked by hand."""

import jax
import pytest

from grpo_jax import models
from grpo_jax.models import presets


def _params(config: models.ModelConfig) -> int:
  return sum(x.size for x in jax.tree.leaves(jax.eval_shape(models.init_params, config, jax.random.key(0))))


def test_parameter_counts_are_the_published_ones():
  # Qwen2.5-0.5B: embeddings 151936·896 (tied) + 24 layers of q 896·896+896, k and v 896·128+128, o 896·896,
  # MLP 3·896·4864, two norms 2·896 (14,912,384 a layer) + the final norm: 494,032,768 (the model card's 0.49B).
  assert _params(presets.config("qwen2.5-0.5b")) == 151_936 * 896 + 24 * 14_912_384 + 896 == 494_032_768
  # Qwen2.5-7B: untied embeddings 2·152064·3584 + 28 layers of q 3584·3584+3584, k and v 3584·512+512,
  # o 3584·3584, MLP 3·3584·18944, norms 2·3584 (233,057,792 a layer) + 3584: 7,615,616,512 (7.61B).
  assert _params(presets.config("qwen2.5-7b")) == 2 * 152_064 * 3584 + 28 * 233_057_792 + 3584 == 7_615_616_512
  # DeepSeekMath-7B (Llama-shaped, no biases): 2·102400·4096 + 30 layers of 4·4096² + 3·4096·11008 + 2·4096
  # (202,383,360 a layer) + 4096: 6,910,365,696 (6.9B).
  assert _params(presets.config("deepseek-math-7b")) == 2 * 102_400 * 4096 + 30 * 202_383_360 + 4096
  assert presets.config("qwen2.5-1.5b").hidden_size == 1536


def test_runtime_keywords_and_sizes():
  config = presets.config("qwen2.5-0.5b", dtype="bfloat16", scan_layers=True)
  assert config.dtype == "bfloat16" and config.scan_layers and config.rope_theta == 1e6 and config.qkv_bias
  for name in presets.PRESETS:  # the benchmarks' model: the preset's arrays over the character tokenizer's ids
    sized = models.tiny_config(**presets.sizes(name))
    shapes = lambda c: jax.tree.map(lambda x: x.shape, jax.eval_shape(models.init_params, c, jax.random.key(0)))
    assert shapes(sized) == shapes(presets.config(name)), name
  with pytest.raises(KeyError, match="unknown model preset 'qwen9' \\(known: qwen2.5-0.5b, "):
    presets.config("qwen9")
