"""Block-wise quantization: the 8-bit, 4-bit and fp8 codes and the arrays they make.

A :class:`QuantizedArray` stores an array in blocks of ``block_size`` values: one float32
``absmax`` per block and one small code per value (``quantize_blockwise``,
``dequantize_blockwise``). :func:`functrain.quantized_state` keeps optimizer state this way.

The codes, from the papers' descriptions:

* ``bits=8`` (Dettmers, Lewis, Shleifer & Zettlemoyer, 2021, "8-bit Optimizers via
  Block-wise Quantization"): the *dynamic* code. A value's bits are a sign (signed code
  only), ``E`` zeros giving the decimal exponent ``10**-E``, an indicator one, and the
  remaining bits a linear fraction in ``[0.1, 1]`` (the midpoints of equal bins). The
  redundant code (negative zero, or all-zeros beyond the last exponent) stands for ``1.0``,
  so a block's largest value is exact. Blocks of 256. The unsigned code (for non-negative
  fields) spends the sign bit on the fraction.
* ``bits=4`` (Li, Chen & Zhu, 2023, "Memory Efficient Optimizers with 4-bit States"):
  blocks of 128; the signed dynamic code with 4 bits for signed fields, and for
  non-negative fields the linear code without zero, ``(i + 1) / 16`` (the paper's
  zero-point finding: a second moment rounded to zero makes ``1 / sqrt(nu)`` explode).
  Two codes per byte.
* ``bits="fp8"``: ``float8_e4m3fn`` values of ``448 x / absmax``, blocks of 256.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from functrain import jax_compat

Array = jax.Array

FP8_MAX = 448.0  # the largest finite float8_e4m3fn
DEFAULT_BLOCK = {8: 256, 4: 128, "fp8": 256}

# --------------------------------------------------------------------------
# The codes
# --------------------------------------------------------------------------

def dynamic_code(signed: bool, bits: int = 8) -> np.ndarray:
    """The dynamic (tree) quantization code of Dettmers et al. (2021), sorted, in [-1, 1].

    With ``n = bits - 1`` bits after the sign (``bits`` for the unsigned code), a value
    with ``E`` leading zeros has ``n - 1 - E`` fraction bits, i.e. ``2**(n-1-E)`` values:
    the midpoints of that many equal bins of ``[0.1, 1]``, times ``10**-E``, for
    ``E = 0 .. bits-2``. Zero and ``1.0`` complete the ``2**bits`` values.

    Args:
      signed: a code for values of both signs (else non-negative values only).
      bits: 8 (256 values) or 4 (16 values).

    Returns:
      A sorted float32 numpy array of ``2**bits`` distinct values, ``0`` and ``1`` among
      them (``-1`` is not: the negative side ends at the largest midpoint).

    >>> code = dynamic_code(signed=True, bits=4)
    >>> len(code), float(code.min()), float(code.max())
    (16, -0.8875, 1.0)
    """
    after_sign = bits - 1 if signed else bits
    magnitudes = []
    for e in range(bits - 1):
        count = 2 ** (after_sign - 1 - e)
        edges = np.linspace(0.1, 1.0, count + 1)
        magnitudes.append(10.0 ** -e * (edges[:-1] + edges[1:]) / 2)
    mags = np.concatenate(magnitudes)
    values = np.concatenate([mags, -mags] if signed else [mags])
    return np.sort(np.concatenate([values, [0.0, 1.0]])).astype(np.float32)


def linear_code(bits: int = 4) -> np.ndarray:
    """The linear code without zero of Li et al. (2023): ``(i + 1) / 2**bits``.

    Args:
      bits: the code's width; ``2**bits`` values.

    Returns:
      A sorted float32 numpy array ``[1/2**bits, 2/2**bits, ..., 1]``.

    >>> linear_code(2)
    array([0.25, 0.5 , 0.75, 1.  ], dtype=float32)
    """
    return (np.arange(1, 2 ** bits + 1) / 2 ** bits).astype(np.float32)


#: Each code by name: its sorted values and how many bits a value takes. ``"fp8"`` has no
#: table (the values are float8_e4m3fn numbers).
CODES: dict[str, tuple[Optional[np.ndarray], int]] = {
    "dynamic8_signed": (dynamic_code(True, 8), 8),
    "dynamic8_unsigned": (dynamic_code(False, 8), 8),
    "dynamic4_signed": (dynamic_code(True, 4), 4),
    "linear4_unsigned": (linear_code(4), 4),
    "fp8": (None, 8),
}
CODE_FOR = {(8, "signed"): "dynamic8_signed", (8, "unsigned"): "dynamic8_unsigned",
            (4, "signed"): "dynamic4_signed", (4, "unsigned"): "linear4_unsigned",
            ("fp8", "signed"): "fp8", ("fp8", "unsigned"): "fp8"}

# Nearest code value = searchsorted on the midpoints between code values, done with one
# table lookup. A float32's bits, made monotone (``_order_key``) and shifted right by
# ``_SHIFT``, give a bucket (1/256 of a binade) holding at most one midpoint (checked
# below). Each bucket's table entry is ``(count << 16) + 0xFFFF - m``: ``count`` midpoints
# lie below the bucket, ``m`` is the low ``_SHIFT`` bits of the key of the midpoint inside
# it (``_NONE`` if none). Adding a value's own low bits carries into the count exactly
# when the value is above that midpoint: the index is ``(entry + low) >> 16``. Buckets
# cover magnitudes from ``2**-_TINY`` to 1; smaller ones share the bucket of ``2**-_TINY``
# (no midpoint lies below ``2**(1-_TINY)``, checked), so the table has ~12K entries.
_SHIFT = 15
_TINY = 24
_NONE = 1 << _SHIFT


def _order_key(bits: Any, xp: Any = jnp) -> Any:
    """Float32 bit patterns (as int32 or int64) mapped to integers in the floats' order."""
    return xp.where(bits < 0, -(2 ** 31) - bits - 1, bits)


def _np_keys(values: Any) -> np.ndarray:
    """``_order_key`` of float32 values, in numpy (int64), for building the tables."""
    return _order_key(np.asarray(values, np.float32).view(np.int32).astype(np.int64), np)


_TOP, _BOTTOM = (int(b) for b in _np_keys([1.0, 2.0 ** -_TINY]) >> _SHIFT)  # positive buckets
_HALF = _TOP - _BOTTOM + 1                                    # buckets per sign


def _bucket_index(bucket: Any, xp: Any = jnp) -> Any:
    """A bucket (of a value in [-1, 1]) to its table row: negatives first, tiny ones shared."""
    bucket = xp.clip(bucket, -1 - _TOP, _TOP)
    return xp.where(bucket >= 0, xp.maximum(bucket, _BOTTOM) - _BOTTOM + _HALF,
                    xp.minimum(bucket, -1 - _BOTTOM) + 1 + _TOP)


def _bucket_table(table: np.ndarray) -> np.ndarray:
    midpoints = ((table[1:] + table[:-1]) / 2).astype(np.float32)
    keys = _np_keys(midpoints)
    assert np.all(np.abs(midpoints) >= 2.0 ** (1 - _TINY)), "a midpoint below 2**(1-_TINY)"
    rows = _bucket_index(keys >> _SHIFT, np)
    assert np.all(np.diff(rows) > 0), "two midpoints share a bucket"
    starts = np.concatenate([np.arange(-1 - _TOP, -_BOTTOM), np.arange(_BOTTOM, _TOP + 1)])
    first = np.searchsorted(keys >> _SHIFT, starts, side="left")
    low = np.full(2 * _HALF, _NONE, np.int64)
    low[rows] = keys & (_NONE - 1)
    return ((first << 16) + 0xFFFF - low).astype(np.int32)


_BUCKETS = {name: _bucket_table(t) for name, (t, _) in CODES.items() if t is not None}


def nearest_code_index(scaled: Array, code: str) -> Array:
    """The index of the nearest value of a code to each of ``scaled`` (in ``[-1, 1]``).

    The same as ``jnp.searchsorted(midpoints, scaled, side='left')`` with ``midpoints``
    between consecutive code values (a tie goes to the lower value), by one lookup.

    Args:
      scaled: float32 values in ``[-1, 1]``.
      code: a key of ``CODES`` with a table (not ``"fp8"``).

    Returns:
      uint8 indices into the code, shaped like ``scaled``.

    >>> import jax.numpy as jnp
    >>> nearest_code_index(jnp.array([0.0, 0.3, 1.0]), 'linear4_unsigned')
    Array([ 0,  4, 15], dtype=uint8)
    """
    key = _order_key(jax.lax.bitcast_convert_type(scaled.astype(jnp.float32), jnp.int32))
    # in bounds: _bucket_index clips, and saying so spares XLA's bounds handling
    row = _bucket_index(key >> _SHIFT).astype(jnp.uint32)  # unsigned: no negative wrap
    entry = jnp.asarray(_BUCKETS[code]).at[row].get(mode="promise_in_bounds")
    return ((entry + (key & (_NONE - 1))) >> 16).astype(jnp.uint8)


class QuantizedArray(NamedTuple):
    """One array stored block-wise quantized (a pytree whose leaves are ``codes``, ``absmax``).

    Attributes:
      codes: ``(blocks, block_size)`` uint8 code indices; ``(blocks, block_size // 2)``
        for 4-bit codes (two per byte, the first in the high nibble); float8_e4m3fn values
        for ``"fp8"``.
      absmax: ``(blocks,)`` float32, each block's largest absolute value.
      shape: the array's shape (static: not a leaf).
      dtype: the array's dtype (static).
      code: the code's name, a key of ``CODES`` (static).

    >>> import jax.numpy as jnp
    >>> q = quantize_blockwise(jnp.arange(300.0), 'dynamic8_unsigned', 256)
    >>> q.codes.shape, q.absmax.shape, q.shape
    ((2, 256), (2,), (300,))
    """

    codes: Array
    absmax: Array
    shape: tuple
    dtype: Any
    code: str


jax.tree_util.register_pytree_with_keys(
    QuantizedArray,
    lambda q: (((jax.tree_util.GetAttrKey("codes"), q.codes),
                (jax.tree_util.GetAttrKey("absmax"), q.absmax)), (q.shape, q.dtype, q.code)),
    lambda aux, children: QuantizedArray(*children, *aux),
    flatten_func=lambda q: ((q.codes, q.absmax), (q.shape, q.dtype, q.code)))


def _blocks(x: Array, block_size: int) -> Array:
    flat = jnp.ravel(x).astype(jnp.float32)
    return jnp.pad(flat, (0, -flat.size % block_size)).reshape(-1, block_size)


def to_e4m3fn(y: Array) -> Array:
    """``y.astype(float8_e4m3fn)`` for ``|y| <= 448`` (and NaN), from the float32 bits.

    Round to nearest even, as the cast; written out with integer operations because
    XLA:CPU's cast runs ~4x slower than this (it is most of an fp8 state's encoding).
    Normal results (``|y| >= 2**-6``): the float32 mantissa rounded to 3 bits, the
    exponent re-biased from 127 to 7; subnormal ones: ``round(|y| * 2**9)`` eighths of
    ``2**-6``; NaN stays NaN. Magnitudes above 448 are not handled (quantization never
    makes them).

    Args:
      y: float32 values in ``[-448, 448]`` or NaN.

    Returns:
      float8_e4m3fn values, shaped like ``y``.

    >>> import jax.numpy as jnp
    >>> to_e4m3fn(jnp.array([0.3, -448.0, 0.001]))
    Array([0.3125, -448, 0.00195312], dtype=float8_e4m3fn)
    """
    bits = jax.lax.bitcast_convert_type(y.astype(jnp.float32), jnp.uint32)
    magnitude = bits & 0x7FFFFFFF
    normal = ((magnitude + 0x7FFFF + ((magnitude >> 20) & 1)) >> 20) - (120 << 3)
    subnormal = jnp.round(jnp.abs(y) * 512.0).astype(jnp.uint32)
    code = jnp.where(magnitude < (121 << 23), subnormal, normal)
    code = jnp.where(magnitude > 0x7F800000, 0x7F, code) | ((bits >> 24) & 0x80)
    return jax.lax.bitcast_convert_type(code.astype(jnp.uint8), jnp.float8_e4m3fn)


# Two 4-bit codes per byte, the first in the high nibble. Pairs of bytes are read and
# written as one uint16 (a bitcast, little-endian: the first byte is the low half): the
# codes themselves are then computed, and decoded, in a plain contiguous pass, where
# strided slices of them made XLA:CPU compute them scalar by scalar (5x slower).

def _pack_nibbles(index: Array) -> Array:
    pairs = jax.lax.bitcast_convert_type(index.reshape(index.shape[0], -1, 2), jnp.uint16)
    return (((pairs & 15) << 4) | (pairs >> 8)).astype(jnp.uint8)


def _unpack_nibbles(codes: Array) -> Array:
    pairs = (codes >> 4).astype(jnp.uint16) | ((codes & 15).astype(jnp.uint16) << 8)
    return jax.lax.bitcast_convert_type(pairs, jnp.uint8).reshape(codes.shape[0], -1)


def quantize_blockwise(x: Array, code: str, block_size: int) -> QuantizedArray:
    """``x`` quantized in blocks: each value to the nearest code value of ``x / absmax``.

    ``x`` is flattened and zero-padded to whole blocks; the original shape and dtype are
    kept in the result. Nearest is by a search of the midpoints of the sorted code
    (``nearest_code_index``; a tie goes to the lower value); ``"fp8"`` casts
    ``448 x / absmax`` to float8_e4m3fn (``to_e4m3fn``)
    (round to nearest even). A block of zeros gets ``absmax = 0``.

    Args:
      x: a floating array.
      code: a key of ``CODES``.
      block_size: values per block (even for 4-bit codes).

    Returns:
      The :class:`QuantizedArray`.

    >>> import jax.numpy as jnp
    >>> q = quantize_blockwise(jnp.array([0.5, -1.0, 0.0]), 'dynamic8_signed', 4)
    >>> dequantize_blockwise(q)
    Array([ 0.50078124, -0.99296874,  0.        ], dtype=float32)
    """
    table, bits = CODES[code]
    blocks = _blocks(x, block_size)
    absmax = jnp.max(jnp.abs(blocks), axis=1)
    scaled = blocks / jnp.where(absmax > 0, absmax, 1.0)[:, None]
    if table is None:
        codes = to_e4m3fn(scaled * FP8_MAX)
    else:
        index = nearest_code_index(scaled, code)
        codes = _pack_nibbles(index) if bits == 4 else index
    return QuantizedArray(codes, absmax, tuple(np.shape(x)), jnp.dtype(x.dtype), code)


def dequantize_blockwise(q: QuantizedArray, after: Optional[Array] = None) -> Array:
    """The array a :class:`QuantizedArray` stands for: ``code[index] * absmax``.

    Args:
      q: the quantized array.
      after: ``None``, or a boolean scalar computed from arrays that must exist before
        this decode starts; the result is the same whatever its value (it only picks
        between two copies of the code table, or of the scale), but XLA cannot start
        the decode earlier.

    Returns:
      An array of ``q.shape`` and ``q.dtype``.

    >>> import jax.numpy as jnp
    >>> q = quantize_blockwise(jnp.full((2, 3), 0.25), 'linear4_unsigned', 2)
    >>> dequantize_blockwise(q)
    Array([[0.25, 0.25, 0.25],
           [0.25, 0.25, 0.25]], dtype=float32)
    """
    table, bits = CODES[q.code]
    if table is None:
        # the scale, or its absolute value (the same: a maximum of absolute values)
        absmax = q.absmax if after is None else jnp.where(after, q.absmax, jnp.abs(q.absmax))
        blocks = q.codes.astype(jnp.float32) * (absmax / FP8_MAX)[:, None]
    else:
        index = q.codes
        if bits == 4:
            index = _unpack_nibbles(index)
        if after is not None:  # the table twice; ``after`` picks the copy
            table = np.concatenate([table, table])
            index = index.astype(jnp.int32) + jnp.where(after, 0, 2 ** bits)
        # an index into the table: always in bounds (see nearest_code_index)
        blocks = jnp.asarray(table).at[index].get(mode="promise_in_bounds") * q.absmax[:, None]
    size = int(np.prod(q.shape, dtype=np.int64))
    return blocks.reshape(-1)[:size].reshape(q.shape).astype(q.dtype)


# On a mesh with explicit axes (jax.make_mesh's default) a split leaf's reshapes to and
# from blocks run with the axes made automatic: blocks split like the leaf's first dim
# where whole blocks line up (else replicated); a quantized leaf keeps its layout.

def _explicit(x: Any) -> Any:
    sharding = getattr(jax.typeof(x), "sharding", None)
    return sharding if AxisType.Explicit in getattr(getattr(sharding, "mesh", None),
                                                    "axis_types", ()) else None


def _aligned(sharding: Any, shape: tuple, blocks: int, block_size: int) -> PartitionSpec:
    axes = (tuple(sharding.spec) + (None,) * len(shape))[:len(shape)]
    n = int(np.prod([sharding.mesh.shape[a] for a in np.atleast_1d(axes[0] or ())]))
    ok = (axes[0] is not None and not any(axes[1:]) and shape[0] % n == blocks % n == 0
          and int(np.prod(shape, dtype=np.int64)) == blocks * block_size)
    return PartitionSpec(axes[0] if ok else None)


def quantize_like(x: Array, code: str, block_size: int, like: Optional[QuantizedArray]) -> Any:
    """``quantize_blockwise(x, code, block_size)``, laid out on ``x``'s mesh or like ``like``.

    On a mesh with explicit axes the reshape to blocks runs with the axes made automatic:
    new blocks are split like ``x``'s first dimension where whole blocks line up (else
    replicated); with ``like`` (the state being replaced) its codes' and scales' layout.

    Args:
      x: the array to quantize.
      code: a key of ``CODES``.
      block_size: values per block.
      like: the quantized array ``x`` replaces, or ``None``.

    Returns:
      The :class:`QuantizedArray`.
    """
    sharding = _explicit(x if like is None else like.codes)
    if sharding is None:
        return quantize_blockwise(x, code, block_size)
    if like is None:
        spec = _aligned(sharding, np.shape(x), -(-np.size(x) // block_size), block_size)
        codes, absmax = (NamedSharding(sharding.mesh, PartitionSpec(*spec, None)),
                         NamedSharding(sharding.mesh, spec))
    else:
        codes, absmax = sharding, jax.typeof(like.absmax).sharding
    out = QuantizedArray(codes, absmax, tuple(np.shape(x)), jnp.dtype(x.dtype), code)
    return jax_compat.auto_axes(lambda v: quantize_blockwise(v, code, block_size),
                                out_sharding=out)(x)


def dequantize_like(q: QuantizedArray, after: Optional[Array] = None) -> Array:
    """``dequantize_blockwise(q, after)``, laid out like ``q`` on a mesh with explicit axes.

    Args:
      q: the quantized array.
      after: as for :func:`dequantize_blockwise`.

    Returns:
      An array of ``q.shape`` and ``q.dtype``.
    """
    sharding = _explicit(q.codes)
    if sharding is None:
        return dequantize_blockwise(q, after)
    spec = _aligned(sharding, q.shape, q.codes.shape[0], block_size_of(q))
    return jax_compat.auto_axes(dequantize_blockwise,
                                out_sharding=NamedSharding(sharding.mesh, spec))(q, after)


def block_size_of(q: QuantizedArray) -> int:
    """Values per block of ``q`` (two codes per byte for 4-bit codes).

    Args:
      q: a quantized array.

    Returns:
      The block size.
    """
    return q.codes.shape[1] * (2 if CODES[q.code][1] == 4 else 1)
