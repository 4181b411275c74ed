"""DeepSeekMath Fig 6: iterative RL with a learned reward model against one round of the same length."""

import dataclasses

from experiments.studies import common
from experiments.studies.spec import TRAIN_REWARD_MODEL, Claim, Contrast, Metric, Panel, Plot, Run, Study

RL_RUNS = ("grpo", "one_round", "iterative")

STUDY = Study(
    name="iterative",
    title="DeepSeekMath Fig 6: iterative RL (reward model retrained, reference reset) vs one round",
    description=(
        "GRPO+OS with a learned outcome reward model (`orm_steps`: an ORM read at every step end and pooled by a "
        "noisy-AND, plus α times its backbone's log-likelihood of the completion (`--rm_score=loglik`, the backbone "
        "frozen, the head and α trained with the within-problem pairwise loss on outcome labels of SFT samples), "
        "advantages normalised by the group's std as in the paper (the score ranks but is not calibrated: its "
        "spread within a group is a few hundredths, so unnormalised advantages would be that small), from the "
        "seed's SFT "
        "policy: once for all steps, and iteratively (Algorithm 1, I = 2: after each half the reward model "
        "retrains on fresh samples of the current policy plus 10% replay, and the reference becomes the "
        "policy), the same total policy steps. The rule-reward GRPO of the same seed is drawn for comparison. "
        "The reward model starts from a stronger backbone, the verifier (the same tiny model SFT-trained on 18,000 "
        "solutions for 2,000 steps): started from the policy's own backbone it ranked a problem's samples at chance "
        "(docs/reward_models.md, 'Why the outcome reward model ranked within problems at chance'); with a head "
        "alone on the verifier it ranked at 0.70 ± 0.08 within problems, with the log-likelihood term at 0.75 or "
        "more (quick profile, 3 seeds; docs/reward_models.md). "
        "The paper: iterating helps, most in the first iteration."),
    runs=(
        common.SFT,
        Run("verifier", {"steps": 0, "eval_every": 0, "sft_examples": 18000, "sft_steps": 2000},
            label="verifier backbone (SFT 2,000 steps on 18,000)"),
        Run("rm", {"policy": "{run:sft}/sft_policy", "rm_init": "{run:verifier}/sft_policy", "rm_kind": "orm_steps",
                   "rm_score": "loglik", "rm_freeze_backbone": True, "rm_loss": "pairwise",
                   "rm_prompts": 8000, "rm_samples_per_prompt": 8, "rm_steps": 3000},
            module=TRAIN_REWARD_MODEL, label="reward model (orm_steps + α · log-likelihood)",
            profiles={"quick": {"rm_prompts": 1000, "rm_steps": 400}}),
        common.GRPO,
        common.rl("one_round", "GRPO+OS, learned ORM, one round", reward="orm",
                  reward_model="{run:rm}/reward_model"),
        common.rl("iterative", "GRPO+OS, learned ORM, iterative (I = 2)", reward="orm",
                  reward_model="{run:rm}/reward_model", iterations=2,
                  steps_per_iteration=100,
                  quick={"steps_per_iteration": common.QUICK_STEPS // 2, "rm_update_prompts": 128,
                         "rm_update_steps": 50}),
    ),
    metrics=(
        Metric("accuracy", "eval/accuracy", source="curve", runs=RL_RUNS,
               label="held-out greedy accuracy"),
        dataclasses.replace(common.CHANGE, runs=RL_RUNS),
        Metric("iteration_accuracy", "iteration/accuracy", source="curve", runs=("iterative",),
               label="held-out accuracy at each iteration's end"),
        *(dataclasses.replace(m, runs=RL_RUNS) for m in (common.START, common.FINAL, common.GAIN)),
        Metric("rm_auc", "after/outcome/auc", runs=("rm",), percent=False, label="reward model AUC"),
        Metric("rm_group_auc", "after/outcome/group_auc", runs=("rm",), percent=False,
               label="reward model AUC within problems"),
        Metric("rm_train_group_auc", "train/outcome/group_auc", runs=("rm",), percent=False,
               label="the same on its training samples"),
    ),
    plots=(
        Plot("fig6.png", (Panel("accuracy", ("one_round", "iterative", "grpo"),
                                title="learned ORM: one round vs iterative; rule reward"),
                          Panel("change", ("one_round", "iterative", "grpo"),
                                title="change since the SFT start, paired by seed", ylabel="points")),
             title="DeepSeekMath Fig 6: iterative RL against one round of the same length", xlabel="RL step"),
    ),
    contrasts=(Contrast("iterative", "one_round", "final"), Contrast("one_round", "grpo", "final")),
    claims=(Claim("Fig 6: iterative RL beats one round of the same length", "iterative - one_round", "final",
                  margin=common.ORDERING_MARGIN),
            Claim("GRPO on the learned ORM raises accuracy over its SFT start", "one_round", "gain"),
            Claim("the learned ORM beside the rule reward (no ordering claimed)", "one_round - grpo", "final", "")),
    profiles={"quick": common.QUICK},
    notes={"quick": common.QUICK_NOTE + " The reward model trains its head and α (the backbone frozen) on 1,000 "
                                        "prompts x 8 SFT samples for 400 steps from the verifier's backbone (full: "
                                        "8,000 x 8, 3,000 steps); each "
                                        "iteration retrains it on 128 prompts x 8 for 50 steps (full: 256 x 8, "
                                        "100 steps)."},
)
