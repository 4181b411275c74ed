"""The later GRPO variants side by side, and the KL estimator and coefficient, on the same seeds."""

import dataclasses

from experiments.studies import common
from experiments.studies.spec import Contrast, Panel, Plot, Study

VARIANTS = ("grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp")
KL = ("grpo", "kl_k1", "kl_k2", "no_kl")
# The policy terms differ only once the ratio leaves 1: these three take 4 optimiser steps per collected batch.
POLICY = ("grpo_mb4", "cispo", "sapo")
ENTROPY = ("grpo", "entropy_bonus", "forking_tokens")
NEW = POLICY + ENTROPY[1:]
MB4 = dict(minibatch_size=64, quick={"minibatch_size": 32})  # a quarter of B·G (256; quick 128)

STUDY = Study(
    name="variants",
    title=("GRPO and its later variants (Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++, CISPO, SAPO, entropy bonus, "
           "forking tokens), KL estimators k1/k2/k3 and β"),
    description=(
        "All from the seed's SFT policy with the same samples per step; each differs from GRPO (k3 KL, β = 0.04, "
        "group-std advantages, seq-mean-token-mean) only in the flags named. Dr. GRPO: no std division, token "
        "sums over a constant. DAPO: clip-higher (ε_high 0.28), token-mean, dynamic sampling, overlong shaping "
        "(8-token buffer), no KL. GSPO: sequence-level importance ratio (the runner's ε = 0.2, not the paper's "
        "3e-4). RLOO: the leave-one-out baseline in place of the group normalisation. REINFORCE++: k1 KL in the "
        "per-token reward, returns whitened over the batch, no KL in the loss. KL: the estimator in GRPO's loss "
        "at β = 0.04, and β = 0 (no reference). CISPO (weight cap 5, TRL's recommendation after ScaleRL) and SAPO "
        "(τ 1.0 / 1.05) against GRPO with the same 4 optimiser steps per batch (GRPO, 4 minibatches): on-policy, "
        "with one step per batch, all three have GRPO's gradient. Entropy bonus: c = 0.001. Forking tokens: the "
        "policy gradient on the top 20% of each batch's tokens by entropy (Beyond the 80/20 rule)."),
    runs=(
        common.SFT,
        common.rl("grpo", "GRPO (k3, β = 0.04)"),
        common.rl("dr_grpo", "Dr. GRPO", loss_aggregation="seq-mean-token-sum-norm", advantage_scale="none"),
        common.rl("dapo", "DAPO", epsilon_high=0.28, loss_aggregation="token-mean", dynamic_sampling=True,
                  overlong_buffer=8, beta=0.0),
        common.rl("gspo", "GSPO", importance="sequence"),
        common.rl("rloo", "RLOO", advantage_estimator="rloo"),
        common.rl("reinforce_pp", "REINFORCE++", advantage_estimator="reinforce_pp"),
        common.rl("kl_k1", "GRPO, k1 KL", kl="k1"),
        common.rl("kl_k2", "GRPO, k2 KL", kl="k2"),
        common.rl("no_kl", "GRPO, β = 0", beta=0.0),
        common.rl("grpo_mb4", "GRPO, 4 minibatches", **MB4),
        common.rl("cispo", "CISPO", loss="cispo", epsilon_high=4.0, **MB4),
        common.rl("sapo", "SAPO", loss="sapo", **MB4),
        common.rl("entropy_bonus", "GRPO + entropy bonus", entropy_coef=0.001),
        common.rl("forking_tokens", "GRPO, top-20% entropy tokens", top_entropy_quantile=0.2),
    ),
    metrics=tuple(dataclasses.replace(m, runs=VARIANTS + KL[1:] + NEW)
                  for m in (common.ACCURACY, common.START, common.FINAL, common.GAIN)),
    plots=(
        Plot("variants.png", (Panel("accuracy", VARIANTS, title="GRPO, Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++"),
                              Panel("accuracy", KL, title="KL estimator (β = 0.04) and β = 0"),
                              Panel("accuracy", POLICY, title="policy terms, 4 minibatches a step"),
                              Panel("accuracy", ENTROPY, title="entropy bonus and forking tokens")),
             title="GRPO variants: held-out greedy accuracy against RL steps", xlabel="RL step"),
        Plot("gain.png", (Panel("gain", VARIANTS + KL[1:] + NEW, title="gain over the SFT policy", ylabel="points"),),
             x="run", title="Held-out accuracy gain of each variant over its SFT start"),
    ),
    contrasts=(tuple(Contrast(name, "grpo", "final") for name in VARIANTS[1:] + KL[1:] + ("grpo_mb4",) + ENTROPY[1:])
               + tuple(Contrast(name, "grpo_mb4", "final") for name in POLICY[1:])),
    profiles={"quick": common.QUICK},
    notes={"quick": common.QUICK_NOTE},
)
