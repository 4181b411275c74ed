"""`random_init`: slices of one normal draw computed alone, and `models.init_params` built on them.

The values are those of the jitted `jax.random.normal` over the whole draw, bit for bit (the tiny default model's
included: those of the single-draw program this replaced, compiled with the same flags; XLA's flags can move the
last bit of a float32, through its fused multiply-adds, so the reference is compiled in the same process), and the
init program holds one draw whatever the model's depth, with no temporary bigger than the weights.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import models
from grpo_jax.models import params as params_lib
from grpo_jax.models import random_init, tiny, transformer


@functools.partial(jax.jit, static_argnums=0)
def _one_draw(config, key):
  """The program init_params replaced: one `jax.random.normal` sliced into every weight."""
  unrolled = params_lib.shapes(transformer.CausalLM, config.replace(scan_layers=False))
  params = random_init.one_draw(unrolled, key, config.param_dtype)
  return models.stack_layers(params, config) if config.scan_layers else params


DEEP = models.ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=12,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, qkv_bias=True,
                          tie_word_embeddings=False, eos_token_ids=(3,), pad_token_id=0, param_dtype="bfloat16")
QWEN_05B = dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
                vocab_size=151936, param_dtype="bfloat16")


def assert_same_tree(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("jit", [False, True])
def test_pieces_are_the_whole_draw_bit_for_bit(dtype, jit):
  key = jax.random.key(7)
  n, piece = 37, 8  # five pieces, the last one past the end
  draw = lambda k: random_init.normal_pieces(k, n, dtype, 0.02, piece=piece)
  got = (jax.jit(draw) if jit else draw)(key)
  assert got.shape == (5, 8) and got.dtype == jnp.dtype(dtype)
  expected = jax.jit(lambda k: (0.02 * jax.random.normal(k, (40,), jnp.float32)).astype(dtype))(key)
  np.testing.assert_array_equal(np.asarray(got).reshape(-1), np.asarray(expected))


def test_a_small_draw_takes_a_small_piece():
  assert random_init.normal_pieces(jax.random.key(0), 5, "float32").shape == (1, 8)


def test_piece_start_carries_into_the_high_word():
  # 5 · 2³⁰ = 1 · 2³² + 2³⁰; 3 · 2³¹ = 1 · 2³² + 2³¹; 7 · 2⁴ = 112.
  for j, piece, (hi, lo) in [(5, 2**30, (1, 2**30)), (3, 2**31, (1, 2**31)), (7, 16, (0, 112))]:
    got = random_init.piece_start(np.uint32(j), piece)
    assert (int(got[0]), int(got[1])) == (hi, lo)


def test_sliceable_only_for_partitionable_threefry():
  assert random_init.sliceable(jax.random.key(0))
  assert random_init.sliceable(jax.random.PRNGKey(0))
  assert not random_init.sliceable(jax.random.key(0, impl="rbg"))
  with jax.threefry_partitionable(False):
    assert not random_init.sliceable(jax.random.key(0))


@pytest.mark.parametrize("scan", [False, True])
def test_tiny_default_values_unchanged(scan):
  config = tiny.tiny_config(scan_layers=scan)
  assert_same_tree(models.init_params(config, jax.random.key(0)), _one_draw(config, jax.random.key(0)))


@pytest.mark.parametrize("scan", [False, True])
def test_equals_one_draw_sliced_past_ten_layers(scan):
  # Twelve layers: their blocks in the draw follow their numbers (layers_2 before layers_10).
  config = DEEP.replace(scan_layers=scan)
  key = jax.random.key(3)
  assert_same_tree(models.init_params(config, key), _one_draw(config, key))
  if scan:
    assert_same_tree(models.init_params(config, key),
                     models.stack_layers(models.init_params(DEEP, key), DEEP))


def test_keys_that_cannot_be_sliced_take_the_one_draw():
  key = jax.random.key(1, impl="rbg")
  assert_same_tree(models.init_params(DEEP, key), _one_draw(DEEP, key))


def _threefry_count(jaxpr) -> int:
  count = 0
  for eqn in jaxpr.eqns:
    count += eqn.primitive.name == "threefry2x32"
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          count += _threefry_count(sub)
  return count


@pytest.mark.parametrize("layers", [2, 24])
def test_one_draw_in_the_program_whatever_the_depth(layers):
  config = tiny.tiny_config(**QWEN_05B, num_hidden_layers=layers, scan_layers=False)
  jaxpr = jax.make_jaxpr(lambda k: models.init_params(config, k))(jax.random.key(0))
  assert _threefry_count(jaxpr.jaxpr) == 1


def test_qwen_05b_scanned_program_small_and_no_temporary_past_the_weights():
  """Compiled (not run) on the CPU at Qwen2.5-0.5B's shapes: the single-draw program this replaced had 18.7k HLO
  instructions and 8.6 GiB of temporaries for 0.92 GiB of weights."""
  config = tiny.tiny_config(**QWEN_05B, num_hidden_layers=24, scan_layers=True)
  compiled = models.init_params.lower(config, jax.random.key(0)).compile()
  weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(jax.eval_shape(models.init_params, config,
                                                                                  jax.random.key(0))))
  instructions = sum(1 for line in compiled.as_text().splitlines() if " = " in line)
  assert instructions < 1000
  assert compiled.memory_analysis().temp_size_in_bytes < 1.1 * weights


def test_the_draw_order_by_hand():
  """Embedding, then the layers by number (each: its weights in the order of their names: attn k, o, q, v, then mlp
  down, gate, up), then lm_head."""
  key = jax.random.key(5)
  c = DEEP.replace(param_dtype="float32")
  v, e, m, kd, hd = c.vocab_size, c.hidden_size, c.intermediate_size, 2 * 8, 4 * 8
  layer = e * kd + hd * e + e * hd + e * kd + m * e + e * m + e * m
  n = v * e + 12 * layer + e * v
  flat = np.asarray(jax.jit(lambda k: 0.02 * jax.random.normal(k, (n,), jnp.float32))(key))
  params = models.init_params(c, key)
  close = lambda x, y: np.testing.assert_allclose(np.asarray(x), y, rtol=3e-7, atol=0)
  close(params["embed"]["embedding"].reshape(-1), flat[:v * e])
  k_proj = params["layers_10"]["attn"]["k_proj"]["kernel"]
  close(k_proj.reshape(-1), flat[v * e + 10 * layer:v * e + 10 * layer + e * kd])
  up = params["layers_2"]["mlp"]["up_proj"]["kernel"]
  close(up.reshape(-1), flat[v * e + 3 * layer - e * m:v * e + 3 * layer])
  close(params["lm_head"]["kernel"].reshape(-1), flat[n - e * v:])


@pytest.mark.parametrize("piece", [6, 1, 2**32])
def test_a_piece_that_is_not_a_power_of_two_is_one_clear_error(piece):
  with pytest.raises(ValueError, match="piece must be a power of two"):
    random_init.normal_pieces(jax.random.key(0), 10, "float32", piece=piece)
