"""The KV-cache sampler (sampling.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from grpo_jax import logprobs, models, sampling

CONFIG = models.tiny_config(hidden_size=64, intermediate_size=128)
T = 8
_forward = jax.jit(models.apply, static_argnums=1)


@jax.jit
def _recomputed(params, samples, temperature=1.0):
  """The sampled completions' log-probs [N, T] by the training forward (`token_logprobs`)."""
  logp = logprobs.token_logprobs(params, CONFIG, *logprobs.sequences_from_samples(samples), temperature=temperature)
  return logp[:, samples.prompt_tokens.shape[1]:]


@pytest.fixture(scope="module")
def params():
  p = models.init_params(CONFIG, jax.random.key(0))
  return jax.tree.map(lambda x: 4.0 * x if x.ndim > 1 else x, p)  # Peaked, non-uniform distributions.


@pytest.fixture(scope="module")
def prompts():
  tokens = jnp.array([[10, 11, 12, 13, 14, 15], [0, 0, 0, 40, 41, 42], [0, 0, 0, 0, 0, 70]], jnp.int32)
  return tokens, tokens != 0


@pytest.fixture(scope="module")
def greedy(params, prompts):
  return sampling.sample(params, CONFIG, *prompts, jax.random.key(0), max_new_tokens=T, greedy=True,
                         eos_token_ids=())


def test_greedy_equals_uncached_forward(params, prompts, greedy):
  assert greedy.tokens.shape == (3, T) and greedy.prompt_tokens.shape == (3, 6)
  assert bool(greedy.mask.all()) and bool(greedy.truncated.all())
  np.testing.assert_array_equal(greedy.lengths, T)
  tokens = jnp.concatenate([prompts[0], greedy.tokens], axis=1)
  mask = jnp.concatenate([prompts[1], greedy.mask], axis=1)
  logits, _ = _forward(params, CONFIG, tokens, attention_mask=mask)
  predicted = logits[:, 5:-1]  # Position 5 + t predicts completion token t.
  np.testing.assert_array_equal(jnp.argmax(predicted, axis=-1), greedy.tokens)
  logp = jnp.take_along_axis(jax.nn.log_softmax(predicted), greedy.tokens[..., None], axis=-1)[..., 0]
  np.testing.assert_allclose(greedy.logprobs, logp, atol=1e-5)
  assert float(jnp.min(logp)) < -0.01  # Not a degenerate one-hot policy.


def test_left_padded_prompt_equals_unpadded(params, greedy):
  alone = sampling.sample(params, CONFIG, jnp.array([[40, 41, 42]]), jnp.ones((1, 3), bool), jax.random.key(5),
                          max_new_tokens=T, greedy=True, eos_token_ids=())
  np.testing.assert_array_equal(alone.tokens[0], greedy.tokens[1])
  np.testing.assert_allclose(alone.logprobs[0], greedy.logprobs[1], atol=1e-5)


def test_stop_tokens_end_rows_and_pad(params, prompts, greedy):
  g = np.asarray(greedy.tokens)
  stop = int(g[0, 2])
  out = sampling.sample(params, CONFIG, *prompts, jax.random.key(0), max_new_tokens=T, greedy=True,
                        eos_token_ids=(), stop_token_ids=(stop,), pad_id=99)
  for row in range(3):
    hits = np.flatnonzero(g[row] == stop)
    length = hits[0] + 1 if hits.size else T
    assert int(out.lengths[row]) == length
    assert bool(out.truncated[row]) == (hits.size == 0)
    np.testing.assert_array_equal(out.tokens[row, :length], g[row, :length])
    np.testing.assert_array_equal(out.tokens[row, length:], 99)
    np.testing.assert_array_equal(out.mask[row], np.arange(T) < length)
    np.testing.assert_array_equal(out.logprobs[row, length:], 0.0)
    np.testing.assert_allclose(out.logprobs[row, :length], greedy.logprobs[row, :length], atol=1e-6)
  assert int(out.lengths[0]) <= 3 and out.tokens[0, int(out.lengths[0]) - 1] == stop


def test_sampled_logprobs_equal_recomputed(params, prompts):
  key = jax.random.key(1)
  out = sampling.sample(params, CONFIG, *prompts, key, num_samples=3, max_new_tokens=T, temperature=0.7,
                        top_p=0.95)
  assert out.tokens.shape == (9, T) and out.prompt_mask.shape == (9, 6)
  # Prompt-major: row p * G + g belongs to prompt p.
  np.testing.assert_array_equal(out.prompt_tokens[3:6], jnp.repeat(prompts[0][1:2], 3, axis=0))
  np.testing.assert_array_equal(out.lengths, out.mask.sum(-1))
  recomputed = _recomputed(params, out)
  np.testing.assert_allclose(out.logprobs, recomputed, atol=1e-5)
  np.testing.assert_array_equal(jnp.where(out.mask, 0.0, out.logprobs), 0.0)
  assert float(jnp.abs(out.logprobs).sum()) > 0

  again = sampling.sample(params, CONFIG, *prompts, key, num_samples=3, max_new_tokens=T, temperature=0.7,
                          top_p=0.95)
  jax.tree.map(np.testing.assert_array_equal, out, again)
  other = sampling.sample(params, CONFIG, *prompts, jax.random.key(2), num_samples=3, max_new_tokens=T,
                          temperature=0.7, top_p=0.95)
  assert bool((other.tokens != out.tokens).any())
  # The G samples of one prompt differ from each other.
  assert bool((out.tokens[0] != out.tokens[1]).any() | (out.tokens[1] != out.tokens[2]).any())


def test_logprobs_at_the_sampling_temperature_equal_recomputed(params, prompts):
  """logprobs_at_temperature: π_old of the policy softmax(logits / T), as the training forward computes it;
  the tokens are those of the default call (only the returned log-probs change)."""
  key = jax.random.key(3)
  kwargs = dict(num_samples=3, max_new_tokens=T, temperature=0.7, top_p=0.95)
  out = sampling.sample(params, CONFIG, *prompts, key, logprobs_at_temperature=True, **kwargs)
  raw = sampling.sample(params, CONFIG, *prompts, key, **kwargs)
  np.testing.assert_array_equal(out.tokens, raw.tokens)
  recomputed = _recomputed(params, out, temperature=0.7)
  np.testing.assert_allclose(out.logprobs, recomputed, atol=1e-5)
  assert float(jnp.abs(out.logprobs - raw.logprobs).max()) > 1e-2  # not the temperature-1 values
  greedy = sampling.sample(params, CONFIG, *prompts, key, greedy=True, logprobs_at_temperature=True,
                           max_new_tokens=T)
  np.testing.assert_array_equal(greedy.logprobs, sampling.sample(params, CONFIG, *prompts, key, greedy=True,
                                                                 max_new_tokens=T).logprobs)


def test_top_k_one_equals_greedy(params, prompts, greedy):
  out = sampling.sample(params, CONFIG, *prompts, jax.random.key(3), num_samples=2, max_new_tokens=T,
                        temperature=1.5, top_k=1, eos_token_ids=())
  np.testing.assert_array_equal(out.tokens, jnp.repeat(greedy.tokens, 2, axis=0))
  np.testing.assert_allclose(out.logprobs, jnp.repeat(greedy.logprobs, 2, axis=0), atol=1e-6)


def test_segment_ends_by_hand():
  # T = 64 in 4 segments: steps 1-16, 17-32, 33-48, 49-63 against caches of P + 17, 33, 49 and 64 slots.
  assert sampling.segment_ends(64, 4) == (17, 33, 49, 64)
  assert sampling.segment_ends(10, 3) == (4, 7, 10)  # 9 steps: 1-3, 4-6, 7-9
  assert sampling.segment_ends(5, 2) == (3, 5)
  assert sampling.segment_ends(16, 1) == (16,)  # one loop over P + T slots, as before segments
  assert sampling.segment_ends(2, 4) == (2,) and sampling.segment_ends(1, 4) == (1,)  # fewer steps than segments
  with pytest.raises(ValueError, match="cache_segments"):
    sampling.sample(models.init_params(CONFIG, jax.random.key(0)), CONFIG, jnp.ones((1, 2), jnp.int32),
                    jnp.ones((1, 2), bool), jax.random.key(0), cache_segments=0)


@pytest.mark.parametrize("segments", [2, 3, 8])
def test_segmented_decode_equals_one_loop(params, prompts, greedy, segments):
  """The decode in segments over grown caches gives the tokens of the one-loop sampler, log-probs to rounding,
  with left padding, stop tokens ending rows inside a segment, and rows alive to the end."""
  stop = int(np.asarray(greedy.tokens)[0, 4])
  kwargs = dict(num_samples=3, max_new_tokens=T + 3, temperature=0.7, top_p=0.95, stop_token_ids=(stop,), pad_id=99)
  one = sampling.sample(params, CONFIG, *prompts, jax.random.key(6), **kwargs)
  seg = sampling.sample(params, CONFIG, *prompts, jax.random.key(6), cache_segments=segments, **kwargs)
  assert (~one.truncated).any() and one.truncated.any()  # both kinds of rows are tested
  for name in ("tokens", "mask", "lengths", "truncated", "prompt_tokens"):
    np.testing.assert_array_equal(getattr(seg, name), getattr(one, name), err_msg=name)
  np.testing.assert_allclose(seg.logprobs, one.logprobs, atol=1e-6)


def test_segmented_decode_with_scanned_layers(params, prompts):
  scanned = CONFIG.replace(scan_layers=True)
  kwargs = dict(num_samples=2, max_new_tokens=T, temperature=0.7, eos_token_ids=())
  one = sampling.sample(params, CONFIG, *prompts, jax.random.key(7), **kwargs)
  seg = sampling.sample(models.stack_layers(params, scanned), scanned, *prompts, jax.random.key(7), cache_segments=3,
                        **kwargs)
  np.testing.assert_array_equal(seg.tokens, one.tokens)
  np.testing.assert_allclose(seg.logprobs, one.logprobs, atol=1e-6)


def test_argmax_last_by_hand():
  x = jnp.array([[1.0, 3.0, 3.0, -jnp.inf], [-jnp.inf, -jnp.inf, 0.5, 0.5], [2.0, 1.0, 0.0, -1.0]])
  np.testing.assert_array_equal(sampling.argmax_last(x), [1, 2, 0])  # ties: the first index, as jnp.argmax
  y = jax.random.normal(jax.random.key(0), (64, 101))
  np.testing.assert_array_equal(sampling.argmax_last(y), jnp.argmax(y, axis=-1))
  assert sampling.argmax_last(y).dtype == jnp.int32


def test_argmax_last_is_one_paired_reduction_off_the_cpu():
  """On an H100 the two-reduction argmax gave tokens outside the vocabulary for 96% of greedy tokens (XLA fused
  the max and the comparison apart, each recomputing the logits); off the CPU it must be jnp.argmax's single
  (value, index) reduction, which cannot match no index. The CPU keeps its two plain reductions."""
  x = jnp.zeros((4, 10))
  text = lambda platform: jax.jit(sampling.argmax_last).trace(x).lower(lowering_platforms=(platform,)).as_text()
  assert text("cpu").count("stablehlo.reduce") == 2
  for platform in ("cuda", "tpu"):
    assert text(platform).count("stablehlo.reduce") == 1, platform


def test_draws_equal_jax_random_categorical():
  """The Gumbel-max draw is `jax.random.categorical`'s, so the tokens of a key are those of the earlier sampler."""
  logits = 3.0 * jax.random.normal(jax.random.key(1), (256, 101))
  for i in range(5):
    key = jax.random.key(i)
    mine = sampling._choose(logits, key, 0.7, top_k=0, top_p=0.9, greedy=False)
    theirs = jax.random.categorical(key, sampling.filter_logits(logits / 0.7, top_p=0.9), axis=-1)
    np.testing.assert_array_equal(mine, theirs)


def test_filter_logits_by_hand():
  # probabilities 0.5, 0.3, 0.15, 0.05 in a shuffled order.
  logits = jnp.log(jnp.array([[0.15, 0.5, 0.05, 0.3]]))
  kept = lambda **kw: np.isfinite(np.asarray(sampling.filter_logits(logits, **kw)))[0].tolist()
  assert kept(top_p=0.4) == [False, True, False, False]
  assert kept(top_p=0.7) == [False, True, False, True]  # 0.5 < 0.7, so the 0.3 token is needed.
  assert kept(top_p=0.79) == [False, True, False, True]
  assert kept(top_p=0.81) == [True, True, False, True]  # 0.8 < 0.81.
  assert kept(top_p=0.96) == [True, True, True, True]
  assert kept(top_k=2) == [False, True, False, True]
  assert kept(top_k=3, top_p=0.6) == [False, True, False, True]
  assert kept() == [True] * 4
  np.testing.assert_array_equal(sampling.filter_logits(logits, top_k=3)[0, 1], logits[0, 1])


def test_argument_checks(params, prompts):
  with pytest.raises(ValueError, match="temperature"):
    sampling.sample(params, CONFIG, *prompts, jax.random.key(0), temperature=0.0)
  with pytest.raises(ValueError, match="top_p"):
    sampling.sample(params, CONFIG, *prompts, jax.random.key(0), top_p=0.0)


@pytest.mark.devices(8)
def test_sharded_sampling_equals_one_device(params):
  """Sharded samples equal one device's: one GSPMD loop (weights split), or one loop per shard (weights whole)."""
  tokens = jnp.array([[10, 11, 12, 13, 14, 15], [0, 0, 0, 40, 41, 42], [0, 0, 0, 0, 0, 70], [0, 0, 20, 21, 22, 23]],
                     jnp.int32)
  kwargs = dict(num_samples=2, max_new_tokens=T, temperature=0.7, top_p=0.95)
  free = sampling.sample(params, CONFIG, tokens, tokens != 0, jax.random.key(4), eos_token_ids=(), **kwargs)
  kwargs["eos_token_ids"] = (int(free.tokens[0, 2]),)  # rows end at different steps, shards at different times
  expected = sampling.sample(params, CONFIG, tokens, tokens != 0, jax.random.key(4), **kwargs)
  lengths = np.asarray(expected.lengths)
  assert lengths[:2].max() < T and lengths.max() == T  # the first shard (prompt 0's rows) is done early
  for rules_name, per_shard in [("fsdp_tp", False), ("dp", True)]:  # one child process with 8 devices for both
    _check_sharded_sampling(params, tokens, kwargs, expected, rules_name, per_shard)


def _check_sharded_sampling(params, tokens, kwargs, expected, rules_name, per_shard):
  from grpo_jax import partitioning
  mesh, rules = partitioning.make_mesh("data:2,fsdp:2,tensor:2"), partitioning.get_rules(rules_name)
  placed = partitioning.put(params, partitioning.param_shardings(mesh, rules, params))
  out = sampling.sample(placed, CONFIG, tokens, tokens != 0, jax.random.key(4), mesh=mesh, rules=rules, **kwargs)
  np.testing.assert_array_equal(out.tokens, expected.tokens)
  np.testing.assert_array_equal(out.lengths, expected.lengths)
  np.testing.assert_array_equal(out.truncated, expected.truncated)
  np.testing.assert_allclose(out.logprobs, expected.logprobs, atol=1e-5)
  assert out.tokens.sharding.spec == PartitionSpec(("data", "fsdp"), None)
  assert bool((out.tokens[0] != out.tokens[1]).any())  # really sampled
  if not per_shard:  # q/k/v grouped per kv head and gate/up stacked, on split weights: the same samples
    together = sampling.sample(placed, CONFIG.replace(decode_projections="together"), tokens, tokens != 0,
                               jax.random.key(4), mesh=mesh, rules=rules, **kwargs)
    np.testing.assert_array_equal(together.tokens, expected.tokens)
    np.testing.assert_allclose(together.logprobs, expected.logprobs, atol=1e-5)
  # One loop per shard has no cross-device step at all; GSPMD's reduces `done` (and the split weights' sums).
  static = {k: v for k, v in kwargs.items() if k != "temperature"}
  fn = sampling.jit_sample(CONFIG, tokens.shape, mesh=mesh, rules=rules, **static)
  hlo = fn.lower(placed, tokens, tokens != 0, jax.random.key(4), jnp.float32(0.7)).compile().as_text()
  assert ("all-reduce" in hlo) != per_shard
  with pytest.raises(ValueError, match="both mesh and rules"):
    sampling.sample(placed, CONFIG, tokens, tokens != 0, jax.random.key(4), mesh=mesh)


_CHUNK_PROMPTS = jnp.array([[10, 11, 12, 13, 14, 15], [0, 0, 0, 40, 41, 42], [0, 0, 0, 0, 0, 70],
                            [0, 0, 20, 21, 22, 23]], jnp.int32)


def _chunk_kwargs(params):
  """Sampling options under which rows end at different steps (an end token the first row draws early)."""
  kwargs = dict(num_samples=2, max_new_tokens=T, temperature=0.7)
  free = sampling.sample(params, CONFIG, _CHUNK_PROMPTS, _CHUNK_PROMPTS != 0, jax.random.key(4),
                         eos_token_ids=(), **kwargs)
  return kwargs | dict(eos_token_ids=(int(free.tokens[0, 2]),))


@pytest.mark.parametrize("prompt_chunk", [1, 2])
def test_prompt_chunks_draw_the_same_tokens(params, prompt_chunk):
  """4 prompts x 2 samples, `prompt_chunk` prompts at a time: each row draws its row of the batch's noise, so the
  tokens equal one chunk's, though each chunk's loop stops at its own rows' ends."""
  kwargs = _chunk_kwargs(params)
  expected = sampling.sample(params, CONFIG, _CHUNK_PROMPTS, _CHUNK_PROMPTS != 0, jax.random.key(4), **kwargs)
  lengths = np.asarray(expected.lengths)
  assert lengths[:2].max() < T and lengths.max() == T and bool((expected.tokens[0] != expected.tokens[1]).any())
  out = sampling.sample(params, CONFIG, _CHUNK_PROMPTS, _CHUNK_PROMPTS != 0, jax.random.key(4),
                        prompt_chunk=prompt_chunk, **kwargs)
  for name in ("tokens", "lengths", "truncated", "mask", "prompt_tokens", "prompt_mask"):
    np.testing.assert_array_equal(getattr(out, name), getattr(expected, name))
  np.testing.assert_allclose(out.logprobs, expected.logprobs, atol=1e-5)
  with pytest.raises(ValueError, match="prompt_chunk=3 must divide the 4 prompts"):
    sampling.sample(params, CONFIG, _CHUNK_PROMPTS, _CHUNK_PROMPTS != 0, jax.random.key(4), prompt_chunk=3,
                    **kwargs)


@pytest.mark.devices(2)
def test_prompt_chunks_within_each_shard(params):
  """Rows split over 2 data devices, each decoding its 2 prompts 1 at a time: the tokens of one device."""
  from grpo_jax import partitioning
  kwargs = _chunk_kwargs(params)
  expected = sampling.sample(params, CONFIG, _CHUNK_PROMPTS, _CHUNK_PROMPTS != 0, jax.random.key(4), **kwargs)
  mesh, rules = partitioning.make_mesh("data:2"), partitioning.get_rules("dp")
  out = sampling.sample(params, CONFIG, _CHUNK_PROMPTS, _CHUNK_PROMPTS != 0, jax.random.key(4), mesh=mesh,
                        rules=rules, prompt_chunk=1, **kwargs)
  np.testing.assert_array_equal(out.tokens, expected.tokens)
  np.testing.assert_array_equal(out.lengths, expected.lengths)
  np.testing.assert_allclose(out.logprobs, expected.logprobs, atol=1e-5)
  assert sampling.per_shard_axes(mesh, rules, CONFIG, 4, 2) == ("data", "fsdp")  # params whole: a loop per shard
  fsdp = partitioning.make_mesh("fsdp:2")  # params split: one GSPMD loop
  assert sampling.per_shard_axes(fsdp, partitioning.get_rules("fsdp"), CONFIG, 4, 2) == ()
