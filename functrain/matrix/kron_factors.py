"""PSGD Kron's batched factor math for a group of same-shape leaves (Li, 2018).

A group is a stack: every array here has a leading axis ``k`` over the group's leaves, and
every operation (factor products, Gram matrices, triangular solves, norms) is one batched
call over it. :func:`diagonal_axes` says which factors are diagonal, :func:`group_noise`
draws the whitening noise of every group, :func:`whitening_step` updates the factors on
PSGD's whitening criterion, :func:`precondition` applies ``P = Q^H Q``;
:mod:`functrain.families.preconditioned.kron` groups the leaves and keeps the state.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from functrain.linalg import map_matrices
from functrain.numerics import abs_sq

Array = jax.Array

__all__ = ["diagonal_axes", "group_noise", "whitening_step", "precondition"]

# The damping of the preconditioner's input, as the reference: sqrt(float32 eps) * mean|h|.
_DAMPING = float(np.sqrt(np.finfo(np.float32).eps))


def diagonal_axes(shape: tuple, max_size: int, max_skew: Optional[float], min_ndim: int,
                  memory_save_mode: Optional[str]) -> tuple:
    """Per axis of a leaf (or block) of ``shape``: whether its Kron factor is diagonal.

    An axis gets a diagonal factor (a vector) when it has size 1, is longer than
    ``max_size``, is too skewed (``d**2 > max_skew * size``), the leaf has fewer than
    ``min_ndim`` axes, or ``memory_save_mode`` says so (``'all_diag'``; ``'one_diag'``:
    the largest axis, the last of equals; ``'smart_one_diag'``: it, only if strictly the
    largest); otherwise a triangular matrix. A scalar has one (scalar) factor.

    Args:
      shape: the leaf's (merged, or one block's) shape.
      max_size: the longest axis with a triangular factor.
      max_skew: the skew limit, or ``None`` for none.
      min_ndim: the fewest axes a leaf needs for triangular factors.
      memory_save_mode: ``None``, ``'one_diag'``, ``'smart_one_diag'`` or ``'all_diag'``.

    Returns:
      A tuple of bools, one per axis (``(True,)`` for a scalar).

    >>> diagonal_axes((4, 8), 8192, None, 2, None), diagonal_axes((4, 8), 8192, None, 2, "one_diag")
    ((False, False), (False, True))
    """
    if not shape:
        return (True,)
    numel = math.prod(shape)
    forced = [False] * len(shape)
    largest = max(range(len(shape)), key=lambda i: (shape[i], i))  # the last of equals
    if memory_save_mode == "all_diag":
        forced = [True] * len(shape)
    elif memory_save_mode == "one_diag":
        forced[largest] = True
    elif memory_save_mode == "smart_one_diag":
        rest = sorted(shape)
        if len(rest) > 1 and rest[-1] > rest[-2]:
            forced[largest] = True
    return tuple(f or d <= 1 or d > max_size or len(shape) < min_ndim
                 or (max_skew is not None and d * d > max_skew * numel)
                 for d, f in zip(shape, forced))


def group_noise(key: Array, like: list, groups: list, max_gather_rows: int = 1 << 16
                ) -> list:
    """Standard normal draws shaped like each group's stack, from ONE flat draw.

    The draw is in the widest real dtype of ``like``, cut in ``like``'s order (a complex
    entry takes two pieces, ``(re + i im) / sqrt(2)``): each leaf's (or block's, or
    layer's) noise depends only on its place in ``like``, not on how the leaves are
    grouped. One gather of rows (the sizes' gcd) puts it in group order, so the draw's
    last kernel has one reader, not one per leaf; above ``max_gather_rows`` rows, slices.

    Args:
      key: the PRNG key of this step's noise.
      like: per leaf (or block, or layer), a ``jax.ShapeDtypeStruct``.
      groups: per group, the indices into ``like`` of its members, in stack order.
      max_gather_rows: the most rows of the gather (``0``: always slices).

    Returns:
      Per group, an array ``(len(members),) + shape`` in the members' dtype.

    >>> import jax, jax.numpy as jnp
    >>> like = [jax.ShapeDtypeStruct((2,), jnp.float32)] * 3
    >>> a, b = group_noise(jax.random.PRNGKey(0), like, [[0, 2], [1]])
    >>> flat = jax.random.normal(jax.random.PRNGKey(0), (6,))
    >>> bool((a[1] == flat[4:]).all()), bool((b[0] == flat[2:4]).all())
    (True, True)
    """
    if not like:
        return []
    real = jnp.result_type(*[jnp.finfo(x.dtype).dtype for x in like])
    cplx = [jnp.issubdtype(x.dtype, jnp.complexfloating) for x in like]
    sizes = [x.size * (2 if c else 1) for x, c in zip(like, cplx)]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    flat = jax.random.normal(key, (int(starts[-1]),), real)
    order = [i for members in groups for i in members]
    width = math.gcd(*sizes) or 1
    if order != sorted(order):
        if flat.size // width <= max_gather_rows:
            rows = np.concatenate([np.arange(starts[i], starts[i + 1], width) // width
                                   for i in order]).astype(np.int32)
            flat = flat.reshape(-1, width)[rows].reshape(-1)
        else:
            flat = jnp.concatenate([flat[starts[i]:starts[i + 1]] for i in order])
    out, at = [], 0
    for members in groups:
        x, n = like[members[0]], sizes[members[0]]
        w = flat[at:at + n * len(members)].reshape(len(members), n)
        at += n * len(members)
        if cplx[members[0]]:
            w = (w[:, :x.size] + 1j * w[:, x.size:]) / np.sqrt(2)
        out.append(w.reshape((len(members),) + x.shape).astype(x.dtype))
    return out


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
