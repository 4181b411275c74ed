r"""Flow-GRPO: a multi-turn planner with tools and memory, trained on a broadcast outcome reward.

  python -m experiments.flow_grpo                        # embedded default: tiny model, synthetic task, CPU
  python -m experiments.flow_grpo --flagfile=experiments/configs/flow_grpo.cfg

AgentFlow (arXiv 2510.05592), as the method `flow_grpo` of the one training loop (`experiments/methods/
flow_grpo.py` says how the planner, tools, memory and eq. 5 fit together). This entry point is
`python -m experiments.grpo_math --algo=flow_grpo` with Flow-GRPO's own defaults (`runner.config.PRESETS["flow_grpo"]`:
a shorter SFT on teacher trajectories, 60 steps of 16 queries x 8 trajectories at lr 5e-5); the agent's flags
(--max_turns, --tools, ...) and every shared flag are accepted, GRPO-only knobs that mean nothing for the per-turn
objective are refused unless at their defaults; --planner_objective picks stage 2's update of the planner.
From Python:

  from experiments.runner import config
  from experiments.trainer import loop
  loop.run(config.Config().replace(**config.PRESETS["flow_grpo"]))
"""

from absl import app
from absl import flags

from experiments import cli
from experiments.runner import config as config_lib
from experiments.trainer import loop

FLAGS = flags.FLAGS
RunError = config_lib.RunError
# The flag defaults set when run as a program.
DEFAULTS = {k: v for k, v in config_lib.PRESETS["flow_grpo"].items() if k != "algo"}


def run() -> dict:
  """The Flow-GRPO run of the parsed flags (for tests that parse flags themselves)."""
  _refuse_algo()
  return _train(cli.config_from_flags(algo="flow_grpo"))


def _train(config: config_lib.Config) -> dict:
  return loop.run(config)


def _refuse_algo():
  if FLAGS["algo"].present:
    raise RunError("--algo: this runner trains Flow-GRPO; use experiments.grpo_math for the other methods")


def main(argv):
  try:
    _refuse_algo()
  except RunError as err:
    raise SystemExit(f"flow_grpo: error: {err}") from None
  cli.main_for("flow_grpo", job=_train, algo="flow_grpo")(argv)


if __name__ == "__main__":
  for _name, _value in DEFAULTS.items():
    FLAGS.set_default(_name, _value)
  app.run(main)
