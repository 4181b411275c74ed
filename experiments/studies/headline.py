"""The README's headline: the default run, unchanged, over five seeds."""

from experiments.studies import common
from experiments.studies.spec import Panel, Plot, Run, Study

STUDY = Study(
    name="headline",
    title="The default run (`python -m experiments.grpo_math`, no flags) over five seeds",
    description=(
        "SFT warm start then GRPO, the runner's defaults; only --seed changes. Held-out greedy accuracy after SFT "
        "and after GRPO, and the gain, per seed and as mean ± standard error."),
    runs=(Run("default", {}, label="default run"),),
    metrics=(common.START, common.FINAL, common.GAIN,
             common.Metric("accuracy", "eval/accuracy", source="curve", label="held-out greedy accuracy")),
    plots=(Plot("headline.png", (Panel("accuracy", title="held-out greedy accuracy"),), xlabel="GRPO step",
                title="The default run over five seeds"),),
    profiles={"quick": {}},
    notes={"quick": "The headline has no quick form: both profiles run the default unchanged."},
    seeds=5,
)
