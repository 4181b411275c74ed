"""Length-bucketed micro-batches: a forward or an update whose cost follows the completions' tokens.

A step's N completions have a long tail of lengths, and a padded layout computes N x T columns, T the longest.
Here the rows are sorted by length and cut into K micro-batches of R = N / K rows, and micro-batch k computes only
as many columns as its longest row needs, so the columns computed are near the tokens when K is large enough. A
program is compiled once for the step's [N, T] shape, whatever the lengths, in one of two forms:

- `Buckets.scan` (the update): micro-batch k runs at the smallest width w_k of a fixed ladder (`widths`) that holds
  its longest row, one `lax.switch` branch per width inside one `lax.scan`: Σ_k R · w_k columns, and the program
  holds one copy of the branch's forward and backward per width (its compile time grows with the widths).
- `Buckets.scan_blocks` (the π_ref / π_old forwards): one traced body for every micro-batch, which runs the completion
  in blocks of the narrowest width c, skipping the blocks after the longest row (`lax.cond`;
  `logprobs.PromptPrefix.blocks`): Σ_k R · c · ceil(longest_k / c) columns, and one copy of the forward whatever the
  widths (`with_block_tokens` drops the widths whose blocks would hold too few tokens). (In the update this form
  compiles in 0.75x the time of three branches but ran 1.7x slower per call on the tiny model: the skipped blocks'
  residuals are still written, and each block attends over all T slots.)

On a mesh whose data axes split the rows into S shards, each shard sorts its own rows and every micro-batch takes
R / S of each, so micro-batch k holds the k-th shortest rows of every shard and stays split like the batch.
"""

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


def ladder(max_width: int, num_widths: int, multiple: int = 1) -> tuple[int, ...]:
  """`num_widths` widths that halve from `max_width`, each rounded up to a multiple of `multiple` (and at least
  `multiple`), ascending and distinct: e.g. (24, 48, 96, 192) for 192, 4, 8."""
  if max_width < 1 or num_widths < 1 or multiple < 1:
    raise ValueError(f"ladder: max_width {max_width}, num_widths {num_widths}, multiple {multiple} must be >= 1")
  widths = {max_width}
  for i in range(1, num_widths):
    w = -(-max_width // 2 ** i)
    widths.add(min(max_width, max(multiple, -(-w // multiple) * multiple)))
  return tuple(sorted(widths))


def micro_batches(num_rows: int, at_least: int, shards: int = 1) -> int:
  """The fewest micro-batches K >= `at_least` that split `num_rows` rows evenly over `shards` (K · S divides N;
  N / S when none does)."""
  per_shard = num_rows // shards
  return next((k for k in range(max(1, at_least), per_shard + 1) if per_shard % k == 0), max(per_shard, 1))


class Buckets(NamedTuple):
  """The layout: `num_micro_batches` micro-batches K, at the `widths` ladder (ascending, the last one the full
  width), rows sorted within `shards` contiguous blocks (the data shards; 1 without a mesh)."""
  widths: tuple[int, ...]
  num_micro_batches: int
  shards: int = 1

  def check(self, num_rows: int, width: int, group_size: int = 1):
    """Raises ValueError unless N = `num_rows` rows of `width` columns can be laid out (K and S divide N, every
    shard's rows are whole groups of `group_size`, the widest width is `width`)."""
    k, s = self.num_micro_batches, self.shards
    if k < 1 or s < 1 or num_rows % (k * s):
      raise ValueError(f"length buckets: {num_rows} rows are not {k} micro-batches x {s} shards")
    if (num_rows // s) % group_size:
      raise ValueError(f"length buckets: {num_rows // s} rows per shard are not whole groups of {group_size}")
    if not self.widths or self.widths[-1] != width or list(self.widths) != sorted(set(self.widths)):
      raise ValueError(f"length buckets: widths {self.widths} must ascend to the full width {width}")

  def rows(self, lengths: jax.Array) -> jax.Array:
    """[K, R] row indices: micro-batch k holds, from each shard, the k-th R / S of its rows sorted by length."""
    n = lengths.shape[0]
    k, s = self.num_micro_batches, self.shards
    local = jnp.argsort(lengths.reshape(s, n // s), axis=1, stable=True).astype(jnp.int32)  # [S, N / S]
    rows = local + (jnp.arange(s, dtype=jnp.int32) * (n // s))[:, None]
    return rows.reshape(s, k, n // (s * k)).swapaxes(0, 1).reshape(k, n // k)

  @property
  def block(self) -> int:
    """The columns of one block: the narrowest width."""
    return self.widths[0]

  @property
  def num_blocks(self) -> int:
    """Blocks M that cover the full width (the last one may run past it, into padding)."""
    return -(-self.widths[-1] // self.block)

  def blocks(self, lengths: jax.Array) -> jax.Array:
    """[M] bool: the blocks that hold a column of one of `lengths` (block j holds columns [j c, (j + 1) c))."""
    return jnp.arange(self.num_blocks) * self.block < jnp.max(lengths)

  def width_index(self, lengths: jax.Array) -> jax.Array:
    """The index in `widths` of the narrowest width that holds every one of `lengths`."""
    longest = jnp.max(lengths)
    return jnp.sum(jnp.asarray(self.widths[:-1]) < longest).astype(jnp.int32)

  def scan(self, body: Callable, carry, lengths: jax.Array):
    """`lax.scan` over the micro-batches of `self.rows(lengths)`: `body(carry, rows [R], width index []) -> (carry,
    out)`, the index into `widths` of the narrowest width that holds the micro-batch (`width_index`), for the body's
    `lax.switch` over its branch per width (which holds only what depends on the width). Returns (carry, outs
    stacked [K, ...], rows [K, R])."""
    rows = self.rows(lengths)
    carry, outs = jax.lax.scan(lambda carry, r: body(carry, r, self.width_index(lengths[r])), carry, rows)
    return carry, outs, rows

  def scan_blocks(self, body: Callable, carry, lengths: jax.Array):
    """`lax.scan` over the micro-batches of `self.rows(lengths)` with one body for every width: `body(carry, rows
    [R], blocks [M] bool) -> (carry, out)`, `blocks` the micro-batch's blocks of `self.block` columns to run
    (`self.blocks`, for `logprobs.PromptPrefix.blocks`). The program holds one copy of the body. Returns (carry,
    outs stacked [K, ...], rows [K, R])."""
    rows = self.rows(lengths)
    carry, outs = jax.lax.scan(lambda carry, r: body(carry, r, self.blocks(lengths[r])), carry, rows)
    return carry, outs, rows

  def tokens(self, lengths) -> int:
    """Columns `scan` computes for these (host) lengths: Σ_k R · w_k (the padded layout: N · max width)."""
    lengths = np.asarray(lengths)
    rows = np.asarray(self.rows(jnp.asarray(lengths)))
    widths = np.asarray(self.widths)
    picked = [widths[np.sum(widths[:-1] < lengths[r].max())] for r in rows]
    return int(sum(picked) * rows.shape[1])

  def block_tokens(self, lengths) -> int:
    """Columns `scan_blocks` computes for these (host) lengths: Σ_k R · c · (blocks micro-batch k runs)."""
    lengths = np.asarray(lengths)
    rows = np.asarray(self.rows(jnp.asarray(lengths)))
    return int(sum(-(-int(lengths[r].max()) // self.block) * self.block for r in rows) * rows.shape[1])


# Tokens a forward's block should hold at the least (`with_block_tokens`): a block reads every weight once, for
# 2 FLOPs a weight a token, so with bf16 weights it does ~t FLOPs a byte read; past ~250 (an H100's or a TPU v5e's
# FLOP rate over its memory bandwidth) its matmuls, not the read, set its time.
MIN_BLOCK_TOKENS = 256


def with_block_tokens(buckets: Buckets, num_rows: int, min_tokens: int | None = None) -> Buckets:
  """`buckets` for `num_rows` rows without the ladder's widths w where a micro-batch's block on a data shard,
  N / (K · S) · w tokens, holds fewer than `min_tokens` (the full width always stays), so that `scan_blocks`'
  blocks each do enough work for the weights they read. A layout of many rows a micro-batch is unchanged; one of
  a few rows runs in fewer, wider blocks (with 2 rows a micro-batch of a 0.5B model, blocks of 16 columns took
  1.8x as long as the padded forward at equal lengths on a CPU: BENCHMARKS.md). `min_tokens` None:
  `MIN_BLOCK_TOKENS`."""
  min_tokens = MIN_BLOCK_TOKENS if min_tokens is None else min_tokens
  rows = num_rows // (buckets.num_micro_batches * buckets.shards)
  widths = tuple(w for w in buckets.widths[:-1] if rows * w >= min_tokens) + buckets.widths[-1:]
  return buckets._replace(widths=widths)


def take(x: jax.Array, rows: jax.Array, shards: int = 1, axis: int = 0) -> jax.Array:
  """x's entries at `rows` along `axis`, where the rows of shard s (`shards` contiguous blocks of x) come from
  block s (as `Buckets.rows` gives them): gathered within the block, so a split x stays split."""
  if shards == 1:
    return jnp.take(x, rows, axis=axis)
  x = jnp.moveaxis(x, axis, 0)
  n, m = x.shape[0], rows.shape[0]
  blocks = x.reshape(shards, n // shards, *x.shape[1:])
  local = (rows.reshape(shards, m // shards) % (n // shards)).reshape(shards, m // shards, *[1] * (x.ndim - 1))
  out = jnp.take_along_axis(blocks, local, axis=1).reshape(m, *x.shape[1:])
  return jnp.moveaxis(out, 0, axis)


def add_at(x: jax.Array, rows: jax.Array, values: jax.Array, shards: int = 1, axis: int = 0) -> jax.Array:
  """x with `values` added at `rows` along `axis` (repeated rows add up): the transpose of `take`."""
  if shards == 1:
    index = (slice(None),) * (axis % x.ndim) + (rows,)
    return x.at[index].add(values)
  x, values = jnp.moveaxis(x, axis, 0), jnp.moveaxis(values, axis, 0)
  n, m = x.shape[0], rows.shape[0]
  blocks = x.reshape(shards, n // shards, *x.shape[1:])
  local = rows.reshape(shards, m // shards) % (n // shards)
  blocks = blocks.at[jnp.arange(shards)[:, None], local].add(values.reshape(shards, m // shards, *x.shape[1:]))
  return jnp.moveaxis(blocks.reshape(x.shape), 0, axis)
