"""The layer above the methods: the one training loop (`loop.run(config)`), the update plan it runs by (`plan`)
and the compiled programs of a run (`programs`, for scripts/aot_compile.py). It imports the methods
(`experiments.methods`) and the runner's pieces below them (`experiments.runner`); only `cli` and the entry
modules import it."""
