r"""The device memory LoRA saves in stage 2, from the byte counts of the trees that stay on the devices (jax.eval_shape
of the runner's own params, adapters, optimiser and LoRA split; no weight is allocated).

  python scripts/lora_memory.py --model=deepseek-math-7b --dtype=bfloat16 --lora_rank=64

It takes the runner's flags --model (a named shape of `grpo_jax.models.presets`), --dtype, --lora_rank, --lora_alpha
and --lora_targets.

Full fine-tuning keeps the policy, a frozen copy of it as π_ref (β > 0), AdamW's two moments of every weight and, in
the update, a gradient of every weight. With LoRA (`grpo_jax.models.lora`) π_ref is the same base arrays with the
adapters switched off (no byte of its own), and the moments and gradients are those of the adapters only.
Activations and the sampler's KV cache are the same either way and are not counted. These are byte counts of the
trees, not the compiler's memory analysis (`scripts/aot_compile.py` does not list the LoRA update's programs yet).
"""

import sys

from absl import app
from absl import flags
import jax
import numpy as np

from experiments import cli  # noqa: F401  pylint: disable=unused-import  # defines the runner's flags
from experiments.runner import config as config_lib
from grpo_jax import models
from grpo_jax import training
from grpo_jax.chips import GiB
from grpo_jax.models import lora
from grpo_jax.models import presets


def nbytes(tree) -> int:
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def resident(config: models.ModelConfig, rank: int, alpha: float, targets) -> dict[str, dict[str, int]]:
  """Bytes by tree, for full fine-tuning and for LoRA at `rank` on `targets` (GRPO with β > 0, AdamW)."""
  key = jax.random.key(0)
  optimizer = training.make_optimizer(1e-6)
  base = jax.eval_shape(models.init_params, config, key)
  adapted_config = lora.lora_config(config, rank=rank, alpha=alpha, targets=targets)
  adapted = jax.eval_shape(lambda k: lora.add_adapters(models.init_params(config, k), adapted_config, k), key)
  trained, frozen = jax.eval_shape(lora.split, adapted)
  moments = lambda params: nbytes(jax.eval_shape(optimizer.init, params))
  full = {"policy weights": nbytes(base), "π_ref": nbytes(base), "AdamW moments": moments(base),
          "gradients (in the update)": nbytes(base)}
  reference = jax.eval_shape(lora.disabled, adapted)  # the base arrays alone: shared with the policy, no new bytes
  with_lora = {"policy weights": nbytes(frozen) + nbytes(trained), "π_ref": nbytes(reference) - nbytes(frozen),
               "AdamW moments": moments(trained), "gradients (in the update)": nbytes(trained)}
  return {"full fine-tuning": full, "LoRA": with_lora}


def main(argv):
  del argv
  f = flags.FLAGS
  if f.model not in presets.PRESETS or f.lora_rank < 1:
    sys.exit(f"--model must be one of {', '.join(presets.PRESETS)} and --lora_rank >= 1")
  config = presets.config(f.model, dtype=f.dtype, param_dtype=f.dtype)
  targets = config_lib.lora_targets(f.lora_targets)
  table = resident(config, f.lora_rank, f.lora_alpha, targets)
  print(f"{f.model}, {f.dtype} weights, LoRA rank {f.lora_rank} on {','.join(targets)} (whole model, GiB)")
  print(f"{'':28}{'full':>10}{'LoRA':>10}")
  for name in table["full fine-tuning"]:
    print(f"{name:28}{table['full fine-tuning'][name] / GiB:10.2f}{table['LoRA'][name] / GiB:10.2f}")
  full, with_lora = (sum(t.values()) / GiB for t in table.values())
  ref = (table["full fine-tuning"]["π_ref"] - table["LoRA"]["π_ref"]) / GiB
  print(f"{'total':28}{full:10.2f}{with_lora:10.2f}   saved {full - with_lora:.2f} GiB, π_ref's copy {ref:.2f} of it")

if __name__ == "__main__":
  app.run(main)
