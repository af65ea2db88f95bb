"""Low-bit optimizer state: 8-bit, 4-bit and fp8 block-wise moments for any optimizer.

:func:`quantized_state` wraps an optimizer and stores its large params-shaped floating
state fields block-wise quantized: each block of ``block_size`` values keeps one float32
``absmax`` and one small code per value. Inside ``update`` the state is dequantized to its
own dtype, the optimizer runs unchanged, and the new state is quantized again.

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

Which fields are non-negative is declared in ``FIELD_CODES`` per state class, never
guessed from values.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from functrain import tree as ft
from functrain.arg_checks import (check_range, check_transformation, hyperparameters,
                                  state_mismatch_error)
from functrain.optimizers.adam_family import adam, adamw
from functrain.transforms.base import (GradientTransformationExtraArgs, MaskOrFn, OptState,
                                       Params, ScalarOrSchedule, Updates, call_update)
from functrain.transforms.engine import fusion_plan, run_plan

Array = jax.Array
PyTree = Any

FP8_MAX = 448.0  # the largest finite float8_e4m3fn
DEFAULT_BLOCK = {8: 256, 4: 128, "fp8": 256}

#: For each known state class (by name), the code of each field: ``"signed"`` (values of
#: either sign), ``"unsigned"`` (never negative: second moments) or ``"keep"`` (not
#: quantized). Unlisted fields of a listed class are kept. Fields of a class *not* listed
#: use the signed code: it represents every value (a non-negative field loses one bit of
#: resolution), where an error would refuse every optimizer not in this table.
FIELD_CODES: dict[str, dict[str, str]] = {
    "ScaleByAdamState": {"mu": "signed", "nu": "unsigned"},
    "ScaleByAmsgradState": {"mu": "signed", "nu": "unsigned", "nu_max": "unsigned"},
    "ScaleByBeliefState": {"mu": "signed", "nu": "unsigned"},
    "ScaleByLapropState": {"mu": "signed", "nu": "unsigned"},
    "ScaleByAdemamixState": {"m1": "signed", "m2": "signed", "nu": "unsigned"},
    "ScaleBySimplifiedAdEMAMixState": {"m": "signed", "n": "unsigned"},
    "ScaleByAdanState": {"m": "signed", "v": "signed", "n": "unsigned", "g": "signed"},
    "ScaleByLionState": {"mu": "signed"},
    "MuonState": {"mu": "signed"},
    "TraceState": {"trace": "signed"},
    "EmaState": {"ema": "signed"},
    "ScaleByRmsState": {"nu": "unsigned"},
    "ScaleByRmsWithCountState": {"nu": "unsigned"},
    "ScaleByRStdDevState": {"mu": "signed", "nu": "unsigned"},
    "ScaleByRStdDevWithCountState": {"mu": "signed", "nu": "unsigned"},
    "ScaleByRssState": {"sum_of_squares": "unsigned"},
    "ScaleByAdaDeltaState": {"e_g": "unsigned", "e_x": "unsigned"},
    "MultiStepsState": {},  # accumulated gradients stay exact; the inner state is walked
}


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


def _bucket_of(v: float) -> int:
    bits = np.array([v], np.float32).view(np.int32).astype(np.int64)
    return int(_order_key(bits, np)[0] >> _SHIFT)


_TOP, _BOTTOM = _bucket_of(1.0), _bucket_of(2.0 ** -_TINY)  # positive buckets used
_HALF = _TOP - _BOTTOM + 1                                    # buckets per sign


def _bucket_index(bucket: Any, xp: Any = jnp) -> Any:
    """A bucket (of a value in [-1, 1]) to its table row: negatives first, tiny ones shared."""
    bucket = xp.clip(bucket, -1 - _TOP, _TOP)
    return xp.where(bucket >= 0, xp.maximum(bucket, _BOTTOM) - _BOTTOM + _HALF,
                    xp.minimum(bucket, -1 - _BOTTOM) + 1 + _TOP)


def _bucket_table(table: np.ndarray) -> np.ndarray:
    midpoints = ((table[1:] + table[:-1]) / 2).astype(np.float32)
    keys = _order_key(midpoints.view(np.int32).astype(np.int64), np)
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
    entry = jnp.asarray(_BUCKETS[code]).at[_bucket_index(key >> _SHIFT)].get(
        mode="promise_in_bounds")
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
    absmax = q.absmax if after is None else jnp.where(after, q.absmax, jnp.abs(q.absmax))
    if table is None:
        blocks = q.codes.astype(jnp.float32) * (absmax / FP8_MAX)[:, None]
    else:
        index = q.codes
        if bits == 4:
            index = _unpack_nibbles(index)
        if after is not None:  # the table twice; ``after`` picks the copy
            table = np.concatenate([table, table])
            index = index.astype(jnp.int32) + jnp.where(after, 0, 2 ** bits)
        # an index into the table: always in bounds (see nearest_code_index)
        blocks = jnp.asarray(table).at[index].get(mode="promise_in_bounds") * absmax[:, None]
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


def _quantize(x: Array, code: str, block_size: int, like: Optional[QuantizedArray]) -> Any:
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
    return jax.sharding.auto_axes(lambda v: quantize_blockwise(v, code, block_size),
                                  out_sharding=out)(x)


def _dequantize(q: QuantizedArray, after: Optional[Array] = None) -> Array:
    sharding = _explicit(q.codes)
    if sharding is None:
        return dequantize_blockwise(q, after)
    spec = _aligned(sharding, q.shape, q.codes.shape[0], _block_size(q))
    return jax.sharding.auto_axes(dequantize_blockwise,
                                  out_sharding=NamedSharding(sharding.mesh, spec))(q, after)


# --------------------------------------------------------------------------
# The wrapper
# --------------------------------------------------------------------------

def _is_named_tuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields") and not isinstance(x, QuantizedArray)


def field_codes(state: PyTree, default: str = "signed") -> PyTree:
    """A tree like ``state`` whose leaves say how each is quantized, from ``FIELD_CODES``.

    Args:
      state: an optimizer state.
      default: the code kind of leaves outside any listed state class.

    Returns:
      The same structure with ``"signed"``, ``"unsigned"`` or ``"keep"`` as leaves.

    >>> import jax.numpy as jnp, functrain
    >>> field_codes(functrain.adam(1e-3).init(jnp.ones(2)))
    (ScaleByAdamState(count='keep', mu='signed', nu='unsigned'), EmptyState())
    """
    if _is_named_tuple(state):
        table = FIELD_CODES.get(type(state).__name__)
        kinds = [default if table is None else table.get(f, "keep") for f in state._fields]
        return type(state)(*(field_codes(v, "signed" if k == "keep" else k)
                             if _is_named_tuple(v) else _leaf_kinds(v, k)
                             for v, k in zip(state, kinds)))
    return _leaf_kinds(state, default)


def _leaf_kinds(node: PyTree, kind: str) -> PyTree:
    return jax.tree_util.tree_map(
        lambda x: field_codes(x) if _is_named_tuple(x) else kind, node, is_leaf=_is_named_tuple)


def _check_bits(bits: Any, block_size: Optional[int]) -> int:
    if bits not in (8, 4, "fp8") or isinstance(bits, bool):
        raise ValueError(f"quantized_state: bits must be 8, 4 or 'fp8', got {bits!r}.")
    if block_size is None:
        return DEFAULT_BLOCK[bits]
    if not isinstance(block_size, (int, np.integer)) or isinstance(block_size, bool):
        raise TypeError(f"quantized_state: block_size must be an int, got {block_size!r}.")
    check_range("block_size", block_size, 2 if bits == 4 else 1, owner="quantized_state")
    if bits == 4 and block_size % 2:
        raise ValueError(f"quantized_state: block_size must be even for bits=4 (two codes "
                         f"per byte), got {block_size}.")
    return int(block_size)


@hyperparameters(min_size="number")
def quantized_state(optimizer: Any, *, bits: Union[int, str] = 8,
                    block_size: Optional[int] = None, min_size: int = 4096
                    ) -> GradientTransformationExtraArgs:
    """``optimizer`` with its params-shaped floating state stored in 8, 4 or fp8 bits.

    Every floating state leaf with the shape of a parameter and at least ``min_size``
    elements is kept as a :class:`QuantizedArray` (signed or unsigned code per
    ``FIELD_CODES``); counts, scalars, other shapes, complex and small leaves stay as
    they are.
    ``update`` dequantizes to each leaf's dtype, calls ``optimizer.update``, and quantizes
    the new state with the same codes. References: Dettmers et al., 2021, "8-bit
    Optimizers via Block-wise Quantization"; Li et al., 2023, "Memory Efficient
    Optimizers with 4-bit States".

    Args:
      optimizer: any transformation (functrain's, optax's, user-written).
      bits: ``8`` (dynamic code, blocks of 256), ``4`` (blocks of 128, two codes per
        byte) or ``"fp8"`` (float8_e4m3fn, blocks of 256).
      block_size: values per block; ``None`` for the defaults above.
      min_size: leaves with fewer elements are not quantized.

    Returns:
      A ``GradientTransformationExtraArgs`` with ``optimizer``'s state structure, the
      quantized leaves replaced by :class:`QuantizedArray`.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.quantized_state(functrain.adamw(1e-3), bits=8, min_size=16)
    >>> params = {'w': jnp.ones((8, 8))}
    >>> state = opt.init(params)
    >>> state[0].nu['w'].code, state[0].nu['w'].codes.dtype
    ('dynamic8_unsigned', dtype('uint8'))
    >>> updates, state = opt.update({'w': jnp.ones((8, 8))}, state, params)
    >>> updates['w'][0, :2]
    Array([-0.001, -0.001], dtype=float32)
    """
    check_transformation(optimizer, "quantized_state", "optimizer")
    size = _check_bits(bits, block_size)
    check_range("min_size", min_size, 0.0, owner="quantized_state")

    def quantize(x: Any, kind: str, shapes: set) -> Any:
        if (kind == "keep" or not hasattr(x, "dtype") or np.ndim(x) == 0
                or not jnp.issubdtype(x.dtype, jnp.floating) or np.size(x) < min_size
                or tuple(np.shape(x)) not in shapes):
            return x
        return _quantize(x, CODE_FOR[bits, kind], size, None)

    def init_fn(params: Params) -> OptState:
        state = optimizer.init(params)
        shapes = {tuple(np.shape(p)) for p in jax.tree_util.tree_leaves(params)}
        return ft.distinct_buffers(jax.tree_util.tree_map(
            lambda kind, x: quantize(x, kind, shapes), field_codes(state), state))

    plan = fusion_plan(optimizer)

    def update_fn(updates: Updates, state: OptState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, OptState]:
        paths_leaves = jax.tree_util.tree_flatten_with_path(state, is_leaf=_is_quantized)[0]
        for path, leaf in paths_leaves:
            if _is_quantized(leaf):
                _check_quantized(leaf, path)
        return run_plan(plan, updates, state, params, extra_args, _CODEC)

    return GradientTransformationExtraArgs(init_fn, update_fn)


def _is_quantized(x: Any) -> bool:
    return isinstance(x, QuantizedArray)


class _Codec:
    """How the engine reads and writes quantized state (see ``engine.run_block``).

    Stages (adam's, lion's, ...) get each leaf's state decoded and re-encoded inside
    the engine's per-leaf pass; any other transformation (optax's, a wrapper) gets its
    whole state decoded before its ``update`` and encoded after it.
    """

    is_coded = staticmethod(_is_quantized)

    @staticmethod
    def decode(x: Any, written: Sequence[Any] = ()) -> Any:
        """``x`` dequantized; after the quantized arrays in ``written`` exist, if any."""
        if not _is_quantized(x):
            return x
        # Always true (a maximum of absolute values is not negative), unknown to XLA:
        # a data dependency that orders the decodes leaf after leaf.
        marks = [w.absmax[0] >= -1.0 for w in written if _is_quantized(w) and w.absmax.size]
        return _dequantize(x, functools.reduce(jnp.logical_and, marks) if marks else None)

    @staticmethod
    def encode(new: Any, old: Any, where: str = "") -> Any:
        if not _is_quantized(old):
            return new
        if tuple(np.shape(new)) != old.shape:
            raise state_mismatch_error("quantized_state", f"state leaf {where} came back with "
                                       f"shape {np.shape(new)}, not {old.shape}")
        return _quantize(new, old.code, _block_size(old), old)

    @staticmethod
    def update_opaque(tx: Any, updates: Updates, state: OptState, params: Optional[Params],
                      extra_args: dict) -> tuple[Updates, OptState]:
        paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(state,
                                                                     is_leaf=_is_quantized)
        inner = treedef.unflatten([_Codec.decode(x) for _, x in paths_leaves])
        new_updates, new_inner = call_update(tx, updates, inner, params, extra_args)
        new_leaves, new_def = jax.tree_util.tree_flatten(new_inner)
        if new_def != jax.tree_util.tree_structure(inner):
            raise state_mismatch_error("quantized_state", "the optimizer's update returned a "
                                       "state of another structure than it was given")
        return new_updates, treedef.unflatten([
            _Codec.encode(new, old, jax.tree_util.keystr(path))
            for (path, old), new in zip(paths_leaves, new_leaves)])


_CODEC = _Codec()


def _block_size(q: QuantizedArray) -> int:
    return q.codes.shape[1] * (2 if CODES[q.code][1] == 4 else 1)


def _check_quantized(q: QuantizedArray, path: tuple) -> None:
    where = jax.tree_util.keystr(path)
    if q.code not in CODES or np.ndim(q.codes) != 2 or np.shape(q.absmax) != q.codes.shape[:1]:
        raise state_mismatch_error("quantized_state", f"state leaf {where} is not a "
                                   f"quantized array (code {q.code!r}, codes "
                                   f"{np.shape(q.codes)}, absmax {np.shape(q.absmax)})")
    want = jnp.float8_e4m3fn if q.code == "fp8" else jnp.uint8
    blocks = -(-int(np.prod(q.shape, dtype=np.int64)) // _block_size(q))
    if q.codes.dtype != want or q.codes.shape[0] != blocks:
        raise state_mismatch_error("quantized_state", f"state leaf {where} has codes "
                                   f"{q.codes.dtype}{list(q.codes.shape)}, expected {want.__name__}"
                                   f" with {blocks} blocks for shape {q.shape}")


# --------------------------------------------------------------------------
# Presets with the names users know
# --------------------------------------------------------------------------

def adam_8bit(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
              eps: float = 1e-8, eps_root: float = 0.0, *, nesterov: bool = False,
              block_size: Optional[int] = None, min_size: int = 4096
              ) -> GradientTransformationExtraArgs:
    """Adam (Kingma & Ba, 2014) with 8-bit block-wise state (Dettmers et al., 2021).

    ``quantized_state(adam(...), bits=8)``: about 2 bytes of state per parameter
    instead of 8.

    Args:
      learning_rate: a number or a schedule.
      b1: the first moment's decay.
      b2: the second moment's decay.
      eps: added to the root of the second moment.
      eps_root: added inside the root.
      nesterov: NAdam's Nesterov momentum.
      block_size: values per block (``None``: 256).
      min_size: smaller state leaves stay float32.

    Returns:
      The optimizer, a ``GradientTransformationExtraArgs``.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adam_8bit(1e-3, min_size=4)
    >>> opt.init({'w': jnp.ones(4)})[0].mu['w'].codes.dtype
    dtype('uint8')
    """
    return quantized_state(adam(learning_rate, b1, b2, eps, eps_root, nesterov=nesterov),
                           bits=8, block_size=block_size, min_size=min_size)


def _adamw_bits(bits: Union[int, str], learning_rate: ScalarOrSchedule, b1: float, b2: float,
                eps: float, eps_root: float, weight_decay: ScalarOrSchedule,
                mask: Optional[MaskOrFn], nesterov: bool, block_size: Optional[int],
                min_size: int) -> GradientTransformationExtraArgs:
    return quantized_state(adamw(learning_rate, b1, b2, eps, eps_root, None, weight_decay, mask,
                                 nesterov=nesterov),
                           bits=bits, block_size=block_size, min_size=min_size)


def adamw_8bit(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
               eps: float = 1e-8, eps_root: float = 0.0, weight_decay: ScalarOrSchedule = 1e-4,
               mask: Optional[MaskOrFn] = None, *, nesterov: bool = False,
               block_size: Optional[int] = None, min_size: int = 4096
               ) -> GradientTransformationExtraArgs:
    """AdamW (Loshchilov & Hutter, 2019) with 8-bit block-wise state (Dettmers et al., 2021).

    ``quantized_state(adamw(...), bits=8)``: the dynamic code, signed for the first
    moment and unsigned for the second, blocks of 256; about 2.03 bytes of state per
    parameter instead of 8.

    Args:
      learning_rate: a number or a schedule.
      b1: the first moment's decay.
      b2: the second moment's decay.
      eps: added to the root of the second moment.
      eps_root: added inside the root.
      weight_decay: the decoupled weight decay (a number or a schedule).
      mask: which parameters are decayed (a tree of bools or a function of params).
      nesterov: NAdamW's Nesterov momentum.
      block_size: values per block (``None``: 256).
      min_size: smaller state leaves stay float32.

    Returns:
      The optimizer, a ``GradientTransformationExtraArgs``.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adamw_8bit(1e-3, min_size=4)
    >>> opt.init({'w': jnp.ones(300)})[0].nu['w'].absmax.shape
    (2,)
    """
    return _adamw_bits(8, learning_rate, b1, b2, eps, eps_root, weight_decay, mask, nesterov,
                       block_size, min_size)


def adamw_4bit(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
               eps: float = 1e-8, eps_root: float = 0.0, weight_decay: ScalarOrSchedule = 1e-4,
               mask: Optional[MaskOrFn] = None, *, nesterov: bool = False,
               block_size: Optional[int] = None, min_size: int = 4096
               ) -> GradientTransformationExtraArgs:
    """AdamW (Loshchilov & Hutter, 2019) with 4-bit block-wise state (Li et al., 2023).

    ``quantized_state(adamw(...), bits=4)``: blocks of 128, the signed 4-bit dynamic code
    for the first moment and the linear code without zero for the second, two codes per
    byte; about 1.06 bytes of state per parameter instead of 8.

    Args:
      learning_rate: a number or a schedule.
      b1: the first moment's decay.
      b2: the second moment's decay.
      eps: added to the root of the second moment.
      eps_root: added inside the root.
      weight_decay: the decoupled weight decay (a number or a schedule).
      mask: which parameters are decayed (a tree of bools or a function of params).
      nesterov: NAdamW's Nesterov momentum.
      block_size: values per block (``None``: 128; even).
      min_size: smaller state leaves stay float32.

    Returns:
      The optimizer, a ``GradientTransformationExtraArgs``.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adamw_4bit(1e-3, min_size=4)
    >>> opt.init({'w': jnp.ones(256)})[0].mu['w'].codes.shape
    (2, 64)
    """
    return _adamw_bits(4, learning_rate, b1, b2, eps, eps_root, weight_decay, mask, nesterov,
                       block_size, min_size)


def adamw_fp8(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
              eps: float = 1e-8, eps_root: float = 0.0, weight_decay: ScalarOrSchedule = 1e-4,
              mask: Optional[MaskOrFn] = None, *, nesterov: bool = False,
              block_size: Optional[int] = None, min_size: int = 4096
              ) -> GradientTransformationExtraArgs:
    """AdamW (Loshchilov & Hutter, 2019) with float8_e4m3fn block-wise state.

    ``quantized_state(adamw(...), bits="fp8")``: each block of 256 stores
    ``448 x / absmax`` as float8_e4m3fn and one float32 ``absmax``.

    Args:
      learning_rate: a number or a schedule.
      b1: the first moment's decay.
      b2: the second moment's decay.
      eps: added to the root of the second moment.
      eps_root: added inside the root.
      weight_decay: the decoupled weight decay (a number or a schedule).
      mask: which parameters are decayed (a tree of bools or a function of params).
      nesterov: NAdamW's Nesterov momentum.
      block_size: values per block (``None``: 256).
      min_size: smaller state leaves stay float32.

    Returns:
      The optimizer, a ``GradientTransformationExtraArgs``.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adamw_fp8(1e-3, min_size=4)
    >>> opt.init({'w': jnp.ones(4)})[0].mu['w'].codes.dtype
    dtype(float8_e4m3fn)
    """
    return _adamw_bits("fp8", learning_rate, b1, b2, eps, eps_root, weight_decay, mask,
                       nesterov, block_size, min_size)
