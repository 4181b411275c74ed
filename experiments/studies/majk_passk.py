"""DeepSeekMath Fig 7: Maj@K and Pass@K against K, before (SFT) and after RL (GRPO), the same seed."""

from experiments.studies import common
from experiments.studies.spec import SAMPLE_EVAL, Claim, Contrast, Metric, Panel, Plot, Run, Study

KS = (1, 2, 4, 8, 16, 32, 64)

STUDY = Study(
    name="majk_passk",
    title="DeepSeekMath Fig 7: Maj@K and Pass@K before and after RL",
    description=(
        "The SFT policy of each seed and the GRPO policy trained from it (the default stage 2) each sample 64 "
        "completions per held-out problem at T = 0.7 (`experiments.sample_eval`); Pass@K is the unbiased "
        "estimator from those 64, Maj@K the majority answer of the first K. The paper: RL raises Maj@K but not "
        "Pass@K (it makes the output distribution more robust, not the model more capable)."),
    runs=(
        common.SFT,
        common.GRPO,
        Run("before", {"init_checkpoint": "{run:sft}/sft_policy", "eval_samples": 64}, module=SAMPLE_EVAL,
            label="SFT (before RL)"),
        Run("after", {"init_checkpoint": "{run:grpo}/final_policy", "eval_samples": 64}, module=SAMPLE_EVAL,
            label="GRPO (after RL)"),
    ),
    metrics=(
        Metric("maj@{k}", "maj@{k}", ks=KS, label="Maj@{k}"),
        Metric("pass@{k}", "pass@{k}", ks=KS, label="Pass@{k}"),
        Metric("greedy", "accuracy", runs=("before", "after"), label="greedy accuracy"),
    ),
    plots=(
        Plot("fig7.png", (Panel("maj@{k}", ("before", "after"), title="Maj@K", ylabel="Maj@K (%)"),
                          Panel("pass@{k}", ("before", "after"), title="Pass@K", ylabel="Pass@K (%)")),
             x="k", title="DeepSeekMath Fig 7: Maj@K and Pass@K (T = 0.7) before and after RL"),
    ),
    contrasts=tuple(Contrast("after", "before", f"{m}@{k}") for m in ("maj", "pass") for k in (1, 8, 64)),
    claims=(Claim("Fig 7: RL raises Maj@64", "after - before", "maj@64"),
            Claim("Fig 7: RL raises Maj@8", "after - before", "maj@8"),
            Claim("Fig 7: RL raises Pass@1 (= Maj@1)", "after - before", "pass@1"),
            # "flat": within ±3 points, about 2 binomial standard errors of one seed's Pass@64 (~90%) on 500
            # problems, and a fraction of the Maj@K gains beside it
            Claim("Fig 7: Pass@64 stays flat (within ±3 points)", "after - before", "pass@64", "=", margin=0.03)),
    profiles={"quick": common.QUICK},
    notes={"quick": common.QUICK_NOTE},
)
