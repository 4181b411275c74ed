"""Length-bucketed micro-batches (length_buckets.py) and the log-probs computed in them (logprobs.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import length_buckets, logprobs, models

CONFIG = models.ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, qkv_bias=True,
                            tie_word_embeddings=False)
B, G, P, T = 4, 3, 5, 16
LENGTHS = np.array([3, 16, 1, 5,  2, 2, 9, 4,  12, 1, 7, 6])  # N = 12: a long tail (one full-width row)


def test_ladder_by_hand():
  assert length_buckets.ladder(192, 4, 8) == (24, 48, 96, 192)
  assert length_buckets.ladder(40, 4, 4) == (8, 12, 20, 40)  # 5 -> 8, 10 -> 12
  assert length_buckets.ladder(16, 8, 4) == (4, 8, 16)  # distinct: 2, 1 round up to 4
  assert length_buckets.ladder(7, 1) == (7,)
  with pytest.raises(ValueError, match="num_widths"):
    length_buckets.ladder(16, 0)


def test_micro_batches_by_hand():
  assert length_buckets.micro_batches(16, 8) == 8
  assert length_buckets.micro_batches(12, 5) == 6  # 5 does not divide 12: the next count that does
  assert length_buckets.micro_batches(1024, 13, shards=8) == 16  # 128 rows a shard: 13, 14, 15 do not divide
  assert length_buckets.micro_batches(7, 3) == 7  # a prime: one row each
  assert length_buckets.micro_batches(8, 20) == 8  # more than the rows: one row each


def test_rows_width_and_tokens_by_hand():
  b = length_buckets.Buckets(widths=(4, 8, 16), num_micro_batches=3)
  rows = np.asarray(b.rows(jnp.asarray(LENGTHS)))
  # sorted by length (stable): 2@1, 9@1, 4@2, 5@2, 0@3, 7@4, 3@5, 11@6, 10@7, 6@9, 8@12, 1@16
  np.testing.assert_array_equal(rows, [[2, 9, 4, 5], [0, 7, 3, 11], [10, 6, 8, 1]])
  assert [int(b.width_index(jnp.asarray(LENGTHS[r]))) for r in rows] == [0, 1, 2]  # longest 2, 6, 16
  assert b.tokens(LENGTHS) == 4 * (4 + 8 + 16)  # vs 12 x 16 padded
  # Two shards: each sorts its own 6 rows; micro-batch k takes 2 of each.
  two = length_buckets.Buckets(widths=(4, 8, 16), num_micro_batches=3, shards=2)
  np.testing.assert_array_equal(np.asarray(two.rows(jnp.asarray(LENGTHS))),
                                [[2, 4, 9, 7], [5, 0, 11, 10], [3, 1, 6, 8]])
  assert two.tokens(LENGTHS) == 4 * (4 + 8 + 16)


def test_blocks_by_hand():
  b = length_buckets.Buckets(widths=(6, 16), num_micro_batches=3)
  assert (b.block, b.num_blocks) == (6, 3)  # 18 columns: the last block runs 2 past the width
  np.testing.assert_array_equal(b.blocks(jnp.asarray([0, 1])), [True, False, False])
  np.testing.assert_array_equal(b.blocks(jnp.asarray([6, 2])), [True, False, False])
  np.testing.assert_array_equal(b.blocks(jnp.asarray([7, 2])), [True, True, False])
  np.testing.assert_array_equal(b.blocks(jnp.asarray([16])), [True, True, True])
  np.testing.assert_array_equal(b.blocks(jnp.asarray([0])), [False, False, False])
  # micro-batches' longest 2, 6, 16 (test above): 1, 1 and 3 blocks of 6, 4 rows each
  assert b.block_tokens(LENGTHS) == 4 * 6 * (1 + 1 + 3)


def test_check_refuses_layouts_that_do_not_fit():
  with pytest.raises(ValueError, match="micro-batches"):
    length_buckets.Buckets((8, 16), 5).check(12, 16)
  with pytest.raises(ValueError, match="whole groups"):
    length_buckets.Buckets((8, 16), 3, shards=4).check(12, 16, group_size=2)
  with pytest.raises(ValueError, match="ascend to the full width"):
    length_buckets.Buckets((8, 12), 3).check(12, 16)
  length_buckets.Buckets((8, 16), 3, shards=2).check(12, 16, group_size=3)


@pytest.mark.parametrize("shards", [1, 2])
def test_take_and_add_at_are_a_gather_and_its_transpose(shards):
  x = jax.random.normal(jax.random.key(0), (2, 12, 3))
  rows = length_buckets.Buckets((16,), 2, shards).rows(jnp.asarray(LENGTHS))[1]
  np.testing.assert_array_equal(length_buckets.take(x, rows, shards, axis=1), x[:, rows])
  v = jax.random.normal(jax.random.key(1), (2, 6, 3))
  expected = jnp.zeros_like(x).at[:, rows].add(v)
  np.testing.assert_array_equal(length_buckets.add_at(jnp.zeros_like(x), rows, v, shards, axis=1), expected)
  # add_at is take's transpose: <take(x), v> = <x, add_at(0, v)>
  _, vjp = jax.vjp(lambda y: length_buckets.take(y, rows, shards, axis=1), x)
  np.testing.assert_allclose(vjp(v)[0], expected, rtol=1e-6)


@pytest.fixture(scope="module")
def params():
  p = models.init_params(CONFIG, jax.random.key(0))
  return jax.tree.map(lambda x: 6.0 * x if x.ndim > 1 else x, p)


def _rows():
  prompts = jax.random.randint(jax.random.key(5), (B, P), 0, CONFIG.vocab_size)
  prompt_mask = jnp.arange(P)[None] >= jnp.array([[0], [2], [4], [1]])  # left padding
  completions = jax.random.randint(jax.random.key(6), (B * G, T), 0, CONFIG.vocab_size)
  mask = jnp.arange(T)[None] < jnp.asarray(LENGTHS)[:, None]
  return prompts, prompt_mask, completions, mask


@pytest.mark.parametrize("buckets", [length_buckets.Buckets((4, 8, 16), 3), length_buckets.Buckets((16,), 1),
                                     length_buckets.Buckets((2, 4, 8, 16), 6), length_buckets.Buckets((8, 16), 2, 2),
                                     length_buckets.Buckets((6, 16), 3)])
def test_bucketed_logprobs_equal_the_padded_ones(params, buckets):
  prompts, prompt_mask, completions, mask = _rows()
  kw = dict(chunk_size=4, return_entropy=True, temperature=0.7)
  padded = jax.jit(lambda p: logprobs.grouped_completion_logprobs(p, CONFIG, prompts, prompt_mask, completions, mask,
                                                                   group_size=G, **kw))(params)
  bucketed = jax.jit(lambda p: logprobs.bucketed_completion_logprobs(
      p, CONFIG, prompts, prompt_mask, completions, mask, group_size=G, buckets=buckets, **kw))(params)
  for got, want in zip(bucketed, padded):
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert bool(jnp.all(jnp.where(mask, True, got == 0.0)))
  assert float(jnp.abs(padded[0]).sum()) > 1.0  # real values, not zeros on both sides

  weights = jax.random.normal(jax.random.key(7), completions.shape)
  loss = lambda fn, **k: lambda p: jnp.sum(weights * fn(p, CONFIG, prompts, prompt_mask, completions, mask,
                                                        group_size=G, chunk_size=4, **k))
  want = jax.jit(jax.grad(loss(logprobs.grouped_completion_logprobs)))(params)
  got = jax.jit(jax.grad(loss(logprobs.bucketed_completion_logprobs, buckets=buckets)))(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, atol=2e-5 * float(jnp.abs(a).max()) + 1e-7), want, got)


def test_a_narrow_bucket_cannot_hide_a_long_row(params):
  # A ladder whose narrowest width cuts the longest row of a micro-batch would drop its tail: the widths are
  # picked per micro-batch from its longest row, so every token is scored.
  prompts, prompt_mask, completions, mask = _rows()
  out = logprobs.bucketed_completion_logprobs(params, CONFIG, prompts, prompt_mask, completions, mask, group_size=G,
                                              buckets=length_buckets.Buckets((1, 16), 2))
  assert bool(jnp.all((out != 0.0) == mask))


def test_bucketed_logprobs_compile_one_block_for_every_width(params):
  # One traced block in one scan: the program's matmuls do not grow with the widths (a branch per width would
  # hold a copy of the model's forward each: 3x the dots with 3 widths).
  prompts, prompt_mask, completions, mask = _rows()

  def dots(buckets):
    fn = lambda p: logprobs.bucketed_completion_logprobs(p, CONFIG, prompts, prompt_mask, completions, mask,
                                                         group_size=G, buckets=buckets)
    return jax.jit(fn).lower(params).as_text(dialect="hlo").count(" dot(")

  one = dots(length_buckets.Buckets((16,), 3))
  assert one > 0
  assert dots(length_buckets.Buckets((4, 8, 16), 3)) == one
  assert dots(length_buckets.Buckets((2, 4, 8, 16), 3)) == one


def test_prefixed_logprobs_skip_the_blocks_they_are_told_to(params):
  # `PromptPrefix.blocks` runs only the marked blocks: the columns of a skipped block come back 0, the others
  # equal the one-pass values.
  prompts, prompt_mask, completions, mask = _rows()
  rows = jnp.arange(B * G)
  prefix = logprobs.take_prefix(logprobs.prefill(params, CONFIG, prompts, prompt_mask), rows // G)
  whole = logprobs.prefixed_completion_logprobs(params, CONFIG, prefix, completions, mask)
  blocked = logprobs.prefixed_completion_logprobs(params, CONFIG, prefix._replace(blocks=jnp.array([True, True, False,
                                                                                                     False])),
                                                  completions, mask)
  np.testing.assert_allclose(blocked[:, :8], whole[:, :8], atol=2e-5)
  np.testing.assert_array_equal(blocked[:, 8:], 0.0)
  assert float(jnp.abs(whole[:, 8:]).sum()) > 1.0  # the skipped columns held real values


def test_bucketed_logprobs_with_a_scanned_layer_stack(params):
  # The blocks write into and read a cache of stacked [L, ...] keys and values (`--scan_layers`): the same values.
  prompts, prompt_mask, completions, mask = _rows()
  buckets = length_buckets.Buckets((4, 8, 16), 3)
  run = lambda config, p: logprobs.bucketed_completion_logprobs(p, config, prompts, prompt_mask, completions, mask,
                                                                group_size=G, buckets=buckets)
  unrolled = jax.jit(lambda p: run(CONFIG, p))(params)
  scanned = jax.jit(lambda p: run(CONFIG.replace(scan_layers=True), p))(models.stack_layers(params, CONFIG))
  np.testing.assert_allclose(scanned, unrolled, atol=2e-5)
  assert float(jnp.abs(unrolled).sum()) > 1.0


def test_with_block_tokens_drops_the_widths_of_few_token_blocks():
  b = length_buckets.Buckets(widths=(16, 32, 64, 128), num_micro_batches=4)
  # 8 rows, 2 a micro-batch: blocks of 16, 32, 64 hold 32, 64, 128 tokens; only the full width is left at 256
  assert length_buckets.with_block_tokens(b, 8).widths == (128,)
  assert length_buckets.with_block_tokens(b, 8, min_tokens=64).widths == (32, 64, 128)
  # 64 rows, 16 a micro-batch: 16 x 16 = 256 tokens a block already
  assert length_buckets.with_block_tokens(b, 64) == b
  # On 2 data shards a device's block holds half the micro-batch's rows: 32 rows, 4 a device, 4 x 64 = 256
  two = b._replace(shards=2)
  assert length_buckets.with_block_tokens(two, 32).widths == (64, 128)
  assert (length_buckets.with_block_tokens(b, 8).block, length_buckets.with_block_tokens(b, 8).num_blocks) == (128, 1)
