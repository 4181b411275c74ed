"""scripts/lora_memory.py: the bytes of the trees full fine-tuning and LoRA keep on the devices, by hand."""

import importlib.util
import pathlib
import subprocess
import sys

from grpo_jax import models

_SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "lora_memory.py"
_spec = importlib.util.spec_from_file_location("lora_memory", _SCRIPT)
lora_memory = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lora_memory)


def test_resident_bytes_by_hand():
  config = models.ModelConfig(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=4, tie_word_embeddings=False,
                              param_dtype="bfloat16", dtype="bfloat16")
  table = lora_memory.resident(config, rank=2, alpha=4.0, targets=("q", "down"))
  e, m, v, h, k, d, layers = 16, 24, 50, 4, 2, 4, 3
  weights = 2 * (2 * v * e + e + layers * (e * h * d + 2 * e * k * d + h * d * e + 3 * e * m + 2 * e))  # bf16
  adapters = 4 * layers * 2 * ((e + h * d) + (m + e))  # float32 A [in, r] and B [r, out] on q and down
  full, lora = table["full fine-tuning"], table["LoRA"]
  assert full == {"policy weights": weights, "π_ref": weights, "AdamW moments": 2 * weights + 4,  # + its step count
                  "gradients (in the update)": weights}
  assert lora == {"policy weights": weights + adapters, "π_ref": 0, "AdamW moments": 2 * adapters + 4,
                  "gradients (in the update)": adapters}


def test_bad_flags_are_one_line():
  result = subprocess.run([sys.executable, str(_SCRIPT), "--model=deepseek-math-7b", "--lora_rank=0"],
                          capture_output=True, text=True, timeout=300, cwd=_SCRIPT.parents[1])
  assert result.returncode != 0 and result.stderr.strip().splitlines()[-1].startswith("--model must be one of")
