"""`python -m experiments.sample_eval`'s bad inputs: one line naming the flag, nothing written (its numbers are
tested with the studies, tests/test_reproduce.py)."""

import pytest

from experiments import cli
from experiments import sample_eval


@pytest.mark.parametrize("args, message", [
    ([], "--init_checkpoint is required"),
    (["--init_checkpoint=p"], "--eval_samples must be >= 1"),
    (["--init_checkpoint=p", "--eval_samples=4", "--model=m"], "--model: sample_eval does not read it (use "
                                                                "--init_checkpoint)"),
    (["--init_checkpoint=p", "--eval_samples=4", "--temperature=1.0"], "--temperature: sample_eval does not read it "
                                                                       "(use --eval_temperature)"),
    (["--init_checkpoint=p", "--eval_samples=4", "--mesh=data:1"], "--mesh: sample_eval does not read it"),
    (["--init_checkpoint=p", "--eval_samples=4", "--lora_rank=4"], "--lora_rank: sample_eval does not read it"),
    (["--init_checkpoint=p", "--eval_samples=4", "--eval_temperature=nan"], "--eval_temperature must be a finite"),
    (["--init_checkpoint=nope", "--eval_samples=4"], "checkpoint directory does not exist: nope"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, monkeypatch, main_in_process, args, message):
  monkeypatch.chdir(tmp_path)
  error = main_in_process(cli.main_for("sample_eval", sample_eval.run),
                          ["sample_eval", f"--work_dir={tmp_path / 'out'}", *args])
  assert error.startswith("sample_eval: error: ") and message in error and "\n" not in error, error
  assert not (tmp_path / "out").exists()


def test_unread_names_shared_flags():
  from experiments.runner import config as config_lib  # pylint: disable=import-outside-toplevel
  fields = set(config_lib.Config().flat())
  assert set(sample_eval.UNREAD) <= fields and len(set(sample_eval.UNREAD)) == len(sample_eval.UNREAD)
  read = {"init_checkpoint", "dtype", "task", "num_test", "max_prompt_len", "max_new_tokens", "eval_samples",
          "eval_temperature", "eval_batch_size", "seed", "work_dir"}
  assert not read & set(sample_eval.UNREAD)
