"""The starting policy and what a run exports: loading (HF checkpoint, earlier SFT policy, or the embedded tiny
model built in the work dir), the SFT marker that says which problems stage 1 saw, and atomic HF exports."""

import hashlib
import json
import pathlib
import shutil

import jax

from experiments.runner import config as config_lib
from experiments.runner import placement as placement_lib
from grpo_jax import distributed
from grpo_jax import models
from grpo_jax.models import attention
from grpo_jax.models import lora
from grpo_jax.models import presets
from grpo_jax import training

SFT_MARKER = "grpo_jax_sft.json"  # in a run's sft_policy: it was fine-tuned on the first --sft_examples problems


def tiny_overrides(config: config_lib.PolicyConfig) -> dict:
  """The embedded model's size from the config (`models.build_default_checkpoint` keywords)."""
  return dict(num_hidden_layers=config.tiny_layers, hidden_size=config.tiny_hidden_size,
              intermediate_size=3 * config.tiny_hidden_size)


def runtime(config: config_lib.PolicyConfig, platform: str | None = None) -> dict:
  """The policy's `models.ModelConfig` runtime keywords (dtype, remat, layer scan, attention, decode projections)
  from the run's config;
  `--attention=auto` resolved for `platform` (default: JAX's default backend)."""
  return dict(dtype=config.dtype, param_dtype=config.dtype, remat=config.remat, remat_policy=config.remat_policy,
              scan_layers=config.scan_layers, decode_projections=config.decode_projections,
              attention=attention.resolve(config.attention, platform or jax.default_backend(), config.dtype))


def model_config(config: config_lib.PolicyConfig, platform: str | None = None) -> models.ModelConfig:
  """The policy's `models.ModelConfig` as `load` gives it on `platform` (default: JAX's backend), without reading a
  weight: the `--init_checkpoint` or `--model` directory's config.json, else the embedded tiny model's. Ahead of
  time (`scripts/aot_compile.py`) a name of `models.presets` that is not a directory stands for its shapes."""
  runtime_ = runtime(config, platform)
  name = config.init_checkpoint or config.model
  if not name:
    return models.tiny_config(**tiny_overrides(config), **runtime_)
  if name in presets.PRESETS and not pathlib.Path(name).is_dir():
    return presets.config(name, **runtime_)
  return models.read_config(name, **runtime_)


# Kernels that exist only on some backends: --attention=NAME elsewhere runs xla, with one warning line.
_KERNEL_NEEDS = {"cudnn": (("gpu", "cuda"), "an NVIDIA GPU and --dtype=bfloat16"), "pallas": (("tpu",), "a TPU")}


def attention_that_runs(config: config_lib.PolicyConfig, platform: str | None = None) -> tuple[str, str]:
  """`(attention, warning)`: the `--attention` value this run can use on `platform` (default: JAX's backend), and
  a one-line warning when that is not the value asked for (cudnn off an NVIDIA GPU or in float32, pallas off a
  TPU: xla instead); "" when it is."""
  platform = platform or jax.default_backend()
  needs = _KERNEL_NEEDS.get(config.attention)
  if needs is None:
    return config.attention, ""
  platforms, what = needs
  if platform in platforms and (config.attention != "cudnn" or config.dtype == "bfloat16"):
    return config.attention, ""
  have = f"{platform} with --dtype={config.dtype}" if platform in platforms else platform
  return "xla", (f"--attention={config.attention}: its kernel needs {what}, not {have}; running --attention=xla "
                 f"instead (config.json records xla)")


def check_start(config: config_lib.PolicyConfig) -> None:
  """Reads the config.json of the `--init_checkpoint` or `--model` checkpoint, before the run writes anything or
  allocates a weight: raises `models.CheckpointError` naming a missing or unreadable one, and RunError when
  `--lora_rank` exceeds its width (hidden size)."""
  path = config.init_checkpoint or config.model
  if not path:
    return
  flag = "--init_checkpoint" if config.init_checkpoint else "--model"
  try:
    hidden = models.read_config(path).hidden_size
  except models.CheckpointError as err:
    raise models.CheckpointError(f"{flag}: {err}") from None
  if config.lora_rank > hidden:
    raise config_lib.RunError(f"--lora_rank={config.lora_rank} exceeds the width of {path} (hidden size {hidden}): "
                              f"a rank-r adapter needs r <= the hidden size")


def check_inputs(config: config_lib.Config) -> None:
  """`check_start`, and the other checkpoints a run reads: `--value_init` (PPO, a directory) and `--reward_model`,
  each named with its flag when missing, before the run writes anything; a prompt and completion budget beyond the
  start checkpoint's context (`max_position_embeddings`), and a batch of more prompts than the synthetic task has
  problems, are refused."""
  check_start(config.model)
  check_context(config)
  if config.task.task in config_lib.SYNTHETIC_TASKS and config.rollout.batch_size > config.task.num_train:
    raise config_lib.RunError(f"--batch_size={config.rollout.batch_size} exceeds the {config.task.task} task's "
                              f"--num_train={config.task.num_train} problems: a step would hold every problem more "
                              f"than once")
  value_init = config.algorithm.value_init
  if config.algorithm.algo == "ppo" and value_init != "policy":
    try:
      models.read_config(value_init)
    except models.CheckpointError as err:
      raise models.CheckpointError(f"--value_init: {err}") from None
  if config.reward_model.reward_model and not pathlib.Path(config.reward_model.reward_model).is_dir():
    raise config_lib.RunError(f"--reward_model: {config.reward_model.reward_model} is not a directory (one written "
                              "by experiments.train_reward_model)")


def check_context(config: config_lib.Config) -> None:
  """RunError when --max_prompt_len + --max_new_tokens exceed the start checkpoint's `max_position_embeddings`
  (positions it was never trained on, or beyond its RoPE scaling's range). Flow-GRPO's planner prompts are sized by
  its own flags and are not checked here."""
  path = config.model.init_checkpoint or config.model.model
  if not path or config.algorithm.algo == "flow_grpo":
    return
  context = models.read_config(path).max_position_embeddings
  p, t = config.task.max_prompt_len, config.rollout.max_new_tokens
  if p + t > context:
    raise config_lib.RunError(f"--max_prompt_len={p} + --max_new_tokens={t} = {p + t} tokens exceed the context of "
                              f"{path} (max_position_embeddings {context}); lower them")


def load(config: config_lib.Config, placement: placement_lib.Placement, marker_name: str = SFT_MARKER):
  """`(params, model_config, tokenizer, needs_sft, path)` of the starting policy, placed by `placement`'s rules.

  In order: `init_checkpoint`, `model`, the work dir's own `sft_policy` (which must hold `marker_name`, the
  method's SFT marker), else the embedded model in `<work_dir>/base_model` (built by process 0), warm-started by
  SFT unless `sft_steps` is 0.
  """
  model, work_dir = config.model, pathlib.Path(config.run.work_dir)
  sft_dir = work_dir / "sft_policy"
  if model.init_checkpoint:
    path, needs_sft = pathlib.Path(model.init_checkpoint), False
  elif model.model:
    path, needs_sft = pathlib.Path(model.model), False
  elif sft_dir.exists():  # exported whole with its marker (`export`), by an earlier run in this work_dir
    if not (sft_dir / marker_name).is_file():
      raise config_lib.RunError(f"{sft_dir} has no {marker_name}: not an SFT policy this runner exported whole; "
                                f"remove it to redo stage 1, or pass it as --init_checkpoint")
    path, needs_sft = sft_dir, False
  else:
    path, needs_sft = work_dir / "base_model", config.sft.sft_steps > 0
  if path == work_dir / "base_model":
    if distributed.is_main_process():  # one writer; the others wait for the files
      models.build_default_checkpoint(path, seed=config.run.seed, **tiny_overrides(model))
    distributed.barrier("base_model")
  params, model_config = placement.load_hf(path, **runtime(model))
  return params, model_config, models.load_tokenizer(path), needs_sft, path


def sft_lineage(source: pathlib.Path, config: config_lib.TaskConfig, marker_name: str = SFT_MARKER) -> bool:
  """Whether the start policy is a stage-1 SFT policy of this task (its `marker_name` file says so); then RL
  draws prompts from the problems SFT did not see."""
  marker = pathlib.Path(source) / marker_name
  if not marker.is_file():
    return False
  try:
    recorded = json.loads(marker.read_text())
  except ValueError as err:
    raise config_lib.RunError(f"{marker}: not valid JSON ({err})") from None
  if recorded.get("task") == config.task and recorded.get("sft_examples") != config.sft_examples:
    raise config_lib.RunError(f"{source} was fine-tuned on the first {recorded.get('sft_examples')} problems; pass "
                              f"--sft_examples={recorded.get('sft_examples')} so the RL prompts exclude them")
  return recorded.get("task") == config.task


def sft_marker(task: str, sft_examples: int, seed: int) -> str:
  """The marker file's text: which problems stage 1 fine-tuned on."""
  return json.dumps({"sft_examples": sft_examples, "seed": seed, "task": task})


def base_record(path: pathlib.Path) -> dict:
  """What LoRA checkpoints record of their frozen base, checked on `--resume`: its path and the SHA-256 of its
  config.json and weight files."""
  path = pathlib.Path(path)
  digest = hashlib.sha256()
  for f in sorted([path / "config.json", *path.glob("*.safetensors"), *path.glob("*.safetensors.index.json")]):
    digest.update(f.name.encode())
    with open(f, "rb") as stream:
      digest.update(hashlib.file_digest(stream, "sha256").digest())
  return {"path": str(path.resolve()), "sha256": digest.hexdigest()}


def export_adapters(params, model_config, base_path: str, target: pathlib.Path) -> None:
  """Writes a LoRA policy's adapters in PEFT's format (`lora.save_peft`), naming `base_path` as the base model;
  the directory appears whole or not at all. Every process calls it; process 0 writes."""
  params = distributed.all_gather(lora.adapters(params))
  if distributed.is_main_process():
    with training.atomic_directory(target) as tmp:
      lora.save_peft(params, model_config, tmp, base_model_name_or_path=base_path)
  distributed.barrier(f"export {target.name}")


def export(params, model_config, source: pathlib.Path, target: pathlib.Path,
           extra_files: dict | None = None) -> None:
  """Writes params in HF format with the source checkpoint's tokenizer files, as they were, plus
  `extra_files` (name -> text, e.g. the SFT marker); the directory appears whole or not at all.

  Every process calls it; process 0 writes. `models.save_hf` fetches the weights one tensor at a time: from this
  process's devices on one process; with several, every process takes part in gathering each tensor (a layer's
  slice of a stacked weight) and drops it, so no host ever holds more than about two tensors of the model.
  """
  fetch = {} if jax.process_count() == 1 else {"fetch": distributed.all_gather}
  if not distributed.is_main_process():
    models.save_hf(params, model_config, None, **fetch)
    distributed.barrier(f"export {target.name}")
    return
  with training.atomic_directory(target) as tmp:
    models.save_hf(params, model_config, tmp, **fetch)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                 "vocab.json", "merges.txt", "generation_config.json", "chat_template.jinja"):
      if (source / name).is_file():
        shutil.copyfile(source / name, tmp / name)
    for name, text in (extra_files or {}).items():
      (tmp / name).write_text(text)
  distributed.barrier(f"export {target.name}")
