"""grpo_jax.chips: a device_kind finds its chip (TPU kinds exactly, GPU kinds by their longest key)."""

from grpo_jax import chips


def test_find():
  assert chips.find("TPU v5 lite") == chips.TPUS["TPU v5 lite"] and chips.find("TPU v5").name == "v5p"
  assert chips.find("TPU v5 lite").usable_gib == 15.75 and chips.find("TPU v5 lite").hbm_gib == 16
  assert chips.find("NVIDIA H100 80GB HBM3").name == "h100"
  assert chips.find("NVIDIA H200").peak_flops == 989e12 and chips.find("NVIDIA H200").hbm_gib == 141
  assert chips.find("NVIDIA A100-SXM4-40GB").name == "a100"  # not A10, also a part of the name
  assert chips.find("NVIDIA A10").name == "a10"
  assert chips.find("cpu") is None and chips.find("TPU v9") is None and chips.find("") is None
