r"""Flow-GRPO: a multi-turn planner with tools and memory, trained on a broadcast outcome reward.

  python -m experiments.flow_grpo                        # embedded default: tiny model, synthetic task, CPU
  python -m experiments.flow_grpo --flagfile=experiments/configs/flow_grpo.cfg

AgentFlow (arXiv 2510.05592): at turn t the planner π_θ sees the query q and its memory M^t and writes
an action a^t, a sub-goal plus a tool call ("mul 4: calc 8*4") or the final answer ("answer: 32"); the
executor runs the tool, the verifier stops on an answer or at T_max (--max_turns), the memory records
the call and its result, and the generator writes the final answer from M^T. All G trajectories of
all B queries advance together through the KV-cache sampler, finished ones leaving the batch.

Stage 1 (embedded default) fine-tunes the planner on teacher trajectories made from the ground truth
(each solution step a calculator call, then the answer). Stage 2 is Flow-GRPO (eq. 5): the outcome
reward of a trajectory is broadcast to every turn's action, normalised over the G trajectories of the
query (eq. 7), and the clipped surrogate with a k3 KL to the frozen SFT planner is averaged over
action tokens, turns and trajectories; only action tokens are trained. Held-out evaluation runs the
same agent loop greedily: accuracy, mean number of turns, tool-error rate. Every grpo_math flag is
accepted (shared data, model, optimiser and logging flags); the agent's own flags are below.
"""

import json
import pathlib
import resource
import sys
import time

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from experiments import grpo_math
from experiments.methods import resume as resume_lib
from grpo_jax import agents
from grpo_jax import data
from grpo_jax import logprobs as logprobs_lib
from grpo_jax import models
from grpo_jax import rewards as rewards_lib
from grpo_jax import training
from grpo_jax.losses import flow_grpo
from grpo_jax.training import checkpointing
from grpo_jax.training import update as update_lib

# THE AGENT
flags.DEFINE_integer("max_turns", 4, "T_max: most planner turns per trajectory (training and evaluation).")
flags.DEFINE_integer("memory_budget", 56, "Tokens of memory text in the planner's prompt; the oldest turns are "
                     "dropped (and summarised in one line) beyond it.")
flags.DEFINE_integer("planner_prompt_len", 72, "Planner prompt budget in tokens (query + memory + cue).")
flags.DEFINE_integer("action_tokens", 20, "Token budget of one action.")
flags.DEFINE_string("tools", "calc,frac,recall", "The toolset K, from calc, frac, recall.")
flags.DEFINE_float("tool_time_limit", 1.0, "Seconds a tool call may take before it is an error observation.")
flags.DEFINE_bool("tool_header", False, "Describe the tools and the action format at the top of every prompt "
                  "(for instruction-tuned models; the tiny default learns the format from SFT).")
flags.DEFINE_bool("answer_from_memory", True, "Without a final-answer action, the generator answers with the "
                  "last tool result in memory.")
flags.DEFINE_integer("min_bucket", 8, "Smallest padded active-set size of a turn (row counts are padded up to "
                     "powers of two, so jit compiles a few shapes, not one per turn).")


def _validators():
  for name in ("max_turns", "planner_prompt_len", "action_tokens", "min_bucket"):
    flags.register_validator(name, lambda v: v >= 1, message=f"--{name} must be >= 1")
  flags.register_validator("memory_budget", lambda v: v >= 0, message="--memory_budget must be >= 0")
  flags.register_validator("tool_time_limit", lambda v: v > 0, message="--tool_time_limit must be > 0")


_validators()
FLAGS = flags.FLAGS

# Defaults of `python -m experiments.flow_grpo` that differ from grpo_math's; set only when run as a program,
# so importing this module (tests, other runners) leaves grpo_math's defaults alone.
DEFAULTS = dict(work_dir="runs/flow_grpo", sft_steps=300, sft_batch_size=64, steps=60, batch_size=16,
                group_size=8, learning_rate=5e-5, eval_every=0, save_every=20)
# grpo_math knobs that mean nothing for the per-turn objective of eq. 5: refused unless at their defaults.
UNSUPPORTED = ("algo", "loss_aggregation", "importance", "dynamic_sampling", "overlong_buffer", "mask_truncated",
               "eval_samples", "reward_model", "supervision", "iterations", "steps_per_iteration",
               "advantage_estimator")
SFT_MARKER = "flow_grpo_sft.json"  # in sft_policy: the planner was fine-tuned on the first --sft_examples problems


class Agent:
  """Everything but the planner: toolset, prompt format, executor, verifier, generator, budgets."""

  def __init__(self, tokenizer):
    try:
      self.toolset = agents.math_toolset(FLAGS.tools)
    except ValueError as err:
      raise grpo_math.RunError(f"--tools: {err}") from None
    count = lambda text: len(tokenizer.encode(text, add_special_tokens=False))
    header = f"{self.toolset.describe()}\nactions: '<sub-goal>: <tool> <args>' or 'answer: <value>'\n"
    self.prompt_format = agents.PromptFormat(FLAGS.planner_prompt_len, count, header if FLAGS.tool_header else "")
    self.executor = agents.ToolExecutor(self.toolset, FLAGS.tool_time_limit)
    self.generator = agents.RuleGenerator(use_last_result=FLAGS.answer_from_memory)
    self.tokenizer = tokenizer

  def planner(self, params, config, *, greedy: bool) -> agents.SamplerPlanner:
    return agents.SamplerPlanner(params, config, self.tokenizer, max_prompt_len=FLAGS.planner_prompt_len,
                                 max_action_tokens=FLAGS.action_tokens, temperature=FLAGS.temperature,
                                 top_k=FLAGS.top_k, top_p=FLAGS.top_p, greedy=greedy, min_bucket=FLAGS.min_bucket)

  def episodes(self, planner, examples, group_size: int, key) -> list[agents.Trajectory]:
    return agents.run_episodes(planner, [e.question for e in examples], group_size=group_size,
                               max_turns=FLAGS.max_turns, key=key, prompt_format=self.prompt_format,
                               memory_budget=FLAGS.memory_budget, executor=self.executor, generator=self.generator)


# EVALUATION


def evaluate_agent(params, config, agent: Agent, task: grpo_math.Task, key) -> dict:
  """Greedy agent loop on the held-out set: accuracy, mean turns, tool calls, tool-error rate, answer rate."""
  size = min(FLAGS.eval_batch_size, len(task.test))
  trajectories = []
  for start in range(0, len(task.test), size):
    planner = agent.planner(params, config, greedy=True)
    trajectories += agent.episodes(planner, task.test[start:start + size], 1, jax.random.fold_in(key, start))
  correct = rewards_lib.score([t.output for t in trajectories], task.test, "correctness")
  return {"accuracy": float(correct.mean()), **agents.episode_stats(trajectories)}


# STAGE 1: SFT ON TEACHER TRAJECTORIES


def teacher_turns(agent: Agent, task: grpo_math.Task) -> list[tuple[list[int], list[int]]]:
  """(prompt ids, action ids + end token) of every turn of the teacher trajectories of the SFT pool."""
  examples = [e for e in task.sft_pool if e.solution]
  try:
    scripts = agents.teacher_scripts(examples)
  except ValueError as err:
    raise grpo_math.RunError(f"teacher trajectories need solutions of a<op>b=c steps ({err}); "
                             "pass --sft_steps=0 with an instruction-tuned --model") from None
  trajectories = agents.run_episodes(agents.ScriptedPlanner(scripts), [e.question for e in examples], group_size=1,
                                     max_turns=FLAGS.max_turns, key=jax.random.PRNGKey(0),
                                     prompt_format=agent.prompt_format, memory_budget=FLAGS.memory_budget,
                                     executor=agent.executor, generator=agent.generator)
  correct = rewards_lib.score([t.output for t in trajectories], examples, "correctness")
  tok = agent.tokenizer
  turns = [(tok.encode(turn.prompt, add_special_tokens=False), tok.encode(turn.action.text, add_special_tokens=False)
            + [tok.eos_token_id]) for t, ok in zip(trajectories, correct) if ok for turn in t.turns]
  if not turns:
    raise grpo_math.RunError(f"no teacher trajectory reaches its answer within --max_turns={FLAGS.max_turns}")
  return turns


def warm_start(params, config, agent: Agent, task: grpo_math.Task, logger) -> object:
  """Teacher-forced NLL of the teacher's actions given the prompts the agent loop builds (GC = 1)."""
  turns = teacher_turns(agent, task)
  print(f"  {len(turns)} teacher turns from {len(task.sft_pool)} problems", file=sys.stderr)
  optimizer = training.make_optimizer(FLAGS.sft_learning_rate, warmup_steps=min(50, FLAGS.sft_steps // 10),
                                      total_steps=FLAGS.sft_steps, schedule="cosine", max_grad_norm=1.0)
  state = training.init_train_state(params, optimizer)
  objective = update_lib.bind(training.sft_objective, config=config, chunk_size=FLAGS.logprob_chunk)
  train_step = training.make_train_step(objective, optimizer, FLAGS.grad_accum_steps)
  rng = np.random.default_rng([FLAGS.seed, 54321])
  pad = agent.tokenizer.pad_token_id or 0
  logger.start(FLAGS.sft_steps)
  for step in range(1, FLAGS.sft_steps + 1):
    chunk = [turns[i] for i in rng.integers(0, len(turns), FLAGS.sft_batch_size)]
    batch = training.supervised_batch([p for p, _ in chunk], [a for _, a in chunk], FLAGS.planner_prompt_len,
                                      FLAGS.action_tokens, pad)
    state, metrics = train_step(state, batch)
    if step % 25 == 0 or step == FLAGS.sft_steps:
      values = logger.log(step, metrics, prefix="sft/")
      grpo_math._check_finite(values, f"SFT step {step}")
      logger.progress(step, f"sft loss {values['sft/loss']:.4f}")
  logger.newline()
  return state.params


# STAGE 2: FLOW-GRPO


def _row_bucket(n: int, unit: int) -> int:
  """Rows padded up to a multiple of `unit`, so the update compiles for a few shapes only."""
  return max(unit, -(-n // unit) * unit)


def _take_rows(batch: agents.TurnBatch, rows: np.ndarray, size: int) -> agents.TurnBatch:
  """The given rows of a batch, padded with empty rows (no tokens, nothing trained) up to `size`."""
  pad = size - len(rows)

  def take(name, x):
    x = np.asarray(x)[rows]
    filler = np.full((pad, *x.shape[1:]), 1 if name == "num_turns" else 0, x.dtype)
    return np.concatenate([x, filler]) if pad else x

  return agents.TurnBatch(*[take(name, x) for name, x in zip(agents.TurnBatch._fields, batch)])


class FlowCollector:
  """Runs B·G trajectories with the current policy, scores them and builds the per-turn batch."""

  def __init__(self, config, agent: Agent, task: grpo_math.Task, logprob_fn, reference):
    self.config, self.agent, self.task = config, agent, task
    self.logprob_fn, self.reference = logprob_fn, reference
    self.prompts_truncated = 0

  def collect(self, params, position: int, key):
    b, g = FLAGS.batch_size, FLAGS.group_size
    t0 = time.time()
    examples = [self.task.train_example(position + i) for i in range(b)]
    planner = self.agent.planner(params, self.config, greedy=False)
    trajectories = self.agent.episodes(planner, examples, g, key)
    self.prompts_truncated += planner.prompts_truncated
    t1 = time.time()
    repeated = [e for e in examples for _ in range(g)]
    outputs = [t.output for t in trajectories]
    rewards = rewards_lib.score(outputs, repeated, self.task.reward_fn).reshape(b, g)
    correct = rewards_lib.score(outputs, repeated, "correctness")
    n_turns = sum(t.num_turns for t in trajectories)
    unit = max(b * g // 2, 1) * FLAGS.grad_accum_steps
    host = agents.turn_rows(trajectories, FLAGS.planner_prompt_len, FLAGS.action_tokens,
                            self.agent.tokenizer.pad_token_id or 0, rows=_row_bucket(n_turns, unit))
    advantages = flow_grpo.broadcast_outcome_advantages(rewards, host.trajectory_ids, scale=FLAGS.advantage_scale,
                                                        eps=FLAGS.advantage_eps)
    real = np.arange(len(host.advantages)) < n_turns
    old_logp = self.logprob_fn(params, host.tokens, host.attention_mask)
    ref_logp = (self.logprob_fn(self.reference, host.tokens, host.attention_mask) if FLAGS.beta > 0
                else jnp.zeros_like(old_logp))
    batch = host._replace(old_logp=np.asarray(old_logp), ref_logp=np.asarray(ref_logp),
                          advantages=np.where(real, np.asarray(advantages), 0.0).astype(np.float32))
    stats = {
        "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()), "accuracy": float(correct.mean()),
        "zero_variance_groups": float(np.mean(np.ptp(rewards, axis=1) == 0)),
        **agents.episode_stats(trajectories),
        "turn_rows": float(n_turns), "padded_rows": float(len(host.advantages) - n_turns),
        "sampled_rows": float(planner.rows_sampled), "prompts_truncated": float(self.prompts_truncated),
        "action_length": float(np.mean([len(turn.output.action_ids) for t in trajectories for turn in t.turns])),
        "time_sampling": t1 - t0, "time_scoring": time.time() - t1,
    }
    return batch, stats, n_turns


def run_flow_grpo(policy, reference, config, agent: Agent, task: grpo_math.Task, logger, ckpt, sft_accuracy):
  """Stage 2. Returns (final policy params, the start policy's accuracy, whether --stop_after stopped it)."""
  b, g = FLAGS.batch_size, FLAGS.group_size
  minibatch = FLAGS.minibatch_size or b * g  # in trajectories: a trajectory's turns stay together
  if (b * g) % minibatch:
    raise grpo_math.RunError(f"--minibatch_size={minibatch} must divide batch_size*group_size={b * g}")
  updates_per_step = FLAGS.num_epochs * (b * g // minibatch)
  total_updates = FLAGS.steps * updates_per_step
  warmup = min(FLAGS.warmup_steps, total_updates // 2)
  optimizer = training.make_optimizer(
      FLAGS.learning_rate, warmup_steps=warmup, total_steps=total_updates,
      schedule=FLAGS.lr_schedule if total_updates > warmup + 1 else "constant",
      weight_decay=FLAGS.weight_decay, max_grad_norm=FLAGS.max_grad_norm or None)
  state = training.init_train_state(policy, optimizer)
  key = jax.random.PRNGKey(FLAGS.seed)
  position, start = 0, 0
  if FLAGS.resume and ckpt.latest_step() is not None:
    state, meta = ckpt.restore_intact(
        state, check=lambda meta, step: resume_lib.check_flags(meta.get("flags"), step, grpo_math._note))
    dropped = logger.rewind(meta.get("metrics_offset"))  # records of steps after the checkpoint: re-run below
    start, position = int(meta["step"]), int(meta["data_position"])
    key = jnp.asarray(meta["key"], jnp.uint32)
    sft_accuracy = meta.get("sft_accuracy", sft_accuracy)
    print(f"resumed from step {start} in {ckpt.directory}" + (
        f" ({dropped} metrics.jsonl records of later steps dropped)" if dropped else ""), file=sys.stderr)
  loss_kwargs = dict(epsilon=FLAGS.epsilon, epsilon_high=FLAGS.epsilon_high, beta=FLAGS.beta, kl=FLAGS.kl or "k3",
                     dual_clip=FLAGS.dual_clip)
  temperature = FLAGS.temperature  # π ∝ exp(logits / T), the distribution the actions were sampled from
  objective = update_lib.bind(agents.flow_grpo_objective, config=config, loss_kwargs=loss_kwargs,
                              use_reference=FLAGS.beta > 0, chunk_size=FLAGS.logprob_chunk, temperature=temperature)
  train_step = training.make_train_step(objective, optimizer, FLAGS.grad_accum_steps)
  logprob_fn = jax.jit(lambda params, tokens, mask: logprobs_lib.token_logprobs(
      params, config, tokens, mask, chunk_size=FLAGS.logprob_chunk, temperature=temperature))
  collector = FlowCollector(config, agent, task, logprob_fn, reference)
  logger.start(FLAGS.steps)

  for step in range(start + 1, FLAGS.steps + 1):
    step_key = jax.random.fold_in(key, step)
    # COLLECT: B queries x G trajectories, turn by turn, with π_old = the current policy
    batch, stats, n_turns = collector.collect(state.params, position, step_key)
    position += b
    # UPDATE: μ epochs over minibatches of whole trajectories
    t0 = time.time()
    step_metrics = []
    real_rows = np.arange(n_turns)
    for epoch in range(FLAGS.num_epochs):
      order = np.asarray(jax.random.permutation(jax.random.fold_in(step_key, 10_000 + epoch), b * g))
      for i in range(0, b * g, minibatch):
        if minibatch == b * g:
          part = batch
        else:
          chosen = np.isin(batch.trajectory_ids[real_rows], order[i:i + minibatch])
          rows = real_rows[chosen]
          part = _take_rows(batch, rows, _row_bucket(len(rows), max(minibatch // 2, 1) * FLAGS.grad_accum_steps))
          part = part._replace(num_trajectories=np.full_like(part.num_trajectories, minibatch))
        state, metrics = train_step(state, jax.tree.map(jnp.asarray, part))
        step_metrics.append(metrics)
    metrics = {k: grpo_math._combine(k, [float(m[k]) for m in step_metrics]) for k in step_metrics[0]}
    grpo_math._check_finite(metrics, f"Flow-GRPO step {step}")
    stats.update(metrics, time_update=time.time() - t0, optimizer_steps=float(updates_per_step))
    values = logger.log(step, stats, prefix="train/")
    logger.progress(step, f"reward {values['train/reward_mean']:.3f} turns {values['train/mean_turns']:.2f} "
                    f"tool err {values['train/tool_error_rate']:.3f} kl {values['train/kl']:.4f}")
    # EVALUATE AND SAVE
    if FLAGS.eval_every and step % FLAGS.eval_every == 0 and step != FLAGS.steps:
      logger.newline()
      values = logger.log(step, evaluate_agent(state.params, config, agent, task, jax.random.PRNGKey(FLAGS.seed + 1)),
                          prefix="eval/")
      print(f"step {step}: held-out accuracy {values['eval/accuracy']:.3f}", file=sys.stderr)
    if (FLAGS.save_every and step % FLAGS.save_every == 0) or step == FLAGS.steps or step == FLAGS.stop_after:
      ckpt.save(step, state, {"step": step, "data_position": position, "key": np.asarray(key).tolist(),
                              "sft_accuracy": sft_accuracy, "flags": resume_lib.run_flags(),
                              "metrics_offset": logger.offset()})
    if step == FLAGS.stop_after:
      logger.newline()
      print(f"stopping after step {step} (--stop_after); continue with --resume", file=sys.stderr)
      return state.params, sft_accuracy, True
  logger.newline()
  return state.params, sft_accuracy, False


# MAIN


def _check_flags():
  for name in UNSUPPORTED:
    if name in FLAGS and FLAGS[name].value != FLAGS[name].default:
      raise grpo_math.RunError(f"--{name} is a grpo_math option that Flow-GRPO does not use; leave it at its default")
  if FLAGS.reward in ("orm", "prm", "exact_steps"):
    raise grpo_math.RunError("--reward: Flow-GRPO scores the generator's answer with rule rewards, not a reward model")
  if FLAGS.group_size is None:
    FLAGS.group_size = 8
  if FLAGS.group_size < 2:
    raise grpo_math.RunError("--group_size must be >= 2 (eq. 7 normalises over the G trajectories of a query)")


def _sft_lineage(source: pathlib.Path) -> bool:
  """Whether the start policy is this runner's SFT planner (then RL draws problems SFT did not see)."""
  return grpo_math._sft_lineage(source, SFT_MARKER)


def run() -> dict:
  _check_flags()
  work_dir = pathlib.Path(FLAGS.work_dir)
  ckpt_dir = work_dir / "checkpoints"
  if not FLAGS.resume and ckpt_dir.is_dir() and any(ckpt_dir.iterdir()):
    raise grpo_math.RunError(f"{ckpt_dir} already holds checkpoints; pass --resume to continue, or choose another "
                             "--work_dir")
  if FLAGS.resume and not (ckpt_dir.is_dir() and any(ckpt_dir.iterdir())):
    raise grpo_math.RunError(f"--resume: no checkpoint in {ckpt_dir}")
  if FLAGS.resume:  # refuse other flags before anything (flags.txt included) is written
    resume_lib.check_before_writing(ckpt_dir, grpo_math._note)
  t_start = time.time()
  work_dir.mkdir(parents=True, exist_ok=True)
  (work_dir / "flags.txt").write_text(FLAGS.flags_into_string())
  params, config, tokenizer, needs_sft, source = grpo_math._load_policy(work_dir, marker_name=SFT_MARKER)
  task = grpo_math.Task(tokenizer, sft_lineage=needs_sft or _sft_lineage(source))
  agent = Agent(tokenizer)
  logger = training.MetricsLogger(work_dir, FLAGS.steps, tensorboard=FLAGS.tensorboard)
  eval_key = jax.random.PRNGKey(FLAGS.seed + 1)
  print(f"planner from {source} ({config.model_type}, {sum(x.size for x in jax.tree.leaves(params)):,} params); "
        f"tools {', '.join(agent.toolset.names())}; T_max {FLAGS.max_turns}; task {FLAGS.task}: "
        f"{len(task.train)} train / {len(task.test)} held-out problems", file=sys.stderr)

  t_sft = time.time()
  if needs_sft and FLAGS.sft_steps:
    print(f"stage 1: SFT on teacher trajectories, {FLAGS.sft_steps} steps", file=sys.stderr)
    params = warm_start(params, config, agent, task, logger)
    grpo_math.export(params, config, source, work_dir / "sft_policy",
                     {SFT_MARKER: grpo_math.sft_marker(FLAGS.task, FLAGS.sft_examples, FLAGS.seed)})
  start_eval = {}
  if not FLAGS.resume:
    start_eval = logger.log(0, evaluate_agent(params, config, agent, task, eval_key), prefix="eval/")
    print(f"start planner: held-out accuracy {start_eval['eval/accuracy']:.3f}, "
          f"{start_eval['eval/mean_turns']:.2f} turns, tool errors {start_eval['eval/tool_error_rate']:.3f}",
          file=sys.stderr)
  start_accuracy = start_eval.get("eval/accuracy")  # on --resume it comes from the checkpoint

  t_rl = time.time()
  print(f"stage 2: Flow-GRPO, {FLAGS.steps} steps of {FLAGS.batch_size} queries x {FLAGS.group_size} trajectories",
        file=sys.stderr)
  reference = jax.tree.map(jnp.copy, params)  # frozen π_ref: the start planner
  ckpt = training.Checkpointer(ckpt_dir, max_to_keep=FLAGS.keep_checkpoints)
  try:
    policy, start_accuracy, stopped = run_flow_grpo(params, reference, config, agent, task, logger, ckpt,
                                                    start_accuracy)
  finally:
    ckpt.close()
  if stopped:
    return {}
  t_final = time.time()
  final_eval = evaluate_agent(policy, config, agent, task, eval_key)
  logger.log(FLAGS.steps, final_eval, prefix="eval/")
  grpo_math.export(policy, config, source, work_dir / "final_policy")
  logger.close()
  peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
  summary = {"start_accuracy": start_accuracy, "final_accuracy": final_eval["accuracy"],
             "num_eval_problems": len(task.test), "wall_time_s": time.time() - t_start,
             "sft_time_s": t_rl - t_sft, "flow_grpo_time_s": t_final - t_rl, "peak_rss_mib": peak_mib,
             **{f"start_{k[len('eval/'):]}": v for k, v in start_eval.items()},
             **{f"final_{k}": v for k, v in final_eval.items()}}
  training.atomic_write_text(work_dir / "summary.json", json.dumps(summary, indent=2))
  pct = lambda v: "n/a" if v is None else f"{100 * v:.1f}%"
  rows = [("held-out problems", f"{len(task.test)}"),
          ("greedy accuracy, SFT planner", pct(start_accuracy)),
          ("greedy accuracy, after Flow-GRPO", pct(final_eval["accuracy"])),
          ("mean turns, SFT -> Flow-GRPO", f"{start_eval.get('eval/mean_turns', float('nan')):.2f} -> "
                                           f"{final_eval['mean_turns']:.2f}"),
          ("tool-error rate, SFT -> Flow-GRPO", f"{pct(start_eval.get('eval/tool_error_rate'))} -> "
                                                f"{pct(final_eval['tool_error_rate'])}"),
          ("wall time (this run)", f"{summary['wall_time_s'] / 60:.1f} min"),
          ("peak host memory (RSS)", f"{peak_mib:,.0f} MiB")]
  grpo_math.print_table("summary", rows)
  print(f"final planner (HF format): {work_dir / 'final_policy'}")
  return summary


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO; -v 0 brings it back
  try:
    run()
  except (grpo_math.RunError, models.CheckpointError, data.DatasetError, checkpointing.CheckpointError,
          FloatingPointError, ValueError, OSError) as err:
    training.end_progress_line()
    sys.exit(f"flow_grpo: error: {err}")
  except BaseException:
    training.end_progress_line()
    raise


if __name__ == "__main__":
  for _name, _value in DEFAULTS.items():
    FLAGS.set_default(_name, _value)
  app.run(main)
