r"""π_ref scoring and the GRPO (or PPO) update, padded vs length-bucketed, on a long tail of completion lengths (#53).

  JAX_PLATFORMS=cpu python scripts/bench_update_layout.py                        # tiny model, tail and equal
  JAX_PLATFORMS=cpu python scripts/bench_update_layout.py --model=0.5b --prompts=4 --samples=8 \
      --max_new_tokens=256 --median=48
  JAX_PLATFORMS=cpu python scripts/bench_update_layout.py --algo=ppo --prompts=128 --samples=1   # PPO, G = 1

The work: `--prompts` prompts of `--prompt_len` random tokens x `--samples` completions each (one group per
prompt), with lengths from `bench_rollout.schedule` (`tail`: log-normal with median `--median` and `--at_cap` of
them at the `--max_new_tokens` cap; `equal`: all at the cap), random tokens. Two layouts of the same rows:

  padded    the runner's `--token_layout=padded`: the completion columns cut to the longest row (rounded up to a
            multiple of 4), each prompt run once per group (`logprobs.jit_token_logprobs` in the row chunks of the
            default memory budget, as the runner calls it), the update in `--padded_micro_batches` equal
            micro-batches of whole groups (the runner's --grad_accum_steps, default 1).
  bucketed  `--token_layout=buckets`: the full width, rows sorted by length into `--micro_batches` micro-batches at
            a ladder of `--widths` widths (`grpo_jax.length_buckets`), one program for every length: the scoring
            in blocks of the narrowest width whose blocks hold 256 tokens or more (`Buckets.scan_blocks`,
            `length_buckets.with_block_tokens`), the update at the ladder's widths.

`--algo=ppo` measures PPO's programs as `experiments.methods.ppo` builds them: padded, π_ref scoring over each row
with its own prompt (`Rollouts.logprobs`), the value forward V_ψ (`objectives.token_values` in the budget's row
chunks) and the policy + value update (`objectives.ppo_objective` over whole rows); bucketed, π_ref and V_ψ each
prompt once per group in blocks (`objectives.bucketed_completion_values`) and the update of both models at the
ladder's widths (`objectives.ppo_prefill`). The value model is a copy of the policy's backbone with a scalar head.

Reported per layout and workload: seconds per call, mean ± s.e. over `--repeats` after a warm-up (compilation
excluded; the compile time of each layout's first call is printed beside), the bucketed/padded speed-up paired
repeat by repeat, the columns each computes, and the roofline fraction: the FLOPs the tokens need (each prompt
once, each completion's own tokens; forward 2 per multiply-add, the update 3x the forward) / time / the
machine's float32 matmul GFLOP/s measured in this run.
"""

import argparse
import functools
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import bench_rollout  # pylint: disable=wrong-import-position

from grpo_jax import length_buckets, logprobs, models, row_chunks, training  # pylint: disable=wrong-import-position
from grpo_jax.models import tiny  # pylint: disable=wrong-import-position
from grpo_jax.training import objectives  # pylint: disable=wrong-import-position
from grpo_jax.training import update as update_lib  # pylint: disable=wrong-import-position


def rows(config, args, lengths):
  """(prompts [B, P], prompt mask, completions [N, T], completion mask): random tokens, lengths as given."""
  rng = np.random.default_rng(2)
  b, p, t = args.prompts, args.prompt_len, args.max_new_tokens
  prompts = rng.integers(3, min(config.vocab_size, 90), (b, p)).astype(np.int32)
  completions = rng.integers(3, min(config.vocab_size, 90), (b * args.samples, t)).astype(np.int32)
  mask = np.arange(t)[None] < lengths[:, None]
  return jnp.asarray(prompts), jnp.ones((b, p), bool), jnp.asarray(completions), jnp.asarray(mask)


def padded_width(lengths, cap: int, multiple: int = 4) -> int:
  return min(cap, -(-int(lengths.max()) // multiple) * multiple)


def flops(config, args, lengths) -> float:
  """Forward FLOPs the tokens need: each prompt once, each completion token attending to P + its position."""
  prompts = bench_rollout.useful_flops(config, 0, np.full(args.prompts, args.prompt_len))
  return prompts + bench_rollout.useful_flops(config, args.prompt_len, lengths)


def programs(params, config, args, lengths):
  """name -> (padded fn, bucketed fn, columns padded, columns bucketed) for scoring and the update."""
  if args.algo == "ppo":
    return ppo_programs(params, config, args, lengths)
  g, p, t = args.samples, args.prompt_len, args.max_new_tokens
  width, buckets, scoring, sequences = shared(config, args, lengths)
  # As the runner builds them (`Placement.logprobs`): the padded forward in row chunks of its default budget.
  layout = dict(group_size=g, prompt_len=p, chunk_size=128)
  padded_score = logprobs.jit_token_logprobs(config, memory_budget=row_chunks.default_budget_bytes(), **layout)
  bucketed_score = logprobs.jit_token_logprobs(config, buckets=scoring, **layout)
  n = len(lengths)
  rng = np.random.default_rng(3)

  def batch(w):
    tokens, attention = sequences(w)
    loss_mask = attention.at[:, :p].set(False)
    old = jnp.asarray(-rng.uniform(1, 3, tokens.shape), jnp.float32) * loss_mask
    adv = jnp.broadcast_to(jnp.asarray(rng.normal(size=(n, 1)), jnp.float32), tokens.shape) * loss_mask
    return training.Batch(tokens, attention, loss_mask, old, old, adv)

  objective = update_lib.bind(training.grpo_objective, config=config, use_reference=False, chunk_size=128,
                              group_size=g, prompt_len=p, loss_kwargs=dict(epsilon=0.2, beta=0.0))
  padded_step, bucketed_step, optimizer = train_steps(
      objective, objective, update_lib.BucketedRows(buckets, config, group_size=g, prompt_len=p), args)
  state = training.init_train_state(params, optimizer)
  padded_batch, full_batch = batch(width), batch(t)
  padded_rows, full_rows = sequences(width), sequences(t)
  return {
      "π_ref scoring": (lambda: padded_score(params, *padded_rows), lambda: bucketed_score(params, *full_rows),
                        n * width, scoring.block_tokens(lengths)),
      "update": (lambda: padded_step(state, padded_batch), lambda: bucketed_step(state, full_batch), n * width,
                 buckets.tokens(lengths)),
  }


def shared(config, args, lengths):
  """What both algorithms' programs share: the padded width, the update's buckets, the scoring's (with the runner's
  floor of tokens a block, `Method.scoring_buckets`) and `sequences(width)` -> (tokens, attention) [N, P + width]."""
  prompts, prompt_mask, completions, mask = rows(config, args, lengths)
  buckets = length_buckets.Buckets(length_buckets.ladder(args.max_new_tokens, args.widths, 4), args.micro_batches)
  scoring = length_buckets.with_block_tokens(buckets, len(lengths), getattr(args, "min_block_tokens", None))
  sequences = functools.partial(sequences_at, prompts, prompt_mask, completions, mask, args.samples)
  return padded_width(lengths, args.max_new_tokens), buckets, scoring, sequences


def train_steps(padded_objective, bucketed_objective, bucketed_rows, args):
  """(padded step, bucketed step, optimizer): plain SGD, so both layouts' updates are their gradients."""
  optimizer = optax.sgd(1e-6)
  return (training.make_train_step(padded_objective, optimizer, args.padded_micro_batches, donate=False),
          training.make_train_step(bucketed_objective, optimizer, donate=False, bucketed=bucketed_rows), optimizer)


def sequences_at(prompts, prompt_mask, completions, mask, g: int, width: int):
  """(tokens, attention) [N, P + width]: each prompt repeated for its G completions, the completions cut to width."""
  return (jnp.concatenate([jnp.repeat(prompts, g, 0), completions[:, :width]], 1),
          jnp.concatenate([jnp.repeat(prompt_mask, g, 0), mask[:, :width]], 1))


def ppo_programs(params, config, args, lengths):
  """`programs` of PPO: π_ref scoring, the value forward and the policy + value update."""
  g, p, t = args.samples, args.prompt_len, args.max_new_tokens
  width, buckets, scoring, sequences = shared(config, args, lengths)
  budget = row_chunks.default_budget_bytes()
  trained = {"policy": params, "value": models.init_scalar_params(config, jax.random.key(1), backbone=params)}
  # As `PPO` builds them: padded, the rollouts' forward (each row its own prompt) and the values in row chunks.
  padded_score = logprobs.jit_token_logprobs(config, memory_budget=budget, chunk_size=128)
  bucketed_score = logprobs.jit_token_logprobs(config, buckets=scoring, group_size=g, prompt_len=p, chunk_size=128)
  padded_values = jax.jit(lambda v, tokens, attention: row_chunks.map_rows(
      lambda x, m: objectives.token_values(v, config, x, m), (tokens, attention),
      row_chunks.rows_per_chunk(tokens.shape[0], row_chunks.forward_row_bytes(config, tokens.shape[1]), budget)))
  bucketed_values = jax.jit(lambda v, tokens, attention: objectives.bucketed_completion_values(
      v, config, tokens[::g, :p], attention[::g, :p], tokens[:, p:], attention[:, p:], group_size=g,
      buckets=scoring))
  n = len(lengths)
  rng = np.random.default_rng(3)

  def batch(w):
    tokens, attention = sequences(w)
    loss_mask = attention.at[:, :p].set(False)
    f32 = lambda x: jnp.asarray(x, jnp.float32) * loss_mask  # noqa: E731
    old = f32(-rng.uniform(1, 3, tokens.shape))
    return training.PPOBatch(tokens, attention, loss_mask, old, old, f32(rng.normal(size=tokens.shape)),
                             f32(rng.normal(size=tokens.shape)), f32(rng.normal(size=tokens.shape)))

  kw = dict(config=config, chunk_size=128, value_clip=0.2, value_coef=1.0, loss_kwargs=dict(epsilon=0.2))
  padded_step, bucketed_step, optimizer = train_steps(
      update_lib.bind(objectives.ppo_objective, **kw), update_lib.bind(objectives.ppo_objective, prompt_len=p, **kw),
      update_lib.BucketedRows(buckets, config, g, p, objectives.ppo_prefill), args)
  state = training.init_train_state(trained, optimizer)
  padded_batch, full_batch = batch(width), batch(t)
  padded_rows, full_rows = sequences(width), sequences(t)
  return {
      "π_ref scoring": (lambda: padded_score(params, *padded_rows), lambda: bucketed_score(params, *full_rows),
                        n * width, scoring.block_tokens(lengths)),
      "value forward": (lambda: padded_values(trained["value"], *padded_rows),
                        lambda: bucketed_values(trained["value"], *full_rows), n * width,
                        scoring.block_tokens(lengths)),
      "update": (lambda: padded_step(state, padded_batch), lambda: bucketed_step(state, full_batch), n * width,
                 buckets.tokens(lengths)),
  }


def _timed(fn) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", choices=sorted(bench_rollout.SHAPES), default="tiny")
  parser.add_argument("--algo", choices=("grpo", "ppo"), default="grpo",
                      help="GRPO's programs (π_ref, update) or PPO's (π_ref, value forward, policy + value update)")
  parser.add_argument("--dtype", default=None, help="float32 (tiny's default) or bfloat16 (0.5b's default)")
  parser.add_argument("--workloads", default="tail,equal")
  parser.add_argument("--prompts", type=int, default=16)
  parser.add_argument("--samples", type=int, default=8)
  parser.add_argument("--prompt_len", type=int, default=64)
  parser.add_argument("--max_new_tokens", type=int, default=192)
  parser.add_argument("--median", type=float, default=40)
  parser.add_argument("--at_cap", type=float, default=0.02)
  parser.add_argument("--micro_batches", type=int, default=8)
  parser.add_argument("--widths", type=int, default=4)
  parser.add_argument("--padded_micro_batches", type=int, default=1, help="the padded update's (--grad_accum_steps)")
  parser.add_argument("--min_block_tokens", type=int, default=None,
                      help="the scoring blocks' floor of tokens (default: MIN_BLOCK_TOKENS, as the runner)")
  parser.add_argument("--programs", default="",
                      help="comma-separated programs to time, each a prefix of a table's name (π_ref, update, value); "
                           "default: all")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--json", default="", help="also write the figures here")
  args = parser.parse_args()
  dtype = args.dtype or ("bfloat16" if args.model == "0.5b" else "float32")
  ckpt = pathlib.Path(tempfile.mkdtemp()) / "ckpt"
  tiny.build_default_checkpoint(ckpt, seed=0, param_dtype=dtype, **bench_rollout.SHAPES[args.model])
  params, config = models.load_hf(ckpt, dtype=dtype)
  peak = bench_rollout.matmul_gflops()
  n = args.prompts * args.samples
  print(f"machine: {os.cpu_count()} cores, float32 matmul {peak:.1f} GFLOP/s; {args.algo}; {args.model} ({dtype}), "
        f"{args.prompts} prompts x {args.samples} samples, prompt {args.prompt_len}, cap {args.max_new_tokens}; "
        f"{args.micro_batches} micro-batches, {args.widths} widths "
        f"{length_buckets.ladder(args.max_new_tokens, args.widths, 4)}; jax {jax.__version__}; "
        f"load {os.getloadavg()[0]:.1f}")
  results = {}
  for kind in args.workloads.split(","):
    lengths = bench_rollout.schedule(kind, n, args.max_new_tokens, args.median, args.at_cap)
    forward = flops(config, args, lengths)
    print(f"\n{kind}: {int(lengths.sum())} completion tokens (mean {lengths.mean():.1f}, longest {lengths.max()}); "
          f"padded to {padded_width(lengths, args.max_new_tokens)} columns")
    print("| program | layout | columns | compile s | s per call | speed-up (paired) | roofline |")
    print("|---|---|---|---|---|---|---|")
    results[kind] = {}
    for name, (padded, bucketed, cols_padded, cols_bucketed) in programs(params, config, args, lengths).items():
      if args.programs and not any(name.startswith(x) for x in args.programs.split(",")):
        continue
      compile_s = [_timed(padded), _timed(bucketed)]
      times = [[], []]
      for _ in range(args.repeats):  # interleaved: a drift of the machine hits both alike
        times[0].append(_timed(padded))
        times[1].append(_timed(bucketed))
      work = forward * (3 if name == "update" else 1) * (2 if name == "update" and args.algo == "ppo" else 1)
      speedup = bench_rollout.mean_se(a / b for a, b in zip(*times))
      row = {}
      for layout, ts, cols, c in zip(("padded", "bucketed"), times, (cols_padded, cols_bucketed), compile_s):
        mean, se = bench_rollout.mean_se(ts)
        row[layout] = dict(seconds=mean, se=se, columns=cols, compile_s=c,
                           roofline=work / statistics.mean(ts) / (peak * 1e9))
        up = f"{speedup[0]:.2f} ± {speedup[1]:.2f}x" if layout == "bucketed" else ""
        print(f"| {name} | {layout} | {cols} | {c:.1f} | {mean:.3f} ± {se:.3f} | {up} | "
              f"{row[layout]['roofline']:.1%} |")
      row["speedup"], row["speedup_se"] = speedup
      results[kind][name] = row
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(dict(peak_gflops=peak, args=vars(args), results=results), indent=1))


if __name__ == "__main__":
  main()
