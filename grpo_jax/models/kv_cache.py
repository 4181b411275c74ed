"""The static-shape key/value cache of decoding: its layout, a shared read-only prefix, one layer's view of it.

Keys are stored [B, kv_heads, head_dim, S] and values [B, kv_heads, S, head_dim] (`CACHE_K_AXES`, `CACHE_V_AXES`).
In a decode step's attention (`attention.decode_attend`), per (row, kv head), the scores q·k are a [G, D] x [D, S]
product and the output p·v a [G, S] x [S, D] one: each operand has the contracted axis where a batched matrix
product wants it, S (the long axis) contiguous in the keys and D in the values, so neither is transposed in a
step. A step writes one [D] column of keys and one [D] row of values per (row, kv head).

A cache holds its slots per layer as a tuple of arrays, or with `config.scan_layers` as one array stacked over the
layers (a leading [L] axis); `cache_batch_axis` says which axis is the batch in both cases.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.logical_axes import constrain

CACHE_K_AXES = ("batch", "kv_heads", None, "length")
CACHE_V_AXES = ("batch", "kv_heads", "length", None)

# A row's own cache columns (its completion's, after a shared prompt prefix) are a multiple of this (`own_columns`):
# a decode step's batched matmuls over them then run at whole vector tiles. On this CPU, 192 and 64 columns instead
# of 191 and 63 made the rollout engine 6-9% faster at T = 192 and 64 at equal lengths (9% on the T = 192 tail) and
# the one-segment static sampler 7-11% faster at T = 192.
OWN_COLUMN_MULTIPLE = 16


def own_columns(max_new_tokens: int) -> int:
  """The own cache columns of a row that decodes up to T = `max_new_tokens` tokens: its first T - 1 tokens are fed
  back (its last is not), rounded up to a multiple of `OWN_COLUMN_MULTIPLE`; the columns past T - 1 stay masked."""
  return -(-max(max_new_tokens - 1, 1) // OWN_COLUMN_MULTIPLE) * OWN_COLUMN_MULTIPLE


class KVPrefix(NamedTuple):
  """Keys and values of prefixes (prompts) that cache rows read before their own slots, stored once each.

  Without `rows`, groups of G consecutive cache rows share a prefix row (a prompt's G samples, `sampling`):
  B' = B / G. With `rows`, cache row b reads prefix row rows[b], any of the B' (a rollout engine's slot pointing
  at its completion's prompt, `rollout_engine`).

  Attributes:
    k: per layer, keys [B', kv_heads, head_dim, P]; stacked [L, B', ...] with `config.scan_layers`; one layer's
      array in a `LayerKV`.
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


class LayerKV(NamedTuple):
  """One layer's part of a `KVCache`, what its attention reads and writes.

  Attributes:
    k: keys [B, kv_heads, head_dim, S].
    v: values [B, kv_heads, S, head_dim].
    prefix: the layer's `KVPrefix` (k [B', kv_heads, head_dim, P], v [B', kv_heads, P, head_dim], the mask and
      rows of the cache's), read before the S slots; None: no prefix.
  """
  k: jax.Array
  v: jax.Array
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


def layer_prefix(prefix: KVPrefix | None, i) -> KVPrefix | None:
  """Layer i's part of a prefix (i a Python int for per-layer tuples, or a traced index into stacked arrays)."""
  return None if prefix is None else prefix._replace(k=prefix.k[i], v=prefix.v[i])


def prefix_per_row(prefix: KVPrefix) -> KVPrefix:
  """One layer's prefix with `rows` resolved: each cache row's own prefix row gathered ([B, ...], rows None), or
  without `rows` the prefix as it is (B' rows, each read by a group of consecutive cache rows). The gather is the
  XLA form of a paged read; a decode kernel that reads the rows in place would take `rows` instead."""
  k, v, mask = prefix.k, prefix.v, prefix.mask
  if prefix.rows is not None:
    k, v, mask = (jnp.take(x, prefix.rows, axis=0) for x in (k, v, mask))
  return KVPrefix(k=constrain(k, CACHE_K_AXES), v=constrain(v, CACHE_V_AXES), mask=mask)


def write(kv: LayerKV, k: jax.Array, v: jax.Array, index: jax.Array) -> LayerKV:
  """`kv` with L new keys and values [B, L, kv_heads, head_dim] written from slot `index` on.

  `index` [] int32 writes every row's L tokens at the same slots; [B] int32 writes each row's one token (L = 1)
  at its own slot, a write at an index >= S dropped (a scatter of B columns of keys and B rows of values).
  """
  if jnp.ndim(index):
    b, l = k.shape[:2]
    if l != 1:
      raise ValueError(f"a cache with per-row indices takes one token per row, got {l}")
    rows = jnp.arange(b)
    return kv._replace(k=kv.k.at[rows, :, :, index].set(k[:, 0].astype(kv.k.dtype), mode="drop"),
                       v=kv.v.at[rows, :, index, :].set(v[:, 0].astype(kv.v.dtype), mode="drop"))
  put = lambda cache, x, axes, at: jax.lax.dynamic_update_slice(cache, x.transpose(axes).astype(cache.dtype), at)
  return kv._replace(k=put(kv.k, k, (0, 2, 3, 1), (0, 0, 0, index)), v=put(kv.v, v, (0, 2, 1, 3), (0, 0, index, 0)))
