"""Attention: one `attend` seam with four implementations, and `decode_attend` for one-token decode steps.

  out = softmax(q·kᵀ / √D, masked)·v   (Vaswani et al. 2017, eq. 1), grouped-query (Ainslie et al. 2023):
  query head n reads kv head n // G, G = N / K.

  einsum  the reference: float32 scores [B, K, G, L, S], masked, softmaxed, times v (every platform; the CPU's)
  xla     `jax.nn.dot_product_attention(implementation="xla")`: the same math in JAX's own composition
  cudnn   `jax.nn.dot_product_attention(implementation="cudnn")`: cuDNN's fused flash attention (NVIDIA GPUs,
          bfloat16 or float16 activations); no [L, S] scores in memory
  pallas  the Pallas TPU flash-attention kernel (`jax.experimental.pallas.ops.tpu.flash_attention`, Dao et al.
          2022) with the padding as segment ids; no [L, S] scores in memory

`resolve("auto", platform, dtype)` picks one per backend.

One-token decode steps take `decode_attend`, which reads a KV cache's layout (`kv_cache`) and its shared prefix.
With a prefix, the softmax over the prefix's P keys and the row's S own slots is computed as two partial softmaxes
merged by their logsumexp (`Partial`, `merge_partials`; Milakov & Gimelshein 2018, "Online normalizer calculation
for softmax", the merge flash attention's blocks use): a fused decode kernel can compute either part and join at
the merge.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from grpo_jax.models import kv_cache
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


class Partial(NamedTuple):
  """Softmax attention of queries over a part of the keys, not yet normalised.

  With the part's scores s_j, values v_j and a reference m (any finite value; the part's maximum, or above it, so
  that no exponential overflows):

    max = m,   sum = Σ_j exp(s_j − m),   out = Σ_j exp(s_j − m) · v_j

  The attention over all the parts is `normalised(merge_partials(...))`: the same softmax · v as one softmax over
  the concatenated keys.

  Attributes:
    max: [...] the reference m.
    sum: [...] float32.
    out: [..., D] float32.
  """
  max: jax.Array
  sum: jax.Array
  out: jax.Array


def partial_softmax(scores: jax.Array, values: jax.Array, reference: jax.Array | None = None) -> Partial:
  """The `Partial` of float32 scores [B, K, G, S] (masked entries at a finite low value, such as float32's min)
  over values [B, K, S, D]: K kv heads, G query heads each; `reference` [B, K, G] defaults to the scores' max."""
  m = jnp.max(scores, axis=-1) if reference is None else reference
  e = jnp.exp(scores - m[..., None])
  return Partial(max=m, sum=jnp.sum(e, axis=-1), out=jnp.einsum("bkgs,bksd->bkgd", e, values.astype(jnp.float32)))


def merge_partials(a: Partial, b: Partial) -> Partial:
  """The `Partial` of two parts' keys together (associative and commutative), both rescaled to the larger max:

    m = max(m_a, m_b),  sum = sum_a · exp(m_a − m) + sum_b · exp(m_b − m),  out likewise.

  Parts that share their reference (the same array m) merge as plain sums, `(m, sum_a + sum_b, out_a + out_b)`:
  the factors would be exp(0) = 1, and the program carries no rescaling.
  """
  if a.max is b.max:
    return Partial(max=a.max, sum=a.sum + b.sum, out=a.out + b.out)
  m = jnp.maximum(a.max, b.max)
  fa, fb = jnp.exp(a.max - m), jnp.exp(b.max - m)
  return Partial(max=m, sum=a.sum * fa + b.sum * fb, out=a.out * fa[..., None] + b.out * fb[..., None])


def normalised(p: Partial) -> jax.Array:
  """softmax · v from a `Partial`: out / sum, [..., D]."""
  return p.out / p.sum[..., None]


def decode_attend(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array,
                  prefix: kv_cache.KVPrefix | None = None) -> jax.Array:
  """One query token per row against a KV cache (a decode step), grouped-query, float32 scores.

  Args:
    q: [B, 1, N, D] queries (RoPE applied).
    k: [B, K, D, S] the cache's keys (`kv_cache`'s layout: per (row, kv head) the scores are one [G, D] x [D, S]
      product and the output one [G, S] x [S, D] product, with G = N / K).
    v: [B, K, S, D] the cache's values.
    allowed: [B, 1, S] bool, True at the slots the query may attend.
    prefix: one layer's `KVPrefix` (keys [B', K, D, P], values [B', K, P, D], mask [B', P], rows), which each row
      attends before its own S slots: one softmax over P + S. None: the S slots alone.

  Returns:
    [B, 1, N, D] in q's dtype. Where a query may attend no key, the average of all the values it reads.

  Without a prefix the softmax is normalised before its product with the values, its probabilities in q's dtype
  (as `attend`'s einsum path). With one, the two parts are `Partial`s merged by `merge_partials`, both taking the
  common maximum over P + S as their reference (so the merge adds their sums, with no rescaling). A prefix
  without `rows` is read once per group of R = B / B' consecutive rows: its part runs kv-head-major,
  [B', K, R·G, P], the R rows' G query heads side by side against one [D, P] block of keys, so each step reads a
  prompt's keys once for its R samples. With `rows`, each row's prefix row is gathered first
  (`kv_cache.prefix_per_row`, R = 1).
  """
  f32, low, dtype = jnp.float32, jnp.finfo(jnp.float32).min, q.dtype
  b, _, n, d = q.shape
  n_kv = k.shape[1]
  groups = n // n_kv
  q = q.reshape(b, n_kv, groups, d).astype(f32)
  scores = jnp.einsum("bkgd,bkds->bkgs", q, k.astype(f32)) * d ** -0.5  # [B, K, G, S]
  scores = jnp.where(allowed[:, None], scores, low)
  if prefix is None:
    probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
    out = jnp.einsum("bkgs,bksd->bkgd", probs.astype(f32), v.astype(f32))  # [B, K, G, D]
    return out.reshape(b, 1, n, d).astype(dtype)
  prefix = kv_cache.prefix_per_row(prefix)
  rows = prefix.k.shape[0]
  r = b // rows
  to_prefix = lambda x: x.reshape(rows, r, n_kv, groups, *x.shape[3:]).swapaxes(1, 2).reshape(
      rows, n_kv, r * groups, *x.shape[3:])  # [B, K, G, ...] -> [B', K, R * G, ...]
  to_rows = lambda x: x.reshape(rows, n_kv, r, groups, *x.shape[3:]).swapaxes(1, 2).reshape(
      b, n_kv, groups, *x.shape[3:])  # and back
  pscores = jnp.einsum("bkgd,bkdp->bkgp", to_prefix(q), prefix.k.astype(f32)) * d ** -0.5  # [B', K, R * G, P]
  pscores = jnp.where(prefix.mask[:, None, None], pscores, low)
  top = jnp.maximum(jnp.max(scores, axis=-1), to_rows(jnp.max(pscores, axis=-1)[..., None])[..., 0])  # [B, K, G]
  own = partial_softmax(scores, v, top)
  shared = partial_softmax(pscores, prefix.v, to_prefix(top[..., None])[..., 0])
  shared = Partial(max=top, sum=to_rows(shared.sum[..., None])[..., 0], out=to_rows(shared.out))
  return normalised(merge_partials(own, shared)).reshape(b, 1, n, d).astype(dtype)


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

