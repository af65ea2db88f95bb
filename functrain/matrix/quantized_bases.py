"""Low-bit eigenbases: orthogonal matrices stored in 4 or 8 bits, re-orthogonalized on reading.

Wang, Zhou, Li & Huang, 2024, "4-bit Shampoo for Memory-Efficient Network Training"
(NeurIPS 2024, arXiv:2405.18144; the authors' code: github.com/Sike-Wang/low-bit-Shampoo)
store a preconditioner ``A = U diag(lambda) U^T`` as its eigenvector matrix ``U`` in 4 bits
and its eigenvalues ``lambda`` in 32 bits, rather than ``A`` itself: a block-wise code
rounds each entry of ``U`` alone, and the rounded ``U`` is close to orthogonal, which a
rounded ``A`` (or its inverse root) is not close to being positive definite. After decoding
they restore the orthogonality by Björck's iteration, ``U <- 1.5 U - 0.5 U U^T U``, and
rebuild ``A`` from the rectified ``U``. Their code quantizes ``U^T`` (one eigenvector per
row) in blocks of 64 entries that never cross rows, only matrices of 4096 or more entries,
and runs 1 Björck iteration before rebuilding a statistic and 4 before an inverse root.

Here a :class:`QuantizedBasis` is one such matrix (or a stack of them, ``(..., d, d)``):

* an *orthogonal* basis (``values`` is ``None``; SOAP's eigenbases ``Q``, declared
  ``"orthogonal"``) decodes to the rectified ``U``;
* a *symmetric* matrix (Shampoo's inverse roots, declared ``"symmetric"``) is encoded by
  ``eigh`` into ``U`` (low-bit) and ``lambda`` (float32) and decodes to
  ``U diag(lambda) U^T`` with the rectified ``U``.

:func:`functrain.quantized_state` with ``bases=True`` stores such fields this way:
:func:`decode_basis` where the optimizer reads the field, :func:`encode_like` where it
writes it, so the optimizer's code does not know. A matrix the optimizer gives back
unchanged (a basis between two refreshes) keeps its codes: re-encoding the rectified matrix
would round it again each step and let it drift.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from functrain.arg_checks import state_mismatch_error
from functrain.linalg import map_matrices
from functrain.quantization import (CODES, QuantizedArray, block_size_of, dequantize_blockwise,
                                    quantize_blockwise)

Array = jax.Array

__all__ = ["BASIS_BLOCK", "BJORCK_ITERATIONS", "QuantizedBasis", "bjorck", "quantize_basis",
           "decode_basis", "encode_like", "basis_code", "check_basis"]

#: Entries per block along each eigenvector (Wang et al.'s ``quan_blocksize``).
BASIS_BLOCK = 64
#: Björck iterations after each decode, by ``bits``: Wang et al. run 4 before computing an
#: inverse root from 4-bit eigenvectors (1 before rebuilding a statistic); the decoded basis
#: here is used as the preconditioner's, so 4 with 4 bits. 8-bit and fp8 eigenvectors reach
#: float32's orthogonality (``||U^T U - I|| ~ 4e-7``) after 2 (4 bits: 0.40, 0.10, 8.5e-3,
#: 5.4e-5, 4.2e-7 after 0..4; benchmarks/results/quantized_matrix.md).
BJORCK_ITERATIONS = {4: 4, 8: 2, "fp8": 2}
_HIGHEST = jax.lax.Precision.HIGHEST


class QuantizedBasis(NamedTuple):
    """An orthogonal or symmetric matrix (or a stack of them) stored as low-bit eigenvectors.

    A pytree whose children are ``vectors`` (the :class:`QuantizedArray`, keys
    ``.vectors.codes_<code>`` and ``.vectors.absmax``) and ``values`` (key ``.values``;
    none for an orthogonal basis), so a checkpoint of one kind restored into the other
    fails by key.

    Attributes:
      vectors: the eigenvectors as rows (``U^T``), each row zero-padded to whole blocks,
        quantized: shape ``(..., d, padded)``.
      values: ``None`` for an orthogonal basis; for a symmetric matrix its eigenvalues
        ``(..., d)`` in float32.
      shape: the matrix (stack) shape ``(..., d, d)`` (static).
      dtype: its dtype (static).
      iterations: Björck iterations after decoding (static).

    >>> import jax.numpy as jnp
    >>> q = quantize_basis(jnp.eye(64), 'dynamic4_signed', 2)
    >>> q.vectors.codes.shape, q.values is None, q.shape
    ((64, 32), True, (64, 64))
    """

    vectors: QuantizedArray
    values: Optional[Array]
    shape: tuple
    dtype: Any
    iterations: int


jax.tree_util.register_pytree_with_keys(
    QuantizedBasis,
    lambda q: (((jax.tree_util.GetAttrKey("vectors"), q.vectors),
                (jax.tree_util.GetAttrKey("values"), q.values)),
               (q.shape, q.dtype, q.iterations)),
    lambda aux, children: QuantizedBasis(*children, *aux),
    flatten_func=lambda q: ((q.vectors, q.values), (q.shape, q.dtype, q.iterations)))


def basis_code(bits: Any) -> str:
    """The code of the eigenvectors for ``bits``: the signed dynamic code, nearest rounding.

    Wang et al. found their linear-square code slightly better than the dynamic (tree) code
    for eigenvectors; functrain's codes are the dynamic ones (and fp8).

    Args:
      bits: ``8``, ``4`` or ``"fp8"``.

    Returns:
      A key of ``functrain.quantization.CODES``.

    >>> basis_code(4), basis_code(8), basis_code('fp8')
    ('dynamic4_signed', 'dynamic8_signed', 'fp8')
    """
    return "fp8" if bits == "fp8" else f"dynamic{int(bits)}_signed"


def _block(d: int, block_size: int, code: str) -> int:
    """Entries per block for rows of ``d``: ``block_size``, or the (even, for 4 bits) row."""
    even = d + d % 2 if CODES[code].bits == 4 else d
    return min(block_size, even)


def bjorck(u: Array, iterations: int) -> Array:
    """Björck's orthonormalization: ``iterations`` times ``U <- 1.5 U - 0.5 U U^T U``.

    Each iteration maps every singular value ``s`` of ``U`` to ``s (3 - s^2) / 2``: an error
    ``s = 1 + e`` becomes ``1 - 1.5 e^2 - 0.5 e^3``, so the distance to the nearest
    orthogonal matrix squares (for ``0 < s < sqrt(3)``) and singular vectors are kept.

    Args:
      u: a matrix or a stack ``(..., d, d)``.
      iterations: how many iterations (``0``: ``u`` as it is).

    Returns:
      The matrix after the iterations, in ``u``'s dtype.

    >>> import jax.numpy as jnp
    >>> u = jnp.array([[1.1, 0.0], [0.0, 0.9]])
    >>> print(jnp.round(bjorck(u, 1), 4))     # 1.1 * 1.79 / 2 and 0.9 * 2.19 / 2
    [[0.9845 0.    ]
     [0.     0.9855]]
    """
    for _ in range(iterations):
        gram = jnp.matmul(jnp.swapaxes(u, -1, -2), u, precision=_HIGHEST)
        u = 1.5 * u - 0.5 * jnp.matmul(u, gram, precision=_HIGHEST)
    return u


def _encode_rows(rows: Array, code: str, block_size: int) -> QuantizedArray:
    """``rows`` ``(..., d, d)`` with each row zero-padded to whole blocks, quantized."""
    d = rows.shape[-1]
    block = _block(d, block_size, code)
    padded = jnp.pad(rows.astype(jnp.float32),
                     [(0, 0)] * (rows.ndim - 1) + [(0, -d % block)])
    return quantize_blockwise(padded, code, block)


def quantize_basis(matrix: Array, code: str, iterations: int, symmetric: bool = False,
                   block_size: int = BASIS_BLOCK) -> QuantizedBasis:
    """``matrix`` stored as low-bit eigenvectors: an orthogonal basis, or a symmetric matrix.

    An orthogonal ``matrix`` (its columns the eigenvectors, as SOAP's ``Q``) is stored as is;
    a symmetric one is decomposed by ``eigh`` (one matrix at a time on CPU,
    :func:`functrain.linalg.map_matrices`) into ``U`` and float32 eigenvalues. ``U^T`` (one
    eigenvector per row) is quantized with ``code`` in blocks of ``block_size`` entries
    along each row (rows shorter than that are one block; rows are zero-padded to whole
    blocks, so no block spans two eigenvectors), as Wang et al. (2024).

    Args:
      matrix: a square matrix or a stack ``(..., d, d)``.
      code: a key of ``CODES`` (:func:`basis_code`).
      iterations: Björck iterations after each decode.
      symmetric: decompose ``matrix`` (else it is taken as an orthogonal basis).
      block_size: entries per block along each eigenvector.

    Returns:
      The :class:`QuantizedBasis`.

    >>> import jax.numpy as jnp
    >>> q = quantize_basis(jnp.diag(jnp.array([4.0, 1.0])), 'dynamic8_signed', 1,
    ...                    symmetric=True)
    >>> print(q.values, decode_basis(q))
    [1. 4.] [[4. 0.]
     [0. 1.]]
    """
    shape = tuple(np.shape(matrix))
    values = None
    vectors = matrix
    if symmetric:
        stack = matrix.astype(jnp.float32).reshape((-1,) + shape[-2:])
        values, vectors = map_matrices(jnp.linalg.eigh, stack)
        values, vectors = values.reshape(shape[:-1]), vectors.reshape(shape)
    rows = jnp.swapaxes(vectors, -1, -2)
    return QuantizedBasis(_encode_rows(rows, code, block_size), values, shape,
                          jnp.dtype(matrix.dtype), int(iterations))


def decode_basis(q: QuantizedBasis) -> Array:
    """The matrix ``q`` stands for: the rectified basis ``U``, or ``U diag(lambda) U^T``.

    Decodes ``U^T``, drops the rows' padding, runs ``q.iterations`` Björck iterations
    (:func:`bjorck`) in float32, and for a symmetric matrix rebuilds it from the rectified
    ``U`` and the float32 eigenvalues.

    Args:
      q: the quantized basis.

    Returns:
      An array of ``q.shape`` and ``q.dtype``.

    >>> import jax.numpy as jnp
    >>> c, s = 0.6, 0.8
    >>> q = quantize_basis(jnp.array([[c, -s], [s, c]]), 'dynamic4_signed', 2)
    >>> u = decode_basis(q)
    >>> print(jnp.round(u.T @ u, 4))
    [[1. 0.]
     [0. 1.]]
    """
    d = q.shape[-1]
    rows = dequantize_blockwise(q.vectors)[..., :d]
    u = bjorck(jnp.swapaxes(rows, -1, -2).astype(jnp.float32), q.iterations)
    if q.values is None:
        return u.astype(q.dtype)
    return jnp.matmul(u * q.values[..., None, :], jnp.swapaxes(u, -1, -2),
                      precision=_HIGHEST).astype(q.dtype)


def encode_like(new: Array, stored: QuantizedBasis) -> QuantizedBasis:
    """``new`` stored like ``stored`` (its code, blocks, kind and iterations); each matrix
    of the stack that equals what ``stored`` decodes to keeps ``stored``'s codes and values.

    Args:
      new: the matrix (stack) the optimizer wrote, of ``stored.shape``.
      stored: the quantized basis it replaces.

    Returns:
      The new :class:`QuantizedBasis`.

    >>> import jax.numpy as jnp
    >>> q = quantize_basis(jnp.eye(4)[::-1], 'dynamic4_signed', 2)
    >>> encode_like(decode_basis(q), q).vectors.codes is not None
    True
    """
    fresh = quantize_basis(new, stored.vectors.code, stored.iterations,
                           symmetric=stored.values is not None,
                           block_size=block_size_of(stored.vectors))
    batch = stored.shape[:-2]
    same = jnp.all(new == decode_basis(stored), axis=(-2, -1))  # one per matrix

    def keep(old: Array, made: Array) -> Array:  # per matrix: its rows' blocks, or values
        grouped = made.reshape(batch + (-1,))
        flag = same.reshape(batch + (1,))
        return jnp.where(flag, old.reshape(grouped.shape), grouped).reshape(made.shape)

    vectors = QuantizedArray(keep(stored.vectors.codes, fresh.vectors.codes),
                             keep(stored.vectors.absmax, fresh.vectors.absmax),
                             *fresh.vectors[2:])
    values = None if fresh.values is None else keep(stored.values, fresh.values)
    return fresh._replace(vectors=vectors, values=values)


def check_basis(q: QuantizedBasis, where: str) -> None:
    """Raise a ``ValueError`` naming ``where`` if ``q``'s arrays do not fit its shape.

    Args:
      q: a quantized basis from a state.
      where: the leaf's key path, for the message.

    Returns:
      ``None``.

    >>> import jax.numpy as jnp
    >>> check_basis(quantize_basis(jnp.eye(4), 'dynamic4_signed', 1), "['w']")
    """
    d = q.shape[-1] if len(q.shape) >= 2 else -1
    problem = None
    if len(q.shape) < 2 or q.shape[-2] != d:
        problem = f"has shape {q.shape}, not a square matrix or a stack of them"
    elif not isinstance(q.vectors, QuantizedArray) or q.vectors.shape[:-1] != q.shape[:-1]:
        problem = (f"has eigenvectors of shape {getattr(q.vectors, 'shape', None)} for "
                   f"matrices {q.shape}")
    elif q.values is not None and tuple(np.shape(q.values)) != q.shape[:-1]:
        problem = f"has eigenvalues of shape {np.shape(q.values)}, expected {q.shape[:-1]}"
    if problem is not None:
        raise state_mismatch_error("quantized_state", f"state leaf {where} (a low-bit "
                                   f"eigenbasis) {problem}")
