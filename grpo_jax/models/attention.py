"""Multi-token attention (training and scoring forwards): one `attend` seam, four implementations.

  out = softmax(q·kᵀ / √D, masked)·v   (Vaswani et al. 2017, eq. 1), grouped-query (Ainslie et al. 2023):
  query head n reads kv head n // G, G = N / K.

  einsum  the reference: float32 scores [B, K, G, L, S], masked, softmaxed, times v (every platform; the CPU's)
  xla     `jax.nn.dot_product_attention(implementation="xla")`: the same math in JAX's own composition
  cudnn   `jax.nn.dot_product_attention(implementation="cudnn")`: cuDNN's fused flash attention (NVIDIA GPUs,
          bfloat16 or float16 activations); no [L, S] scores in memory
  pallas  the Pallas TPU flash-attention kernel (`jax.experimental.pallas.ops.tpu.flash_attention`, Dao et al.
          2022) with the padding as segment ids; no [L, S] scores in memory

`resolve("auto", platform, dtype)` picks one per backend. One-token decode steps keep their own path
(`transformer._decode_attention`), which reads the cache's layout and its shared prefix.
"""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from grpo_jax.models import logical_axes
from grpo_jax.models.config import ATTENTION_IMPLEMENTATIONS as IMPLEMENTATIONS

CHOICES = ("auto", *IMPLEMENTATIONS)  # the `--attention` flag's values
_PALLAS_BLOCK = 128  # the Pallas kernel's query and key block; the lengths are padded to a multiple of it


def resolve(name: str, platform: str, dtype) -> str:
  """The implementation `name` stands for on `platform` ("cpu", "gpu"/"cuda", "tpu") with activations of `dtype`.

  "auto": pallas on a TPU; cudnn on an NVIDIA GPU with bfloat16/float16 activations (cuDNN's fused kernel has
  no float32 variant), else xla there; einsum elsewhere (the CPU). Any other name is returned as it is.
  """
  if name not in CHOICES:
    raise ValueError(f"attention must be one of {', '.join(CHOICES)}, not {name!r}")
  if name != "auto":
    return name
  if platform == "tpu":
    return "pallas"
  if platform in ("gpu", "cuda"):
    return "cudnn" if jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) else "xla"
  return "einsum"


def scores(q: jax.Array, k: jax.Array, k_spec: str) -> jax.Array:
  """q·k as float32 [B, K, G, L, S] for q [B, L, K, G, D] and keys `k_spec` ("bskd", or "bkds" from a cache).

  XLA's CPU backend has no bfloat16 x bfloat16 -> float32 product for keys laid out [B, K, D, S] (it falls back
  to a dot without that type), so on the CPU such keys and queries are cast to float32 first: the same products
  (bfloat16 values are exact in float32) and float32 sums. Other platforms take the mixed-precision product.
  """
  dot = lambda q, k: jnp.einsum(f"blkgd,{k_spec}->bkgls", q, k, preferred_element_type=jnp.float32)
  if k_spec != "bkds" or q.dtype == jnp.float32:
    return dot(q, k)
  f32 = jnp.float32
  return jax.lax.platform_dependent(q, k, cpu=lambda q, k: dot(q.astype(f32), k.astype(f32)), default=dot)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array, *, implementation: str = "einsum",
           causal: bool = False, cache_layout: bool = False) -> jax.Array:
  """Grouped-query attention of L queries over S keys.

  Args:
    q: [B, L, N, D] queries (RoPE applied).
    k: [B, S, K, D] keys, or [B, K, D, S] with `cache_layout` (a KV cache's).
    v: [B, S, K, D] values, or [B, K, S, D] with `cache_layout`.
    allowed: [B, L, S] bool, True where query l may attend key s.
    implementation: one of IMPLEMENTATIONS.
    causal: a promise that L == S and allowed = key_mask[:, None, :] & tril (the no-cache forward); key_mask is
      then read off allowed's last query row, and the fused kernels take it with their causal flag instead of
      the dense mask. Without it (a forward against a cache: the grouped forward's completions, the sampler's
      prefill) the fused kernels fall back to xla with the dense mask.

  Returns:
    [B, L, N, D] in q's dtype. Where a query may attend no key (padding), einsum and xla average all values;
    the fused kernels return other finite values there (only a real token's output is ever read).
  """
  b, l, n, d = q.shape
  n_kv = k.shape[1] if cache_layout else k.shape[2]
  scale = d ** -0.5
  k, v = k.astype(q.dtype), v.astype(q.dtype)
  if implementation == "einsum":
    q5 = q.reshape(b, l, n_kv, n // n_kv, d)
    k_spec, v_spec = ("bkds", "bksd") if cache_layout else ("bskd", "bskd")
    s = scores(q5, k, k_spec) * scale
    s = jnp.where(allowed[:, None, None], s, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(s, axis=-1).astype(q.dtype)
    return jnp.einsum(f"bkgls,{v_spec}->blkgd", probs, v).reshape(b, l, n, d)
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"attend: implementation must be one of {', '.join(IMPLEMENTATIONS)}, not {implementation!r}")
  if cache_layout:
    k, v = k.transpose(0, 3, 1, 2), v.transpose(0, 2, 1, 3)  # -> [B, S, K, D]
  if implementation == "pallas" and causal:
    return _pallas_flash(q, k, v, allowed[:, -1, :], scale)
  if implementation == "cudnn" and causal:  # the key mask as a [B, 1, L, S] bias (cuDNN takes no broadcast
    # query axis), the causal part in the kernel
    key_mask = jnp.broadcast_to(allowed[:, -1, None, None, :], (b, 1, l, allowed.shape[-1]))
    return jax.nn.dot_product_attention(q, k, v, mask=key_mask, scale=scale, is_causal=True,
                                        implementation="cudnn")
  return jax.nn.dot_product_attention(q, k, v, mask=allowed[:, None], scale=scale, implementation="xla")


def _pallas_flash(q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array, scale: float) -> jax.Array:
  """The Pallas TPU flash-attention kernel on [B, L, N, D] queries and [B, S, K, D] keys and values, L == S.

  Causal, with the padding as segment ids (1 at real tokens, 0 at padding): a real query attends the real keys
  up to itself, as `allowed` says; a padding query attends the padding keys up to itself (at least itself, so no
  row is empty). The kernel wants as many kv heads as query heads (each kv head repeated G times) and lengths in
  whole blocks (padded with padding tokens, cut off after). On a mesh (inside `logical_axes.axis_rules`) it runs
  per shard in `shard_map`, rows split as "batch" and heads as "heads" say (XLA cannot partition a Mosaic kernel).
  """
  from jax.experimental.pallas.ops.tpu import flash_attention as flash  # pylint: disable=g-import-not-at-top

  b, l, n, d = q.shape
  groups = n // k.shape[2]
  padded = -(-l // _PALLAS_BLOCK) * _PALLAS_BLOCK
  heads_major = lambda x: jnp.pad(x, ((0, 0), (0, padded - l), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
  qh = heads_major(q)
  kh, vh = (heads_major(jnp.repeat(x, groups, axis=2)) for x in (k, v))
  segments = jnp.pad(key_mask.astype(jnp.int32), ((0, 0), (0, padded - l)))

  def kernel(qh, kh, vh, segments):
    return flash.flash_attention(qh, kh, vh, segment_ids=flash.SegmentIds(q=segments, kv=segments), causal=True,
                                 sm_scale=scale, block_sizes=_pallas_blocks())

  placed = logical_axes.current_rules()
  if placed is None:
    out = kernel(qh, kh, vh, segments)
  else:
    mesh, rules = placed
    heads = logical_axes.logical_to_spec(("batch", "heads", None, None), rules, shape=qh.shape, mesh=mesh)
    rows = PartitionSpec(heads[0], None)
    out = jax.shard_map(kernel, mesh=mesh, in_specs=(heads, heads, heads, rows), out_specs=heads,
                        check_vma=False)(qh, kh, vh, segments)
  return out.transpose(0, 2, 1, 3)[:, :l].astype(q.dtype)


@functools.cache
def _pallas_blocks():
  from jax.experimental.pallas.ops.tpu import flash_attention as flash  # pylint: disable=g-import-not-at-top

  blk = _PALLAS_BLOCK
  return flash.BlockSizes(block_q=blk, block_k_major=blk, block_k=blk, block_b=1, block_q_major_dkv=blk,
                          block_k_major_dkv=blk, block_k_dkv=blk, block_q_dkv=blk, block_k_major_dq=blk,
                          block_k_dq=blk, block_q_dq=blk)

