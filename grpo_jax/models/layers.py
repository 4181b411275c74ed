"""The decoder's layers, in Flax NNX: projections, RMSNorm, attention, the SwiGLU MLP, the block, embeddings.

Every matrix product of the model goes through `project` (a hand-written backward), `project_together` or
`project_qkv` (several projections of one input as one product, in decode steps: `config.decode_projections`): the
products whose form was chosen for a backend are all in this file.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from grpo_jax.models import attention
from grpo_jax.models import kv_cache
from grpo_jax.models import rope
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.kv_cache import LayerKV
from grpo_jax.models.logical_axes import constrain

BTE = ("batch", "length", "embed")  # the logical axes of hidden states
_BLHD = ("batch", "length", "heads", None)


def normal(rngs: nnx.Rngs, shape, dtype) -> nnx.Param:
  """A weight drawn as normal(0, 0.02) (the models' `initializer_range`)."""
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
    self.kernel = normal(rngs, kernel_shape, config.param_dtype)
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


def _on_platforms(x: jax.Array, mode: str, together, separate):
  """`together(x)` where `mode` (`config.decode_projections`) asks for one product: "auto" on the CPU only,
  "together" everywhere; else `separate(x)`."""
  if mode == "together":
    return together(x)
  if mode == "auto":
    return jax.lax.platform_dependent(x, cpu=together, default=separate)
  return separate(x)


def project_together(x: jax.Array, projs: tuple[Proj, ...], mode: str = "auto") -> tuple[jax.Array, ...]:
  """(p(x) for p in projs), projections of one input with kernels of one shape, as one product where `mode` asks
  for it (`_on_platforms`: by default on the CPU only).

  XLA's CPU backend runs each product as its own library call, whose throughput grows with the product's width,
  so at a decode step's shapes SwiGLU's gate and up projections cost less as one [R, E] x [E, 2·M] product than
  as two [R, E] x [E, M] ones (and k and v likewise); on a GPU one product is one kernel instead of two. The
  kernels are stacked on a new axis after their input axes, so a split output axis stays split; in a decode loop
  over unrolled layers XLA hoists the stacking out of the loop (the params are loop-invariant), so it runs once a
  call. Each output is the same dot products as its own projection's (the same values on the CPU). The model uses
  it in decode steps only: the gradients of the stacked product round differently from the separate ones', and
  the tiny default run's training amplifies any rounding into another trajectory.
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

  return _on_platforms(x, mode, stacked, separate)


def project_qkv(x: jax.Array, q_proj: Proj, k_proj: Proj, v_proj: Proj) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(q, k, v) of x [B, L, E] as one product: the kernels grouped per key/value head, [E, K, H/K + 2, D] (the H/K
  query heads of kv head k, then its key and its value), so that splitting the K axis over devices keeps each
  group on one device. q [B, L, H, D] (query head h reads kv head h // (H/K), as `attention` groups them), k and v
  [B, L, K, D]: the same dot products as the three projections'. With LoRA adapters on any of them: the three
  products (`Proj`), which add the adapters."""
  if any(p.lora_a is not None for p in (q_proj, k_proj, v_proj)):
    return q_proj(x), k_proj(x), v_proj(x)
  e, h, d = q_proj.kernel.shape
  k = k_proj.kernel.shape[1]
  kernel = jnp.concatenate([q_proj.kernel[...].reshape(e, k, h // k, d), k_proj.kernel[...][:, :, None],
                            v_proj.kernel[...][:, :, None]], axis=2).astype(q_proj.dtype)
  y = project(x, kernel, 1)  # [B, L, K, H/K + 2, D]
  q, key, value = y[..., :h // k, :].reshape(*x.shape[:-1], h, d), y[..., h // k, :], y[..., h // k + 1, :]
  if q_proj.bias is not None:
    q = q + q_proj.bias[...].astype(q_proj.dtype)
  if k_proj.bias is not None:
    key = key + k_proj.bias[...].astype(k_proj.dtype)
  if v_proj.bias is not None:
    value = value + v_proj.bias[...].astype(v_proj.dtype)
  return q, key, value


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
    self.attention = c.attention
    self.decode_projections = c.decode_projections

  def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, allowed: jax.Array, kv: LayerKV | None,
               index: jax.Array | None) -> tuple[jax.Array, LayerKV | None]:
    """x [B, L, E]; cos, sin [B, L, head_dim]; allowed [B, L, S] bool; kv: the layer's cache (S slots, after its
    prefix if it has one) or None (S = L); index: where the L new keys and values go in it (`kv_cache.write`).

    Returns the output [B, L, E] and the updated `LayerKV` (None without one). One query token per row with a
    cache (a decode step) goes through `attention.decode_attend`; the rest through `attention.attend` with the
    config's implementation.
    """
    b, l = x.shape[:2]
    if kv is not None and l == 1 and self.decode_projections == "together":  # a decode step (no gradient)
      q, k, v = project_qkv(x, self.q_proj, self.k_proj, self.v_proj)
    elif kv is not None and l == 1:  # "auto": k and v as one product on the CPU
      q, (k, v) = self.q_proj(x), project_together(x, (self.k_proj, self.v_proj), self.decode_projections)
    else:
      q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    q = constrain(rope.apply(q, cos, sin), _BLHD)
    k = constrain(rope.apply(k, cos, sin), ("batch", "length", "kv_heads", None))
    v = constrain(v, ("batch", "length", "kv_heads", None))
    if kv is None:  # training and scoring: keys and values of this forward's own tokens
      out = attention.attend(q, k, v, allowed, implementation=self.attention, causal=True)
      return self.o_proj(constrain(out, _BLHD)), None
    if kv.prefix is not None and l != 1:
      raise ValueError(f"a cache with a shared prefix takes one token per row, got {l}")
    kv = kv_cache.write(kv, k, v, index)
    if l == 1:
      out = attention.decode_attend(q, kv.k, kv.v, allowed, kv.prefix)
    else:  # a prefill, or the grouped forward's completions against their prompts' cache
      out = attention.attend(q, kv.k, kv.v, allowed, implementation=self.attention, cache_layout=True)
    return self.o_proj(constrain(out, _BLHD)), kv


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    e, m, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
    self.gate_proj = Proj("ble,em->blm", (e, m), (m,), use_bias=bias, config=config, rngs=rngs, lora="gate")
    self.up_proj = Proj("ble,em->blm", (e, m), (m,), use_bias=bias, config=config, rngs=rngs, lora="up")
    self.down_proj = Proj("blm,me->ble", (m, e), (e,), use_bias=bias, config=config, rngs=rngs, lora="down")
    self.decode_projections = config.decode_projections

  def __call__(self, x: jax.Array, *, together: bool = False) -> jax.Array:
    """`together`: gate and up as one product where `config.decode_projections` asks for it (`project_together`;
    decode steps, which take no gradient, so that training's products and their rounding stay those of the
    separate projections)."""
    gate, up = (project_together(x, (self.gate_proj, self.up_proj), self.decode_projections) if together
                else (self.gate_proj(x), self.up_proj(x)))
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

  def __call__(self, x, cos, sin, allowed, kv: LayerKV | None, index):
    """See `Attention`; returns the layer's output [B, L, E] and the updated `LayerKV` (None without one)."""
    h, kv = self.attn(self.input_norm(x), cos, sin, allowed, kv, index)
    x = x + h
    x = x + self.mlp(self.post_attn_norm(x), together=kv is not None and x.shape[1] == 1)
    return constrain(x, BTE), kv


class Embed(nnx.Module):
  """Token embedding table [vocab, embed]."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.embedding = normal(rngs, (config.vocab_size, config.hidden_size), config.param_dtype)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    return jnp.take(self.embedding[...], tokens, axis=0)


class LMHead(nnx.Module):
  """Untied output projection, kernel [embed, vocab]."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.kernel = normal(rngs, (config.hidden_size, config.vocab_size), config.param_dtype)
