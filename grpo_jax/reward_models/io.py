"""Reward-model checkpoints: the backbone in Hugging Face format plus the head in its own file.

  <dir>/config.json, model.safetensors   the backbone, loadable by `grpo_jax.models.load_hf` (and by
                                         transformers as a causal LM whose output layer is tied to
                                         the embeddings: the policy's lm_head is not part of a reward model)
  <dir>/reward_head.safetensors          "kernel" [E] and "bias" [1] (and "alpha" [1] for the "loglik" score),
                                         metadata {"kind": "orm"|"orm_steps"|"prm", "score": "head"|"loglik"}
  <dir>/tokenizer files                  copied from the policy when `tokenizer_dir` is given
  <dir>/training_rows.npz                optional: the labelled rows it trained on (`RewardData` and the prompt
                                         length of their layout), which iterative RL's replay buffer starts from
                                         (DeepSeekMath Algorithm 1's historical data)
"""

import dataclasses
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy

from grpo_jax.models import hf_io
from grpo_jax.models.config import CheckpointError, ModelConfig
from grpo_jax.reward_models.data import RewardData
from grpo_jax.reward_models.model import KINDS, SCORES, Params, score_of

HEAD_FILE = "reward_head.safetensors"
ROWS_FILE = "training_rows.npz"
_FORMAT = "grpo_jax.reward_head"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                    "vocab.json", "merges.txt", "chat_template.jinja")


def save_reward_model(params: Params, config: ModelConfig, path: str | pathlib.Path, *, kind: str,
                      tokenizer_dir: str | pathlib.Path | None = None) -> pathlib.Path:
  """Writes a reward model (see the module docstring); returns `path`."""
  if kind not in KINDS:
    raise ValueError(f"unknown reward model kind {kind!r}; expected one of {KINDS}")
  path = pathlib.Path(path)
  backbone_config = dataclasses.replace(config, tie_word_embeddings=True)
  hf_io.save_hf(params["backbone"], backbone_config, path)
  head = {"kernel": np.asarray(jax.device_get(params["head"]["kernel"]), np.float32),
          "bias": np.asarray(jax.device_get(params["head"]["bias"]), np.float32).reshape(1)}
  if "alpha" in params:
    head["alpha"] = np.asarray(jax.device_get(params["alpha"]), np.float32).reshape(1)
  tmp = path / (HEAD_FILE + ".tmp")
  safetensors.numpy.save_file(head, str(tmp), metadata={"format": _FORMAT, "kind": kind,
                                                        "score": score_of(params)})
  tmp.replace(path / HEAD_FILE)
  if tokenizer_dir is not None:
    for name in _TOKENIZER_FILES:
      if (pathlib.Path(tokenizer_dir) / name).is_file():
        shutil.copyfile(pathlib.Path(tokenizer_dir) / name, path / name)
  return path


def _read_head(path: pathlib.Path, tensors: bool) -> tuple[dict, dict]:
  """`(metadata, tensors)` of the head file in `path` (tensors only if asked); CheckpointError if it is missing,
  unreadable or not a grpo_jax reward head."""
  if not path.is_dir():
    raise CheckpointError(f"reward model directory does not exist: {path}")
  head_file = path / HEAD_FILE
  if not head_file.is_file():
    raise CheckpointError(f"missing {HEAD_FILE} in {path}: not a reward model directory")
  try:
    with safetensors.safe_open(head_file, framework="np") as f:
      meta = f.metadata() or {}
      arrays = {name: f.get_tensor(name) for name in f.keys()} if tensors else {}
  except Exception as err:  # safetensors raises its own error types for truncated or garbled files.
    raise CheckpointError(f"{head_file}: unreadable ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
                          ) from None
  if meta.get("format") != _FORMAT or meta.get("kind") not in KINDS or meta.get("score", "head") not in SCORES:
    raise CheckpointError(f"{head_file}: not a grpo_jax reward head (metadata {meta})")
  return meta, arrays


def read_reward_model(path: str | pathlib.Path, **runtime) -> tuple[ModelConfig, str]:
  """`(config, kind)` of the reward model at `path` without reading a weight: its backbone's config.json with the
  `runtime` keywords of `load_reward_model` (and attention), and its head's kind.

  Raises:
    CheckpointError: as `load_reward_model`, for the files it reads.
  """
  path = pathlib.Path(path)
  meta, _ = _read_head(path, tensors=False)
  return hf_io.read_config(path, **runtime), meta["kind"]


def load_reward_model(path: str | pathlib.Path, *, dtype: str = "float32", param_dtype: str | None = None,
                      remat: bool = False, scan_layers: bool = False) -> tuple[Params, ModelConfig, str]:
  """Loads a reward model written by `save_reward_model`; with `scan_layers`, its backbone's layers stacked (one
  compiled layer in its programs, as the policy's `--scan_layers`).

  Returns:
    (params, config, kind); `config.tie_word_embeddings` is True (see the module docstring).

  Raises:
    CheckpointError: a missing directory, backbone or head file, or a corrupt or mis-shaped head.
  """
  path = pathlib.Path(path)
  meta, tensors = _read_head(path, tensors=True)
  kind, score, head_file = meta["kind"], meta.get("score", "head"), path / HEAD_FILE
  # After the head check: with no model.safetensors, load_hf would scan the head file too.
  backbone, config = hf_io.load_hf(path, dtype=dtype, param_dtype=param_dtype, remat=remat, scan_layers=scan_layers)
  expected = {"kernel": (config.hidden_size,), "bias": (1,), **({"alpha": (1,)} if score == "loglik" else {})}
  for name, shape in expected.items():
    if name not in tensors:
      raise CheckpointError(f"{head_file}: missing tensor {name}")
    if tuple(tensors[name].shape) != shape:
      raise CheckpointError(f"{head_file}: tensor {name} has shape {tuple(tensors[name].shape)}, expected {shape}")
  dt = jnp.dtype(config.param_dtype)
  head = {"kernel": jnp.asarray(tensors["kernel"].astype(dt)), "bias": jnp.asarray(tensors["bias"][0].astype(dt))}
  params = {"backbone": backbone, "head": head}
  if score == "loglik":
    params["alpha"] = jnp.asarray(tensors["alpha"][0].astype(np.float32))
  return params, config, kind


def save_training_rows(data: RewardData, path: str | pathlib.Path, *, prompt_len: int) -> pathlib.Path:
  """Writes the rows a reward model trained on to `path/ROWS_FILE` (compressed; whole or not at all), with
  `prompt_len`, the prompt columns of their token layout; returns the file."""
  path = pathlib.Path(path)
  tmp = path / (ROWS_FILE + ".tmp")
  try:
    with open(tmp, "wb") as f:
      np.savez_compressed(f, prompt_len=np.asarray(prompt_len, np.int64),
                          **{name: np.asarray(x) for name, x in data._asdict().items()})
    tmp.replace(path / ROWS_FILE)
  finally:
    tmp.unlink(missing_ok=True)  # a failed write (a full disk) leaves neither a part file nor a changed one
  return path / ROWS_FILE


def load_training_rows(path: str | pathlib.Path) -> tuple[RewardData, int] | None:
  """`(rows, prompt_len)` as `save_training_rows` wrote them in the reward model at `path`; None where it has none
  (a model saved without them).

  Raises:
    CheckpointError: an unreadable file, or one that lacks a field or whose fields differ in rows.
  """
  file = pathlib.Path(path) / ROWS_FILE
  if not file.is_file():
    return None
  try:
    with np.load(file) as arrays:
      missing = [name for name in ("prompt_len", *RewardData._fields) if name not in arrays.files]
      if missing:
        raise CheckpointError(f"{file}: lacks {', '.join(missing)}: not a reward model's training rows")
      rows = RewardData(**{name: arrays[name] for name in RewardData._fields})
      prompt_len = int(arrays["prompt_len"])
  except CheckpointError:
    raise
  except Exception as err:  # zipfile and NumPy raise several types for truncated or garbled files.
    raise CheckpointError(f"{file}: unreadable ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
                          ) from None
  counts = {name: np.shape(x)[0] if np.ndim(x) else None for name, x in rows._asdict().items()}
  if len(set(counts.values())) != 1 or None in counts.values():
    raise CheckpointError(f"{file}: its fields differ in rows ({counts})")
  return rows, prompt_len
