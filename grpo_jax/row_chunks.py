"""Forwards over many rows in row chunks: one compiled chunk, looped inside the program.

A forward that sees all B·G rows of a step at once (π_ref and π_old log-probs, reward-model scores, PPO's
values) holds activations for every row at the same time: its logits chunk [rows, chunk, V], attention scores
[rows, heads, L, L] and, in the grouped forward, a KV cache of every row. `map_rows` runs the same function over
row chunks of R rows in a `lax.map` (a `scan`, so the program holds one chunk's activations plus the outputs),
and `rows_per_chunk` picks R from a memory budget and an estimate of one row's bytes (`forward_row_bytes`).

Each row's outputs depend on that row alone, so the values are the unchunked ones up to float rounding (the
products run over fewer rows). Chunk c holds rows c, c + C, c + 2C, ... (C chunks): with the rows split over
devices in contiguous blocks, every chunk keeps that split, and no device idles while another works.
"""

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import chips
from grpo_jax.chips import GiB
from grpo_jax.models import kv_cache
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.logical_axes import constrain

CPU_BUDGET_BYTES = 4 * GiB  # the default budget of a CPU device (host memory, shared with everything else)
DEVICE_BUDGET_FRACTION = 0.25  # the default budget of an accelerator: this share of its memory


def map_rows(fn: Callable, arrays: Sequence[jax.Array], rows_per_chunk: int, *, group: int = 1):
  """fn(*arrays) computed R = `rows_per_chunk` rows at a time: the same pytree of [N, ...] outputs.

  Args:
    fn: maps arrays of [R, ...] rows to a pytree of [R, ...] outputs, each row's from that row alone.
    arrays: [N, ...] inputs, rows aligned.
    rows_per_chunk: R, a multiple of `group`; 0 or >= N: one call, fn(*arrays).
    group: rows that must stay together, in consecutive blocks of this many (a prompt's G samples in the
      grouped forward): chunks hold whole groups, in their order.

  When the N / group groups are not a multiple of R / group, the last groups are repeated up to one (their
  outputs are dropped).
  """
  n = arrays[0].shape[0]
  if any(x.shape[0] != n for x in arrays):
    raise ValueError(f"map_rows: arrays of {[x.shape[0] for x in arrays]} rows; they must agree")
  if n % group or rows_per_chunk % group:
    raise ValueError(f"map_rows: {n} rows and chunks of {rows_per_chunk} must be whole groups of {group}")
  if not 0 < rows_per_chunk < n:
    return fn(*arrays)
  units, per_chunk = n // group, rows_per_chunk // group
  chunks = -(-units // per_chunk)
  padded = chunks * per_chunk
  take = np.minimum(np.arange(padded), units - 1)  # the groups, the last ones repeated to fill the last chunk

  def split(x):  # [N, ...] -> [C, R, ...]: chunk c holds groups c, c + C, ...
    x = x.reshape(units, group, *x.shape[1:])
    x = x if padded == units else x[take]
    return x.reshape(per_chunk, chunks, group, *x.shape[2:]).swapaxes(0, 1).reshape(
        chunks, per_chunk * group, *x.shape[2:])

  def join(y):  # [C, R, ...] -> [N, ...]
    y = y.reshape(chunks, per_chunk, group, *y.shape[2:]).swapaxes(0, 1)
    return y.reshape(padded * group, *y.shape[3:])[:n]

  out = jax.lax.map(lambda xs: fn(*xs), tuple(split(x) for x in arrays))
  return jax.tree.map(join, out)


def map_live_blocks(fn: Callable, arrays: Sequence[jax.Array], rows_per_block: int, live: jax.Array):
  """fn(*arrays) over consecutive blocks of R = `rows_per_block` rows (block c: rows cR ... cR + R - 1), a block
  without a `live` row skipped: its outputs are zeros and fn does not run (a `lax.cond` in the loop).

  For rows padded to one fixed count with the real ones first (Flow-GRPO's turns): the program compiles once
  and runs the blocks its real rows fill. fn maps [R, ...] rows to a pytree of [R, ...] outputs, each row's from
  that row alone; N must be a multiple of R. Under a mesh's rules each block's rows are split over the data axes
  (the `batch` logical axis), so no device waits while another runs a block.
  """
  n = arrays[0].shape[0]
  if any(x.shape[0] != n for x in arrays) or live.shape != (n,):
    raise ValueError(f"map_live_blocks: arrays of {[x.shape[0] for x in arrays]} rows and live {live.shape}; "
                     "they must agree")
  if rows_per_block < 1 or n % rows_per_block:
    raise ValueError(f"map_live_blocks: {n} rows are not whole blocks of {rows_per_block}")
  blocks = n // rows_per_block
  split = lambda x: constrain(x.reshape(blocks, rows_per_block, *x.shape[1:]), (None, "batch") + (None,) * (x.ndim - 1))
  shapes = jax.eval_shape(fn, *(x[:rows_per_block] for x in arrays))

  def block(xs):
    *xs, alive = xs
    return jax.lax.cond(jnp.any(alive), lambda: fn(*xs),
                        lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes))

  out = jax.lax.map(block, tuple(split(x) for x in (*arrays, live)))
  return jax.tree.map(lambda y: y.reshape(n, *y.shape[2:]), out)


def rows_per_chunk(total_rows: int, row_bytes: float, budget_bytes: float, *, devices: int = 1,
                   multiple: int = 1) -> int:
  """Rows per chunk for `total_rows` rows of `row_bytes` each under `budget_bytes` per device.

  The rows are split over `devices` (the data-parallel ones), so a chunk of R rows holds R / devices of them on
  each. R is a multiple of `multiple` and of `devices`, as large as the budget allows,
  then evened out over the chunks that takes; `total_rows` (one chunk) when they all fit.
  """
  step = int(np.lcm(multiple, devices))
  fit = int(budget_bytes // max(row_bytes, 1)) * devices
  rows = max(step, fit // step * step)
  if rows >= total_rows:
    return total_rows
  chunks = -(-total_rows // rows)
  even = -(-total_rows // chunks)  # <= rows
  return -(-even // step) * step


def forward_row_bytes(config: ModelConfig, length: int, *, logits_chunk: int = 0, cached: bool = False,
                      fused_attention: bool | None = None) -> int:
  """An estimate of the activation bytes one row of `length` tokens holds at the peak of a forward (no grad).

  The largest live arrays of a layer: the residual stream, q, k, v and the attention output ~ 6·L·E, the MLP's
  gate, up and product ~ 3·L·M (in the activation dtype); the attention scores and their softmax, 2·N·L²
  float32, unless the attention is fused (`config.attention` cudnn or pallas: blocks, not [L, L]); the
  log-prob chunk's float32 logits, their exponentials and a mask, 9·min(chunk, L)·V bytes (`logits_chunk` > 0);
  with `cached` (the grouped forward's KV cache, every layer's keys and values) 2·layers·K·D·L. The TPU
  compiler's figures for a Qwen2.5-0.5B π_ref forward are in BENCHMARKS.md.
  """
  c = config
  act = jnp.dtype(c.dtype).itemsize
  fused = c.attention in ("cudnn", "pallas") if fused_attention is None else fused_attention
  layer = (6 * c.hidden_size + 3 * c.intermediate_size) * length * act
  scores = 0 if fused else 2 * c.num_attention_heads * length * length * 4
  logits = 9 * min(logits_chunk, length) * c.vocab_size if logits_chunk else 0
  cache = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * length * act if cached else 0
  return int(layer + scores + logits + cache)


def sampler_prompt_bytes(config: ModelConfig, prompt_len: int, num_samples: int, max_new_tokens: int) -> int:
  """An estimate of the bytes one prompt and its G samples hold in the sampler (`sampling.sample`): the prompt's
  keys and values (2·layers·K·D·P), its samples' own cache slots (G times 2·layers·K·D·C, C =
  `kv_cache.own_columns(T)`), the prefill's activations (`forward_row_bytes` at P) and a step's float32 logits,
  filtered, noised and normalised (3·G·V)."""
  c = config
  kv = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * jnp.dtype(c.dtype).itemsize
  slots = prompt_len + num_samples * kv_cache.own_columns(max_new_tokens)
  return int(kv * slots + forward_row_bytes(c, prompt_len) + 3 * num_samples * c.vocab_size * 4)


def prompts_per_chunk(num_prompts: int, prompt_bytes: float, budget_bytes: float, *, shards: int = 1,
                      multiple: int = 1) -> int:
  """The sampler's `prompt_chunk`: 0 (all at once) when each shard's num_prompts / shards prompts fit
  `budget_bytes`, else the most prompts that fit, divide them and are a multiple of `multiple` (the fewest such
  when none fits)."""
  local = num_prompts // shards
  fit = int(budget_bytes // max(prompt_bytes, 1))
  if fit >= local:
    return 0
  sizes = [d for d in range(1, local + 1) if local % d == 0 and d % multiple == 0] or [local]
  return max([d for d in sizes if d <= fit] or [min(sizes)])


def engine_bytes(config: ModelConfig, num_prompts: int, prompt_len: int, max_new_tokens: int) -> tuple[int, int]:
  """An estimate of what `rollout_engine.generate` holds: (bytes of its B prompts, bytes of one slot).

  The prompts: their keys and values (2·layers·K·D·P each), the prefill's activations (`forward_row_bytes` at P)
  and their last hidden states. A slot: its own cache twice (2·layers·K·D·C, C = `kv_cache.own_columns(T)`: the
  whole cache, and the copy a phase cuts from it, `rollout_engine.phase_widths`), one layer's gathered prefix
  (2·K·D·P) and a step's float32 logits, filtered, noised and normalised (3·V).
  """
  c = config
  act = jnp.dtype(c.dtype).itemsize
  kv = 2 * c.num_key_value_heads * c.head_dim * act
  prompts = num_prompts * (c.num_hidden_layers * kv * prompt_len + forward_row_bytes(c, prompt_len)
                           + c.hidden_size * act)
  slot = 2 * c.num_hidden_layers * kv * kv_cache.own_columns(max_new_tokens) + kv * prompt_len + 3 * c.vocab_size * 4
  return int(prompts), int(slot)


def slots_that_fit(num_completions: int, prompts_bytes: float, slot_bytes: float, budget_bytes: float, *,
                   most: int, shards: int = 1) -> int:
  """The engine's slots over `shards` shards (each holding 1 / shards of the prompts and of the slots): `most`,
  or fewer when they would not fit `budget_bytes` per shard beside the prompts; at least one a shard."""
  fit = int((budget_bytes - prompts_bytes / shards) // max(slot_bytes, 1)) * shards
  return max(min(most, num_completions, fit), shards)


def default_budget_bytes(device: jax.Device | None = None) -> int:
  """The activation budget per device when none is given: DEVICE_BUDGET_FRACTION of an accelerator's memory
  (`memory_stats()["bytes_limit"]`, else its chip's memory in `chips`: a TPU topology's device, ahead of time,
  reports none); CPU_BUDGET_BYTES on a CPU or where neither says."""
  device = device or jax.devices()[0]
  if device.platform == "cpu":
    return CPU_BUDGET_BYTES
  try:
    limit = (device.memory_stats() or {}).get("bytes_limit", 0)
  except Exception:  # pylint: disable=broad-except  # a device description (ahead-of-time) has no stats
    limit = 0
  if not limit:
    chip = chips.find(getattr(device, "device_kind", ""))
    limit = (chip.hbm_gib or 0) * GiB if chip else 0
  return int(DEVICE_BUDGET_FRACTION * limit) if limit else CPU_BUDGET_BYTES
