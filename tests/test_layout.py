"""Where tests live: a module's tests are found by its path (README, "Tests").

`grpo_jax/losses/cispo.py` is tested in `tests/grpo_jax/losses/test_cispo.py`, `experiments/runner/config.py` in
`tests/experiments/runner/test_config.py`, `scripts/aot_compile.py` in `tests/scripts/test_aot_compile.py`. A
test file of a folder names a module of the mirrored folder (`test_<module>.py`; `__main__` is `test_main.py`), a
subpackage (`test_<package>.py`, for its public API), or one aspect of a module (`test_<module>_<aspect>.py`).
Only the cross-cutting tests sit in `tests/` itself.
"""

import pathlib

TESTS = pathlib.Path(__file__).resolve().parent
REPO = TESTS.parent
MIRRORED = ("grpo_jax", "experiments", "scripts")
# Tests of the whole tree rather than of one module: the documented commands, the import layers, the suite's own
# set-up, and this file.
CROSS_CUTTING = ("test_docs.py", "test_import_layers.py", "test_conftest.py", "test_layout.py")


def misplaced(tests: pathlib.Path, repo: pathlib.Path) -> list[str]:
  """One line per test file whose path names no module (relative to `tests`), and per folder without `__init__.py`
  (two folders' test files of one name would otherwise collide)."""
  problems = []
  for folder in sorted(p for p in [tests, *tests.rglob("*")] if p.is_dir()):
    not_code = {"data", "__pycache__"} & set(folder.relative_to(tests).parts)
    if not not_code and not (folder / "__init__.py").is_file():
      problems.append(f"{folder.relative_to(tests.parent)}/: no __init__.py")
  for test in sorted(tests.rglob("test_*.py")):
    rel = test.relative_to(tests)
    if len(rel.parts) == 1:
      if rel.name not in CROSS_CUTTING:
        problems.append(f"{test.relative_to(tests.parent)}: a module's tests go to tests/<its folder>/test_<module>.py")
      continue
    source = repo.joinpath(*rel.parts[:-1])
    name = test.stem[len("test_"):]
    modules = {p.stem for p in source.glob("*.py")} | {p.parent.name for p in source.glob("*/__init__.py")}
    modules |= {"main"} if "__main__" in modules else set()
    if rel.parts[0] not in MIRRORED or not source.is_dir() or not (
        name in modules or any(name.startswith(f"{m}_") for m in modules)):
      problems.append(f"{test.relative_to(tests.parent)}: no module {source.relative_to(repo)}/{name}.py")
  return problems


def test_every_test_file_is_at_the_path_of_its_module():
  assert misplaced(TESTS, REPO) == []
  assert len(list(TESTS.rglob("test_*.py"))) >= 100  # the walk sees the suite


def test_the_checker_finds_misplaced_tests(tmp_path):
  """A flat test file, one in the wrong folder, one naming no module and a folder without `__init__.py` are each
  found; the right places (a module, `__main__`, a subpackage, an aspect, a cross-cutting test) are not."""
  repo, tests = tmp_path, tmp_path / "tests"
  for path in ["grpo_jax/losses/cispo.py", "grpo_jax/losses/__init__.py", "experiments/reproduce/__main__.py",
               "grpo_jax/models/__init__.py", "grpo_jax/models/transformer.py"]:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text("")
  right = ["test_docs.py", "grpo_jax/losses/test_cispo.py", "experiments/reproduce/test_main.py",
           "grpo_jax/test_models.py", "grpo_jax/models/test_transformer_scan_layers.py"]
  wrong = ["test_cispo.py", "grpo_jax/models/test_cispo.py", "grpo_jax/losses/test_sapo.py", "other/test_cispo.py"]
  for path in right + wrong:
    (tests / path).parent.mkdir(parents=True, exist_ok=True)
    (tests / path).write_text("")
  for folder in [tests, *tests.rglob("*")]:
    if folder.is_dir() and folder.name != "other":
      (folder / "__init__.py").write_text("")
  (tests / "data").mkdir()  # data, not a package
  assert misplaced(tests, repo) == [
      "tests/other/: no __init__.py",
      "tests/grpo_jax/losses/test_sapo.py: no module grpo_jax/losses/sapo.py",
      "tests/grpo_jax/models/test_cispo.py: no module grpo_jax/models/cispo.py",
      "tests/other/test_cispo.py: no module other/cispo.py",
      "tests/test_cispo.py: a module's tests go to tests/<its folder>/test_<module>.py",
  ]
