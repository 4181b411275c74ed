"""experiments/runner/policy.py: the policy's ModelConfig without weights is the one `load` gives."""
import pytest

from experiments.runner import config as config_lib
from experiments.runner import placement as placement_lib
from experiments.runner import policy
from grpo_jax import models
from grpo_jax.models import presets


def test_model_config_is_loads(tmp_path):
  base = config_lib.Config().replace(work_dir=str(tmp_path / "run"), tiny_layers=1, tiny_hidden_size=32,
                                     dtype="bfloat16", scan_layers=True)
  _, loaded, _, _, path = policy.load(base, placement_lib.Placement())  # builds the embedded model
  assert path == tmp_path / "run" / "base_model" and loaded.hidden_size == 32 and loaded.scan_layers
  assert policy.model_config(base.model) == loaded
  checkpoint = base.replace(model=str(path), work_dir=str(tmp_path / "other"), remat=True)
  _, loaded, _, _, _ = policy.load(checkpoint, placement_lib.Placement())
  assert policy.model_config(checkpoint.model) == loaded and loaded.remat
  assert policy.model_config(checkpoint.model, "cpu").attention == loaded.attention
  together = checkpoint.replace(work_dir=str(tmp_path / "third"), decode_projections="together")
  _, loaded, _, _, _ = policy.load(together, placement_lib.Placement())  # --decode_projections reaches the model
  assert loaded.decode_projections == "together" and policy.model_config(together.model) == loaded


def test_a_preset_name_unless_a_directory_holds_it(tmp_path, monkeypatch):
  model = config_lib.PolicyConfig(model="qwen2.5-7b", dtype="bfloat16")
  assert policy.model_config(model, "cpu") == presets.config("qwen2.5-7b", **policy.runtime(model, "cpu"))
  monkeypatch.chdir(tmp_path)
  models.build_default_checkpoint(tmp_path / "qwen2.5-7b", num_hidden_layers=1, hidden_size=32, intermediate_size=64)
  assert policy.model_config(model, "cpu").hidden_size == 32  # the directory's config.json


def test_a_budget_beyond_the_checkpoints_context_is_one_line(tmp_path):
  """A prompt and completion budget longer than the checkpoint's positions (2048 for the tiny default) is refused
  before the run writes anything; one token fewer is accepted."""
  models.build_default_checkpoint(tmp_path / "ckpt", seed=0)
  assert models.read_config(tmp_path / "ckpt").max_position_embeddings == 2048
  config = config_lib.Config().replace(init_checkpoint=str(tmp_path / "ckpt"), max_prompt_len=2000, max_new_tokens=49)
  with pytest.raises(config_lib.RunError, match=r"^--max_prompt_len=2000 \+ --max_new_tokens=49 = 2049 tokens exceed "
                     r"the context of .*ckpt \(max_position_embeddings 2048\); lower them$"):
    policy.check_inputs(config)
  policy.check_inputs(config.replace(max_new_tokens=48))
  policy.check_inputs(config.replace(algo="flow_grpo"))  # the planner's prompts are sized by its own flags


def test_a_batch_of_more_prompts_than_problems_is_one_line():
  """Issue 55's sweep: --batch_size=10^8 built 10^8 prompts on the host before anything said no."""
  config = config_lib.Config().replace(batch_size=10**8)
  with pytest.raises(config_lib.RunError, match=r"^--batch_size=100000000 exceeds the synthetic task's "
                     r"--num_train=20000 problems"):
    policy.check_inputs(config)
  policy.check_inputs(config.replace(batch_size=20000))
