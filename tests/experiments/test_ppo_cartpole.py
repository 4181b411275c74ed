"""experiments/ppo_cartpole.py: episode-wise GAE through losses.gae, a short run that learns, bad flags."""

import json
import os
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from experiments import ppo_cartpole
from tests.conftest import HANG_GUARD_S

REPO = pathlib.Path(__file__).resolve().parents[2]


def _reference_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
  """The done-aware recursion, one environment and step at a time."""
  adv = np.zeros_like(rewards)
  num_envs, num_steps = rewards.shape
  for n in range(num_envs):
    next_adv = 0.0
    for t in reversed(range(num_steps)):
      if terminated[n, t]:
        next_v, next_adv = 0.0, 0.0
      elif truncated[n, t] or t == num_steps - 1:
        next_v, next_adv = next_values[n, t], 0.0
      else:
        next_v = values[n, t + 1]
      next_adv = rewards[n, t] + gamma * next_v - values[n, t] + gamma * lam * next_adv
      adv[n, t] = next_adv
  return adv, adv + values


def test_episode_gae_by_hand():
  # One row, γ = λ = 0.5, V ≡ 0: the pole falls at t=0, the rollout ends after t=2 with V(s_3) = 4.
  # A_2 = 1 + 0.5·4 = 3, A_1 = 1 + 0.25·3 = 1.75, A_0 = 1 (nothing leaks back across the reset).
  zeros = jnp.zeros((1, 3))
  adv, ret = ppo_cartpole.episode_gae(jnp.ones((1, 3)), zeros, jnp.array([[9.0, 9.0, 4.0]]),
                                      jnp.array([[True, False, False]]), jnp.zeros((1, 3), bool), 0.5, 0.5)
  np.testing.assert_allclose(adv, [[1.0, 1.75, 3.0]])
  np.testing.assert_allclose(ret, [[1.0, 1.75, 3.0]])


def test_episode_gae_matches_done_aware_recursion():
  rng = np.random.default_rng(0)
  shape = (5, 12)
  rewards, values, next_values = (rng.normal(size=shape).astype(np.float32) for _ in range(3))
  terminated = rng.random(shape) < 0.2
  truncated = (rng.random(shape) < 0.15) & ~terminated
  terminated[0, -1] = truncated[1, -1] = True  # cuts on the rollout's last step too
  adv, ret = ppo_cartpole.episode_gae(rewards, values, next_values, terminated, truncated, 0.9, 0.8)
  want_adv, want_ret = _reference_gae(rewards, values, next_values, terminated, truncated, 0.9, 0.8)
  np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)


def test_short_run_learns_and_repeats_exactly(tmp_path):
  config = ppo_cartpole.Config(total_steps=50_000, seed=0)
  summary = ppo_cartpole.run(config, tmp_path / "a")
  rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
  assert [r["env_steps"] for r in rows] == [10240, 20480, 30208, 39936, 49664]
  assert summary["env_steps"] == 49664
  # A uniform random policy averages ~22 on CartPole; 50k steps of PPO reach 400+ here. The bar is 4x random,
  # far below that, so another processor's trajectory (same seed, other rounding) passes it too.
  assert summary["final_return"] == rows[-1]["mean_return"] > 90, rows
  assert rows[-1]["mean_return"] > 2 * rows[0]["mean_return"], rows
  assert all(r["episodes"] > 0 for r in rows)
  assert (tmp_path / "a" / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert json.loads((tmp_path / "a" / "summary.json").read_text())["config"]["seed"] == 0

  ppo_cartpole.run(config, tmp_path / "b")  # same seed, fresh compile: identical metrics
  assert (tmp_path / "b" / "metrics.jsonl").read_text() == (tmp_path / "a" / "metrics.jsonl").read_text()


def _cli(*args, cwd):
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "experiments.ppo_cartpole", *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=HANG_GUARD_S)


@pytest.mark.parametrize("args,message", [
    (["--num_envs=0"], "--num_envs must be >= 1"),
    (["--minibatches=3"], "--minibatches must divide --num_envs * --rollout_len"),
])
def test_bad_flag_is_one_clear_line(tmp_path, args, message):
  result = _cli(f"--output_dir={tmp_path / 'run'}", *args, cwd=tmp_path)
  assert result.returncode != 0
  assert message in result.stderr, result.stderr[-2000:]
  assert "Traceback" not in result.stderr


def test_unwritable_output_dir_is_one_clear_line(tmp_path):
  (tmp_path / "file").write_text("")
  result = _cli(f"--output_dir={tmp_path / 'file'}", cwd=tmp_path)
  assert result.returncode != 0
  assert "ppo_cartpole: error:" in result.stderr and "file" in result.stderr, result.stderr[-2000:]
  assert "Traceback" not in result.stderr
