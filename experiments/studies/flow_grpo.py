"""AgentFlow Table 3's analogue: single-turn GRPO against a tool-using planner before and after Flow-GRPO."""

from experiments.studies import common
from experiments.studies.spec import FLOW_GRPO, Claim, Contrast, Metric, Panel, Plot, Run, Study

STUDY = Study(
    name="flow_grpo",
    title="AgentFlow (Table 3 analogue): single-turn GRPO vs a planner with tools, before and after Flow-GRPO",
    description=(
        "The same tiny model, task and held-out set. Single turn: the SFT policy, then GRPO (the default stage "
        "2). Agent: the planner SFT-trained on teacher trajectories (calculator calls) and frozen — AgentFlow's "
        "untrained-planner row, here the start column — then trained with Flow-GRPO (`experiments.flow_grpo`, "
        "its default flags). AgentFlow reports that Flow-GRPO training of the planner beats the frozen planner."),
    runs=(
        common.SFT,
        common.rl("grpo", "single turn: SFT -> GRPO"),
        Run("flow", {}, module=FLOW_GRPO, label="planner with tools: SFT -> Flow-GRPO"),
    ),
    metrics=(
        Metric("start", "start_accuracy", runs=("grpo", "flow"), label="SFT (frozen)"),
        Metric("final", "final_accuracy", runs=("grpo", "flow"), label="after RL"),
        Metric("gain", "final_accuracy", minus="start_accuracy", runs=("grpo", "flow"), label="gain (points)"),
        Metric("start_turns", "start_mean_turns", runs=("flow",), percent=False, label="turns, SFT"),
        Metric("final_turns", "final_mean_turns", runs=("flow",), percent=False, label="turns, after RL"),
        Metric("tool_errors", "final_tool_error_rate", runs=("flow",), label="tool errors after RL"),
    ),
    plots=(
        Plot("agentflow.png", (Panel(("start", "final"), ("grpo", "flow"), title="held-out greedy accuracy",
                                     ylabel="accuracy (%)"),
                               Panel("gain", ("grpo", "flow"), title="gain of RL, paired by seed", ylabel="points")),
             x="run", title="Single-turn GRPO vs a planner with tools (Flow-GRPO)"),
    ),
    contrasts=(Contrast("flow", "grpo", "gain"), Contrast("flow", "grpo", "final")),
    claims=(Claim("AgentFlow: Flow-GRPO beats the frozen planner", "flow", "gain"),
            Claim("the planner with tools beside single-turn GRPO (no ordering claimed here)", "flow - grpo", "final",
                  "")),
    profiles={"quick": common.QUICK},
    notes={"quick": common.QUICK_NOTE},
)
