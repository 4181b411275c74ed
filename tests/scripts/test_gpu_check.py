"""scripts/gpu_check.py: its rooflines by hand, its table from known parts, and its parts at tiny shapes (`--smoke`,
what scripts/gpu_check.sh runs on a GPU at Qwen2.5-0.5B's shapes)."""

import argparse
import importlib.util
import json
import pathlib

import jax
import jax.numpy as jnp
import pytest


_spec = importlib.util.spec_from_file_location("gpu_check", pathlib.Path(__file__).parents[2] / "scripts" /
                                               "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


def test_weight_bytes_and_decode_limit_by_hand():
  config = gpu_check.config_for("0.5b", smoke=True)  # hidden 64, mlp 128, 2 layers, 4 heads of 16, 2 kv heads
  v, e, m = config.vocab_size, 64, 128
  layer = (e * 64 + 64) + 2 * (e * 32 + 32) + 64 * e + 3 * e * m + 2 * e
  assert gpu_check.weight_bytes(config) == 2 * (v * e + 2 * layer + e)  # bf16, tied embeddings
  # 4 rows, prompt 8, 4 new tokens: the cache at the mean length holds 4 x (8 + 2) x 2 layers x 2 (k, v) x 2 heads
  # x 16 dims bf16 values = 10,240 bytes; each of the 4 steps reads it and the weights once.
  w = gpu_check.weight_bytes(config)
  assert gpu_check.decode_limit_s(config, 4, 8, 4, copy_rate=1e9) == pytest.approx(4 * (w + 10_240) / 1e9)


def test_table_from_known_parts(tmp_path):
  parts = {
      "roofline": {"device": "NVIDIA H200", "backend": "gpu", "jax": "0.11.2", "matmul_flops": 790e12,
                   "copy_bytes_per_s": 4.0e12},
      "init": {"rows": [{"shape": "0.5b", "scan_layers": False, "compile_s": 2.5, "run_s": 0.25,
                         "weight_bytes": 988e6}]},
      "grpo": {"step_s": 0.5, "sampling_s": 0.25, "scoring_s": 0.05, "update_s": 0.2, "tokens_per_s": 65_000,
               "peak_rss_bytes": 3 * 2**30, "weight_bytes": 2**30, "rows": 128, "new_tokens": 256,
               "update_tokens": 35_000, "update_mfu": 0.6, "sampling_roofline_fraction": 0.4},
      "sampler": {"rows": [{"rows": 256, "new_tokens": 256, "prompt": 64, "jax_s": 0.5, "hf_s": 4.0,
                            "tokens_per_s": 131_072, "speedup": 8.0, "roofline_fraction": 0.42}]},
      "variants": {"rows": [{"name": "graphs", "step_s": 0.4, "sampling_s": 0.15, "scoring_s": 0.05,
                             "update_s": 0.2},
                            {"name": "attention cudnn", "error": "out of time after 75 s"}]},
  }
  for name, value in parts.items():
    (tmp_path / f"{name}.json").write_text(json.dumps(value))
  lines = gpu_check.table(argparse.Namespace(out=str(tmp_path))).splitlines()
  assert lines[0] == "NVIDIA H200 (gpu, jax 0.11.2): measured bf16 matmul 790 TFLOP/s, copy 4.00 TB/s"
  assert "| init_params 0.5b | compiles in 2.5 s, runs in 0.25 s | goal: seconds |" in lines
  assert "| its update | 0.200 s, 35,000 tokens | 60% MFU (goal 50%) |" in lines
  assert ("| peak host RSS | 3.00 GiB for 1.00 GiB of weights | 3.0x the weights (goal ~2x + a constant) |"
          in lines)
  assert ("| GRPO step, graphs | 0.400 s (sampling 0.150, scoring 0.050, update 0.200) | 1.25x the step above |"
          in lines)
  assert "| GRPO step, attention cudnn | failed: out of time after 75 s | - |" in lines
  # 790 / 989 TFLOP/s and 4.00 / 4.80 TB/s: H200's data sheet (grpo_jax.chips)
  assert ("| the roofline itself | bf16 matmul 790 TFLOP/s, copy 4.00 TB/s | 80% and 83% of the data sheet's 989 "
          "TFLOP/s and 4.80 TB/s |" in lines)
  assert any(l.startswith("| sampler 256 x 256 (prompt 64) | 0.500 s, 131,072 tokens/s; HF generate 4.000 s (8.0x)"
                          " | 42% of the decode limit") for l in lines)


def test_smoke_parts_write_what_the_table_reads(tmp_path):
  args = argparse.Namespace(out=str(tmp_path), scratch=str(tmp_path / "scratch"), smoke=True, prompt_tokens=8.0)
  roof = gpu_check.roofline(args)
  assert roof["matmul_flops"] > 0 and roof["copy_bytes_per_s"] > 0 and roof["backend"] == jax.default_backend()
  (tmp_path / "roofline.json").write_text(json.dumps(roof))
  init = gpu_check.init(args)
  assert [r["scan_layers"] for r in init["rows"]] == [False, True]
  assert all(r["compile_s"] > 0 and r["run_s"] > 0 for r in init["rows"])
  assert init["rows"][0]["weight_bytes"] == gpu_check.weight_bytes(gpu_check.config_for("0.5b", smoke=True))
  (tmp_path / "init.json").write_text(json.dumps(init))
  assert "init_params smoke scanned" in gpu_check.table(args)
  engine = gpu_check.engine(args)  # the static sampler and the engine, equal and long-tail lengths
  together = "engine (default slots), projections together"
  assert [(r["workload"], r["sampler"]) for r in engine["rows"]] == [
      ("equal", "static"), ("equal", "engine 2"), ("equal", together), ("tail", "static"), ("tail", "engine 2"),
      ("tail", together)]
  assert [r["useful_tokens"] for r in engine["rows"]][:3] == [32, 32, 32] and engine["rows"][3]["useful_tokens"] < 32
  (tmp_path / "engine.json").write_text(json.dumps(engine))
  assert "| engine 2, tail lengths (" in gpu_check.table(args)
  layout = gpu_check.layout(args)  # scoring and the update, padded and in length buckets
  assert [(r["workload"], r["program"], r["layout"]) for r in layout["rows"]][:4] == [
      ("equal", "π_ref scoring", "padded"), ("equal", "π_ref scoring", "buckets"), ("equal", "update", "padded"),
      ("equal", "update", "buckets")]
  assert all(r["seconds"] > 0 and r["mfu"] > 0 for r in layout["rows"])
  tail = [r for r in layout["rows"] if r["workload"] == "tail"]
  assert tail[0]["useful_tokens"] < 8 * 4 and tail[1]["columns"] <= tail[0]["columns"]
  (tmp_path / "layout.json").write_text(json.dumps(layout))
  assert "| update, buckets, tail lengths (" in gpu_check.table(args)


def test_attention_check_passes_xla_and_catches_a_wrong_mask(monkeypatch):
  """The GPU's fused-attention check, run here with xla standing in for cuDNN: rounding passes, a kernel that
  ignores the padding mask is caught."""
  from grpo_jax.models import attention  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(attention, "resolve", lambda *args: "xla")
  good = gpu_check.attention_check(smoke=True)
  assert good["implementation"] == "xla" and max(good[k] for k in ("out", "dq", "dk", "dv")) < 1e-2
  real = attention.attend

  def ignores_padding(q, k, v, allowed, implementation, causal):
    if implementation == "xla":
      allowed = jnp.tril(jnp.ones_like(allowed))
    return real(q, k, v, allowed, implementation="einsum", causal=causal)

  monkeypatch.setattr(attention, "attend", ignores_padding)
  bad = gpu_check.attention_check(smoke=True)
  assert bad["out"] > 0.1 and bad["dk"] > 0.1
