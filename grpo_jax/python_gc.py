"""CPython's cyclic garbage collector set for a JAX process: what exists at start left out, collections rarer.

Tracing, lowering and compiling allocate and drop container objects by the million, and CPython's default
thresholds (700, 10, 10) start a collection of the youngest generation every 700 net allocations and a full
collection every 100 of those. A full collection walks every tracked object, and a JAX process holds hundreds of
thousands (its modules, jit caches, jaxprs), so collections were a measurable share of a test worker's time and
of compiling a train step.

  from grpo_jax import python_gc
  python_gc.collect_less()   # in main(), once the imports are done

Reference cycles are still collected, only later: memory held by a cycle waits for the next collection of its
generation, about 14x as many allocations away as by default, and so do the finalizers of its objects (one that
uses an asyncio loop may find it closed by then, and print an "Exception ignored" line).
"""

import gc

# The youngest generation's threshold. The older generations keep CPython's 10: a full collection comes after
# 100 young collections, 1M net allocations instead of 70k.
YOUNGEST_THRESHOLD = 10_000


def collect_less(youngest: int = YOUNGEST_THRESHOLD) -> None:
  """Freezes the objects alive now (`gc.freeze`: no collection examines them again) and collects the youngest
  generation every `youngest` net allocations instead of 700 (`gc.set_threshold(youngest, 10, 10)`).

  Call it once, early: after the imports, whose modules live as long as the process. A garbage cycle that is
  frozen is never freed.
  """
  if youngest < 1:
    raise ValueError(f"youngest must be >= 1, got {youngest}")
  gc.freeze()
  gc.set_threshold(youngest, 10, 10)
