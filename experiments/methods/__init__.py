"""The runner's training methods, DeepSeekMath's unified paradigm (§5.2.1, Table 10).

  method       data source                    reward   gradient coefficient
  sft          human solutions                -        1
  rft          SFT-policy samples (offline)   rule     1 on the distinct correct ones (a pool, Yuan et al.)
  rft_table10  SFT-policy samples, each step  rule     I(o correct)
  online_rft   current-policy samples         rule     I(o correct)
  dpo          SFT-policy pairs (offline)     rule     σ(β log-ratio margin), ±
  ppo          current-policy samples         rule     GAE advantage A_t (critic)
  grpo         current-policy samples         rule     group-normalised advantage + k3 KL term
  flow_grpo    current-policy trajectories    rule     outcome advantage broadcast to every turn (AgentFlow)
  distill      current-policy samples         teacher  per-token log π_T − log π_old (on-policy distillation)

A new method is one file here (a `base.Method` subclass: `collect` and `objective`, plus the hooks it needs) and
one line in `METHODS`; its name becomes a value of `--algo` once listed in the `algo` field's choices
(`runner.config.AlgorithmConfig`).
"""

from experiments.methods.base import Method
from experiments.methods.distill import Distill
from experiments.methods.dpo import DPO
from experiments.methods.flow_grpo import FlowGRPO
from experiments.methods.grpo import GRPO
from experiments.methods.ppo import PPO
from experiments.methods.rft import RFT, OnlineRFT, Table10RFT
from experiments.methods.rollouts import Rollouts
from experiments.methods.sft import SFT

METHODS = {m.name: m for m in (SFT, RFT, Table10RFT, OnlineRFT, DPO, PPO, GRPO, FlowGRPO, Distill)}

__all__ = ("METHODS", "Method", "Rollouts")
