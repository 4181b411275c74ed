"""The character-level tokenizer (models/tokenizer.py)."""

import string

import pytest
import transformers

from grpo_jax import models
from grpo_jax.models import tokenizer as tk


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  path = tk.save_char_tokenizer(tmp_path_factory.mktemp("tok"))
  return models.load_tokenizer(path)


def test_loads_as_fast_tokenizer_with_ids(tok):
  assert tok.is_fast
  assert len(tok) == 95 + 1 + len(tk.SPECIAL_TOKENS) == 101
  assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, None)
  assert tok.convert_ids_to_tokens([0, 1]) == ["<|pad|>", "<|endoftext|>"]
  assert isinstance(tok, transformers.PreTrainedTokenizerBase)


def test_one_token_per_character_and_exact_round_trip(tok):
  text = "".join(chr(c) for c in range(32, 127)) + "\n  a  b\n\n x = 1 + 2 . , !? \"'`"
  ids = tok(text)["input_ids"]
  assert len(ids) == len(text)  # No BOS, no merges.
  assert ids[:3] == [5, 6, 7]  # ' ', '!', '"' after the 5 special tokens.
  assert tok.decode(ids) == text
  assert tok.convert_ids_to_tokens(tok("A \n")["input_ids"]) == ["A", "Ġ", "Ċ"]  # Byte-level symbols.


def test_special_tokens_and_unknown_characters(tok):
  ids = tok("a<|im_end|>b")["input_ids"]
  assert ids == [tok.convert_tokens_to_ids("a"), 3, tok.convert_tokens_to_ids("b")]
  assert tok.decode(ids, skip_special_tokens=True) == "ab"
  assert set(tok("é")["input_ids"]) == {tok.convert_tokens_to_ids("<|unk|>")}  # Non-ASCII: unknown bytes.
  assert set(string.ascii_letters) <= set(tk.char_vocab())


def test_chat_template_and_left_padding(tok):
  text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
  assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
  batch = tok(["ab", "abcd"], padding=True)
  assert batch["input_ids"][0][:2] == [0, 0] and batch["attention_mask"][0] == [0, 0, 1, 1]


@pytest.mark.parametrize("name, damage", [("tokenizer.json", b'{"version": "1.0", "trunc'),
                                          ("tokenizer_config.json", b"\xff\xfe not json")])
def test_damaged_tokenizer_files_are_one_checkpoint_error(tmp_path, name, damage):
  tk.save_char_tokenizer(tmp_path)
  (tmp_path / name).write_bytes(damage)
  with pytest.raises(models.CheckpointError) as info:
    models.load_tokenizer(tmp_path)
  assert str(tmp_path) in str(info.value) and "\n" not in str(info.value)
