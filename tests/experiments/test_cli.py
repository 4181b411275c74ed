"""The runners' command line (`experiments/cli.py`) and the runner layer's shape: flags are read only by the
entry modules, every config field is a flag with the field's default, a flagfile and the Python config give the
same run (the packages' layers: tests/test_import_layers.py)."""

import ast
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import typing

from absl import flags
import jax
import numpy as np
import pytest

from experiments import cli
from experiments.runner import config as config_lib
from experiments.trainer import loop
from grpo_jax import models

REPO = pathlib.Path(__file__).resolve().parents[2]
FLAGS = flags.FLAGS


def _modules(package: str):
  return sorted((REPO / package).rglob("*.py"))


def test_flags_are_read_only_in_entry_modules():
  """No `absl.flags` import and no `FLAGS` below the entry modules (`experiments/*.py`, `experiments/*/__main__.py`)
  or in the library."""
  offenders = []
  for path in _modules("experiments") + _modules("grpo_jax"):
    if REPO / "experiments" in (path.parent, path.parent.parent if path.name == "__main__.py" else None):
      continue  # the entry modules and cli.py: flags live here
    tree = ast.parse(path.read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    if "FLAGS" in names or any(n.startswith("absl.flags") or n == "absl.flags" for n in _imports(path)) or any(
        isinstance(n, ast.ImportFrom) and n.module == "absl" and any(a.name == "flags" for a in n.names)
        for n in ast.walk(tree)):
      offenders.append(str(path.relative_to(REPO)))
  assert not offenders, offenders


def _imports(path: pathlib.Path) -> set[str]:
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
      names.update(f"{node.module}.{a.name}" for a in node.names)
  return names


def test_every_field_is_a_flag_with_its_default():
  FLAGS.unparse_flags()
  FLAGS(["grpo_math"])
  try:
    for name, value in config_lib.Config().flat().items():
      if name == "group_size":
        assert FLAGS[name].default is None  # resolved by the method: 8, or 1 for PPO
        continue
      assert FLAGS[name].default == value, name
    assert cli.config_from_flags() == config_lib.Config()
  finally:
    FLAGS.unparse_flags()


def test_flagfile_preset_is_the_default_config():
  FLAGS.unparse_flags()
  FLAGS(["grpo_math", f"--flagfile={REPO / 'experiments' / 'configs' / 'cpu_default.cfg'}"])
  try:
    assert cli.config_from_flags() == config_lib.Config()
  finally:
    FLAGS.unparse_flags()


TINY = dict(max_prompt_len=16, max_new_tokens=16, num_train=200, num_test=8, batch_size=2, group_size=4,
            eval_batch_size=8, tiny_layers=1, tiny_hidden_size=32, sft_steps=4, sft_batch_size=4, steps=2,
            eval_every=0, tensorboard=False, overlong_buffer=12)  # length shaping: rewards vary, the policy moves


def test_a_flagfile_and_the_python_config_give_the_same_run(tmp_path):
  flagfile = tmp_path / "tiny.cfg"
  flagfile.write_text("".join(f"--{k}={str(v).lower() if isinstance(v, bool) else v}\n" for k, v in TINY.items()))
  FLAGS.unparse_flags()
  FLAGS(["grpo_math", f"--flagfile={flagfile}", f"--work_dir={tmp_path / 'cli'}"])
  try:
    from_flags = cli.run_from_flags()
  finally:
    FLAGS.unparse_flags()
  from_python = loop.run(config_lib.Config().replace(**TINY, work_dir=str(tmp_path / "python")))
  assert from_flags["final_accuracy"] == from_python["final_accuracy"]
  records = [[json.loads(l) for l in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
             for d in ("cli", "python")]
  train = [[r for r in rs if "train/loss" in r] for rs in records]
  assert [r["step"] for r in train[0]] == [1, 2]
  for a, b in zip(*train):
    for key in ("train/loss", "train/reward_mean", "train/kl", "train/grad_norm", "train/response_length"):
      np.testing.assert_array_equal(a[key], b[key], err_msg=key)
  assert all(r["train/reward_std"] > 0 and r["train/grad_norm"] > 0 for r in train[0])
  sft, final = (models.load_hf(tmp_path / "python" / d)[0] for d in ("sft_policy", "final_policy"))
  assert not np.array_equal(sft["embed"]["embedding"], final["embed"]["embedding"])
  jax.tree.map(np.testing.assert_array_equal, final, models.load_hf(tmp_path / "cli" / "final_policy")[0])
  assert json.loads((tmp_path / "cli" / "config.json").read_text()) == json.loads(
      (tmp_path / "python" / "config.json").read_text()) | {"work_dir": str(tmp_path / "cli")}


def test_the_compilation_cache_flag_defers_to_the_environment(tmp_path):
  before = jax.config.jax_compilation_cache_dir  # conftest sets JAX_COMPILATION_CACHE_DIR for the whole run
  assert before
  cli.enable_compilation_cache(str(tmp_path / "elsewhere"))
  assert jax.config.jax_compilation_cache_dir == before


def test_the_cpu_is_split_into_devices_before_jax_starts_and_left_alone_after():
  """`--cpu_devices`: N CPU devices in a fresh process (0: one per core); a count set by XLA_FLAGS wins; in a
  process whose backends are up (this one) it changes nothing and does not raise."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                              if not f.startswith("--xla_force_host_platform_device_count"))
  code = ("import sys; from experiments import cli; cli.split_cpu(int(sys.argv[1])); import jax; "
          "print(jax.device_count())")
  counts = {}
  for n, extra in ((0, ""), (3, ""), (3, "--xla_force_host_platform_device_count=2")):
    run_env = dict(env, XLA_FLAGS=" ".join(filter(None, [env["XLA_FLAGS"], extra])), JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", code, str(n)], cwd=REPO, env=run_env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    counts[(n, extra)] = int(result.stdout.split()[-1])
  assert counts == {(0, ""): len(os.sched_getaffinity(0)), (3, ""): 3,
                    (3, "--xla_force_host_platform_device_count=2"): 2}
  before = jax.devices()
  cli.split_cpu(4)
  assert jax.devices() == before


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
                    reason="glibc's malloc only")
def test_a_cpu_run_keeps_freed_host_memory_from_its_start():
  """`main` keeps freed memory (`host_memory.retain_freed_memory`) before the job starts JAX, on the CPU only: a 100 MB
  block then comes from the heap, not from mmap (mallinfo2's hblkhd), and JAX's CPU dispatch is synchronous. On
  every platform it sets Python's collector (`python_gc.collect_less`): the imports frozen, young collections rarer."""
  code = ("import ctypes, gc; from absl import app; from experiments import cli\n"
          "libc = ctypes.CDLL(None)\n"
          "libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)\n"
          "class Info(ctypes.Structure):  # mallinfo2; hblkhd: bytes in mmap'd blocks\n"
          "  _fields_ = [(n, ctypes.c_size_t) for n in 'arena ordblks smblks hblks hblkhd a b c d e'.split()]\n"
          "libc.mallinfo2.restype = Info\n"
          "def job(config):\n"
          "  before = libc.mallinfo2().hblkhd; libc.malloc(100 << 20)\n"
          "  import jax; print(gc.get_threshold()[0], gc.get_freeze_count() > 10_000,\n"
          "                    jax.config.read('jax_cpu_enable_async_dispatch'), libc.mallinfo2().hblkhd - before)\n"
          "app.run(cli.main_for('probe', job=job))")
  seen = {}
  for platforms in ("cpu", "cuda"):  # a GPU run keeps the defaults (the job never starts JAX here)
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, JAX_PLATFORMS=platforms),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    threshold, frozen, asynchronous, mmapped = result.stdout.split()[-4:]
    seen[platforms] = (threshold, frozen, asynchronous, int(mmapped) >= 100 << 20)
  assert seen == {"cpu": ("10000", "True", "False", False), "cuda": ("10000", "True", "True", True)}


def test_a_second_run_loads_its_programs_from_the_compilation_cache(tmp_path):
  # Without the test suite's cache and threshold, as a user runs it: the flag's cache keeps every program.
  env = {k: v for k, v in os.environ.items()
         if k not in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")}
  cache = tmp_path / "cache"
  args = [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in TINY.items()]

  def run(name):
    done = subprocess.run([sys.executable, "-m", "experiments.grpo_math", *args, f"--work_dir={tmp_path / name}",
                           f"--compilation_cache_dir={cache}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(l) for l in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]

  first = run("first")
  entries = sorted(p.name for p in cache.rglob("*") if p.is_file())
  assert len(entries) >= 10  # every program, not only those over a second of compile time
  second = run("second")
  # Every program of the second run was found: nothing new written, and the same numbers.
  assert sorted(p.name for p in cache.rglob("*") if p.is_file()) == entries
  drop = lambda r: {k: v for k, v in r.items() if "time" not in k and k != "train/tokens_per_s"}
  assert [drop(r) for r in first] == [drop(r) for r in second]


def test_out_of_memory_is_one_line_and_other_runtime_errors_stay_tracebacks(tmp_path, main_in_process):
  """Issue 55's sweep: a size no device holds (--tiny_hidden_size=1048576, --max_new_tokens=100000000) ended in a
  RESOURCE_EXHAUSTED traceback; it is one line that says what to lower. Other runtime errors are bugs: raised."""

  def job(message):
    def run(config):
      del config
      raise jax.errors.JaxRuntimeError(message)
    return run

  error = main_in_process(cli.main_for("grpo_math", job("RESOURCE_EXHAUSTED: Out of memory allocating 9 bytes.\n"
                                                         "more")), ["grpo_math", f"--work_dir={tmp_path}"])
  assert error == ("grpo_math: error: out of memory: RESOURCE_EXHAUSTED: Out of memory allocating 9 bytes; lower the "
                   "sizes the flags set (--batch_size, --group_size, --max_new_tokens, the model's), or "
                   "--forward_memory_budget")
  with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
    main_in_process(cli.main_for("grpo_math", job("INTERNAL: a bug")), ["grpo_math", f"--work_dir={tmp_path}"])


def test_flags_are_the_fields_metadata():
  """Each field's flag has the field's default, the help and values its `config_lib.flag(...)` declares, and the
  DEFINE_* of its type; cli defines them (its key flags, as `--helpfull` groups them)."""
  kinds = {str: "string", int: "int", float: "float", bool: "bool"}
  for section in config_lib.SECTIONS.values():
    annotations = typing.get_type_hints(section)
    for field in dataclasses.fields(section):
      flag, help_text = FLAGS[field.name], field.metadata["help"]
      assert flag.default == field.default and FLAGS.find_module_defining_flag(field.name) == "experiments.cli"
      if "choices" in field.metadata:
        choices = [c for c in field.metadata["choices"] if c is not None]
        assert flag.flag_type() == "string enum" and flag.parser.enum_values == choices, field.name
        assert flag.help == f"<{'|'.join(choices)}>: {help_text}", field.name  # absl puts the values first
      else:
        assert flag.help == help_text, field.name
        (kind,) = [t for t in (typing.get_args(annotations[field.name]) or (annotations[field.name],))
                   if t is not type(None)]
        assert flag.flag_type() == kinds[kind], field.name
  # Frozen: the four fields unset by default (each a flag without a default value) and a few of each kind.
  frozen = {"group_size": ("int", None), "epsilon_high": ("float", None), "num_processes": ("int", None),
            "kl": ("string enum", None), "batch_size": ("int", 32), "beta": ("float", 0.04),
            "scan_layers": ("bool", False), "model": ("string", ""), "algo": ("string enum", "grpo")}
  assert {name: (FLAGS[name].flag_type(), FLAGS[name].default) for name in frozen} == frozen
  assert FLAGS["kl"].parser.enum_values == ["k1", "k2", "k3"]
  assert FLAGS["scan_layers"].help.startswith("Run the decoder layers as one lax.scan over stacked weights")


def test_a_new_field_is_a_flag():
  """A section's fields become flags of their types with nothing else written; one without help is refused."""

  @dataclasses.dataclass(frozen=True)
  class Section:
    name: str = config_lib.flag("x", "A string.")
    count: int | None = config_lib.flag(None, "An int, unset.", minimum=1)
    rate: float = config_lib.flag(0.5, "A float.")
    on: bool = config_lib.flag(True, "A bool.")
    mode: str | None = config_lib.flag(None, "An enum.", choices=(None, "a", "b"))

  values = flags.FlagValues()
  cli.define_flags({"section": Section}, values)
  values(["prog", "--count=3", "--rate=2", "--noon", "--mode=b"])
  assert (values.name, values.count, values.rate, values.on, values.mode) == ("x", 3, 2.0, False, "b")
  assert [values[n].flag_type() for n in ("name", "count", "rate", "on", "mode")] == [
      "string", "int", "float", "bool", "string enum"]
  assert values["mode"].help == "<a|b>: An enum." and values["mode"].default is None
  with pytest.raises(flags.IllegalFlagValueError):
    values(["prog", "--mode=c"])

  @dataclasses.dataclass(frozen=True)
  class Bare:
    plain: int = 1

  with pytest.raises(TypeError, match="config field plain has no help text"):
    cli.define_flags({"bare": Bare}, flags.FlagValues())
