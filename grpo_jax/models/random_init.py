"""One long normal draw computed in pieces, bit for bit the whole draw.

`init_params` gives every weight a slice of one draw, `0.02 · normal(key, (N,))[start:start + size]`. Built as one
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
multiply-adds (tests/test_random_init.py compares the two in one process).
"""

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

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
