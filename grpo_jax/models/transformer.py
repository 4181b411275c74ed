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

The decoder's neighbours live beside it: `layers` (projections, norms, attention, MLP, the block),
`attention` (the attention implementations, and decode attention over a cache), `kv_cache`, `rope`,
`params` (the params dict and its layouts), `random_init` (the weights' one draw) and `logical_axes`
(the parameters' and activations' axis names). This module re-exports the names that code running the
model uses (the cache, RoPE tables, the layouts), so `transformer.X` stays the model's one entry point.
"""

import functools

import chex
import jax
import jax.numpy as jnp
from flax import nnx

# Besides the names used here, those that code running the model reaches as `transformer.X` (the cache, RoPE
# tables, the params' layouts).
from grpo_jax.models import kv_cache, random_init
from grpo_jax.models.config import REMAT_POLICIES, ModelConfig
from grpo_jax.models.kv_cache import (CACHE_K_AXES, CACHE_V_AXES, KVCache, KVPrefix, LayerKV, as_prefix,
                                      cache_batch_axis, grow_cache, init_cache)
from grpo_jax.models.layers import BTE, DecoderLayer, Embed, LMHead, RMSNorm
from grpo_jax.models.logical_axes import constrain, logical_axes_of
from grpo_jax.models.params import STACKED, Params, backbone, merge, shapes, stack_layers, unstack_layers
from grpo_jax.models.rope import rope_inv_freq, rope_tables

# config.remat_policy -> jax.checkpoint policy (None: save nothing but the layer's input).
_POLICIES = {"full": None, "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
             "dots": jax.checkpoint_policies.checkpoint_dots}
assert set(_POLICIES) == set(REMAT_POLICIES)


def _call_layer(layer, *args):
  return layer(*args)


def _stacked_layer(config: ModelConfig, rngs: nnx.Rngs) -> DecoderLayer:
  """A DecoderLayer whose every weight has a leading [num_hidden_layers] axis (called only through the scan).

  Its values are never used: params come in through `params.merge` (init_params draws them).
  """
  graphdef, state = nnx.split(DecoderLayer(config, rngs=rngs))
  state = jax.tree.map(lambda x: jnp.broadcast_to(x, (config.num_hidden_layers, *x.shape)), state)
  return nnx.merge(graphdef, state)


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

    x = constrain(self.embed(tokens).astype(c.dtype), BTE)
    if c.scan_layers:
      x, new_k, new_v = self._scan(x, cos, sin, allowed, cache, index)
    else:
      new_k, new_v = [], []
      for i in range(c.num_hidden_layers):
        layer = getattr(self, f"layers_{i}")
        kv = None if cache is None else LayerKV(cache.k[i], cache.v[i], kv_cache.layer_prefix(cache.prefix, i))
        call = nnx.remat(_call_layer, policy=_POLICIES[c.remat_policy]) if c.remat else _call_layer
        x, kv = call(layer, x, cos, sin, allowed, kv, index)
        if kv is not None:
          new_k.append(kv.k)
          new_v.append(kv.v)
      new_k, new_v = tuple(new_k), tuple(new_v)
    x = self.final_norm(x)
    if cache is not None:
      cache = KVCache(k=new_k, v=new_v, mask=key_mask, index=index + l, prefix=cache.prefix)
    return x, cache

  def _scan(self, x, cos, sin, allowed, cache, index):
    """The stacked layers as one `lax.scan`.

    A one-token step (decoding) carries the stacked cache and updates it in place. A call of several tokens
    (a prefill, a forward after a prompt's keys and values) reads layer i's cache as the scan's i-th input and
    returns its new keys and values as the i-th output: a cache in the carry would be an input of every
    iteration, so under `remat` and a gradient each of the L iterations would save all L layers' caches.
    """
    c = self.config
    graphdef, state = nnx.split(getattr(self, STACKED))
    prefix = None if cache is None else cache.prefix
    layer_kv = lambda k, v, i: LayerKV(constrain(k, CACHE_K_AXES), constrain(v, CACHE_V_AXES),
                                       kv_cache.layer_prefix(prefix, i))
    remat = (lambda f: jax.checkpoint(f, policy=_POLICIES[c.remat_policy], prevent_cse=False)) if c.remat else (
        lambda f: f)
    layers = (state, jnp.arange(c.num_hidden_layers))

    if cache is not None and x.shape[1] == 1:
      def step(carry, xs):
        x, ks, vs = carry
        layer_state, i = xs
        x, kv = nnx.merge(graphdef, layer_state)(x, cos, sin, allowed, layer_kv(ks[i], vs[i], i), index)
        ks = jax.lax.dynamic_update_index_in_dim(ks, kv.k, i, 0)
        vs = jax.lax.dynamic_update_index_in_dim(vs, kv.v, i, 0)
        return (x, ks, vs), None

      (x, ks, vs), _ = jax.lax.scan(remat(step), (x, cache.k, cache.v), layers)
      return x, ks, vs

    def run(x, xs):
      layer_state, i, k, v = xs
      x, kv = nnx.merge(graphdef, layer_state)(x, cos, sin, allowed, None if k is None else layer_kv(k, v, i),
                                               index)
      return x, None if kv is None else (kv.k, kv.v)

    k, v = (None, None) if cache is None else (cache.k, cache.v)
    x, kvs = jax.lax.scan(remat(run), x, (*layers, k, v))
    return (x, None, None) if kvs is None else (x, *kvs)


class CausalLM(Decoder):
  """Decoder plus the output projection (the embedding itself when tied)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    super().__init__(config, rngs=rngs)
    if not config.tie_word_embeddings:
      self.lm_head = LMHead(config, rngs=rngs)


@functools.partial(jax.jit, static_argnums=0)
def init_params(config: ModelConfig, key: jax.Array) -> Params:
  """Random parameters as a plain nested dict, distributed as `CausalLM(config, rngs)` initialises them.

  Kernels and embeddings are normal(0, 0.02), biases zero, norm scales one. Every
  weight is a slice of one normal draw over all of them, `0.02 · normal(key,
  (N,))[start:start + size]`, in the unrolled layout's order with the layers by
  number (`random_init.draw`). With `config.scan_layers` the values are those of
  the unrolled layout, stacked: the same key gives the same model in both layouts.
  """
  unrolled = shapes(CausalLM, config.replace(scan_layers=False))
  if random_init.sliceable(key):
    return random_init.draw(unrolled, key, config.param_dtype, stacked=config.scan_layers)
  params = random_init.one_draw(unrolled, key, config.param_dtype)
  return stack_layers(params, config) if config.scan_layers else params


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
  model = merge(Decoder, config, backbone(params))
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


def param_logical_axes(config: ModelConfig) -> Params:
  """A dict shaped like `init_params(config, key)` whose leaves are tuples of logical axis names.

  Tuples are pytree nodes, so map with the params first, e.g.
  `jax.tree.map(lambda p, names: ..., params, axes)`, or pass
  `is_leaf=lambda x: isinstance(x, tuple)`.
  """
  return logical_axes_of(shapes(CausalLM, config))
