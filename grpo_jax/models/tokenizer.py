"""Tokenizers: the Hugging Face loader and the project's character-level tokenizer."""

from __future__ import annotations

import json
import pathlib
from typing import TYPE_CHECKING

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers

from grpo_jax.models.config import CheckpointError

if TYPE_CHECKING:
  import transformers

PAD = "<|pad|>"
EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
UNK = "<|unk|>"
SPECIAL_TOKENS = (PAD, EOS, IM_START, IM_END, UNK)
# Printable ASCII (space to tilde) and the newline.
CHARACTERS = tuple(chr(c) for c in range(32, 127)) + ("\n",)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def load_tokenizer(path: str | pathlib.Path) -> transformers.PreTrainedTokenizerBase:
  """`transformers.AutoTokenizer.from_pretrained(path)` (chat template included), with a clear error."""
  # Imported on first use: transformers' import is slow, and a bad command-line flag need not wait for it.
  import transformers  # pylint: disable=import-outside-toplevel
  path = pathlib.Path(path)
  if not path.is_dir():
    raise CheckpointError(f"tokenizer directory does not exist: {path}")
  if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
    raise CheckpointError(f"no tokenizer files (tokenizer.json / tokenizer_config.json) in {path}")
  config_file = path / "tokenizer_config.json"
  if config_file.is_file():
    try:
      tokenizer_class = json.loads(config_file.read_text()).get("tokenizer_class")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
      raise CheckpointError(f"{config_file}: not a JSON object ({err})") from None
  else:
    tokenizer_class = None
  try:
    if tokenizer_class in ("PreTrainedTokenizerFast", "TokenizersBackend"):
      # Taken as written: AutoTokenizer would pick the class of config.json's model_type (e.g.
      # Qwen2Tokenizer), which replaces tokenizer.json's pipeline with its own byte-level one.
      return transformers.PreTrainedTokenizerFast.from_pretrained(str(path))
    return transformers.AutoTokenizer.from_pretrained(str(path))
  except Exception as err:  # pylint: disable=broad-except  (tokenizers raises bare Exception on bad files)
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    raise CheckpointError(f"{path}: unreadable tokenizer files ({reason})") from None


def _bytes_to_unicode() -> dict[int, str]:
  """GPT-2's byte -> printable symbol map used by byte-level BPE (space -> 'Ġ', newline -> 'Ċ')."""
  keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
  symbols, extra = {}, 0
  for b in range(256):
    if b in keep:
      symbols[b] = chr(b)
    else:
      symbols[b] = chr(256 + extra)
      extra += 1
  return symbols


def char_vocab() -> dict[str, int]:
  """Token -> id: the special tokens first (pad = 0, eos = 1), then one id per character.

  Characters are stored under their byte-level symbols (' ' is 'Ġ', '\n' is 'Ċ'),
  the representation of Qwen2/Llama 3 tokenizers.
  """
  symbols = _bytes_to_unicode()
  tokens = SPECIAL_TOKENS + tuple(symbols[ord(c)] for c in CHARACTERS)
  return {tok: i for i, tok in enumerate(tokens)}


def build_char_tokenizer() -> tokenizers.Tokenizer:
  """A character-level `tokenizers.Tokenizer`: one token per character, no BOS, exact round trip.

  A byte-level BPE without merges: every ASCII character is one token, a byte
  outside the vocabulary maps to `<|unk|>`. It is the pipeline that
  transformers' Qwen2Tokenizer rebuilds (NFC, byte-level pre-tokenizer and
  decoder), so `AutoTokenizer.from_pretrained` on a checkpoint whose config.json
  says qwen2 tokenizes identically. The special tokens are added tokens, so
  `<|im_end|>` in text is one token.
  """
  tok = tokenizers.Tokenizer(models.BPE(vocab=char_vocab(), merges=[], unk_token=UNK, fuse_unk=False))
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
  return tok


def save_char_tokenizer(path: str | pathlib.Path) -> pathlib.Path:
  """Writes tokenizer.json + tokenizer_config.json that `AutoTokenizer.from_pretrained` loads (fast)."""
  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  build_char_tokenizer().save(str(path / "tokenizer.json"))
  vocab = char_vocab()
  tokenizer_config = {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "bos_token": None,
      "eos_token": EOS,
      "pad_token": PAD,
      "unk_token": UNK,
      "add_bos_token": False,
      "add_eos_token": False,
      "clean_up_tokenization_spaces": False,
      "padding_side": "left",
      "model_max_length": 1 << 20,
      "chat_template": CHAT_TEMPLATE,
      "added_tokens_decoder": {
          str(vocab[t]): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                          "normalized": False, "single_word": False} for t in SPECIAL_TOKENS},
  }
  (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
  special = {"eos_token": EOS, "pad_token": PAD, "unk_token": UNK}
  (path / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
  return path
