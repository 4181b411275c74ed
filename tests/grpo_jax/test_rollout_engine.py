"""The continuous-batching rollout engine (rollout_engine.py) against the static sampler and a plain forward."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from grpo_jax import models, rollout_engine, row_chunks, sampling

CONFIG = models.tiny_config(hidden_size=64, intermediate_size=128)
T = 10
G = 3
PROMPTS = jnp.array([[10, 11, 12, 13, 14, 15], [0, 0, 0, 40, 41, 42], [0, 0, 0, 0, 0, 70], [0, 0, 20, 21, 22, 23]],
                    jnp.int32)
MASK = PROMPTS != 0
_FIELDS = ("tokens", "mask", "lengths", "truncated", "prompt_tokens", "prompt_mask")
_forward = jax.jit(models.apply, static_argnums=1)


@pytest.fixture(scope="module")
def params():
  p = models.init_params(CONFIG, jax.random.key(0))
  return jax.tree.map(lambda x: 4.0 * x if x.ndim > 1 else x, p)  # Peaked, non-uniform distributions.


@pytest.fixture(scope="module")
def caps():
  """Each completion's own cap, 1 to T: lengths differ, so slots finish at different steps and refill."""
  return np.random.default_rng(0).integers(1, T + 1, size=len(PROMPTS) * G).astype(np.int32)


def _assert_same(out, expected, atol=1e-5):
  for name in _FIELDS:
    np.testing.assert_array_equal(getattr(out, name), getattr(expected, name), err_msg=name)
  np.testing.assert_allclose(out.logprobs, expected.logprobs, atol=atol)


OPTIONS = {
    "greedy": dict(greedy=True),
    "sampled": dict(temperature=0.7, top_p=0.9),
    "top_k": dict(temperature=1.3, top_k=5),
    "at_temperature": dict(temperature=0.6, logprobs_at_temperature=True),
}


@pytest.mark.parametrize("slots", [1, 5, 12])
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_equals_the_static_sampler(params, caps, option, slots):
  """With the same key, the same completions as `sampling.sample` (which decodes all 12 rows at once), whether
  one slot decodes the 12 completions one after the other, 5 slots refill as theirs end, or 12 never refill."""
  kwargs = dict(num_samples=G, max_new_tokens=T, eos_token_ids=(), max_lengths=caps, **OPTIONS[option])
  expected = sampling.sample(params, CONFIG, PROMPTS, MASK, jax.random.key(3), **kwargs)
  np.testing.assert_array_equal(expected.lengths, caps)
  out = rollout_engine.generate(params, CONFIG, PROMPTS, MASK, jax.random.key(3), num_slots=slots, **kwargs)
  _assert_same(out, expected)
  assert bool(out.truncated.all())  # every completion ended at its cap, none with an end token
  if not OPTIONS[option].get("greedy"):
    assert bool((out.tokens[0] != out.tokens[1]).any())  # really sampled


@pytest.mark.parametrize("slots", [2, 12])
def test_end_tokens_end_completions(params, slots):
  """End tokens (drawn from the policy's own samples, so completions end early, at different steps) end a
  completion, pad it and free its slot: the static sampler's rows exactly."""
  free = sampling.sample(params, CONFIG, PROMPTS, MASK, jax.random.key(1), num_samples=G, max_new_tokens=T,
                         temperature=1.0, eos_token_ids=())
  stops = tuple(int(t) for t in np.asarray(free.tokens[:, 1:3]).ravel()[:3])
  kwargs = dict(num_samples=G, max_new_tokens=T, temperature=1.0, eos_token_ids=(), stop_token_ids=stops, pad_id=99)
  expected = sampling.sample(params, CONFIG, PROMPTS, MASK, jax.random.key(1), **kwargs)
  lengths = np.asarray(expected.lengths)
  assert lengths.min() < T and lengths.max() == T and not bool(expected.truncated.all())
  out = rollout_engine.generate(params, CONFIG, PROMPTS, MASK, jax.random.key(1), num_slots=slots, **kwargs)
  _assert_same(out, expected)
  tokens = np.asarray(out.tokens)
  for row, n in enumerate(lengths):
    np.testing.assert_array_equal(tokens[row, n:], 99)
    assert (tokens[row, n - 1] in stops) != bool(out.truncated[row])


def test_logprobs_equal_an_uncached_forward(params, caps):
  """Each completion's tokens and log-probs re-scored by one full forward over prompt + completion (no cache):
  the engine's prefix pointers, per-slot cache indices and refills attend to exactly the right keys."""
  out = rollout_engine.generate(params, CONFIG, PROMPTS, MASK, jax.random.key(2), num_samples=G, max_new_tokens=T,
                                greedy=True, eos_token_ids=(), max_lengths=caps, num_slots=4)
  tokens = jnp.concatenate([out.prompt_tokens, out.tokens], axis=1)
  mask = jnp.concatenate([out.prompt_mask, out.mask], axis=1)
  logits, _ = _forward(params, CONFIG, tokens, attention_mask=mask)
  predicted = logits[:, PROMPTS.shape[1] - 1:-1]  # position P - 1 + t predicts completion token t
  logp = jnp.take_along_axis(jax.nn.log_softmax(predicted), out.tokens[..., None], axis=-1)[..., 0]
  m = np.asarray(out.mask)
  np.testing.assert_array_equal(np.asarray(jnp.argmax(predicted, -1))[m], np.asarray(out.tokens)[m])
  np.testing.assert_allclose(np.asarray(out.logprobs)[m], np.asarray(logp)[m], atol=1e-5)
  np.testing.assert_array_equal(np.asarray(out.logprobs)[~m], 0.0)


def test_scanned_layers(params, caps):
  """`scan_layers` (one stacked cache, the prefix gathered inside the scan): the unrolled layers' completions."""
  config = dataclasses.replace(CONFIG, scan_layers=True)
  kwargs = dict(num_samples=G, max_new_tokens=T, temperature=0.8, eos_token_ids=(), max_lengths=caps, num_slots=5)
  expected = rollout_engine.generate(params, CONFIG, PROMPTS, MASK, jax.random.key(5), **kwargs)
  out = rollout_engine.generate(models.stack_layers(params, CONFIG), config, PROMPTS, MASK, jax.random.key(5),
                                **kwargs)
  _assert_same(out, expected)


def test_lora_adapters(params, caps):
  """With LoRA adapters in the params (merged by the model), the static sampler's completions."""
  from grpo_jax.models import lora
  config = lora.lora_config(CONFIG, rank=2, alpha=4.0, targets=("q", "v", "up"))
  adapters = jax.tree.map(lambda x: x + 0.3, lora.init_adapters(config, jax.random.key(7)))  # B != 0
  adapted = lora.join(params, adapters)
  kwargs = dict(num_samples=G, max_new_tokens=T, temperature=1.0, eos_token_ids=(), max_lengths=caps)
  expected = sampling.sample(adapted, config, PROMPTS, MASK, jax.random.key(6), **kwargs)
  base = sampling.sample(params, CONFIG, PROMPTS, MASK, jax.random.key(6), **kwargs)
  assert not np.array_equal(expected.tokens, base.tokens)
  _assert_same(rollout_engine.generate(adapted, config, PROMPTS, MASK, jax.random.key(6), num_slots=5, **kwargs),
               expected)


def test_argument_checks(params):
  with pytest.raises(ValueError, match=r"max_lengths must be \[12\] ints in \[1, 10\]"):
    rollout_engine.generate(params, CONFIG, PROMPTS, MASK, jax.random.key(0), num_samples=G, max_new_tokens=T,
                            max_lengths=np.full(12, T + 1))
  with pytest.raises(ValueError, match=r"max_lengths must be \[12\]"):
    rollout_engine.generate(params, CONFIG, PROMPTS, MASK, jax.random.key(0), num_samples=G, max_new_tokens=T,
                            max_lengths=np.full(11, T))
  with pytest.raises(ValueError, match="num_slots must be >= 1"):
    rollout_engine.generate(params, CONFIG, PROMPTS, MASK, jax.random.key(0), num_slots=-1)
  with pytest.raises(ValueError, match="temperature must be > 0"):
    rollout_engine.generate(params, CONFIG, PROMPTS, MASK, jax.random.key(0), temperature=0.0)


def test_default_slots_and_the_budget():
  # A CPU: 4096 cached tokens a device, at least 8 slots (512 tokens: 8 a device; 40 tokens: 102 a device), and at
  # most 8 waves (512 completions a device at 512 tokens: 64 slots, not 8 in 64 waves), raised to whole waves: 512
  # completions a device at 40 tokens in 5 waves of 103 (not 5 of 102 and one of 2), 99 in 7 waves of 15 (8 of 13).
  slots = rollout_engine.default_slots
  assert slots(1024, 512, 2, "cpu") == 128 and slots(1024, 1024, 2, "cpu") == 128 and slots(5, 512, 2, "cpu") == 5
  assert slots(64, 512, 2, "cpu") == 16  # 32 a device: the floor of 8 slots, 4 waves
  assert slots(1024, 40, 2, "cpu") == 206 and slots(99, 4096, 1, "cpu") == 15
  assert slots(256, 192, 2, "cpu") == 44 and slots(256, 64, 2, "cpu") == 128  # 128 a device: 21 -> 22; 2 x 64
  assert slots(80, 192, 2, "cpu") == 42  # 40 a device: one wave of 40 would be 1.9x the 21, more than 1.25x
  assert rollout_engine.even_waves(100, 30) == 34 and rollout_engine.even_waves(100, 26) == 26  # 3 x 34; 34 > 32.5
  # With a model whose weights outweigh its cache, a step's caches may hold 2.5x the weights' bytes.
  big = models.tiny_config(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                           num_attention_heads=14, num_key_value_heads=2, head_dim=64, dtype="bfloat16")
  layer = (896 * 14 * 64 + 2 * 896 * 2 * 64 + 14 * 64 * 896 + 3 * 896 * 4864  # q, k, v, o; gate, up, down
           + 14 * 64 + 2 * 2 * 64 + 2 * 896)  # q, k, v biases; two norms
  assert rollout_engine.weight_bytes(big) == (151_936 * 896 + 24 * layer + 896) * 4  # tied, final norm; float32
  per_token = 2 * 24 * 2 * 64 * 2  # keys and values, 24 layers, 2 kv heads of 64, a bfloat16 cache
  assert rollout_engine.cpu_cache_tokens(big) == int(2.5 * rollout_engine.weight_bytes(big) // per_token)
  assert slots(128, 96, 2, "cpu", big) == 128  # 64 a device fit: one wave (42 a device without the model)
  assert slots(128, 96, 2, "cpu") == 84
  assert rollout_engine.cpu_cache_tokens(CONFIG) == 4096  # a small model: the floor
  # One wave's levels a factor sqrt(2) apart only where a CPU step costs about its rows (the weights outweigh it).
  assert rollout_engine.level_ratio(big, "cpu") == 2 ** 0.5 and rollout_engine.level_ratio(big, "gpu") == 2
  assert rollout_engine.level_ratio(CONFIG, "cpu") == 2 and rollout_engine.level_ratio(None, "cpu") == 2
  assert slots(256, 192, 2, "cpu", CONFIG) == 44
  assert slots(40, 64, 1, "gpu") == 40  # few completions: one slot each
  assert slots(1024, 64, 8, "tpu") == 256 and slots(100, 8, 1, "gpu") == 64
  # 1 GiB of prompts split over 2 shards beside slots of 1 MiB each in 1.5 GiB a shard: 1024 a shard, 2048 in all.
  gib, mib = row_chunks.GiB, 2 ** 20
  assert row_chunks.slots_that_fit(10_000, gib, mib, 1.5 * gib, most=4096, shards=2) == 2048
  assert row_chunks.slots_that_fit(10_000, gib, mib, 1.5 * gib, most=300, shards=2) == 300
  assert row_chunks.slots_that_fit(100, gib, mib, 1.5 * gib, most=300, shards=2) == 100
  assert row_chunks.slots_that_fit(100, 4 * gib, mib, gib, most=300, shards=2) == 2  # nothing fits: one a shard
  c = CONFIG  # hand count: 2 layers x 2 (k, v) x K x D x 4 bytes per cached token
  prompts, slot = row_chunks.engine_bytes(c, 3, 6, 10)
  kv = 2 * c.num_key_value_heads * c.head_dim * 4
  # The cache and a phase's copy, each of T - 1 = 9 columns rounded up to 16 (`kv_cache.own_columns`).
  assert slot == 2 * c.num_hidden_layers * kv * 16 + kv * 6 + 3 * c.vocab_size * 4
  assert prompts == 3 * (c.num_hidden_layers * kv * 6 + row_chunks.forward_row_bytes(c, 6) + c.hidden_size * 4)


@pytest.mark.devices(8)
def test_sharded_engine_equals_one_device(params, caps):
  """On a 2 x 2 x 2 mesh: one engine per data shard (weights whole, `dp`) or one GSPMD engine whose slots are split
  (weights split, `fsdp_tp`), refilling or in one wave: the one-device completions; and 3 prompts, not a multiple
  of the 4 data shards."""
  from grpo_jax import partitioning
  kwargs = dict(num_samples=G, max_new_tokens=T, temperature=0.7, eos_token_ids=(), max_lengths=caps)
  expected = rollout_engine.generate(params, CONFIG, PROMPTS, MASK, jax.random.key(4), num_slots=6, **kwargs)
  three = dict(kwargs, max_lengths=caps[:9])
  expected3 = rollout_engine.generate(params, CONFIG, PROMPTS[:3], MASK[:3], jax.random.key(4), num_slots=6, **three)
  for rules_name in ("dp", "fsdp_tp"):
    mesh, rules = partitioning.make_mesh("data:2,fsdp:2,tensor:2"), partitioning.get_rules(rules_name)
    placed = partitioning.put(params, partitioning.param_shardings(mesh, rules, params))
    out = rollout_engine.generate(placed, CONFIG, PROMPTS, MASK, jax.random.key(4), num_slots=8, mesh=mesh,
                                  rules=rules, **kwargs)
    _assert_same(out, expected)
    assert out.tokens.sharding.spec == PartitionSpec(("data", "fsdp"), None)
    _assert_same(rollout_engine.generate(placed, CONFIG, PROMPTS, MASK, jax.random.key(4), num_slots=12, mesh=mesh,
                                         rules=rules, **kwargs), expected)  # one wave: every shard in lockstep
    out3 = rollout_engine.generate(placed, CONFIG, PROMPTS[:3], MASK[:3], jax.random.key(4), num_slots=8, mesh=mesh,
                                   rules=rules, **three)
    _assert_same(out3, expected3)
    # Ahead of time: the program `generate` runs (a multiple of the data shards), for aot_compile.
    fn = rollout_engine.jit_generate(CONFIG, PROMPTS.shape, mesh=mesh, rules=rules, num_samples=G, max_new_tokens=T,
                                     eos_token_ids=(), num_slots=8)
    hlo = fn.lower(placed, PROMPTS, MASK, jax.random.key(4), jnp.float32(0.7), jnp.asarray(caps)).compile().as_text()
    assert ("all-reduce" in hlo) == (rules_name == "fsdp_tp")  # one engine per shard: no cross-device step


def test_phase_widths_by_hand():
  assert rollout_engine.phase_widths(511) == (63, 127, 255, 511)
  assert rollout_engine.phase_widths(71) == (17, 35, 71) and rollout_engine.phase_widths(9) == (9,)
  assert rollout_engine.phase_widths(1023, phases=2) == (511, 1023)


@pytest.mark.parametrize("slots", [2, 5])
def test_phases_of_narrower_caches(params, slots):
  """T = 72: the caches cut to 17, 35 or 71 columns as the longest live completion grows and shrinks (caps from 1
  to 72, so a long one ends while short ones run, and the phase narrows again): the static sampler's completions."""
  caps = np.random.default_rng(1).choice([2, 5, 20, 40, 72], size=len(PROMPTS) * G).astype(np.int32)
  kwargs = dict(num_samples=G, max_new_tokens=72, temperature=0.9, eos_token_ids=(), max_lengths=caps)
  expected = sampling.sample(params, CONFIG, PROMPTS, MASK, jax.random.key(8), **kwargs)
  out = rollout_engine.generate(params, CONFIG, PROMPTS, MASK, jax.random.key(8), num_slots=slots, **kwargs)
  _assert_same(out, expected)


def test_slot_levels_by_hand():
  assert rollout_engine.slot_levels(128) == (128, 64, 32, 16)
  assert rollout_engine.slot_levels(21) == (21, 11) and rollout_engine.slot_levels(12) == (12,)
  assert rollout_engine.slot_levels(100, levels=2) == (100, 50) and rollout_engine.slot_levels(8) == (8,)
  # One wave's levels, a factor sqrt(2) apart: 32 / 1.414 = 22.6 -> 23, 16.3 -> 17, 12.02 -> 13, 9.2 -> 10, 7.07 -> 8
  one_wave = rollout_engine.ONE_WAVE_LEVELS
  assert rollout_engine.slot_levels(32, **one_wave) == (32, 23, 17, 13, 10, 8)
  assert rollout_engine.slot_levels(128, **one_wave) == (128, 91, 65, 46, 33, 24, 17)  # at most 7
  assert rollout_engine.slot_levels(9, narrowest=2, ratio=1.05) == (9, 8, 7, 6)  # each smaller than the one before


# 8 prompts x 4 samples: 32 completions, enough for the slots to narrow (levels down to 8 slots).
PROMPTS8 = jnp.concatenate([PROMPTS, jnp.where(MASK, (PROMPTS * 7 + 3) % CONFIG.vocab_size, 0)])
MASK8 = jnp.concatenate([MASK, MASK])


@pytest.mark.parametrize("slots", [32, 20, "32, sqrt(2) apart"])
@pytest.mark.parametrize("option", ["greedy", "sampled"])
def test_levels_of_fewer_slots(params, option, slots, monkeypatch):
  """A long tail of caps (most completions short, a few at T = 72): once nothing is pending, the live slots are
  gathered into narrower levels (one wave of 32 slots: in lockstep, the first level's slots in completion order,
  then 16 and 8, or 23, 17, 13, 10 and 8 with `level_ratio` sqrt(2), a larger model's on a CPU; 20 slots: refills
  first, then 10), which step at the width 71 only (of 17, 35, 71), and the completions are the static
  sampler's."""
  fine = slots == "32, sqrt(2) apart"
  if fine:
    monkeypatch.setattr(rollout_engine, "level_ratio", lambda config, platform=None: 2 ** 0.5)
    slots = 32
  caps = np.random.default_rng(2).choice([1, 2, 3, 6, 9, 72], p=[.2, .2, .2, .2, .1, .1], size=32).astype(np.int32)
  caps[[5, 30]] = 72  # two long ones, far apart in the slots
  assert rollout_engine.phase_widths(71)[-rollout_engine.NARROWER_LEVEL_WIDTHS:] == (71,)
  kwargs = dict(num_samples=4, max_new_tokens=72, eos_token_ids=(), max_lengths=caps, **OPTIONS[option])
  expected = sampling.sample(params, CONFIG, PROMPTS8, MASK8, jax.random.key(9), **kwargs)
  levels = (32, 23, 17, 13, 10, 8) if fine else {32: (32, 16, 8), 20: (20, 10)}[slots]
  assert rollout_engine.slot_levels(slots, **(rollout_engine.ONE_WAVE_LEVELS if fine else {})) == levels
  static = rollout_engine.generate_program(CONFIG, (8, 6), mesh=None, rules=None, num_samples=4, max_new_tokens=72,
                                           num_slots=slots)[2]
  assert static["level_ratio"] == (2 ** 0.5 if fine else 2)  # what generate passes the engine
  out = rollout_engine.generate(params, CONFIG, PROMPTS8, MASK8, jax.random.key(9), num_slots=slots, **kwargs)
  _assert_same(out, expected)


def test_one_wave_with_end_tokens(params):
  """As many slots as completions, ended by end tokens of their own samples (not caps): the static sampler's."""
  free = sampling.sample(params, CONFIG, PROMPTS8, MASK8, jax.random.key(1), num_samples=4, max_new_tokens=24,
                         temperature=1.0, eos_token_ids=())
  drawn, counts = np.unique(np.asarray(free.tokens[:, :6]), return_counts=True)
  stops = tuple(int(t) for t in drawn[np.argsort(-counts)][:8])  # the policy's eight commonest early tokens
  kwargs = dict(num_samples=4, max_new_tokens=24, temperature=1.0, eos_token_ids=(), stop_token_ids=stops, pad_id=99)
  expected = sampling.sample(params, CONFIG, PROMPTS8, MASK8, jax.random.key(1), **kwargs)
  lengths = np.asarray(expected.lengths)
  assert 0 < (lengths > 6).sum() <= 8  # most end early: the live ones narrow to 16 then 8 slots
  _assert_same(rollout_engine.generate(params, CONFIG, PROMPTS8, MASK8, jax.random.key(1), num_slots=32, **kwargs),
               expected)


@pytest.mark.parametrize("impl", ["typed", "raw", "rbg"])
def test_fold_in_rows_is_jax_fold_in(impl):
  """The engine's per-slot step keys (threefry unrolled, no rolled loop in a decode step) are JAX's fold_in, bit for
  bit: a typed threefry key, a raw one, and an rbg key (JAX's own fold_in, vmapped)."""
  key = {"typed": jax.random.key(7), "raw": jax.random.PRNGKey(7), "rbg": jax.random.key(7, impl="rbg")}[impl]
  data = jnp.array([0, 1, 2, 191, 5000, 2 ** 31 - 1], jnp.int32)
  expected = jax.vmap(jax.random.fold_in, (None, 0))(key, data)
  got = jax.jit(rollout_engine.fold_in_rows)(key, data)
  unwrap = lambda k: jax.random.key_data(k) if jnp.issubdtype(k.dtype, jax.dtypes.prng_key) else k
  np.testing.assert_array_equal(unwrap(got), unwrap(expected))
  assert jnp.issubdtype(got.dtype, jax.dtypes.prng_key) == (impl == "rbg")  # threefry: raw keys [S, 2]
