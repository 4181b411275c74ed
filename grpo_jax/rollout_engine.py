"""A rollout engine: continuous batching over a fixed number of decode slots, in one compiled loop.

`sampling.sample` decodes every row of a batch together until the last one ends, so each row pays for the
longest. Here S slots decode one completion each; when a slot's completion ends (an end token, or its cap) the
slot takes the next pending completion in the same `lax.while_loop` step, and the loop ends when every
completion is done. A long tail of lengths then costs about its tokens, not rows x the longest (the static
batching vs continuous batching of Orca, Yu et al. OSDI 2022; vLLM, JetStream).

Each prompt is prefilled once; its keys and values are the read-only `KVPrefix` that every slot working on one of
its samples points at (`KVPrefix.rows`, gathered per step, never copied into a slot). A slot's own cache holds
its completion, token j in slot j (`KVCache` with per-row indices), and is cleared when the slot takes a new
completion. Completion c is sample c % G of prompt c // G (prompt-major, like `SampleOutput`).

When nothing is pending, the finished slots' rows are dropped from the steps: the live slots are gathered into
the first slots of a narrower level (S, S/2, S/4, ...: `slot_levels`; with one wave of a model whose weights
outweigh its caches on a CPU, S, S/sqrt(2), S/2, ...: `level_ratio`), so a long tail's last completions step
alone. With as many slots as completions (one wave) no slot refills: every slot steps in lockstep, and until the
first narrower level slot c holds completion c, so a step has the static sampler's ops (one cache index for all,
each prompt's prefix read once for its G samples, tokens written as a column; on a CPU still 0.80-0.95x its speed
at equal lengths, BENCHMARKS.md), and the levels cut a one-wave tail too.

The draws are the static sampler's: completion c's token t uses row c of the Gumbel noise of
`fold_in(key, t)` over all N completions (`gumbel_rows`), so with the same key the tokens equal
`sampling.sample`'s, and the log-probs too up to float rounding (the attention's sums run over other shapes).
"""

import functools
import math
from collections.abc import Mapping, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from grpo_jax import partitioning as sharding
from grpo_jax import sampling
from grpo_jax.gumbel_rows import gumbel_rows, threefry2x32
from grpo_jax.models import kv_cache, transformer
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.logical_axes import constrain
from grpo_jax.sampling import SampleOutput

_STATIC = ("config", "num_samples", "max_new_tokens", "top_k", "top_p", "greedy", "stop_ids", "pad_id",
           "logprobs_at_temperature", "num_slots", "level_ratio")


# On a CPU, slots x max_new_tokens per device: the cached tokens a decode step walks through (`default_slots`), at
# least this many, and more where a model's weights outweigh its cache: up to `CPU_CACHE_PER_WEIGHT_BYTE` times the
# bytes of the weights that the step reads anyway (`cpu_cache_tokens`). The tiny model of the benchmarks (3.2 MB of
# weights, 2 KiB of cache a token) sits at the floor; Qwen2.5-0.5B's shapes in bfloat16 (1 GB of weights, 12 KiB
# of cache a token) get ~200k.
CPU_CACHE_TOKENS_PER_DEVICE = 4096
CPU_CACHE_PER_WEIGHT_BYTE = 2.5
# On a CPU, at most this many waves of a device's completions (slots >= its completions / CPU_MOST_WAVES): where
# many completions meet a long cap, the cache budget alone leaves a few slots and dozens of waves, each a step's
# fixed cost per token. On a long tail of 1,024 completions of up to 1,024 tokens on 2 devices, 16, 32, 64 and 128
# slots ran 1.80x, 1.94x, 2.07x and 2.31x the static sampler (BENCHMARKS.md); at 256 completions of up to 192 tokens
# 44 to 128 ran alike, so the rule leaves the budget's slots where the completions take few waves.
CPU_MOST_WAVES = 8


@functools.lru_cache(maxsize=16)
def weight_bytes(config: ModelConfig) -> int:
  """The bytes of the weights a decode step reads: the params `transformer.init_params` makes for `config`, at
  their dtype (`config.param_dtype`)."""
  shapes = jax.eval_shape(transformer.init_params, config, jax.random.key(0))
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes)))


def cpu_cache_tokens(config: ModelConfig | None) -> int:
  """A CPU device's cached tokens for `default_slots`: `CPU_CACHE_TOKENS_PER_DEVICE`, or the tokens whose keys and
  values hold `CPU_CACHE_PER_WEIGHT_BYTE` x `weight_bytes` where that is more (None: the floor)."""
  if config is None:
    return CPU_CACHE_TOKENS_PER_DEVICE
  per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
  per_token *= jnp.dtype(config.dtype).itemsize
  return max(CPU_CACHE_TOKENS_PER_DEVICE, int(CPU_CACHE_PER_WEIGHT_BYTE * weight_bytes(config) // per_token))


def default_slots(num_completions: int, max_new_tokens: int, devices: int = 1, platform: str | None = None,
                  config: ModelConfig | None = None) -> int:
  """Slots when none are given, over `devices` data shards on `platform` (default: JAX's backend), for the model
  of `config` (None: the CPU rule's floor).

  A slot count trades the loop's steps (about the tokens / S, plus the longest completion's tail) against each
  step's width. A decode step reads the weights once for all its slots and each slot's cache once. On a CPU, with
  a small model, a few slots a device already use its matmul rate, and more grow the caches a step walks through:
  slots x `max_new_tokens` = `CPU_CACHE_TOKENS_PER_DEVICE` a device, at least 8 (8 a device at 512 tokens, the
  fastest of 2 to 128 a device that `scripts/bench_rollout.py` measured on a long tail; the rule keeps a step's
  caches that size at other lengths), raised to whole waves (`even_waves`). One wave (a slot for every completion)
  was measured against it at 256 x 64 and 256 x 192: at equal lengths 0.80x and 0.95x the static sampler against
  0.77x and 0.89x, on a long tail 1.40x and 1.99x against 2.04x and 2.38x (BENCHMARKS.md, one sitting), so the
  rule stays for it. With many completions at a long cap the budget leaves few slots and many waves (1,024 at
  1,024 tokens: 8 slots a device, 64 waves), and more slots ran faster there, so a device's completions take at
  most `CPU_MOST_WAVES` waves. Where the weights outweigh the caches (`cpu_cache_tokens`: at Qwen2.5-0.5B's shapes), a step
  costs about its rows' matmuls whatever their caches, and 42, 32 or 64 slots a device ran the same tail at the
  same speed, so the slots go up to one wave: the steps of a second wave at equal lengths cost as much again.
  An accelerator needs hundreds of rows a step to stop being bound by reading the weights: a quarter of the
  completions, at least 64 (the runner takes no more than its memory budget holds: `Placement.engine_slots`).
  """
  platform = platform or jax.default_backend()
  if platform == "cpu":
    tokens = cpu_cache_tokens(config)
    per_device = -(-num_completions // devices)
    return even_waves(num_completions, max(8, tokens // max(max_new_tokens, 1), -(-per_device // CPU_MOST_WAVES)),
                      devices)
  return num_completions if num_completions <= 64 else max(64, num_completions // 4)


def even_waves(num_completions: int, slots_per_device: int, devices: int = 1, most: float = 1.25) -> int:
  """`slots_per_device` a device (all `devices` together), raised by at most a factor `most` where that splits a
  device's completions into whole waves: completions at equal lengths then run ceil(n / slots) waves, with no last
  wave of a few leftover completions that costs as many steps as a full one (128 a device at 21 slots: 7 waves,
  the last of 2; at 22: 6). Capped at the completions."""
  n = -(-num_completions // devices)  # a device's completions
  waves = max(n // max(slots_per_device, 1), 1)
  even = -(-n // waves)
  slots = even if even <= most * slots_per_device else slots_per_device
  return min(num_completions, slots * devices)


def phase_widths(own_slots: int, phases: int = 4, narrowest: int = 16) -> tuple[int, ...]:
  """The cache widths of the engine's phases: `own_slots` (`kv_cache.own_columns(T)`) and its halves down to
  `narrowest`, at most `phases` of them (each a compiled copy of the decode step)."""
  widths = [own_slots]
  while len(widths) < phases and widths[-1] // 2 >= narrowest:
    widths.append(widths[-1] // 2)
  return tuple(reversed(widths))


def fold_in_rows(key: jax.Array, data: jax.Array) -> jax.Array:
  """`jax.vmap(jax.random.fold_in, (None, 0))(key, data)`: one key per entry of `data` [S], the same bits.

  For a threefry key (typed, or raw of the default implementation) the raw keys [S, 2] uint32, threefry-2x32 of
  the counter (0, data) under `key` with its rounds unrolled into one fused pass (`gumbel_rows.threefry2x32`):
  on the CPU JAX's own fold_in runs threefry as a rolled loop, a `while` of five passes inside every decode step.
  Other implementations: JAX's fold_in, vmapped.
  """
  typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
  impl = str(jax.random.key_impl(key)) if typed else jax.config.jax_default_prng_impl
  if "threefry2x32" not in impl:
    return jax.vmap(jax.random.fold_in, (None, 0))(key, data)
  k0, k1 = jax.random.key_data(key) if typed else key
  counter = jnp.asarray(data).astype(jnp.uint32)
  return jnp.stack(threefry2x32(k0, k1, jnp.zeros_like(counter), counter), axis=-1)


def _choose(logits, keys, temperature, rows, total, *, top_k, top_p, greedy):
  """Each slot's next token [S] from float32 logits [S, V]: argmax, or the Gumbel-max draw with its completion's
  noise row `rows[s]` of a [total, V] draw under its own step's key `keys[s]` (`sampling._choose`'s draw)."""
  if greedy:
    return sampling.argmax_last(logits)
  z = sampling.filter_logits(logits / temperature, top_k=top_k, top_p=top_p)
  noise = jax.vmap(lambda k, r: gumbel_rows(k, r, 1, (total, z.shape[-1]), z.dtype)[0])(keys, rows)
  return sampling.argmax_last(z + noise)


def _engine_impl(params, prompt_tokens, prompt_mask, key, temperature, caps, *, num_samples: int,
                 shard_axes: tuple[str, ...] = (), num_shards: int = 1, **static):
  """The engine on these prompts; with `shard_axes`, one shard's prompts inside `shard_map` (its completions'
  noise rows offset by the shard's first row, so the draws are those of the whole batch)."""
  n = prompt_tokens.shape[0] * num_samples
  first = jax.lax.axis_index(shard_axes) * n if shard_axes else 0
  return _engine(params, prompt_tokens, prompt_mask, key, temperature, caps, num_samples=num_samples,
                 first=first, total=n * num_shards, **static)


# The widths (`phase_widths`) that the narrower levels of slots step at: the widest only. A level is reached late
# in a tail, when the longest live completion is long; each (level, width) is a compiled copy of the step. The two
# widest compiled more copies of the step (6 and 8 instead of 5 and 5 at T = 192 and 64, 22 and 64 slots a device),
# so slower first calls, and decoded the tail no faster (BENCHMARKS.md, issue 52).
NARROWER_LEVEL_WIDTHS = 1


def slot_levels(slots: int, levels: int = 4, narrowest: int = 8, ratio: float = 2.0) -> tuple[int, ...]:
  """The slot counts of the engine's levels: `slots`, then each the one before divided by `ratio` (rounded up) down
  to `narrowest`, at most `levels` of them. Once no completion is pending and the live ones fit a narrower level,
  they are gathered into its first slots and the steps run on those alone (each level a compiled copy of the
  decode step per width)."""
  counts = [slots]
  while len(counts) < levels and min(math.ceil(counts[-1] / ratio), counts[-1] - 1) >= narrowest:
    counts.append(min(math.ceil(counts[-1] / ratio), counts[-1] - 1))
  return tuple(counts)


# The levels of one wave (as many slots as completions) where a step costs about its rows: with nothing to refill,
# the levels alone drop the finished rows, and a step at a level may run up to 1 - 1 / ratio of its rows idle.
# Halving against levels a factor sqrt(2) apart (128, 91, 65, 46, 33, 24, 17) on a tail of Qwen2.5-0.5B's shapes
# (bf16, 256 completions of up to 96 tokens, one wave of 128 on each of 2 CPU devices): a call 7% shorter (1.95x ->
# 2.13x the static sampler), for three more compiled steps (BENCHMARKS.md). Where a step's fixed cost outweighs its
# rows (the tiny model's one wave at 64 x 16 and 256 x 64) they doubled the first call and gained nothing.
ONE_WAVE_LEVELS = dict(levels=7, ratio=2 ** 0.5)


def level_ratio(config: ModelConfig | None, platform: str | None = None) -> float:
  """The ratio of one wave's levels (`slot_levels`): `ONE_WAVE_LEVELS`' sqrt(2) on a CPU where the model's
  weights outweigh its caches (`cpu_cache_tokens` above its floor: a decode step costs about its rows' matmuls), 2
  elsewhere (a small model's step on a CPU is mostly fixed cost; an accelerator's one wave, 64 completions or
  fewer, is bound by reading the weights)."""
  platform = platform or jax.default_backend()
  rows_cost = platform == "cpu" and cpu_cache_tokens(config) > CPU_CACHE_TOKENS_PER_DEVICE
  return ONE_WAVE_LEVELS["ratio"] if rows_cost else 2.0


def _engine(params, prompt_tokens, prompt_mask, key, temperature, caps, *, config: ModelConfig, num_samples: int,
            max_new_tokens: int, top_k: int, top_p: float, greedy: bool, stop_ids: tuple[int, ...], pad_id: int,
            logprobs_at_temperature: bool, num_slots: int, first, total: int, level_ratio: float = 2.0) -> SampleOutput:
  """The engine's loop over `num_slots` slots for N = B * G completions (see the module docstring); one wave's
  levels `level_ratio` apart (`level_ratio()`)."""
  n_prompts, prompt_len = prompt_tokens.shape
  g, steps = num_samples, max_new_tokens
  n = n_prompts * g
  slots = min(num_slots, n)
  # ONE WAVE (as many slots as completions): no slot ever takes another, so every slot steps in lockstep (one
  # cache index for all, written as the static sampler writes it) and, until the first gather into a narrower
  # level, slot c holds completion c: its prompt's prefix is read once for its G samples, its tokens written as a
  # column. With fewer slots, each slot its own index, its prompt's prefix rows gathered (`KVPrefix.rows`).
  one_wave = slots >= n
  stop_ids = jnp.asarray(stop_ids, jnp.int32)
  choose = functools.partial(_choose, top_k=top_k, top_p=top_p, greedy=greedy, total=total)
  draw = sampling._choose  # pylint: disable=protected-access
  row_axes = lambda x: constrain(x, ("batch",) + (None,) * (x.ndim - 1))

  # PREFILL: every prompt once. Its keys and values are the prefix its samples' slots point at; its last hidden
  # state gives a new completion's first token (through the same unembedding as the slots' steps).
  place = sampling._place_cache  # pylint: disable=protected-access
  prompt_cache = place(transformer.init_cache(config, n_prompts, prompt_len))
  hidden, prompt_cache = transformer.hidden_states(params, config, prompt_tokens, attention_mask=prompt_mask,
                                                   cache=prompt_cache)
  prompt_hidden = hidden[:, -1]  # [B, E]
  n_prompt_tokens = jnp.sum(prompt_mask, axis=-1, dtype=jnp.int32)
  prefix = transformer.as_prefix(prompt_cache)
  own = kv_cache.own_columns(steps)
  # RoPE's cos and sin at every position a step can feed (0 ... P + T - 1), computed once before the loop: a step
  # gathers its slots' rows (XLA would recompute them inside every layer's query and key fusions).
  tables = tuple(x[0] for x in transformer.rope_tables(config, jnp.arange(prompt_len + steps)[None]))
  cache = transformer.init_cache(config, slots, own)
  prompt_of = lambda c: jnp.minimum(c, n - 1) // g

  def step(carry, in_order: bool):
    """One token for every slot; `in_order`: slot c holds completion c (one wave, before any gather)."""
    k, v, own_mask, comp, t, hidden, next_comp, tokens, logprobs, lengths = carry
    live = comp < n
    c = jnp.minimum(comp, n - 1)
    # Choose each live slot's token t of its completion, and write it down.
    logits = transformer.logits_from_hidden(params, config, hidden)  # [S, V] float32
    if in_order:  # the static sampler's draw: rows first ... first + N - 1 of step t's noise
      tok = draw(logits, fold_in_rows(key, t[:1])[0], temperature, top_k=top_k, top_p=top_p, greedy=greedy,
                 rows=(first, total))
    else:
      keys = fold_in_rows(key, t)
      tok = choose(logits, keys, temperature, first + c)
    scored = logits / temperature if logprobs_at_temperature else logits
    logp = jnp.take_along_axis(jax.nn.log_softmax(scored, axis=-1), tok[:, None], axis=-1)[:, 0]
    tok = jnp.where(live, tok, pad_id)
    ends = live & (jnp.isin(tok, stop_ids) | (t + 1 >= jnp.take(caps, c)))
    if in_order:
      tokens = jax.lax.dynamic_update_slice(tokens, tok[:, None], (0, t[0]))
      logprobs = jax.lax.dynamic_update_slice(logprobs, jnp.where(live, logp, 0.0)[:, None], (0, t[0]))
      lengths = jnp.where(live, t + 1, lengths)
    else:
      at = jnp.where(live, comp, n)  # idle slots write to row n: dropped
      tokens = tokens.at[at, t].set(tok, mode="drop")
      logprobs = logprobs.at[at, t].set(logp, mode="drop")
      lengths = lengths.at[at].set(t + 1, mode="drop")
    # Feed it back: one token a slot, written at the slot's own index t, attending to its prompt's prefix.
    positions = jnp.take(n_prompt_tokens, prompt_of(comp)) + t
    rope = tuple(jnp.take(x, positions, axis=0)[:, None] for x in tables)  # [S, 1, D] rows of the tables
    index = t[0] if one_wave else t
    step_prefix = prefix if in_order else prefix._replace(rows=prompt_of(comp))
    step_cache = transformer.KVCache(k=k, v=v, mask=own_mask, index=index, prefix=step_prefix)
    out, step_cache = transformer.hidden_states(params, config, tok[:, None], attention_mask=(live & ~ends)[:, None],
                                                cache=step_cache, rope=rope)
    own_mask = step_cache.mask & ~ends[:, None]
    if one_wave:  # an ended slot stays idle; every slot's index moves on together
      comp = jnp.where(ends, n, comp)
      t, hidden = t + 1, out[:, 0]
    else:
      # Refill: a slot whose completion ended takes the next pending one (in order), with a cleared cache and its
      # prompt's last hidden state in place of the step's.
      fresh = next_comp + jnp.cumsum(ends, dtype=jnp.int32) - 1
      comp = jnp.where(ends, jnp.minimum(fresh, n), comp)
      next_comp = jnp.minimum(next_comp + jnp.sum(ends, dtype=jnp.int32), n)
      t = jnp.where(ends | ~live, 0, t + 1)
      hidden = jnp.where(ends[:, None], jnp.take(prompt_hidden, prompt_of(comp), axis=0), out[:, 0])
    k, v = (jax.tree.map(row_axes, x) for x in (step_cache.k, step_cache.v))
    return (k, v, row_axes(own_mask), row_axes(comp), row_axes(t), row_axes(hidden), next_comp, tokens, logprobs,
            lengths)

  # PHASES: the steps run with the caches cut to the narrowest of `widths` that holds every live slot's tokens
  # (the longest live completion's), so a step attends over about the slots that can be filled, not T - 1; a phase
  # ends when a live slot needs more room, or when all of them fit two widths down (no back-and-forth at a
  # boundary). A slot's mask is False past its own length, so the columns a phase leaves out hold nothing a later,
  # wider phase would read. LEVELS: once nothing is pending, the live slots are gathered into the first slots of
  # the narrowest of `levels` that holds them, and a phase's steps run on those alone, so a long tail's last
  # completions step without the finished ones' rows. The cut caches go in and out once a phase.
  fine = one_wave and level_ratio != 2.0
  widths, levels = phase_widths(own), slot_levels(slots, **(dict(ONE_WAVE_LEVELS, ratio=level_ratio) if fine else {}))
  wide = max(len(widths) - NARROWER_LEVEL_WIDTHS, 0)  # the narrower levels' first width: widths[wide:] only
  live_top = lambda c: jnp.max(jnp.where(c[3] < n, c[4], 0))  # the longest live completion's tokens so far
  slot_axis = lambda x: transformer.cache_batch_axis(x) if x.ndim >= 4 else 0
  per_slot = lambda c, fn: (jax.tree.map(lambda x: fn(x, -1, slot_axis(x)), c[0]),  # fn(array, its column
                            jax.tree.map(lambda x: fn(x, -2, slot_axis(x)), c[1]),  # axis or None, its slot axis)
                            fn(c[2], -1, 0), *(fn(x, None, 0) for x in c[3:6]), *c[6:])

  def phase(j, i):
    width, rows, last = widths[i], levels[j], i == len(widths) - 1
    narrowest = 0 if j == 0 else wide  # the narrowest width this level has

    def run(carry):
      def cut(x, cols, axis):
        x = jax.lax.slice_in_dim(x, 0, rows, axis=axis)
        return x if cols is None else jax.lax.slice_in_dim(x, 0, width, axis=cols % x.ndim)

      narrow = per_slot(carry, cut)

      def cond(c):
        live = c[3] < n
        going = jnp.any(live)
        if not last:
          going &= live_top(c) < width
        if i >= narrowest + 2:
          going &= live_top(c) >= width // 4
        if j + 1 < len(levels):
          going &= (c[6] < n) | (jnp.sum(live) > levels[j + 1])
        return going

      out = jax.lax.while_loop(cond, functools.partial(step, in_order=one_wave and j == 0), narrow)
      put = lambda full, part: jax.lax.dynamic_update_slice(full, part, (0,) * full.ndim)
      return (jax.tree.map(put, carry[0], out[0]), jax.tree.map(put, carry[1], out[1]),
              *(put(full, part) for full, part in zip(carry[2:6], out[2:6])), *out[6:])

    return run

  def gather(carry):
    """The live slots first (in order), the idle ones after: every slot array permuted alike."""
    order = jnp.argsort(carry[3] >= n, stable=True)
    return per_slot(carry, lambda x, _, axis: jnp.take(x, order, axis=axis))

  def next_phase(carry):
    live = carry[3] < n
    j = jnp.where(carry[6] < n, 0, jnp.sum(jnp.asarray(levels[1:]) >= jnp.sum(live)))  # the narrowest level
    scattered = jnp.any(live & (jnp.arange(slots) >= jnp.take(jnp.asarray(levels), j)))
    carry = jax.lax.cond(scattered, gather, lambda c: c, carry)
    i = jnp.sum(jnp.asarray(widths[:-1]) <= live_top(carry))  # the narrowest width above every live slot's tokens
    branch = jnp.where(j == 0, i, len(widths) + (j - 1) * (len(widths) - wide) + jnp.maximum(i - wide, 0))
    return jax.lax.switch(branch, [phase(0, ii) for ii in range(len(widths))] + [
        phase(jj, ii) for jj in range(1, len(levels)) for ii in range(wide, len(widths))], carry)

  comp = jnp.arange(slots, dtype=jnp.int32)
  carry = (cache.k, cache.v, cache.mask, comp, jnp.zeros((slots,), jnp.int32),
           jnp.take(prompt_hidden, prompt_of(comp), axis=0), jnp.asarray(slots, jnp.int32),
           jnp.full((n, steps), pad_id, jnp.int32), jnp.zeros((n, steps), jnp.float32), jnp.zeros((n,), jnp.int32))
  carry = jax.lax.while_loop(lambda c: jnp.any(c[3] < n), next_phase, carry)
  tokens, logprobs, lengths = carry[-3:]
  last = jnp.take_along_axis(tokens, jnp.maximum(lengths - 1, 0)[:, None], axis=-1)[:, 0]
  repeat = lambda x: jnp.repeat(x, g, axis=0)
  return SampleOutput(prompt_tokens=repeat(prompt_tokens), prompt_mask=repeat(prompt_mask), tokens=tokens,
                      logprobs=logprobs, mask=jnp.arange(steps)[None, :] < lengths[:, None], lengths=lengths,
                      truncated=~jnp.isin(last, stop_ids))


_generate = jax.jit(_engine_impl, static_argnames=_STATIC)


@functools.lru_cache(maxsize=64)
def _sharded_engine(mesh: Mesh, frozen_rules: tuple, prompt_shape: tuple[int, int], **static):
  """`_engine_impl` jitted with explicit shardings: params by the rules, prompts and completions over the data
  axes. With params whole on every device (data parallelism) each shard runs its own engine on its own prompts
  (`shard_map`), so no slot waits on another shard's; else one engine whose slots GSPMD splits over the data axes."""
  rules, config = dict(frozen_rules), static["config"]
  params, rows, out = sampling.placements(mesh, rules, config, prompt_shape, static["num_samples"],
                                          static["max_new_tokens"])
  b, p = prompt_shape
  n = b * static["num_samples"]
  scalar = sharding.replicated(mesh)
  in_shardings = (params, rows(b, p), rows(b, p), scalar, scalar, rows(n))
  axes = sampling.per_shard_axes(mesh, rules, config, b, static["num_samples"])
  if axes:
    shards = int(np.prod([mesh.shape[a] for a in axes]))
    local = dict(static, num_slots=max(static["num_slots"] // shards, 1))
    body = functools.partial(_engine_impl, **local, shard_axes=axes, num_shards=shards)
    split, whole = PartitionSpec(axes), PartitionSpec()
    mapped = jax.shard_map(body, mesh=mesh, in_specs=(whole, split, split, whole, whole, split),
                           out_specs=SampleOutput(*(split,) * len(SampleOutput._fields)), check_vma=False)
    fn = jax.jit(mapped, in_shardings=in_shardings, out_shardings=out)
  else:
    fn = sharding.jit_with_rules(functools.partial(_engine_impl, **static), mesh, rules,
                                 in_shardings=in_shardings, out_shardings=out)
  return fn, (params, rows(b, p), scalar, rows(n))


def _static_args(config: ModelConfig, *, num_slots: int, num_prompts: int, shards: int = 1, **kw) -> dict:
  static = sampling._static_args(config, **kw)  # pylint: disable=protected-access
  for name in ("cache_segments", "prompt_chunk"):
    static.pop(name)
  n = num_prompts * static["num_samples"]
  num_slots = int(num_slots) or default_slots(n, static["max_new_tokens"], shards, config=config)
  if num_slots < 1:
    raise ValueError(f"num_slots must be >= 1 (or 0 for the default), got {num_slots}")
  return dict(static, num_slots=min(num_slots, n), level_ratio=level_ratio(config))


def generate(params, config: ModelConfig, prompt_tokens: jax.Array, prompt_mask: jax.Array, key: jax.Array, *,
             num_samples: int = 1, max_new_tokens: int = 64, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, greedy: bool = False, eos_token_ids: Sequence[int] | None = None,
             stop_token_ids: Sequence[int] = (), pad_id: int | None = None, logprobs_at_temperature: bool = False,
             num_slots: int = 0, max_lengths: jax.Array | None = None, mesh: Mesh | None = None,
             rules: Mapping | None = None) -> SampleOutput:
  """Samples `num_samples` completions for each left-padded prompt with continuous batching over slots.

  The arguments and the result are those of `sampling.sample` (same keys, same tokens), plus:
    num_slots: completions decoded at once (0: `default_slots`); with a mesh, over all its data shards (each
      shard's own engine takes num_slots / shards).
    max_lengths: [B * G] int, each completion's own cap (<= `max_new_tokens`; a completion that reaches it is
      truncated); None: `max_new_tokens` for all. Per-request limits, and the length schedules of benchmarks.

  With as many slots as completions no slot ever takes another: one wave in lockstep, the static sampler's steps
  until the finished rows are dropped (`slot_levels`). Compiles once per (shapes, config, static options, slots);
  `temperature` and `key` are traced. With `mesh`,
  a batch of any number of prompts: it is padded to a multiple of the data shards with one-token completions
  that are dropped from the result.
  """
  chex.assert_rank([prompt_tokens, prompt_mask], 2)
  chex.assert_equal_shape([prompt_tokens, prompt_mask])
  if not greedy and not temperature > 0:
    raise ValueError(f"temperature must be > 0 (use greedy=True for argmax), got {temperature}")
  if (mesh is None) != (rules is None):
    raise ValueError("generate: pass both mesh and rules, or neither")
  b = prompt_tokens.shape[0]
  shards = 1 if mesh is None else sharding.data_parallel_size(mesh, rules)
  static = _static_args(config, num_slots=num_slots, num_prompts=b, shards=shards, num_samples=num_samples,
                        max_new_tokens=max_new_tokens, top_k=top_k, top_p=top_p, greedy=greedy,
                        eos_token_ids=eos_token_ids, stop_token_ids=stop_token_ids, pad_id=pad_id,
                        logprobs_at_temperature=logprobs_at_temperature)
  n = b * static["num_samples"]
  caps = np.full((n,), max_new_tokens, np.int32) if max_lengths is None else np.asarray(max_lengths, np.int32)
  if caps.shape != (n,) or caps.min() < 1 or caps.max() > max_new_tokens:
    raise ValueError(f"max_lengths must be [{n}] ints in [1, {max_new_tokens}], got shape {caps.shape}")
  pad = -b % shards
  if mesh is None:
    return _generate(params, jnp.asarray(prompt_tokens, jnp.int32), jnp.asarray(prompt_mask, bool), key,
                     jnp.asarray(temperature, jnp.float32), jnp.asarray(caps), **static)
  as_int = lambda x: x if getattr(x, "dtype", None) == jnp.int32 else np.asarray(x, np.int32)
  as_bool = lambda x: x if getattr(x, "dtype", None) == bool else np.asarray(x, bool)
  tokens, mask = as_int(prompt_tokens), as_bool(prompt_mask)  # global arrays stay as they are
  if pad:  # copies of the first prompt, one token each, dropped below (host arrays of one process)
    tokens, mask = (np.concatenate([x, np.repeat(x[:1], pad, axis=0)]) for x in (np.asarray(tokens),
                                                                                 np.asarray(mask)))
    caps = np.concatenate([caps, np.ones((pad * static["num_samples"],), np.int32)])
    static["num_slots"] = min(static["num_slots"], len(caps))
  fn, (param_sh, row_sh, scalar_sh, cap_sh) = _sharded_engine(mesh, sharding.freeze_rules(rules), tokens.shape,
                                                              **static)
  params, tokens, mask, key, temperature, caps = sharding.put(
      (params, tokens, mask, key, np.float32(temperature), caps), (param_sh, row_sh, row_sh, scalar_sh, scalar_sh,
                                                                  cap_sh))
  out = fn(params, tokens, mask, key, temperature, caps)
  return jax.tree.map(lambda x: x[:n], out) if pad else out


def jit_generate(config: ModelConfig, prompt_shape: tuple[int, int], *, mesh: Mesh, rules: Mapping,
                 num_samples: int = 1, max_new_tokens: int = 64, top_k: int = 0, top_p: float = 1.0,
                 greedy: bool = False, eos_token_ids: Sequence[int] | None = None,
                 stop_token_ids: Sequence[int] = (), pad_id: int | None = None,
                 logprobs_at_temperature: bool = False, num_slots: int = 0):
  """The jitted program that `generate(..., mesh=mesh, rules=rules)` runs for prompts of `prompt_shape` (a
  multiple of the data shards): `fn(params, prompt_tokens, prompt_mask, key, temperature, max_lengths)`; for
  compiling ahead of time with `jax.ShapeDtypeStruct` arguments."""
  return generate_program(config, prompt_shape, mesh=mesh, rules=rules, num_samples=num_samples,
                          max_new_tokens=max_new_tokens, top_k=top_k, top_p=top_p, greedy=greedy,
                          eos_token_ids=eos_token_ids, stop_token_ids=stop_token_ids, pad_id=pad_id,
                          logprobs_at_temperature=logprobs_at_temperature, num_slots=num_slots)[0]


def generate_program(config: ModelConfig, prompt_shape: tuple[int, int], *, mesh: Mesh | None, rules: Mapping | None,
                     num_samples: int = 1, max_new_tokens: int = 64, top_k: int = 0, top_p: float = 1.0,
                     greedy: bool = False, eos_token_ids: Sequence[int] | None = None,
                     stop_token_ids: Sequence[int] = (), pad_id: int | None = None,
                     logprobs_at_temperature: bool = False, num_slots: int = 0) -> tuple:
  """`(fn, in_shardings, static)`: the jitted program that `generate(..., mesh=mesh, rules=rules, **options)` runs
  for prompts of `prompt_shape` (with a mesh, a multiple of its data shards), called as `fn(params, prompt_tokens,
  prompt_mask, key, temperature, max_lengths, **static)`, and the shardings of those six arguments (the params' a
  tree); without a mesh, None: the one-device program takes them unplaced."""
  shards = 1 if mesh is None else sharding.data_parallel_size(mesh, rules)
  static = _static_args(config, num_slots=num_slots, num_prompts=prompt_shape[0], shards=shards,
                        num_samples=num_samples, max_new_tokens=max_new_tokens, top_k=top_k, top_p=top_p,
                        greedy=greedy, eos_token_ids=eos_token_ids, stop_token_ids=stop_token_ids, pad_id=pad_id,
                        logprobs_at_temperature=logprobs_at_temperature)
  if mesh is None:
    return _generate, None, static
  fn, (params, rows, scalar, caps) = _sharded_engine(mesh, sharding.freeze_rules(rules), tuple(prompt_shape), **static)
  return fn, (params, rows, rows, scalar, scalar, caps), {}
