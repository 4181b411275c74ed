"""Parity of load_hf/apply with PyTorch transformers, save_hf round trip, and clear checkpoint errors."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from grpo_jax import models

_SIZES = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2)
_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16}
_CASES = {
    "qwen2_tied": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
                   dict(tie_word_embeddings=True, rope_theta=1e6)),
    "qwen3_untied_bias": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
                          dict(head_dim=16, tie_word_embeddings=False, attention_bias=True)),
    "llama3_untied": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                      dict(tie_word_embeddings=False, rope_theta=5e5, rope_scaling=_LLAMA3_ROPE)),
}


def _hf_model(name, seed=0):
  """A small random HF model; weights perturbed so that logits are O(1), not near-uniform."""
  config_cls, model_cls, extra = _CASES[name]
  torch.manual_seed(seed)
  model = model_cls(config_cls(**_SIZES, **extra)).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  return model


def _batch():
  tokens = np.random.RandomState(0).randint(0, _SIZES["vocab_size"], (3, 24))
  mask = np.ones(tokens.shape, bool)
  mask[1, :5] = False
  mask[2, :11] = False
  return tokens, mask


def _torch_logits(model, tokens, mask):
  positions = np.maximum(mask.cumsum(-1) - 1, 0)
  with torch.no_grad():
    return model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
                 position_ids=torch.tensor(positions)).logits.numpy()


def _assert_parity(model, params, config):
  tokens, mask = _batch()
  ref = _torch_logits(model, tokens, mask)
  logits, cache = models.apply(params, config, jnp.asarray(tokens), attention_mask=jnp.asarray(mask))
  assert cache is None
  assert logits.shape == ref.shape and logits.dtype == jnp.float32
  assert np.abs(ref).max() > 0.5  # Non-trivial logits, so the tolerance means something.
  np.testing.assert_array_less(np.abs(np.asarray(logits) - ref)[mask].max(), 1e-4)


@pytest.mark.parametrize("name", sorted(_CASES))
def test_logits_match_transformers(name, tmp_path):
  model = _hf_model(name)
  model.save_pretrained(tmp_path)
  params, config = models.load_hf(tmp_path)
  assert config.model_type == model.config.model_type
  assert config.tie_word_embeddings == model.config.tie_word_embeddings
  assert ("lm_head" in params) == (not config.tie_word_embeddings)
  _assert_parity(model, params, config)


def test_llama3_rope_frequencies_match_transformers():
  model = _hf_model("llama3_untied")
  config = models.ModelConfig.from_hf_dict(model.config.to_dict())
  assert config.rope_scaling == models.RopeScaling(8.0, 1.0, 4.0, 16)
  ref = model.model.rotary_emb.inv_freq.numpy()
  np.testing.assert_allclose(models.rope_inv_freq(config), ref, rtol=1e-6)
  plain = models.rope_inv_freq(config.replace(rope_scaling=None))
  assert np.abs(plain - ref).max() > 1e-3  # The scaling changes the low frequencies.


def test_sharded_checkpoint(tmp_path):
  model = _hf_model("qwen2_tied", seed=1)
  model.save_pretrained(tmp_path, max_shard_size="40KB")
  assert (tmp_path / "model.safetensors.index.json").is_file()
  assert len(list(tmp_path.glob("*.safetensors"))) > 1
  params, config = models.load_hf(tmp_path)
  _assert_parity(model, params, config)


@pytest.mark.parametrize("name", ["qwen2_tied", "llama3_untied"])
def test_save_hf_round_trip(name, tmp_path):
  model = _hf_model(name, seed=2)
  model.save_pretrained(tmp_path / "src")
  params, config = models.load_hf(tmp_path / "src")
  models.save_hf(params, config, tmp_path / "dst")
  with safetensors.safe_open(tmp_path / "dst" / "model.safetensors", framework="np") as f:
    names = set(f.keys())
    assert f.get_slice("model.layers.0.self_attn.q_proj.weight").get_shape() == [32, 32]
    assert f.get_slice("model.layers.0.self_attn.k_proj.weight").get_shape() == [16, 32]
  assert ("lm_head.weight" in names) == (not config.tie_word_embeddings)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dst").eval()
  tokens, mask = _batch()
  np.testing.assert_allclose(_torch_logits(reloaded, tokens, mask), _torch_logits(model, tokens, mask), atol=1e-6)
  params2, config2 = models.load_hf(tmp_path / "dst")
  assert config2 == config


def test_load_bfloat16_params(tmp_path):
  _hf_model("qwen2_tied").save_pretrained(tmp_path)
  params, config = models.load_hf(tmp_path, dtype="bfloat16")
  assert config.dtype == config.param_dtype == "bfloat16"
  assert params["embed"]["embedding"].dtype == jnp.bfloat16
  params, config = models.load_hf(tmp_path, dtype=jnp.float32, param_dtype=jnp.bfloat16)
  assert (config.dtype, config.param_dtype) == ("float32", "bfloat16")


def _assert_error(path, *fragments):
  with pytest.raises(models.CheckpointError) as info:
    models.load_hf(path)
  message = str(info.value)
  assert isinstance(info.value, ValueError) and "\n" not in message
  for fragment in fragments:
    assert fragment in message, message


def test_clear_errors(tmp_path):
  _assert_error(tmp_path / "nope", "does not exist", "nope")
  empty = tmp_path / "empty"
  empty.mkdir()
  _assert_error(empty, "missing config.json", "empty")

  good = tmp_path / "good"
  _hf_model("qwen2_tied").save_pretrained(good)
  config = json.loads((good / "config.json").read_text())

  def variant(name, config_changes=None, tensor_changes=None):
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps({**config, **(config_changes or {})}))
    if tensor_changes is not None:
      tensors = safetensors.numpy.load_file(good / "model.safetensors")
      tensor_changes(tensors)
      safetensors.numpy.save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path

  _assert_error(variant("gpt2", {"model_type": "gpt2"}), "unsupported architecture", "gpt2")
  _assert_error(variant("no_weights"), "no *.safetensors files", "no_weights")
  _assert_error(variant("missing", tensor_changes=lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
                "missing tensor model.layers.1.mlp.up_proj.weight")

  def misshape(t):
    t["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 32), np.float32)

  _assert_error(variant("misshaped", tensor_changes=misshape), "model.layers.0.self_attn.k_proj.weight",
                "(8, 32)", "(16, 32)")
  bad_json = tmp_path / "bad_json"
  bad_json.mkdir()
  (bad_json / "config.json").write_text("{")
  _assert_error(bad_json, "not valid JSON")
  with pytest.raises(models.CheckpointError, match="does not exist"):
    models.load_tokenizer(tmp_path / "nope")


@pytest.mark.parametrize("scan", [False, True])
def test_loading_holds_one_tensor_at_a_time_on_the_host(tmp_path, scan):
  """Host (NumPy) memory while loading, traced by tracemalloc (XLA's buffers and the file's mapped pages are not
  Python allocations): at most a few copies of the largest tensor at once, never the whole model again (a loader
  that kept the tensors it read, or upcast them to float32 on the host, holds at least the weights' bytes)."""
  import tracemalloc  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  config = models.tiny_config(hidden_size=128, intermediate_size=512, num_hidden_layers=8, vocab_size=2048,
                              tie_word_embeddings=False, param_dtype="bfloat16")
  models.save_hf(models.init_params(config, jax.random.key(0)), config, tmp_path)
  weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(jax.eval_shape(models.init_params, config,
                                                                                  jax.random.key(0))))
  largest = 2 * 2048 * 128  # bytes of the embedding (and of lm_head), bf16
  tracemalloc.start()
  try:
    params, _ = models.load_hf(tmp_path, dtype="bfloat16", scan_layers=scan)
    jax.block_until_ready(params)
    _, peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  assert weights > 8 * largest  # the bound below tells the two loaders apart
  assert peak < 3 * largest + 2**20


@pytest.mark.parametrize("scan", [False, True])
def test_bfloat16_save_load_is_bit_identical(tmp_path, scan):
  """save_hf writes bf16 params as bf16 (no float32 round trip), in either layout, and load_hf reads back the same
  bits; the file is one safetensors reads, with HF names and torch layouts."""
  import jax  # pylint: disable=import-outside-toplevel
  config = models.tiny_config(hidden_size=32, intermediate_size=48, num_hidden_layers=3, vocab_size=101,
                              tie_word_embeddings=False, param_dtype="bfloat16", scan_layers=scan)
  params = models.init_params(config, jax.random.key(1))
  models.save_hf(params, config, tmp_path)
  tensors = safetensors.numpy.load_file(tmp_path / "model.safetensors")
  assert {str(t.dtype) for t in tensors.values()} == {"bfloat16"}
  assert tensors["lm_head.weight"].shape == (101, 32) and tensors["model.layers.2.mlp.down_proj.weight"].shape == (
      32, 48)
  down = params["layers"]["mlp"]["down_proj"]["kernel"][2] if scan else params["layers_2"]["mlp"]["down_proj"]["kernel"]
  np.testing.assert_array_equal(tensors["model.layers.2.mlp.down_proj.weight"], np.asarray(down).T)
  loaded, loaded_config = models.load_hf(tmp_path, param_dtype="bfloat16", scan_layers=scan)
  assert loaded_config == config
  assert jax.tree.structure(loaded) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(params)):
    assert a.dtype == b.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))


@pytest.mark.parametrize("scan", [False, True])
def test_saving_holds_one_tensor_at_a_time_on_the_host(tmp_path, scan):
  """Host (NumPy) memory while writing, traced by tracemalloc: a few copies of the largest tensor, never the whole
  model (a writer that gathers every tensor before writing, or upcasts bf16 to float32, holds at least the
  weights' bytes)."""
  import tracemalloc  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  config = models.tiny_config(hidden_size=128, intermediate_size=512, num_hidden_layers=8, vocab_size=2048,
                              tie_word_embeddings=False, param_dtype="bfloat16", scan_layers=scan)
  params = models.init_params(config, jax.random.key(0))
  jax.block_until_ready(params)
  weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  largest = 2 * 2048 * 128  # bytes of the embedding (and of lm_head), bf16
  tracemalloc.start()
  try:
    models.save_hf(params, config, tmp_path)
    _, peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  assert (tmp_path / "model.safetensors").stat().st_size > weights
  assert weights > 8 * largest  # the bound below tells the two writers apart
  assert peak < 3 * largest + 2**20


@pytest.mark.devices(2)
@pytest.mark.parametrize("scan", [False, True])
def test_saving_leaves_no_host_copy_on_the_params(tmp_path, scan):
  """`np.asarray` of a jax array that must be copied to the host (off a GPU or TPU; here, sharded over two CPU
  devices) keeps that copy on the array (`_npy_value`) for as long as the array lives: an export that fetched the
  params directly would leave the whole model on the host. save_hf fetches through temporaries."""
  import jax  # pylint: disable=import-outside-toplevel
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=import-outside-toplevel
  config = models.tiny_config(hidden_size=32, intermediate_size=48, num_hidden_layers=2, vocab_size=64,
                              tie_word_embeddings=False, param_dtype="bfloat16", scan_layers=scan)
  mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
  params = jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, PartitionSpec(*(["x"] if x.shape[0] % 2 == 0
                                                                                         else [])))),
                        models.init_params(config, jax.random.key(0)))
  sharded = [x for x in jax.tree.leaves(params) if not x.is_fully_replicated]
  assert sharded and all(x._npy_value is None for x in sharded)  # pylint: disable=protected-access
  probe = jnp.copy(sharded[0])
  np.asarray(probe)
  assert probe._npy_value is not None  # pylint: disable=protected-access  (what save_hf must not leave)
  models.save_hf(params, config, tmp_path)
  assert [x for x in sharded if x._npy_value is not None] == []  # pylint: disable=protected-access
  loaded, _ = models.load_hf(tmp_path, param_dtype="bfloat16", scan_layers=scan)
  for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))
