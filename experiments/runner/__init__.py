"""The pieces below the methods: the typed config, the task, device placement, the start policy and exports,
evaluation, stage 1, the run scaffolding every runner shares (the checkpoint-directory guard and resume checks,
a stage's checkpoints, the logs, the optimiser), preemption, the work-dir lock, profiling and the terminal report.
Methods (`experiments.methods`) import these; the trainer above them (`experiments.trainer`) runs the methods; the
entry modules (`experiments/*.py`) only turn flags into a `Config` and call the trainer
(`tests/test_import_layers.py`)."""
