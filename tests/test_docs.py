"""The docs stay runnable: README.md and docs/ are checked as a user would use them.

- Every relative link and image resolves to a file of the repository (and an `#anchor` to a heading).
- The README's two commands are the ones `.ci/run` and a newcomer run.
- Every ```python block runs; every command of a shell block (`python -m experiments.X ...`,
  `python scripts/Y.py ...`) parses with that program's own flags, flagfiles included, and a runner's flags build a
  valid config. A block may say otherwise in an HTML comment on the line before its fence:
  `<!-- doc-test: skip REASON -->` (a fragment: it names arrays it does not define), `<!-- doc-test: run -->`
  (a shell block whose commands are also run to completion), `<!-- doc-test: tiny OLD => NEW; ... -->` (run, with
  those replacements: the same code at sizes a test affords).
"""

import json
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import HANG_GUARD_S, with_cpu_devices

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", REPO / "BENCHMARKS.md", *(REPO / "docs").rglob("*.md")])
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_MARKER = re.compile(r"<!--\s*doc-test:\s*(skip|run|tiny)\b(.*?)-->", re.S)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _rel(path: pathlib.Path) -> str:
  return str(path.relative_to(REPO))


def blocks(page: pathlib.Path):
  """(language, code, marker kind, marker argument, line) of each fenced block; the marker is the HTML comment
  that ends on the line before the fence."""
  text = page.read_text()
  for m in _FENCE.finditer(text):
    before = text[:m.start()].rstrip("\n")
    marker = _MARKER.match(before[before.rfind("<!--"):]) if before.endswith("-->") else None
    kind, arg = (marker.group(1), " ".join(marker.group(2).split())) if marker else (None, "")
    yield m.group(1), m.group(2), kind, arg, text[:m.start()].count("\n") + 1


def _tiny(code: str, arg: str) -> str:
  for pair in filter(None, (p.strip() for p in arg.split(";"))):
    old, new = (s.strip() for s in pair.split("=>"))
    assert old in code, f"doc-test tiny: {old!r} is not in the block"
    code = code.replace(old, new)
  return code


def _anchors(page: pathlib.Path) -> set[str]:
  """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
  heads = re.findall(r"^#+\s+(.*)$", _FENCE.sub("", page.read_text()), re.M)
  return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page):
  broken = []
  for target in _LINK.findall(_FENCE.sub("", page.read_text())):
    if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
      continue
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists() or REPO not in dest.parents and dest != REPO:
      broken.append(target)
    elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
      broken.append(target)
  assert not broken, f"{_rel(page)}: broken links {broken}"


def _marked_block(marker: str) -> str:
  text = (REPO / "README.md").read_text()
  after = text.split(f"<!-- {marker} -->\n", 1)[1]
  return _FENCE.match(after.lstrip("\n")).group(2).strip()


def test_the_two_commands_are_what_ci_and_a_newcomer_run():
  ci = (REPO / ".ci/run").read_text()
  awk = re.search(r"cmd=\$\((awk '[^']*' README.md)\)", ci)
  assert awk, ".ci/run no longer reads the test command from README.md with awk"
  ci_cmd = subprocess.run(awk.group(1), shell=True, cwd=REPO, capture_output=True, text=True, check=True).stdout
  test_cmd = _marked_block("test-command")
  assert ci_cmd.strip() == test_cmd
  assert test_cmd.startswith("python3 -m venv") and test_cmd.endswith("-m pytest -q tests")
  assert "'.[test]'" in test_cmd
  assert _marked_block("run-command") == (
      "python3 -m venv --upgrade-deps .venv && .venv/bin/pip install -e . && .venv/bin/python -m experiments.grpo_math")


def _python_blocks():
  for page in PAGES:
    for lang, code, kind, arg, line in blocks(page):
      if lang == "python" and kind != "skip":
        yield pytest.param(code if kind != "tiny" else _tiny(code, arg), id=f"{_rel(page)}:{line}")


@pytest.mark.parametrize("code", list(_python_blocks()))
def test_python_blocks_run(code, tmp_path):
  # a block's own temporary directories (`tempfile.mkdtemp()` in an example) go in the test's, removed with it
  env = {**with_cpu_devices(1), "TMPDIR": str(tmp_path)}
  result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
  assert result.returncode == 0, result.stderr[-3000:]


def commands(code: str):
  """The `python -m experiments.X` / `python scripts/Y.py` commands of a shell block, continuations joined and
  comments dropped, as (program, args)."""
  joined = re.sub(r"\\\n\s*", " ", code)
  for line in joined.splitlines():
    words = shlex.split(line, comments=True)
    while words and "=" in words[0] and not words[0].startswith("-"):
      words = words[1:]  # VAR=value prefixes
    if len(words) >= 2 and re.fullmatch(r"(\.venv/bin/)?python3?", words[0]):
      if words[1] == "-m" and len(words) >= 3 and words[2].startswith("experiments."):
        yield words[2], words[3:]
      elif words[1].startswith("scripts/") and words[1].endswith(".py"):
        yield words[1], words[2:]


def _shell_commands():
  found = {}
  for page in PAGES:
    for lang, code, kind, arg, line in blocks(page):
      if lang in ("", "sh", "bash", "shell") and kind != "skip":
        for program, args in commands(code if kind != "tiny" else _tiny(code, arg)):
          found.setdefault(program, []).append((args, kind in ("run", "tiny"), f"{_rel(page)}:{line}"))
  return found


# Runs in a child process per program: its module is executed as `python -m`/`python script.py` would, except
# that absl's `app.run` and argparse stop after parsing. Each command's flags are then parsed in turn, and a
# runner's (experiments.cli) flags are turned into its config, whose checks name a bad value.
_PARSE_ONLY = r"""
import argparse, json, runpy, sys
from absl import app, flags
program, commands = sys.argv[1], json.loads(sys.argv[2])

class _Parsed(Exception):
  pass

def _stop(main, argv=None, **kwargs):
  raise _Parsed()

app.run = _stop
_parse_args = argparse.ArgumentParser.parse_args
def _parse_and_stop(self, args=None, namespace=None):
  _parse_args(self, args, namespace)
  raise _Parsed()
argparse.ArgumentParser.parse_args = _parse_and_stop

errors = []
for args in commands:
  sys.argv = [program] + args
  try:
    if program.startswith("experiments."):
      if "module" not in globals():
        module = True
        try:
          runpy.run_module(program, run_name="__main__", alter_sys=True)
        except _Parsed:
          pass
    else:
      runpy.run_path(program, run_name="__main__")
  except _Parsed:
    pass
  except SystemExit as e:
    errors.append(f"{args}: exit {e.code}")
    continue
  if program.startswith("experiments."):
    try:
      flags.FLAGS.unparse_flags()
      flags.FLAGS(sys.argv)
      if program in ("experiments.grpo_math", "experiments.flow_grpo"):
        from experiments import cli
        cli.config_from_flags()
    except Exception as e:  # pylint: disable=broad-except
      errors.append(f"{args}: {type(e).__name__}: {e}")
print(json.dumps(errors))
"""


@pytest.mark.parametrize("program", sorted(_shell_commands()))
def test_shell_commands_parse(program):
  """Each documented command's flags are the program's own, with valid values (nothing runs)."""
  cmds = [args for args, _, _ in _shell_commands()[program]]
  if not program.startswith("experiments."):
    assert (REPO / program).is_file(), f"{program} does not exist"
  result = subprocess.run([sys.executable, "-c", _PARSE_ONLY, program, json.dumps(cmds)], cwd=REPO,
                          env=with_cpu_devices(1), capture_output=True, text=True, timeout=HANG_GUARD_S)
  assert result.returncode == 0, result.stderr[-3000:]
  errors = json.loads(result.stdout.strip().splitlines()[-1])
  assert not errors, f"{program}: {errors}"


def _run_commands():
  for program, uses in sorted(_shell_commands().items()):
    for args, run, where in uses:
      if run:
        yield pytest.param(program, args, id=where)


@pytest.mark.parametrize("program,args", list(_run_commands()))
def test_marked_shell_commands_run(program, args, tmp_path):
  argv = ["-m", program] if program.startswith("experiments.") else [str(REPO / program)]
  env = with_cpu_devices(1)
  env["RUNS_TMP"] = str(tmp_path)
  args = [a.replace("$RUNS_TMP", str(tmp_path)) for a in args]
  result = subprocess.run([sys.executable, *argv, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
  assert result.returncode == 0, result.stderr[-3000:]


def test_the_checker_finds_what_it_checks(tmp_path):
  """The parsers above see the blocks, markers, commands and links they are meant to (so no check is empty)."""
  page = tmp_path / "p.md"
  page.write_text("# A title\n[x](missing.md) [y](#a-title)\n<!-- doc-test: tiny 50 => 1 -->\n```python\nn = 50\n```\n"
                  "```\npython -m experiments.grpo_math --steps=3 \\\n    --seed=1   # c\nJAX_PLATFORMS=cpu python "
                  "scripts/aot_compile.py --model=tiny\npip install -e .\n```\n")
  (lang, code, kind, arg, _), (_, shell, _, _, _) = blocks(page)
  assert (lang, kind, _tiny(code, arg)) == ("python", "tiny", "n = 1\n")
  assert list(commands(shell)) == [("experiments.grpo_math", ["--steps=3", "--seed=1"]),
                                   ("scripts/aot_compile.py", ["--model=tiny"])]
  assert _anchors(page) == {"a-title"}
  assert sum(len(v) for v in _shell_commands().values()) >= 20
  assert len(list(_python_blocks())) >= 4


def test_every_runner_flag_is_documented():
  """Each field of the runner's config (a flag of the same name) is named as `--field` in docs/."""
  from experiments.runner import config as config_lib  # pylint: disable=import-outside-toplevel
  text = "".join(p.read_text() for p in (REPO / "docs").glob("*.md"))
  missing = [name for name in config_lib.Config().flat() if not re.search(rf"--{name}(?!\w)", text)]
  assert not missing, f"runner flags without a line in docs/: {missing}"


@pytest.mark.parametrize("page", ["README.md", "docs/reproduce/README.md"])
def test_what_reproduces_is_the_committed_pages_table(page):
  """The "What reproduces" table is `reproduce --claims_table` of the committed study pages, not hand copy."""
  from experiments import reproduce  # pylint: disable=import-outside-toplevel
  text = (REPO / page).read_text()
  block = re.search(r"<!-- what-reproduces -->\n(.*?)<!-- /what-reproduces -->", text, re.S)
  assert block, f"{page}: no <!-- what-reproduces --> ... <!-- /what-reproduces --> block"
  assert block.group(1) == reproduce.claims_table(), (
      f"{page}: the table differs from the pages; paste `python -m experiments.reproduce --claims_table`")
