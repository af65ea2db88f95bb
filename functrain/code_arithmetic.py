"""The dynamic codes without tables: values from indices, nearest indices from values.

``quantize_blockwise`` and ``dequantize_blockwise`` look a dynamic code's values up in a
256-entry (or 16-entry) table, and its nearest index up in a table of buckets. On CPU and
GPU those lookups are the fast way. On TPU a lookup is a gather, which the compiler costs at
kilobytes of traffic per looked-up value (``make accel``, docs/performance.md): there the
codes are computed instead (``quantization._by_platform`` picks when the program is
lowered), bit for bit the tables':

* **decode** (:func:`decode`): the index gives the value's decade ``e`` and its bin ``j`` in
  that decade with integer comparisons (the decades hold 1, 2, 4, ... values, smallest
  first); the value is ``A_e + j B_e`` (``A_e = 10**-e (0.1 + 0.45 / n_e)``, ``B_e = 10**-e
  0.9 / n_e``, ``n_e`` values in decade ``e``), evaluated in float32 as an unevaluated sum:
  ``B_e`` split into a 16-bit head (``j`` times it is exact) and a tail, ``A_e`` into a
  float32 head and tail, the head sum made exact by Knuth's two-sum, the small terms added
  last, one rounding at the end. Every product that a compiler could fuse into a
  multiply-add is exact or lies in the small terms, so contraction gives the same bits.
* **nearest index** (:func:`nearest`): the code's midpoints are float32 sums of two
  neighbouring values halved, so they too are exact from :func:`decode`. A candidate index
  comes from the value's decade (comparisons with the decades' lower edges) and its bin
  (one multiply); it is within one of the nearest, and one exact comparison with the
  midpoint on either side corrects it. The 16-value codes compare with all 15 midpoints.
* **stochastic rounding's neighbours** (16-value codes): the value and the inverse gaps to
  its neighbours picked from constants by comparisons (:func:`pick`).

``tests/test_quantized_codec_exact.py`` checks these against the tables and the
definitions: every index of every dynamic code bit for bit; each value's float64 definition
at least a thousandth of an ulp from a float32 rounding boundary (so the small terms'
rounding cannot change it); the nearest index on every float32 within 4096 ulps of every
midpoint, a sweep of all float32 bit patterns in ``[-1, 1]``, and the special values.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def _split(x: float, head_bits: int) -> tuple:
    """``x`` as a float32 head of at most ``head_bits`` significant bits and a float32 tail."""
    mantissa, exponent = np.frexp(x)
    head = np.float32(np.ldexp(np.round(mantissa * 2.0 ** head_bits), exponent - head_bits))
    return head, np.float32(x - np.float64(head))


@functools.lru_cache(maxsize=None)
def layout(signed: bool, bits: int) -> tuple:
    """``(zero, first, decades, constants)`` of the dynamic code of ``bits`` bits.

    ``zero`` is the index of 0 in the sorted code; the magnitudes above it, ascending,
    hold ``first, 2 first, 4 first, ...`` values per decade (``first`` 1 for the signed
    code, 2 for the unsigned); ``constants`` is a float32 array ``(4, decades)`` of
    ``A`` head, ``A`` tail, ``B`` head, ``B`` tail, smallest decade first.
    """
    after_sign = bits - 1 if signed else bits
    first = 2 ** (after_sign - bits + 1)
    rows = []
    for e in reversed(range(bits - 1)):           # the smallest decade first
        count = 2 ** (after_sign - 1 - e)
        a = 10.0 ** -e * (0.1 + 0.45 / count)
        b = 10.0 ** -e * 0.9 / count
        rows.append((*_split(a, 24), *_split(b, 16)))
    zero = 2 ** bits // 2 - 1 if signed else 0
    return zero, first, bits - 1, np.asarray(rows, np.float32).T.copy()


def pick(constants: np.ndarray, index: Array) -> Array:
    """``constants[index]`` for a short float32 vector, by comparisons and selects (no
    gather); ``index`` in range.

    Args:
      constants: a short float32 numpy vector.
      index: integer indices into it.

    Returns:
      float32 values shaped like ``index``.

    >>> import jax.numpy as jnp
    >>> pick(np.array([1.0, 2.0, 4.0], np.float32), jnp.array([2, 0]))
    Array([4., 1.], dtype=float32)
    """
    out = jnp.full(index.shape, constants[0], jnp.float32)
    for k in range(1, len(constants)):
        out = jnp.where(index == k, constants[k], out)
    return out


def _two_sum(a: Array, b: Array) -> tuple:
    """``(s, err)`` with ``s = fl(a + b)`` and ``s + err = a + b`` exactly (Knuth)."""
    s = a + b
    b_virtual = s - a
    return s, (a - (s - b_virtual)) + (b - b_virtual)


def decode(index: Array, signed: bool, bits: int) -> Array:
    """The dynamic code's value at each index (float32), equal to the sorted table's.

    Args:
      index: integer indices into the sorted code, ``0 .. 2**bits - 1``.
      signed: the signed code (else the unsigned one).
      bits: 8 or 4.

    Returns:
      float32 values shaped like ``index``.

    >>> import jax.numpy as jnp
    >>> decode(jnp.array([0, 127, 255]), signed=True, bits=8)  # -largest, zero, one
    Array([-0.99296874,  0.        ,  1.        ], dtype=float32)
    >>> float(decode(jnp.array(128), signed=True, bits=8))       # 10**-6 * 0.55
    5.499999815583578e-07
    """
    zero, first, decades, (a_head, a_tail, b_head, b_tail) = layout(signed, bits)
    i = index.astype(jnp.int32)
    top = 2 ** bits - 1
    p = jnp.abs(i - zero) - 1                       # position among the ascending magnitudes
    shifted = p + first                             # in [2**m, 2**(m + 1)) in decade m
    m = sum((shifted >= first * 2 ** k).astype(jnp.int32) for k in range(1, decades))
    j = (shifted - first * jnp.left_shift(1, m)).astype(jnp.float32)
    s, err = _two_sum(pick(a_head, m), j * pick(b_head, m))   # j * head: exact
    magnitude = s + ((err + pick(a_tail, m)) + j * pick(b_tail, m))
    value = jnp.where(i < zero, -magnitude, magnitude)
    return jnp.where(i == zero, 0.0, jnp.where(i == top, 1.0, value)).astype(jnp.float32)


def _decade_edges(signed: bool, bits: int) -> tuple:
    """Per decade (smallest first): its lower edge ``0.1 * 10**-e``, ``1 / B_e``, its first
    position among the magnitudes and its count, as float32 / int constants."""
    after_sign = bits - 1 if signed else bits
    lower, inverse_width, start, count = [], [], [], []
    position = 0
    for e in reversed(range(bits - 1)):
        n = 2 ** (after_sign - 1 - e)
        lower.append(np.float32(0.1 * 10.0 ** -e))
        inverse_width.append(np.float32(n / (0.9 * 10.0 ** -e)))
        start.append(position)
        count.append(n)
        position += n
    return (np.asarray(lower), np.asarray(inverse_width, np.float32), np.asarray(start),
            np.asarray(count))


def _midpoint(k: Array, signed: bool, bits: int) -> Array:
    """The float32 midpoint between code values ``k`` and ``k + 1``, as the table's."""
    return (decode(k, signed, bits) + decode(k + 1, signed, bits)) * np.float32(0.5)


def nearest(scaled: Array, signed: bool, bits: int,
            values: Optional[np.ndarray] = None) -> Array:
    """The index of the nearest dynamic-code value to each of ``scaled``: the number of the
    code's float32 midpoints below it (a tie goes to the lower value), as
    ``quantization.nearest_code_index``'s table lookup gives it, NaN by its sign.

    Args:
      scaled: float32 values (in ``[-1, 1]``; beyond, the nearest end).
      signed: the signed code (else the unsigned one).
      bits: 8 or 4.
      values: for ``bits=4``, the code's sorted float32 values (its table): the 15
        midpoints are formed from them as the table's are.

    Returns:
      uint8 indices shaped like ``scaled``.

    >>> import jax.numpy as jnp
    >>> nearest(jnp.array([-1.0, 0.0, 0.3, 1.0]), signed=True, bits=8)
    Array([  0, 127, 205, 255], dtype=uint8)
    """
    x = scaled.astype(jnp.float32)
    top = 2 ** bits - 1
    if bits == 4:        # 15 midpoints: count those below x
        if values is None or len(values) != 16:
            raise ValueError("code_arithmetic.nearest: a 4-bit code needs its 16 sorted "
                             "values (values=).")
        values = np.asarray(values, np.float32)
        index = sum((x > m).astype(jnp.int32) for m in (values[1:] + values[:-1]) / 2)
    else:
        zero = layout(signed, bits)[0]
        lower, inverse_width, start, count = _decade_edges(signed, bits)
        magnitude = jnp.abs(x)
        decade = sum((magnitude >= lower[k]).astype(jnp.int32) for k in range(1, len(lower)))
        offset = (magnitude - pick(lower, decade)) * pick(inverse_width, decade)
        # clipped as a float first: an infinity or NaN never reaches the integer conversion
        last = pick(count.astype(np.float32) - 1, decade)
        j = jnp.floor(jnp.clip(jnp.nan_to_num(offset), 0.0, last)).astype(jnp.int32)
        position = pick(start.astype(np.float32), decade).astype(jnp.int32) + j
        candidate = jnp.clip(jnp.where(x < 0, zero - 1 - position, zero + 1 + position),
                             0, top)
        up = (candidate < top) & (x > _midpoint(jnp.minimum(candidate, top - 1), signed,
                                                 bits))
        down = (candidate > 0) & (x <= _midpoint(jnp.maximum(candidate - 1, 0), signed,
                                                  bits))
        index = candidate + up.astype(jnp.int32) - down.astype(jnp.int32)
    negative = jax.lax.bitcast_convert_type(x, jnp.int32) < 0
    index = jnp.where(jnp.isnan(x), jnp.where(negative, 0, top), index)
    return index.astype(jnp.uint8)


# --------------------------------------------------------------------------
# Two 4-bit codes per byte
# --------------------------------------------------------------------------
# The first code in the high nibble. On CPU and GPU pairs of codes are read and written as
# one uint16 (a bitcast, little-endian: the first byte is the low half): the codes
# themselves are then computed, and decoded, in a plain contiguous pass, where strided
# slices of them made XLA:CPU compute them scalar by scalar (5x slower). On TPU that
# bitcast's trailing axis of 2 is padded to 128 lanes (1,454 bytes per parameter for a 4-bit
# AdamW step, 1.3 GB temp): there the pairs are strided slices, and the codes are spread
# back by interior padding (167 bytes, 145 MiB). The same bytes either way.

def pack_by_bitcast(index: Array) -> Array:
    """Pairs of 4-bit indices in one byte each, through a uint16 bitcast (CPU, GPU).

    Args:
      index: uint8 indices below 16, ``(blocks, width)`` with ``width`` even.

    Returns:
      ``(blocks, width // 2)`` uint8: ``index[:, 2 j] << 4 | index[:, 2 j + 1]``.
    """
    pairs = jax.lax.bitcast_convert_type(index.reshape(index.shape[0], -1, 2), jnp.uint16)
    return (((pairs & 15) << 4) | (pairs >> 8)).astype(jnp.uint8)


def unpack_by_bitcast(codes: Array) -> Array:
    """The inverse of :func:`pack_by_bitcast`.

    Args:
      codes: ``(blocks, n)`` uint8, two indices per byte.

    Returns:
      ``(blocks, 2 n)`` uint8 indices.
    """
    pairs = (codes >> 4).astype(jnp.uint16) | ((codes & 15).astype(jnp.uint16) << 8)
    return jax.lax.bitcast_convert_type(pairs, jnp.uint8).reshape(codes.shape[0], -1)


def pack_by_slices(index: Array) -> Array:
    """:func:`pack_by_bitcast`'s bytes from strided slices (TPU).

    Args:
      index: as :func:`pack_by_bitcast`.

    Returns:
      As :func:`pack_by_bitcast`.
    """
    return ((index[:, 0::2] & 15) << 4) | (index[:, 1::2] & 15)


def unpack_by_slices(codes: Array) -> Array:
    """:func:`unpack_by_bitcast`'s indices by interior padding (TPU).

    Args:
      codes: as :func:`unpack_by_bitcast`.

    Returns:
      As :func:`unpack_by_bitcast`.
    """
    zero = jnp.zeros((), codes.dtype)
    first = jax.lax.pad(codes >> 4, zero, [(0, 0, 0), (0, 1, 1)])  # at even positions
    second = jax.lax.pad(codes & 15, zero, [(0, 0, 0), (1, 0, 1)])  # at odd positions
    return first | second
