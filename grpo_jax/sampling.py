"""Batched autoregressive sampling with a static-shape KV cache, jitted end to end.

Prefill each (left-padded) prompt once; its keys and values are the shared
prefix of its G samples' caches (read once per prompt, not G times, in every
step); then decode one token per step inside a `jax.lax.while_loop` that exits
as soon as every row has produced an end token (EOS or an extra stop id).
"""

import functools
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from grpo_jax import partitioning as sharding
from grpo_jax.gumbel_rows import gumbel_rows
from grpo_jax.models import kv_cache, transformer
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.logical_axes import constrain


class SampleOutput(NamedTuple):
  """Samples, rows prompt-major: row p * G + g is sample g of prompt p.

  Attributes:
    prompt_tokens: [N, P] int32 prompt ids (left padded).
    prompt_mask: [N, P] bool, False at left padding.
    tokens: [N, T] int32 completion ids, pad id after the end.
    logprobs: [N, T] float32 log π(o_t | ...) under the raw (temperature 1,
      unfiltered) policy distribution, or with `logprobs_at_temperature` under
      softmax(logits / temperature) (unfiltered); 0 where `mask` is False.
    mask: [N, T] bool, True for generated tokens including the end token.
    lengths: [N] int32 number of generated tokens (= mask.sum(-1)).
    truncated: [N] bool, True when no end token came within T tokens.
  """
  prompt_tokens: jax.Array
  prompt_mask: jax.Array
  tokens: jax.Array
  logprobs: jax.Array
  mask: jax.Array
  lengths: jax.Array
  truncated: jax.Array


def filter_logits(logits: jax.Array, *, top_k: int = 0, top_p: float = 1.0) -> jax.Array:
  """Sets logits outside the top-k and outside the top-p nucleus to -inf.

  The nucleus is the smallest set of most probable tokens whose probability mass
  reaches `top_p` (a token is kept when the mass of the tokens ranked above it is
  below `top_p`; the most probable token is always kept). Top-k applies first.

  Args:
    logits: [..., V].
    top_k: keep the k largest logits (ties at the k-th value are kept); 0 disables.
    top_p: nucleus mass in (0, 1]; 1 disables.

  Returns:
    [..., V] logits with the removed entries at -inf.
  """
  if top_k <= 0 and top_p >= 1.0:
    return logits
  if top_k > 0:
    ranked = jax.lax.top_k(logits, min(top_k, logits.shape[-1]))[0]  # Descending.
  else:
    ranked = -jnp.sort(-logits, axis=-1)
  threshold = ranked[..., -1:]
  if top_p < 1.0:
    probs = jax.nn.softmax(ranked, axis=-1)
    mass_above = jnp.cumsum(probs, axis=-1) - probs
    n_keep = jnp.maximum(jnp.sum(mass_above < top_p, axis=-1, keepdims=True), 1)
    threshold = jnp.take_along_axis(ranked, n_keep - 1, axis=-1)
  return jnp.where(logits >= threshold, logits, -jnp.inf)


def argmax_last(x: jax.Array) -> jax.Array:
  """`jnp.argmax(x, axis=-1)` as int32 (the first index of the maximum) for x without NaNs.

  On the CPU two plain reductions (the max, then the least index holding it) instead of XLA's (value, index)
  pair reduction, which is slower there. Elsewhere `jnp.argmax` itself: the two-reduction form needs the
  comparison to see the very values the max saw, and a GPU compiler that recomputes x inside each of the two
  fusions gives no such promise (a row then matches no index and yields V, a token outside the vocabulary).
  """
  def two_reductions(x):
    index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    at_max = x == jnp.max(x, axis=-1, keepdims=True)
    return jnp.min(jnp.where(at_max, index, x.shape[-1]), axis=-1)

  return jax.lax.platform_dependent(x, cpu=two_reductions,
                                    default=lambda x: jnp.argmax(x, axis=-1).astype(jnp.int32))


def _choose(logits, key, temperature, *, top_k, top_p, greedy, rows=None):
  """Next token [N] from float32 logits [N, V]: argmax, or the Gumbel-max draw of `jax.random.categorical`.

  `rows` = (first, total): the logits are rows first ... first + N - 1 of a batch of `total`, and get that
  batch's noise rows (`gumbel_rows`: only those rows computed), so that a shard draws what the whole batch would.
  """
  if greedy:
    return argmax_last(logits)
  z = filter_logits(logits / temperature, top_k=top_k, top_p=top_p)
  first, total = (0, z.shape[0]) if rows is None else rows
  return argmax_last(z + gumbel_rows(key, first, z.shape[0], (total, z.shape[-1]), z.dtype))


_STATIC = ("config", "num_samples", "max_new_tokens", "top_k", "top_p", "greedy", "stop_ids", "pad_id",
           "logprobs_at_temperature", "cache_segments", "prompt_chunk")


def segment_ends(max_new_tokens: int, cache_segments: int) -> tuple[int, ...]:
  """The exclusive ends of the decode segments: step t (1 <= t < T) runs in the first segment with t < end.

  Segment i decodes against the prompt's P slots and ends[i] - 1 own slots per row (`kv_cache.own_columns(T)` for
  the last, as with one segment), so the attention of early steps spans only the slots that can be live, not the
  whole P + T.
  Equal blocks of ceil((T - 1) / cache_segments) steps; fewer segments when T is short.
  """
  steps = max_new_tokens - 1  # step 0's token comes from the prefill
  block = max(-(-steps // max(cache_segments, 1)), 1)
  return tuple(range(1 + block, max_new_tokens, block)) + (max_new_tokens,)


def _place_cache(cache):
  """Names the axes of a `KVCache` or `KVPrefix` for the sharding hook (identity outside `axis_rules`)."""
  place = lambda axes: lambda x: constrain(x, (None,) * transformer.cache_batch_axis(x) + axes)
  placed = cache._replace(k=jax.tree.map(place(transformer.CACHE_K_AXES), cache.k),
                          v=jax.tree.map(place(transformer.CACHE_V_AXES), cache.v),
                          mask=constrain(cache.mask, ("batch", "length")))
  if getattr(cache, "prefix", None) is not None:
    placed = placed._replace(prefix=_place_cache(cache.prefix))
  return placed


def _sample_impl(params, prompt_tokens, prompt_mask, key, temperature, caps=None, *, num_samples: int,
                 prompt_chunk: int = 0, shard_axes: tuple[str, ...] = (), num_shards: int = 1, **static):
  """The sampler; with `shard_axes`, one shard's rows inside `shard_map` (`num_shards` shards of the batch).

  With 0 < `prompt_chunk` < the prompts (a divisor), `prompt_chunk` prompts and their G samples at a time, in a
  `lax.map`: one chunk's KV cache in memory, and each chunk's decode loop stops when its own rows are done. Every
  row draws its row of the whole batch's noise, so the tokens are those of one chunk, and the log-probs too up
  to float rounding.
  """
  n_prompts = prompt_tokens.shape[0]
  n = n_prompts * num_samples
  first, total = (jax.lax.axis_index(shard_axes) * n, n * num_shards) if shard_axes else (0, n)
  if not 0 < prompt_chunk < n_prompts:
    return _sample_rows(params, prompt_tokens, prompt_mask, key, temperature, caps, num_samples=num_samples,
                        rows=(first, total) if shard_axes else None, **static)
  if n_prompts % prompt_chunk:
    raise ValueError(f"sample: prompt_chunk={prompt_chunk} must divide the {n_prompts} prompts (of each shard)")
  chunks = n_prompts // prompt_chunk
  split = lambda x: x.reshape(chunks, prompt_chunk, *x.shape[1:])

  def chunk(xs):
    c, tokens, mask, caps = xs
    return _sample_rows(params, tokens, mask, key, temperature, caps, num_samples=num_samples,
                        rows=(first + c * prompt_chunk * num_samples, total), **static)

  caps = None if caps is None else caps.reshape(chunks, prompt_chunk * num_samples)
  out = jax.lax.map(chunk, (jnp.arange(chunks), split(prompt_tokens), split(prompt_mask), caps))
  return jax.tree.map(lambda x: x.reshape(n, *x.shape[2:]), out)


def _sample_rows(params, prompt_tokens, prompt_mask, key, temperature, caps=None, *, config: ModelConfig,
                 num_samples: int, max_new_tokens: int, top_k: int, top_p: float, greedy: bool,
                 stop_ids: tuple[int, ...], pad_id: int, logprobs_at_temperature: bool = False,
                 cache_segments: int = 1, rows=None):
  """The sampler on these prompts; `rows` = (first, total): they are rows first ... of a batch of `total` rows
  whose noise they draw (`_choose`); `caps`: [N] each row's own cap, or None."""
  n_prompts, prompt_len = prompt_tokens.shape
  n, steps = n_prompts * num_samples, max_new_tokens
  choose = functools.partial(_choose, top_k=top_k, top_p=top_p, greedy=greedy, rows=rows)

  # PREFILL: once per prompt. Its keys and values become the cache's shared prefix (`KVPrefix`), read once per
  # prompt by its G samples' steps; each row's own slots hold its completion, token j in slot j.
  ends = segment_ends(steps, cache_segments)
  prompt_cache = _place_cache(transformer.init_cache(config, n_prompts, prompt_len))
  hidden, prompt_cache = transformer.hidden_states(params, config, prompt_tokens, attention_mask=prompt_mask,
                                                   cache=prompt_cache)
  logits = transformer.logits_from_hidden(params, config, hidden[:, -1])
  repeat = lambda x: jnp.repeat(x, num_samples, axis=0)
  # Steps t < end write tokens 0 ... end - 2; the last segment's columns are `kv_cache.own_columns`.
  own_slots = lambda end: kv_cache.own_columns(end) if end == steps else max(end - 1, 1)
  prefix = transformer.as_prefix(prompt_cache)
  cache = _place_cache(transformer.init_cache(config, n, own_slots(ends[0]), prefix=prefix))
  logits = repeat(logits)
  prompt_tokens, prompt_mask = repeat(prompt_tokens), repeat(prompt_mask)
  n_prompt_tokens = jnp.sum(prompt_mask, axis=-1, dtype=jnp.int32)
  stop_ids = jnp.asarray(stop_ids, jnp.int32)

  def record(t, logits, done, tokens, logprobs, lengths):
    """Chooses token t of every row from `logits` and writes it down."""
    tok = choose(logits, jax.random.fold_in(key, t), temperature)
    scored = logits / temperature if logprobs_at_temperature else logits
    logp = jnp.take_along_axis(jax.nn.log_softmax(scored, axis=-1), tok[:, None], axis=-1)[:, 0]
    alive = ~done
    tok = jnp.where(alive, tok, pad_id)
    tokens = jax.lax.dynamic_update_slice(tokens, tok[:, None], (0, t))
    logprobs = jax.lax.dynamic_update_slice(logprobs, jnp.where(alive, logp, 0.0)[:, None], (0, t))
    ended = jnp.isin(tok, stop_ids) if caps is None else jnp.isin(tok, stop_ids) | (t + 1 >= caps)
    done = done | (alive & ended)
    return tok, done, tokens, logprobs, lengths + alive.astype(jnp.int32)

  done = jnp.zeros((n,), bool)
  tokens = jnp.full((n, steps), pad_id, jnp.int32)
  logprobs = jnp.zeros((n, steps), jnp.float32)
  lengths = jnp.zeros((n,), jnp.int32)
  tok, done, tokens, logprobs, lengths = record(0, logits, done, tokens, logprobs, lengths)

  # DECODE: one token per step until every row is done or T tokens are out; segment by segment, each a
  # while loop over a cache grown (zero slots, masked) to the length its steps can fill.
  def cond(end):
    def fn(carry):
      t, _, _, done, *_ = carry
      return (t < end) & ~jnp.all(done)
    return fn

  def body(start, end):
    """The loop body of segment [start, end) and its first step's RoPE tables.

    The segment's tables are computed once, before its loop (XLA would recompute cos and sin inside every
    layer's query and key fusions at every step), and each step's ride in the carry, so that no fusion indexes
    into them.
    """
    positions = n_prompt_tokens[:, None] + jnp.arange(start - 1, end - 1)  # step t: real prompt tokens + t - 1
    tables = tuple(x.transpose(1, 0, 2) for x in transformer.rope_tables(config, positions))  # [steps, N, D]
    rope_at = lambda t: tuple(jax.lax.dynamic_index_in_dim(x, t - start, keepdims=False)[:, None] for x in tables)

    def fn(carry):
      (t, cache, tok, done, tokens, logprobs, lengths), rope = carry
      hidden, cache = transformer.hidden_states(params, config, tok[:, None], rope=rope, cache=cache)
      logits = transformer.logits_from_hidden(params, config, hidden[:, 0])
      tok, done, tokens, logprobs, lengths = record(t, logits, done, tokens, logprobs, lengths)
      return (t + 1, _place_cache(cache), tok, done, tokens, logprobs, lengths), rope_at(t + 1)

    return fn, rope_at(start)

  carry = (jnp.ones((), jnp.int32), cache, tok, done, tokens, logprobs, lengths)
  for i, (start, end) in enumerate(zip((1,) + ends[:-1], ends)):
    if i:
      carry = (carry[0], _place_cache(transformer.grow_cache(carry[1], own_slots(end))), *carry[2:])
    fn, rope = body(start, end)
    carry, _ = jax.lax.while_loop(lambda c: cond(end)(c[0]), fn, (carry, rope))
  _, _, _, done, tokens, logprobs, lengths = carry
  mask = jnp.arange(steps)[None, :] < lengths[:, None]
  if caps is not None:  # a row stopped by its cap is truncated too: it ended without an end token
    last = jnp.take_along_axis(tokens, jnp.maximum(lengths - 1, 0)[:, None], axis=-1)[:, 0]
    done = jnp.isin(last, stop_ids)
  return SampleOutput(prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, tokens=tokens, logprobs=logprobs,
                      mask=mask, lengths=lengths, truncated=~done)


_sample = jax.jit(_sample_impl, static_argnames=_STATIC)


@functools.lru_cache(maxsize=64)
def _sharded_sampler(mesh: Mesh, frozen_rules: tuple, prompt_shape: tuple[int, int], capped: bool = False, **static):
  """`_sample` jitted with explicit in/out shardings: params by the rules, rows over the data axes; `capped`: a
  sixth argument, each row's cap [N] (`max_lengths`), split like the rows.

  When the params are whole on every device and the prompts and the samples split over the same mesh axes
  (data parallelism), each shard runs the sampler on its own rows in `shard_map`: its decode loop stops when
  its own rows are done, and no step waits on the other shards (GSPMD's one loop would reduce `done` over
  all of them every token). The draws are the whole batch's, so the tokens are the same either way.
  """
  rules, config = dict(frozen_rules), static["config"]
  params, rows, out = placements(mesh, rules, config, prompt_shape, static["num_samples"], static["max_new_tokens"])
  b, p = prompt_shape
  n = b * static["num_samples"]
  in_shardings = (params, rows(b, p), rows(b, p), sharding.replicated(mesh), sharding.replicated(mesh)) + (
      (rows(n),) if capped else ())
  axes = per_shard_axes(mesh, rules, config, b, static["num_samples"])
  if axes:
    shards = int(np.prod([mesh.shape[a] for a in axes]))
    body = functools.partial(_sample_impl, **static, shard_axes=axes, num_shards=shards)
    split, whole = PartitionSpec(axes), PartitionSpec()
    specs = (whole, split, split, whole, whole) + ((split,) if capped else ())
    mapped = jax.shard_map(body, mesh=mesh, in_specs=specs,
                           out_specs=SampleOutput(*(split,) * len(SampleOutput._fields)), check_vma=False)
    fn = jax.jit(mapped, in_shardings=in_shardings, out_shardings=out)
  else:
    fn = sharding.jit_with_rules(functools.partial(_sample_impl, **static), mesh, rules,
                                 in_shardings=in_shardings, out_shardings=out)
  return fn, (params, rows(b, p), sharding.replicated(mesh), rows(n))


def placements(mesh: Mesh, rules: Mapping, config: ModelConfig, prompt_shape: tuple[int, int], num_samples: int,
               max_new_tokens: int):
  """A sampler's shardings on `mesh`: (the params' by the rules, `rows(n, *rest)` an array's with its n rows
  over the data axes, the `SampleOutput`'s), as `sample` and `rollout_engine.generate` place them."""
  params = sharding.param_shardings(mesh, rules, jax.eval_shape(transformer.init_params, config, jax.random.key(0)))
  rows = lambda n, *rest: sharding.logical_sharding(mesh, rules, ("batch",) + (None,) * len(rest), (n, *rest))
  p, n, t = prompt_shape[1], prompt_shape[0] * num_samples, max_new_tokens
  out = SampleOutput(prompt_tokens=rows(n, p), prompt_mask=rows(n, p), tokens=rows(n, t), logprobs=rows(n, t),
                     mask=rows(n, t), lengths=rows(n), truncated=rows(n))
  return params, rows, out


def per_shard_axes(mesh: Mesh, rules: Mapping, config: ModelConfig, num_prompts: int,
                   num_samples: int) -> tuple[str, ...]:
  """The mesh axes over which `sample(..., mesh=mesh, rules=rules)` runs each shard's rows in its own loop
  (`shard_map`: params whole on every device, prompts and samples split over the same axes); () when it runs
  one GSPMD loop over all rows."""
  rules = dict(rules)
  params = sharding.param_shardings(mesh, rules, jax.eval_shape(transformer.init_params, config, jax.random.key(0)))
  axes = lambda n: _row_axes(sharding.logical_sharding(mesh, rules, ("batch", None), (n, 1)))
  if axes(num_prompts) and axes(num_prompts) == axes(num_prompts * num_samples) and all(
      s.is_fully_replicated for s in jax.tree.leaves(params)):
    return axes(num_prompts)
  return ()


def _row_axes(row_sharding) -> tuple[str, ...]:
  """The mesh axes that split an array's rows (its leading dimension) under a NamedSharding."""
  axes = row_sharding.spec[0] if len(row_sharding.spec) else None
  return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def sample(params, config: ModelConfig, prompt_tokens: jax.Array, prompt_mask: jax.Array, key: jax.Array, *,
           num_samples: int = 1, max_new_tokens: int = 64, temperature: float = 1.0, top_k: int = 0,
           top_p: float = 1.0, greedy: bool = False, eos_token_ids: Sequence[int] | None = None,
           stop_token_ids: Sequence[int] = (), pad_id: int | None = None, mesh: Mesh | None = None,
           rules: Mapping | None = None, logprobs_at_temperature: bool = False,
           cache_segments: int = 1, prompt_chunk: int = 0, max_lengths: jax.Array | None = None) -> SampleOutput:
  """Samples `num_samples` completions for each left-padded prompt.

  Compiles once per (shapes, config, num_samples, max_new_tokens, top_k, top_p,
  greedy, stop ids, pad id); `temperature` and `key` are traced, so changing
  them does not recompile. Deterministic for a given key.

  Args:
    params: policy params.
    config: its ModelConfig (static).
    prompt_tokens: [B, P] int prompt ids, left padded.
    prompt_mask: [B, P] bool, False at padding; every prompt needs a real token.
    key: PRNG key.
    num_samples: G, samples per prompt.
    max_new_tokens: T, the completion budget.
    temperature: divides the logits before filtering (> 0).
    top_k: keep the k most likely tokens (0: off).
    top_p: nucleus mass (1: off).
    greedy: argmax instead of sampling (ignores temperature/top_k/top_p).
    eos_token_ids: end tokens; default `config.eos_token_ids`.
    stop_token_ids: extra end tokens.
    pad_id: fills `tokens` after the end; default `config.pad_token_id` or 0.
    mesh: with `rules`, run sharded: params placed by the rules, prompts and
      outputs split over the data axes (inputs are re-sharded as needed, and may
      be global arrays spanning several processes). The tokens equal those of the
      single-device sampler for the same key. With params whole on every device
      (data parallelism), each shard decodes its own rows in its own loop.
    rules: logical-axis rules (`grpo_jax.sharding.get_rules`).
    logprobs_at_temperature: return log-probs under softmax(logits / temperature),
      the distribution sampled from before top-k/top-p (π_old of a policy trained at
      that temperature, so no forward recomputes it); default: at temperature 1.
    cache_segments: decode in this many segments (`segment_ends`), each a while loop whose
      cache holds only the slots its steps can fill, so early steps attend over P + T / k slots
      instead of P + T (faster; one more compiled loop body each). 1: one loop over the whole
      cache. The same tokens and log-probs up to float rounding (the softmax and its sums run
      over fewer masked slots).
      A segment's RoPE tables (cos and sin, [its steps, N, head_dim] each) are computed before its
      loop, so one segment holds [T, N, head_dim] of them.
    prompt_chunk: sample this many prompts (a divisor of B, or of each shard's prompts) at a time, inside the
      program, when the KV cache of all B prompts would not fit; 0: all at once. The same tokens; the
      log-probs equal up to float rounding.
    max_lengths: [B * G] int, each row's own cap (<= max_new_tokens; a row that reaches it is truncated), as in
      `rollout_engine.generate` (per-request limits; benchmarks' length schedules). None: max_new_tokens.

  The G samples of a prompt share its prefilled keys and values (`transformer.KVPrefix`): the
  cache holds B * P + N * (T - 1) slots instead of N * (P + T), and each step reads the prompts'
  slots once per prompt. The tokens and log-probs equal those of a cache repeated G times up to
  float rounding (the softmax's sums split into the prompt's part and the completion's).

  Returns:
    A SampleOutput with N = B * num_samples rows, prompt-major.
  """
  chex.assert_rank([prompt_tokens, prompt_mask], 2)
  chex.assert_equal_shape([prompt_tokens, prompt_mask])
  if not greedy and not temperature > 0:
    raise ValueError(f"temperature must be > 0 (use greedy=True for argmax), got {temperature}")
  static = _static_args(config, num_samples=num_samples, max_new_tokens=max_new_tokens, top_k=top_k, top_p=top_p,
                        greedy=greedy, eos_token_ids=eos_token_ids, stop_token_ids=stop_token_ids, pad_id=pad_id,
                        logprobs_at_temperature=logprobs_at_temperature, cache_segments=cache_segments,
                        prompt_chunk=prompt_chunk)
  if (mesh is None) != (rules is None):
    raise ValueError("sample: pass both mesh and rules, or neither")
  if max_lengths is not None:
    max_lengths = np.asarray(max_lengths, np.int32)
    chex.assert_shape(max_lengths, (prompt_tokens.shape[0] * num_samples,))
  if mesh is None:
    return _sample(params, jnp.asarray(prompt_tokens, jnp.int32), jnp.asarray(prompt_mask, bool), key,
                   jnp.asarray(temperature, jnp.float32), max_lengths, **static)
  capped = max_lengths is not None
  fn, (param_sh, row_sh, scalar_sh, cap_sh) = _sharded_sampler(mesh, sharding.freeze_rules(rules),
                                                               tuple(prompt_tokens.shape), capped, **static)
  as_int = lambda x: x if getattr(x, "dtype", None) == jnp.int32 else np.asarray(x, np.int32)
  as_bool = lambda x: x if getattr(x, "dtype", None) == bool else np.asarray(x, bool)
  args = (params, as_int(prompt_tokens), as_bool(prompt_mask), key, np.float32(temperature))
  shardings = (param_sh, row_sh, row_sh, scalar_sh, scalar_sh)
  if capped:
    args, shardings = args + (max_lengths,), shardings + (cap_sh,)
  return fn(*sharding.put(args, shardings))


def _static_args(config: ModelConfig, *, num_samples, max_new_tokens, top_k, top_p, greedy, eos_token_ids,
                 stop_token_ids, pad_id, logprobs_at_temperature=False, cache_segments=1, prompt_chunk=0) -> dict:
  """The compile-time arguments of `_sample_impl`, checked."""
  if not 0.0 < top_p <= 1.0:
    raise ValueError(f"top_p must be in (0, 1], got {top_p}")
  if cache_segments < 1:
    raise ValueError(f"cache_segments must be >= 1, got {cache_segments}")
  if prompt_chunk < 0:
    raise ValueError(f"prompt_chunk must be >= 0, got {prompt_chunk}")
  if max_new_tokens < 1 or num_samples < 1:
    raise ValueError(f"max_new_tokens and num_samples must be >= 1, got {max_new_tokens}, {num_samples}")
  eos = config.eos_token_ids if eos_token_ids is None else tuple(eos_token_ids)
  stop_ids = tuple(sorted({int(i) for i in (*eos, *stop_token_ids)}))
  if pad_id is None:
    pad_id = 0 if config.pad_token_id is None else config.pad_token_id
  return dict(config=config, num_samples=int(num_samples), max_new_tokens=int(max_new_tokens), top_k=int(top_k),
              top_p=float(top_p), greedy=bool(greedy), stop_ids=stop_ids, pad_id=int(pad_id),
              logprobs_at_temperature=bool(logprobs_at_temperature) and not greedy,
              cache_segments=int(cache_segments), prompt_chunk=int(prompt_chunk))


def sample_program(config: ModelConfig, *, num_samples: int = 1, max_new_tokens: int = 64, top_k: int = 0,
                   top_p: float = 1.0, greedy: bool = False, eos_token_ids: Sequence[int] | None = None,
                   stop_token_ids: Sequence[int] = (), pad_id: int | None = None, logprobs_at_temperature: bool = False,
                   cache_segments: int = 1, prompt_chunk: int = 0):
  """`(program, static)`: the jitted program that `sample(..., **options)` runs without a mesh, and its
  compile-time keywords. Ahead of time: `program.trace(params, prompt_tokens, prompt_mask, key, temperature, None,
  **static)` (None: no per-row caps); the arguments' shardings place it."""
  return _sample, _static_args(config, num_samples=num_samples, max_new_tokens=max_new_tokens, top_k=top_k,
                               top_p=top_p, greedy=greedy, eos_token_ids=eos_token_ids, stop_token_ids=stop_token_ids,
                               pad_id=pad_id, logprobs_at_temperature=logprobs_at_temperature,
                               cache_segments=cache_segments, prompt_chunk=prompt_chunk)


def jit_sample(config: ModelConfig, prompt_shape: tuple[int, int], *, mesh: Mesh, rules: Mapping,
               num_samples: int = 1, max_new_tokens: int = 64, top_k: int = 0, top_p: float = 1.0,
               greedy: bool = False, eos_token_ids: Sequence[int] | None = None, stop_token_ids: Sequence[int] = (),
               pad_id: int | None = None, logprobs_at_temperature: bool = False, cache_segments: int = 1,
               prompt_chunk: int = 0, max_lengths: bool = False):
  """The jitted program that `sample(..., mesh=mesh, rules=rules)` runs for prompts of `prompt_shape`.

  `fn(params, prompt_tokens, prompt_mask, key, temperature) -> SampleOutput`, with explicit in/out
  shardings; for compiling ahead of time: `fn.lower(<jax.ShapeDtypeStruct args>).compile()`. With `max_lengths`,
  a sixth argument: each row's cap [B * G].
  """
  return placed_sample_program(config, prompt_shape, mesh=mesh, rules=rules, num_samples=num_samples,
                               max_new_tokens=max_new_tokens, top_k=top_k, top_p=top_p, greedy=greedy,
                               eos_token_ids=eos_token_ids, stop_token_ids=stop_token_ids, pad_id=pad_id,
                               logprobs_at_temperature=logprobs_at_temperature, cache_segments=cache_segments,
                               prompt_chunk=prompt_chunk, max_lengths=max_lengths)[0]


def placed_sample_program(config: ModelConfig, prompt_shape: tuple[int, int], *, mesh: Mesh, rules: Mapping,
                          max_lengths: bool = False, **options) -> tuple:
  """`(fn, in_shardings)`: `jit_sample`'s program (the keywords of `sample` as `options`) and the shardings that
  `sample` puts its arguments at: params (a tree), prompt tokens, mask, key, temperature, and with `max_lengths`
  the caps."""
  defaults = dict(num_samples=1, max_new_tokens=64, top_k=0, top_p=1.0, greedy=False, eos_token_ids=None,
                  stop_token_ids=(), pad_id=None)  # `sample`'s
  static = _static_args(config, **(defaults | options))
  fn, (params, rows, scalar, caps) = _sharded_sampler(mesh, sharding.freeze_rules(rules), tuple(prompt_shape),
                                                      bool(max_lengths), **static)
  return fn, (params, rows, rows, scalar, scalar) + ((caps,) if max_lengths else ())
