r"""PPO on gymnax CartPole-v1 with grpo_jax's loss functions: the losses are plain JAX, usable anywhere.

  python -m experiments.ppo_cartpole                               # 500k env steps on CPU
  python -m experiments.ppo_cartpole --total_steps=100000 --output_dir=/tmp/ppo

Training is one `jax.jit`: a `lax.scan` over updates, each collecting `rollout_len` steps of `num_envs`
CartPoles (gymnax, stepped and auto-reset inside jit, `vmap`ped over environments), then `epochs` passes
of `minibatches` Adam steps on a small actor-critic MLP (Flax NNX). The losses are grpo_jax's, written
for token sequences and reused as they are; a transition is a one-token sequence:

  PPO clipped surrogate (Schulman et al. 2017, arXiv 1707.06347)      `losses.clipped_surrogate`
    ρ_t = π_θ(a_t|s_t) / π_old(a_t|s_t),   ℓ_t = −min(ρ_t Â_t, clip(ρ_t, 1−ε, 1+ε) Â_t),
    Â_t the minibatch-whitened advantage (`losses.whiten`);
  GAE (Schulman et al. 2016, arXiv 1506.02438)                        `losses.gae`
    δ_t = r_t + γ V(s_{t+1}) − V(s_t),   A_t = δ_t + γλ A_{t+1},   R_t = A_t + V(s_t);
  clipped value loss  ½ max((V−R)², (V_old + clip(V−V_old, −ε, ε) − R)²)   `losses.value_loss`;
  loss = mean ℓ + c_v · mean value loss − c_e · mean entropy, means by `losses.aggregate`.

`losses.gae` ends a row after its last masked-in step (value 0 beyond). A rollout row holds several
episodes, so each episode gets its own row, masked to its steps. Termination (the pole falls) ends an
episode with no future; a cut that is not a termination (the 500-step time limit, the rollout's end)
bootstraps through the reward of its last step, r_t + γ V(s_{t+1}), with s_{t+1} the observation before
any auto-reset. Episode returns are summed per environment and recorded when an episode ends.

Writes `metrics.jsonl` (env steps, mean return of the episodes that ended in each `log_every` window,
loss statistics), `learning_curve.png` and `summary.json` to `--output_dir`.
"""

import functools
import json
import pathlib
import sys
import time
from typing import NamedTuple

from absl import app
from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax import losses
from grpo_jax import python_gc
from grpo_jax import training


class Config(NamedTuple):
  """Hyperparameters of a run (the flags' defaults)."""
  total_steps: int = 500_000
  num_envs: int = 8
  rollout_len: int = 64
  learning_rate: float = 2.5e-3
  anneal_lr: bool = True
  epochs: int = 4
  minibatches: int = 4
  gamma: float = 0.99
  gae_lambda: float = 0.95
  clip_eps: float = 0.2
  value_coef: float = 0.5
  entropy_coef: float = 0.01
  max_grad_norm: float = 0.5
  hidden: int = 64
  seed: int = 0

  @property
  def steps_per_update(self) -> int:
    return self.num_envs * self.rollout_len

  @property
  def num_updates(self) -> int:
    return self.total_steps // self.steps_per_update


FLAGS = flags.FLAGS


def define_flags():
  """Defines the flags (defaults from `Config`) and their validators.

  Called only when run as a script, so tests can import this module beside other runners' flags.
  """
  d = Config._field_defaults
  flags.DEFINE_integer("total_steps", d["total_steps"], "Environment steps (all environments together), "
                       "rounded down to whole updates.")
  flags.DEFINE_integer("num_envs", d["num_envs"], "Environments stepped in parallel (vmap).")
  flags.DEFINE_integer("rollout_len", d["rollout_len"], "Steps per environment per update.")
  flags.DEFINE_float("learning_rate", d["learning_rate"], "Adam learning rate (the start, with --anneal_lr).")
  flags.DEFINE_bool("anneal_lr", d["anneal_lr"], "Decay the learning rate linearly to 0.")
  flags.DEFINE_integer("epochs", d["epochs"], "Passes over each rollout.")
  flags.DEFINE_integer("minibatches", d["minibatches"], "Minibatches (Adam steps) per pass.")
  flags.DEFINE_float("gamma", d["gamma"], "Discount γ.")
  flags.DEFINE_float("gae_lambda", d["gae_lambda"], "GAE λ.")
  flags.DEFINE_float("clip_eps", d["clip_eps"], "Clip range ε of the ratio and of the value.")
  flags.DEFINE_float("value_coef", d["value_coef"], "Value-loss coefficient c_v.")
  flags.DEFINE_float("entropy_coef", d["entropy_coef"], "Entropy-bonus coefficient c_e.")
  flags.DEFINE_float("max_grad_norm", d["max_grad_norm"], "Global-norm gradient clipping (0: off).")
  flags.DEFINE_integer("hidden", d["hidden"], "Width of the two hidden layers of actor and critic.")
  flags.DEFINE_integer("seed", d["seed"], "Random seed of initialisation, environments and minibatches.")
  flags.DEFINE_string("output_dir", "runs/ppo_cartpole", "Where metrics.jsonl, learning_curve.png and "
                      "summary.json go.")
  flags.DEFINE_integer("log_every", 10_000, "Env steps per metrics row (whole updates).")
  flags.DEFINE_float("target_return", 475.0, "The mean return whose crossing the summary reports.")

  for name in ("total_steps", "num_envs", "rollout_len", "epochs", "minibatches", "hidden", "log_every"):
    flags.register_validator(name, lambda v: v >= 1, message=f"--{name} must be >= 1")
  for name in ("learning_rate", "clip_eps"):
    flags.register_validator(name, lambda v: v > 0, message=f"--{name} must be > 0")
  for name in ("gamma", "gae_lambda"):
    flags.register_validator(name, lambda v: 0 <= v <= 1, message=f"--{name} must be in [0, 1]")
  for name in ("value_coef", "entropy_coef", "max_grad_norm"):
    flags.register_validator(name, lambda v: v >= 0, message=f"--{name} must be >= 0")
  flags.register_multi_flags_validator(
      ["total_steps", "num_envs", "rollout_len"], lambda f: f["total_steps"] >= f["num_envs"] * f["rollout_len"],
      message="--total_steps must be >= --num_envs * --rollout_len (one update)")
  flags.register_multi_flags_validator(
      ["num_envs", "rollout_len", "minibatches"], lambda f: (f["num_envs"] * f["rollout_len"]) % f["minibatches"] == 0,
      message="--minibatches must divide --num_envs * --rollout_len")


class ActorCritic(nnx.Module):
  """Separate tanh MLPs for the policy logits and the value, orthogonal initialisation."""

  def __init__(self, obs_dim: int, num_actions: int, hidden: int, *, rngs: nnx.Rngs):
    def dense(d_in, d_out, scale):
      return nnx.Linear(d_in, d_out, kernel_init=nnx.initializers.orthogonal(scale), rngs=rngs)
    def mlp(d_out, scale):
      return nnx.Sequential(dense(obs_dim, hidden, np.sqrt(2)), nnx.tanh, dense(hidden, hidden, np.sqrt(2)),
                            nnx.tanh, dense(hidden, d_out, scale))
    self.actor = mlp(num_actions, 0.01)
    self.critic = mlp(1, 1.0)

  def __call__(self, obs):
    return self.actor(obs), self.critic(obs)[..., 0]


class Transition(NamedTuple):
  """One rollout step of every environment; leaves are `[N, ...]`, stacked to `[T, N, ...]`."""
  obs: jax.Array
  action: jax.Array
  logp: jax.Array
  value: jax.Array
  reward: jax.Array
  terminated: jax.Array
  truncated: jax.Array
  next_obs: jax.Array  # s_{t+1} before any auto-reset


class Batch(NamedTuple):
  """The training inputs of one transition."""
  obs: jax.Array
  action: jax.Array
  logp: jax.Array
  value: jax.Array
  advantage: jax.Array
  ret: jax.Array


def episode_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
  """GAE over `[N, T]` rollouts holding several episodes per row, through `losses.gae`.

  Every episode becomes its own row of `losses.gae` (`[N·T, T]`, masked to the episode's steps, so
  no advantage leaks across an auto-reset). Cuts that are not terminations, the time limit and the
  rollout's last step, bootstrap with γ V(s_{t+1}) added to their reward. Costs N·T², small for PPO's
  short rollouts. Returns `(A, R)`, `[N, T]`.
  """
  num_steps = rewards.shape[1]
  cut = terminated | truncated | (jnp.arange(num_steps) == num_steps - 1)
  rewards = rewards + gamma * next_values * (cut & ~terminated)
  episode = jnp.cumsum(cut, axis=1) - cut  # index of each step's episode within its row, < T
  mask = episode[:, None, :] == jnp.arange(num_steps)[None, :, None]  # [N, episode, T]
  rows = lambda x: jnp.broadcast_to(x[:, None, :], mask.shape).reshape(-1, num_steps)
  adv, ret = losses.gae(rows(rewards), rows(values), mask.reshape(-1, num_steps), gamma=gamma, lam=lam)
  return adv.reshape(mask.shape).sum(1), ret.reshape(mask.shape).sum(1)


def make_train(config: Config):
  """Returns `train(key) -> (params, per-update metrics)`, the whole run as one jitted function.

  purejaxrl's layout: `train` is a `lax.scan` over updates, each `collect`, then `rollout_batch`, then
  `config.epochs` of `update_epoch` on the loss `ppo_loss`; the environment, the network and the optimiser are
  built here, once, and handed to those.
  """
  # Imported here, not at the top: gymnax's import is slow, and a bad flag should not wait for it.
  import gymnax  # pylint: disable=import-outside-toplevel
  env, env_params = gymnax.make("CartPole-v1")
  obs_dim = env.observation_space(env_params).shape[0]
  model = lambda rngs: ActorCritic(obs_dim, env.num_actions, config.hidden, rngs=rngs)
  graphdef = nnx.graphdef(nnx.eval_shape(lambda: model(nnx.Rngs(0))))
  apply = lambda params, obs: nnx.merge(graphdef, params)(obs)
  num_sgd_steps = config.num_updates * config.epochs * config.minibatches
  lr = optax.linear_schedule(config.learning_rate, 0.0, num_sgd_steps) if config.anneal_lr else config.learning_rate
  clip = optax.clip_by_global_norm(config.max_grad_norm) if config.max_grad_norm else optax.identity()
  optimizer = optax.chain(clip, optax.adam(lr, eps=1e-5))
  env_reset = jax.vmap(env.reset, in_axes=(0, None))
  loss = functools.partial(ppo_loss, apply=apply, config=config)

  def update(runner, _):
    params, opt_state, env_state, obs, episode_return, key = runner
    (env_state, obs, episode_return, key), traj, finished = collect(
        params, (env_state, obs, episode_return, key), apply, env, env_params, config)
    batch = rollout_batch(params, traj, apply, config)
    (params, opt_state, key), metrics = jax.lax.scan(
        lambda carry, _: update_epoch(carry, batch, loss, optimizer, config.minibatches), (params, opt_state, key),
        length=config.epochs)
    metrics = jax.tree.map(jnp.mean, metrics)
    metrics["return_sum"], metrics["episodes"] = jax.tree.map(jnp.sum, finished)
    return (params, opt_state, env_state, obs, episode_return, key), metrics

  def train(key):
    key, k_init, k_reset = jax.random.split(key, 3)
    params = nnx.state(model(nnx.Rngs(k_init)))
    obs, env_state = env_reset(jax.random.split(k_reset, config.num_envs), env_params)
    runner = (params, optimizer.init(params), env_state, obs, jnp.zeros(config.num_envs), key)
    runner, metrics = jax.lax.scan(update, runner, length=config.num_updates)
    return runner[0], metrics

  return jax.jit(train)


def collect(params, carry, apply, env, env_params, config: Config):
  """COLLECT: `config.rollout_len` steps of every environment under the policy `params`, auto-resetting.

  `carry` is `(env_state, obs, episode_return, key)`, returned advanced; also returns the `Transition`s,
  `[T, N, ...]`, and per step the summed return and the number of the episodes that ended there.
  """
  env_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

  def step(carry, _):
    env_state, obs, episode_return, key = carry
    key, k_act, k_env = jax.random.split(key, 3)
    logits, value = apply(params, obs)
    action = jax.random.categorical(k_act, logits)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=-1)[:, 0]
    next_obs, env_state, reward, terminated, truncated, info = env_step(
        jax.random.split(k_env, config.num_envs), env_state, action, env_params)
    done = terminated | truncated
    episode_return = episode_return + reward
    finished = (jnp.sum(jnp.where(done, episode_return, 0.0)), jnp.sum(done))
    transition = Transition(obs, action, logp, value, reward, terminated, truncated, info["final_observation"])
    return (env_state, next_obs, jnp.where(done, 0.0, episode_return), key), (transition, finished)

  carry, (traj, finished) = jax.lax.scan(step, carry, length=config.rollout_len)
  return carry, traj, finished


def rollout_batch(params, traj: Transition, apply, config: Config) -> Batch:
  """ADVANTAGE: a rollout `[T, N, ...]` as `N·T` transitions with their `episode_gae` advantages and returns,
  V(s_{t+1}) from the value of `params`."""
  _, next_values = apply(params, traj.next_obs)
  env_major = lambda x: x.T  # [T, N] -> [N, T]
  adv, ret = episode_gae(env_major(traj.reward), env_major(traj.value), env_major(next_values),
                         env_major(traj.terminated), env_major(traj.truncated), config.gamma, config.gae_lambda)
  flat = lambda x: x.reshape(config.steps_per_update, *x.shape[2:])
  return Batch(flat(traj.obs), flat(traj.action), flat(traj.logp), flat(traj.value), flat(adv.T), flat(ret.T))


def update_epoch(carry, batch: Batch, loss, optimizer: optax.GradientTransformation, minibatches: int):
  """UPDATE: one pass over `batch` in `minibatches` shuffled minibatches, an optimiser step on `loss` each.

  `carry` is `(params, opt_state, key)`, returned advanced; also returns `loss`'s statistics per minibatch.
  """
  params, opt_state, key = carry
  key, k_perm = jax.random.split(key)
  perm = jax.random.permutation(k_perm, batch.obs.shape[0])
  batches = jax.tree.map(lambda x: x[perm].reshape(minibatches, -1, *x.shape[1:]), batch)

  def sgd_step(carry, mb):
    params, opt_state = carry
    grads, metrics = jax.grad(loss, has_aux=True)(params, mb)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), metrics

  (params, opt_state), metrics = jax.lax.scan(sgd_step, (params, opt_state), batches)
  return (params, opt_state, key), metrics


def ppo_loss(params, mb: Batch, apply, config: Config):
  """The loss of the module docstring on a minibatch, each transition a one-token sequence, and its statistics
  (policy and value loss, entropy, clip fraction)."""
  logits, values = apply(params, mb.obs)
  logp_all = jax.nn.log_softmax(logits)
  logp = jnp.take_along_axis(logp_all, mb.action[:, None], axis=-1)  # [M, 1]: M one-step sequences
  mask = jnp.ones_like(logp)
  adv = losses.whiten(mb.advantage[:, None], mask)
  policy = losses.aggregate(losses.clipped_surrogate(logp, mb.logp[:, None], adv, mask, config.clip_eps),
                            mask, "token-mean")
  value = losses.aggregate(losses.value_loss(values[:, None], mb.value[:, None], mb.ret[:, None], mask,
                                             clip=config.clip_eps), mask, "token-mean")
  entropy = jnp.mean(-jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1))
  clip_frac = losses.clip_fractions(logp, mb.logp[:, None], adv, mask, config.clip_eps)["clip_frac"]
  total = policy + config.value_coef * value - config.entropy_coef * entropy
  return total, {"policy_loss": policy, "value_loss": value, "entropy": entropy, "clip_frac": clip_frac}


def summarise(metrics, config: Config, log_every: int):
  """Per-window rows: env steps, mean return of the episodes that ended in the window, mean losses."""
  metrics = jax.tree.map(np.asarray, metrics)
  num_rows = max(1, config.num_updates // max(1, log_every // config.steps_per_update))
  rows = []
  for chunk in np.array_split(np.arange(config.num_updates), num_rows):  # whole updates, none left short
    window = slice(int(chunk[0]), int(chunk[-1]) + 1)
    episodes = int(metrics["episodes"][window].sum())
    row = {"env_steps": window.stop * config.steps_per_update,
           "mean_return": float(metrics["return_sum"][window].sum() / episodes) if episodes else None,
           "episodes": episodes}
    for name in ("policy_loss", "value_loss", "entropy", "clip_frac"):
      row[name] = float(metrics[name][window].mean())
    rows.append(row)
  return rows


def steps_to_target(rows, target: float) -> tuple[int | None, int | None]:
  """Env steps at the end of the first window with mean return >= target, and of the first window from
  which every later window stays >= target (None: never)."""
  above = [r["mean_return"] is not None and r["mean_return"] >= target for r in rows]
  first = next((r["env_steps"] for r, a in zip(rows, above) if a), None)
  held = next((rows[i]["env_steps"] for i in range(len(rows)) if all(above[i:])), None)
  return first, held


def plot(rows, path: pathlib.Path, target: float, title: str):
  """Writes the learning curve (Agg backend, no display needed)."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt
  points = [(r["env_steps"], r["mean_return"]) for r in rows if r["mean_return"] is not None]
  fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
  ax.plot(*zip(*points), marker=".", label="mean training-episode return")
  ax.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"{target:g}")
  ax.set(xlabel="environment steps", ylabel="episode return", ylim=(0, 520))
  ax.set_title(title, fontsize=10)
  ax.grid(alpha=0.3)
  ax.legend(loc="lower right")
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


def run(config: Config, output_dir: pathlib.Path, log_every: int = 10_000, target: float = 475.0) -> dict:
  """Trains, writes metrics.jsonl, learning_curve.png and summary.json; returns the summary."""
  output_dir.mkdir(parents=True, exist_ok=True)
  start = time.perf_counter()
  train = make_train(config).lower(jax.random.key(config.seed)).compile()
  compiled = time.perf_counter()
  _, metrics = jax.block_until_ready(train(jax.random.key(config.seed)))
  done = time.perf_counter()
  rows = summarise(metrics, config, log_every)
  with open(output_dir / "metrics.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  first, held = steps_to_target(rows, target)
  summary = {"env_steps": config.num_updates * config.steps_per_update, "final_return": rows[-1]["mean_return"],
             "target_return": target, "steps_to_target": first, "steps_to_target_held": held,
             "compile_s": round(compiled - start, 2), "train_s": round(done - compiled, 2),
             "config": config._asdict()}
  steps = lambda n: f"{n:,}" if n else "never"
  plot(rows, output_dir / "learning_curve.png", target,
       f"PPO with grpo_jax.losses, gymnax CartPole-v1, seed {config.seed}\nmean return ≥ {target:g}: first at "
       f"{steps(first)} steps, held from {steps(held)}; final {rows[-1]['mean_return'] or 0:.0f}")
  training.atomic_write_text(output_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
  return summary


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  python_gc.collect_less()
  config = Config(**{name: FLAGS[name].value for name in Config._fields})
  try:
    summary = run(config, pathlib.Path(FLAGS.output_dir), FLAGS.log_every, FLAGS.target_return)
  except OSError as err:
    sys.exit(f"ppo_cartpole: error: {err}")
  print(json.dumps({k: v for k, v in summary.items() if k != "config"}))


if __name__ == "__main__":
  define_flags()
  app.run(main)
