r"""Trains an outcome (ORM) or process (PRM) reward model on samples of a policy.

  python -m experiments.grpo_math --work_dir=runs/sft --steps=1 --eval_every=0    # an SFT policy
  python -m experiments.train_reward_model --policy=runs/sft/sft_policy --rm_kind=prm \
      --rm_dir=runs/prm

The policy (the SFT model) samples --rm_samples_per_prompt completions for each of --rm_prompts
training problems (problems the SFT stage never saw) and of --rm_eval_prompts held-out problems.
Completions are labelled by their final answer (ORM) or step by step (PRM): exactly on the
synthetic task, else by Math-Shepherd Monte Carlo rollouts (--mc_rollouts per step). The reward
model (the policy's backbone plus a scalar head, DeepSeekMath §4.1, arXiv 2402.03300) trains on
the training samples; held-out accuracy and AUC (overall and within problems) are reported before
and after. --rm_init starts the reward model from another checkpoint with the policy's tokenizer
(a larger or better-trained model: a stronger verifier than the policy itself). Output in --rm_dir:
`reward_model/` (HF backbone + reward_head.safetensors + tokenizer, and training_rows.npz: the labelled
rows it trained on, from which iterative RL's replay buffer starts), `metrics.jsonl`, `summary.json`.

Checkpoints: `<rm_dir>/checkpoints/data.npz` holds the labelled samples (written once, after sampling: the
expensive part) and `<rm_dir>/checkpoints/<step>` the train state every --save_every steps and when SIGTERM or
SIGINT stops the run (`preemption`: exit 143 or 130, one line with the command that continues). --resume loads
the samples instead of sampling and continues the same batches: the reward model equals an uninterrupted run's.
The directory is removed once the reward model and summary are written.

Task, sampling and model flags (--seed, --resume, --save_every and --keep_checkpoints among them) are those of
experiments.grpo_math (`experiments/cli.py`); the task, policy loading and placement are the training loop's,
and so are the checkpoint-directory guard, the optimiser's schedule rule, the logs (W&B continued on --resume)
and the checkpoints with their resume and stop signals (`experiments/runner/`). From Python:
`run(runner.config.Config(...), RewardModelTrainingConfig(policy=..., rm_kind="prm"))`.
"""

import dataclasses
import json
import math
import os
import pathlib
import shutil
import sys
import time
from typing import NamedTuple
import zipfile

from absl import app
from absl import flags
import jax
import numpy as np

from experiments import cli
from experiments.runner import config as config_lib
from experiments.runner import git_commit
from experiments.runner import logs
from experiments.runner import optimizer as optimizer_lib
from experiments.runner import placement as placement_lib
from experiments.runner import preemption
from experiments.runner import report
from experiments.runner import resume as resume_lib
from experiments.runner import stage_checkpoints
from experiments.runner import task as task_lib
from experiments.runner import work_dir_lock
from grpo_jax import models
from grpo_jax import reward_models as rm
from grpo_jax import training
from grpo_jax.reward_models import positions
from grpo_jax.training import checkpointing

RunError = config_lib.RunError
CHECKPOINTS = "checkpoints"  # under --rm_dir: DATA, then the train state's steps
DATA = "data.npz"
LOG_EVERY = 10  # training steps between logged steps (and between checks for a stop signal)
# What `--resume` lets differ from the checkpoint: the shared runner's, and these (how long it trains, how often it
# evaluates, where the directory is); anything else would continue a different run.
MAY_CHANGE = config_lib.MAY_CHANGE | {"rm_steps", "rm_eval_every", "rm_overwrite", "rm_dir"}


@dataclasses.dataclass(frozen=True)
class RewardModelTrainingConfig:
  """What this runner adds to the shared `runner.config.Config`: the data, the reward model, its training (the
  shared config's `RewardModelConfig` is a learned reward's use in RL)."""
  policy: str = ""
  rm_init: str = ""
  rm_kind: str = "orm"
  rm_dir: str = "runs/reward_model"
  rm_step_labels: str = "auto"
  mc_rollouts: int = 4
  rm_prompts: int = 1000
  rm_eval_prompts: int = 200
  rm_samples_per_prompt: int = 4
  rm_sample_batch: int = 64
  rm_max_steps: int = 8
  rm_loss: str = "bce"
  rm_score: str = "head"
  rm_freeze_backbone: bool = False
  rm_lora_rank: int = 0
  rm_lora_alpha: float = 16.0
  rm_steps: int = 300
  rm_batch_size: int = 64
  rm_learning_rate: float = 3e-4
  rm_eval_every: int = 100
  rm_overwrite: bool = False

  def __post_init__(self):
    for name in ("rm_prompts", "rm_eval_prompts", "rm_samples_per_prompt", "rm_sample_batch", "rm_max_steps",
                 "rm_batch_size", "mc_rollouts"):
      if getattr(self, name) < 1:
        raise config_lib.ConfigError(f"--{name} must be >= 1")
    for name in ("rm_steps", "rm_eval_every", "rm_lora_rank"):
      if getattr(self, name) < 0:
        raise config_lib.ConfigError(f"--{name} must be >= 0")
    if not (math.isfinite(self.rm_learning_rate) and self.rm_learning_rate > 0):
      raise config_lib.ConfigError(f"--rm_learning_rate must be a finite number > 0, not {self.rm_learning_rate}")
    if self.rm_loss == "pairwise" and self.rm_kind not in rm.OUTCOME_KINDS:
      raise config_lib.ConfigError("--rm_loss=pairwise needs an outcome reward model (--rm_kind=orm or orm_steps)")
    if self.rm_score not in rm.SCORES:
      raise config_lib.ConfigError(f"--rm_score must be one of {', '.join(rm.SCORES)}")
    if self.rm_score == "loglik" and self.rm_kind not in rm.OUTCOME_KINDS:
      raise config_lib.ConfigError("--rm_score=loglik needs an outcome reward model (--rm_kind=orm or orm_steps)")
    if self.rm_lora_rank and self.rm_freeze_backbone:
      raise config_lib.ConfigError("--rm_lora_rank trains adapters on the backbone, --rm_freeze_backbone none of it: "
                                   "pass one of them")
    if self.rm_lora_rank and not (math.isfinite(self.rm_lora_alpha) and self.rm_lora_alpha > 0):
      raise config_lib.ConfigError(f"--rm_lora_alpha must be a finite number > 0, not {self.rm_lora_alpha}")


_D = RewardModelTrainingConfig()
# The shared flags (`experiments/cli.py`) this runner does not read: refused unless at their defaults.
UNREAD = ("model", "init_checkpoint", "tiny_layers", "tiny_hidden_size", "remat_policy", "scan_layers",
          "logprob_chunk", "attention", "lora_rank", "lora_alpha", "lora_targets", "lora_export_peft", "sft_steps",
          "sft_batch_size", "sft_learning_rate", "sft_save_every", "batch_size", "group_size", "dynamic_sampling",
          "dynamic_sampling_max_rounds", "overlong_buffer", "mask_truncated", "completion_pad_multiple",
          "completion_widths", "token_layout", "bucket_widths", "bucket_micro_batches",
          *(f.name for f in dataclasses.fields(config_lib.AlgorithmConfig)), "steps", "learning_rate", "lr_schedule",
          *(f.name for f in dataclasses.fields(config_lib.RewardModelConfig)),
          *(f.name for f in dataclasses.fields(config_lib.AgentConfig)),
          *(f.name for f in dataclasses.fields(config_lib.EvalConfig)), "work_dir", "stop_after", "profile_steps",
          "compile_ahead", "forward_rows", "forward_memory_budget", "sharding_rules")
INSTEAD = {"work_dir": "--rm_dir", "init_checkpoint": "--policy", "model": "--policy", "steps": "--rm_steps",
           "learning_rate": "--rm_learning_rate", "batch_size": "--rm_batch_size",
           "eval_every": "--rm_eval_every"}

flags.DEFINE_string("policy", _D.policy, "HF-format directory of the policy that samples the training data (the SFT "
                    "model, e.g. <grpo_math work_dir>/sft_policy); the reward model starts from its backbone.")
flags.DEFINE_string("rm_init", _D.rm_init, "HF-format directory of the reward model's backbone (default: --policy). Any "
                    "size, but the policy's tokenizer.")
flags.DEFINE_enum("rm_kind", _D.rm_kind, list(rm.KINDS), "orm: outcome labels, score the last token; prm: step "
                  "labels, score every step's end; orm_steps: outcome labels, score every step's end, pooled by "
                  "a noisy-AND (P(correct) = product of the step probabilities).")
flags.DEFINE_string("rm_dir", _D.rm_dir, "Output directory of the reward model, logs and summary.")
flags.DEFINE_enum("rm_step_labels", _D.rm_step_labels, ["auto", *rm.STEP_LABELS], "PRM step labels: exact (synthetic "
                  "task), Math-Shepherd Monte Carlo mc_hard (any rollout right) or mc_soft (the fraction); "
                  "auto: exact on the synthetic task, else mc_hard.")
flags.DEFINE_integer("mc_rollouts", _D.mc_rollouts, "Monte Carlo step labels: completions sampled from each step's prefix.")
flags.DEFINE_integer("rm_prompts", _D.rm_prompts, "Training problems to sample completions for.")
flags.DEFINE_integer("rm_eval_prompts", _D.rm_eval_prompts, "Held-out problems (from the test set) for accuracy and AUC.")
flags.DEFINE_integer("rm_samples_per_prompt", _D.rm_samples_per_prompt, "Completions sampled per problem.")
flags.DEFINE_integer("rm_sample_batch", _D.rm_sample_batch, "Problems per sampler call.")
flags.DEFINE_integer("rm_max_steps", _D.rm_max_steps, "PRM and orm_steps: most scored segments per completion (the first "
                     "K-1 and the last).")
flags.DEFINE_enum("rm_loss", _D.rm_loss, list(rm.LOSSES), "bce, or the Bradley-Terry pairwise loss (orm, orm_steps) "
                  "over (right, wrong) pairs of one problem: it trains only the ranking within a problem, what "
                  "GRPO's group advantage uses.")
flags.DEFINE_enum("rm_score", _D.rm_score, list(rm.SCORES), "head: the scalar head's logit; loglik (orm, orm_steps): "
                  "that logit + alpha (trained, from 1) x the backbone's own log-likelihood of the completion (the "
                  "sum of its token log-probs), saved with the model so --reward=orm scores the same way.")
flags.DEFINE_bool("rm_freeze_backbone", _D.rm_freeze_backbone, "Train only the head (and alpha): the backbone stays "
                  "as loaded (with --rm_score=loglik fine-tuning it on a few thousand samples spoils its likelihood).")
flags.DEFINE_integer("rm_lora_rank", _D.rm_lora_rank, "> 0: train rank-r LoRA adapters on every projection of the "
                     "backbone (and the head, alpha), its base weights as loaded: the likelihood a loglik score ranks "
                     "with trains too, from exactly the loaded model; saved merged (a plain reward model). 0: the "
                     "whole backbone trains (or none, --rm_freeze_backbone).")
flags.DEFINE_float("rm_lora_alpha", _D.rm_lora_alpha, "--rm_lora_rank's scale: the adapters add (x·A)·B·alpha/rank.")
flags.DEFINE_integer("rm_steps", _D.rm_steps, "Reward-model optimiser steps.")
flags.DEFINE_integer("rm_batch_size", _D.rm_batch_size, "Completions per reward-model step (pairwise: batches hold whole "
                     "problems, so make it a multiple of --rm_samples_per_prompt).")
flags.DEFINE_float("rm_learning_rate", _D.rm_learning_rate, "Reward-model peak learning rate (cosine decay; the paper: 2e-5 "
                   "for 7B).")
flags.DEFINE_integer("rm_eval_every", _D.rm_eval_every, "Held-out evaluation every N steps (0: only before and after).")
flags.DEFINE_bool("rm_overwrite", _D.rm_overwrite, "Replace an existing reward model in --rm_dir (and start "
                  "over from any checkpoints there, unless --resume).")

FLAGS = flags.FLAGS


def _collect(cfg: config_lib.Config, rmc: RewardModelTrainingConfig, params, model_config, task, examples, key,
             step_labels):
  prompts = [task.prompt(e) for e in examples]
  return rm.sample_reward_data(
      params, model_config, task.tokenizer, examples, prompts, key, kind=rmc.rm_kind,
      samples_per_prompt=rmc.rm_samples_per_prompt, max_prompt_len=cfg.task.max_prompt_len,
      max_new_tokens=cfg.rollout.max_new_tokens, batch_size=min(rmc.rm_sample_batch, len(examples)),
      temperature=cfg.rollout.temperature, top_k=cfg.rollout.top_k, top_p=cfg.rollout.top_p,
      step_labels=step_labels, max_steps=rmc.rm_max_steps, mc_rollouts=rmc.mc_rollouts)


def _load_backbone(path: str, policy_config, model: config_lib.PolicyConfig):
  """--rm_init's params and model config, after checking it reads the policy's tokens."""
  rm_dir = pathlib.Path(path)
  if not rm_dir.is_dir():
    raise RunError(f"--rm_init={path} is not a directory")
  params, model_config = models.load_hf(rm_dir, dtype=model.dtype, param_dtype=model.dtype, remat=model.remat)
  if model_config.vocab_size != policy_config.vocab_size:
    raise RunError(f"--rm_init={path} has a vocabulary of {model_config.vocab_size} tokens, the policy "
                             f"{policy_config.vocab_size}; the reward model must read the policy's tokens")
  return params, model_config


def _mixed_problems(data) -> tuple[int, int]:
  """(problems with both a right and a wrong sample, problems): only the first give within-problem pairs."""
  groups = np.unique(data.group)
  both = [data.outcome[data.group == g].max() > 0.5 > data.outcome[data.group == g].min() for g in groups]
  return int(np.sum(both)), len(groups)


def _record(cfg: config_lib.Config, rmc: RewardModelTrainingConfig) -> dict:
  """Both configs as a checkpoint records them: flag name -> value, JSON-ready."""
  return {**resume_lib.record(cfg), **json.loads(json.dumps(dataclasses.asdict(rmc), default=str))}


def _check_flags(recorded: dict | None, now: dict, step: int) -> None:
  resume_lib.check_flags(recorded, now, step, report.note, may_change=MAY_CHANGE, directory_flag="--rm_dir")


class _Labelled(NamedTuple):
  """The labelled samples (`_sample`'s, or the checkpoint's `_load_data`)."""
  train: rm.RewardData
  held_out: rm.RewardData
  hidden: np.ndarray | None  # orm_steps on the synthetic task: exact step labels of held_out, never trained on
  collect_time: float
  metrics_offset: int  # metrics.jsonl's length when they were saved


def _save_data(ckpt_dir: pathlib.Path, recorded: dict, train, held_out, hidden, collect_time: float,
               metrics_offset: int) -> None:
  """The labelled samples as `ckpt_dir/DATA`, written beside the directory and renamed in: whole or absent."""
  arrays = {f"{name}/{field}": value for name, data in (("train", train), ("eval", held_out))
            for field, value in data._asdict().items()}
  if hidden is not None:
    arrays["hidden"] = hidden
  tmp = ckpt_dir.with_name(f".{DATA}.tmp-{os.getpid()}")
  try:
    with open(tmp, "wb") as f:
      np.savez(f, flags=np.asarray(json.dumps(recorded)), collect_time=np.asarray(collect_time, np.float64),
               metrics_offset=np.asarray(metrics_offset, np.int64), **arrays)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, ckpt_dir / DATA)
  finally:
    tmp.unlink(missing_ok=True)


def _load_data(ckpt_dir: pathlib.Path, now: dict) -> _Labelled:
  """`_save_data`'s samples, after checking their flags against `now`."""
  path = ckpt_dir / DATA
  if not path.is_file():
    raise checkpointing.CheckpointError(f"--resume: {ckpt_dir} holds no {DATA} (the labelled samples); start over "
                                        "with --rm_overwrite")
  try:
    with np.load(path) as f:
      arrays = {name: f[name] for name in f.files}
    recorded = json.loads(str(arrays.pop("flags")))
    train, held_out = (rm.RewardData(**{field: arrays[f"{name}/{field}"] for field in rm.RewardData._fields})
                       for name in ("train", "eval"))
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
    cause = str(err).splitlines()[0] if str(err) else type(err).__name__
    raise checkpointing.CheckpointError(f"{path} cannot be read (damaged?): {cause}; start over with "
                                        "--rm_overwrite") from None
  _check_flags(recorded, now, 0)
  return _Labelled(train, held_out, arrays.get("hidden"), float(arrays["collect_time"]), int(arrays["metrics_offset"]))


def _print_eval(name, values):
  parts = [f"{k} {v:.3f}" for k, v in values.items() if not k.endswith(("count", "positive_rate", "pairs"))]
  print(f"{name}: " + ", ".join(parts), file=sys.stderr)


def run(cfg: config_lib.Config, rmc: RewardModelTrainingConfig, signals: preemption.StopSignals | None = None) -> dict:
  """Samples, labels, trains and saves a reward model; returns the summary (also in `<rm_dir>/summary.json`).

  Saves the labelled samples once sampled, and the train state every `save_every` steps, under
  `<rm_dir>/checkpoints`; `resume` continues from there, with the same batches as an uninterrupted run. After
  sampling, or after a logged training step (every 10), during which `signals` noted SIGTERM or SIGINT, saves
  that step and raises `preemption.Interrupted`.
  """
  t_start = time.time()
  _check(cfg, rmc)
  out_dir = pathlib.Path(rmc.rm_dir)
  ckpt_dir = out_dir / CHECKPOINTS
  held = resume_lib.holds_checkpoints(ckpt_dir)
  recorded = _record(cfg, rmc)
  labelled = _load_data(ckpt_dir, recorded) if cfg.run.resume else None  # refuses other flags before any write
  policy_dir = pathlib.Path(rmc.policy)
  params, model_config = placement_lib.Placement().load_hf(policy_dir, dtype=cfg.model.dtype,
                                                           param_dtype=cfg.model.dtype, remat=cfg.model.remat,
                                                           decode_projections=cfg.model.decode_projections)
  task = task_lib.Task(cfg.task, models.load_tokenizer(policy_dir), sft_lineage=True, seed=cfg.run.seed)
  step_labels = _step_labels(cfg, rmc)
  _prepare_rm_dir(cfg, rmc, start_over=held and not cfg.run.resume)
  key = jax.random.PRNGKey(cfg.run.seed)

  # COLLECT: samples of the policy, labelled (or, resumed, the checkpoint's)
  labelled = _collect_labelled(cfg, rmc, labelled, params, model_config, task, key, step_labels, recorded, signals)

  # TRAIN (the logs start once --rm_init has loaded: a bad one leaves no W&B run open)
  rm_params, model_config = _init_reward_model(cfg, rmc, params, model_config, key)
  del params  # from here on, `model_config` is the reward model's
  # resumed: the same W&B run (REVIEW B1), as the loop's
  logger = logs.start(out_dir, cfg.run, {**cfg.flat(), **dataclasses.asdict(rmc)}, rmc.rm_steps)
  state, before, train_time = _train(cfg, rmc, rm_params, model_config, labelled, logger, recorded, signals)
  after, train_fit = _evaluate_trained(cfg, rmc, state.params, model_config, labelled, logger)

  # SAVE (adapters merged into the backbone: a plain reward model, as `--reward=orm` loads it)
  with training.atomic_directory(out_dir / "reward_model") as tmp:  # whole or not at all: never half-written
    rm.save_reward_model(*rm.adapters.merge(state.params, model_config), tmp, kind=rmc.rm_kind,
                         tokenizer_dir=policy_dir)
    rm.save_training_rows(labelled.train, tmp, prompt_len=labelled.train.tokens.shape[1] - cfg.rollout.max_new_tokens)
  summary = _summary(rmc, state.params, labelled, step_labels, before, after, train_fit,
                     {"time_collect_s": labelled.collect_time, "time_train_s": train_time,
                      "time_total_s": time.time() - t_start})
  training.atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2))
  shutil.rmtree(ckpt_dir, ignore_errors=True)  # the reward model is saved: the samples and states are spent
  report.print_table(f"reward model ({rmc.rm_kind})", _summary_rows(summary, before, after, train_fit))
  print(f"reward model: {out_dir / 'reward_model'}")
  return summary


def _prepare_rm_dir(cfg: config_lib.Config, rmc: RewardModelTrainingConfig, start_over: bool) -> None:
  """--rm_dir before anything is written there: its checkpoints removed on `start_over` (--rm_overwrite), the
  logs' inputs checked, then the directory and its `config.json`."""
  out_dir = pathlib.Path(rmc.rm_dir)
  if start_over:
    shutil.rmtree(out_dir / CHECKPOINTS)
  logs.check(out_dir, cfg.run)  # a missing wandb or a damaged id file is named before anything is written
  out_dir.mkdir(parents=True, exist_ok=True)
  (out_dir / "config.json").write_text(json.dumps({**cfg.flat(), **dataclasses.asdict(rmc)}, indent=2,
                                                  default=str))


def _init_reward_model(cfg: config_lib.Config, rmc: RewardModelTrainingConfig, params, model_config, key):
  """The reward model's initial parameters and model config: on the policy (`params`, `model_config`) or
  --rm_init's backbone, with a score head for --rm_score and, with --rm_lora_rank, adapters on the backbone."""
  if rmc.rm_init:
    params, model_config = _load_backbone(rmc.rm_init, model_config, cfg.model)
  if rmc.rm_score == "loglik" and not model_config.tie_word_embeddings:
    raise RunError(f"--rm_score=loglik needs a backbone whose output layer is its embedding table; "
                   f"{rmc.rm_init or pathlib.Path(rmc.policy)} has an untied lm_head, which a reward model does not "
                   f"keep")
  rm_params = rm.init_reward_params(params, model_config, jax.random.fold_in(key, 3), score=rmc.rm_score)
  if rmc.rm_lora_rank:  # adapters on the backbone: from exactly the loaded model, its base weights as loaded
    rm_params, model_config = rm.adapters.add(rm_params, model_config, jax.random.fold_in(key, 4),
                                              rank=rmc.rm_lora_rank, alpha=rmc.rm_lora_alpha)
  return rm_params, model_config


def _train(cfg: config_lib.Config, rmc: RewardModelTrainingConfig, rm_params, model_config, labelled: _Labelled,
           logger, recorded: dict, signals: preemption.StopSignals | None):
  """TRAIN: `_fit` with the train states checkpointed under `<rm_dir>/checkpoints`; a run that fails or is
  interrupted closes its logs (and finishes its W&B run), as the loop's does."""
  ckpt = stage_checkpoints.StageCheckpoints(pathlib.Path(rmc.rm_dir) / CHECKPOINTS, cfg.run.keep_checkpoints, logger,
                                            recorded, lambda then, step: _check_flags(then, recorded, step),
                                            "reward-model training", signals)
  try:
    return _fit(cfg, rmc, rm_params, model_config, labelled, logger, ckpt)
  except BaseException:
    logger.close()
    raise
  finally:
    ckpt.close()


def _evaluate_trained(cfg: config_lib.Config, rmc: RewardModelTrainingConfig, params, model_config,
                      labelled: _Labelled, logger) -> tuple[dict, dict]:
  """The trained model's held-out metrics (logged, then `logger` closed, and printed) and its fit to its training
  samples."""
  prompt_len = labelled.train.tokens.shape[1] - cfg.rollout.max_new_tokens
  after = rm.evaluate(params, model_config, labelled.held_out, kind=rmc.rm_kind, step_labels=labelled.hidden,
                      prompt_len=prompt_len)
  train_fit = rm.evaluate(params, model_config, labelled.train, kind=rmc.rm_kind, prompt_len=prompt_len)
  logger.log(rmc.rm_steps, after, prefix="eval/")
  logger.close()
  _print_eval("held-out after training", after)
  return after, train_fit


def _summary(rmc: RewardModelTrainingConfig, params, labelled: _Labelled, step_labels: str, before: dict,
             after: dict, train_fit: dict, times: dict) -> dict:
  """What `summary.json` records: the reward model, its data, held-out metrics before and after, its fit to its
  training samples, the times, the code's commit."""
  train_data, held_out = labelled.train, labelled.held_out
  mixed, problems = _mixed_problems(train_data)
  return {"kind": rmc.rm_kind, "loss": rmc.rm_loss, "score": rmc.rm_score,
          **({"alpha": float(params["alpha"])} if "alpha" in params else {}),
          "frozen_backbone": rmc.rm_freeze_backbone, "lora_rank": rmc.rm_lora_rank,
          "backbone": rmc.rm_init or str(pathlib.Path(rmc.policy)),
          "step_labels": "outcome" if rmc.rm_kind in rm.OUTCOME_KINDS else step_labels,
          "train_completions": int(train_data.tokens.shape[0]), "eval_completions": int(held_out.tokens.shape[0]),
          "train_answer_accuracy": float(train_data.outcome.mean()),
          "train_problems": problems, "train_mixed_problems": mixed,
          "eval_answer_accuracy": float(held_out.outcome.mean()),
          **{f"before/{k}": v for k, v in before.items()}, **{f"after/{k}": v for k, v in after.items()},
          **{f"train/{k}": v for k, v in train_fit.items()}, **times, "code_version": git_commit.head_commit()}


def _check(cfg: config_lib.Config, rmc: RewardModelTrainingConfig) -> None:
  """The flags this runner refuses, and its output directory's guard (RunError or ConfigError with one line)."""
  for name in UNREAD:
    config_lib.refuse_unread(cfg, (name,), "train_reward_model", INSTEAD.get(name, ""))
  if cfg.mesh.mesh or cfg.mesh.coordinator_address or (cfg.mesh.num_processes or 1) > 1:
    raise RunError("train_reward_model runs on one device in one process; leave --mesh and the multi-process "
                   "flags empty")
  if not rmc.policy:
    raise RunError("--policy is required: the HF directory of the policy that samples the data")
  model_dir = pathlib.Path(rmc.rm_dir) / "reward_model"
  if model_dir.exists() and not rmc.rm_overwrite:
    raise RunError(f"{model_dir} already exists; pass --rm_overwrite or choose another --rm_dir")
  resume_lib.check_start([pathlib.Path(rmc.rm_dir) / CHECKPOINTS], cfg.run.resume, directory_flag="--rm_dir",
                         overwrite_flag="--rm_overwrite", overwrite=rmc.rm_overwrite)


def _step_labels(cfg: config_lib.Config, rmc: RewardModelTrainingConfig) -> str:
  """--rm_step_labels resolved: auto is exact on the synthetic task, else mc_hard."""
  step_labels = rmc.rm_step_labels
  if step_labels == "auto":
    step_labels = "exact" if cfg.task.task in config_lib.SYNTHETIC_TASKS else "mc_hard"
  if rmc.rm_kind == "prm" and step_labels == "exact" and cfg.task.task not in config_lib.SYNTHETIC_TASKS:
    raise RunError(f"--rm_step_labels=exact needs the synthetic task; --task={cfg.task.task} has no step "
                   "truth (use mc_hard or mc_soft)")
  return step_labels


def _collect_labelled(cfg: config_lib.Config, rmc: RewardModelTrainingConfig, labelled: _Labelled | None, params,
                      model_config, task, key, step_labels: str, recorded: dict,
                      signals: preemption.StopSignals | None) -> _Labelled:
  """COLLECT: the checkpoint's labelled samples (`labelled`, on --resume), or the policy's, sampled and saved (then
  `preemption.Interrupted` if a stop signal came meanwhile); a line of their statistics."""
  ckpt_dir = pathlib.Path(rmc.rm_dir) / CHECKPOINTS
  if labelled is not None:
    print(f"resumed: the labelled samples from {ckpt_dir / DATA}", file=sys.stderr)
  else:
    labelled = _sample(cfg, rmc, params, model_config, task, key, step_labels)
    _save_data(ckpt_dir, recorded, *labelled)
    if signals is not None and signals.stop_requested():
      raise preemption.Interrupted(signals.signum, 0, "reward-model training", ckpt_dir)
  train_data = labelled.train
  label_rate = float(train_data.labels[train_data.loss_mask].mean())
  mixed, problems = _mixed_problems(train_data)
  print(f"{train_data.tokens.shape[0]} training / {labelled.held_out.tokens.shape[0]} held-out completions, "
        f"{int(train_data.loss_mask.sum())} scored positions, {100 * label_rate:.1f}% labelled right, "
        f"{100 * float(train_data.outcome.mean()):.1f}% right answers, {mixed} of {problems} problems with both "
        f"right and wrong samples ({labelled.collect_time:.0f} s)", file=sys.stderr)
  return labelled


def _sample(cfg: config_lib.Config, rmc: RewardModelTrainingConfig, params, model_config, task, key,
            step_labels: str) -> _Labelled:
  """COLLECT: the policy's completions of --rm_prompts training and --rm_eval_prompts held-out problems,
  labelled."""
  t0 = time.time()
  train_examples = [task.train_example(i) for i in range(min(rmc.rm_prompts, len(task.rl_pool)))]
  eval_examples = task.test[:rmc.rm_eval_prompts]
  print(f"sampling {rmc.rm_samples_per_prompt} completions for {len(train_examples)} training and "
        f"{len(eval_examples)} held-out problems from {pathlib.Path(rmc.policy)} ({rmc.rm_kind}, labels: "
        f"{'outcome' if rmc.rm_kind in rm.OUTCOME_KINDS else step_labels})", file=sys.stderr)
  train_data, _ = _collect(cfg, rmc, params, model_config, task, train_examples, jax.random.fold_in(key, 1),
                           step_labels)
  eval_data, eval_texts = _collect(cfg, rmc, params, model_config, task, eval_examples, jax.random.fold_in(key, 2),
                                   step_labels)
  hidden = None  # orm_steps on the synthetic task: exact step labels, never trained on, to check its step scores
  if rmc.rm_kind == "orm_steps" and cfg.task.task in config_lib.SYNTHETIC_TASKS:
    repeated = [e for e in eval_examples for _ in range(rmc.rm_samples_per_prompt)]
    hidden, hidden_mask = positions.pad_segments(rm.exact_step_labels(eval_texts, repeated), rmc.rm_max_steps,
                                                 np.float32)
    if not np.array_equal(hidden_mask, eval_data.loss_mask):
      raise RunError("exact step labels and the held-out completions' segments disagree in number")
  metrics = pathlib.Path(rmc.rm_dir) / "metrics.jsonl"
  return _Labelled(train_data, eval_data, hidden, time.time() - t0, metrics.stat().st_size if metrics.is_file() else 0)


def _fit(cfg: config_lib.Config, rmc: RewardModelTrainingConfig, rm_params, model_config, labelled: _Labelled,
         logger, ckpt: stage_checkpoints.StageCheckpoints):
  """TRAIN: --rm_steps optimiser steps (continued from `ckpt` on --resume), held-out evaluation every
  --rm_eval_every, a checkpoint every --save_every; returns `(train state, held-out metrics before, train time)`."""
  # --lr_schedule (cosine: the flag is not read here) after a tenth of the steps' warm-up
  optimizer = optimizer_lib.make_optimizer(cfg.optim, rmc.rm_learning_rate, max(rmc.rm_steps, 1),
                                           min(cfg.optim.warmup_steps, rmc.rm_steps // 10))
  if rmc.rm_freeze_backbone:
    optimizer = rm.frozen_backbone_optimizer(optimizer)
  elif rmc.rm_lora_rank:
    optimizer = rm.adapters.optimizer(optimizer)
  prompt_len = labelled.train.tokens.shape[1] - cfg.rollout.max_new_tokens  # the padded prompt, then the completion
  state = training.init_train_state(rm_params, optimizer)
  train_step = rm.make_reward_train_step(model_config, optimizer, kind=rmc.rm_kind, loss=rmc.rm_loss,
                                         prompt_len=prompt_len, freeze_backbone=rmc.rm_freeze_backbone)
  evaluate = lambda params: rm.evaluate(params, model_config, labelled.held_out, kind=rmc.rm_kind,  # noqa: E731
                                        step_labels=labelled.hidden, prompt_len=prompt_len)
  done, before = 0, None
  if cfg.run.resume and ckpt.latest_step() is not None:  # records after the checkpoint: logged again
    state, meta = ckpt.restore(state)
    done, before = int(meta["step"]), meta["before"]
  elif cfg.run.resume:
    logger.rewind(labelled.metrics_offset)  # the samples' checkpoint: the records of any training steps after it
  if not done:
    before = evaluate(state.params)
    logger.log(0, before, prefix="eval/")
    _print_eval("held-out before training", before)
  logger.start(rmc.rm_steps)

  def log(step, values):
    values = logger.log(step, values, prefix="train/")
    logger.progress(step, f"loss {values['train/loss']:.4f} acc {values['train/accuracy']:.3f}")

  t0 = time.time()
  block = rmc.rm_samples_per_prompt if rmc.rm_loss == "pairwise" else 1
  every = rmc.rm_eval_every or rmc.rm_steps
  save_every = cfg.run.save_every or rmc.rm_steps
  while done < rmc.rm_steps:  # chunks end at every logged step, evaluation and save: the same on --resume
    end = min(rmc.rm_steps, *((done // n + 1) * n for n in (LOG_EVERY, every, save_every)))
    state, _ = rm.fit(state, train_step, labelled.train, steps=end - done, batch_size=rmc.rm_batch_size,
                      seed=cfg.run.seed, start=done, block=block, log_every=LOG_EVERY, log=log)
    done = end
    if done == rmc.rm_steps:
      break
    if done % every == 0:
      logger.newline()
      values = evaluate(state.params)
      logger.log(done, values, prefix="eval/")
      _print_eval(f"held-out at step {done}", values)
    interrupted = ckpt.stop_requested()
    if done % save_every == 0 or interrupted:
      ckpt.save(done, state, {"before": {k: float(v) for k, v in before.items()}}, interrupted=interrupted)
  logger.newline()
  return state, before, time.time() - t0


def _summary_rows(summary: dict, before: dict, after: dict, train_fit: dict) -> list[tuple[str, str]]:
  """The closing table: held-out accuracy and AUC before -> after, the within-problem AUC, the times."""
  rows = [("held-out completions", f"{summary['eval_completions']}"),
          ("policy answer accuracy (held-out samples)", f"{100 * summary['eval_answer_accuracy']:.1f}%")]
  for level in ("outcome", "step"):
    if f"{level}/auc" in after:
      rows += [(f"{level} accuracy, before -> after", f"{100 * before[f'{level}/accuracy']:.1f}% -> "
                f"{100 * after[f'{level}/accuracy']:.1f}% (majority class "
                f"{100 * max(after[f'{level}/positive_rate'], 1 - after[f'{level}/positive_rate']):.1f}%)"),
               (f"{level} AUC, before -> after", f"{before[f'{level}/auc']:.3f} -> {after[f'{level}/auc']:.3f}")]
  rows.append(("outcome AUC within problems, before -> after",
               f"{before['outcome/group_auc']:.3f} -> {after['outcome/group_auc']:.3f} "
               f"({int(after['outcome/group_pairs'])} right/wrong pairs; what GRPO sees)"))
  mixed, problems = summary["train_mixed_problems"], summary["train_problems"]
  rows.append(("the same on its training samples", f"{train_fit['outcome/group_auc']:.3f} ({mixed} of {problems} "
               "training problems have both right and wrong samples; far above the held-out value: memorised, "
               "not learnt)"))
  rows.append(("wall time", f"{summary['time_total_s']:.0f} s (sampling and labels {summary['time_collect_s']:.0f} "
               f"s, training {summary['time_train_s']:.0f} s)"))
  return rows


def config_from_flags() -> tuple[config_lib.Config, RewardModelTrainingConfig]:
  """The shared config and this runner's, from the parsed flags."""
  return (cli.config_from_flags(),
          RewardModelTrainingConfig(**{f.name: FLAGS[f.name].value
                                       for f in dataclasses.fields(RewardModelTrainingConfig)}))


def _job(cfg: config_lib.Config) -> dict:
  """The command line's run: `--rm_dir` locked while it runs (`work_dir_lock`), SIGTERM / SIGINT noted."""
  rmc = config_from_flags()[1]
  with work_dir_lock.WorkDirLock(rmc.rm_dir, flag="--rm_dir"), preemption.StopSignals() as signals:
    return run(cfg, rmc, signals)


main = cli.main_for("train_reward_model", _job)


if __name__ == "__main__":
  app.run(main)
