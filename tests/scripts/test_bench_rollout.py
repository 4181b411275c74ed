"""scripts/bench_rollout.py: its length schedules and its FLOPs by hand (the figures of BENCHMARKS.md rest on them)."""

import argparse
import importlib.util
import pathlib

import jax
import numpy as np
import pytest

from grpo_jax import partitioning, sampling
from grpo_jax.models import tiny, transformer

_spec = importlib.util.spec_from_file_location("bench_rollout", pathlib.Path(__file__).parents[2] / "scripts" /
                                               "bench_rollout.py")
bench_rollout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_rollout)


def test_tail_schedule_has_its_median_and_its_share_at_the_cap():
  lengths = bench_rollout.schedule("tail", 20_000, 1024, 200, 0.05, seed=3)
  assert lengths.dtype == np.int32 and lengths.min() >= 1 and lengths.max() == 1024
  assert np.median(lengths) == pytest.approx(200, rel=0.03)
  assert np.mean(lengths == 1024) == pytest.approx(0.05, abs=0.005)  # P(draw >= cap) = at_cap, clipped to the cap
  np.testing.assert_array_equal(bench_rollout.schedule("equal", 5, 64, 10, 0.05), 64)
  np.testing.assert_array_equal(bench_rollout.schedule("tail", 50, 64, 10, 0.05, seed=1),
                                bench_rollout.schedule("tail", 50, 64, 10, 0.05, seed=1))  # the same for every engine


def test_useful_flops_by_hand():
  """One layer, hidden 8, 2 heads of 4 (1 kv head), mlp 16, vocabulary 10; a 3-token prompt; completions of 1 and 2
  tokens. Per token: q 2·8·8, k and v 2·8·4 each, o 2·8·8, mlp 6·8·16, unembedding 2·8·10 = 1,312; attention
  4·(2·4) = 32 per key, over P + t keys: 3 for the 1-token completion, 3 + 4 for the 2-token one."""
  config = tiny.tiny_config(num_hidden_layers=1, hidden_size=8, num_attention_heads=2, num_key_value_heads=1,
                            intermediate_size=16, vocab_size=10)
  per_token = 2 * 8 * (8 + 2 * 4) + 2 * 8 * 8 + 6 * 8 * 16 + 2 * 8 * 10
  assert per_token == 1312
  assert bench_rollout.useful_flops(config, 3, np.array([1, 2], np.int32)) == 3 * per_token + 32 * (3 + 3 + 4)


def test_useful_flops_at_half_a_billion_parameters_do_not_overflow():
  """Qwen2.5-0.5B's shapes: about a GFLOP a token, so int32 lengths times it must not wrap (it read 0.1% of the
  roofline for a rate near 20%)."""
  config = tiny.tiny_config(**bench_rollout.SHAPES["0.5b"])
  flops = bench_rollout.useful_flops(config, 12, np.full(32, 22, np.int32))
  assert 0.9e9 < flops / (32 * 22) < 1.1e9


@pytest.mark.devices(2)
def test_params_placed_once_on_the_mesh_are_what_the_samplers_take():
  """`placed` puts the params on the samplers' shardings, so a sampler's own `partitioning.put` returns them as they
  are (no copy onto the mesh inside a timed call)."""
  config = tiny.tiny_config(vocab_size=64)
  params = transformer.init_params(config, jax.random.key(0))
  args = argparse.Namespace(samples=2, max_new_tokens=8)
  mesh = partitioning.make_mesh("data:2")
  held = bench_rollout.placed(params, config, (4, 6), args, mesh)
  shardings = sampling.placements(mesh, partitioning.get_rules("dp"), config, (4, 6), 2, 8)[0]
  again = partitioning.put(held, shardings)
  for before, after, sharding in zip(jax.tree.leaves(held), jax.tree.leaves(again), jax.tree.leaves(shardings)):
    assert after is before and before.sharding.is_equivalent_to(sharding, before.ndim)
    assert len(before.sharding.device_set) == 2
  assert bench_rollout.placed(params, config, (4, 6), args, None) is params
