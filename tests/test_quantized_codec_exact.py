"""The fast codec paths give exactly the codes and values of the codes' definitions.

``nearest_code_index`` finds the nearest code value by arithmetic (the linear codes) or by
one lookup in a table of buckets whose width each code chooses (the dynamic codes);
``dequantize_blockwise`` decodes the linear codes by arithmetic. The reference here is the
definition, in numpy: ``np.searchsorted(midpoints, x, side="left")`` on the float32
midpoints ``(code[1:] + code[:-1]) / 2`` (a tie goes to the lower value), and
``code[index] * scale`` in float32. They are compared bit for bit on every float32 within
4096 ulps of every midpoint, on a sweep over all float32 bit patterns in ``[-1, 1]``, on
zeros, subnormals, values outside ``[-1, 1]``, infinities and NaN, and on every index of
every code.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from functrain.quantization import (CODES, QuantizedArray, dequantize_blockwise,
                                    nearest_code_index, quantize_blockwise)

TABLE_CODES = sorted(name for name, c in CODES.items() if c.values is not None)
_NEAREST = jax.jit(nearest_code_index, static_argnums=1)


def midpoints(name: str) -> np.ndarray:
    code = CODES[name].values
    return ((code[1:] + code[:-1]) / 2).astype(np.float32)


def reference_index(x: np.ndarray, name: str) -> np.ndarray:
    """searchsorted on the midpoints; NaN by its sign (above all midpoints if positive)."""
    x = np.asarray(x, np.float32)
    index = np.searchsorted(midpoints(name), x, side="left")
    negative = np.signbit(x)
    return np.where(np.isnan(x), np.where(negative, 0, len(CODES[name].values) - 1),
                    index).astype(np.uint8)


def near_every_midpoint(name: str, ulps: int = 4096) -> np.ndarray:
    """Every float32 within ``ulps`` of each midpoint (bit patterns are monotone per sign)."""
    bits = midpoints(name).view(np.int32).astype(np.int64)
    steps = np.arange(-ulps, ulps + 1)
    # a positive float's bit pattern grows with it, a negative one's with its magnitude
    patterns = bits[:, None] + steps[None, :]
    return patterns.astype(np.int32).ravel().view(np.float32)


def sweep_of_all_floats(stride: int = 4099) -> np.ndarray:
    """One float32 in ``stride`` of all those in ``[-1, 1]`` (both signs), ``+-0`` included."""
    positive = np.arange(0, 0x3F800001, stride, dtype=np.int64)
    positive = np.concatenate([positive, [0x3F800000]]).astype(np.int32)
    negative = positive | np.int32(-2 ** 31)
    return np.concatenate([positive, negative]).view(np.float32)


SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 1e30, -1e30, np.inf, -np.inf,
                    1e-45, -1e-45, 2.0 ** -126, -2.0 ** -126, 2.0 ** -24, -2.0 ** -24,
                    np.nextafter(np.float32(1), np.float32(2)),
                    np.nextafter(np.float32(-1), np.float32(-2))], np.float32)


@pytest.mark.parametrize("name", TABLE_CODES)
def test_nearest_index_is_searchsorted_near_every_midpoint(name):
    x = near_every_midpoint(name)
    got = np.asarray(_NEAREST(jnp.asarray(x), name))
    want = reference_index(x, name)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (name, x[bad[:5]], got[bad[:5]], want[bad[:5]])


@pytest.mark.parametrize("name", TABLE_CODES)
def test_nearest_index_is_searchsorted_on_all_floats_in_range_and_beyond(name):
    rng = np.random.default_rng(0)
    x = np.concatenate([sweep_of_all_floats(), SPECIAL, CODES[name].values,
                        -CODES[name].values, rng.uniform(-1, 1, 100_000).astype(np.float32),
                        (10.0 ** rng.uniform(-45, 0, 100_000)).astype(np.float32)])
    got = np.asarray(_NEAREST(jnp.asarray(x), name))
    want = reference_index(x, name)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (name, x[bad[:5]], got[bad[:5]], want[bad[:5]])


@pytest.mark.parametrize("name", TABLE_CODES)
def test_nan_goes_where_its_sign_says(name):
    nans = np.array([0x7FC00000, 0x7F800001, -0x00400000, -0x007FFFFF], np.int64)
    x = nans.astype(np.int32).view(np.float32)
    top = len(CODES[name].values) - 1
    np.testing.assert_array_equal(np.asarray(_NEAREST(jnp.asarray(x), name)),
                                  [top, top, 0, 0])


@pytest.mark.parametrize("name", TABLE_CODES)
@pytest.mark.parametrize("after", [None, True, False])
def test_every_index_decodes_to_its_code_value_times_the_scale(name, after):
    code, bits, scaling, _ = CODES[name]
    n = len(code)
    index = np.tile(np.arange(n, dtype=np.uint8), 4)              # every index, 4 blocks
    scales = np.array([1.0, 0.37, 3e-5, 0.0], np.float32)
    shape = (4, n)
    if scaling == "rank1":
        rows, cols = np.array([0.5, 2.0, 1e-3, 7.0], np.float32), np.full(n, 3.0, np.float32)
        absmax, scale = np.concatenate([rows, cols]), np.minimum(rows[:, None], cols[None, :])
    else:
        absmax, scale = scales, np.repeat(scales[:, None], n, axis=1)
    blocks = index.reshape(4, n)
    codes = (blocks[:, 0::2] << 4) | blocks[:, 1::2] if bits == 4 else blocks
    q = QuantizedArray(jnp.asarray(codes), jnp.asarray(absmax), shape, jnp.dtype(jnp.float32),
                       name)
    mark = None if after is None else jnp.asarray(after)
    got = np.asarray(jax.jit(dequantize_blockwise)(q, mark))
    want = code[blocks] * scale                                        # float32 products
    np.testing.assert_array_equal(got.view(np.int32), want.astype(np.float32).view(np.int32))


@pytest.mark.parametrize("name,block", [("linear4_unsigned", 128),
                                        ("linear4_unsigned_rank1", 128),
                                        ("dynamic8_signed", 256), ("dynamic8_unsigned", 256),
                                        ("dynamic4_signed", 128)])
def test_quantize_stores_the_reference_codes(name, block):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 96)) * 10.0 ** rng.uniform(-6, 0, (64, 96))).astype(np.float32)
    if "unsigned" in name:
        x = np.abs(x)
    q = jax.jit(quantize_blockwise, static_argnums=(1, 2))(jnp.asarray(x), name, block)
    if CODES[name].scaling == "rank1":
        scale = np.minimum(np.abs(x).max(1)[:, None], np.abs(x).max(0)[None, :])
        scaled = (np.abs(x) / np.where(scale > 0, scale, 1)).reshape(-1, block)
    else:
        blocks = x.reshape(-1, block)
        absmax = np.abs(blocks).max(1)
        scaled = blocks / np.where(absmax > 0, absmax, 1)[:, None]
    index = reference_index(scaled.astype(np.float32), name)
    codes = (index[:, 0::2] << 4) | index[:, 1::2] if CODES[name].bits == 4 else index
    np.testing.assert_array_equal(np.asarray(q.codes), codes)


# --------------------------------------------------------------------------
# The accelerators' decode: the dynamic codes' values by arithmetic, no table
# --------------------------------------------------------------------------

DYNAMIC = [(name, CODES[name].values[0] < 0, CODES[name].bits) for name in TABLE_CODES
           if name.startswith("dynamic")]


@pytest.mark.parametrize("name, signed, bits", DYNAMIC)
def test_arithmetic_decode_is_the_table_bit_for_bit(name, signed, bits):
    from functrain.code_arithmetic import decode
    index = jnp.arange(2 ** bits)
    table = CODES[name].values.view(np.int32)
    for run in (decode, jax.jit(decode, static_argnums=(1, 2))):
        got = np.asarray(run(index, signed, bits)).view(np.int32)
        np.testing.assert_array_equal(got, table, err_msg=name)


@pytest.mark.parametrize("name, signed, bits", DYNAMIC)
def test_each_value_is_far_from_a_float32_rounding_boundary(name, signed, bits):
    # The small terms of the unevaluated sum are rounded (differently where a compiler fuses
    # a multiply-add); that cannot change the result while the value's float64 definition
    # (the paper's formula, written here from its decades and bins) lies well away from the
    # midpoint between two float32 numbers.
    after_sign = bits - 1 if signed else bits
    defined = []
    for e in range(bits - 1):
        count = 2 ** (after_sign - 1 - e)
        defined += [10.0 ** -e * (0.1 + 0.9 * (j + 0.5) / count) for j in range(count)]
    defined = np.sort(np.asarray(defined))
    as_float32 = defined.astype(np.float32)
    np.testing.assert_array_equal(np.sort(CODES[name].values[(CODES[name].values > 0)
                                                            & (CODES[name].values < 1)]),
                                  as_float32)
    ulp = np.spacing(as_float32).astype(np.float64)
    offset = (defined - as_float32.astype(np.float64)) / ulp    # in (-0.5, 0.5)
    assert np.min(0.5 - np.abs(offset)) > 1e-3, name


@pytest.mark.parametrize("name", [n for n, _, _ in DYNAMIC])
def test_accelerators_code_by_arithmetic_and_cpu_by_table(name):
    # lax.platform_dependent picks at lowering: the CPU program looks up (gathers); the
    # branches for other platforms, encode and decode, hold no gather.
    from functrain.code_arithmetic import decode, nearest
    c = CODES[name]
    signed = bool(c.values[0] < 0)
    x = jnp.linspace(-1, 1, 512)
    cpu = jax.jit(lambda v: dequantize_blockwise(quantize_blockwise(v, name, 256))).lower(
        x).compile().as_text()
    assert "gather" in cpu
    other = jax.jit(lambda v: decode(nearest(v, signed, c.bits, c.values), signed,
                                     c.bits)).lower(x)
    assert "gather" not in other.as_text()


@pytest.mark.parametrize("after", [None, True])
@pytest.mark.parametrize("name", [n for n, _, _ in DYNAMIC])
def test_arithmetic_branch_decodes_as_the_cpu_branch(name, after):
    from functrain.quantization import _values_by_arithmetic, _values_by_table
    c = CODES[name]
    index = jnp.arange(2 ** c.bits, dtype=jnp.uint8).reshape(-1, 2 ** (c.bits - 2))
    absmax = jnp.linspace(0.5, 3.0, index.shape[0], dtype=jnp.float32)
    mark = None if after is None else jnp.asarray(after)
    by_table = _values_by_table(c.values, c.bits, mark, index, absmax)
    by_arithmetic = _values_by_arithmetic(name, mark, index, absmax)
    for x, y in zip(by_table, by_arithmetic):
        np.testing.assert_array_equal(np.asarray(x).view(np.int32), np.asarray(y).view(np.int32))


def _nearest_by_arithmetic(name):
    from functrain.code_arithmetic import nearest
    signed, bits = bool(CODES[name].values[0] < 0), CODES[name].bits
    return jax.jit(lambda x: nearest(x, signed, bits, CODES[name].values))


@pytest.mark.parametrize("name", [n for n, _, _ in DYNAMIC])
def test_arithmetic_nearest_index_is_searchsorted(name):
    # the accelerators' encode, on the same inputs as the table's: every float32 within 4096
    # ulps of every midpoint, a sweep of all float32 bit patterns in [-1, 1], special values
    rng = np.random.default_rng(1)
    x = np.concatenate([near_every_midpoint(name), sweep_of_all_floats(), SPECIAL,
                        CODES[name].values, -CODES[name].values,
                        rng.uniform(-1, 1, 100_000).astype(np.float32),
                        (10.0 ** rng.uniform(-45, 0, 100_000)).astype(np.float32),
                        np.array([np.inf, -np.inf, 3.0, -3.0], np.float32)])
    got = np.asarray(_nearest_by_arithmetic(name)(jnp.asarray(x)))
    want = reference_index(x, name)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (name, x[bad[:5]], got[bad[:5]], want[bad[:5]])


@pytest.mark.parametrize("name", [n for n, _, _ in DYNAMIC])
def test_arithmetic_nearest_index_puts_nan_where_its_sign_says(name):
    nans = np.array([0x7FC00000, 0x7F800001, -0x00400000, -0x007FFFFF], np.int64)
    x = nans.astype(np.int32).view(np.float32)
    top = len(CODES[name].values) - 1
    np.testing.assert_array_equal(np.asarray(_nearest_by_arithmetic(name)(jnp.asarray(x))),
                                  [top, top, 0, 0])


def test_small_tables_picked_without_a_gather_are_the_lookups():
    from functrain.code_arithmetic import pick
    from functrain.quantization import _INVERSE_GAPS
    index = jnp.arange(16)
    for table in (CODES["dynamic4_signed_sr"].values, *_INVERSE_GAPS["dynamic4_signed_sr"]):
        np.testing.assert_array_equal(np.asarray(pick(table, index)).view(np.int32),
                                      table.view(np.int32))
    table = CODES["dynamic4_signed"].values
    assert "gather" not in jax.jit(lambda i: pick(table, i)).lower(index).as_text()


@pytest.mark.parametrize("width", [2, 16, 256])
def test_tpu_nibble_packing_stores_and_reads_the_cpu_bytes(width):
    """The TPU's pairing by strided slices against the CPU's and GPU's bitcast: the same
    byte for every pair of 4-bit indices (all 256), the first in the high nibble, and back."""
    from functrain import code_arithmetic as arith
    first, second = np.divmod(np.arange(256), 16)
    pairs = np.stack([first, second], axis=1).reshape(-1)  # every pair once, in order
    index = np.resize(pairs, (512 * 2 // width, width)).astype(np.uint8)
    expected = (index[:, 0::2] << 4) | index[:, 1::2]
    for pack in (arith.pack_by_bitcast, arith.pack_by_slices):
        packed = np.asarray(jax.jit(pack)(jnp.asarray(index)))
        assert packed.dtype == np.uint8 and np.array_equal(packed, expected), pack.__name__
    for unpack in (arith.unpack_by_bitcast, arith.unpack_by_slices):
        assert np.array_equal(np.asarray(jax.jit(unpack)(jnp.asarray(expected))), index)
