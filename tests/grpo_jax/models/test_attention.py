"""The attention seam (grpo_jax/models/attention.py): each implementation against the einsum reference, and decode
attention with its merge of partial softmaxes.

Values and gradients on the CPU: xla directly, the Pallas TPU kernel in Pallas's TPU interpret mode; the model's
logits and log-probs with each; the Pallas kernel compiled for a TPU topology with libtpu (no TPU). cuDNN needs an
NVIDIA GPU: here only its selection is tested. Decode attention against a float64 NumPy softmax, with a shared
prefix against one cache holding prefix and own slots; the merge by hand and against one softmax.
"""

import functools
import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from grpo_jax import logprobs as logprobs_lib
from grpo_jax.models import ModelConfig, attention, kv_cache, transformer
from tests.conftest import HANG_GUARD_S

B, L, N, K, D = 3, 20, 4, 2, 16  # GQA: 2 query heads per kv head


def _inputs(dtype=jnp.float32, seed=0):
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.normal(size=shape), dtype) for shape in ((B, L, N, D), (B, L, K, D), (B, L, K, D)))
  key_mask = np.ones((B, L), bool)
  key_mask[0, :3] = False  # a left-padded prompt
  key_mask[1, 15:] = False  # a right-padded completion
  key_mask[2, :2] = key_mask[2, 17:] = False  # both
  allowed = key_mask[:, None, :] & np.tril(np.ones((L, L), bool))[None]
  return q, k, v, key_mask, jnp.asarray(allowed)


def _numpy_attention(q, k, v, allowed):
  """float64 softmax(q·kᵀ/√D)·v with each kv head repeated for its query heads; rows with no allowed key: NaN."""
  groups = q.shape[2] // k.shape[2]
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
  s = np.einsum("blnd,bsnd->bnls", q, k) / np.sqrt(q.shape[-1])
  s = np.where(np.asarray(allowed)[:, None], s, -np.inf)
  with np.errstate(invalid="ignore"):
    p = np.exp(s - s.max(-1, keepdims=True))
  return np.einsum("bnls,bsnd->blnd", p / p.sum(-1, keepdims=True), v)


def _run(implementation, *args, **kwargs):
  fn = jax.jit(functools.partial(attention.attend, implementation=implementation, **kwargs))
  if implementation == "pallas":
    with pltpu.force_tpu_interpret_mode():
      return fn(*args)
  return fn(*args)


def test_einsum_reference_is_grouped_query_attention():
  q, k, v, key_mask, allowed = _inputs()
  got = np.asarray(_run("einsum", q, k, v, allowed, causal=True))
  want = _numpy_attention(q, k, v, allowed)
  real = key_mask[:, :, None, None]
  np.testing.assert_allclose(np.where(real, got, 0), np.where(real, want, 0), rtol=1e-5, atol=1e-5)
  # A query that may attend nothing (left padding) averages every value, as the model always did.
  np.testing.assert_allclose(got[0, 0, 0], np.asarray(v)[0, :, 0].mean(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("implementation", ["xla", "pallas"])
def test_values_and_gradients_equal_the_einsum_reference(implementation):
  q, k, v, key_mask, allowed = _inputs()
  real = jnp.asarray(key_mask[:, :, None, None])
  w = jax.random.normal(jax.random.key(3), (B, L, N, D))

  def loss(impl, q, k, v):  # read at real queries only: padding rows are free to differ
    return jnp.sum(jnp.where(real, attention.attend(q, k, v, allowed, implementation=impl, causal=True) * w, 0))

  ref_value, ref_grads = jax.jit(jax.value_and_grad(functools.partial(loss, "einsum"), argnums=(0, 1, 2)))(q, k, v)
  fn = jax.jit(jax.value_and_grad(functools.partial(loss, implementation), argnums=(0, 1, 2)))
  if implementation == "pallas":
    with pltpu.force_tpu_interpret_mode():
      value, grads = fn(q, k, v)
  else:
    value, grads = fn(q, k, v)
  np.testing.assert_allclose(value, ref_value, rtol=1e-5)
  for g, r in zip(grads, ref_grads):
    assert np.abs(np.asarray(r)).max() > 0.1  # the gradients are not trivially zero
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
  out = np.asarray(_run(implementation, q, k, v, allowed, causal=True))
  assert np.isfinite(out).all()  # padding rows too: their values flow on into the next layer


def test_xla_reads_a_cache_layout_and_a_dense_mask():
  """The grouped forward's completions: keys [B, K, D, S] and values [B, K, S, D] from a cache, queries at slots
  P.. of S = P + L, a mask that is not a plain causal one."""
  q, k, v, key_mask, _ = _inputs()
  p = 5
  rng = np.random.default_rng(1)
  k_all, v_all = (jnp.asarray(rng.normal(size=(B, p + L, K, D)), jnp.float32) for _ in range(2))
  slots = np.arange(p + L)
  allowed = (slots[None, :] <= p + np.arange(L)[:, None])[None] & np.concatenate(
      [np.ones((B, p), bool), key_mask], axis=1)[:, None, :]
  k_cache, v_cache = k_all.transpose(0, 2, 3, 1), v_all.transpose(0, 2, 1, 3)
  want = _run("einsum", q, k_cache, v_cache, jnp.asarray(allowed), cache_layout=True)
  for impl in ("xla", "pallas", "cudnn"):  # the fused kernels fall back to xla with the dense mask
    got = _run(impl, q, k_cache, v_cache, jnp.asarray(allowed), cache_layout=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(want, _numpy_attention(q, k_all, v_all, allowed), rtol=1e-5, atol=1e-5)


def test_bfloat16_scores_against_cached_keys_equal_float32_ones():
  """Keys from the cache ([B, K, D, S]) in bfloat16: XLA CPU has no bf16 x bf16 -> f32 dot for that layout, so
  `scores` casts on the CPU; the products of bf16 values are exact in f32, so the scores equal float32's."""
  q = jax.random.normal(jax.random.key(0), (2, 3, 2, 2, 8)).astype(jnp.bfloat16)  # [B, L, K, G, D]
  keys = jax.random.normal(jax.random.key(1), (2, 2, 8, 5)).astype(jnp.bfloat16)  # [B, K, D, S]
  got = jax.jit(functools.partial(attention.scores, k_spec="bkds"))(q, keys)
  want = jnp.einsum("blkgd,bkds->bkgls", q.astype(jnp.float32), keys.astype(jnp.float32))
  assert got.dtype == jnp.float32 and got.shape == (2, 2, 2, 3, 5)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _float32_products(hlo: str) -> int:
  """dot_general ops of a StableHLO text with float32 operands (on a GPU: TF32 GEMMs; on a TPU: multi-pass)."""
  return sum(1 for line in hlo.splitlines() if "dot_general" in line and line.split("->")[0].count("xf32>") >= 2)


def test_backward_products_in_bfloat16():
  """With bf16 activations, the xla path (the chips' attention where a fused kernel does not apply: the grouped
  forward's completions over the prompt cache) keeps all five backward products bf16. The einsum reference (the
  CPU's) takes q·kᵀ with float32 output, so autodiff promotes two of them (dq and dk) to float32."""
  q = jnp.ones((2, 8, 4, 16), jnp.bfloat16)
  k = v = jnp.ones((2, 12, 2, 16), jnp.bfloat16)
  allowed = jnp.ones((2, 8, 12), bool)
  counts = {}
  for implementation in ("xla", "einsum"):
    loss = lambda q, k, v, impl=implementation: jnp.sum(attention.attend(q, k, v, allowed, implementation=impl))
    hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).as_text()
    counts[implementation] = (_float32_products(hlo), hlo.count("dot_general"))
  assert counts == {"xla": (0, 5), "einsum": (2, 5)}


def test_auto_picks_per_backend():
  assert attention.resolve("auto", "cpu", "float32") == "einsum"
  assert attention.resolve("auto", "tpu", "float32") == "pallas"
  assert attention.resolve("auto", "gpu", "bfloat16") == "cudnn"
  assert attention.resolve("auto", "cuda", "float16") == "cudnn"
  assert attention.resolve("auto", "gpu", "float32") == "xla"  # cuDNN's fused kernel has no float32 variant
  assert attention.resolve("xla", "tpu", "bfloat16") == "xla"
  with pytest.raises(ValueError, match="attention must be one of auto, einsum, xla, cudnn, pallas, not 'flash'"):
    attention.resolve("flash", "cpu", "float32")
  with pytest.raises(ValueError, match="unknown attention='auto'"):
    _config("auto")


def _config(implementation, **kw):
  return ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=8, attention=implementation, **kw)


@pytest.mark.parametrize("implementation", ["xla", "pallas"])
def test_the_model_scores_and_trains_with_each_implementation(implementation):
  """token_logprobs (the no-cache forward: π_ref, π_old, the update) and grouped_completion_logprobs (prompts
  once, completions against the cache) equal the einsum model's, and so do the log-probs' gradients."""
  base = _config("einsum", scan_layers=True)
  params = transformer.init_params(base, jax.random.key(0))
  rng = np.random.default_rng(0)
  g, p, t = 2, 6, 9
  prompts = jnp.asarray(rng.integers(1, 61, (2, p)))
  prompt_mask = jnp.asarray(np.arange(p)[None] >= np.array([[0], [2]]))  # the second prompt left-padded
  completions = jnp.asarray(rng.integers(1, 61, (2 * g, t)))
  completion_mask = jnp.asarray(np.arange(t)[None] < np.array([[9], [4], [7], [1]]))
  tokens = jnp.concatenate([jnp.repeat(prompts, g, 0), completions], 1)
  mask = jnp.concatenate([jnp.repeat(prompt_mask, g, 0), completion_mask], 1)

  def outputs(config):
    full = lambda params: logprobs_lib.token_logprobs(params, config, tokens, mask, chunk_size=4)
    grouped = logprobs_lib.grouped_completion_logprobs(params, config, prompts, prompt_mask, completions,
                                                       completion_mask, group_size=g, chunk_size=4)
    grads = jax.grad(lambda params: jnp.sum(full(params) * jnp.linspace(-1, 1, p + t)))(params)
    return full(params), grouped, grads

  want = jax.jit(lambda: outputs(base))()
  fn = jax.jit(lambda: outputs(base.replace(attention=implementation)))
  if implementation == "pallas":
    with pltpu.force_tpu_interpret_mode():
      got = fn()
  else:
    got = fn()
  assert np.abs(np.asarray(want[0])).max() > 1  # real log-probs, not all padding
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[1], want[0][:, p:], rtol=1e-4, atol=1e-4)
  for a, b in zip(jax.tree.leaves(got[2]), jax.tree.leaves(want[2])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# Decode steps: one query a row against a cache, a prefix's part merged by logsumexp.


def _partial(scores, values):
  """A `Partial` of scores [S] and values [S] (one row, kv head and query head; D = 1), its own max the reference."""
  return attention.partial_softmax(jnp.asarray(scores, jnp.float32)[None, None, None],
                                   jnp.asarray(values, jnp.float32)[None, None, :, None])


def test_merge_of_partial_softmaxes_by_hand():
  """Scores (0, ln 2) over values (1, 3), and ln 4 over 5: weights 1, 2, 4 of 7, so softmax · v = 27 / 7."""
  a, b = _partial([0.0, np.log(2.0)], [1.0, 3.0]), _partial([np.log(4.0)], [5.0])
  np.testing.assert_allclose([a.max.item(), a.sum.item(), a.out.item()], [np.log(2.0), 1.5, 3.5], rtol=1e-6)
  np.testing.assert_allclose([b.max.item(), b.sum.item(), b.out.item()], [np.log(4.0), 1.0, 5.0], rtol=1e-6)
  for merged in (attention.merge_partials(a, b), attention.merge_partials(b, a)):  # a rescaled by exp(ln 2 - ln 4)
    np.testing.assert_allclose([merged.max.item(), merged.sum.item(), merged.out.item()],
                               [np.log(4.0), 1.75, 6.75], rtol=1e-6)
    np.testing.assert_allclose(attention.normalised(merged).item(), 27 / 7, rtol=1e-6)


def test_merged_partials_equal_one_softmax_over_the_concatenation():
  """Three parts, each with its own maximum and masked entries, merged in either grouping: softmax over all keys
  times their values. A fully masked part adds nothing; parts with one common reference merge to exact sums."""
  rng = np.random.default_rng(0)
  low = np.finfo(np.float32).min
  shapes = [(2, 2, 3, s) for s in (5, 4, 3)]  # [B, K, G, S] each
  scores = [np.where(rng.random(shape) < 0.3, low, 4 * rng.normal(size=shape)).astype(np.float32) for shape in shapes]
  scores[0][..., 0] = 0.0  # every row has a real key
  values = [rng.normal(size=(2, 2, shape[-1], 6)).astype(np.float32) for shape in shapes]
  a, b, c = (attention.partial_softmax(jnp.asarray(x), jnp.asarray(v)) for x, v in zip(scores, values))
  s64, v64 = np.concatenate(scores, -1).astype(np.float64), np.concatenate(values, 2).astype(np.float64)
  p = np.exp(s64 - s64.max(-1, keepdims=True))
  want = np.einsum("bkgs,bksd->bkgd", p / p.sum(-1, keepdims=True), v64)
  left = attention.merge_partials(attention.merge_partials(a, b), c)
  right = attention.merge_partials(a, attention.merge_partials(c, b))
  for merged in (left, right):
    np.testing.assert_allclose(attention.normalised(merged), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(merged.max, s64.max(-1))
  masked = attention.partial_softmax(jnp.full((2, 2, 3, 4), low), jnp.asarray(1e3 * values[1]))
  np.testing.assert_array_equal(attention.normalised(attention.merge_partials(a, masked)), attention.normalised(a))
  top = jnp.maximum(a.max, b.max)
  a_top, b_top = (attention.partial_softmax(jnp.asarray(x), jnp.asarray(v), top)
                  for x, v in zip(scores[:2], values[:2]))
  # The same reference array (decode_attend's case) adds the parts; an equal one rescales them by exp(0), exactly 1.
  for b_ref in (b_top, b_top._replace(max=jnp.array(top))):
    common = attention.merge_partials(a_top, b_ref)
    np.testing.assert_array_equal(common.sum, a_top.sum + b_top.sum)
    np.testing.assert_array_equal(common.out, a_top.out + b_top.out)


def _cache_layout(k, v):
  """Keys and values [B, S, K, D] -> the cache's [B, K, D, S] and [B, K, S, D]."""
  return k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_attend_equals_grouped_query_attention(dtype):
  """One query a row against the cache's layout: float64 softmax(q·kᵀ/√D)·v; a row that sees one slot gets its
  value."""
  b, n, k, s, d = 3, 4, 2, 7, 8
  q, keys, values = (jax.random.normal(jax.random.key(i), shape) for i, shape in
                     enumerate([(b, 1, n, d), (b, s, k, d), (b, s, k, d)]))
  allowed = jnp.arange(s)[None, None, :] < jnp.array([7, 4, 1])[:, None, None]  # row 2 sees one slot
  want = _numpy_attention(q, keys, values, allowed)
  np.testing.assert_allclose(want[2, 0], np.repeat(values[2, 0], n // k, axis=0), rtol=1e-6)
  cast = lambda x: x.astype(dtype)
  got = jax.jit(attention.decode_attend)(cast(q), *map(cast, _cache_layout(keys, values)), allowed)
  assert got.shape == (b, 1, n, d) and got.dtype == jnp.dtype(dtype)
  np.testing.assert_allclose(got.astype(jnp.float32), want, atol=1e-5 if dtype == "float32" else 5e-2)


@pytest.mark.parametrize("by_rows", [False, True])
def test_decode_attend_with_a_prefix_equals_one_cache_holding_both(by_rows):
  """Rows attending to a prefix row's slots, then their own, as one cache holding both per row: groups of 3
  consecutive rows sharing one (the sampler), or each row its own prefix row by `rows` (the rollout engine)."""
  b, groups, n, k, d, p, s = 6, 3, 4, 2, 8, 5, 4  # 2 prefixes, each read by 3 rows
  q = jax.random.normal(jax.random.key(0), (b, 1, n, d))
  pk, pv = (jax.random.normal(jax.random.key(i), (b // groups, p, k, d)) for i in (1, 2))
  own_k, own_v = (jax.random.normal(jax.random.key(i), (b, s, k, d)) for i in (3, 4))
  pmask = jnp.array([[False, False, True, True, True], [True] * p])  # prefix 0 left-padded by 2
  allowed = jnp.arange(s)[None, None, :] < jnp.array([4, 1, 2, 3, 4, 1])[:, None, None]
  rows = jnp.array([1, 0, 1, 1, 0, 0]) if by_rows else jnp.repeat(jnp.arange(b // groups), groups)
  whole_k = jnp.concatenate([pk[rows], own_k], axis=1)
  whole_v = jnp.concatenate([pv[rows], own_v], axis=1)
  whole_allowed = jnp.concatenate([pmask[rows][:, None], allowed], axis=-1)
  want = _numpy_attention(q, whole_k, whole_v, whole_allowed)
  decode = jax.jit(attention.decode_attend)
  prefix = lambda k, v: kv_cache.KVPrefix(*_cache_layout(k, v), mask=pmask, rows=rows if by_rows else None)
  got = decode(q, *_cache_layout(own_k, own_v), allowed, prefix(pk, pv))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got, decode(q, *_cache_layout(whole_k, whole_v), whole_allowed), rtol=1e-5, atol=1e-6)
  # A masked prefix slot changes nothing: prefix 0's padding holds garbage.
  again = decode(q, *_cache_layout(own_k, own_v), allowed, prefix(pk.at[0, :2].set(1e3), pv.at[0, :2].set(1e3)))
  np.testing.assert_allclose(again, got, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed: no TPU compiler")
def test_pallas_kernel_compiles_for_a_tpu_topology():
  """The kernel, its backward and the model's bfloat16 log-prob forward with it compile for one chip
  of a v5e:2x2 with libtpu as the compiler (a child process: libtpu's environment is set before it loads); and the
  forward on a mesh of its 4 chips in row chunks, where XLA would refuse to partition the kernel without its
  shard_map. (Pallas's interpret mode hangs under shard_map on several CPU devices, so the mesh is only
  compiled.)"""
  code = textwrap.dedent("""
      import jax, jax.numpy as jnp, numpy as np
      from jax.experimental import topologies
      from jax.sharding import SingleDeviceSharding
      from grpo_jax import logprobs
      from grpo_jax.models import ModelConfig, attention, kv_cache, transformer
      device = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices[0]
      one = SingleDeviceSharding(device)
      spec = lambda shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype, sharding=one)
      b, l, n, k, d = 2, 200, 4, 2, 64
      def loss(q, k_, v, allowed):
        return jnp.sum(attention.attend(q, k_, v, allowed, implementation="pallas", causal=True).astype(jnp.float32))
      args = (spec((b, l, n, d)), spec((b, l, k, d)), spec((b, l, k, d)), spec((b, l, l), jnp.bool_))
      forward = jax.jit(lambda *a: attention.attend(*a, implementation="pallas", causal=True)).lower(*args)
      assert "tpu_custom_call" in forward.as_text(), "no Mosaic kernel in the lowered forward"
      out = forward.compile().out_info
      grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile().out_info
      config = ModelConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=64, dtype="bfloat16",
                           param_dtype="bfloat16", attention="pallas", scan_layers=True)
      params = jax.tree.map(lambda x: spec(x.shape, x.dtype), jax.eval_shape(transformer.init_params, config,
                                                                              jax.random.key(0)))
      fn = jax.jit(lambda p, t, m: logprobs.token_logprobs(p, config, t, m))
      lowered = fn.lower(params, spec((4, 300), jnp.int32), spec((4, 300), jnp.bool_))
      assert "tpu_custom_call" in lowered.as_text()
      logp = lowered.compile().out_info
      # On a mesh of the 4 chips, rows split over fsdp: the kernel runs per shard (shard_map), in row chunks.
      from grpo_jax import partitioning
      devices = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices
      mesh, rules = partitioning.make_mesh("fsdp:4", devices), partitioning.get_rules("fsdp")
      fn = logprobs.jit_token_logprobs(config, mesh=mesh, rules=rules, forward_rows=4)
      params_sh = partitioning.param_shardings(mesh, rules, params)
      rows = partitioning.logical_sharding(mesh, rules, ("batch", None), (8, 300))
      sharded = fn.program((8, 300)).lower(
          jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params, params_sh),
          jax.ShapeDtypeStruct((8, 300), jnp.int32, sharding=rows), jax.ShapeDtypeStruct((8, 300), jnp.bool_,
                                                                                            sharding=rows))
      assert "tpu_custom_call" in sharded.as_text()
      on_mesh = sharded.compile().out_info
      print("SHAPES", out.shape, out.dtype, [g.shape for g in grads], logp.shape, logp.dtype, on_mesh.shape)
  """)
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_SKIP_MDS_QUERY": "1",
         "TPU_WORKER_HOSTNAMES": "localhost", "TPU_ACCELERATOR_TYPE": "v5litepod-1"}
  result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S, cwd=pathlib.Path(__file__).resolve().parents[3])
  assert result.returncode == 0, result.stderr[-3000:]
  shapes = result.stdout.strip().splitlines()[-1]
  assert shapes == ("SHAPES (2, 200, 4, 64) bfloat16 [(2, 200, 4, 64), (2, 200, 2, 64), (2, 200, 2, 64)] "
                    "(4, 300) float32 (8, 300)"), shapes
