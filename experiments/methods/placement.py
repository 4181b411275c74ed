"""Where the runner's arrays live: one device, or a device mesh spanning one or several processes.

Host code (rewards, advantages, batches) works on whole NumPy arrays on every process; the jitted
programs (sampler, log-probs, update) work on global arrays split over the mesh. `rows` turns a
whole host array into a global one from this process's rows only (so each process provides its own
slice of the prompts and of the batch), `host` brings a global result back whole to every process.
Without a mesh both are plain conversions and everything runs on the default device.
"""

from absl import flags
import jax
import numpy as np

from grpo_jax import distributed
from grpo_jax import logprobs as logprobs_lib
from grpo_jax import models
from grpo_jax import partitioning as sharding
from grpo_jax import training

FLAGS = flags.FLAGS

flags.DEFINE_string("mesh", "", "Device mesh, e.g. 'data:2,fsdp:2,tensor:2' (one size may be -1: the remaining "
                    "devices). Empty: one device (or, with several processes, every device on the data axis).")
flags.DEFINE_enum("sharding_rules", "fsdp", sorted(sharding.RULES), "How params, optimiser state and activations "
                  "map onto the mesh: dp (replicated params), fsdp (params split over fsdp), fsdp_tp (+ tensor).")
flags.DEFINE_string("coordinator_address", "", "Multi-host: host:port of process 0's coordinator "
                    "(or JAX_COORDINATOR_ADDRESS). Every process runs the same command.")
flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes (or JAX_NUM_PROCESSES).")
flags.DEFINE_integer("process_id", None, "Multi-host: this process's index (or JAX_PROCESS_ID).")


class Placement:
  """The mesh and logical-axis rules of a run (`mesh is None`: single device, no sharding)."""

  def __init__(self, mesh=None, rules=None):
    self.mesh, self.rules = mesh, rules
    self.batch_sharding = sharding.batch_sharding(mesh, rules) if mesh is not None else None

  @classmethod
  def from_flags(cls) -> "Placement":
    if not FLAGS.mesh and jax.process_count() == 1:
      return cls()
    return cls(sharding.make_mesh(FLAGS.mesh), sharding.get_rules(FLAGS.sharding_rules))

  @property
  def data_parallel(self) -> int:
    return 1 if self.mesh is None else sharding.data_parallel_size(self.mesh, self.rules)

  def rows(self, tree):
    """Whole host arrays -> global arrays split over the data axes, from this process's rows."""
    if self.mesh is None:
      return tree
    return distributed.global_batch(
        jax.tree.map(lambda x: np.asarray(x)[distributed.process_rows(len(x), self.batch_sharding)], tree),
        self.batch_sharding)

  def host(self, tree):
    """Global (or local) arrays -> whole NumPy arrays on every process."""
    return distributed.all_gather(tree)

  def load_hf(self, path, **runtime):
    if self.mesh is None:
      return models.load_hf(path, **runtime)
    return sharding.load_hf(path, self.mesh, self.rules, **runtime)

  def put_params(self, params):
    """Places a params pytree (policy, value or reward model) by the rules."""
    if self.mesh is None:
      return params
    return sharding.put(params, sharding.param_shardings(self.mesh, self.rules, params))

  def logprobs(self, config, **kwargs):
    """`fn(params, tokens, mask) -> host [N, L]` log-probs; kwargs of `logprobs.jit_token_logprobs`."""
    fn = logprobs_lib.jit_token_logprobs(config, mesh=self.mesh, rules=self.rules, **kwargs)
    return lambda params, tokens, mask: self.host(fn(params, *self.rows((np.asarray(tokens), np.asarray(mask)))))

  def train(self, params, optimizer, objective, num_micro_batches: int):
    """`(state, step)`: the train state placed by the rules and the jitted update (state donated).

    `step(state, batch)` takes a whole host batch; each process contributes its rows."""
    if self.mesh is None:
      return (training.init_train_state(params, optimizer),
              training.make_train_step(objective, optimizer, num_micro_batches))
    state, shardings = sharding.init_train_state(params, optimizer, self.mesh, self.rules)
    step = training.make_train_step(objective, optimizer, num_micro_batches, state_shardings=shardings,
                                    batch_shardings=self.batch_sharding, mesh=self.mesh, rules=self.rules)
    return state, lambda state, batch: step(state, self.rows(jax.tree.map(np.asarray, batch)))

  def sample_kwargs(self) -> dict:
    return {} if self.mesh is None else {"mesh": self.mesh, "rules": self.rules}
