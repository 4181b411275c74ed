"""A jitted function whose call places its arguments, and the program behind it for ahead-of-time use.

The runner's forwards and update steps are called with arrays of any placement (host arrays, another sharding)
and put them where the program takes them first; `scripts/aot_compile.py` and `experiments.trainer.programs` need
the program itself, to trace, lower and compile it for abstract arguments. `Placed` carries both.
"""

from typing import Any, Callable


class Placed:
  """`placed(*args)` runs the function; `placed.program(*key)` is the jitted program it runs for `key` (nothing:
  the only one; a sharded forward: the tokens' shape and, optionally, a params tree whose structure decides its
  placement), ready for `.trace(...)` / `.lower(...)` with abstract arguments."""

  def __init__(self, call: Callable[..., Any], program: Callable[..., Any]):
    self._call = call
    self.program = program

  def __call__(self, *args):
    return self._call(*args)
