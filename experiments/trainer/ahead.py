"""Compiling stage 2's first-step programs ahead, in threads, while the start evaluation runs (`--compile_ahead`).

A step's first call of each program compiles it, one after the other: the rollouts' sampler, the scoring forwards,
the step's batch, the update. Their arguments' shapes are known before the first step wherever they do not follow
the step's completions: the sampler's always; the forwards', the batch's and the update's with
`--token_layout=buckets`, which takes all T columns. `CompileAhead` traces, lowers and compiles those programs in
background threads (`THREADS`), from the run's own jitted callables at abstract arguments placed as the run places them
(`first_step_programs`), while the main thread evaluates the start policy (itself compiling the evaluation's
sampler); JAX keeps the executables in its in-memory caches, keyed by the traced program and its arguments'
placement, so the run's own calls find them compiled. The first step waits for them all before it starts
(`CompileAhead.wait`), so nothing is compiled twice at once; while it waits, one more thread compiles what no
thread has taken yet. XLA's compiler threads and the evaluation share the cores; on an accelerator the host
compiles while the chip evaluates.

A compile that fails in a thread leaves that program to the run's own call, which raises the error where it
would have; a note names it.
"""

import os
import queue
import sys
import threading
import time
from collections.abc import Mapping

import jax

from experiments.methods import program as program_lib
from grpo_jax import partitioning
from grpo_jax.models import lora


# Threads compiling at once beside the main thread: the update (the longest compile) in one, the others in a second,
# where the host has a core for each beyond the main thread's. XLA's compile of one program is partly parallel
# already: on a 2-core CPU a second thread made the whole run no shorter, only moved compiling from the first step
# into the start evaluation (BENCHMARKS.md, "The runner on the 1-8-operation task").
THREADS = max(1, min(2, (os.cpu_count() or 1) - 1))


class CompileAhead:
  """Compiles `programs` (name -> `methods.program.Program`) in daemon threads started at once, each taking the
  next program in order."""

  def __init__(self, programs: Mapping[str, program_lib.Program], threads: int = THREADS):
    self.programs = dict(programs)
    self.seconds: dict[str, float] = {}  # wall seconds of each finished compile
    self.failed: dict[str, str] = {}  # name -> the error's first line
    self.compiled_by: dict[str, str] = {}  # name -> the thread that compiled it
    self._done = {name: threading.Event() for name in self.programs}
    self._noted = set()  # the failures `wait` has named
    self._pending = queue.SimpleQueue()
    for name in self.programs:
      self._pending.put(name)
    for i in range(max(1, min(threads, len(self.programs)))):
      threading.Thread(target=self._run, name=f"compile-ahead-{i}", daemon=True).start()

  def _run(self) -> None:
    while True:
      try:
        name = self._pending.get_nowait()
      except queue.Empty:
        return
      p, start = self.programs[name], time.perf_counter()
      self.compiled_by[name] = threading.current_thread().name
      try:
        p.jitted.trace(*p.args, **p.kwargs).lower().compile()
      except Exception as e:  # pylint: disable=broad-except
        self.failed[name] = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
      self.seconds[name] = time.perf_counter() - start
      self._done[name].set()

  def wait(self, *names: str) -> None:
    """Returns once the programs `names` (all: none given) are compiled or have failed; names it never had
    return at once. First the programs that no thread has taken yet compile in one more thread
    (`compile-ahead-wait`), so a waiting step adds its core to the compiling instead of idling beside the threads."""
    helper = threading.Thread(target=self._run, name="compile-ahead-wait", daemon=True)
    helper.start()
    helper.join()
    for name in names or tuple(self._done):
      if name in self._done:
        self._done[name].wait()
        if name in self.failed and name not in self._noted:
          self._noted.add(name)
          print(f"compile ahead: {name} failed ({self.failed[name]}); the step compiles it", file=sys.stderr)

  def done(self) -> bool:
    return all(e.is_set() for e in self._done.values())


def first_step_programs(method, state, train_step, frozen=None) -> dict[str, program_lib.Program]:
  """The programs of stage 2's first step whose arguments are known before it, from the run's own callables, by name:
  the update first (the longest to compile), then the others in the order the step calls them.

  The rollouts' sampler, the engine or the static one (`Rollouts.sampler_program`; one process); where a step's
  shapes are fixed (`Method.fixed_step_shapes`: `--token_layout=buckets`, Flow-GRPO's turn rows) also the
  method's step programs (`Method.step_programs`: its scoring forwards, Flow-GRPO's planner turns at their widest
  bucket and, without a mesh, the batch) and the update (`train_step`, a `placed.Placed`, over
  `Method.abstract_batch`).
  `state`: the train state; `frozen`: LoRA's frozen part of the policy, or None.
  """
  from experiments.trainer import programs as programs_lib  # pylint: disable=import-outside-toplevel
  placement, mesh = method.rollouts.placement, method.rollouts.placement.mesh
  policy = method.policy(lora.TrainedPart(frozen is not None).join(state.params, frozen))
  placed = lambda tree: program_lib.abstract(tree, None if mesh is None else jax.tree.map(lambda x: x.sharding, tree))
  out = {}
  if not method.samples_each_step or jax.process_count() > 1:
    return out
  params = program_lib.abstract(policy, None if mesh is None else
                                partitioning.param_shardings(mesh, placement.rules, policy))
  shapes = programs_lib.placed_shapes(params, placed(state.params), placement)
  declared = method.step_programs(shapes)
  if "sampler" not in declared:  # Flow-GRPO declares its planner's turns itself
    sampler = method.rollouts.sampler_program(params)
    if sampler is not None:
      out["sampler"] = sampler
  if not method.fixed_step_shapes():  # padded: the widths follow the step's completions
    return out
  # The step's batch program takes host arrays (rewards, counts), unplaced: on a mesh its abstract arguments (split
  # like the rows) would be another program than the one the step compiles, a small one.
  out.update({name: p for name, p in declared.items() if not (name == "batch" and mesh is not None)})
  m = method.update_rows(method.config.algorithm.minibatch_size or method.rows_per_step())
  batch = method.abstract_batch(lambda dtype, *shape: shapes.rows(dtype, m, *shape))
  args = (placed(state), batch) + (() if frozen is None else (placed(frozen),))
  update = program_lib.Program(train_step.program(), args, "the update", per_step=1)
  return {"update": update, **out}  # the longest compile first


def start(method, state, train_step, frozen=None) -> CompileAhead | None:
  """`CompileAhead` of `first_step_programs`, or None where there are none. Listing them is an optimisation that
  must not stop a run: a failure to list them is one note, and the first step compiles its programs itself."""
  try:
    programs = first_step_programs(method, state, train_step, frozen)
  except Exception as e:  # pylint: disable=broad-except
    why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    print(f"compile ahead: off ({type(e).__name__}: {why}); the first step compiles its programs", file=sys.stderr)
    return None
  return CompileAhead(programs) if programs else None
