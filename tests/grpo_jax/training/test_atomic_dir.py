"""training.atomic_directory: a directory appears whole or not at all."""

import pytest

from grpo_jax import training


def test_writes_then_replaces_whole(tmp_path):
  target = tmp_path / "policy"
  with training.atomic_directory(target) as tmp:
    assert tmp.parent == tmp_path and tmp != target and not target.exists()
    (tmp / "a.txt").write_text("1")
    (tmp / "b.txt").write_text("2")
  assert sorted(p.name for p in target.iterdir()) == ["a.txt", "b.txt"]
  with training.atomic_directory(target) as tmp:
    (tmp / "c.txt").write_text("3")
  assert sorted(p.name for p in target.iterdir()) == ["c.txt"]  # replaced, not merged
  assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]  # no temporary left


def test_an_error_leaves_the_old_directory_untouched(tmp_path):
  target = tmp_path / "policy"
  target.mkdir()
  (target / "model.safetensors").write_text("old")
  with pytest.raises(RuntimeError, match="killed"):
    with training.atomic_directory(target) as tmp:
      (tmp / "model.safetensors").write_text("half")
      raise RuntimeError("killed mid-export")
  assert (target / "model.safetensors").read_text() == "old"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]


def test_a_killed_exports_leftovers_are_removed_and_never_used(tmp_path):
  stale = tmp_path / ".sft_policy.tmp-abc123"  # what `kill -9` during an export leaves
  stale.mkdir()
  (stale / "model.safetensors").write_text("half")
  assert not (tmp_path / "sft_policy").exists()  # the runner looks only at the real name
  with training.atomic_directory(tmp_path / "sft_policy") as tmp:
    (tmp / "model.safetensors").write_text("whole")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["sft_policy"]
  assert (tmp_path / "sft_policy" / "model.safetensors").read_text() == "whole"


def test_atomic_write_text_replaces_whole(tmp_path):
  path = tmp_path / "summary.json"
  training.atomic_write_text(path, '{"a": 1}')
  training.atomic_write_text(path, '{"a": 2}')
  assert path.read_text() == '{"a": 2}'
  assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
