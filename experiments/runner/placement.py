"""Where the runner's arrays live: one device, or a device mesh spanning one or several processes.

The jitted programs (sampler, log-probs, update) work on global arrays split over the mesh's data axes, and a
step's training batch is built and kept there. Host code (decoding text, rule rewards) works on whole NumPy
arrays on every process. `rows` turns a whole host array into a global one from this process's rows only (so
each process provides its own slice of the prompts), `device` does that for host leaves and places device leaves
by the batch sharding, `host` brings a global result back whole to every process. Without a mesh these are
plain conversions and everything runs on the default device, except that on a CPU presented as several devices
(`--cpu_devices`) the sampler splits its rows over them: a decode step is many small ops that one device runs
one at a time, so each core decoding its own rows keeps every core busy (the same tokens; log-probs equal up
to float rounding), and the samples then move to the default device.
"""

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import distributed
from grpo_jax import logprobs as logprobs_lib
from grpo_jax import models
from grpo_jax.models import lora
from grpo_jax import partitioning
from grpo_jax import placed
from grpo_jax import rollout_engine
from grpo_jax import row_chunks
from grpo_jax import sampling
from grpo_jax import training



class Placement:
  """The mesh and logical-axis rules of a run (`mesh is None`: single device, no sharding)."""

  def __init__(self, mesh=None, rules=None, sampler_mesh=None, forward_rows: int = 0, forward_budget: int = 0):
    self.mesh, self.rules = mesh, rules
    self.batch_sharding = partitioning.batch_sharding(mesh, rules) if mesh is not None else None
    # Without a mesh: a data mesh of CPU devices that only the sampler uses (None: the sampler runs on one device).
    self.sampler_mesh = sampler_mesh if mesh is None else None
    # Row chunks of the forwards over many rows and of the sampler (`row_chunks`): rows per chunk (0: from the
    # budget), and the bytes per device one chunk's activations, or the sampler's cache, may take.
    self.forward_rows = forward_rows
    self.forward_budget = forward_budget or row_chunks.default_budget_bytes(
        None if mesh is None else mesh.devices.flat[0])

  @classmethod
  def from_config(cls, config, devices=None) -> "Placement":
    """From a `MeshConfig`: its mesh spec and rules; one device when the spec is empty and one process runs, with
    the sampler over every local device when they are CPU devices (`--cpu_devices`). `devices`: the mesh's devices
    (default all; e.g. a TPU topology's, to compile for it ahead of time)."""
    chunks = dict(forward_rows=config.forward_rows, forward_budget=int(config.forward_memory_budget * row_chunks.GiB))
    if not config.mesh and jax.process_count() == 1:
      return cls(sampler_mesh=cpu_sampler_mesh(), **chunks)
    return cls(partitioning.make_mesh(config.mesh, devices), partitioning.get_rules(config.sharding_rules), **chunks)

  @property
  def data_parallel(self) -> int:
    return 1 if self.mesh is None else partitioning.data_parallel_size(self.mesh, self.rules)

  def rows(self, tree):
    """Whole host arrays -> global arrays split over the data axes, from this process's rows."""
    if self.mesh is None:
      return tree
    return distributed.global_batch(
        jax.tree.map(lambda x: np.asarray(x)[distributed.process_rows(len(x), self.batch_sharding)], tree),
        self.batch_sharding)

  def device(self, tree):
    """Global device leaves -> placed by the batch sharding on the devices (no host round trip); host leaves, and
    with several processes a process's local arrays (built from host data, e.g. an offline dataset) -> `rows`."""
    if self.mesh is None:
      return tree
    several = jax.process_count() > 1

    def place(x):
      if isinstance(x, jax.Array) and not (several and x.is_fully_addressable):
        return jax.device_put(x, self.batch_sharding)
      return self.rows(np.asarray(x))

    return jax.tree.map(place, tree)

  def host(self, tree):
    """Global (or local) arrays -> whole NumPy arrays on every process."""
    return distributed.all_gather(tree)

  def load_hf(self, path, **runtime):
    if self.mesh is None:
      return models.load_hf(path, **runtime)
    return partitioning.load_hf(path, self.mesh, self.rules, **runtime)

  def put_params(self, params):
    """Places a params pytree (policy, value or reward model) by the rules."""
    if self.mesh is None:
      return params
    return partitioning.put(params, partitioning.param_shardings(self.mesh, self.rules, params))

  def logprobs(self, config, **kwargs):
    """`fn(params, tokens, mask) -> [N, L]` log-probs on the device(s), split like the batch, in row chunks
    (`forward_rows` or `forward_budget`); kwargs of `logprobs.jit_token_logprobs`."""
    kwargs = dict(forward_rows=self.forward_rows, memory_budget=self.forward_budget) | kwargs
    fn = logprobs_lib.jit_token_logprobs(config, mesh=self.mesh, rules=self.rules, **kwargs)
    # `.program(shape, params)`: the program for tokens of `shape` and params of `params`'s tree structure
    return placed.Placed(lambda params, tokens, mask: fn(params, *self.device((tokens, mask))), fn.program)

  def row_shards(self, rows: int, group: int = 1) -> int:
    """The data shards over which `rows` rows in groups of `group` split into whole groups (`length_buckets`'
    shard-local sorting); 1 where they don't."""
    shards = self.data_parallel
    return shards if rows % shards == 0 and (rows // shards) % group == 0 else 1

  def train(self, params, optimizer, objective, num_micro_batches: int, frozen=None, bucketed=None,
            skip_empty: bool = False):
    """`(state, step)`: the train state placed by the rules and the jitted update (state donated; a `placed.Placed`,
    `step.program()` the program).

    `params` are handed over: the state takes their buffers and they are deleted (on a mesh, a leaf placed
    otherwise is resharded, then deleted), so no second copy outlives the call; keep a copy of what must stay.

    `frozen`: weights the objective reads but the update does not train (LoRA's base, `models.lora.split`): the
    objective sees `lora.join(state.params, frozen)`; they are neither in the state nor donated.

    `step(state, batch)` takes a batch on the device(s) (or whole host arrays: each process contributes its
    rows).

    `bucketed`: the update's length-bucketed layout (`training.update.BucketedRows`), or None (padded);
    `skip_empty`: micro-batches without a loss token skip their forward and backward (`make_train_step`)."""
    extra = () if frozen is None else (frozen,)
    if self.mesh is None:
      step = training.make_train_step(objective, optimizer, num_micro_batches,
                                      combine=None if frozen is None else lora.join, bucketed=bucketed,
                                      skip_empty=skip_empty)
      state = jax.jit(lambda p: training.init_train_state(p, optimizer), donate_argnums=0)(params)
      return state, placed.Placed(lambda state, batch: step(state, batch, *extra), step.program)
    state, shardings = partitioning.init_train_state(params, optimizer, self.mesh, self.rules, donate=True)
    step = self.train_step(shardings, optimizer, objective, num_micro_batches, frozen=frozen, bucketed=bucketed,
                           skip_empty=skip_empty)
    return state, placed.Placed(lambda state, batch: step(state, self.device(batch), *extra), step.program)

  def train_step(self, state_shardings, optimizer, objective, num_micro_batches: int, frozen=None, bucketed=None,
                 skip_empty: bool = False):
    """The jitted update of `train` on a mesh, for a train state placed by `state_shardings`
    (`partitioning.state_shardings`); `.program()` is the program itself (ahead of time: `.program().lower(...)`).
    With `frozen` (arrays or shape structs, placed), the step takes them as a third argument."""
    lora_kwargs = {} if frozen is None else dict(
        combine=lora.join, frozen_shardings=jax.tree.map(lambda x: x.sharding, frozen))
    return training.make_train_step(objective, optimizer, num_micro_batches, state_shardings=state_shardings,
                                    batch_shardings=self.batch_sharding, mesh=self.mesh, rules=self.rules,
                                    bucketed=bucketed, skip_empty=skip_empty, **lora_kwargs)

  def forward_chunk(self, config, rows: int, length: int, *, group: int = 1, **estimate) -> int:
    """Rows per chunk (`row_chunks.map_rows`) of a forward over [rows, length] tokens: `forward_rows`, else as
    many as `forward_budget` holds per device (`row_chunks.forward_row_bytes(config, length, **estimate)`)."""
    if self.forward_rows:
      return self.forward_rows
    return row_chunks.rows_per_chunk(rows, row_chunks.forward_row_bytes(config, length, **estimate),
                                     self.forward_budget, devices=self.data_parallel, multiple=group)

  def sampler_chunk(self, config, num_prompts: int, prompt_len: int, num_samples: int, max_new_tokens: int) -> int:
    """`sampling.sample`'s `prompt_chunk` for these shapes: 0 when the prompts fit `forward_budget` per device
    (`row_chunks.sampler_prompt_bytes`), else the most that do. A sampler that loops per shard chunks each shard's
    own prompts; one loop over rows split over the data axes puts 1 / data-parallel of a chunk on each device."""
    per_prompt = row_chunks.sampler_prompt_bytes(config, prompt_len, num_samples, max_new_tokens)
    placed = self.sample_kwargs(num_prompts)
    if not placed:
      return row_chunks.prompts_per_chunk(num_prompts, per_prompt, self.forward_budget)
    mesh, rules = placed["mesh"], placed["rules"]
    axes = sampling.per_shard_axes(mesh, rules, config, num_prompts, num_samples)
    if axes:
      shards = int(np.prod([mesh.shape[a] for a in axes]))
      return row_chunks.prompts_per_chunk(num_prompts, per_prompt, self.forward_budget, shards=shards)
    dp = partitioning.data_parallel_size(mesh, rules)
    return row_chunks.prompts_per_chunk(num_prompts, per_prompt / dp, self.forward_budget,
                                        multiple=dp // np.gcd(dp, num_samples))

  def sample_kwargs(self, num_prompts: int, any_count: bool = False) -> dict:
    """`sampling.sample`'s (or `rollout_engine.generate`'s) mesh arguments for `num_prompts` prompts: the run's
    mesh; without one, the CPU sampler mesh when it divides the prompts or `any_count` (the engine pads them),
    else one device."""
    if self.mesh is not None:
      return {"mesh": self.mesh, "rules": self.rules}
    if self.sampler_mesh is not None and (any_count or num_prompts % self.sampler_mesh.size == 0):
      return {"mesh": self.sampler_mesh, "rules": partitioning.get_rules("dp")}
    return {}

  def engine_slots(self, config, num_prompts: int, prompt_len: int, num_samples: int, max_new_tokens: int,
                   num_slots: int = 0) -> int:
    """`rollout_engine.generate`'s `num_slots` for these shapes: `num_slots` when given, else
    `rollout_engine.default_slots`, or fewer where the budget (`forward_budget` per device) would not hold them
    beside the prompts (`row_chunks.engine_bytes`)."""
    n = num_prompts * num_samples
    if num_slots:
      return min(num_slots, n)
    placed = self.sample_kwargs(num_prompts, any_count=True)
    shards = partitioning.data_parallel_size(placed["mesh"], placed["rules"]) if placed else 1
    prompts, slot = row_chunks.engine_bytes(config, num_prompts, prompt_len, max_new_tokens)
    platform = (placed["mesh"].devices.flat[0] if placed else jax.devices()[0]).platform
    return row_chunks.slots_that_fit(n, prompts, slot, self.forward_budget, shards=shards,
                                     most=rollout_engine.default_slots(n, max_new_tokens, shards, platform, config))

  def sampled(self, samples):
    """`(device, host)`: the sampler's output where the rest of the run works on it, and its whole host copy (`host`;
    the step's one host crossing). Split over the mesh as it is; from the CPU sampler mesh, the host copy put back on
    the default device, uncommitted like the run's other one-device arrays (a `device_put` to the device would commit
    them, and the update, given a committed batch, returns a committed state that its next call compiles for
    again)."""
    host = self.host(samples)
    if self.mesh is None and self.sampler_mesh is not None:
      return jax.tree.map(jnp.asarray, host), host
    return samples, host


def cpu_sampler_mesh():
  """A data mesh over this process's devices when there are several and they are CPU devices, else None."""
  devices = jax.local_devices()
  if len(devices) < 2 or jax.default_backend() != "cpu":
    return None
  return partitioning.make_mesh(f"data:{len(devices)}", devices)
