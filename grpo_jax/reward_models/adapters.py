"""LoRA adapters on a reward model's backbone: training that moves what the reward model prefers.

A "loglik" reward model ranks a problem's samples by its backbone's likelihood of them (s = head + α · Σ log p).
With the backbone frozen only the head and α train, and α only scales that likelihood: within a problem the
trained model prefers what the loaded backbone preferred (docs/reward_models.md). Fine-tuning the whole backbone
on a few thousand samples spoils the likelihood instead. Rank-r adapters (`grpo_jax.models.lora`, Hu et al. 2021)
on the backbone's projections are between the two: the likelihood itself trains, from exactly the loaded model
(B = 0), and the base weights stay as loaded:

  params, config = adapters.add(params, config, key, rank=8)    # the same scores, adapters to train
  optimizer = adapters.optimizer(optax.adam(1e-3))              # adapters, head and α train; the base never moves
  params, config = adapters.merge(params, config)               # a plain reward model (W + A·B·α/r), to save

The objective (`train.reward_objective`) stops the gradient at the base weights whenever `config.lora_rank` > 0,
so only the adapters' backward pass is computed there.
"""

import jax
import optax

from grpo_jax.models import lora
from grpo_jax.models.config import LORA_TARGETS, ModelConfig

Params = dict


def add(params: Params, config: ModelConfig, key: jax.Array, *, rank: int, alpha: float = 16.0,
        targets=LORA_TARGETS) -> tuple[Params, ModelConfig]:
  """`(params, config)` of the reward model with fresh rank-`rank` adapters on `targets` of its backbone (A random,
  B = 0: every score is the loaded model's); the backbone's arrays are shared, not copied."""
  if rank < 1:
    raise ValueError(f"reward-model adapters need a rank >= 1, not {rank}")
  if config.lora_rank:
    raise ValueError("the reward model already has adapters (merge them first)")
  adapted = lora.lora_config(config, rank=rank, alpha=alpha, targets=targets)
  return {**params, "backbone": lora.add_adapters(params["backbone"], adapted, key)}, adapted


def is_trained(path) -> bool:
  """The leaves an adapted reward model trains: the adapters, the head and α (`init_reward_params`)."""
  return lora.is_adapter(path) or getattr(path[0], "key", None) in ("head", "alpha")


def optimizer(inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """`inner` on `is_trained`'s leaves; the base weights never move (no update, no weight decay, no moments)."""
  def labels(params):
    return jax.tree_util.tree_map_with_path(lambda path, _: "trained" if is_trained(path) else "frozen", params)
  return optax.multi_transform({"trained": inner, "frozen": optax.set_to_zero()}, labels)


def stop_base_gradient(params: Params) -> Params:
  """`params` with the backbone's base weights under `stop_gradient` (the adapters, head and α unchanged)."""
  adapters_, base = lora.split(params["backbone"], lora.is_adapter)
  return {**params, "backbone": lora.join(adapters_, jax.lax.stop_gradient(base))}


def merge(params: Params, config: ModelConfig) -> tuple[Params, ModelConfig]:
  """`(params, config)` of the plain reward model the adapted one computes (`lora.merge` of its backbone); a model
  without adapters is returned as it is."""
  if not config.lora_rank:
    return params, config
  backbone, plain = lora.merge(params["backbone"], config)
  return {**params, "backbone": backbone}, plain
