r"""GRPO (and PPO, SFT, RFT, Online RFT, DPO, Flow-GRPO) on math word problems: SFT warm start, then RL.

  python -m experiments.grpo_math                       # embedded default: tiny model, synthetic task, CPU
  python -m experiments.grpo_math --algo=ppo --batch_size=256   # PPO with a critic, same samples per step
  python -m experiments.grpo_math --flagfile=experiments/configs/deepseekmath_gsm8k.cfg \
      --model=/path/to/Qwen2.5-0.5B-Instruct --train_file=gsm8k/train.jsonl --test_file=gsm8k/test.jsonl

Stage 1 (embedded default only) fine-tunes the random-init tiny model on the task's step-by-step
solutions, because RL needs a policy that is sometimes right. Stage 2 is GRPO as in DeepSeekMath
(arXiv 2402.03300) §4.1: per step, B prompts, G samples each from π_old; rule rewards; group-normalised
advantages; μ epochs of minibatch updates of the clipped surrogate with the k3 KL to the frozen
reference (the stage-1 policy) in the loss. Every knob of the later variants (DAPO, Dr. GRPO, GSPO) is
a flag. `--algo` picks another method of DeepSeekMath's unified paradigm (§5.2.1, Table 10;
`experiments/methods/`): each is a data source and a gradient coefficient over the same sampler,
rewards, update step, evaluation, logging and checkpoints (`experiments/trainer/loop.py`). Policy, value
model, reference and optimiser state are pytrees; checkpoints resume exactly.

This module only turns flags into a `runner.config.Config` (`experiments/cli.py`) and calls
`trainer.loop.run(config)`; the same run from Python:

  from experiments.runner import config
  from experiments.trainer import loop
  loop.run(config.Config().replace(steps=50))
"""

from absl import app

from experiments import cli
from experiments.runner import config as config_lib

RunError = config_lib.RunError


def run(**overrides) -> dict:
  """The run of the parsed flags (for tests and notebooks that parse flags themselves)."""
  return cli.run_from_flags(**overrides)


if __name__ == "__main__":
  app.run(cli.main_for("grpo_math"))
