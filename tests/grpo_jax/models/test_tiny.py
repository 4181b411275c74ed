"""The embedded default checkpoint (models/tiny.py)."""

import jax
import numpy as np
import pytest
import torch
import transformers

from grpo_jax import models


def test_build_default_checkpoint_loads_everywhere(tmp_path):
  path = models.build_default_checkpoint(tmp_path / "tiny", seed=3, hidden_size=64, num_hidden_layers=2)
  names = {p.name for p in path.iterdir()}
  assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
  params, config = models.load_hf(path)
  assert config == models.tiny_config(hidden_size=64, num_hidden_layers=2)
  assert config.model_type == "qwen2" and config.tie_word_embeddings and config.vocab_size == 101
  assert 50_000 < sum(x.size for x in jax.tree.leaves(params)) < 5_000_000
  tok = models.load_tokenizer(path)
  assert tok.eos_token_id in config.eos_token_ids and tok.pad_token_id == config.pad_token_id
  # Plain AutoTokenizer picks Qwen2Tokenizer from config.json (transformers 5) and must agree.
  auto = transformers.AutoTokenizer.from_pretrained(path)
  text = "Hi there,\n  x = 1 + 2 <|im_end|>!"
  assert auto(text)["input_ids"] == tok(text)["input_ids"]
  assert len(tok(text)["input_ids"]) == len(text) - len("<|im_end|>") + 1
  assert auto.decode(auto(text)["input_ids"]) == text
  assert (auto.eos_token_id, auto.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
  # Same weights as init_params with the seed, and transformers reads the same model.
  ref = models.init_params(config, jax.random.key(3))
  np.testing.assert_array_equal(params["layers_1"]["mlp"]["up_proj"]["kernel"],
                                ref["layers_1"]["mlp"]["up_proj"]["kernel"])
  hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
  tokens = np.asarray(tok(["hello world", "abc"], padding=True)["input_ids"])[:1]
  with torch.no_grad():
    hf_logits = hf(torch.tensor(tokens)).logits.numpy()
  logits, _ = models.apply(params, config, tokens)
  np.testing.assert_allclose(logits, hf_logits, atol=1e-4)


def test_idempotent_and_refuses_other_configs(tmp_path):
  path = models.build_default_checkpoint(tmp_path / "tiny", hidden_size=64)
  stamp = (path / "model.safetensors").stat().st_mtime_ns
  models.build_default_checkpoint(path, hidden_size=64)
  assert (path / "model.safetensors").stat().st_mtime_ns == stamp
  with pytest.raises(models.CheckpointError, match="different config"):
    models.build_default_checkpoint(path, hidden_size=32)
  (tmp_path / "junk").mkdir()
  (tmp_path / "junk" / "notes.txt").write_text("x")
  with pytest.raises(models.CheckpointError, match="not a valid checkpoint"):
    models.build_default_checkpoint(tmp_path / "junk")
  assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
