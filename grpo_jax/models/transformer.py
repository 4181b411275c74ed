"""Decoder-only transformer for Qwen2/Qwen2.5, Qwen3 and Llama 3.x, in Flax NNX.

Grouped-query attention with RoPE (Llama 3 frequency scaling optional), RMSNorm,
SwiGLU MLP, optional q/k/v(/o) bias, optional per-head q/k RMSNorm (Qwen3), tied
or untied embeddings, optional per-layer rematerialisation (with a policy of what
to keep), and the layer stack either unrolled or as one `lax.scan` over stacked
weights (`config.scan_layers`: one layer is traced and compiled instead of L).

The trainers hold parameters as plain nested dicts, so the public entry points
are functional: `init_params(config, key)`, `apply(params, config, tokens, ...)`
and `hidden_states(...)` merge the dict into the NNX module inside the trace.

Parameter layout (leaves of the params dict, logical axis names in brackets):
  embed/embedding                   [vocab, embed]
  layers_{i}/attn/q_proj/kernel     [embed, heads, None]      bias [heads, None]
  layers_{i}/attn/k_proj/kernel     [embed, kv_heads, None]   bias [kv_heads, None]
  layers_{i}/attn/v_proj/kernel     [embed, kv_heads, None]   bias [kv_heads, None]
  layers_{i}/attn/o_proj/kernel     [heads, None, embed]      bias [embed]
  layers_{i}/attn/{q,k}_norm/scale  [None]                    (Qwen3)
  layers_{i}/mlp/{gate,up}_proj/kernel [embed, mlp]           bias [mlp]
  layers_{i}/mlp/down_proj/kernel   [mlp, embed]              bias [embed]
  layers_{i}/{input,post_attn}_norm/scale [embed]
  final_norm/scale                  [embed]
  lm_head/kernel                    [embed, vocab]            (untied only)

With `config.scan_layers` the L layers' weights are stacked: `layers/attn/q_proj/kernel`
is [L, embed, heads, None] (the stacked axis unsharded), and so on; `stack_layers` and
`unstack_layers` convert between the two layouts, which compute the same function.
"""

import functools
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from grpo_jax.models import attention
from grpo_jax.models import random_init
from grpo_jax.models.config import REMAT_POLICIES, ModelConfig
from grpo_jax.models.logical_axes import constrain

Params = dict[str, Any]

_BTE = ("batch", "length", "embed")
# The cache's logical axes: keys [B, K, D, S], values [B, K, S, D]. In a decode step's attention
# (`_decode_attention`) the scores q·k are [G, D] x [D, S] products with S, the long axis, contiguous, and the
# output p·v [G, S] x [S, D] with D contiguous; a step writes one [D] column of keys and one [D] row of values
# per (row, kv head).
CACHE_K_AXES = ("batch", "kv_heads", None, "length")
CACHE_V_AXES = ("batch", "kv_heads", "length", None)
STACKED = "layers"  # the params key of the stacked layers (config.scan_layers)

# config.remat_policy -> jax.checkpoint policy (None: save nothing but the layer's input).
_POLICIES = {"full": None, "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
             "dots": jax.checkpoint_policies.checkpoint_dots}
assert set(_POLICIES) == set(REMAT_POLICIES)


class KVPrefix(NamedTuple):
  """Keys and values of prefixes (prompts) that cache rows read before their own slots, stored once each.

  Without `rows`, groups of G consecutive cache rows share a prefix row (a prompt's G samples, `sampling`):
  B' = B / G. With `rows`, cache row b reads prefix row rows[b], any of the B' (a rollout engine's slot pointing
  at its completion's prompt, `rollout_engine`).

  Attributes:
    k: per layer, keys [B', kv_heads, head_dim, P]; stacked [L, B', ...] with `config.scan_layers`.
    v: per layer, values [B', kv_heads, P, head_dim]; stacked likewise.
    mask: [B', P] bool, True at the prefix's real tokens.
    rows: [B] int32, the prefix row of each cache row; None: groups of consecutive rows.
  """
  k: tuple[jax.Array, ...] | jax.Array
  v: tuple[jax.Array, ...] | jax.Array
  mask: jax.Array
  rows: jax.Array | None = None


class KVCache(NamedTuple):
  """Static-shape key/value cache.

  Attributes:
    k: per layer, keys [B, kv_heads, head_dim, S] (the slots minor); with
      `config.scan_layers`, one array [L, B, kv_heads, head_dim, S].
    v: per layer, values [B, kv_heads, S, head_dim]; stacked likewise.
    mask: [B, S] bool, True where the slot holds a real (non-padding) token.
    index: [] int32, the next slot to write (the same for every row); or [B] int32, each row's own next slot
      (one-token steps only: rows at different points of their sequences, as a rollout engine's slots are;
      a write at an index >= S is dropped).
    prefix: a `KVPrefix` that every row attends to before its own S slots (rows g * G ... g * G + G - 1 share
      prefix row g), stored once per group instead of G times; None: no prefix. Read-only: new tokens go into
      the S slots. One-token steps only (decoding).
  """
  k: tuple[jax.Array, ...] | jax.Array
  v: tuple[jax.Array, ...] | jax.Array
  mask: jax.Array
  index: jax.Array
  prefix: KVPrefix | None = None


def init_cache(config: ModelConfig, batch_size: int, max_length: int, prefix: KVPrefix | None = None) -> KVCache:
  """An empty cache of `max_length` slots, in the activation dtype, after the shared `prefix` if given."""
  k_shape = (batch_size, config.num_key_value_heads, config.head_dim, max_length)
  v_shape = (batch_size, config.num_key_value_heads, max_length, config.head_dim)
  mask, index = jnp.zeros((batch_size, max_length), bool), jnp.zeros((), jnp.int32)
  if config.scan_layers:
    stacked = lambda shape: jnp.zeros((config.num_hidden_layers, *shape), config.dtype)
    return KVCache(k=stacked(k_shape), v=stacked(v_shape), mask=mask, index=index, prefix=prefix)
  layers = range(config.num_hidden_layers)
  return KVCache(k=tuple(jnp.zeros(k_shape, config.dtype) for _ in layers),
                 v=tuple(jnp.zeros(v_shape, config.dtype) for _ in layers), mask=mask, index=index, prefix=prefix)


def as_prefix(cache: KVCache, rows: jax.Array | None = None) -> KVPrefix:
  """A filled cache's slots as a `KVPrefix` (e.g. prompts prefilled once, for their G samples to share); `rows`:
  the prefix row each cache row reads (`KVPrefix.rows`)."""
  if cache.prefix is not None:
    raise ValueError("as_prefix: the cache already has a prefix")
  return KVPrefix(k=cache.k, v=cache.v, mask=cache.mask, rows=rows)


def cache_batch_axis(x: jax.Array) -> int:
  """The batch axis of a cache's key or value array (1 when stacked over layers, else 0)."""
  return x.ndim - 4


def grow_cache(cache: KVCache, max_length: int) -> KVCache:
  """The cache with empty (masked) slots appended up to `max_length`; the filled slots and `index` unchanged."""
  extra = max_length - cache.mask.shape[-1]
  if extra < 0:
    raise ValueError(f"grow_cache: cannot shrink {cache.mask.shape[-1]} slots to {max_length}")
  pad = lambda x, axis: jnp.pad(x, [(0, extra if a == axis % x.ndim else 0) for a in range(x.ndim)])
  return cache._replace(k=jax.tree.map(lambda x: pad(x, -1), cache.k), v=jax.tree.map(lambda x: pad(x, -2), cache.v),
                        mask=pad(cache.mask, -1))


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
  """RoPE inverse frequencies [head_dim // 2] (float32, as transformers computes them)."""
  dim = config.head_dim
  inv_freq = (1.0 / (np.float32(config.rope_theta) ** (np.arange(0, dim, 2).astype(np.float32) / dim))).astype(
      np.float32)
  s = config.rope_scaling
  if s is None:
    return inv_freq
  low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
  high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
  wavelen = 2 * np.pi / inv_freq
  scaled = np.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
  smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
      s.high_freq_factor - s.low_freq_factor)
  smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
  is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
  return np.where(is_medium, smoothed, scaled).astype(np.float32)


def rope_tables(config: ModelConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
  """cos, sin [B, L, head_dim] for integer positions [B, L] (rotate-half layout).

  XLA counts cos and sin as cheap and recomputes them inside every fusion that reads them (each layer's
  queries and keys, per head), so the sampler computes its steps' tables once, before its loop, and passes them
  in (`hidden_states(..., rope=...)`): at 256 x 64, 128 rows a CPU device, the queries' RoPE 25 -> 12 us a layer
  and step, the key write with its RoPE 36 -> 28 us.
  """
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(rope_inv_freq(config))
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.cos(angles), jnp.sin(angles)


def _apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates x [B, L, N, D] by the tables [B, L, D]."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  cos, sin = cos[:, :, None].astype(x.dtype), sin[:, :, None].astype(x.dtype)
  return x * cos + rotated * sin


def _normal(rngs: nnx.Rngs, shape, dtype) -> nnx.Param:
  return nnx.Param(0.02 * jax.random.normal(rngs.params(), shape, jnp.float32).astype(dtype))


class RMSNorm(nnx.Module):
  """y = scale * x / sqrt(mean(x²) + eps), the statistics in float32."""

  def __init__(self, dim: int, *, eps: float, param_dtype: str):
    self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.scale[...].astype(x.dtype) * y.astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def project(x: jax.Array, kernel: jax.Array, n_in: int) -> jax.Array:
  """x's last `n_in` axes contracted with kernel's first `n_in`: [..., *in] x [*in, *out] -> [..., *out].

  The forward is the plain contraction. The backward forms the kernel's gradient as one 2-D product
  xᵀ·dy ([R, in] x [R, out], contracted over the R rows, no operand copied); under autodiff of the einsum,
  XLA's CPU backend transposes dy instead, with the elementwise op that made dy (SwiGLU's derivative)
  fused into that unvectorised copy, which made the CPU update much slower.
  Values equal the einsum's; gradients equal autodiff's up to float rounding.
  """
  return jnp.tensordot(x, kernel, n_in)


def _project_fwd(x, kernel, n_in):
  return project(x, kernel, n_in), (x, kernel)


def _project_bwd(n_in, res, dy):
  x, kernel = res
  n_out = kernel.ndim - n_in
  out_axes = tuple(range(dy.ndim - n_out, dy.ndim))
  dx = jnp.tensordot(dy, kernel, (out_axes, tuple(range(n_in, kernel.ndim))))
  rows = lambda a, n: a.reshape(-1, int(np.prod(a.shape[a.ndim - n:])))
  dkernel = jax.lax.dot_general(rows(x, n_in), rows(dy, n_out), (((0,), (0,)), ((), ())))
  return dx.astype(x.dtype), dkernel.reshape(kernel.shape).astype(kernel.dtype)


project.defvjp(_project_fwd, _project_bwd)


class Proj(nnx.Module):
  """A linear map `x · kernel + bias` with a multi-dimensional kernel; `spec` is the einsum it computes.

  `lora` names the projection for `config.lora_targets`; a targeted one also has LoRA adapters `lora_a`
  [*in, r] and `lora_b` [r, *out] and adds (x · A) · B · lora_alpha / r (`grpo_jax.models.lora`).
  """

  def __init__(self, spec: str, kernel_shape, bias_shape, *, use_bias: bool, config: ModelConfig, rngs: nnx.Rngs,
               lora: str = ""):
    self.kernel = _normal(rngs, kernel_shape, config.param_dtype)
    self.bias = nnx.Param(jnp.zeros(bias_shape, config.param_dtype)) if use_bias else None
    x_axes, rest = spec.split(",")
    kernel_axes, out_axes = rest.split("->")
    self.n_in = len(set(x_axes) & set(kernel_axes))
    assert x_axes[len(x_axes) - self.n_in:] == kernel_axes[:self.n_in], spec  # trailing x axes x leading kernel axes
    assert out_axes == x_axes[:len(x_axes) - self.n_in] + kernel_axes[self.n_in:], spec
    self.dtype = config.dtype
    rank = config.lora_rank if lora in config.lora_targets else 0
    self.lora_a = nnx.Param(jnp.zeros((*kernel_shape[:self.n_in], rank), jnp.float32)) if rank else None
    self.lora_b = nnx.Param(jnp.zeros((rank, *kernel_shape[self.n_in:]), jnp.float32)) if rank else None
    self.lora_scale = config.lora_alpha / rank if rank else 0.0

  def __call__(self, x: jax.Array) -> jax.Array:
    y = project(x, self.kernel[...].astype(self.dtype), self.n_in)
    if self.bias is not None:
      y = y + self.bias[...].astype(self.dtype)
    if self.lora_a is not None:  # x·W + (x·A)·B·α/r: the update stays rank r, W is never copied
      xa = project(x, self.lora_a[...].astype(self.dtype), self.n_in)
      y = y + project(xa, (self.lora_scale * self.lora_b[...]).astype(self.dtype), 1)
    return y


def project_together(x: jax.Array, projs: tuple[Proj, ...]) -> tuple[jax.Array, ...]:
  """(p(x) for p in projs), projections of one input with kernels of one shape; on the CPU as one product.

  XLA's CPU backend runs each product as its own call, at a rate that grows with its width: SwiGLU's gate and
  up projections as one [R, E] x [E, 2 x M] product instead of two cost 267 us instead of 2 x 142 at R 128,
  E 128, M 384 (the sampler's decode step, BENCHMARKS.md). The kernels are stacked on a new axis after their
  input axes, so a split output axis stays split. Each output is the same dot products as its own projection's
  (the same values on the CPU). Other platforms keep the separate products (no stacked copy of the kernels).
  The model uses it in decode steps only: the gradients of the stacked product round differently from the
  separate ones', and the tiny default run's training amplifies any rounding into another trajectory.
  """
  first = projs[0]
  assert all(p.kernel.shape == first.kernel.shape and p.n_in == first.n_in and (p.bias is None) == (first.bias is None)
             for p in projs), "project_together: projections of one shape"
  separate = lambda x: tuple(p(x) for p in projs)
  if any(p.lora_a is not None for p in projs):
    return separate(x)

  def stacked(x):
    kernel = jnp.stack([p.kernel[...] for p in projs], axis=first.n_in).astype(first.dtype)
    y = project(x, kernel, first.n_in)  # [..., len(projs), *out]
    at = (slice(None),) * (x.ndim - first.n_in)
    outs = tuple(y[at + (i,)] for i in range(len(projs)))
    if first.bias is None:
      return outs
    return tuple(o + p.bias[...].astype(first.dtype) for o, p in zip(outs, projs))

  return jax.lax.platform_dependent(x, cpu=stacked, default=separate)


class Attention(nnx.Module):
  """Grouped-query self-attention with RoPE and an optional static-shape KV cache."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c = config
    e, h, k, d = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    self.q_proj = Proj("ble,ehd->blhd", (e, h, d), (h, d), use_bias=c.qkv_bias, config=c, rngs=rngs, lora="q")
    self.k_proj = Proj("ble,ekd->blkd", (e, k, d), (k, d), use_bias=c.qkv_bias, config=c, rngs=rngs, lora="k")
    self.v_proj = Proj("ble,ekd->blkd", (e, k, d), (k, d), use_bias=c.qkv_bias, config=c, rngs=rngs, lora="v")
    self.o_proj = Proj("blhd,hde->ble", (h, d, e), (e,), use_bias=c.o_bias, config=c, rngs=rngs, lora="o")
    if c.qk_norm:
      self.q_norm = RMSNorm(d, eps=c.rms_norm_eps, param_dtype=c.param_dtype)
      self.k_norm = RMSNorm(d, eps=c.rms_norm_eps, param_dtype=c.param_dtype)
    else:
      self.q_norm = self.k_norm = None
    self.num_kv_heads, self.num_groups, self.head_dim = k, c.num_groups, d
    self.attention = c.attention

  def __call__(self, x, cos, sin, allowed, kv, index):
    """x [B, L, E]; allowed [B, L, S] bool; kv: the (k, v) cache, [B, K, D, S] and [B, K, S, D], or None (S = L);
    or (k, v, prefix_k, prefix_v, prefix_mask), a `KVPrefix` layer's arrays attended before the S slots.

    One query token per row with a cache (a decode step) goes through `_decode_attention`. Returns the output and
    the updated (k, v).
    """
    b, l = x.shape[:2]
    if kv is not None and l == 1:  # a decode step (no gradient): k and v as one product on the CPU
      q, (k, v) = self.q_proj(x), project_together(x, (self.k_proj, self.v_proj))
    else:
      q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    q = constrain(_apply_rope(q, cos, sin), ("batch", "length", "heads", None))
    k = constrain(_apply_rope(k, cos, sin), ("batch", "length", "kv_heads", None))
    v = constrain(v, ("batch", "length", "kv_heads", None))
    q = q.reshape(b, l, self.num_kv_heads, self.num_groups, self.head_dim)
    if kv is not None:
      kv, prefix = kv[:2], kv[2:] or None
      if prefix is not None and l != 1:
        raise ValueError(f"a cache with a shared prefix takes one token per row, got {l}")
      if jnp.ndim(index):  # each row its own slot (one token a row): a scatter of B columns of keys, rows of values
        if l != 1:
          raise ValueError(f"a cache with per-row indices takes one token per row, got {l}")
        rows = jnp.arange(b)
        kv = (kv[0].at[rows, :, :, index].set(k[:, 0].astype(kv[0].dtype), mode="drop"),
              kv[1].at[rows, :, index, :].set(v[:, 0].astype(kv[1].dtype), mode="drop"))
      else:
        write = lambda cache, x, axes, at: jax.lax.dynamic_update_slice(cache, x.transpose(axes).astype(cache.dtype),
                                                                        at)
        kv = (write(kv[0], k, (0, 2, 3, 1), (0, 0, 0, index)), write(kv[1], v, (0, 2, 1, 3), (0, 0, index, 0)))
      if l == 1:
        out = _decode_attention(q, *kv, allowed, self.head_dim ** -0.5, prefix)
        return self.o_proj(constrain(out.reshape(b, l, -1, self.head_dim), ("batch", "length", "heads", None))), kv
      k, v = kv
    # Multi-token attention (training, scoring, prefill): the config's implementation (`attention.attend`).
    out = attention.attend(q.reshape(b, l, -1, self.head_dim), k, v, allowed, implementation=self.attention,
                           causal=kv is None, cache_layout=kv is not None)
    return self.o_proj(constrain(out, ("batch", "length", "heads", None))), kv


def _decode_attention(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array, scale: float,
                      prefix: tuple[jax.Array, jax.Array, jax.Array] | None = None) -> jax.Array:
  """One query token per row against the cache: B * K batched products per contraction.

  q [B, 1, K, G, D]; k [B, K, D, S]; v [B, K, S, D]; allowed [B, 1, S]. Returns [B, 1, K, G, D]. The same
  attention as the einsums of `Attention`, with the softmax written out so that a prefix can join it. Per
  (row, kv head) the scores are [G, D] x [D, S] and the output [G, S] x [S, D], batched dots that XLA's CPU
  backend runs through YNNPACK. With the keys [D, S] they beat the elementwise products reduced over D, then
  over S, with bit for bit the same values on the CPU measured (another processor's kernels may sum in another
  order).

  With `prefix` = (keys [B', K, D, P], values [B', K, P, D], mask [B', P]), B = B' * R, row r also attends to
  prefix row r // R's P slots, before its own: one softmax over P + S (`KVPrefix`). Each step then reads a
  prompt's slots once for its R samples, not R times. The prefix's part runs kv-head-major ([B', K, R·G, P]: the R samples' G query
  heads side by side against one [D, P] block of keys), whose fusions were faster than [B', R, K, G, P]'s.
  """
  f32, low = jnp.float32, jnp.finfo(jnp.float32).min
  b, _, n_kv, groups, d = q.shape
  scores = jnp.einsum("bkgd,bkds->bkgs", q[:, 0].astype(f32), k.astype(f32)) * scale  # [B, K, G, S]
  scores = jnp.where(allowed[:, None], scores, low)
  if prefix is None:
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    out = jnp.einsum("bkgs,bksd->bkgd", probs.astype(f32), v.astype(f32))  # [B, K, G, D]
    return out[:, None].astype(q.dtype)
  # With a prefix: one softmax over its P slots and the S own ones, without concatenating them: a common
  # maximum, the two parts' exponentials, their products with the values summed, divided by the total.
  # The prefix's queries kv-head-major, [B', K, R * G, D]: each prompt's R samples' G query heads side by side.
  pk, pv, pmask = prefix
  rows = pk.shape[0]
  r = b // rows
  to_prefix = lambda x: x.reshape(rows, r, n_kv, groups, *x.shape[3:]).swapaxes(1, 2).reshape(
      rows, n_kv, r * groups, *x.shape[3:])  # [B, K, G, ...] -> [B', K, R * G, ...]
  to_rows = lambda x: x.reshape(rows, n_kv, r, groups, *x.shape[3:]).swapaxes(1, 2).reshape(
      b, n_kv, groups, *x.shape[3:])  # and back
  qp = to_prefix(q[:, 0].astype(f32))
  pscores = jnp.einsum("bkgd,bkdp->bkgp", qp, pk.astype(f32)) * scale  # [B', K, R * G, P]
  pscores = jnp.where(pmask[:, None, None], pscores, low)
  top = jnp.maximum(jnp.max(scores, axis=-1), to_rows(jnp.max(pscores, axis=-1)[..., None])[..., 0])  # [B, K, G]
  e = jnp.exp(scores - top[..., None])
  pe = jnp.exp(pscores - to_prefix(top[..., None]))
  total = jnp.sum(e, axis=-1) + to_rows(jnp.sum(pe, axis=-1)[..., None])[..., 0]
  pout = jnp.einsum("bkgp,bkpd->bkgd", pe, pv.astype(f32))  # [B', K, R * G, D]
  out = (to_rows(pout) + jnp.einsum("bkgs,bksd->bkgd", e, v.astype(f32))) / total[..., None]
  return out[:, None].astype(q.dtype)


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    e, m, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
    self.gate_proj = Proj("ble,em->blm", (e, m), (m,), use_bias=bias, config=config, rngs=rngs, lora="gate")
    self.up_proj = Proj("ble,em->blm", (e, m), (m,), use_bias=bias, config=config, rngs=rngs, lora="up")
    self.down_proj = Proj("blm,me->ble", (m, e), (e,), use_bias=bias, config=config, rngs=rngs, lora="down")

  def __call__(self, x: jax.Array, *, together: bool = False) -> jax.Array:
    """`together`: gate and up as one product on the CPU (`project_together`; decode steps, which take no
    gradient, so that training's products and their rounding stay those of the separate projections)."""
    gate, up = project_together(x, (self.gate_proj, self.up_proj)) if together else (self.gate_proj(x), self.up_proj(x))
    h = jax.nn.silu(gate) * up
    return self.down_proj(constrain(h, ("batch", "length", "mlp")))


class DecoderLayer(nnx.Module):
  """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    kw = dict(eps=config.rms_norm_eps, param_dtype=config.param_dtype)
    self.input_norm = RMSNorm(config.hidden_size, **kw)
    self.attn = Attention(config, rngs=rngs)
    self.post_attn_norm = RMSNorm(config.hidden_size, **kw)
    self.mlp = MLP(config, rngs=rngs)

  def __call__(self, x, cos, sin, allowed, kv, index):
    h, kv = self.attn(self.input_norm(x), cos, sin, allowed, kv, index)
    x = x + h
    x = x + self.mlp(self.post_attn_norm(x), together=kv is not None and x.shape[1] == 1)
    return constrain(x, _BTE), kv


def _call_layer(layer, *args):
  return layer(*args)


def _prefix_layer(prefix: KVPrefix | None, i) -> tuple[jax.Array, ...]:
  """Layer i's (prefix keys, values, mask), or () without a prefix; with `prefix.rows`, each cache row's own
  prefix row, gathered (the XLA form of a paged read: a decode kernel that reads the rows in place can replace
  it behind `_decode_attention`)."""
  if prefix is None:
    return ()
  k, v, mask = prefix.k[i], prefix.v[i], prefix.mask
  if prefix.rows is not None:
    k, v, mask = (jnp.take(x, prefix.rows, axis=0) for x in (k, v, mask))
  return (constrain(k, CACHE_K_AXES), constrain(v, CACHE_V_AXES), mask)


def _stacked_layer(config: ModelConfig, rngs: nnx.Rngs) -> DecoderLayer:
  """A DecoderLayer whose every weight has a leading [num_hidden_layers] axis (called only through the scan).

  Its values are never used: params come in through `_merge` (init_params draws them).
  """
  graphdef, state = nnx.split(DecoderLayer(config, rngs=rngs))
  state = jax.tree.map(lambda x: jnp.broadcast_to(x, (config.num_hidden_layers, *x.shape)), state)
  return nnx.merge(graphdef, state)


class Embed(nnx.Module):
  """Token embedding table [vocab, embed]."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.embedding = _normal(rngs, (config.vocab_size, config.hidden_size), config.param_dtype)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    return jnp.take(self.embedding[...], tokens, axis=0)


class Decoder(nnx.Module):
  """Embedding, `num_hidden_layers` decoder layers and the final norm: tokens -> hidden states."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.embed = Embed(config, rngs=rngs)
    if config.scan_layers:
      setattr(self, STACKED, _stacked_layer(config, rngs))
    else:
      for i in range(config.num_hidden_layers):
        setattr(self, f"layers_{i}", DecoderLayer(config, rngs=rngs))
    self.final_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, param_dtype=config.param_dtype)

  def __call__(self, tokens, *, positions=None, attention_mask=None, cache: KVCache | None = None, rope=None):
    """Returns final-normed hidden states [B, L, E] and the updated cache (None without one)."""
    c = self.config
    b, l = tokens.shape
    mask = jnp.ones((b, l), bool) if attention_mask is None else attention_mask.astype(bool)
    steps = jnp.cumsum(mask, axis=-1, dtype=jnp.int32) - 1
    if cache is None:
      index = None
      key_mask = mask
      causal = jnp.tril(jnp.ones((l, l), bool))[None]
      offset = jnp.zeros((b, 1), jnp.int32)
    else:
      index = cache.index
      if jnp.ndim(index):  # per-row slots (one token a row): row b's query sits at its own slot index[b]
        key_mask = cache.mask.at[jnp.arange(b), index].set(mask[:, 0], mode="drop")
        causal = (jnp.arange(key_mask.shape[1])[None, :] <= index[:, None])[:, None]  # [B, 1, S]
      else:
        key_mask = jax.lax.dynamic_update_slice(cache.mask, mask, (0, index))
        q_slot = index + jnp.arange(l)
        causal = (jnp.arange(key_mask.shape[1])[None, :] <= q_slot[:, None])[None]  # [1, L, S]
      offset = jnp.sum(cache.mask, axis=-1, keepdims=True, dtype=jnp.int32)
      if cache.prefix is not None:
        filled = jnp.sum(cache.prefix.mask, axis=-1, keepdims=True, dtype=jnp.int32)
        if cache.prefix.rows is not None:
          offset = offset + jnp.take(filled, cache.prefix.rows, axis=0)
        else:
          offset = offset + jnp.repeat(filled, b // filled.shape[0], axis=0)
    if rope is None:
      rope = rope_tables(c, jnp.maximum(offset + steps, 0) if positions is None else positions)
    cos, sin = rope
    allowed = key_mask[:, None, :] & causal

    x = constrain(self.embed(tokens).astype(c.dtype), _BTE)
    if c.scan_layers:
      x, new_k, new_v = self._scan(x, cos, sin, allowed, cache, index)
    else:
      new_k, new_v = [], []
      for i in range(c.num_hidden_layers):
        layer = getattr(self, f"layers_{i}")
        kv = None if cache is None else (cache.k[i], cache.v[i], *_prefix_layer(cache.prefix, i))
        call = nnx.remat(_call_layer, policy=_POLICIES[c.remat_policy]) if c.remat else _call_layer
        x, kv = call(layer, x, cos, sin, allowed, kv, index)
        if kv is not None:
          new_k.append(kv[0])
          new_v.append(kv[1])
      new_k, new_v = tuple(new_k), tuple(new_v)
    x = self.final_norm(x)
    if cache is not None:
      cache = KVCache(k=new_k, v=new_v, mask=key_mask, index=index + l, prefix=cache.prefix)
    return x, cache

  def _scan(self, x, cos, sin, allowed, cache, index):
    """The stacked layers as one `lax.scan`; the stacked cache rides in the carry, updated in place."""
    c = self.config
    graphdef, state = nnx.split(getattr(self, STACKED))

    def body(carry, xs):
      x, ks, vs = carry
      layer_state, i = xs
      layer = nnx.merge(graphdef, layer_state)
      kv = None if ks is None else (constrain(ks[i], CACHE_K_AXES), constrain(vs[i], CACHE_V_AXES),
                                    *_prefix_layer(prefix, i))
      x, kv = layer(x, cos, sin, allowed, kv, index)
      if kv is not None:
        ks = jax.lax.dynamic_update_index_in_dim(ks, kv[0], i, 0)
        vs = jax.lax.dynamic_update_index_in_dim(vs, kv[1], i, 0)
      return (x, ks, vs), None

    if c.remat:
      body = jax.checkpoint(body, policy=_POLICIES[c.remat_policy], prevent_cse=False)
    prefix = None if cache is None else cache.prefix
    carry = (x, None, None) if cache is None else (x, cache.k, cache.v)
    (x, ks, vs), _ = jax.lax.scan(body, carry, (state, jnp.arange(c.num_hidden_layers)))
    return x, ks, vs


class LMHead(nnx.Module):
  """Untied output projection, kernel [embed, vocab]."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.kernel = _normal(rngs, (config.hidden_size, config.vocab_size), config.param_dtype)


class CausalLM(Decoder):
  """Decoder plus the output projection (the embedding itself when tied)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    super().__init__(config, rngs=rngs)
    if not config.tie_word_embeddings:
      self.lm_head = LMHead(config, rngs=rngs)


@functools.lru_cache(maxsize=32)
def _abstract(cls: type, config: ModelConfig):
  return nnx.split(nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0))))


def _has_adapters(params) -> bool:
  return isinstance(params, dict) and ("lora_a" in params or any(_has_adapters(v) for v in params.values()))


def _merge(cls: type, config: ModelConfig, params: Params) -> nnx.Module:
  if config.lora_rank and not _has_adapters(params):  # LoRA's base alone (its adapters off): the plain model
    config = config.replace(lora_rank=0, lora_alpha=0.0, lora_targets=())
  graphdef, abstract_state = _abstract(cls, config)
  state = jax.tree.map(lambda x: x, abstract_state)
  nnx.replace_by_pure_dict(state, params)
  return nnx.merge(graphdef, state)


def backbone(params: Params) -> Params:
  """The decoder part of a params dict (everything but `lm_head`)."""
  return {k: v for k, v in params.items() if k != "lm_head"}


def _pure_dict(state) -> Params:
  return nnx.to_pure_dict(state) if hasattr(nnx, "to_pure_dict") else state.to_pure_dict()


def _layer_keys(config: ModelConfig) -> list[str]:
  return [f"layers_{i}" for i in range(config.num_hidden_layers)]


def stack_layers(params: Params, config: ModelConfig) -> Params:
  """Unrolled params (`layers_{i}/...`) -> the scanned layout (`layers/...`, leading [L] axis).

  Works on any params-shaped dict holding the layers (policy, backbone, a reward
  model's "backbone"); other entries are kept as they are.
  """
  keys = _layer_keys(config)
  out = {k: v for k, v in params.items() if k not in keys}
  out[STACKED] = jax.tree.map(lambda *xs: jnp.stack(xs), *[params[k] for k in keys])
  return out


def unstack_layers(params: Params, config: ModelConfig) -> Params:
  """The scanned layout -> unrolled params (inverse of `stack_layers`)."""
  out = {k: v for k, v in params.items() if k != STACKED}
  for i, key in enumerate(_layer_keys(config)):
    out[key] = jax.tree.map(lambda x, i=i: x[i], params[STACKED])
  return out


def _drawn(names: tuple[str, ...]) -> bool:
  return names[-1] in ("kernel", "embedding")


def _draw_order(leaves) -> dict[tuple[str, ...], int]:
  """Where each drawn leaf ((path, shape) pairs of the unrolled layout) starts in the one draw: the dict's order
  (its keys sorted), but with the layers by number (layers_2 before layers_10; the same for ten layers or fewer)."""
  order = lambda path: tuple((k,) if not k.startswith("layers_") else ("layers_", int(k[7:])) for k in path)
  starts, n = {}, 0
  for names, shape in sorted(((tuple(p.key for p in path), leaf.shape) for path, leaf in leaves
                              if _drawn((path[-1].key,))), key=lambda item: order(item[0])):
    starts[names] = n
    n += int(np.prod(shape))
  return starts


def _init_params_one_draw(config: ModelConfig, key: jax.Array) -> Params:
  """`init_params` as one normal draw sliced into every weight: for keys whose draws cannot be sliced."""
  if config.scan_layers:
    return stack_layers(_init_params_one_draw(config.replace(scan_layers=False), key), config)
  shapes = _pure_dict(_abstract(CausalLM, config)[1])
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  starts = _draw_order(leaves)
  flat = 0.02 * jax.random.normal(key, (sum(int(np.prod(l.shape)) for p, l in leaves if _drawn((p[-1].key,))),),
                                  jnp.float32)
  out = []
  for path, leaf in leaves:
    names, size = tuple(p.key for p in path), int(np.prod(leaf.shape))
    if names in starts:
      out.append(flat[starts[names]:starts[names] + size].reshape(leaf.shape).astype(config.param_dtype))
    else:
      out.append((jnp.zeros if names[-1] == "bias" else jnp.ones)(leaf.shape, config.param_dtype))
  return jax.tree_util.tree_unflatten(treedef, out)


@functools.partial(jax.jit, static_argnums=0)
def init_params(config: ModelConfig, key: jax.Array) -> Params:
  """Random parameters as a plain nested dict, distributed as `CausalLM(config, rngs)` initialises them.

  Kernels and embeddings are normal(0, 0.02), biases zero, norm scales one. Every
  weight is a slice of one normal draw over all of them, `0.02 · normal(key,
  (N,))[start:start + size]`, in the unrolled layout's order with the layers by
  number (`_draw_order`). The draw is a loop over fixed-size pieces
  (`random_init.normal_pieces`), so the program holds one small draw whatever the
  model's size, and the weights are copies of its slices. With
  `config.scan_layers` the values are those of the unrolled layout, stacked: the
  same key gives the same model in both layouts.
  """
  if not random_init.sliceable(key):
    return _init_params_one_draw(config, key)
  dtype = config.param_dtype
  shapes = _pure_dict(_abstract(CausalLM, config.replace(scan_layers=False))[1])
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  starts = _draw_order(leaves)  # each drawn leaf's place in the draw
  n = sum(int(np.prod(leaf.shape)) for path, leaf in leaves if _drawn((path[-1].key,)))
  keys = _layer_keys(config)
  # A layer's draws (its weights one after another) fill a block of `layer` elements, the blocks one after another.
  layer = sum(int(np.prod(leaf.shape)) for path, leaf in leaves if path[0].key == keys[0] and _drawn((path[-1].key,)))
  # The barrier keeps the draw whole: the weights below are copies of its slices, and XLA does not fuse (and repeat)
  # the draw into each of them. The scanned layout reads up to a block past the end.
  extra = layer if config.scan_layers else 0
  flat = jax.lax.optimization_barrier(random_init.normal_pieces(key, n + extra, dtype, 0.02)).reshape(-1)

  def value(names, shape, stacked=False):
    """The leaf's slice of the draw, or (`stacked`) the L layers' slices of it, [L, *shape]."""
    if not _drawn(names):
      return (jnp.zeros if names[-1] == "bias" else jnp.ones)((len(keys), *shape) if stacked else shape, dtype)
    size, begin = int(np.prod(shape)), starts[names]
    if not stacked:
      return flat[begin:begin + size].reshape(shape)
    # From the first block's slice on, L rows a block apart: the slice in each block.
    return flat[begin:begin + len(keys) * layer].reshape(len(keys), layer)[:, :size].reshape(len(keys), *shape)

  if not config.scan_layers:
    return jax.tree_util.tree_unflatten(treedef, [value(tuple(p.key for p in path), leaf.shape)
                                                  for path, leaf in leaves])
  first = keys[0]
  out = {k: jax.tree_util.tree_map_with_path(lambda path, leaf, k=k: value((k, *(p.key for p in path)), leaf.shape),
                                             v) for k, v in shapes.items() if k not in keys}
  out[STACKED] = jax.tree_util.tree_map_with_path(
      lambda path, leaf: value((first, *(p.key for p in path)), leaf.shape, stacked=True), shapes[first])
  return out


def hidden_states(params: Params, config: ModelConfig, tokens: jax.Array, *, positions: jax.Array | None = None,
                  attention_mask: jax.Array | None = None, cache: KVCache | None = None,
                  rope: tuple[jax.Array, jax.Array] | None = None):
  """Final-normed hidden states.

  Args:
    params: policy params (an `lm_head` entry is ignored) or backbone params.
    config: the model config.
    tokens: [B, L] int token ids.
    positions: [B, L] int RoPE positions; default: from the mask, `offset + cumsum(mask) - 1`,
      where offset counts the real tokens already in the cache, so left padding is invisible.
    attention_mask: [B, L] bool, False at padding; default all True.
    cache: a `KVCache`; the new keys/values are written at `cache.index`.
    rope: (cos, sin) [B, L, head_dim], `rope_tables(config, positions)` computed ahead (a decode loop's, once
      for all its steps); replaces `positions`.

  Returns:
    (hidden [B, L, E] in `config.dtype`, updated cache or None).
  """
  chex.assert_rank(tokens, 2)
  if attention_mask is not None:
    chex.assert_equal_shape([tokens, attention_mask])
  if positions is not None:
    chex.assert_equal_shape([tokens, positions])
  if rope is not None:
    if positions is not None:
      raise ValueError("hidden_states: pass positions or their rope tables, not both")
    chex.assert_shape(rope, (*tokens.shape, config.head_dim))
  model = _merge(Decoder, config, backbone(params))
  return model(tokens, positions=positions, attention_mask=attention_mask, cache=cache, rope=rope)


def unembedding(params: Params, config: ModelConfig) -> jax.Array:
  """The output projection as [vocab, embed] (the input embedding when tied)."""
  if config.tie_word_embeddings:
    return params["embed"]["embedding"]
  return params["lm_head"]["kernel"].T


@jax.custom_vjp
def unembed(hidden: jax.Array, w: jax.Array) -> jax.Array:
  """Float32 logits z = hidden · wᵀ [..., V] from hidden [..., E] and w [V, E] of one dtype, float32 accumulation.

  The backward products run in that dtype too: dz (float32) is rounded to it, then dh = dz · w and
  dw = Σ dzᵀ · h accumulate in float32. Plain autodiff would promote them to float32 products (TF32 on a GPU,
  several bf16 passes on a TPU): the largest products of a bf16 update, [tokens, V] x [V, E]. Identical to
  autodiff in float32.
  """
  return jnp.einsum("...e,ve->...v", hidden, w, preferred_element_type=jnp.float32)


def _unembed_fwd(hidden, w):
  return unembed(hidden, w), (hidden, w)


def _unembed_bwd(residuals, dz):
  hidden, w = residuals
  dz = dz.astype(hidden.dtype)
  dh = jnp.einsum("...v,ve->...e", dz, w, preferred_element_type=jnp.float32).astype(hidden.dtype)
  dw = jnp.einsum("...v,...e->ve", dz, hidden, preferred_element_type=jnp.float32).astype(w.dtype)
  return dh, dw


unembed.defvjp(_unembed_fwd, _unembed_bwd)


def logits_from_hidden(params: Params, config: ModelConfig, hidden: jax.Array) -> jax.Array:
  """Float32 logits [..., V] from hidden states [..., E] (`unembed`)."""
  return unembed(hidden, unembedding(params, config).astype(hidden.dtype))


def apply(params: Params, config: ModelConfig, tokens: jax.Array, *, positions: jax.Array | None = None,
          attention_mask: jax.Array | None = None, cache: KVCache | None = None, return_hidden: bool = False):
  """Forward pass: params + token ids -> (float32 logits [B, L, V] or hidden [B, L, E], cache).

  See `hidden_states` for the arguments. The cache is None when none is given.
  """
  hidden, cache = hidden_states(params, config, tokens, positions=positions, attention_mask=attention_mask,
                                cache=cache)
  if return_hidden:
    return hidden, cache
  logits = logits_from_hidden(params, config, hidden)
  return constrain(logits, ("batch", "length", "vocab")), cache


_LEAF_AXES = {
    ("embed", "embedding"): ("vocab", "embed"),
    ("q_proj", "kernel"): ("embed", "heads", None),
    ("q_proj", "bias"): ("heads", None),
    ("k_proj", "kernel"): ("embed", "kv_heads", None),
    ("k_proj", "bias"): ("kv_heads", None),
    ("v_proj", "kernel"): ("embed", "kv_heads", None),
    ("v_proj", "bias"): ("kv_heads", None),
    ("o_proj", "kernel"): ("heads", None, "embed"),
    ("o_proj", "bias"): ("embed",),
    ("q_norm", "scale"): (None,),
    ("k_norm", "scale"): (None,),
    ("gate_proj", "kernel"): ("embed", "mlp"),
    ("gate_proj", "bias"): ("mlp",),
    ("up_proj", "kernel"): ("embed", "mlp"),
    ("up_proj", "bias"): ("mlp",),
    ("down_proj", "kernel"): ("mlp", "embed"),
    ("down_proj", "bias"): ("embed",),
    ("input_norm", "scale"): ("embed",),
    ("post_attn_norm", "scale"): ("embed",),
    ("final_norm", "scale"): ("embed",),
    ("lm_head", "kernel"): ("embed", "vocab"),
    ("head", "kernel"): ("embed",),
    ("head", "bias"): (),
}
# LoRA adapters: A [*in, r] has its kernel's input axes then the rank, B [r, *out] the rank then its output axes.
# The rank axis ("lora_rank") takes the fsdp axis where the kernel's own axes leave it free (B of q/k/v/gate/up, A
# of down: their kernels split over fsdp by the axis the adapter does not have), so every adapter is split.
_LEAF_AXES.update({(proj, leaf): axes for proj, n_in in (("q_proj", 1), ("k_proj", 1), ("v_proj", 1), ("o_proj", 2),
                                                         ("gate_proj", 1), ("up_proj", 1), ("down_proj", 1))
                   for leaf, axes in (("lora_a", (*_LEAF_AXES[(proj, "kernel")][:n_in], "lora_rank")),
                                      ("lora_b", ("lora_rank", *_LEAF_AXES[(proj, "kernel")][n_in:])))})


def logical_axes_of(params_shapes: Params) -> Params:
  """Logical axis names for every leaf of a params (or params-shaped) dict.

  A leaf under a `layers` key (the scanned layout) has an extra leading layer
  axis, named None (never sharded).
  """

  def names(path, leaf):
    key = tuple(p.key for p in path[-2:])
    axes = _LEAF_AXES[key]
    if any(getattr(p, "key", None) == STACKED for p in path[:-2]):
      axes = (None, *axes)
    if len(axes) != len(leaf.shape):
      raise ValueError(f"logical axes {axes} do not match shape {leaf.shape} at {jax.tree_util.keystr(path)}")
    return axes

  return jax.tree_util.tree_map_with_path(names, params_shapes)


def param_logical_axes(config: ModelConfig) -> Params:
  """A dict shaped like `init_params(config, key)` whose leaves are tuples of logical axis names.

  Tuples are pytree nodes, so map with the params first, e.g.
  `jax.tree.map(lambda p, names: ..., params, axes)`, or pass
  `is_leaf=lambda x: isinstance(x, tuple)`.
  """
  return logical_axes_of(_pure_dict(_abstract(CausalLM, config)[1]))
