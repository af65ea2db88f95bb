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
  the signed dynamic code with 4 bits for signed fields, blocks of 128; for non-negative
  fields the linear code without zero, ``(i + 1) / 16`` (the paper's zero-point finding:
  a second moment rounded to zero makes ``1 / sqrt(nu)`` explode), scaled by the
  paper's *rank-1 normalization* on arrays of 2 or more dimensions (code
  ``"linear4_unsigned_rank1"``: each value divided by the smallest of the maxima of
  ``|x|`` over its row, its column, ... one maximum per index of each axis) and per
  block of 128 on vectors. Two codes per byte.
* ``bits="fp8"``: ``float8_e4m3fn`` values of ``448 x / absmax``, blocks of 256.

A :class:`QuantizedArray` names its code in its pytree keys (its codes are the child
``codes_<code>``), so a checkpoint restored into a state of another code (Orbax restores
by key) fails with both names in the error instead of reading one code's bytes as another's.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from functrain import code_arithmetic

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


class Code(NamedTuple):
    """One code of :data:`CODES`.

    Attributes:
      values: its sorted values in ``[-1, 1]`` (float32), or ``None`` for ``"fp8"`` (the
        values are float8_e4m3fn numbers).
      bits: bits per value (4 or 8).
      scaling: ``"block"`` (one ``absmax`` per block of values) or ``"rank1"`` (Li et
        al.'s rank-1 normalization: the maxima of ``|x|`` along each axis).
      rounding: ``"nearest"`` or ``"stochastic"`` (:func:`stochastic_code_index`); only
        the encoding differs, the decoding is the same.
    """

    values: Optional[np.ndarray]
    bits: int
    scaling: str
    rounding: str = "nearest"


#: Each code by name.
CODES: dict[str, Code] = {
    "dynamic8_signed": Code(dynamic_code(True, 8), 8, "block"),
    "dynamic8_unsigned": Code(dynamic_code(False, 8), 8, "block"),
    "dynamic4_signed": Code(dynamic_code(True, 4), 4, "block"),
    "dynamic4_signed_sr": Code(dynamic_code(True, 4), 4, "block", "stochastic"),
    "linear4_unsigned": Code(linear_code(4), 4, "block"),
    "linear4_unsigned_rank1": Code(linear_code(4), 4, "rank1"),
    "fp8": Code(None, 8, "block"),
}


def code_for(bits: Any, kind: str, ndim: int, rank1: bool = True,
             stochastic: bool = True) -> str:
    """The code ``quantized_state`` stores a field of value ``kind`` in.

    Args:
      bits: ``8``, ``4`` or ``"fp8"``.
      kind: ``"signed"`` or ``"unsigned"`` (never negative: second moments).
      ndim: the array's number of dimensions.
      rank1: for ``bits=4``, scale unsigned arrays of 2 or more dimensions by the rank-1
        normalization of Li et al. (2023) rather than per block.
      stochastic: for ``bits=4``, round signed fields stochastically
        (``"dynamic4_signed_sr"``) rather than to the nearest value.

    Returns:
      A key of :data:`CODES`.

    >>> code_for(4, "unsigned", 2), code_for(4, "unsigned", 1), code_for(8, "signed", 2)
    ('linear4_unsigned_rank1', 'linear4_unsigned', 'dynamic8_signed')
    >>> code_for(4, "signed", 2), code_for(4, "signed", 2, stochastic=False)
    ('dynamic4_signed_sr', 'dynamic4_signed')
    """
    if bits == "fp8":
        return "fp8"
    if bits == 8:
        return f"dynamic8_{kind}"
    if kind == "signed":
        return "dynamic4_signed_sr" if stochastic else "dynamic4_signed"
    return "linear4_unsigned_rank1" if rank1 and ndim >= 2 else "linear4_unsigned"

# Nearest code value = searchsorted on the midpoints between code values, done with one
# table lookup. A float32's bits, made monotone (``_order_key``) and shifted right by a
# code's ``shift``, give a bucket (``2**(23 - shift)`` per binade) holding at most one
# midpoint: the shift is the largest that allows this (checked; 16 for the 8-bit codes,
# wider buckets for the 4-bit one), which keeps the table small enough to stay in the L1
# cache beside the data streaming through it. Each bucket's table entry is
# ``(count << (shift + 1)) + 2**(shift + 1) - 1 - m``: ``count`` midpoints lie below the
# bucket, ``m`` is the low ``shift`` bits of the key of the midpoint inside it
# (``2**shift`` if none). Adding a value's own low bits carries into the count exactly
# when the value is above that midpoint: the index is ``(entry + low) >> (shift + 1)``.
# Buckets cover magnitudes from ``2**-_TINY`` to 1; smaller ones share the bucket of
# ``2**-_TINY`` (no midpoint lies below ``2**(1-_TINY)``, checked).
_TINY = 24


def _order_key(bits: Any, xp: Any = jnp) -> Any:
    """Float32 bit patterns (as int32 or int64) mapped to integers in the floats' order."""
    return xp.where(bits < 0, -(2 ** 31) - bits - 1, bits)


def _np_keys(values: Any) -> np.ndarray:
    """``_order_key`` of float32 values, in numpy (int64), for building the tables."""
    return _order_key(np.asarray(values, np.float32).view(np.int32).astype(np.int64), np)


def _bucket_index(bucket: Any, shift: int, xp: Any = jnp) -> Any:
    """A bucket (of a value in [-1, 1]) to its table row: negatives first, tiny ones shared."""
    top, bottom = (int(b) for b in _np_keys([1.0, 2.0 ** -_TINY]) >> shift)  # positive
    half = top - bottom + 1                                                 # rows per sign
    bucket = xp.clip(bucket, -1 - top, top)
    return xp.where(bucket >= 0, xp.maximum(bucket, bottom) - bottom + half,
                    xp.minimum(bucket, -1 - bottom) + 1 + top)


def _bucket_table(table: np.ndarray, shift: int) -> Optional[np.ndarray]:
    """The lookup table of a code for buckets of ``shift``; None if two midpoints share one."""
    midpoints = ((table[1:] + table[:-1]) / 2).astype(np.float32)
    keys = _np_keys(midpoints)
    assert np.all(np.abs(midpoints) >= 2.0 ** (1 - _TINY)), "a midpoint below 2**(1-_TINY)"
    rows = _bucket_index(keys >> shift, shift, np)
    if not np.all(np.diff(rows) > 0):
        return None
    top, bottom = (int(b) for b in _np_keys([1.0, 2.0 ** -_TINY]) >> shift)
    starts = np.concatenate([np.arange(-1 - top, -bottom), np.arange(bottom, top + 1)])
    first = np.searchsorted(keys >> shift, starts, side="left")
    low = np.full(starts.size, 1 << shift, np.int64)
    low[rows] = keys & ((1 << shift) - 1)
    return ((first << (shift + 1)) + (1 << (shift + 1)) - 1 - low).astype(np.int32)


def _widest_buckets(table: np.ndarray) -> tuple[int, np.ndarray]:
    """``(shift, lookup table)`` with the largest shift whose buckets hold one midpoint each."""
    for shift in range(22, 14, -1):  # from 2 buckets per binade to 256
        built = _bucket_table(table, shift)
        if built is not None:
            return shift, built
    raise AssertionError("two midpoints share a bucket of 1/256 binade")


_BUCKETS = {name: _widest_buckets(c.values) for name, c in CODES.items()
            if c.values is not None}


def _inverse_gaps(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per code value, ``1 / (next - value)`` and ``1 / (value - previous)`` (0 at the ends)."""
    gaps = 1.0 / np.diff(table.astype(np.float64))
    return (np.append(gaps, 0.0).astype(np.float32), np.insert(gaps, 0, 0.0).astype(np.float32))


_INVERSE_GAPS = {name: _inverse_gaps(c.values) for name, c in CODES.items()
                 if c.values is not None}


# The linear codes ``(i + 1) / 2**bits`` need no table: their midpoints are
# ``(2 k + 3) / 2**(bits + 1)`` exactly, so the count of midpoints below ``x`` is
# ``ceil(2**bits x - 1.5)`` clipped to the code (``2**bits x`` is exact, and so is the
# subtraction wherever the clip does not decide), and code value ``i`` is
# ``(i + 1) * 2**-bits`` exactly. No gather: XLA:CPU vectorizes the loop around it.
_LINEAR_BITS = {name: c.bits for name, c in CODES.items()
                if c.values is not None and np.array_equal(c.values, linear_code(c.bits))}


def _linear_index(scaled: Array, bits: int) -> Array:
    """``nearest_code_index`` for the linear code of ``bits`` bits, by arithmetic."""
    top = 2 ** bits - 1
    scaled = scaled.astype(jnp.float32)
    index = jnp.clip(jnp.ceil(scaled * np.float32(2 ** bits) - np.float32(1.5)), 0, top)
    # NaN as the table lookup has it: a positive NaN above every midpoint, a negative one below
    nan = jnp.where(jax.lax.bitcast_convert_type(scaled, jnp.int32) < 0, 0, top)
    return jnp.where(jnp.isnan(scaled), nan, index).astype(jnp.uint8)


def _by_platform(args: Sequence[Array], by_table: Any, by_arithmetic: Any) -> Any:
    """``by_table(*args)`` on CPU and GPU, ``by_arithmetic(*args)`` elsewhere (TPU): two
    ways to the same bits, picked when the program is lowered (``lax.platform_dependent``).

    A dynamic code's lookup: on TPU a table lookup is a gather the compiler costs at
    kilobytes per looked-up value, and the arithmetic of ``functrain.code_arithmetic`` gives
    the same bits; on GPU the lookup is cheap and the arithmetic encode compiled 6x slower
    for the same traffic (``make accel``). The 4-bit codes' packing (below) the same way.
    """
    return jax.lax.platform_dependent(*args, cpu=by_table, cuda=by_table, rocm=by_table,
                                      default=by_arithmetic)


def nearest_code_index(scaled: Array, code: str) -> Array:
    """The index of the nearest value of a code to each of ``scaled`` (in ``[-1, 1]``).

    The same as ``jnp.searchsorted(midpoints, scaled, side='left')`` with ``midpoints``
    between consecutive code values (a tie goes to the lower value), by one lookup (for
    the linear codes, by arithmetic).

    Args:
      scaled: float32 values in ``[-1, 1]``.
      code: a key of ``CODES`` with a table (not ``"fp8"``).

    Returns:
      uint8 indices into the code, shaped like ``scaled``.

    >>> import jax.numpy as jnp
    >>> nearest_code_index(jnp.array([0.0, 0.3, 1.0]), 'linear4_unsigned')
    Array([ 0,  4, 15], dtype=uint8)
    """
    if code in _LINEAR_BITS:
        return _linear_index(scaled, _LINEAR_BITS[code])
    c = CODES[code]
    return _by_platform(
        [scaled], functools.partial(_index_by_table, code),
        lambda x: code_arithmetic.nearest(x, bool(c.values[0] < 0), c.bits, c.values))


def _index_by_table(code: str, scaled: Array) -> Array:
    """``nearest_code_index`` by one lookup in the code's bucket table (CPU and GPU)."""
    shift, table = _BUCKETS[code]
    key = _order_key(jax.lax.bitcast_convert_type(scaled.astype(jnp.float32), jnp.int32))
    # in bounds: _bucket_index clips, and saying so spares XLA's bounds handling
    row = _bucket_index(key >> shift, shift).astype(jnp.uint32)  # unsigned: no negative wrap
    entry = jnp.asarray(table).at[row].get(mode="promise_in_bounds")
    return ((entry + (key & ((1 << shift) - 1))) >> (shift + 1)).astype(jnp.uint8)


def _mix32(h: Array) -> Array:
    """An avalanching uint32 -> uint32 bijection (xor-shifts and odd multiplies)."""
    h = (h ^ (h >> 16)) * jnp.uint32(0x7FEB352D)
    h = (h ^ (h >> 15)) * jnp.uint32(0x846CA68B)
    return h ^ (h >> 16)


def dither(scaled: Array, scales: Array) -> Array:
    """Pseudo-random numbers in ``[0, 1)`` for stochastic rounding, one per value, from the
    value's bits (all but the last 16), its position and its block's scale: no key,
    nothing stored.

    Used on values that change every step (a moment after its update), they differ from
    step to step; the same state gives the same numbers, so a run is reproducible. A value
    and a block scale that come back bit for bit get the same number again (a moment that
    stayed at a code value while nothing in its block changed stays again).

    Args:
      scaled: ``(blocks, block_size)`` float32 values.
      scales: ``(blocks,)`` float32 (each block's ``absmax``).

    Returns:
      float32 multiples of ``2**-24`` in ``[0, 1)``, shaped like ``scaled``.

    >>> import jax.numpy as jnp
    >>> u = dither(jnp.linspace(-1, 1, 4096).reshape(32, 128), jnp.ones(32))
    >>> bool((u >= 0).all() & (u < 1).all()), round(float(u.mean()), 1)
    (True, 0.5)
    """
    position = (jax.lax.broadcasted_iota(jnp.uint32, scaled.shape, 0)
                * jnp.uint32(scaled.shape[1])
                + jax.lax.broadcasted_iota(jnp.uint32, scaled.shape, 1))
    # the low 16 bits left out: the last bits of a moment differ between a jitted step and
    # an eager one (fused or not), and should rarely change its rounding
    bits = jax.lax.bitcast_convert_type(scaled.astype(jnp.float32), jnp.uint32) >> 16
    scale_bits = jax.lax.bitcast_convert_type(scales.astype(jnp.float32), jnp.uint32) >> 16
    h = _mix32(_mix32(bits ^ (position * jnp.uint32(0x9E3779B9))) ^ scale_bits[:, None])
    return (h >> 8).astype(jnp.float32) * np.float32(2.0 ** -24)


def stochastic_code_index(scaled: Array, code: str, u: Array) -> Array:
    """Stochastic rounding to a code: each value to one of the two code values around it,
    the upper one with probability ``(x - lower) / (upper - lower)``, so that the decoded
    value's expectation is ``x`` (values beyond the code's ends go to the nearest end).

    With a 4-bit code a moment's decay (``b1 x`` with ``b1 = 0.9``) is smaller than the
    gap between neighbouring code values, and nearest rounding sends it back to where it
    was: a first moment whose gradients stopped never decays. Rounded stochastically it
    decays in expectation.

    Args:
      scaled: float32 values in ``[-1, 1]``.
      code: a key of ``CODES`` with a table (not ``"fp8"``).
      u: numbers in ``[0, 1)`` shaped like ``scaled`` (:func:`dither`): a value moves
        from its nearest code value to the other neighbour when ``u < p``, ``p`` that
        neighbour's probability.

    Returns:
      uint8 indices into the code, shaped like ``scaled``.

    >>> import jax.numpy as jnp
    >>> x = jnp.full(4, 0.5)      # code values 12 and 13 are 0.4375 and 0.6625: p = 0.28
    >>> stochastic_code_index(x, 'dynamic4_signed_sr', jnp.array([0.0, 0.2, 0.3, 0.9]))
    Array([13, 13, 12, 12], dtype=uint8)
    """
    nearest = nearest_code_index(scaled, code).astype(jnp.int32)
    tables = (CODES[code].values, *_INVERSE_GAPS[code])
    value, up_gap, down_gap = _by_platform(
        [nearest], lambda i: [jnp.asarray(t).at[i].get(mode="promise_in_bounds")
                              for t in tables],
        lambda i: [code_arithmetic.pick(t, i) for t in tables])
    up = scaled > value
    inverse_gap = jnp.where(up, up_gap, down_gap)
    p = jnp.abs(scaled - value) * inverse_gap     # 0 at a code value and beyond the ends
    step = jnp.where(u < p, jnp.where(up, 1, -1), 0)
    return (nearest + step).astype(jnp.uint8)


class QuantizedArray(NamedTuple):
    """One array stored quantized (a pytree whose leaves are ``codes`` and ``absmax``).

    Its pytree keys name the code: the codes are the child ``.codes_<code>`` (e.g.
    ``.codes_dynamic8_signed``), the scales ``.absmax``. A checkpoint restored by key
    (Orbax) into a state of another code therefore fails, naming both, rather than
    reading one code's bytes as another's.

    Attributes:
      codes: ``(blocks, block_size)`` uint8 code indices of the flattened, zero-padded
        array; ``(blocks, block_size // 2)`` for 4-bit codes (two per byte, the first in
        the high nibble); float8_e4m3fn values for ``"fp8"``.
      absmax: float32 scales: ``(blocks,)``, each block's largest absolute value; for a
        ``"rank1"`` code, ``(sum(shape),)``: the maxima of ``|x|`` over every index of the
        first axis (each over the other axes), then of the second axis, ...
      shape: the array's shape (static: not a leaf).
      dtype: the array's dtype (static).
      code: the code's name, a key of ``CODES`` (static).

    >>> import jax, jax.numpy as jnp
    >>> q = quantize_blockwise(jnp.arange(300.0), 'dynamic8_unsigned', 256)
    >>> q.codes.shape, q.absmax.shape, q.shape
    ((2, 256), (2,), (300,))
    >>> [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(q)[0]]
    ['.codes_dynamic8_unsigned', '.absmax']
    """

    codes: Array
    absmax: Array
    shape: tuple
    dtype: Any
    code: str


jax.tree_util.register_pytree_with_keys(
    QuantizedArray,
    lambda q: (((jax.tree_util.GetAttrKey(f"codes_{q.code}"), q.codes),
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


# Two 4-bit codes per byte, the first in the high nibble: paired by a bitcast on CPU and GPU,
# by strided slices on TPU (functrain.code_arithmetic).

def _pack_nibbles(index: Array) -> Array:
    return _by_platform([index], code_arithmetic.pack_by_bitcast,
                        code_arithmetic.pack_by_slices)


def _unpack_nibbles(codes: Array) -> Array:
    return _by_platform([codes], code_arithmetic.unpack_by_bitcast,
                        code_arithmetic.unpack_by_slices)


def rank1_scale(maxima: Sequence[Array], shape: tuple) -> Array:
    """Li et al.'s rank-1 scale: at each index, the smallest of its axes' maxima.

    ``scale[i, j, ...] = min(maxima[0][i], maxima[1][j], ...)``: for a matrix, the smaller
    of its row's and its column's largest ``|x|``, so that ``|x| <= scale`` everywhere.

    Args:
      maxima: one vector per axis of ``shape``, ``maxima[a]`` of length ``shape[a]``.
      shape: the array's shape (2 or more dimensions).

    Returns:
      A float32 array of ``shape``.

    >>> import jax.numpy as jnp
    >>> rank1_scale([jnp.array([1.0, 4.0]), jnp.array([2.0, 3.0, 4.0])], (2, 3))
    Array([[1., 1., 1.],
           [2., 3., 4.]], dtype=float32)
    """
    ndim = len(shape)
    views = [jnp.reshape(m, [-1 if a == d else 1 for a in range(ndim)])
             for d, m in enumerate(maxima)]
    return functools.reduce(jnp.minimum, views)


def _split_maxima(absmax: Array, shape: tuple) -> list:
    """A rank-1 code's ``absmax`` (the axes' maxima, concatenated) as one vector per axis."""
    return jnp.split(absmax, np.cumsum(shape)[:-1].tolist())


def quantize_blockwise(x: Array, code: str, block_size: int) -> QuantizedArray:
    """``x`` quantized: each value to the nearest code value of ``x / scale``.

    The scale is the largest ``|x|`` of the value's block (``x`` flattened and zero-padded
    to whole blocks), or for a ``"rank1"`` code (Li et al., 2023) the smallest of the
    maxima of ``|x|`` along its row, its column, ... (:func:`rank1_scale`; ``x`` must
    have 2 or more dimensions); the codes are stored in blocks either way. The original
    shape and dtype are kept in the result. Nearest is by a search of the midpoints of
    the sorted code (``nearest_code_index``; a tie goes to the lower value); ``"fp8"``
    casts ``448 x / absmax`` to float8_e4m3fn (``to_e4m3fn``) (round to nearest even).
    A block of zeros gets ``absmax = 0``.

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
    >>> q = quantize_blockwise(jnp.array([[1.0, 0.01], [0.02, 8.0]]),
    ...                        'linear4_unsigned_rank1', 4)
    >>> q.absmax                      # the rows' maxima, then the columns'
    Array([1., 8., 1., 8.], dtype=float32)
    >>> dequantize_blockwise(q)       # 0.01 and 0.02 to 1/16 of 1, not of 8
    Array([[1.    , 0.0625],
           [0.0625, 8.    ]], dtype=float32)
    """
    table, bits, scaling, rounding = CODES[code]
    if scaling == "rank1":
        if np.ndim(x) < 2:
            raise ValueError(f"quantize_blockwise: code {code!r} scales by the maxima along "
                             f"each axis and needs 2 or more dimensions, got shape "
                             f"{np.shape(x)}.")
        magnitude = jnp.abs(x.astype(jnp.float32))
        maxima = [jnp.max(magnitude, axis=tuple(a for a in range(x.ndim) if a != d))
                  for d in range(x.ndim)]
        absmax = jnp.concatenate(maxima)
        scale = rank1_scale(maxima, np.shape(x))
        scaled = _blocks(magnitude / jnp.where(scale > 0, scale, 1.0), block_size)
    else:
        blocks = _blocks(x, block_size)
        absmax = jnp.max(jnp.abs(blocks), axis=1)
        scaled = blocks / jnp.where(absmax > 0, absmax, 1.0)[:, None]
    if table is None:
        codes = to_e4m3fn(scaled * FP8_MAX)
    else:
        if rounding == "stochastic":  # block scales only (no stochastic rank-1 code)
            index = stochastic_code_index(scaled, code, dither(scaled, absmax))
        else:
            index = nearest_code_index(scaled, code)
        codes = _pack_nibbles(index) if bits == 4 else index
    return QuantizedArray(codes, absmax, tuple(np.shape(x)), jnp.dtype(x.dtype), code)


def _values_by_table(table: np.ndarray, bits: int, after: Optional[Array], index: Array,
                     absmax: Array) -> tuple:
    """A code's values by lookup (CPU and GPU); ``after`` picks a table copy."""
    if after is not None:  # the table twice; ``after`` picks the copy
        table = np.concatenate([table, table])
        index = index.astype(jnp.int32) + jnp.where(after, 0, 2 ** bits)
    # an index into the table: always in bounds (see nearest_code_index)
    return jnp.asarray(table).at[index].get(mode="promise_in_bounds"), absmax


def _values_by_arithmetic(code: str, after: Optional[Array], index: Array,
                          absmax: Array) -> tuple:
    """A dynamic code's values computed, bit for bit the table's (TPU: no gather,
    ``functrain.code_arithmetic``); ``after`` picks the scale or its absolute value."""
    if after is not None:
        absmax = jnp.where(after, absmax, jnp.abs(absmax))
    c = CODES[code]
    return code_arithmetic.decode(index, c.values[0] < 0, c.bits), absmax


def dequantize_blockwise(q: QuantizedArray, after: Optional[Array] = None) -> Array:
    """The array a :class:`QuantizedArray` stands for: ``code[index] * scale``.

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
    table, bits, scaling, _ = CODES[q.code]
    size = int(np.prod(q.shape, dtype=np.int64))
    if table is None:
        # the scale, or its absolute value (the same: a maximum of absolute values)
        absmax = q.absmax if after is None else jnp.where(after, q.absmax, jnp.abs(q.absmax))
        blocks = q.codes.astype(jnp.float32) * (absmax / FP8_MAX)[:, None]
        return blocks.reshape(-1)[:size].reshape(q.shape).astype(q.dtype)
    index = q.codes
    if bits == 4:
        index = _unpack_nibbles(index)
    absmax = q.absmax
    if q.code in _LINEAR_BITS:  # (i + 1) / 2**bits, exact: no table
        values = (index.astype(jnp.float32) + 1.0) * np.float32(2.0 ** -bits)
        if after is not None:  # the scale or its absolute value (the same), as for fp8
            absmax = jnp.where(after, absmax, jnp.abs(absmax))
    else:
        values, absmax = _by_platform(
            [index, absmax], functools.partial(_values_by_table, table, bits, after),
            functools.partial(_values_by_arithmetic, q.code, after))
    if scaling == "rank1":
        values = values.reshape(-1)[:size].reshape(q.shape)
        return (values * rank1_scale(_split_maxima(absmax, q.shape), q.shape)).astype(q.dtype)
    blocks = values * absmax[:, None]
    return blocks.reshape(-1)[:size].reshape(q.shape).astype(q.dtype)


def scales_shape(code: str, shape: tuple, blocks: int) -> tuple:
    """The shape of the ``absmax`` of a :class:`QuantizedArray` of ``code`` and ``shape``.

    Args:
      code: a key of ``CODES``.
      shape: the array's shape.
      blocks: its number of blocks.

    Returns:
      ``(blocks,)``, or ``(sum(shape),)`` for a ``"rank1"`` code.

    >>> scales_shape('linear4_unsigned_rank1', (64, 32), 16), scales_shape('fp8', (9,), 1)
    ((96,), (1,))
    """
    return (int(sum(shape)),) if CODES[code].scaling == "rank1" else (blocks,)


def block_size_of(q: QuantizedArray) -> int:
    """Values per block of ``q`` (two codes per byte for 4-bit codes).

    Args:
      q: a quantized array.

    Returns:
      The block size.
    """
    return q.codes.shape[1] * (2 if CODES[q.code].bits == 4 else 1)
