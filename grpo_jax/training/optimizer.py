"""The optimiser: AdamW with linear warm-up, an optional cosine decay and global-norm clipping."""

import optax


def make_optimizer(
    learning_rate: float,
    *,
    warmup_steps: int = 0,
    total_steps: int | None = None,
    schedule: str = "constant",
    weight_decay: float = 0.0,
    max_grad_norm: float | None = 1.0,
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
) -> optax.GradientTransformation:
  """clip_by_global_norm → AdamW, with the learning rate rising linearly over `warmup_steps`.

  Args:
    learning_rate: peak learning rate.
    warmup_steps: linear warm-up from 0.
    total_steps: needed by the cosine schedule.
    schedule: "constant" after warm-up, or "cosine" decay to 10% at `total_steps`.
    weight_decay: AdamW's decoupled weight decay.
    max_grad_norm: clip threshold, or None for no clipping.
    b1, b2, eps: Adam's moments and epsilon.
  """
  if learning_rate <= 0:
    raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
  if schedule == "constant":
    lr = optax.join_schedules(
        [optax.linear_schedule(0.0, learning_rate, max(warmup_steps, 1)), optax.constant_schedule(learning_rate)],
        [max(warmup_steps, 1)]) if warmup_steps > 0 else learning_rate
  elif schedule == "cosine":
    if not total_steps or total_steps <= warmup_steps:
      raise ValueError(f"cosine schedule needs total_steps > warmup_steps, got {total_steps}, {warmup_steps}")
    if warmup_steps > 0:
      lr = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup_steps, total_steps,
                                              end_value=0.1 * learning_rate)
    else:
      lr = optax.cosine_decay_schedule(learning_rate, total_steps, alpha=0.1)
  else:
    raise ValueError(f"unknown schedule {schedule!r}; expected 'constant' or 'cosine'")
  chain = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm else []
  chain.append(optax.adamw(lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay))
  return optax.chain(*chain)
