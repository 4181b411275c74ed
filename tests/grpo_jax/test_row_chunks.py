"""Row-chunked forwards (grpo_jax/row_chunks.py): the chunk layout, the budget arithmetic, and the log-prob
forward chunked against the same forward over all rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import logprobs, models, partitioning, row_chunks, sampling

CONFIG = models.ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, qkv_bias=True,
                            scan_layers=True)


def test_chunks_hold_strided_rows_and_outputs_come_back_in_order():
  x = jnp.arange(10.0)
  # fn sees R rows at a time: it returns each chunk's first row and its size, so both show in the output.
  first = jax.jit(lambda x: row_chunks.map_rows(lambda c: (jnp.full_like(c, c[0]), c * c.shape[0]), (x,), 4))
  heads, scaled = first(x)
  # 10 rows in chunks of 4: 3 chunks (padded to 12 by repeating row 9); chunk c holds rows c, c + 3, c + 6, c + 9.
  np.testing.assert_array_equal(heads, np.arange(10) % 3)
  np.testing.assert_array_equal(scaled, 4 * np.arange(10.0))
  np.testing.assert_array_equal(row_chunks.map_rows(lambda c: c * c.shape[0], (x,), 0), 10 * np.arange(10.0))
  np.testing.assert_array_equal(row_chunks.map_rows(lambda c: c * c.shape[0], (x,), 10), 10 * np.arange(10.0))


def test_groups_stay_together():
  x = jnp.arange(12.0).reshape(6, 2)  # 3 groups of 2 rows
  out = row_chunks.map_rows(lambda c: c - c[::2].repeat(2, axis=0), (x,), 2, group=2)  # minus the group's first
  np.testing.assert_array_equal(out, x - x[::2].repeat(2, axis=0))
  heads = row_chunks.map_rows(lambda c: jnp.broadcast_to(c[:1], c.shape), (x,), 4, group=2)  # 2 chunks of 2 groups
  # chunk 0: groups 0 and 2, whose first row is row 0 (x = 0); chunk 1: group 1 (rows 2, 3: x = 4) and a padding copy.
  np.testing.assert_array_equal(heads[:, 0], [0, 0, 4, 4, 0, 0])
  with pytest.raises(ValueError, match="whole groups of 2"):
    row_chunks.map_rows(lambda c: c, (x,), 3, group=2)
  with pytest.raises(ValueError, match="must agree"):
    row_chunks.map_rows(lambda a, b: a, (x, x[:5]), 2)


def test_rows_per_chunk_from_a_budget():
  # 1000 rows of 1 MB, 64 MB per device on 8 devices: 512 fit; 2 chunks of 500 (even), a multiple of 8 -> 504.
  assert row_chunks.rows_per_chunk(1000, 2 ** 20, 64 * 2 ** 20, devices=8) == 504
  assert row_chunks.rows_per_chunk(1000, 2 ** 20, 2 ** 30, devices=8) == 1000  # all fit: one chunk
  # Groups of 64 on 8 devices: 512 fit, a multiple of 64; 1024 rows -> 2 chunks of 512.
  assert row_chunks.rows_per_chunk(1024, 2 ** 20, 64 * 2 ** 20, devices=8, multiple=64) == 512
  # Nothing fits: the smallest chunk, one group on each device's share.
  assert row_chunks.rows_per_chunk(1024, 2 ** 30, 2 ** 20, devices=8, multiple=64) == 64
  assert row_chunks.rows_per_chunk(96, 10, 300, multiple=4) == 24  # 30 fit -> 28; 96 rows in 4 chunks of 24


def test_forward_row_bytes_by_hand():
  config = CONFIG.replace(dtype="bfloat16")
  length = 10
  layer = (6 * 32 + 3 * 48) * 10 * 2  # residual, q, k, v, output; gate, up, product; bf16
  scores = 2 * 4 * 10 * 10 * 4
  logits = 9 * 4 * 61  # a chunk of 4 positions: float32 logits and exponentials, a bool mask
  cache = 2 * 2 * 2 * 8 * 10 * 2  # keys and values, 2 layers, 2 kv heads of 8, bf16
  assert row_chunks.forward_row_bytes(config, length) == layer + scores
  assert row_chunks.forward_row_bytes(config, length, logits_chunk=4, cached=True) == layer + scores + logits + cache
  assert row_chunks.forward_row_bytes(config.replace(attention="pallas"), length) == layer  # fused: no [L, L]


def test_sampler_bytes_and_prompt_chunks_by_hand():
  config = CONFIG.replace(dtype="bfloat16")
  kv = 2 * 2 * 2 * 8 * 2  # keys and values of one slot: 2 layers, 2 kv heads of 8, bf16
  slots = 6 + 3 * 16  # the prompt's 6, then 3 samples' own T - 1 = 9 each, rounded up to 16 (`own_columns`)
  want = kv * slots + row_chunks.forward_row_bytes(config, 6) + 3 * 3 * 61 * 4
  assert row_chunks.sampler_prompt_bytes(config, 6, 3, 10) == want
  assert row_chunks.prompts_per_chunk(12, 100, 1200) == 0  # all 12 fit
  assert row_chunks.prompts_per_chunk(12, 100, 500) == 4  # 5 fit: the most that divide 12
  assert row_chunks.prompts_per_chunk(12, 100, 500, shards=2) == 3  # 6 per shard, 5 fit: 3 divides 6
  assert row_chunks.prompts_per_chunk(14, 100, 500, shards=2) == 1  # 7 per shard, prime: one at a time
  assert row_chunks.prompts_per_chunk(12, 100, 50) == 1  # none fit: one at a time
  assert row_chunks.prompts_per_chunk(12, 100, 500, multiple=3) == 3  # 5 fit; multiples of 3 dividing 12: 3, 6, 12
  assert row_chunks.prompts_per_chunk(12, 100, 200, multiple=3) == 3  # none of them fits: the fewest


def test_default_budget():
  assert row_chunks.default_budget_bytes(jax.devices("cpu")[0]) == row_chunks.CPU_BUDGET_BYTES

  class Described:  # a TPU topology's device, as ahead-of-time compilation sees it: no memory stats
    platform, device_kind = "tpu", "TPU v5 lite"

    def memory_stats(self):
      raise RuntimeError("no stats")

  assert row_chunks.default_budget_bytes(Described()) == 4 * row_chunks.GiB  # a quarter of 16 GiB


def _sampled():
  params = models.init_params(CONFIG, jax.random.key(0))
  params = jax.tree.map(lambda x: 6.0 * x if x.ndim > 1 else x, params)
  prompts = jax.random.randint(jax.random.key(1), (5, 6), 1, CONFIG.vocab_size)
  prompt_mask = jnp.arange(6)[None] >= jnp.array([[0], [2], [1], [0], [3]])
  samples = sampling.sample(params, CONFIG, prompts, prompt_mask, jax.random.key(2), num_samples=2,
                            max_new_tokens=7)
  return params, samples


@pytest.mark.parametrize("grouped", [False, True])
def test_chunked_log_probs_equal_all_rows_at_once(grouped):
  """10 rows (5 prompts x 2 samples) in chunks of 4: 3 chunks, the last one padded; the same log-probs and
  entropies as one chunk, up to float rounding; and a memory budget that fits 2 rows picks chunks of 2."""
  params, samples = _sampled()
  tokens, mask = logprobs.sequences_from_samples(samples)
  kw = dict(group_size=2, prompt_len=6) if grouped else {}
  whole = logprobs.jit_token_logprobs(CONFIG, chunk_size=4, return_entropy=True, **kw)(params, tokens, mask)
  chunked = logprobs.jit_token_logprobs(CONFIG, chunk_size=4, return_entropy=True, forward_rows=4, **kw)
  got = chunked(params, tokens, mask)
  assert float(jnp.abs(whole[0]).max()) > 1.0
  for a, b in zip(got, whole):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  row_bytes = row_chunks.forward_row_bytes(CONFIG, 13, logits_chunk=4, cached=grouped)
  budget = logprobs.jit_token_logprobs(CONFIG, chunk_size=4, memory_budget=2 * row_bytes + 1, **kw)
  hlo = budget.program().lower(params, tokens, mask).as_text()
  assert "tensor<5x2x13xf32>" in hlo  # the loop's stacked output: 5 chunks of 2 rows
  np.testing.assert_allclose(budget(params, tokens, mask), whole[0], rtol=1e-5, atol=1e-6)


@pytest.mark.devices(2)
def test_chunked_log_probs_on_a_mesh():
  """Rows split over 2 devices, chunks of 4 rows (2 per device): the values of the single-device forward."""
  params, samples = _sampled()
  tokens, mask = logprobs.sequences_from_samples(samples)
  mesh, rules = partitioning.make_mesh("data:2"), partitioning.get_rules("dp")
  want = logprobs.jit_token_logprobs(CONFIG, chunk_size=4)(params, tokens, mask)
  for kw in ({}, dict(group_size=2, prompt_len=6)):
    fn = logprobs.jit_token_logprobs(CONFIG, mesh=mesh, rules=rules, chunk_size=4, forward_rows=4, **kw)
    got = fn(params, tokens, mask)
    cols = slice(6, None) if kw else slice(None)
    np.testing.assert_allclose(got[:, cols], want[:, cols], rtol=1e-5, atol=1e-6)


def test_live_blocks_run_consecutive_rows_and_skip_the_empty_ones():
  x = jnp.arange(12.0)
  live = jnp.arange(12) < 5  # rows 0-4 real: blocks 0 and 1 of 4 rows; block 2 (rows 8-11) holds none
  # fn returns each block's first row and 1 / (live rows - 0): inf, not 0, if an empty block ran.
  fn = lambda c, alive: (jnp.full_like(c, c[0]), jnp.broadcast_to(1.0 / jnp.sum(alive), c.shape))
  heads, inverse = jax.jit(lambda x, live: row_chunks.map_live_blocks(fn, (x, live), 4, live))(x, live)
  np.testing.assert_array_equal(heads, [0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0])  # consecutive blocks; the last: zeros
  np.testing.assert_array_equal(inverse, [0.25] * 4 + [1.0] * 4 + [0.0] * 4)
  with pytest.raises(ValueError, match="whole blocks of 5"):
    row_chunks.map_live_blocks(lambda c: c, (x,), 5, live)
  with pytest.raises(ValueError, match="must agree"):
    row_chunks.map_live_blocks(lambda c: c, (x,), 4, live[:8])


def _padded(tokens, mask, empty: int):
  pad = lambda x: jnp.concatenate([x, jnp.zeros((empty, *x.shape[1:]), x.dtype)])
  return pad(tokens), pad(mask)


def test_skip_empty_log_probs_equal_the_real_rows_and_are_zero_past_them():
  """10 real rows padded to 16 in blocks of 4: the real rows' log-probs and entropies are those of a forward
  over them alone; the padding rows' are 0; the program is one whatever the real rows (it takes the 16 rows)."""
  params, samples = _sampled()
  tokens, mask = logprobs.sequences_from_samples(samples)
  whole = logprobs.jit_token_logprobs(CONFIG, chunk_size=4, return_entropy=True)(params, tokens, mask)
  fn = logprobs.jit_token_logprobs(CONFIG, chunk_size=4, return_entropy=True, forward_rows=4, skip_empty=True)
  got = fn(params, *_padded(tokens, mask, 6))
  for a, b in zip(got, whole):
    np.testing.assert_allclose(a[:10], b, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(a[10:], 0.0)
  assert float(jnp.abs(whole[0]).max()) > 1.0
  with pytest.raises(ValueError, match="skip_empty"):
    logprobs.jit_token_logprobs(CONFIG, chunk_size=4, skip_empty=True)  # no block size
  with pytest.raises(ValueError, match="skip_empty"):
    logprobs.jit_token_logprobs(CONFIG, forward_rows=4, group_size=2, prompt_len=6, skip_empty=True)


@pytest.mark.devices(2)
def test_skip_empty_log_probs_on_a_mesh():
  """The same on 2 devices, whose contiguous halves of the 16 rows are rows 0-7 (real) and 8-15 (2 real, 6
  empty): each block's rows are split over both, and the values are the single-device forward's."""
  params, samples = _sampled()
  tokens, mask = logprobs.sequences_from_samples(samples)
  want = logprobs.jit_token_logprobs(CONFIG, chunk_size=4)(params, tokens, mask)
  mesh, rules = partitioning.make_mesh("data:2"), partitioning.get_rules("dp")
  fn = logprobs.jit_token_logprobs(CONFIG, mesh=mesh, rules=rules, chunk_size=4, forward_rows=4, skip_empty=True)
  got = fn(params, *_padded(tokens, mask, 6))
  np.testing.assert_allclose(got[:10], want, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(got[10:], 0.0)
