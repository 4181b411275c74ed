"""Tests for grpo_jax.data.example."""

import dataclasses

import pytest

from grpo_jax.data.example import Example


def test_example_is_frozen_and_hashable_with_metadata():
  a = Example("1+1", "2", "1+1=2\n#### 2", metadata={"level": 1})
  b = Example("1+1", "2", "1+1=2\n#### 2", metadata={"level": 2})
  assert hash(a) == hash(b)  # metadata is not hashed
  assert a != b  # but it is compared
  assert Example("q", "1").solution is None and Example("q", "1").metadata == {}
  with pytest.raises(dataclasses.FrozenInstanceError):
    a.answer = "3"
