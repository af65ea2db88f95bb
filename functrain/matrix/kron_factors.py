"""PSGD Kron's batched factor math for a group of same-shape leaves (Li, 2018).

A group is a stack: every array here has a leading axis ``k`` over the group's leaves,
and every operation (factor products, Gram matrices, triangular solves, norms) is one
batched call over it. :func:`whitening_step` updates the factors on PSGD's whitening
criterion, :func:`precondition` applies ``P = Q^H Q``; :mod:`functrain.contrib.kron`
groups the leaves, draws the noise and keeps the state. Also importable under its former
name ``functrain.contrib.kron_factors``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from functrain.linalg import map_matrices
from functrain.numerics import abs_sq

Array = jax.Array

__all__ = ["whitening_step", "precondition"]

# The damping of the preconditioner's input, as the reference: sqrt(float32 eps) * mean|h|.
_DAMPING = float(np.sqrt(np.finfo(np.float32).eps))


def _bcast(d: Array, x: Array, axis: int = -1) -> Array:
    """A diagonal factor stack ``(k, n)`` shaped to scale ``axis`` of the stack ``x``; a
    ``(k,)`` one (per-leaf values) to scale each leaf."""
    shape = [d.shape[0]] + [1] * (x.ndim - 1)
    if d.ndim == 2:
        shape[axis + 1] = -1
    return d.reshape(shape)


def _mode(q: Array, x: Array, axis: int, hermitian: bool = False) -> Array:
    """``op(Q_i)`` along ``axis`` of every leaf, ``op`` the identity or ``^H``: one batched
    GEMM (in place along the first and the last axis: no transpose), or elementwise."""
    if q.ndim < 3:
        return x * _bcast(jnp.conj(q) if hermitian else q, x, axis)
    contract = 1 if hermitian else 2  # (Q^H)[a, b] = conj(Q[b, a]): contract Q's rows
    q, batch = (jnp.conj(q) if hermitian else q), ((0,), (0,))
    if axis + 1 == x.ndim - 1 and x.ndim > 2:
        return jax.lax.dot_general(x, q, (((x.ndim - 1,), (contract,)), batch))
    return jnp.moveaxis(jax.lax.dot_general(q, x, (((contract,), (axis + 1,)), batch)),
                        1, axis + 1)


def _solve_h(qs: dict, v: Array) -> Array:
    """``Q_i^{-H}`` along each axis ``i`` in ``qs`` (triangular factors) of ONE leaf ``v``: a
    triangular solve per axis, right-sided along the last (``Y conj(Q) = X``: nothing
    transposed). :func:`whitening_step` maps it over a group with ``map_matrices``: one
    leaf per LAPACK call on CPU (a batched one can deadlock XLA:CPU,
    docs/matrix_optimizers.md), all of a leaf's solves in one loop step."""
    for i, q in qs.items():
        d = v.shape[i]
        if i == v.ndim - 1 and v.ndim > 1:
            v = jax.lax.linalg.triangular_solve(q, v.reshape(-1, d), left_side=False,
                                                lower=False, conjugate_a=True).reshape(v.shape)
            continue
        moved = jnp.moveaxis(v, i, 0)
        sol = jax.lax.linalg.triangular_solve(q, moved.reshape(d, -1), left_side=True,
                                              lower=False, transpose_a=True, conjugate_a=True)
        v = jnp.moveaxis(sol.reshape(moved.shape), 0, i)
    return v


def _gram(x: Array, axis: int, diagonal: bool) -> Array:
    """``X_i X_i^H`` per leaf (``X`` unfolded with ``axis`` as rows), or only its diagonal:
    one batched GEMM contracting every other axis in place (no unfolding copy)."""
    others = tuple(j for j in range(1, x.ndim) if j != axis + 1)
    if diagonal:
        return jnp.sum(abs_sq(x), axis=others)
    return jax.lax.dot_general(x, jnp.conj(x), ((others, others), ((0,), (0,))))


def _tiny(x: Array) -> Array:
    return x + jnp.finfo(x.dtype).tiny


def _norm_lower_bound(s: Array) -> Array:
    """A cheap lower bound of each ``s``'s spectral norm (within about sqrt(2) of it): two
    power-iteration steps from its row of largest norm. The scaling by the largest entry
    (against overflow) goes to vectors and reductions, so ``s`` is never rewritten."""
    top = jnp.max(jnp.abs(s), axis=(1, 2))
    inv = (1 / jnp.where(top > 0, top, 1)).astype(s.dtype)
    j = jnp.argmax(jnp.sum(abs_sq(s * inv[:, None, None]), axis=2), axis=1)
    row = jnp.take_along_axis(s, j[:, None, None], axis=1)[:, 0] * inv[:, None]
    x = jnp.einsum("kab,kb->ka", s, jnp.conj(row)) * inv[:, None]
    x = x / jnp.maximum(jnp.linalg.norm(x, axis=1, keepdims=True), jnp.finfo(top.dtype).tiny)
    return jnp.linalg.norm(jnp.einsum("kab,ka->kb", jnp.conj(s), x), axis=1)


def _balance(qs: list) -> list:
    """Per factor, the ``(k,)`` scales giving each leaf's factors equal largest entries
    (product 1: ``Q`` is unchanged). The factor step is linear in the factor, so they are
    applied to its result, one pass fewer over the factors."""
    if len(qs) < 2:
        return [None] * len(qs)
    tops = jnp.stack([jnp.max(jnp.abs(q), axis=tuple(range(1, q.ndim)), initial=0.0)
                      for q in qs])  # a zero-size factor: 0, so no rescaling
    ok = jnp.all(tops > 0, axis=0)
    safe = jnp.where(ok, tops, 1)
    gmean = jnp.exp(jnp.mean(jnp.log(safe), axis=0))
    return [jnp.where(ok, gmean / t, 1) for t in safe]


def whitening_step(qs: list, h: Array, v: Array, lr: Any) -> list:
    """One step of every factor of a group on PSGD's whitening criterion (Li, 2018).

    With ``A = Q h`` and ``B = Q^{-H} v`` (triangular solves), each triangular factor
    becomes ``Q_i - lr / ||S_i|| triu(A_i A_i^H - B_i B_i^H) Q_i`` with ``S_i = A_i A_i^H +
    B_i B_i^H`` (``||.||`` a lower bound of the spectral norm); a diagonal factor uses the
    diagonals and their largest entry. ``h`` is first damped by ``sqrt(float32 eps) *
    mean|h| * v``, and each leaf's factors are rescaled to equal largest entries (``Q``
    unchanged).

    Args:
      qs: the group's factors, one stack per axis: ``(k, d, d)`` triangular or ``(k, d)``
        diagonal (``(k,)`` for scalar leaves).
      h: the ``(k, d_1, ..., d_n)`` stack of the leaves' momenta (or gradients).
      v: a standard normal draw shaped like ``h``.
      lr: the preconditioner's step size.

    Returns:
      The new factors, shaped like ``qs``.

    >>> import jax, jax.numpy as jnp
    >>> qs = [jnp.eye(3)[None], jnp.eye(2)[None]]
    >>> h = jnp.ones((1, 3, 2))
    >>> v = jax.random.normal(jax.random.PRNGKey(0), (1, 3, 2))
    >>> [q.shape for q in whitening_step(qs, h, v, 0.1)]
    [(1, 3, 3), (1, 2, 2)]
    """
    scales = _balance(qs)
    h = h + _DAMPING * jnp.mean(jnp.abs(h), axis=tuple(range(1, h.ndim)), keepdims=True) * v
    a, b = h, v
    for i, q in enumerate(qs):
        a = _mode(q, a, i)
        if q.ndim < 3:
            b = b / _bcast(jnp.conj(q), b, i)
    tri = [i for i, q in enumerate(qs) if q.ndim == 3]
    if tri:
        b = map_matrices(lambda x, *ts: _solve_h(dict(zip(tri, ts)), x), b,
                         *[qs[i] for i in tri])
    out = []
    for i, (q, c) in enumerate(zip(qs, scales)):
        diagonal = q.ndim < 3
        t1, t2 = _gram(a, i, diagonal), _gram(b, i, diagonal)
        if diagonal:
            top = jnp.max(jnp.abs(t1 + t2), axis=tuple(range(1, t1.ndim)), initial=0.0)
            step = _bcast(lr / _tiny(top), q) * (t1 - t2) * q
        else:
            step = _bcast(lr / _tiny(_norm_lower_bound(t1 + t2)), q) * \
                (jnp.triu(t1 - t2) @ q)
        new = q - step.astype(q.dtype)
        out.append(new if c is None else new * _bcast(c.astype(q.dtype), new))
    return out


def precondition(qs: list, x: Array) -> Array:
    """``P x = Q^H Q x`` for each leaf of a group, axis by axis (PSGD Kron, Li, 2018).

    A triangular factor no longer than the rest ``r`` of the leaf forms ``Q_i^H Q_i``
    (``2 d^3 + 2 d^2 r`` flops against ``4 d^2 r``, one pass over ``x``), a longer one
    applies ``Q_i`` then ``Q_i^H``; a diagonal one multiplies by ``|q|^2``.

    Args:
      qs: the group's factors, as in :func:`whitening_step`.
      x: the ``(k, d_1, ..., d_n)`` stack to precondition.

    Returns:
      ``P x``, shaped like ``x``.

    >>> import jax.numpy as jnp
    >>> qs = [2 * jnp.eye(2)[None], jnp.array([[1., 3.]])]
    >>> print(precondition(qs, jnp.ones((1, 2, 2)))[0])
    [[ 4. 36.]
     [ 4. 36.]]
    """
    size = math.prod(x.shape[1:])
    for i, q in enumerate(qs):
        if q.ndim < 3:
            x = _mode(abs_sq(q).astype(q.dtype), x, i)
        elif q.shape[-1] ** 2 <= size:
            p = jax.lax.dot_general(jnp.conj(q), q, (((1,), (1,)), ((0,), (0,))))
            x = _mode(p, x, i)
        else:
            x = _mode(q, _mode(q, x, i), i, hermitian=True)
    return x
