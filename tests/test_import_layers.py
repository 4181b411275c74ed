"""The packages' imports form layers: no cycles, each module imports only its own layer or lower.

Every `import` and `from ... import` of every grpo_jax (and experiments) module is read with `ast`, at
top level and inside functions alike, relative imports resolved. An edge M -> X means
that importing M may execute X: the imported module and each of its parent packages
that is not already a parent of M (a parent of M is initialised before M runs).
"""

import ast
import pathlib
import subprocess
import sys

import pytest

import grpo_jax

PACKAGE = "grpo_jax"
ROOT = pathlib.Path(grpo_jax.__file__).parent
EXPERIMENTS = ROOT.parent / "experiments"

# Module (or package prefix) -> layer; a module may import only its own layer or lower.
# The longest matching prefix decides, so a module can sit below its package.
LAYERS = {
    # 0: arrays and text in, arrays and text out: tasks and answers, losses, the model, the state type, noise.
    "grpo_jax.data": 0,
    "grpo_jax.losses": 0,
    "grpo_jax.models": 0.9,  # the package (its public API) above its modules, whose own order is:
    "grpo_jax.models.config": 0.0,  # the architecture
    "grpo_jax.models.presets": 0.05,  # named shapes (configs)
    "grpo_jax.models.params": 0.1,  # the params dict and its layouts
    "grpo_jax.models.tokenizer": 0.1,
    "grpo_jax.models.logical_axes": 0.2,  # axis names of parameters and activations
    "grpo_jax.models.kv_cache": 0.3,
    "grpo_jax.models.rope": 0.3,
    "grpo_jax.models.random_init": 0.3,
    "grpo_jax.models.attention": 0.4,  # the attention seam, decode attention included
    "grpo_jax.models.layers": 0.5,  # projections, norms, attention and MLP modules, the decoder block
    "grpo_jax.models.transformer": 0.6,  # the decoder and its functional API
    "grpo_jax.models.hf_io": 0.7,  # built on the model: checkpoints, LoRA, scalar heads, the tiny default
    "grpo_jax.models.lora": 0.7,
    "grpo_jax.models.heads": 0.7,
    "grpo_jax.models.tiny": 0.7,
    "grpo_jax.distributed": 0,
    "grpo_jax.host_memory": 0,
    "grpo_jax.train_state": 0,
    "grpo_jax.gumbel_rows": 0,
    "grpo_jax.absent_tpu": 0,
    "grpo_jax.chips": 0,
    "grpo_jax.placed": 0,  # a placed call and its program  # chips' published figures (memory, peak FLOP/s)
    # 1: rule rewards (of data's examples); meshes, rules and placement (of models' params, the state); row
# chunks.
    "grpo_jax.rewards": 1,
    "grpo_jax.partitioning": 1,
    "grpo_jax.row_chunks": 1,  # forwards over row chunks (of a model's config)
    "grpo_jax.length_buckets": 1,  # rows sorted by length into micro-batches (arrays only)
    # 2: running the model: sampling (static, and the continuous-batching engine) and log-probs.
    "grpo_jax.sampling": 2,
    "grpo_jax.rollout_engine": 2,
    "grpo_jax.logprobs": 2,
    # 3: batches, objectives, the update step, checkpoints, logs.
    "grpo_jax.training": 3,
    # 4: what is built from training: evaluation, reward models, agents.
    "grpo_jax.evaluation": 4,
    "grpo_jax.reward_models": 4,
    "grpo_jax.agents": 4,
    # 5: the package itself.
    "grpo_jax": 5,
}

# Imported names the library must never reach (runners and flag parsing live above it).
FORBIDDEN = ("experiments", "absl.flags", "scripts", "tests")

# The same for experiments/ (the library, grpo_jax, lies below all of it).
EXPERIMENTS_LAYERS = {
    # 0: below the methods: the config, task, placement, policy, evaluation, stage 1, resume, preemption, the
    # lock, profiling, the report; and the studies (data: runs, metrics, claims).
    "experiments.runner": 0,
    "experiments.studies": 0,
    # 1: the methods, each a data source and a gradient coefficient over the runner's pieces.
    "experiments.methods": 1,
    # 2: the trainer: the loop that runs a method, its update plan, a run's compiled programs.
    "experiments.trainer": 2,
    # 3: flags into a Config, process start.
    "experiments.cli": 3,
    # 4: the entry modules (`python -m experiments.<name>`) and the package itself.
    "experiments": 4,
}
# The names experiments/ must never import: the scripts and tests use it, never the other way round.
EXPERIMENTS_FORBIDDEN = ("scripts", "tests")


def _module_name(path: pathlib.Path, root: pathlib.Path = ROOT) -> str:
  parts = list(path.relative_to(root.parent).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


def _modules(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
  return {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _imported_names(module: str, is_package: bool, tree: ast.AST):
  """Absolute dotted names imported anywhere in `tree` (`from a import b` yields `a.b` and `a`)."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        yield alias.name
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
      else:
        prefix = node.module
      yield prefix
      for alias in node.names:
        yield f"{prefix}.{alias.name}"


def _resolve(name: str, known) -> str | None:
  """The longest prefix of `name` that is a module of the package."""
  parts = name.split(".")
  for i in range(len(parts), 0, -1):
    if ".".join(parts[:i]) in known:
      return ".".join(parts[:i])
  return None


def _parents(name: str) -> list[str]:
  parts = name.split(".")
  return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(root: pathlib.Path = ROOT) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
  """(edges between the modules of the package at `root`, every absolute name each module imports)."""
  modules = _modules(root)
  edges, names = {}, {}
  for module, path in modules.items():
    tree = ast.parse(path.read_text(), filename=str(path))
    imported = set(_imported_names(module, path.name == "__init__.py", tree))
    names[module] = imported
    own = set(_parents(module)) | {module}
    targets = set()
    for name in imported:
      target = _resolve(name, modules)
      if target is None:
        continue
      targets.update(m for m in _parents(target) + [target] if m not in own)
    edges[module] = targets
  return edges, names


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """A cycle of `graph` as a path [a, b, ..., a], or None."""
  done, stack, on_stack = set(), [], set()

  def visit(node):
    stack.append(node)
    on_stack.add(node)
    for nxt in sorted(graph.get(node, ())):
      if nxt in on_stack:
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in done:
        found = visit(nxt)
        if found:
          return found
    stack.pop()
    on_stack.discard(node)
    done.add(node)
    return None

  for node in sorted(graph):
    if node not in done:
      found = visit(node)
      if found:
        return found
  return None


def layer_of(module: str, layers=LAYERS) -> int | None:
  match = _resolve(module, layers)
  return None if match is None else layers[match]


def layer_violations(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
  """Edges from a module to a module of a higher layer."""
  return [f"{a} (layer {layer_of(a, layers)}) imports {b} (layer {layer_of(b, layers)})"
          for a in sorted(graph) for b in sorted(graph[a]) if layer_of(b, layers) > layer_of(a, layers)]


# The checkers themselves, on hand-made graphs.


def test_find_cycle_reports_the_path():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
  cycle = find_cycle(graph)
  assert cycle is not None and cycle[0] == cycle[-1]
  assert set(cycle) == {"a", "b", "c"} and len(cycle) == 4


def test_find_cycle_self_loop_and_acyclic():
  assert find_cycle({"a": {"a"}}) == ["a", "a"]
  assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None  # a diamond is no cycle


def test_layer_violations_on_hand_made_graph():
  layers = {"p": 2, "p.low": 0, "q": 1}
  graph = {"p.low": {"q"}, "q": {"p.low"}, "p.high": {"q"}}
  assert layer_violations(graph, layers) == ["p.low (layer 0) imports q (layer 1)"]


def test_function_local_and_relative_imports_are_edges(tmp_path):
  source = "import os\ndef f():\n  from .sibling import thing\n  import grpo_jax.models.config\n"
  names = set(_imported_names("grpo_jax.training.x", False, ast.parse(source)))
  assert {"grpo_jax.training.sibling.thing", "grpo_jax.training.sibling", "grpo_jax.models.config"} <= names


# The package.


def test_graph_covers_the_package():
  edges, _ = import_graph()
  assert "grpo_jax.training.update" in edges
  assert "grpo_jax.logprobs" in edges["grpo_jax.training.update"]


def test_no_import_cycle():
  edges, _ = import_graph()
  cycle = find_cycle(edges)
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_has_a_layer():
  edges, _ = import_graph()
  assert [m for m in edges if layer_of(m) is None] == []


def test_modules_import_only_their_layer_or_lower():
  edges, _ = import_graph()
  assert layer_violations(edges) == []


def test_every_model_module_has_its_own_layer():
  """Each module of `grpo_jax.models` is placed in the model's own order, not only by the package's entry."""
  edges, _ = import_graph()
  models = [m for m in edges if m.startswith("grpo_jax.models.")]
  assert "grpo_jax.models.kv_cache" in models and [m for m in models if m not in LAYERS] == []


@pytest.mark.parametrize("forbidden", FORBIDDEN)
def test_library_never_imports_runners_or_flags(forbidden):
  _, names = import_graph()
  bad = sorted(m for m, imported in names.items()
               if any(n == forbidden or n.startswith(forbidden + ".") for n in imported))
  assert bad == [], f"{bad} import {forbidden}"


# experiments/: runner and studies < methods < trainer < cli < the entry modules.


def test_experiments_graph_covers_the_package():
  edges, _ = import_graph(EXPERIMENTS)
  assert "experiments.trainer.loop" in edges["experiments.cli"]
  assert {"experiments.methods", "experiments.trainer.plan"} <= edges["experiments.trainer.loop"]
  assert "experiments.runner.config" in edges["experiments.methods.base"]


def test_experiments_has_no_import_cycle():
  edges, _ = import_graph(EXPERIMENTS)
  cycle = find_cycle(edges)
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_experiments_module_has_a_layer():
  edges, _ = import_graph(EXPERIMENTS)
  assert [m for m in edges if layer_of(m, EXPERIMENTS_LAYERS) is None] == []


def test_experiments_modules_import_only_their_layer_or_lower():
  edges, _ = import_graph(EXPERIMENTS)
  assert layer_violations(edges, EXPERIMENTS_LAYERS) == []


def test_a_wrong_direction_import_is_found(tmp_path):
  """The checker on a copy of experiments/ where the runner imports the trainer (and a method the cli): both are
  named, and nothing else."""
  copy = tmp_path / "experiments"
  for path in EXPERIMENTS.rglob("*.py"):
    (copy / path.relative_to(EXPERIMENTS)).parent.mkdir(parents=True, exist_ok=True)
    (copy / path.relative_to(EXPERIMENTS)).write_text(path.read_text())
  for name, line in (("runner/task.py", "from experiments.trainer import plan"),
                     ("methods/sft.py", "from experiments import cli")):
    (copy / name).write_text((copy / name).read_text() + f"\ndef _up():\n  {line}\n")
  edges, _ = import_graph(copy)
  assert layer_violations(edges, EXPERIMENTS_LAYERS) == [
      "experiments.methods.sft (layer 1) imports experiments.cli (layer 3)",
      "experiments.runner.task (layer 0) imports experiments.trainer (layer 2)",
      "experiments.runner.task (layer 0) imports experiments.trainer.plan (layer 2)"]


def test_entry_modules_do_not_import_each_other():
  """An entry module (`python -m experiments.<name>`) imports cli and the layers below, never another entry."""
  edges, _ = import_graph(EXPERIMENTS)
  entries = {m for m in edges if m.count(".") == 1 and layer_of(m, EXPERIMENTS_LAYERS) == 4}
  assert {"experiments.grpo_math", "experiments.train_reward_model"} <= entries
  assert {m: sorted(edges[m] & entries) for m in entries if edges[m] & entries} == {}


@pytest.mark.parametrize("forbidden", EXPERIMENTS_FORBIDDEN)
def test_experiments_never_import_scripts_or_tests(forbidden):
  _, names = import_graph(EXPERIMENTS)
  bad = sorted(m for m, imported in names.items()
               if any(n == forbidden or n.startswith(forbidden + ".") for n in imported))
  assert bad == [], f"{bad} import {forbidden}"


def test_reproduce_imports_no_jax():
  """The study orchestrator reads the runners' defaults (Flow-GRPO's preset too) as data: no method, no JAX."""
  code = ("import sys, experiments.reproduce.__main__; "
          "print(sorted(m for m in sys.modules if m.split('.')[0] == 'jax' or m.startswith('experiments.methods')))")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT.parent, capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"
