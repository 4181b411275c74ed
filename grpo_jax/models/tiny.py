"""The embedded default model: a tiny random-init Qwen2 with the character-level tokenizer.

It is written in the same Hugging Face format as a real checkpoint, so runs on
the default model and on a downloaded one share one loading path (`load_hf`).
"""

import json
import os
import pathlib
import shutil
import tempfile

import jax

from grpo_jax.models import tokenizer
from grpo_jax.models.config import CheckpointError, ModelConfig
from grpo_jax.models.hf_io import load_hf, save_hf
from grpo_jax.models.transformer import init_params

TINY_DEFAULTS = dict(
    model_type="qwen2",
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rope_theta=10000.0,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)


def tiny_config(**overrides) -> ModelConfig:
  """Qwen2-architecture config sized for the character tokenizer (~0.5M params by default).

  Args:
    **overrides: any ModelConfig field, e.g. hidden_size=256, num_hidden_layers=4.
  """
  vocab = tokenizer.char_vocab()
  fields = dict(TINY_DEFAULTS, vocab_size=len(vocab), qkv_bias=True,
                eos_token_ids=(vocab[tokenizer.EOS], vocab[tokenizer.IM_END]),
                pad_token_id=vocab[tokenizer.PAD], bos_token_id=None)
  fields.update(overrides)
  if "head_dim" not in fields:
    fields["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
  return ModelConfig(**fields)


def build_default_checkpoint(path: str | pathlib.Path, seed: int = 0, **config_overrides) -> pathlib.Path:
  """Writes the tiny random-init model + tokenizer at `path` in HF format; idempotent.

  If `path` already holds a loadable checkpoint with the same config, it is left
  as it is. The files are written to a temporary sibling directory and renamed,
  so a crash never leaves a half-written checkpoint.

  Args:
    path: target directory.
    seed: PRNG seed of the random initialisation.
    **config_overrides: ModelConfig fields passed to `tiny_config`.

  Returns:
    `path`.

  Raises:
    CheckpointError: `path` holds a checkpoint with a different config, or is a
      non-empty directory that is not a checkpoint.
  """
  path = pathlib.Path(path)
  config = tiny_config(**config_overrides)
  if path.exists():
    if path.is_dir() and not any(path.iterdir()):
      path.rmdir()
    else:
      try:
        _, existing = load_hf(path)
        tokenizer.load_tokenizer(path)
      except (CheckpointError, OSError) as err:
        raise CheckpointError(f"{path} exists but is not a valid checkpoint ({err})") from None
      if existing.to_hf_dict() != config.to_hf_dict():
        raise CheckpointError(f"{path} holds a checkpoint with a different config; choose another path")
      return path
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
  try:
    save_hf(init_params(config, jax.random.key(seed)), config, tmp)
    tokenizer.save_char_tokenizer(tmp)
    (tmp / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": list(config.eos_token_ids), "pad_token_id": config.pad_token_id}, indent=2) + "\n")
    os.replace(tmp, path)
  except OSError:
    shutil.rmtree(tmp, ignore_errors=True)
    if not (path / "model.safetensors").is_file():
      raise
    # Another process wrote the checkpoint first.
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return path
