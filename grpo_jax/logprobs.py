"""Per-token log-probabilities of given sequences, chunked over the length.

The [B, L, V] float32 log-softmax is never materialised: the unembedding,
log-softmax and gather run per chunk of `chunk_size` positions inside a
`lax.scan` whose body is wrapped in `jax.checkpoint`, so the backward pass
recomputes each chunk's logits instead of storing them.
"""

from collections.abc import Mapping
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from grpo_jax import length_buckets
from grpo_jax import partitioning
from grpo_jax import placed as placed_lib
from grpo_jax import row_chunks
from grpo_jax.models import transformer
from grpo_jax.models.config import ModelConfig
from grpo_jax.sampling import SampleOutput


def token_logprobs(params, config: ModelConfig, tokens: jax.Array, attention_mask: jax.Array, *,
                   positions: jax.Array | None = None, chunk_size: int = 128, return_entropy: bool = False,
                   temperature: float = 1.0):
  """logp[:, t] = log π(tokens[:, t] | tokens[:, :t]), aligned with `tokens`.

  With z = logits(h_{t-1}) / temperature:  logp_t = z[tokens_t] − logsumexp(z),
  entropy_t = logsumexp(z) − Σ_v softmax(z)_v z_v.
  Entries are 0 at t = 0, where attention_mask is False, and where the previous
  position is padding (the first token of a left-padded prompt has no context).

  Args:
    params: policy params (differentiable).
    config: the ModelConfig.
    tokens: [B, L] ids: left-padded prompt + right-padded completion.
    attention_mask: [B, L] bool, False at padding.
    positions: [B, L] positions; default from the mask (cumsum - 1).
    chunk_size: positions per chunk; the peak extra memory is ~B * chunk_size * V floats.
    return_entropy: also return the per-position entropy.
    temperature: divides the logits.

  Returns:
    logp [B, L] float32, or (logp, entropy) with entropy [B, L] float32.
  """
  chex.assert_rank([tokens, attention_mask], 2)
  chex.assert_equal_shape([tokens, attention_mask])
  mask = attention_mask.astype(bool)
  hidden, _ = transformer.hidden_states(params, config, tokens, positions=positions, attention_mask=mask)
  # Position t - 1 predicts token t.
  valid = mask[:, 1:] & mask[:, :-1]
  out = _predicted_logprobs(params, config, hidden[:, :-1], tokens[:, 1:], valid, chunk_size=chunk_size,
                            return_entropy=return_entropy, temperature=temperature)
  return jax.tree.map(lambda x: jnp.pad(x, ((0, 0), (1, 0))), out)


def _predicted_logprobs(params, config: ModelConfig, h: jax.Array, targets: jax.Array, valid: jax.Array, *,
                        chunk_size: int, return_entropy: bool, temperature: float):
  """log softmax(logits(h) / temperature)[targets] [B, n] (and the entropy), 0 where not `valid`; chunked."""
  b, n_pred = targets.shape
  w = transformer.unembedding(params, config).astype(h.dtype)  # [V, E]
  chunk = max(1, min(chunk_size, n_pred))
  n_chunks = -(-n_pred // chunk)
  pad = n_chunks * chunk - n_pred
  h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
  targets = jnp.pad(targets, ((0, 0), (0, pad)))
  h = h.reshape(b, n_chunks, chunk, -1).swapaxes(0, 1)
  targets = targets.reshape(b, n_chunks, chunk).swapaxes(0, 1)

  @jax.checkpoint
  def chunk_fn(h_c, t_c):
    z = transformer.unembed(h_c, w) / temperature  # bf16 products forward and backward, float32 out
    log_z = jax.nn.logsumexp(z, axis=-1)
    logp = jnp.take_along_axis(z, t_c[..., None], axis=-1)[..., 0] - log_z
    if not return_entropy:
      return logp, jnp.zeros_like(logp)
    entropy = log_z - jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1)
    return logp, entropy

  _, (logp, entropy) = jax.lax.scan(lambda c, x: (c, chunk_fn(*x)), None, (h, targets))

  def align(x):
    x = x.swapaxes(0, 1).reshape(b, n_chunks * chunk)[:, :n_pred]
    return jnp.where(valid, x, 0.0)

  if return_entropy:
    return align(logp), align(entropy)
  return align(logp)


def grouped_completion_logprobs(params, config: ModelConfig, prompt_tokens: jax.Array, prompt_mask: jax.Array,
                                completions: jax.Array, completion_mask: jax.Array, *, group_size: int,
                                chunk_size: int = 128, return_entropy: bool = False, temperature: float = 1.0):
  """Log-probs [N, T] of completions whose prompts come in groups of G identical rows, each prompt run once.

  Row p * G + g of `completions` continues prompt p (prompt-major rows, as the sampler returns them). The B
  prompts go through the model once, into a KV cache repeated G times; the N = B * G completions then run
  against it, so the forward (and its backward) costs B * P + N * T tokens instead of N * (P + T). The values
  are those of `token_logprobs` on the concatenated rows, at the completion columns, up to float rounding
  (the same attention over the same keys, summed in another order); gradients flow into the prompt's keys
  and values through the cache.

  Args:
    params: policy params (differentiable).
    config: the ModelConfig.
    prompt_tokens: [B, P] left-padded prompts (the last column must be a real token).
    prompt_mask: [B, P] bool, False at padding.
    completions: [N, T] right-padded completions, N = B * group_size.
    completion_mask: [N, T] bool, False after the end.
    group_size: G.
    chunk_size, return_entropy, temperature: as `token_logprobs`.

  Returns:
    logp [N, T] float32 (0 where completion_mask is False), or (logp, entropy).
  """
  chex.assert_rank([prompt_tokens, prompt_mask, completions, completion_mask], 2)
  chex.assert_equal_shape([prompt_tokens, prompt_mask])
  chex.assert_equal_shape([completions, completion_mask])
  b, p = prompt_tokens.shape
  n, t = completions.shape
  if n != b * group_size:
    raise ValueError(f"grouped_completion_logprobs: {n} completions for {b} prompts x group_size {group_size}")
  prompt_mask, completion_mask = prompt_mask.astype(bool), completion_mask.astype(bool)
  cache = transformer.init_cache(config, b, p + t)
  h_prompt, cache = transformer.hidden_states(params, config, prompt_tokens, attention_mask=prompt_mask,
                                              cache=cache)
  repeat = lambda x, axis=0: jnp.repeat(x, group_size, axis=axis)
  repeat_kv = lambda x: repeat(x, transformer.cache_batch_axis(x))
  cache = cache._replace(k=jax.tree.map(repeat_kv, cache.k), v=jax.tree.map(repeat_kv, cache.v),
                         mask=repeat(cache.mask))
  h_completion, _ = transformer.hidden_states(params, config, completions, attention_mask=completion_mask,
                                              cache=cache)
  # The last prompt position predicts completion token 0; completion position j - 1 predicts token j.
  h = jnp.concatenate([repeat(h_prompt[:, -1:]), h_completion[:, :-1]], axis=1)
  previous = jnp.concatenate([repeat(prompt_mask[:, -1:]), completion_mask[:, :-1]], axis=1)
  return _predicted_logprobs(params, config, h, completions, completion_mask & previous, chunk_size=chunk_size,
                             return_entropy=return_entropy, temperature=temperature)


class PromptPrefix(NamedTuple):
  """Prompts run through the model once, for their completions to continue (`prefill`).

  k, v: the prompts' keys and values per layer, as `KVCache.k` / `KVCache.v` (batch axis
    `transformer.cache_batch_axis`), [B, ...] with P slots, all filled or masked.
  last: [B, E] the hidden state of each prompt's last position, which predicts completion token 0.
  mask: [B, P] bool, False at the prompts' (left) padding.
  blocks: None, or [M] bool: the completions that continue this prefix run in M equal blocks of columns, one
    after another against the cache (`prefixed_completion_logprobs`), and block j runs only where blocks[j] (the
    blocks after the rows' longest completion are skipped; their log-probs are 0).
  """
  k: Any
  v: Any
  last: jax.Array
  mask: jax.Array
  blocks: jax.Array | None = None


def prefill(params, config: ModelConfig, prompt_tokens: jax.Array, prompt_mask: jax.Array) -> PromptPrefix:
  """The `PromptPrefix` of B left-padded prompts [B, P] (the last column must be a real token)."""
  chex.assert_rank([prompt_tokens, prompt_mask], 2)
  prompt_mask = prompt_mask.astype(bool)
  cache = transformer.init_cache(config, *prompt_tokens.shape)
  h, cache = transformer.hidden_states(params, config, prompt_tokens, attention_mask=prompt_mask, cache=cache)
  return PromptPrefix(cache.k, cache.v, h[:, -1], prompt_mask)


def take_prefix(prefix: PromptPrefix, rows: jax.Array, shards: int = 1) -> PromptPrefix:
  """The prompts `rows` of a `PromptPrefix` (one per completion; `length_buckets.take` with `shards`)."""
  kv = lambda x: length_buckets.take(x, rows, shards, axis=transformer.cache_batch_axis(x))
  return PromptPrefix(jax.tree.map(kv, prefix.k), jax.tree.map(kv, prefix.v),
                      length_buckets.take(prefix.last, rows, shards), length_buckets.take(prefix.mask, rows, shards),
                      prefix.blocks)


def prefixed_completion_logprobs(params, config: ModelConfig, prefix: PromptPrefix, completions: jax.Array,
                                 completion_mask: jax.Array, *, chunk_size: int = 128, return_entropy: bool = False,
                                 temperature: float = 1.0):
  """Log-probs [N, T] of completions after their own prompt's `PromptPrefix` row (row i continues prefix row i).

  The completions attend to their prompt's P slots and to themselves, exactly as in
  `grouped_completion_logprobs` (whose prefix rows are the B prompts repeated G times); gradients flow into
  `prefix` (its keys, values and last hidden state) as into `params`.

  With `prefix.blocks` ([M] bool) the T columns run in M blocks of ceil(T / M) (`prefixed_completion_readout`): one
  traced block, in a `lax.scan` whose skipped blocks cost nothing, so the columns computed follow the longest
  completion while a single program serves every length.
  """
  kwargs = dict(chunk_size=chunk_size, return_entropy=return_entropy, temperature=temperature)
  if prefix.blocks is not None:  # a block's log-probs and entropy: one traced block whatever is returned
    out = prefixed_completion_readout(params, config, prefix, completions, completion_mask, lambda h, tokens, valid:
                                      _predicted_logprobs(params, config, h, tokens, valid, **kwargs | dict(
                                          return_entropy=True)))
    return out if return_entropy else out[0]
  return prefixed_completion_readout(params, config, prefix, completions, completion_mask, lambda h, tokens, valid:
                                     _predicted_logprobs(params, config, h, tokens, valid, **kwargs))


def prefixed_completion_readout(params, config: ModelConfig, prefix: PromptPrefix, completions: jax.Array,
                                completion_mask: jax.Array, readout: Callable):
  """`readout(h, tokens, valid)` of completions after their own prompt's `PromptPrefix` row: h [N, T, E] the hidden
  state of the position before each completion token (the prompt's last for token 0), which predicts it; valid
  [N, T] where the token and that position are both real. The readout gives a pytree of [N, T] arrays (the
  log-probs: `prefixed_completion_logprobs`; the value head: `training.objectives.prefixed_completion_values`).

  With `prefix.blocks` ([M] bool) the T columns run in M blocks of c = ceil(T / M) columns: block j's tokens are
  written into a cache of P + M c slots at P + j c and attend to the prompt and blocks 0..j (the slots after are
  masked, as in the one-pass forward), the carry's last hidden state predicting its first token. Block j runs only
  where prefix.blocks[j] (`lax.cond`; a skipped block's outputs are 0), so rows whose completions end within the
  first m blocks cost m blocks, forward and backward, and the program has one copy of the block.
  """
  chex.assert_rank([completions, completion_mask], 2)
  chex.assert_equal_shape([completions, completion_mask])
  n, t = completions.shape
  p = prefix.mask.shape[1]
  completion_mask = completion_mask.astype(bool)
  if prefix.blocks is None:
    cache = transformer.KVCache(k=prefix.k, v=prefix.v, mask=prefix.mask, index=jnp.asarray(p, jnp.int32))
    cache = transformer.grow_cache(cache, p + t)
    h_completion, _ = transformer.hidden_states(params, config, completions, attention_mask=completion_mask,
                                                cache=cache)
    # The last prompt position predicts completion token 0; completion position j - 1 predicts token j.
    h = jnp.concatenate([prefix.last[:, None].astype(h_completion.dtype), h_completion[:, :-1]], axis=1)
    previous = jnp.concatenate([prefix.mask[:, -1:], completion_mask[:, :-1]], axis=1)
    return readout(h, completions, completion_mask & previous)
  m = prefix.blocks.shape[0]
  c = -(-t // m)
  cut = lambda x: jnp.pad(x, ((0, 0), (0, m * c - t))).reshape(n, m, c).swapaxes(0, 1)  # [M, N, c]
  cache = transformer.KVCache(k=prefix.k, v=prefix.v, mask=prefix.mask, index=jnp.asarray(p, jnp.int32))
  cache = transformer.grow_cache(cache, p + m * c)

  def run(carry, tokens, mask):
    cache, last, last_mask = carry
    h, cache = transformer.hidden_states(params, config, tokens, attention_mask=mask, cache=cache)
    # The previous position (the prompt's last, or the previous block's last) predicts the block's first token.
    h_prev = jnp.concatenate([last[:, None].astype(h.dtype), h[:, :-1]], axis=1)
    previous = jnp.concatenate([last_mask[:, None], mask[:, :-1]], axis=1)
    out = readout(h_prev, tokens, mask & previous)
    return (cache, h[:, -1].astype(last.dtype), mask[:, -1]), out

  def skip(carry, tokens, mask):
    cache, last, last_mask = carry
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(run, carry, tokens, mask)[1])
    return (cache._replace(index=cache.index + c), last, last_mask), zeros

  def block(carry, xs):
    run_it, tokens, mask = xs
    return jax.lax.cond(run_it, run, skip, carry, tokens, mask)

  carry = (cache, prefix.last, prefix.mask[:, -1])
  _, out = jax.lax.scan(block, carry, (prefix.blocks, cut(completions), cut(completion_mask)))
  return jax.tree.map(lambda x: x.swapaxes(0, 1).reshape(n, m * c, *x.shape[3:])[:, :t], out)


def bucketed_completion_logprobs(params, config: ModelConfig, prompt_tokens: jax.Array, prompt_mask: jax.Array,
                                 completions: jax.Array, completion_mask: jax.Array, *, group_size: int,
                                 buckets: length_buckets.Buckets, chunk_size: int = 128, return_entropy: bool = False,
                                 temperature: float = 1.0):
  """`grouped_completion_logprobs` in length-sorted micro-batches (`length_buckets.Buckets`): each prompt runs
  once, then micro-batch k's completions, against their prompts' rows of the prefix, in the fewest blocks of
  `buckets.block` columns that hold them (`PromptPrefix.blocks`). Equal to the padded values up to float
  rounding; the columns computed follow the completions' lengths, and one program serves every length.

  Returns:
    logp [N, T] float32 (0 where completion_mask is False), or (logp, entropy).
  """
  kwargs = dict(chunk_size=chunk_size, return_entropy=True, temperature=temperature)
  logp, entropy = bucketed_completions(
      params, config, prompt_tokens, prompt_mask, completions, completion_mask, group_size=group_size,
      buckets=buckets, run=lambda own, tokens, mask: prefixed_completion_logprobs(params, config, own, tokens, mask,
                                                                                    **kwargs))
  return (logp, entropy) if return_entropy else logp


def bucketed_completions(params, config: ModelConfig, prompt_tokens: jax.Array, prompt_mask: jax.Array,
                         completions: jax.Array, completion_mask: jax.Array, *, group_size: int,
                         buckets: length_buckets.Buckets, run: Callable):
  """`run(prefix, completions, mask)` ([R] rows after their prompts' `PromptPrefix` rows, blocks set; a pytree of
  [R, T] arrays) over length-sorted micro-batches of the N = B·G completions: the B prompts run once through
  `params` (`prefill`), then each micro-batch in the fewest blocks of `buckets.block` columns that hold its longest
  completion (`Buckets.scan_blocks`). Returns the pytree of [N, T] arrays in the rows' order."""
  chex.assert_rank([prompt_tokens, prompt_mask, completions, completion_mask], 2)
  b, n, t = prompt_tokens.shape[0], *completions.shape
  if n != b * group_size:
    raise ValueError(f"bucketed_completions: {n} completions for {b} prompts x group_size {group_size}")
  buckets.check(n, t, group_size)
  completion_mask = completion_mask.astype(bool)
  prefix = prefill(params, config, prompt_tokens, prompt_mask)

  def body(carry, rows, blocks):
    own = take_prefix(prefix, rows // group_size, buckets.shards)._replace(blocks=blocks)
    take = lambda x: length_buckets.take(x, rows, buckets.shards)
    return carry, run(own, take(completions), take(completion_mask))

  _, outs, rows = buckets.scan_blocks(body, None, jnp.sum(completion_mask, axis=1, dtype=jnp.int32))
  # Back to the rows' order: the sorted order's inverse permutation.
  inverse = jnp.zeros((n,), jnp.int32).at[rows.reshape(-1)].set(jnp.arange(n, dtype=jnp.int32))
  return jax.tree.map(lambda x: x.reshape(n, t, *x.shape[3:])[inverse], outs)


def jit_token_logprobs(config: ModelConfig, *, mesh: Mesh | None = None, rules: Mapping | None = None,
                       chunk_size: int = 128, return_entropy: bool = False, temperature: float = 1.0,
                       group_size: int = 1, prompt_len: int | None = None, forward_rows: int = 0,
                       memory_budget: int = 0, buckets: length_buckets.Buckets | None = None,
                       skip_empty: bool = False):
  """A `placed.Placed` `fn(params, tokens, attention_mask)` computing `token_logprobs` (e.g. π_old or π_ref);
  `fn.program(shape[, params])` is the jitted program for tokens of `shape`.

  The rows run in chunks inside the program (`row_chunks.map_rows`): `forward_rows` rows at a time (whole
  groups of `group_size`); 0: as many as `memory_budget` bytes per device hold (`row_chunks.rows_per_chunk`
  of `row_chunks.forward_row_bytes`), or all at once without a budget. The values are those of one chunk up
  to float rounding.

  Params are an argument, never a compile-time constant. With `mesh` and `rules`
  the function has explicit in/out shardings: params placed by the rules, rows of
  tokens, mask and outputs split over the data axes (inputs are re-sharded as
  needed); one compilation per input shape.

  With `group_size` G > 1 and `prompt_len` P, the rows are sampler rows (`sequences_from_samples`): G
  consecutive rows share their first P columns, the prompt, which runs once per group
  (`grouped_completion_logprobs`); only the completion columns are computed, the prompt columns are 0.

  With `buckets` (and `prompt_len`; any `group_size`) the completions run in length-sorted micro-batches
  (`bucketed_completion_logprobs`), which take the place of the row chunks.

  With `skip_empty` (ungrouped rows, `forward_rows` > 0) the rows run in consecutive blocks of `forward_rows`, and a
  block whose rows attend to no token is skipped, its outputs 0 (`row_chunks.map_live_blocks`): rows padded to one
  fixed count, the real ones first, compile once and cost the blocks they fill.
  """
  kwargs = dict(chunk_size=chunk_size, return_entropy=return_entropy, temperature=temperature)
  if buckets is not None:
    if prompt_len is None:
      raise ValueError("jit_token_logprobs: buckets need prompt_len")

    def body(params, tokens, mask):
      out = bucketed_completion_logprobs(params, config, tokens[::group_size, :prompt_len],
                                         mask[::group_size, :prompt_len], tokens[:, prompt_len:],
                                         mask[:, prompt_len:], group_size=group_size, buckets=buckets, **kwargs)
      return jax.tree.map(lambda x: jnp.pad(x, ((0, 0), (prompt_len, 0))), out)
  elif group_size > 1:
    if prompt_len is None:
      raise ValueError("jit_token_logprobs: group_size > 1 needs prompt_len")

    def body(params, tokens, mask):
      out = grouped_completion_logprobs(params, config, tokens[::group_size, :prompt_len],
                                        mask[::group_size, :prompt_len], tokens[:, prompt_len:],
                                        mask[:, prompt_len:], group_size=group_size, **kwargs)
      return jax.tree.map(lambda x: jnp.pad(x, ((0, 0), (prompt_len, 0))), out)
  else:
    body = lambda params, tokens, mask: token_logprobs(params, config, tokens, mask, **kwargs)
  if (mesh is None) != (rules is None):
    raise ValueError("jit_token_logprobs: pass both mesh and rules, or neither")
  devices = 1 if mesh is None else partitioning.data_parallel_size(mesh, rules)

  if skip_empty and (buckets is not None or group_size > 1 or forward_rows < 1):
    raise ValueError("jit_token_logprobs: skip_empty takes ungrouped rows in blocks of forward_rows > 0")

  def chunked(params, tokens, mask):  # the shapes are static here: the chunk is chosen per shape
    if buckets is not None:
      return body(params, tokens, mask)
    if skip_empty:
      return row_chunks.map_live_blocks(lambda t, m: body(params, t, m), (tokens, mask), forward_rows,
                                        jnp.any(mask, axis=1))
    rows = forward_rows
    if not rows and memory_budget:
      row_bytes = row_chunks.forward_row_bytes(config, tokens.shape[1], logits_chunk=chunk_size,
                                               cached=group_size > 1)
      rows = row_chunks.rows_per_chunk(tokens.shape[0], row_bytes, memory_budget, devices=devices,
                                       multiple=group_size)
    return row_chunks.map_rows(lambda t, m: body(params, t, m), (tokens, mask), rows, group=group_size)

  if mesh is None:
    program = jax.jit(chunked)
    return placed_lib.Placed(program, lambda shape=None, params=None: program)
  config_sh = partitioning.param_shardings(mesh, rules, jax.eval_shape(transformer.init_params, config,
                                                                       jax.random.key(0)))
  placements = {jax.tree.structure(config_sh): config_sh}  # params tree structure -> its shardings
  compiled = {}

  def jitted(shape, params=None):
    """`(jitted function, rows' sharding, params' shardings)` for tokens of `shape` and params of `params`'s tree
    structure (default `config`'s; another one: e.g. LoRA's base alone, `models.lora.disabled`), built once each."""
    treedef = jax.tree.structure(config_sh if params is None else params)
    if treedef not in placements:
      placements[treedef] = partitioning.param_shardings(mesh, rules, params)
    params_sh, shape = placements[treedef], tuple(shape)
    if (shape, treedef) not in compiled:
      rows = partitioning.logical_sharding(mesh, rules, ("batch", None), shape)
      out = (rows, rows) if return_entropy else rows
      compiled[shape, treedef] = (partitioning.jit_with_rules(chunked, mesh, rules, out_shardings=out,
                                                              in_shardings=(params_sh, rows, rows)), rows, params_sh)
    return compiled[shape, treedef]

  def call(params, tokens, attention_mask):
    fn, rows, params_sh = jitted(tokens.shape, params)
    return fn(*partitioning.put((params, tokens, attention_mask), (params_sh, rows, rows)))

  # ahead of time: .program(shape[, params]).lower(abstract args)
  return placed_lib.Placed(call, lambda shape, params=None: jitted(shape, params)[0])


def sequences_from_samples(samples: SampleOutput) -> tuple[jax.Array, jax.Array]:
  """(tokens [N, P + T], attention_mask [N, P + T]) = prompt then completion, for `token_logprobs`."""
  tokens = jnp.concatenate([samples.prompt_tokens, samples.tokens], axis=1)
  mask = jnp.concatenate([samples.prompt_mask, samples.mask], axis=1)
  return tokens, mask
