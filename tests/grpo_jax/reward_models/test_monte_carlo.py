"""Monte Carlo rollouts from a policy (grpo_jax/reward_models/monte_carlo.py): k continuations per prefix."""

import jax
import jax.numpy as jnp
import pytest

from grpo_jax import models
from grpo_jax import reward_models as rm

CONFIG = models.tiny_config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  return models.load_tokenizer(models.tokenizer.save_char_tokenizer(tmp_path_factory.mktemp("tok")))


def test_k_continuations_per_prefix_in_order(tokenizer):
  params = models.init_params(CONFIG, jax.random.key(0))
  rollout = rm.policy_rollout(params, CONFIG, tokenizer, num_rollouts=3, max_prefix_len=8, max_new_tokens=4,
                              batch_size=2)
  prefixes = [tokenizer.encode(t, add_special_tokens=False) for t in ("1+1=", "2*3=", "9-4=")]
  out = rollout(prefixes, jax.random.key(1))
  assert len(out) == 3 and all(len(texts) == 3 for texts in out)  # the last batch is padded, then cut
  assert all(isinstance(t, str) for texts in out for t in texts)
  again = rollout(prefixes, jax.random.key(1))
  assert again == out  # the same key, the same continuations
  first = rollout(prefixes[:1], jax.random.key(1))
  assert first[0] == out[0]  # batches are padded to one shape, so prefix 0 gets the same draws alone
  assert all(len(set(texts)) > 1 for texts in out)  # k draws, not one draw k times


def _greedy(params, prefix, steps):
  """The argmax continuation of `prefix`, one full forward of the unpadded sequence per token."""
  tokens = list(prefix)
  for _ in range(steps):
    logits, _ = models.apply(params, CONFIG, jnp.asarray([tokens]))
    tokens.append(int(jnp.argmax(logits[0, -1])))
  return tokens[len(prefix):]


def test_continuations_follow_their_own_prefix(tokenizer):
  # At temperature 1e-4 sampling is argmax (the random model's logits differ by far more than 1e-4), so each
  # prefix's k continuations are its greedy continuation, computed here without the sampler.
  params = models.init_params(CONFIG, jax.random.key(0))
  rollout = rm.policy_rollout(params, CONFIG, tokenizer, num_rollouts=2, max_prefix_len=8, max_new_tokens=4,
                              batch_size=2, temperature=1e-4)
  prefixes = [tokenizer.encode(t, add_special_tokens=False) for t in ("1+1=", "2*3", "9-4")]
  out = rollout(prefixes, jax.random.key(1))
  expected = [tokenizer.decode(_greedy(params, p, 4), skip_special_tokens=True) for p in prefixes]
  assert out == [[e, e] for e in expected]
  assert len(set(expected)) == 3  # the prefixes lead to different continuations


def test_rejects_empty_budgets(tokenizer):
  with pytest.raises(ValueError, match="num_rollouts"):
    rm.policy_rollout({}, CONFIG, tokenizer, num_rollouts=0, max_prefix_len=8, max_new_tokens=4)
