"""Step segments, exact and Monte Carlo step labels, propagation (data/step_labels.py), and the
step-end token positions of sampled completions (reward_models/positions.py)."""

import numpy as np
import pytest

from grpo_jax import data
from grpo_jax import models
from grpo_jax.data import step_labels
from grpo_jax.reward_models import positions

EXAMPLE = data.Example(question="(8-7+7)*4", answer="32", solution="8-7=1\n1+7=8\n8*4=32\n#### 32")
RIGHT = "8-7=1\n1+7=8\n8*4=32\n#### 32"


def test_segments_of_real_completions():
  # "8-7=1\n" is 6 characters, "1+7=8\n" 6, "8*4=32\n" 7, then "#### 32".
  assert step_labels.segment_spans(RIGHT) == [(0, 5), (6, 11), (12, 18), (19, 26)]
  assert step_labels.segment_end_offsets(RIGHT) == [4, 10, 17, 25]
  assert [RIGHT[e] for e in step_labels.segment_end_offsets(RIGHT)] == ["1", "8", "2", "2"]
  assert data.step_end_offsets(RIGHT) == [4, 10, 17]  # the steps alone, as data/steps.py gives them
  spaced = "  8-7=1 \n\n1+7=8\n  #### 8  \n"
  assert step_labels.segment_spans(spaced) == [(2, 7), (10, 15), (18, 24)]
  assert [spaced[a:b] for a, b in step_labels.segment_spans(spaced)] == ["8-7=1", "1+7=8", "#### 8"]
  assert step_labels.segment_spans("8-7=1\n1+7") == [(0, 5), (6, 9)]  # truncated: no answer segment
  assert not step_labels.has_answer_segment("8-7=1\n1+7")
  assert step_labels.segment_spans("") == []
  assert step_labels.segment_spans("#### 5") == [(0, 6)]


def test_sampled_completions_of_the_synthetic_task():
  train, _ = data.make_splits(20, 0, seed=3, config=data.SyntheticConfig(max_digits=1, max_steps=3))
  for example in train:
    spans = step_labels.segment_spans(example.solution)
    steps = data.split_steps(example.solution)
    assert [example.solution[a:b] for a, b in spans] == steps + [f"#### {example.answer}"]
    np.testing.assert_array_equal(step_labels.exact_labels(example, example.solution, correct=True),
                                  np.ones(len(steps) + 1))


@pytest.mark.parametrize("completion,correct,expected", [
    (RIGHT, True, [1, 1, 1, 1]),
    ("8-7=1\n1+7=8\n8*4=32\n#### 31", False, [1, 1, 1, 0]),   # right steps, wrong final answer
    ("8-7=1\n1+7=9\n9*4=36\n#### 36", False, [1, 0, 0, 0]),   # wrong arithmetic in step 2
    ("8-7=2\n1+7=8\n8*4=32\n#### 32", True, [0, 0, 0, 0]),    # steps 2-3 match the reference: propagated
    ("8-7=1\n1+7=8", False, [1, 1]),                          # cut short: no answer segment
    ("8-7=1\n1+7=8\n8*4=32\n1*1=1\n#### 1", False, [1, 1, 1, 0, 0]),  # a step beyond the reference
])
def test_exact_labels(completion, correct, expected):
  labels = step_labels.exact_labels(EXAMPLE, completion, correct=correct)
  assert labels.dtype == np.float32
  np.testing.assert_array_equal(labels, expected)


def test_propagate():
  np.testing.assert_array_equal(step_labels.propagate([1, 0, 1, 1]), [1, 0, 0, 0])
  np.testing.assert_array_equal(step_labels.propagate([0.5, 0.25, 0.0, 0.75]), [0.5, 0.25, 0.0, 0.0])
  np.testing.assert_array_equal(step_labels.propagate([1, 1]), [1, 1])
  assert step_labels.propagate([]).shape == (0,)


class _OrdTokenizer:
  """One token per character (id = code point)."""

  def decode(self, ids, skip_special_tokens=True):
    return "".join(chr(i) for i in ids)


def test_monte_carlo_values_with_a_scripted_sampler():
  tok = _OrdTokenizer()
  prompt = [ord(c) for c in "(8-7+7)*4\n"]
  completion = [ord(c) for c in RIGHT]
  ends = step_labels.segment_end_offsets(RIGHT)  # one token per character
  scripted = {  # continuations of each prefix: 2/4, 3/4, 0/4 and 1/4 end at 32
      "8-7=1": ["\n1+7=8\n8*4=32\n#### 32", "\n#### 31", "\n#### 32", "\n#### 5"],
      "8-7=1\n1+7=8": ["\n8*4=32\n#### 32", "\n#### 32", "\n#### 32", "\n#### 0"],
      "8-7=1\n1+7=8\n8*4=32": ["\n#### 33", "\n#### 31", "\n#### 3", "\n#### 0"],
      RIGHT: ["", "0", "1", "2"],  # "#### 32" + "" is right, "#### 320" ... are not
  }
  calls = []

  def rollout(prefixes, key):
    calls.append([list(p) for p in prefixes])
    return [scripted[tok.decode(p[len(prompt):])] for p in prefixes]

  values = step_labels.monte_carlo_values(
      [prompt, prompt], [completion, completion[:5]], [ends, ends[:1]], [EXAMPLE, EXAMPLE], rollout=rollout,
      decode=tok.decode, is_correct=lambda text, ex: text.endswith("#### " + ex.answer),
      key=None)
  np.testing.assert_array_equal(values[0], [0.5, 0.75, 0.0, 0.25])
  np.testing.assert_array_equal(values[1], [0.5])
  assert len(calls) == 1 and len(calls[0]) == 5  # every prefix in one batched call
  assert calls[0][1] == prompt + completion[:11]  # the prefix ends with step 2's end token
  hard = step_labels.propagate((values[0] > 0).astype(np.float32))
  np.testing.assert_array_equal(hard, [1, 1, 0, 0])
  np.testing.assert_array_equal(step_labels.propagate(values[0]), [0.5, 0.75, 0.0, 0.0])
  with pytest.raises(ValueError, match="returned 1 groups for 5 prefixes"):
    step_labels.monte_carlo_values([prompt, prompt], [completion, completion[:5]], [ends, ends[:1]],
                                   [EXAMPLE, EXAMPLE], rollout=lambda p, k: [["x"]], decode=tok.decode,
                                   is_correct=lambda t, e: True, key=None)


def test_step_end_tokens_with_the_char_tokenizer(tmp_path):
  models.save_char_tokenizer(tmp_path)
  tok = models.load_tokenizer(tmp_path)
  eos = tok.eos_token_id
  ids = tok.encode(RIGHT, add_special_tokens=False) + [eos]
  ends = positions.segment_token_ends(tok, ids)
  assert ends == [4, 10, 17, 25]
  assert [tok.decode([ids[e]]) for e in ends] == ["1", "8", "2", "2"]
  # A batch of sampled completions, right-padded, one with no answer segment and one empty.
  texts = [RIGHT, "8-7=1\n1+7", ""]
  rows = [tok.encode(t, add_special_tokens=False) + [eos] for t in texts]
  pad = tok.pad_token_id
  tokens = np.full((3, 30), pad, np.int32)
  for i, r in enumerate(rows):
    tokens[i, :len(r)] = r
  lengths = np.array([len(r) for r in rows])
  ends, mask = positions.sample_segment_ends(tok, tokens, lengths, texts, max_steps=3)
  np.testing.assert_array_equal(ends, [[4, 10, 25], [4, 8, 0], [0, 0, 0]])  # K = 3: first 2 and the answer
  np.testing.assert_array_equal(mask, [[True, True, True], [True, True, False], [False, False, False]])


class _SentencePieceLike:
  """Per-token decoding drops the leading space that whole-text decoding keeps."""
  vocab = {0: "a", 1: " b", 2: "=", 3: "1"}

  def decode(self, ids, skip_special_tokens=True):
    return "".join(self.vocab[i] for i in ids) if len(ids) > 1 else self.vocab[ids[0]].lstrip()


def test_decoded_lengths_fall_back_to_prefix_decoding():
  tok = _SentencePieceLike()
  assert positions.decoded_lengths(tok, [0, 1, 2, 3]) == [1, 2, 1, 1]
  assert positions.char_ends_to_tokens([1, 2, 1, 1], [0, 1, 2, 4]) == [0, 1, 1, 3]
  with pytest.raises(ValueError, match="beyond the decoded text"):
    positions.char_ends_to_tokens([1, 2], [3])
