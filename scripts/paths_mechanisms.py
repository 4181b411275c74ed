r"""Issue 56's two mechanisms on the paths task: offline data goes stale, and step labels say what the outcome does not.

  python scripts/paths_mechanisms.py --out_dir=runs/paths_mechanisms --seeds=3 --rl_steps=20

The runs, each `python -m experiments.grpo_math` in `--out_dir/<name>`:

  sft          stage 1 on `--task=synthetic_paths` (`--sft_examples` solutions, `--sft_steps` steps), seed 0, no RL
  grpo/seedS   GRPO+OS from sft/sft_policy: `--rl_steps` steps of `--batch_size` prompts x `--group_size`, seed S
  sft_chain    with `--chain`: stage 1 of the default chain task (the runner's defaults), seed 0, for (b)'s contrast

Then, in this process, on the first `--problems` held-out problems, with sampling key S for seed S, at the rollouts'
temperature `--temperature`, `--samples` completions a problem from each policy:

(a) Offline data goes stale. The offline pool is the frozen SFT policy's correct samples (what Table 10's RFT
    trains on). Per seed: Δ log π of the pool, the mean over its completions of log π_RL(y) − log π_SFT(y) (nats per
    completion, at the temperature; below 0: the RL policy has moved away from the data), and the same for the RL
    policy's own correct samples (above 0); the share of the RL policy's correct samples whose solution path the
    pool holds for that problem, against a second SFT sample of the same size (the control: what an unchanged
    policy would give); and the share of correct samples on each problem's most frequent path (concentration).
(b) Step labels carry what the outcome does not. On the SFT policy's samples, with exact step labels: among wrong
    solutions, the share of their steps that are right (all before the first wrong one: outcome supervision
    penalises them, process supervision does not); and over every step, the Pearson correlation of the step's
    advantage with its exact label, under outcome supervision (GRPO: `losses.group_advantages` of correctness,
    one value for all of a solution's steps) and under process supervision (`losses.process_advantages` of the
    exact labels, as `--reward=exact_steps --supervision=process` assigns them).

Written: results.md (mean ± s.e. over seeds, per-seed values) and results.json. A run whose summary.json exists is
skipped (one made with other flags is refused); SIGTERM stops the runs in flight.
"""

import argparse
import collections
import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import distill_vs_grpo as runs_lib  # noqa: E402  (the run plan's scheduling: Run, run_plan, finished)

PATHS_TASK = dict(task="synthetic_paths", paths_min_steps=4, paths_max_steps=8, num_train=20000, max_prompt_len=24,
                  max_new_tokens=96)  # experiments/configs/synthetic_paths.cfg


def plan(args) -> list[runs_lib.Run]:
  out = pathlib.Path(args.out_dir).resolve()
  quiet = dict(eval_every=0, num_test=args.num_test, tensorboard=False)
  runs = [runs_lib.Run("sft", dict(**PATHS_TASK, sft_examples=args.sft_examples, sft_steps=args.sft_steps, steps=0,
                                   seed=0, **quiet))]
  for seed in range(args.seeds):
    runs.append(runs_lib.Run(f"grpo/seed{seed}", dict(
        **PATHS_TASK, sft_examples=args.sft_examples, init_checkpoint=str(out / "sft" / "sft_policy"), algo="grpo",
        steps=args.rl_steps, batch_size=args.batch_size, group_size=args.group_size,
        learning_rate=args.learning_rate, temperature=args.temperature, save_every=10, seed=seed, **quiet),
        ("sft",)))
  if args.chain:
    runs.append(runs_lib.Run("sft_chain", dict(steps=0, seed=0, **quiet)))
  return runs


# ---- statistics (pure: lists and arrays in, numbers out) ----

def mean_se(values) -> tuple[float, float]:
  return runs_lib.mean_se(list(values))


def path_share(paths: list[list[tuple]], reference: list[list[tuple]]) -> float:
  """Of the correct samples' paths (per problem), the share that `reference` holds for the same problem."""
  hits = total = 0
  for mine, theirs in zip(paths, reference):
    held = set(theirs)
    hits += sum(p in held for p in mine)
    total += len(mine)
  return hits / total if total else float("nan")


def modal_share(paths: list[list[tuple]]) -> float:
  """Share of the correct samples that lie on their problem's most frequent path (problems with one or more)."""
  top = sum(collections.Counter(p).most_common(1)[0][1] for p in paths if p)
  total = sum(len(p) for p in paths)
  return top / total if total else float("nan")


def pearson(x: np.ndarray, y: np.ndarray) -> float:
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if x.size < 2 or x.std() == 0 or y.std() == 0:
    return float("nan")
  return float(np.corrcoef(x, y)[0, 1])


def step_advantages(labels: list[np.ndarray], correct: list[bool]) -> tuple[np.ndarray, np.ndarray]:
  """One group's per-segment advantages: `(outcome [G, K], process [G, K])`, K the most segments, 0 past a
  sample's own. Outcome: `losses.group_advantages` of correctness on every segment. Process:
  `losses.process_advantages` of the exact segment labels, each segment taken as one token (its own end)."""
  from grpo_jax import losses  # pylint: disable=import-outside-toplevel  (JAX: not needed to plan runs)
  g, k = len(labels), max(1, max(len(l) for l in labels))
  rewards = np.zeros((1, g, k), np.float32)
  mask = np.zeros((1, g, k), bool)
  for i, l in enumerate(labels):
    rewards[0, i, :len(l)], mask[0, i, :len(l)] = l, True
  ends = np.broadcast_to(np.arange(k, dtype=np.int32), (1, g, k))
  process = np.asarray(losses.process_advantages(rewards, ends, mask, mask))[0]
  outcome = np.asarray(losses.group_advantages(np.asarray([correct], np.float32)))[0]
  return np.where(mask[0], outcome[:, None], 0.0), np.where(mask[0], process, 0.0)


def step_statistics(groups: list[tuple[list[np.ndarray], list[bool], list[int]]]) -> dict:
  """(b)'s numbers from groups of (per sample: exact segment labels, correct, number of steps (segments before
  the answer segment)).

  wrong_right_steps: among wrong samples' steps, the share that are right; wrong_with_right_step: the share of
  wrong samples with at least one right step; corr_outcome / corr_process: Pearson correlation, over all steps of
  all samples, of the step's outcome / process advantage with its exact label.
  """
  right = steps = wrong_with = wrong = 0
  adv_o, adv_p, truth = [], [], []
  for labels, correct, num_steps in groups:
    outcome, process = step_advantages(labels, correct)
    for i, (l, ok, n) in enumerate(zip(labels, correct, num_steps)):
      if not ok:
        wrong += 1
        right += int(np.sum(l[:n] > 0))
        steps += n
        wrong_with += int(np.any(l[:n] > 0))
      adv_o.extend(outcome[i, :n])
      adv_p.extend(process[i, :n])
      truth.extend(l[:n])
  return {"wrong_right_steps": right / steps if steps else float("nan"),
          "wrong_with_right_step": wrong_with / wrong if wrong else float("nan"),
          "corr_outcome": pearson(np.asarray(adv_o), np.asarray(truth)),
          "corr_process": pearson(np.asarray(adv_p), np.asarray(truth)), "steps": len(truth), "wrong": wrong}


def staleness(pool_sft: list[float], pool_rl: list[float], fresh_sft: list[float], fresh_rl: list[float],
              rl_paths, pool_paths, control_paths) -> dict:
  """(a)'s numbers for one seed: log-likelihoods (per completion) of the offline pool and of the RL policy's own
  correct samples under both policies, and the correct samples' paths per problem."""
  return {"pool_dlogp": float(np.mean(np.subtract(pool_rl, pool_sft))) if pool_sft else float("nan"),
          "fresh_dlogp": float(np.mean(np.subtract(fresh_rl, fresh_sft))) if fresh_sft else float("nan"),
          "rl_paths_in_pool": path_share(rl_paths, pool_paths),
          "control_paths_in_pool": path_share(control_paths, pool_paths),
          "modal_sft": modal_share(pool_paths), "modal_rl": modal_share(rl_paths),
          "pool_size": len(pool_sft), "fresh_size": len(fresh_sft)}


def _row(per_seed: dict, key: str, label: str, seeds: list[int], digits: int = 3) -> str:
  """One table row: the per-seed values of `key` and their mean ± s.e."""
  per = [per_seed[str(s)][key] for s in seeds if str(s) in per_seed]
  m, se = mean_se(per) if per else (float("nan"), float("nan"))
  return f"| {label} | {' | '.join(f'{v:.{digits}f}' for v in per)} | {m:.{digits}f} ± {se:.{digits}f} |"


def markdown(result: dict, seeds: list[int]) -> str:
  head = "| | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± s.e. |\n|---|" + "---|" * (len(seeds) + 1)
  a = result["staleness"]
  lines = [f"SFT start: {result['start_accuracy']} held-out greedy accuracy; after GRPO: {result['rl_accuracy']}",
           "", "(a) offline data goes stale", "", head,
           _row(a, "pool_dlogp", "Δ log π of the offline pool (RL − SFT, nats per completion)", seeds, 2),
           _row(a, "fresh_dlogp", "Δ log π of the RL policy's own correct samples", seeds, 2),
           _row(a, "rl_paths_in_pool", "RL's correct paths that the pool holds (share)", seeds),
           _row(a, "control_paths_in_pool", "control: a second SFT sample's correct paths that the pool holds", seeds),
           _row(a, "modal_sft", "correct samples on their problem's modal path, SFT", seeds),
           _row(a, "modal_rl", "correct samples on their problem's modal path, RL", seeds),
           "", "(b) step labels against the outcome (the SFT policy's samples)", "", head]
  for task in ("paths", "chain"):
    b = result["steps"].get(task)
    if b:
      lines += [_row(b, "wrong_right_steps", f"{task}: right steps among wrong solutions' steps", seeds),
                _row(b, "wrong_with_right_step", f"{task}: wrong solutions with a right step", seeds),
                _row(b, "corr_outcome", f"{task}: corr(outcome advantage, step label)", seeds),
                _row(b, "corr_process", f"{task}: corr(process advantage, step label)", seeds)]
  return "\n".join(lines) + "\n"


# ---- sampling and scoring (JAX) ----

class Policy:
  """An HF checkpoint with its tokenizer: samples completions and scores given ones."""

  def __init__(self, path: pathlib.Path, max_prompt_len: int, max_new_tokens: int, temperature: float):
    import jax  # pylint: disable=import-outside-toplevel
    from grpo_jax import logprobs, models  # pylint: disable=import-outside-toplevel
    self.params, self.config = models.load_hf(path)
    self.tokenizer = models.load_tokenizer(path)
    self.p, self.t, self.temperature = max_prompt_len, max_new_tokens, temperature
    self._logp = jax.jit(lambda params, tokens, mask: logprobs.token_logprobs(
        params, self.config, tokens, mask, temperature=temperature))

  def sample(self, prompts: list[str], n: int, key) -> list[list[str]]:
    from grpo_jax import evaluation  # pylint: disable=import-outside-toplevel
    texts, _ = evaluation.generate(self.params, self.config, self.tokenizer, prompts, key, batch_size=len(prompts),
                                 max_prompt_len=self.p, max_new_tokens=self.t, num_samples=n,
                                 temperature=self.temperature)
    return texts

  def loglik(self, prompts: list[str], completions: list[str], rows: int = 256) -> list[float]:
    """log π(completion + end token | prompt) at the temperature, summed over the completion's tokens."""
    tok, out = self.tokenizer, []
    pad = tok.pad_token_id or 0
    for start in range(0, len(prompts), rows):
      chunk = list(zip(prompts[start:start + rows], completions[start:start + rows]))
      real = len(chunk)
      chunk += [chunk[0]] * (rows - real)
      tokens = np.full((rows, self.p + self.t), pad, np.int32)
      mask = np.zeros_like(tokens, bool)
      for i, (prompt, completion) in enumerate(chunk):
        p = tok.encode(prompt, add_special_tokens=False)[-self.p:]
        c = (tok.encode(completion, add_special_tokens=False) + [tok.eos_token_id])[:self.t]
        tokens[i, self.p - len(p):self.p], mask[i, self.p - len(p):self.p] = p, True
        tokens[i, self.p:self.p + len(c)], mask[i, self.p:self.p + len(c)] = c, True
      logp = np.asarray(self._logp(self.params, tokens, mask))[:, self.p:]
      out.extend(np.sum(np.where(mask[:, self.p:], logp, 0.0), axis=1)[:real].tolist())
    return out


def analyse(args, out: pathlib.Path, seeds: list[int]) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  from grpo_jax.data import answer, step_labels, steps as steps_lib, synthetic, synthetic_paths as sp  # pylint: disable=import-outside-toplevel
  from grpo_jax.data.steps import FINAL_MARKER  # pylint: disable=import-outside-toplevel
  _, test = sp.make_splits(0, args.num_test, seed=0)  # seed 0's held-out set, as the runs' evaluation reads it
  problems = test[:args.problems]
  prompts = [e.question + "\n" for e in problems]
  sft = Policy(out / "sft" / "sft_policy", PATHS_TASK["max_prompt_len"], PATHS_TASK["max_new_tokens"],
               args.temperature)

  def right(text, example):
    return answer.answers_equal(answer.extract_answer(text), example.answer)

  def groups_of(examples, texts):
    rows = []
    for e, samples in zip(examples, texts):
      correct = [right(t, e) for t in samples]
      labels = [step_labels.exact_labels(e, t, correct=c) for t, c in zip(samples, correct)]
      rows.append((labels, correct, [len(steps_lib.split_steps(t)) for t in samples]))
    return rows

  chain = None
  if args.chain:
    _, chain_test = synthetic.make_splits(0, args.num_test, seed=0)
    chain = (chain_test[:args.problems], Policy(out / "sft_chain" / "sft_policy", 16, 40, args.temperature))
  result = {"staleness": {}, "steps": {"paths": {}, "chain": {}}}
  for seed in seeds:
    key = jax.random.PRNGKey(seed)
    pool_texts = sft.sample(prompts, args.samples, jax.random.fold_in(key, 0))
    control_texts = sft.sample(prompts, args.samples, jax.random.fold_in(key, 1))
    result["steps"]["paths"][str(seed)] = step_statistics(groups_of(problems, pool_texts))
    if chain:
      chain_texts = chain[1].sample([e.question + "\n" for e in chain[0]], args.samples, jax.random.fold_in(key, 3))
      result["steps"]["chain"][str(seed)] = step_statistics(groups_of(chain[0], chain_texts))
    rl_dir = out / f"grpo/seed{seed}" / "final_policy"
    if not rl_dir.is_dir():
      continue
    rl = Policy(rl_dir, PATHS_TASK["max_prompt_len"], PATHS_TASK["max_new_tokens"], args.temperature)
    rl_texts = rl.sample(prompts, args.samples, jax.random.fold_in(key, 2))

    def correct_only(texts):
      return [[t for t in samples if right(t, e)] for e, samples in zip(problems, texts)]

    pool, fresh, control = correct_only(pool_texts), correct_only(rl_texts), correct_only(control_texts)
    flat = lambda lists: ([prompts[i] for i, l in enumerate(lists) for _ in l], [t for l in lists for t in l])  # noqa: E731
    pool_p, pool_c = flat(pool)
    fresh_p, fresh_c = flat(fresh)
    paths = lambda lists: [[sp.path_of(t.split(FINAL_MARKER)[0]) for t in l] for l in lists]  # noqa: E731
    result["staleness"][str(seed)] = staleness(
        sft.loglik(pool_p, pool_c), rl.loglik(pool_p, pool_c), sft.loglik(fresh_p, fresh_c),
        rl.loglik(fresh_p, fresh_c), paths(fresh), paths(pool), paths(control))
  return result


def main(argv_=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out_dir", default="runs/paths_mechanisms", help="where the runs and results go")
  p.add_argument("--seeds", type=int, default=3, help="RL seeds and sampling keys 0..N-1")
  p.add_argument("--sft_examples", type=int, default=10000, help="stage 1's solutions")
  p.add_argument("--sft_steps", type=int, default=1500, help="stage 1's steps (batch 32)")
  p.add_argument("--rl_steps", type=int, default=20, help="GRPO steps from the SFT policy")
  p.add_argument("--batch_size", type=int, default=16, help="GRPO prompts per step")
  p.add_argument("--group_size", type=int, default=8, help="GRPO samples per prompt")
  p.add_argument("--learning_rate", type=float, default=1e-4, help="GRPO's peak learning rate")
  p.add_argument("--temperature", type=float, default=0.7, help="the rollouts' and the analysis' temperature")
  p.add_argument("--num_test", type=int, default=200, help="held-out problems of the runs' evaluation")
  p.add_argument("--problems", type=int, default=100, help="held-out problems the analysis samples")
  p.add_argument("--samples", type=int, default=16, help="samples per problem and policy")
  p.add_argument("--chain", action="store_true", help="also (b) on the default chain task's SFT policy")
  p.add_argument("--parallel", type=int, default=1, help="runs at once")
  p.add_argument("--dry_run", action="store_true", help="print the commands only")
  args = p.parse_args(argv_)
  for name in ("seeds", "sft_examples", "sft_steps", "rl_steps", "batch_size", "group_size", "num_test", "problems",
               "samples", "parallel"):
    if getattr(args, name) < 1:
      print(f"--{name}={getattr(args, name)}: must be at least 1", file=sys.stderr)
      return 2
  if args.problems > args.num_test:
    print(f"--problems={args.problems}: at most --num_test={args.num_test}", file=sys.stderr)
    return 2
  out_dir = pathlib.Path(args.out_dir)
  runs = plan(args)
  status = runs_lib.run_plan(runs, out_dir, args.parallel, args.dry_run)
  if isinstance(status, int):
    return status
  if status["sft"] not in ("done", "cached"):
    print(f"the SFT run did not finish (log: {out_dir}/sft.log)", file=sys.stderr)
    return 1
  summaries = {r.name: runs_lib.finished(r, out_dir) for r in runs if status[r.name] in ("done", "cached")}
  seeds = list(range(args.seeds))
  result = analyse(args, out_dir.resolve(), seeds)
  result["start_accuracy"] = f"{100 * summaries['sft']['final_accuracy']:.1f}%"
  rl = [100 * summaries[f"grpo/seed{s}"]["final_accuracy"] for s in seeds if f"grpo/seed{s}" in summaries]
  result["rl_accuracy"] = " ".join(f"{a:.1f}%" for a in rl) or "none"
  table = markdown(result, seeds)
  (out_dir / "results.json").write_text(json.dumps({"args": vars(args), "status": status, **result}, indent=1))
  (out_dir / "results.md").write_text(table)
  print(table)
  return runs_lib.unfinished(status, out_dir)


if __name__ == "__main__":
  sys.exit(main())
