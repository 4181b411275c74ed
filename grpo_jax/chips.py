"""Accelerator chips' published figures, by JAX's `device_kind`: peak bf16 FLOP/s, memory and its bandwidth.

  chip = chips.find(jax.devices()[0].device_kind)   # None for a kind not in the table (a CPU, an older GPU)

For what a device cannot say about itself: a TPU topology described ahead of time, on a machine without one
(`scripts/aot_compile.py`, `row_chunks.default_budget_bytes`), reports no memory; no device reports its peak
FLOP/s (MFU in the benchmarks). Figures are the vendors' data sheets (Google Cloud's TPU pages, NVIDIA's SXM
data sheets), dense (no sparsity), per chip.
"""

import dataclasses

GiB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One chip's figures."""
  name: str  # short name: v5e, h100
  hbm_gib: float | None  # memory per chip, the data sheet's (None: it differs between the card's variants)
  peak_flops: float  # dense bf16 FLOP/s per chip
  hbm_bandwidth: float | None  # memory bytes/s per chip (None: it differs between the card's variants)
  usable_gib: float | None = None  # what a program may use, as its compiler reports it (TPU: libtpu's
  #                                  "available HBM"); None where not known


TPUS = {  # by the device_kind of a TPU topology's devices
    "TPU v4": Chip("v4", 32, 275e12, 1.2e12, usable_gib=30.75),
    "TPU v5 lite": Chip("v5e", 16, 197e12, 0.819e12, usable_gib=15.75),
    "TPU v5": Chip("v5p", 95, 459e12, 2.765e12, usable_gib=95.74),
    "TPU v6 lite": Chip("v6e", 32, 918e12, 1.64e12, usable_gib=31.25),
}

GPUS = {  # by a part of the device_kind ("NVIDIA H100 80GB HBM3"); the SXM cards' figures
    "H200": Chip("h200", 141, 989e12, 4.8e12),
    "H100": Chip("h100", 80, 989e12, 3.35e12),
    "A100": Chip("a100", None, 312e12, None),  # 40 or 80 GB, 1.6 or 2.0 TB/s
    "L4": Chip("l4", 24, 121e12, 0.3e12),
    "A10": Chip("a10", 24, 125e12, 0.6e12),
}


def find(device_kind: str) -> Chip | None:
  """The chip of `device_kind`: a TPU kind exactly, else the GPU whose longest key is part of it; None if neither."""
  if device_kind in TPUS:
    return TPUS[device_kind]
  keys = [key for key in GPUS if key in device_kind]
  return GPUS[max(keys, key=len)] if keys else None
