"""Per-token log-probabilities of given sequences, chunked over the length.

The [B, L, V] float32 log-softmax is never materialised: the unembedding,
log-softmax and gather run per chunk of `chunk_size` positions inside a
`lax.scan` whose body is wrapped in `jax.checkpoint`, so the backward pass
recomputes each chunk's logits instead of storing them.
"""

from collections.abc import Mapping

import chex
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from grpo_jax import sharding
from grpo_jax.models import transformer
from grpo_jax.models.config import ModelConfig
from grpo_jax.sampling import SampleOutput


def token_logprobs(params, config: ModelConfig, tokens: jax.Array, attention_mask: jax.Array, *,
                   positions: jax.Array | None = None, chunk_size: int = 128, return_entropy: bool = False,
                   temperature: float = 1.0):
  """logp[:, t] = log π(tokens[:, t] | tokens[:, :t]), aligned with `tokens`.

  With z = logits(h_{t-1}) / temperature:  logp_t = z[tokens_t] − logsumexp(z),
  entropy_t = logsumexp(z) − Σ_v softmax(z)_v z_v.
  Entries are 0 at t = 0, where attention_mask is False, and where the previous
  position is padding (the first token of a left-padded prompt has no context).

  Args:
    params: policy params (differentiable).
    config: the ModelConfig.
    tokens: [B, L] ids: left-padded prompt + right-padded completion.
    attention_mask: [B, L] bool, False at padding.
    positions: [B, L] positions; default from the mask (cumsum - 1).
    chunk_size: positions per chunk; the peak extra memory is ~B * chunk_size * V floats.
    return_entropy: also return the per-position entropy.
    temperature: divides the logits.

  Returns:
    logp [B, L] float32, or (logp, entropy) with entropy [B, L] float32.
  """
  chex.assert_rank([tokens, attention_mask], 2)
  chex.assert_equal_shape([tokens, attention_mask])
  b, l = tokens.shape
  mask = attention_mask.astype(bool)
  hidden, _ = transformer.hidden_states(params, config, tokens, positions=positions, attention_mask=mask)
  w = transformer.unembedding(params, config).astype(hidden.dtype)  # [V, E]

  # Position t - 1 predicts token t.
  h, targets = hidden[:, :-1], tokens[:, 1:]
  n_pred = l - 1
  chunk = max(1, min(chunk_size, n_pred))
  n_chunks = -(-n_pred // chunk)
  pad = n_chunks * chunk - n_pred
  h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
  targets = jnp.pad(targets, ((0, 0), (0, pad)))
  h = h.reshape(b, n_chunks, chunk, -1).swapaxes(0, 1)
  targets = targets.reshape(b, n_chunks, chunk).swapaxes(0, 1)

  @jax.checkpoint
  def chunk_fn(h_c, t_c):
    z = jnp.einsum("bce,ve->bcv", h_c, w, preferred_element_type=jnp.float32) / temperature
    log_z = jax.nn.logsumexp(z, axis=-1)
    logp = jnp.take_along_axis(z, t_c[..., None], axis=-1)[..., 0] - log_z
    if not return_entropy:
      return logp, jnp.zeros_like(logp)
    entropy = log_z - jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1)
    return logp, entropy

  _, (logp, entropy) = jax.lax.scan(lambda c, x: (c, chunk_fn(*x)), None, (h, targets))
  valid = mask[:, 1:] & mask[:, :-1]

  def align(x):
    x = x.swapaxes(0, 1).reshape(b, n_chunks * chunk)[:, :n_pred]
    return jnp.pad(jnp.where(valid, x, 0.0), ((0, 0), (1, 0)))

  if return_entropy:
    return align(logp), align(entropy)
  return align(logp)


def jit_token_logprobs(config: ModelConfig, *, mesh: Mesh | None = None, rules: Mapping | None = None,
                       chunk_size: int = 128, return_entropy: bool = False, temperature: float = 1.0):
  """A jitted `fn(params, tokens, attention_mask)` computing `token_logprobs` (e.g. π_old or π_ref).

  Params are an argument, never a compile-time constant. With `mesh` and `rules`
  the function has explicit in/out shardings: params placed by the rules, rows of
  tokens, mask and outputs split over the data axes (inputs are re-sharded as
  needed); one compilation per input shape.
  """
  kwargs = dict(chunk_size=chunk_size, return_entropy=return_entropy, temperature=temperature)
  body = lambda params, tokens, mask: token_logprobs(params, config, tokens, mask, **kwargs)
  if (mesh is None) != (rules is None):
    raise ValueError("jit_token_logprobs: pass both mesh and rules, or neither")
  if mesh is None:
    return jax.jit(body)
  params_sh = sharding.param_shardings(mesh, rules, jax.eval_shape(transformer.init_params, config,
                                                                   jax.random.key(0)))
  compiled = {}

  def jitted(shape):
    """The jitted function for tokens of `shape` and the rows' sharding (built once per shape)."""
    shape = tuple(shape)
    if shape not in compiled:
      rows = sharding.logical_sharding(mesh, rules, ("batch", None), shape)
      out = (rows, rows) if return_entropy else rows
      compiled[shape] = (sharding.jit_with_rules(body, mesh, rules, in_shardings=(params_sh, rows, rows),
                                                 out_shardings=out), rows)
    return compiled[shape]

  def call(params, tokens, attention_mask):
    fn, rows = jitted(tokens.shape)
    return fn(*sharding.put((params, tokens, attention_mask), (params_sh, rows, rows)))

  call.jitted = lambda shape: jitted(shape)[0]  # ahead of time: call.jitted(shape).lower(abstract args)
  return call


def sequences_from_samples(samples: SampleOutput) -> tuple[jax.Array, jax.Array]:
  """(tokens [N, P + T], attention_mask [N, P + T]) = prompt then completion, for `token_logprobs`."""
  tokens = jnp.concatenate([samples.prompt_tokens, samples.tokens], axis=1)
  mask = jnp.concatenate([samples.prompt_mask, samples.mask], axis=1)
  return tokens, mask


def completion_logprobs(params, config: ModelConfig, samples: SampleOutput, **kwargs):
  """Log-probs [N, T] of the sampled completions under `params` (aligned with `samples.tokens`).

  Args:
    params: policy params.
    config: the ModelConfig.
    samples: a SampleOutput.
    **kwargs: `chunk_size`, `return_entropy`, `temperature` of `token_logprobs`.

  Returns:
    logp [N, T] (0 where samples.mask is False), or (logp, entropy).
  """
  tokens, mask = sequences_from_samples(samples)
  out = token_logprobs(params, config, tokens, mask, **kwargs)
  p = samples.prompt_tokens.shape[1]
  return jax.tree.map(lambda x: x[:, p:], out)
