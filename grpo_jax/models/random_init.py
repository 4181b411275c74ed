"""Random weights: one long normal draw computed in pieces, bit for bit the whole draw, sliced into the weights.

`init_params` gives every weight a slice of one draw, `0.02 · normal(key, (N,))[start:start + size]` (`draw`;
`draw_order` says where each weight's slice starts). Built as one
`jax.random.normal` sliced into every weight, XLA fuses the draw's last steps into each slice: a program that grows
with the layer count, which XLA's GPU compiler took minutes over at Qwen2.5-0.5B's shapes, with temporaries
several times the weights' size.

With JAX's partitionable threefry (`jax_threefry_partitionable`, the default since JAX 0.5) element i of a 1-D draw
depends only on the key and on i: its 32 random bits are `b₁ ⊕ b₂` with `(b₁, b₂) = threefry2x32(key, (hi(i),
lo(i)))`, i as a 64-bit counter split in two 32-bit words. So any slice can be drawn alone, bit for bit the values
of the whole draw, by hashing the counters start ... start + size - 1. The bits become a normal value as
`jax.random.normal` makes them (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3", for threefry):

  u = max(lo, (bitcast_f32(bits >> 9 | 0x3F800000) - 1) · (1 - lo) + lo),  lo = nextafter(-1, 0)
  z = √2 · erfinv(u)

`normal_pieces` draws the whole as a loop over pieces: one draw in the program, whatever the model's depth and size.
Bit for bit means compiled with the same XLA flags: they can move the last bit of a float32 through fused
multiply-adds (tests/grpo_jax/models/test_random_init.py compares the two in one process).
"""

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models.params import STACKED, Params

_LO = np.nextafter(np.float32(-1.0), np.float32(0.0), dtype=np.float32)


def sliceable(key: jax.Array) -> bool:
  """Whether slices of a draw with `key` can be computed alone: a threefry key, partitionable threefry on."""
  if not jax.config.jax_threefry_partitionable:
    return False
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    return str(jax.random.key_impl(key)) == "threefry2x32"
  return key.dtype == jnp.uint32 and key.shape == (2,) and jax.config.jax_default_prng_impl == "threefry2x32"


def key_words(key: jax.Array) -> jax.Array:
  """The key as its two uint32 words."""
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(key)
  return key


def _normal_words(words: jax.Array, hi: jax.Array, lo: jax.Array, size: int) -> jax.Array:
  """float32 [size]: elements start ... start + size - 1 of `jax.random.normal(key, (N,))` (N ≥ start + size), for
  start = hi·2³² + lo with lo + size ≤ 2³² (the low words do not wrap)."""
  from jax.extend.random import threefry2x32_p  # pylint: disable=import-outside-toplevel
  c_lo = lo + lax.iota(jnp.uint32, size)
  b1, b2 = threefry2x32_p.bind(words[0], words[1], jnp.broadcast_to(hi, (size,)), c_lo)
  bits = lax.shift_right_logical(b1 ^ b2, jnp.uint32(32 - 23)) | jnp.uint32(0x3F800000)
  floats = lax.bitcast_convert_type(bits, jnp.float32) - jnp.float32(1.0)
  lo_f, hi_f = jnp.float32(_LO), jnp.float32(1.0)
  u = lax.max(lo_f, floats * (hi_f - lo_f) + lo_f)
  return jnp.float32(np.sqrt(2)) * lax.erf_inv(u)


# Elements drawn per step of the loop (a power of two): the draw's temporaries (counters, hash words, which the
# CPU's threefry keeps in memory) stay this small whatever the model's size.
PIECE = 1 << 22


def piece_start(j: jax.Array, piece: int) -> tuple[jax.Array, jax.Array]:
  """The 64-bit counter j·piece (uint32 j, `piece` a power of two below 2³²) as its (hi, lo) uint32 words."""
  shift = int(piece).bit_length() - 1
  j = jnp.asarray(j, jnp.uint32)
  return j >> jnp.uint32(32 - shift), j << jnp.uint32(shift)


def normal_pieces(key: jax.Array, n: int, dtype, scale: float = 1.0, piece: int = PIECE) -> jax.Array:
  """[steps, piece]: flattened, its first n elements are `(scale · jax.random.normal(key, (n,), float32))
  .astype(dtype)` bit for bit (the rest continue the same draw). Drawn as a loop of `steps` draws of `piece`
  elements each (`piece` a power of two; smaller for a small `n`): one draw in the program, whatever `n`. Needs
  `sliceable(key)`."""
  if piece & (piece - 1) or not 2 <= piece <= 2**31:
    raise ValueError(f"piece must be a power of two in [2, 2**31], got {piece}")
  piece = min(int(piece), 1 << max(1, (int(n) - 1).bit_length()))
  steps = -(-int(n) // piece)
  words = key_words(key)

  def draw(j):  # elements j·piece ... (j + 1)·piece - 1
    hi, lo = piece_start(j, piece)
    return (jnp.float32(scale) * _normal_words(words, hi, lo, piece)).astype(dtype)

  return lax.map(draw, jnp.arange(steps, dtype=jnp.uint32))


def _drawn(names: tuple[str, ...]) -> bool:
  return names[-1] in ("kernel", "embedding")


def draw_order(leaves) -> dict[tuple[str, ...], int]:
  """Where each drawn leaf ((path, shape) pairs of the unrolled layout) starts in the one draw: the dict's order
  (its keys sorted), but with the layers by number (layers_2 before layers_10; the same for ten layers or fewer)."""
  order = lambda path: tuple((k,) if not k.startswith("layers_") else ("layers_", int(k[7:])) for k in path)
  starts, n = {}, 0
  for names, shape in sorted(((tuple(p.key for p in path), leaf.shape) for path, leaf in leaves
                              if _drawn((path[-1].key,))), key=lambda item: order(item[0])):
    starts[names] = n
    n += int(np.prod(shape))
  return starts


def _fixed(names: tuple[str, ...], shape, dtype) -> jax.Array:
  """A leaf that is not drawn: biases zero, norm scales one."""
  return (jnp.zeros if names[-1] == "bias" else jnp.ones)(shape, dtype)


def one_draw(shapes: Params, key: jax.Array, dtype) -> Params:
  """`draw` as one `jax.random.normal` sliced into every weight, unrolled layout: for keys whose draws cannot be
  sliced (`sliceable`)."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  starts = draw_order(leaves)
  flat = 0.02 * jax.random.normal(key, (sum(int(np.prod(l.shape)) for p, l in leaves if _drawn((p[-1].key,))),),
                                  jnp.float32)
  out = []
  for path, leaf in leaves:
    names, size = tuple(p.key for p in path), int(np.prod(leaf.shape))
    if names in starts:
      out.append(flat[starts[names]:starts[names] + size].reshape(leaf.shape).astype(dtype))
    else:
      out.append(_fixed(names, leaf.shape, dtype))
  return jax.tree_util.tree_unflatten(treedef, out)


def draw(shapes: Params, key: jax.Array, dtype, *, stacked: bool = False) -> Params:
  """Weights for the unrolled params-shaped dict `shapes` (leaves with a shape): kernels and embeddings
  `0.02 · normal(key, (N,))[start:start + size]` (`draw_order`'s starts), biases zero, other leaves one.

  The draw is a loop over fixed-size pieces (`normal_pieces`), so the program holds one small draw whatever the
  model's size, and the weights are copies of its slices. `stacked`: the scanned layout's dict (the L layers
  under `STACKED` with a leading [L] axis), with the values of the unrolled one. Needs `sliceable(key)`.
  """
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  starts = draw_order(leaves)  # each drawn leaf's place in the draw
  n = sum(int(np.prod(leaf.shape)) for path, leaf in leaves if _drawn((path[-1].key,)))
  keys = sorted((k for k in shapes if k.startswith("layers_")), key=lambda k: int(k[7:]))
  # A layer's draws (its weights one after another) fill a block of `layer` elements, the blocks one after another.
  layer = sum(int(np.prod(leaf.shape)) for path, leaf in leaves if path[0].key == keys[0] and _drawn((path[-1].key,)))
  # The barrier keeps the draw whole: the weights below are copies of its slices, and XLA does not fuse (and repeat)
  # the draw into each of them. The scanned layout reads up to a block past the end.
  extra = layer if stacked else 0
  flat = jax.lax.optimization_barrier(normal_pieces(key, n + extra, dtype, 0.02)).reshape(-1)

  def value(names, shape, stacked=False):
    """The leaf's slice of the draw, or (`stacked`) the L layers' slices of it, [L, *shape]."""
    if not _drawn(names):
      return _fixed(names, (len(keys), *shape) if stacked else shape, dtype)
    size, begin = int(np.prod(shape)), starts[names]
    if not stacked:
      return flat[begin:begin + size].reshape(shape)
    # From the first block's slice on, L rows a block apart: the slice in each block.
    return flat[begin:begin + len(keys) * layer].reshape(len(keys), layer)[:, :size].reshape(len(keys), *shape)

  if not stacked:
    return jax.tree_util.tree_unflatten(treedef, [value(tuple(p.key for p in path), leaf.shape)
                                                  for path, leaf in leaves])
  first = keys[0]
  out = {k: jax.tree_util.tree_map_with_path(lambda path, leaf, k=k: value((k, *(p.key for p in path)), leaf.shape),
                                             v) for k, v in shapes.items() if k not in keys}
  out[STACKED] = jax.tree_util.tree_map_with_path(
      lambda path, leaf: value((first, *(p.key for p in path)), leaf.shape, stacked=True), shapes[first])
  return out
