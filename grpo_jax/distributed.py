"""Multi-process runs through `jax.distributed`: start-up, per-process data, global arrays, process-0 logging.

Every process runs the same program. Before any other JAX call:

  distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)

(or the JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID environment variables). Then
`jax.devices()` lists every process's devices, a mesh spans them all (`sharding.make_mesh`), and
jitted steps run as one program over the global arrays. A process reads only its rows of a batch
(`process_rows`, `process_slice`) and contributes them (`global_batch`); host values the same on
every process are placed with `sharding.put`; results come back with `local_rows` or `all_gather`.
Metrics and logs are written where `is_main_process()`.

Failure: the coordination service watches every process's heartbeat. When one dies, the others'
collectives fail and the service terminates them within `heartbeat_timeout_s`, so no process waits
forever; a start-up that cannot reach all processes fails after `initialization_timeout_s`.
"""

from collections.abc import Sequence
import inspect
import os
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


def _env_int(name: str) -> int | None:
  value = os.environ.get(name, "").strip()
  if not value:
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, local_device_ids: Sequence[int] | None = None,
               initialization_timeout_s: int = 300, heartbeat_timeout_s: int = 60,
               shutdown_timeout_s: int = 60) -> bool:
  """Joins this process to a multi-process run; a no-op for a single process.

  Arguments left None come from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
  JAX_PROCESS_ID. With one process (or none of them set) nothing is started. CPU
  collectives go through gloo. Call it before any other JAX call.

  Args:
    coordinator_address: "host:port" of process 0's coordinator (every process passes the same).
    num_processes: the number of processes.
    process_id: this process, in [0, num_processes).
    local_device_ids: restrict this process to these local devices (e.g. one GPU per process).
    initialization_timeout_s: give up start-up after this long (a peer that never comes).
    heartbeat_timeout_s: a process silent this long is dead, and the others are stopped.
    shutdown_timeout_s: how long an exiting process waits for the others at shutdown.

  Returns:
    True when a multi-process run was joined (or already was), False for a single process.

  Raises:
    ValueError: an incomplete or inconsistent setting, named in one line.
  """
  if jax.distributed.is_initialized():
    return True
  coordinator_address = coordinator_address or os.environ.get(ENV_COORDINATOR, "").strip() or None
  num_processes = _env_int(ENV_NUM_PROCESSES) if num_processes is None else num_processes
  process_id = _env_int(ENV_PROCESS_ID) if process_id is None else process_id
  if num_processes is None or num_processes == 1:
    if num_processes == 1 and process_id not in (None, 0):
      raise ValueError(f"process_id={process_id} with num_processes=1; it must be 0")
    return False
  if num_processes < 1:
    raise ValueError(f"num_processes must be >= 1, got {num_processes}")
  if coordinator_address is None:
    raise ValueError(f"num_processes={num_processes} needs a coordinator address "
                     f"(--coordinator_address or {ENV_COORDINATOR}, 'host:port')")
  host, _, port = coordinator_address.rpartition(":")
  if not host or not port.isdigit():
    raise ValueError(f"coordinator address {coordinator_address!r} is not 'host:port'")
  if process_id is None or not 0 <= process_id < num_processes:
    raise ValueError(f"process_id must be in [0, {num_processes}) (--process_id or {ENV_PROCESS_ID}), "
                     f"got {process_id}")
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  options = dict(initialization_timeout=initialization_timeout_s, heartbeat_timeout_seconds=heartbeat_timeout_s,
                 shutdown_timeout_seconds=shutdown_timeout_s)
  accepted = inspect.signature(jax.distributed.initialize).parameters
  options = {k: v for k, v in options.items() if k in accepted}
  jax.distributed.initialize(coordinator_address, num_processes, process_id, local_device_ids=local_device_ids,
                             **options)
  return True


def shutdown() -> None:
  """Leaves the multi-process run (waits for the other processes); a no-op when none was joined."""
  if jax.distributed.is_initialized():
    jax.distributed.shutdown()


def is_main_process() -> bool:
  """True on process 0, the one that writes logs, metrics and exported models."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier of this name."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def process_rows(num_rows: int, sharding: jax.sharding.Sharding | None = None) -> slice:
  """The rows of a global batch of `num_rows` that this process provides.

  With a sharding of the batch (rows on dimension 0), the rows its addressable
  devices hold; without, an equal contiguous block per process.
  """
  if sharding is None:
    count, index = jax.process_count(), jax.process_index()
    if num_rows % count:
      raise ValueError(f"{num_rows} rows do not split evenly over {count} processes")
    per = num_rows // count
    return slice(index * per, (index + 1) * per)
  spans = {idx[0].indices(num_rows)[:2] for idx in sharding.addressable_devices_indices_map((num_rows,)).values()}
  start, stop = min(s for s, _ in spans), max(e for _, e in spans)
  if sum(e - s for s, e in spans) != stop - start:
    raise ValueError(f"this process's rows of {num_rows} under {sharding} are not one contiguous block")
  return slice(start, stop)


def process_slice(items: Sequence, sharding: jax.sharding.Sharding | None = None) -> Sequence:
  """This process's part of a global list (e.g. the prompts of a step); see `process_rows`."""
  return items[process_rows(len(items), sharding)]


def global_batch(local: Any, shardings: Any) -> Any:
  """Global arrays from each process's rows (`jax.make_array_from_process_local_data`).

  Args:
    local: a pytree of host arrays, this process's rows (`process_rows` of the global batch).
    shardings: one sharding, or a tree of them, of the global arrays.
  """
  if isinstance(shardings, jax.sharding.Sharding):
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(shardings, np.asarray(x)), local)
  return jax.tree.map(lambda s, x: jax.make_array_from_process_local_data(s, np.asarray(x)), shardings, local)


def local_rows(tree: Any) -> Any:
  """This process's rows of global arrays split along dimension 0 only, as host arrays, in row order."""
  def one(x):
    if not isinstance(x, jax.Array) or x.ndim == 0 or x.is_fully_addressable:
      return np.asarray(x)
    shards = {}
    for shard in x.addressable_shards:
      if shard.data.shape[1:] != x.shape[1:]:
        raise ValueError(f"local_rows: an array of shape {x.shape} is split beyond dimension 0 ({x.sharding})")
      shards.setdefault(shard.index[0].indices(x.shape[0])[0], shard.data)
    return np.concatenate([np.asarray(shards[k]) for k in sorted(shards)], axis=0)

  return jax.tree.map(one, tree)


def all_gather(tree: Any) -> Any:
  """Whole host copies of global arrays on every process (small results: tokens, rewards, metrics)."""
  if jax.process_count() == 1:
    return jax.tree.map(np.asarray, tree)
  return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), tree)
