"""Flow-GRPO (AgentFlow, arXiv 2510.05592) as a method of the training loop: a multi-turn planner with tools and
memory, trained on a broadcast outcome reward.

At turn t the planner π_θ sees the query q and its memory M^t and writes an action a^t, a sub-goal plus a tool
call ("mul 4: calc 8*4") or the final answer ("answer: 32"); the executor runs the tool, the verifier stops on an
answer or at T_max (`max_turns`), the memory records the call and its result, and the generator writes the final
answer from M^T. All G trajectories of all B queries advance together through the KV-cache sampler, finished ones
leaving the batch. The outcome reward of a trajectory is broadcast to every turn's action, normalised over the G
trajectories of the query (eq. 7), and the clipped surrogate with a k3 KL to the frozen SFT planner is averaged
over action tokens, turns and trajectories (eq. 5); only action tokens are trained. Stage 1 imitates teacher
trajectories made from the ground truth (each solution step a calculator call, then the answer).

Stage 2's update of the planner (`planner_objective`), for the fair study of Flow-GRPO (issue 56), always one
optimiser update per step at the defaults (one epoch over one minibatch of the step):
  flow_grpo        eq. 5: each turn's tokens averaged, then the turns of a trajectory, then the trajectories;
  trajectory_grpo  the same samples, broadcast advantages and clipped surrogate, but each trajectory one sequence
                   whose action tokens are averaged together (GRPO's sequence mean over the whole trajectory, no
                   per-turn normalisation: a turn weighs as many tokens as it has);
  sft              continued SFT: the teacher trajectories of the step's B queries (the ones the RL arms sample),
                   every action token at coefficient 1 with eq. 5's means and no KL term (at ratio 1, one epoch
                   over one minibatch, the gradient is the demonstrations' log-likelihood gradient).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.methods import base
from experiments.methods import program as program_lib
from experiments.runner import config as config_lib
from experiments.runner import warm_start
from grpo_jax import agents
from grpo_jax import rewards as rewards_lib
from grpo_jax.losses import flow_grpo
from grpo_jax.training import update as update_lib


class Agent:
  """Everything but the planner: toolset, prompt format, executor, verifier, generator, budgets."""

  def __init__(self, config: config_lib.Config, tokenizer):
    self.config, agent = config, config.agent
    try:
      self.toolset = agents.math_toolset(agent.tools)
    except ValueError as err:
      raise config_lib.RunError(f"--tools: {err}") from None
    count = lambda text: len(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    header = f"{self.toolset.describe()}\nactions: '<sub-goal>: <tool> <args>' or 'answer: <value>'\n"
    self.prompt_format = agents.PromptFormat(agent.planner_prompt_len, count, header if agent.tool_header else "")
    self.executor = agents.ToolExecutor(self.toolset, agent.tool_time_limit)
    self.generator = agents.RuleGenerator(use_last_result=agent.answer_from_memory)
    self.tokenizer = tokenizer

  def episodes(self, planner, examples, group_size: int, key) -> list[agents.Trajectory]:
    return agents.run_episodes(planner, [e.question for e in examples], group_size=group_size,
                               max_turns=self.config.agent.max_turns, key=key, prompt_format=self.prompt_format,
                               memory_budget=self.config.agent.memory_budget, executor=self.executor,
                               generator=self.generator)


def take_turn_rows(batch: agents.TurnBatch, rows: np.ndarray, size: int) -> agents.TurnBatch:
  """The given rows of a batch, padded with empty rows (no tokens, nothing trained) up to `size`."""
  pad = size - len(rows)

  def take(name, x):
    x = np.asarray(x)[rows]
    filler = np.full((pad, *x.shape[1:]), 1 if name in ("num_turns", "trajectory_tokens") else 0, x.dtype)
    return np.concatenate([x, filler]) if pad else x

  return agents.TurnBatch(*[take(name, x) for name, x in zip(agents.TurnBatch._fields, batch)])


class FlowGRPO(base.Method):
  """Rows are turns; a step's B·G trajectories have a varying number of them, so minibatches hold whole
  trajectories, their turns first, padded with empty rows to one fixed count (`turn_rows`: each trajectory at
  --max_turns). The forwards and the update run them in blocks and micro-batches of `micro_rows` rows, skipping
  those that hold no turn: one compiled shape each, whatever a step's turns, at the cost of its turns rounded up
  to a block."""

  name = "flow_grpo"
  sft_marker = "flow_grpo_sft.json"  # a planner fine-tuned on teacher trajectories, not a single-turn policy

  def __init__(self, config, model_config, task, rollouts, reference):
    super().__init__(config, model_config, task, rollouts, reference)
    self.num_turns = 0  # turn rows of the last collected step
    # The sampler's padding: the tokenizer's pad id; without a task (built to list its programs) the model's
    self.pad_id = (model_config.pad_token_id if task is None else task.tokenizer.pad_token_id) or 0
    self.agent = None if task is None else Agent(config, task.tokenizer)
    self.objective_name = config.agent.planner_objective
    self._scoring = None  # `scoring_logprobs`, built at its first use
    if task is None:
      return
    longest = max(self.agent.prompt_format.frame_tokens(e.question) for e in [*task.test, *task.rl_pool])
    if longest > config.agent.planner_prompt_len:  # the sampler would cut the problem's head off, without a word
      raise config_lib.RunError(f"--planner_prompt_len={config.agent.planner_prompt_len}: the planner's prompt (tool "
                                f"header, problem, cue) takes {longest} tokens for the longest problem; give at "
                                f"least that")

  def planner(self, params, *, greedy: bool) -> agents.SamplerPlanner:
    """π_θ as the agent's planner; `.program(num_samples)` is the sampler program a turn runs."""
    agent, rollout = self.config.agent, self.config.rollout
    return agents.SamplerPlanner(params, self.model_config, None if self.task is None else self.task.tokenizer,
                                 max_prompt_len=agent.planner_prompt_len, max_action_tokens=agent.action_tokens,
                                 temperature=rollout.temperature, top_k=rollout.top_k, top_p=rollout.top_p,
                                 greedy=greedy, min_bucket=agent.min_bucket, pad_id=self.pad_id)

  def micro_rows(self, trajectories: int, parts: int | None = None) -> int:
    """Rows of a micro-batch of the update over `trajectories` trajectories: half as many as the trajectories (a few
    turns a trajectory fill a few micro-batches), divided by `parts` (default --grad_accum_steps, which bounds the
    update's activations), a multiple of the data shards (against one micro-batch of all the rows: BENCHMARKS.md,
    "Flow-GRPO's turn rows")."""
    parts = self.config.algorithm.grad_accum_steps if parts is None else parts
    shards = self.rollouts.placement.data_parallel if self.rollouts is not None else 1
    rows = max(-(-trajectories // (2 * parts)), 1)
    return -(-rows // shards) * shards

  def turn_rows(self, trajectories: int) -> int:
    """The rows of `trajectories` trajectories' turns, fixed: room for each of --max_turns turns, in whole
    micro-batches (`micro_rows`); the rows past a step's turns are empty."""
    unit = self.micro_rows(trajectories)
    return -(-trajectories * self.config.agent.max_turns // unit) * unit

  def update_micro_batches(self, minibatch: int) -> int:
    return self.turn_rows(minibatch) // self.micro_rows(minibatch)

  def skips_empty_micro_batches(self) -> bool:
    return True

  def fixed_step_shapes(self) -> bool:
    return True  # the turn rows' one count; the planner's first turn, and its later ones at the widest bucket

  def scoring_logprobs(self):
    """π_old's and π_ref's forward over a step's turn rows in blocks of `micro_rows` (fewer where the forward's
    memory budget holds fewer), the blocks past its turns skipped."""
    if self._scoring is None:
      self._scoring = self.rollouts.placement.logprobs(
          self.model_config, chunk_size=self.config.model.logprob_chunk, temperature=self.config.rollout.temperature,
          forward_rows=self.scoring_block(), skip_empty=True)
    return self._scoring

  def scoring_block(self) -> int:
    """Rows of a block of the scoring forwards: the most that divides a step's `turn_rows`, is a multiple of the
    data shards, and is at most half the step's trajectories (`micro_rows` without --grad_accum_steps) and what
    the forward's memory budget holds (`Placement.forward_chunk`)."""
    rollout, placement = self.config.rollout, self.rollouts.placement
    n, width = self.scoring_shape()
    most = min(self.micro_rows(rollout.batch_size * rollout.group_size, parts=1),
               placement.forward_chunk(self.model_config, n, width, logits_chunk=self.config.model.logprob_chunk))
    shards = placement.data_parallel
    return max([d for d in range(shards, most + 1, shards) if n % d == 0] or [shards])

  def forward_layout(self) -> dict:
    return {"live_blocks": self.scoring_block()}

  def scoring_forwards(self) -> tuple[str, ...]:
    """π_old over every turn row, and π_ref with the KL term (β > 0, not in continued SFT), through the rollouts'
    forward."""
    return ("π_old",) + (("π_ref",) if self.uses_reference() else ())

  def uses_reference(self) -> bool:
    return self.config.algorithm.beta > 0 and self.objective_name != "sft"

  def scoring_shape(self) -> tuple[int, int]:
    rollout, agent = self.config.rollout, self.config.agent
    return self.turn_rows(rollout.batch_size * rollout.group_size), agent.planner_prompt_len + agent.action_tokens

  def update_rows(self, minibatch: int) -> int:
    return self.turn_rows(minibatch)  # `minibatches`: a minibatch of trajectories is their turns, padded

  def step_programs(self, shapes):
    """The planner's turns (`planner(...).program`): a step's first (sampler: B queries' prompts, G actions each) and
    its later ones (sampler_turns: one action for each of the B·G trajectories still active, at most --max_turns - 1
    calls), then π_old / π_ref over the turns' rows."""
    rollout, max_turns = self.config.rollout, self.config.agent.max_turns
    b, g = rollout.batch_size, rollout.group_size
    planner = self.planner(shapes.policy, greedy=False)
    out = {"sampler": self._turn(planner, shapes, b, g, "the planner's first turn", per_step=1)}
    if max_turns > 1:
      out["sampler_turns"] = self._turn(planner, shapes, b * g, 1, f"the planner's later turns, at most "
                                        f"{max_turns - 1} a step", per_step=max_turns - 1)
    return out | super().step_programs(shapes)

  def eval_programs(self, shapes, held_out: int):
    """The greedy planner's turns (`evaluate`: one trajectory a query, --eval_batch_size queries at a time)."""
    size = min(self.config.eval.eval_batch_size, held_out)
    calls = -(-held_out // size) * self.config.agent.max_turns
    return {"eval_greedy": self._turn(self.planner(shapes.policy, greedy=True), shapes, size, 1,
                                      f"evaluation: the greedy planner's turns, at most {calls} calls", per_step=0,
                                      per_eval=calls)}

  def _turn(self, planner, shapes, requests: int, samples: int, uses: str, **calls) -> program_lib.Program:
    """The sampler program of a turn of `requests` requests x `samples` actions, at its row bucket."""
    fn, static = planner.program(samples)
    n, p, a = planner.rows(requests), self.config.agent.planner_prompt_len, self.config.agent.action_tokens
    return program_lib.Program(
        fn, (shapes.policy, shapes.rows(jnp.int32, n, p), shapes.rows(jnp.bool_, n, p), shapes.key,
             shapes.temperature, None),
        f"{uses}: {n} prompts of {p} tokens x {samples} actions of up to {a} tokens", loop_trips=a - 1,
        kwargs=static, **calls)

  def abstract_batch(self, rows):
    width = self.config.agent.planner_prompt_len + self.config.agent.action_tokens
    f32, bool_, per_row = rows(jnp.float32, width), rows(jnp.bool_, width), rows(jnp.float32)
    return agents.TurnBatch(tokens=rows(jnp.int32, width), attention_mask=bool_, loss_mask=bool_, old_logp=f32,
                            ref_logp=f32, advantages=per_row, num_turns=per_row, num_trajectories=per_row,
                            trajectory_ids=rows(jnp.int32), trajectory_tokens=per_row)

  def objective(self):
    algo = self.config.algorithm
    use_reference = self.uses_reference()
    loss_kwargs = dict(epsilon=algo.epsilon, epsilon_high=algo.epsilon_high, beta=algo.beta if use_reference else 0.0,
                       kl=algo.kl or "k3", dual_clip=algo.dual_clip)
    aggregation = "trajectory" if self.objective_name == "trajectory_grpo" else "turn"
    # π ∝ exp(logits / T), the distribution the actions were sampled from
    return update_lib.bind(agents.flow_grpo_objective, config=self.model_config, loss_kwargs=loss_kwargs,
                           use_reference=use_reference, chunk_size=self.config.model.logprob_chunk,
                           temperature=self.config.rollout.temperature, aggregation=aggregation)

  def collect(self, params, position: int, key):
    algo, b, g = self.config.algorithm, self.config.rollout.batch_size, self.config.rollout.group_size
    t0 = time.time()
    examples = [self.task.train_example(position + i) for i in range(b)]
    if self.objective_name == "sft":
      return *self._collect_teacher(params, examples, t0), position + b
    planner = self.planner(params, greedy=False)
    trajectories = self.agent.episodes(planner, examples, g, key)
    self.rollouts.prompts_truncated += planner.prompts_truncated  # the count the checkpoint records
    t1 = time.time()
    repeated = [e for e in examples for _ in range(g)]
    outputs = [t.output for t in trajectories]
    rewards = rewards_lib.score(outputs, repeated, self.task.reward_fn).reshape(b, g)
    correct = rewards_lib.score(outputs, repeated, "correctness")
    n_turns = sum(t.num_turns for t in trajectories)
    host = agents.turn_rows(trajectories, self.config.agent.planner_prompt_len, self.config.agent.action_tokens,
                            self.pad_id, rows=self.turn_rows(b * g))
    advantages = flow_grpo.broadcast_outcome_advantages(rewards, host.trajectory_ids, scale=algo.advantage_scale,
                                                        eps=algo.advantage_eps)
    real = np.arange(len(host.advantages)) < n_turns
    forward = self.scoring_logprobs()
    old_logp = forward(params, host.tokens, host.attention_mask)
    ref_logp = (forward(self.reference, host.tokens, host.attention_mask)
                if self.uses_reference() else jnp.zeros_like(old_logp))
    batch = host._replace(old_logp=np.asarray(old_logp), ref_logp=np.asarray(ref_logp),
                          advantages=np.where(real, np.asarray(advantages), 0.0).astype(np.float32))
    self.num_turns = n_turns
    stats = {
        "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()), "accuracy": float(correct.mean()),
        "zero_variance_groups": float(np.mean(np.ptp(rewards, axis=1) == 0)),
        **agents.episode_stats(trajectories),
        "turn_rows": float(n_turns), "padded_rows": float(len(host.advantages) - n_turns),
        "sampled_rows": float(planner.rows_sampled), "prompts_truncated": float(self.rollouts.prompts_truncated),
        "action_length": float(np.mean([len(turn.output.action_ids) for t in trajectories for turn in t.turns])),
        "time_sampling": t1 - t0, "time_scoring": time.time() - t1,
    }
    return batch, stats, position + b

  def _collect_teacher(self, params, examples, t0: float):
    """Continued SFT's step (`planner_objective` sft): the teacher trajectories of the step's queries that reach
    their answer, every action token at advantage 1, π_old the current planner (ratio 1 at the update)."""
    trajectories = self._teacher_trajectories(examples)
    correct = rewards_lib.score([t.output for t in trajectories], examples, "correctness")
    trajectories = [t for t, ok in zip(trajectories, correct) if ok]
    if not trajectories:
      raise config_lib.RunError(f"no teacher trajectory of the step's queries reaches its answer within --max_turns="
                                f"{self.config.agent.max_turns}")
    b, g = self.config.rollout.batch_size, self.config.rollout.group_size
    n_turns = sum(t.num_turns for t in trajectories)
    host = agents.turn_rows(trajectories, self.config.agent.planner_prompt_len, self.config.agent.action_tokens,
                            self.pad_id, rows=self.turn_rows(b * g))
    t1 = time.time()
    real = np.arange(len(host.advantages)) < n_turns
    old_logp = self.scoring_logprobs()(params, host.tokens, host.attention_mask)
    batch = host._replace(old_logp=np.asarray(old_logp), ref_logp=np.zeros_like(np.asarray(old_logp)),
                          advantages=real.astype(np.float32))
    self.num_turns = n_turns
    return batch, {"teacher_trajectories": float(len(trajectories)), **agents.episode_stats(trajectories),
                   "turn_rows": float(n_turns), "padded_rows": float(len(host.advantages) - n_turns),
                   "time_sampling": t1 - t0, "time_scoring": time.time() - t1}

  def _teacher_trajectories(self, examples) -> list[agents.Trajectory]:
    """The ground truth's trajectories (`agents.teacher_scripts`) played through the agent loop, with token ids."""
    try:
      scripts = agents.teacher_scripts(examples)
    except ValueError as err:
      raise config_lib.RunError(f"teacher trajectories need solutions of a<op>b=c steps ({err}); "
                                "pass --sft_steps=0 with an instruction-tuned --model") from None
    planner = agents.ScriptedPlanner(scripts, self.agent.tokenizer, self.config.agent.planner_prompt_len)
    return agents.run_episodes(planner, [e.question for e in examples], group_size=1,
                               max_turns=self.config.agent.max_turns, key=jax.random.PRNGKey(0),
                               prompt_format=self.agent.prompt_format, memory_budget=self.config.agent.memory_budget,
                               executor=self.agent.executor, generator=self.agent.generator)

  def minibatches(self, batch, key, epoch: int, minibatch: int):
    """Minibatches of `minibatch` whole trajectories (all of a step's turns when it is B·G), each padded to
    `turn_rows(minibatch)`."""
    trajectories = self.rows_per_step()
    order = np.asarray(jax.random.permutation(jax.random.fold_in(key, 10_000 + epoch), trajectories))
    if minibatch == trajectories:
      return [jax.tree.map(jnp.asarray, batch)]
    real_rows = np.arange(self.num_turns)
    parts = []
    for i in range(0, trajectories, minibatch):
      rows = real_rows[np.isin(batch.trajectory_ids[real_rows], order[i:i + minibatch])]
      part = take_turn_rows(batch, rows, self.turn_rows(minibatch))
      parts.append(jax.tree.map(jnp.asarray, part._replace(num_trajectories=np.full_like(part.num_trajectories,
                                                                                         minibatch))))
    return parts

  def evaluate(self, params, key, task=None) -> dict:
    """Greedy agent loop on the held-out set (`task.test`, default: the method's task): accuracy, mean turns, tool
    calls, tool-error rate, answer rate."""
    test = (self.task if task is None else task).test
    size = min(self.config.eval.eval_batch_size, len(test))
    trajectories = []
    for start in range(0, len(test), size):
      planner = self.planner(params, greedy=True)
      trajectories += self.agent.episodes(planner, test[start:start + size], 1, jax.random.fold_in(key, start))
    correct = rewards_lib.score([t.output for t in trajectories], test, "correctness")
    return {"accuracy": float(correct.mean()), **agents.episode_stats(trajectories)}

  def demonstrations(self) -> warm_start.Demonstrations:
    """(prompt ids, action ids + end token) of every turn of the teacher trajectories of the SFT pool."""
    examples = [e for e in self.task.sft_pool if e.solution]
    try:
      scripts = agents.teacher_scripts(examples)
    except ValueError as err:
      raise config_lib.RunError(f"teacher trajectories need solutions of a<op>b=c steps ({err}); "
                                "pass --sft_steps=0 with an instruction-tuned --model") from None
    agent = self.agent
    trajectories = agents.run_episodes(agents.ScriptedPlanner(scripts), [e.question for e in examples],
                                       group_size=1, max_turns=self.config.agent.max_turns, key=jax.random.PRNGKey(0),
                                       prompt_format=agent.prompt_format, memory_budget=self.config.agent.memory_budget,
                                       executor=agent.executor, generator=agent.generator)
    correct = rewards_lib.score([t.output for t in trajectories], examples, "correctness")
    tok = agent.tokenizer
    turns = [(tok.encode(turn.prompt, add_special_tokens=False),
              tok.encode(turn.action.text, add_special_tokens=False) + [tok.eos_token_id])
             for t, ok in zip(trajectories, correct) if ok for turn in t.turns]
    if not turns:
      raise config_lib.RunError(f"no teacher trajectory reaches its answer within --max_turns="
                                f"{self.config.agent.max_turns}")
    agent = self.config.agent
    return warm_start.Demonstrations(turns, agent.planner_prompt_len, agent.action_tokens, 54321)

  def summary_rows(self, start: dict, final: dict) -> list[tuple[str, str]]:
    pct = lambda v: "n/a" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    return [("mean turns, start -> Flow-GRPO", f"{start.get('mean_turns', float('nan')):.2f} -> "
                                               f"{final['mean_turns']:.2f}"),
            ("tool-error rate, start -> Flow-GRPO", f"{pct(start.get('tool_error_rate'))} -> "
                                                    f"{pct(final['tool_error_rate'])}")]
