"""SOAP's eigenbasis math (Vyas et al., 2024): rotating a tensor into the eigenbases of its
per-axis statistics, those statistics, and their refresh.

A leaf seen as a tensor with axes ``d_1 .. d_k`` keeps, per rotated axis ``i``, a
statistic ``L_i`` (an average of :func:`gram` ``G_(i) G_(i)^T``) and an orthonormal basis
``Q_i`` of its eigenvectors; :func:`rotate` takes ``G x_i Q_i^T`` over the rotated axes
(and back). :func:`refresh_bases` sets the bases from ``eigh`` on the first call and
refreshes them every ``precondition_frequency`` calls by one power-iteration step and QR,
for a whole tree in one conditional, its decompositions of each size batched (by the
caller's map, :func:`functrain.matrix.blocks.map_by_shape` in
:mod:`functrain.families.preconditioned.soap`, which keeps the moments and the state).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from functrain import tree as ft

Array = jax.Array

__all__ = ["rotate", "gram", "refresh_bases", "flatten_eigenbasis_inputs"]


def rotate(x: Array, bases: Sequence[Array], rotated: Sequence[bool], back: bool) -> Array:
    """``x x_i Q_i^T`` over the rotated axes ``i`` (into the eigenbases), or ``x x_i Q_i`` back.

    Args:
      x: a tensor of ``len(rotated)`` axes.
      bases: per axis, an orthonormal ``(d_i, d_i)`` basis (any placeholder where not
        rotated).
      rotated: per axis, whether it is rotated.
      back: rotate back out of the eigenbases.

    Returns:
      The rotated tensor, of ``x``'s shape.

    >>> import jax.numpy as jnp
    >>> q = jnp.array([[0., 1.], [1., 0.]])
    >>> print(rotate(jnp.array([[1., 2.], [3., 4.]]), (q, None), (True, False), back=False))
    [[3. 4.]
     [1. 2.]]
    """
    for k, (q, on) in enumerate(zip(bases, rotated)):
        if on:
            x = jnp.moveaxis(jnp.tensordot(x, q, axes=([k], [1 if back else 0])), -1, k)
    return x


def gram(x: Array, k: int) -> Array:
    """``X_(k) X_(k)^T``: ``x`` contracted with itself over every axis but ``k``.

    Args:
      x: a tensor.
      k: the axis kept.

    Returns:
      A ``(d_k, d_k)`` matrix.

    >>> import jax.numpy as jnp
    >>> print(gram(jnp.array([[1., 2.], [3., 4.]]), 1))
    [[10. 14.]
     [14. 20.]]
    """
    others = [a for a in range(x.ndim) if a != k]
    return jnp.tensordot(x, x, axes=(others, others))


def _top_eigenvectors(s: Array) -> Array:
    """The eigenvectors of one statistic, largest eigenvalue first."""
    return jnp.linalg.eigh(s)[1][:, ::-1]


def _power_step(s: Array, q: Array) -> tuple:
    """One power-iteration step and QR on one axis: ``(qr(S Q[:, order]).Q, order)``, with
    ``Q``'s columns ordered by their estimated eigenvalues ``diag(Q^T S Q)``, descending."""
    sq = s @ q
    order = jnp.argsort(-jnp.sum(q * sq, axis=0))
    return jnp.linalg.qr(sq[:, order])[0], order


def refresh_bases(units: list, count: Array, precondition_frequency: int,
                  map_fn: Callable[[Callable, list], list]) -> list:
    """The bases and second moment of every unit after one conditional for the whole tree.

    On the first call (``count == 0``) each rotated axis' basis becomes its statistic's
    eigenvectors (``eigh``, largest eigenvalue first); when ``count`` is a positive
    multiple of ``precondition_frequency``, one power-iteration step and QR, ``Q =
    qr(L Q[:, order]).Q`` with the columns ordered by ``diag(Q^T L Q)`` descending, and
    ``nu``'s entries along that axis reordered with them; otherwise nothing changes.
    Each refresh's decompositions go through one ``map_fn`` call.

    Args:
      units: per unit (a leaf, a leaf's same-shape blocks, or a stacked leaf's layers),
        ``(stats, bases, nu, rotated)``: per axis a stack ``(n, d, d)`` of statistics
        and one of bases (placeholders where ``rotated`` is False), and the second
        moments ``(n,) + shape`` in the rotated basis.
      count: the number of earlier calls (int32).
      precondition_frequency: refresh every this many calls.
      map_fn: ``map_fn(fn, items)``: ``fn`` of each matrix of each item (a tuple of
        stacks), per item its outputs stacked, as
        :func:`functrain.matrix.blocks.map_by_shape` (which batches same-size matrices,
        divided over a mesh's devices when given one).

    Returns:
      Per unit, ``(bases, nu)``.

    >>> import jax.numpy as jnp
    >>> from functrain.matrix.blocks import map_by_shape
    >>> s = jnp.diag(jnp.array([1., 3.]))[None]
    >>> [(q, _)] = refresh_bases([((s,), (s,), jnp.ones((1, 2)), (True,))], jnp.int32(0), 10,
    ...                          map_by_shape)
    >>> print(jnp.abs(q[0][0]))
    [[0. 1.]
     [1. 0.]]
    """
    axes = [(i, k) for i, (_, _, _, rotated) in enumerate(units) for k, on in enumerate(rotated)
            if on]

    def run(ops: list, initial: bool) -> list:
        new = [[list(q), v] for _, q, v in ops]
        done = map_fn(_top_eigenvectors if initial else _power_step,
                            [(ops[i][0][k],) + (() if initial else (ops[i][1][k],))
                             for i, k in axes])
        for (i, k), q in zip(axes, done):
            if not initial:  # nu's entries follow the sorted columns
                (q, order), v = q, new[i][1]
                new[i][1] = jnp.take_along_axis(v, order.reshape(
                    order.shape[:1] + (1,) * k + order.shape[1:] + (1,) * (v.ndim - k - 2)),
                    axis=k + 1)
            new[i][0][k] = q
        return [(tuple(q), v) for q, v in new]

    refresh = (count > 0) & (count % precondition_frequency == 0)
    branch = jnp.where(count == 0, 1, jnp.where(refresh, 2, 0))
    return lax.switch(branch, [lambda ops: [(q, v) for _, q, v in ops],
                               lambda ops: run(ops, True), lambda ops: run(ops, False)],
                      [(stats, bases, nu) for stats, bases, nu, _ in units])


def flatten_eigenbasis_inputs(updates: Any, state: Any, params: Any, owner: str) -> tuple:
    """An eigenbasis optimizer's inputs, flattened and checked before any math (SOAP's and
    SOAP-Muon's ``update``): real floating leaves, params that fit the updates, and the
    state's ``mu``, ``nu``, ``stats`` and ``bases`` fields shaped like the tree.

    Args:
      updates: the gradients.
      state: the optimizer's state (fields ``mu``, ``nu``, ``stats``, ``bases``).
      params: the params, or ``None``.
      owner: the optimizer, for the messages.

    Returns:
      ``(paths, gradient leaves, param leaves or Nones, treedef, {field: leaves})``; a
      ``ValueError`` or ``TypeError`` naming the leaf's key path otherwise.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.soap(1e-3)
    >>> g = {'w': jnp.ones((2, 2))}
    >>> paths, gs, ps, _, fields = flatten_eigenbasis_inputs(g, opt.init(g)[0], None, "soap")
    >>> paths, sorted(fields)
    (["['w']"], ['bases', 'mu', 'nu', 'stats'])
    """
    paths, gs, treedef = ft.flatten_with_paths(updates)
    gs = [jnp.asarray(g) for g in gs]
    active, ps = [True] * len(gs), [None] * len(gs)
    ft.check_leaf_dtypes(paths, gs, active, owner, "updates", real_only=True)
    if params is not None:
        ft.check_structure(updates, params, "params", "updates")
        ps = [jnp.asarray(p) for p in treedef.flatten_up_to(params)]
        ft.check_shapes(paths, ps, gs, "updates", "params")
        ft.check_leaf_dtypes(paths, ps, active, owner, "params", real_only=True)
    fields = {name: ft.flatten_like(treedef, getattr(state, name), f"{owner} state .{name}",
                                    updates, "updates")
              for name in ("mu", "nu", "stats", "bases")}
    for name in ("mu", "nu"):
        ft.check_shapes(paths, fields[name], gs, "updates", f"{owner} state .{name}")
    return paths, gs, ps, treedef, fields
