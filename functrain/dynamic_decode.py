"""The dynamic code's values from their indices by arithmetic: no table, no gather.

``dequantize_blockwise`` reads a dynamic code's values from a 256-entry (or 16-entry) table.
On CPU that lookup is the fast way. On accelerators a lookup is a gather: the TPU compiler
costs each looked-up value at kilobytes of traffic, and the GPU compiler will not repeat a
gather inside two kernels, so the decoded moments are written to memory and read back
(``make accel``, docs/performance.md). There, the value is computed instead, bit for bit the
table's:

* the index gives the value's decade ``e`` and its bin ``j`` in that decade with integer
  comparisons (the decades hold 1, 2, 4, ... values, smallest first);
* the value is ``A_e + j B_e`` (``A_e = 10**-e (0.1 + 0.45 / n_e)``, ``B_e = 10**-e 0.9 /
  n_e``, ``n_e`` values in decade ``e``), evaluated in float32 as an unevaluated sum: ``B_e``
  split into a 16-bit head (``j`` times it is exact) and a tail, ``A_e`` into a float32 head
  and tail, the head sum made exact by Knuth's two-sum, the small terms added last, one
  rounding at the end. Every product that could be fused into a multiply-add is exact or
  lies in the small terms, so a compiler that contracts gets the same bits.

``tests/test_quantized_codec_exact.py`` checks all 256 (16) indices of every dynamic code
against the table bit for bit, and that each value's float64 definition lies far enough
from a float32 rounding boundary (at least a thousandth of an ulp) that the small terms'
rounding cannot change it.
"""

from __future__ import annotations

import functools

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


def _pick(by_decade: np.ndarray, decade: Array) -> Array:
    """``by_decade[decade]`` for a small constant vector, by selects (no gather)."""
    out = jnp.full(decade.shape, by_decade[0], jnp.float32)
    for d in range(1, len(by_decade)):
        out = jnp.where(decade == d, by_decade[d], out)
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
    >>> decode(jnp.array([0, 127, 128, 255]), signed=True, bits=8)
    Array([-9.929687e-01,  0.000000e+00,  5.500000e-08,  1.000000e+00], dtype=float32)
    """
    zero, first, decades, (a_head, a_tail, b_head, b_tail) = layout(signed, bits)
    i = index.astype(jnp.int32)
    top = 2 ** bits - 1
    p = jnp.abs(i - zero) - 1                       # position among the ascending magnitudes
    shifted = p + first                             # in [2**m, 2**(m + 1)) in decade m
    m = sum((shifted >= first * 2 ** k).astype(jnp.int32) for k in range(1, decades))
    j = (shifted - first * jnp.left_shift(1, m)).astype(jnp.float32)
    s, err = _two_sum(_pick(a_head, m), j * _pick(b_head, m))   # j * head: exact
    magnitude = s + ((err + _pick(a_tail, m)) + j * _pick(b_tail, m))
    value = jnp.where(i < zero, -magnitude, magnitude)
    return jnp.where(i == zero, 0.0, jnp.where(i == top, 1.0, value)).astype(jnp.float32)
