"""The runner layer's pieces below the training loop: the typed config, the task, device placement, the start
policy and exports, evaluation, stage 1, resume checks. `runner.loop.run(config)` is the one training loop that
every method (`experiments.methods`) plugs into; the entry modules (`experiments/*.py`) only turn flags into a
`Config` and call it."""
