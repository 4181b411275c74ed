"""--algo=distill end to end on the embedded tiny model: a frozen teacher (a wider tiny model with sharper logits,
written as an HF checkpoint) distils into the student, full fine-tuning and LoRA, on one device and on a mesh."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.runner import config as config_lib
from experiments.trainer import loop
from experiments.runner import policy
from grpo_jax import models

TEMPERATURE = 0.7
_RUN = dict(algo="distill", tiny_layers=1, tiny_hidden_size=32, sft_steps=0, steps=30, batch_size=32, group_size=2,
            max_prompt_len=16, max_new_tokens=12, num_train=200, num_test=4, eval_batch_size=4, eval_every=0,
            save_every=0, tensorboard=False, learning_rate=2e-2, warmup_steps=0, lr_schedule="constant",
            temperature=TEMPERATURE, completion_pad_multiple=0)


def _teacher(path, hidden_size=64, vocab_size=None):
  """A tiny model wider than the student, its logits sharpened (final norm x 4), saved as an HF checkpoint."""
  model = config_lib.PolicyConfig(tiny_layers=1, tiny_hidden_size=hidden_size)
  config = models.tiny_config(**policy.tiny_overrides(model), **policy.runtime(model))
  if vocab_size:
    config = config.replace(vocab_size=vocab_size)
  params = models.init_params(config, jax.random.PRNGKey(7))
  params["final_norm"]["scale"] = params["final_norm"]["scale"] * 4.0
  models.save_hf(params, config, path)
  return path


def _student_and_low_rank_teacher(tmp_path):
  """The embedded student (seed 0), and a teacher that differs from it by a rank-2 change of its MLP's down
  projection: a change that LoRA adapters of rank >= 2 on `down` can represent exactly."""
  model = config_lib.PolicyConfig(tiny_layers=1, tiny_hidden_size=32)
  student = models.build_default_checkpoint(tmp_path / "student", seed=0, **policy.tiny_overrides(model))
  params, config = models.load_hf(student)
  kernel = params["layers_0"]["mlp"]["down_proj"]["kernel"]  # [96, 32]
  u, v = jax.random.normal(jax.random.PRNGKey(5), (kernel.shape[0], 2)), jax.random.normal(jax.random.PRNGKey(6),
                                                                                          (2, kernel.shape[1]))
  params["layers_0"]["mlp"]["down_proj"]["kernel"] = kernel + 3.0 * u @ v
  models.save_hf(params, config, tmp_path / "teacher")
  return student, tmp_path / "teacher"


def _reverse_kl(student_dir, teacher_dir) -> float:
  """Mean over the positions of 8 fixed random sequences of KL(π_student ‖ π_teacher) at the rollout temperature,
  over the whole vocabulary."""
  (s_params, s_config), (t_params, t_config) = models.load_hf(student_dir), models.load_hf(teacher_dir)
  tokens = jax.random.randint(jax.random.PRNGKey(3), (8, 20), 3, s_config.vocab_size)
  s = jax.nn.log_softmax(models.apply(s_params, s_config, tokens)[0] / TEMPERATURE)
  t = jax.nn.log_softmax(models.apply(t_params, t_config, tokens)[0] / TEMPERATURE)
  return float(jnp.mean(jnp.sum(jnp.exp(s) * (s - t), axis=-1)))


def _distil(tmp_path, teacher=None, **flags):
  teacher = teacher or _teacher(tmp_path / "teacher")
  work_dir = tmp_path / "run"
  summary = loop.run(config_lib.Config().replace(**{**_RUN, **flags}, teacher_checkpoint=str(teacher),
                                                 work_dir=str(work_dir)))
  records = [json.loads(line) for line in (work_dir / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in records if "train/reverse_kl" in r]
  return summary, train, teacher, work_dir


@pytest.mark.parametrize("lora", [False, True])
def test_the_student_moves_towards_its_teacher(tmp_path, lora):
  # 30 steps of 64 samples (a single-sample estimate per token is noisy: with 8 samples a step the student did not
  # move in 20 steps); the exact reverse KL over the vocabulary, on contexts the run never saw, falls. Full
  # fine-tuning from the embedded model towards a wider random teacher; LoRA (q, k, v, o, gate, up, down, the
  # embeddings frozen) towards a teacher it can reach, a rank-2 change of the student's down projection.
  if lora:
    student, teacher = _student_and_low_rank_teacher(tmp_path)
    flags = dict(model=str(student), teacher=teacher, lora_rank=4, lora_alpha=8.0)
  else:
    student, flags = None, {}
  summary, train, teacher, work_dir = _distil(tmp_path, **flags)
  assert summary["algo"] == "distill" and [r["step"] for r in train] == list(range(1, 31))
  assert all(np.isfinite(r["train/reverse_kl"]) and np.isfinite(r["train/loss"]) for r in train)
  before, after = _reverse_kl(student or work_dir / "base_model", teacher), _reverse_kl(work_dir / "final_policy",
                                                                                         teacher)
  assert before > (0.02 if lora else 1.0) and after < 0.7 * before, (before, after)
  # and so does the sampled estimate on the student's own samples
  first, last = (np.mean([r["train/reverse_kl"] for r in part]) for part in (train[:3], train[-3:]))
  assert last < 0.5 * first, (first, last)


@pytest.mark.devices(4)
def test_distillation_runs_on_a_mesh(tmp_path):
  summary, train, _, _ = _distil(tmp_path, mesh="data:2,fsdp:2", steps=3)
  assert [r["step"] for r in train] == [1, 2, 3] and summary["algo"] == "distill"
  assert all(np.isfinite(r["train/reverse_kl"]) and np.isfinite(r["train/loss"]) for r in train)


def test_a_teacher_of_another_vocabulary_is_refused(tmp_path):
  teacher = _teacher(tmp_path / "teacher", vocab_size=128)
  config = config_lib.Config().replace(**_RUN, teacher_checkpoint=str(teacher), work_dir=str(tmp_path / "run"))
  with pytest.raises(config_lib.RunError, match="vocabulary of 128 tokens, the policy's has 101"):
    loop.run(config)


@pytest.mark.parametrize("fields,message", [
    (dict(algo="distill"), "--algo=distill and --teacher_checkpoint=DIR"),
    (dict(teacher_checkpoint="t"), "--algo=distill and --teacher_checkpoint=DIR"),
    (dict(algo="distill", teacher_checkpoint="t", dynamic_sampling=True), "--dynamic_sampling: --algo=distill"),
    (dict(algo="distill", teacher_checkpoint="t", reward="exact_steps"), "--reward: --algo=distill"),
    (dict(algo="distill", teacher_checkpoint="t", loss="sapo"), "--loss=sapo: GRPO's objective only"),
])
def test_bad_flags_are_one_line(fields, message):
  with pytest.raises(config_lib.ConfigError) as info:
    config_lib.Config().replace(**fields)
  assert message in str(info.value) and "\n" not in str(info.value)
  assert config_lib.Config().replace(algo="distill", teacher_checkpoint="t", group_size=1).rollout.group_size == 1


def test_one_sample_per_prompt(tmp_path):
  _, train, _, _ = _distil(tmp_path, group_size=1, batch_size=8, steps=2)
  assert [r["step"] for r in train] == [1, 2] and all(np.isfinite(r["train/reverse_kl"]) for r in train)


def test_the_teacher_runs_with_the_policys_attention(tmp_path):
  # The teacher's config comes from its config.json with the policy's runtime options and attention (on a TPU the
  # Pallas kernel, which `policy.runtime` alone would resolve for the host's backend when compiling ahead of time).
  from experiments import methods  # pylint: disable=import-outside-toplevel
  from experiments.runner import placement as placement_lib  # pylint: disable=import-outside-toplevel
  teacher = _teacher(tmp_path / "teacher")
  config = config_lib.Config().replace(**_RUN, teacher_checkpoint=str(teacher))
  model = config_lib.PolicyConfig(tiny_layers=1, tiny_hidden_size=32)
  policy_config = models.tiny_config(**policy.tiny_overrides(model), **policy.runtime(model)).replace(attention="xla")
  rollouts = methods.Rollouts(config, policy_config, None, None, placement_lib.Placement())
  method = methods.METHODS["distill"](config, policy_config, None, rollouts, None)
  assert method.teacher_config.attention == "xla" and method.teacher_config.hidden_size == 64
  assert method.reference is None  # no π_ref is kept
