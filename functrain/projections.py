"""Euclidean projections of pytrees onto convex sets: ``argmin_p ||x - p||_2`` over the set.

The twelve of ``optax.projections`` with their signatures and numbers. A tree
counts as one flat vector: the l1/l2 balls and the simplex constrain all
leaves together; boxes act entrywise. Use one after an optimizer step for
projected gradient descent::

    params = functrain.projections.projection_non_negative(
        functrain.apply_updates(params, updates))
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import flatten_util

from functrain import tree as ft

PyTree = Any
Array = jax.Array

__all__ = ["projection_non_negative", "projection_box", "projection_hypercube",
           "projection_simplex", "projection_l1_sphere", "projection_l1_ball",
           "projection_l2_sphere", "projection_l2_ball", "projection_linf_ball",
           "projection_hyperplane", "projection_halfspace", "projection_vector"]


def projection_non_negative(tree: PyTree) -> PyTree:
    """Projection onto the non-negative orthant: ``max(x, 0)`` entrywise.

    Args:
      tree: the tree to project.

    Returns:
      The projected tree, same structure.

    >>> import jax.numpy as jnp
    >>> projection_non_negative({'w': jnp.array([-1., 2.])})
    {'w': Array([0., 2.], dtype=float32)}
    """
    return jax.tree_util.tree_map(jax.nn.relu, tree)


def projection_box(tree: PyTree, lower: Any, upper: Any) -> PyTree:
    """Projection onto the box ``lower <= p <= upper``: entrywise clipping.

    Args:
      tree: the tree to project.
      lower: the lower bound, a scalar or a tree like ``tree``.
      upper: the upper bound, a scalar or a tree like ``tree``.

    Returns:
      The projected tree, same structure. (A scalar bound applies to every
      leaf; optax accepts a scalar only when ``tree`` is a single array.)

    Raises:
      ValueError: a bound tree of another structure (the key paths are named).

    >>> import jax.numpy as jnp
    >>> projection_box({'w': jnp.array([-2., 0.5, 3.])}, -1., 1.)
    {'w': Array([-1. ,  0.5,  1. ], dtype=float32)}
    """
    def like_tree(bound: Any) -> PyTree:
        if ft.is_single_leaf(bound) and not ft.is_single_leaf(tree):
            return jax.tree_util.tree_map(lambda _: bound, tree)
        return bound

    return ft.map(jnp.clip, tree, like_tree(lower), like_tree(upper))


def projection_hypercube(tree: PyTree, scale: Any = 1) -> PyTree:
    """Projection onto the hypercube ``0 <= p <= scale`` (the unit cube by default).

    Args:
      tree: the tree to project.
      scale: the cube's side, a scalar or a tree like ``tree``.

    Returns:
      The projected tree, same structure.

    >>> import jax.numpy as jnp
    >>> projection_hypercube([jnp.array([-1., 0.5, 2.])])
    [Array([0. , 0.5, 1. ], dtype=float32)]
    """
    return projection_box(tree, lower=0, upper=scale)


@jax.custom_jvp
def _unit_simplex(v: Array) -> Array:
    """Projection of a vector onto ``{p >= 0, sum p = 1}`` (sort-based, Held et al., 1974)."""
    desc = jnp.sort(v)[::-1]
    partial_sums = jnp.cumsum(desc)
    k = jnp.arange(1, v.shape[0] + 1)
    support = jnp.count_nonzero(1 / k + (desc - partial_sums / k) > 0)
    return jax.nn.relu(1 / support + (v - partial_sums[support - 1] / support))


@_unit_simplex.defjvp
def _unit_simplex_jvp(primals: tuple, tangents: tuple) -> tuple:
    (v,), (dv,) = primals, tangents
    out = _unit_simplex(v)
    on = out > 0
    # On the support the projection is the centring map: dv minus its mean there.
    return out, on * dv - (jnp.dot(on, dv) / jnp.count_nonzero(on)) * on


def projection_simplex(tree: PyTree, scale: Any = 1) -> PyTree:
    """Projection onto the simplex ``{p >= 0, sum of all entries = scale}``.

    Args:
      tree: the tree to project (all leaves together).
      scale: what the projected entries sum to (1: the probability simplex).

    Returns:
      The projected tree, same structure.

    >>> import jax.numpy as jnp
    >>> out = projection_simplex({'a': jnp.array([1., 0.]), 'b': jnp.array([2.])})
    >>> out['a'], out['b']
    (Array([0., 0.], dtype=float32), Array([1.], dtype=float32))
    """
    flat, unflatten = flatten_util.ravel_pytree(tree)
    return unflatten(scale * _unit_simplex(flat / scale))


def projection_l1_sphere(tree: PyTree, scale: Any = 1) -> PyTree:
    """Projection onto the l1 sphere ``||p||_1 = scale``: the moduli onto the simplex, signs kept.

    Args:
      tree: the tree to project.
      scale: the sphere's radius.

    Returns:
      The projected tree, same structure.

    >>> import jax.numpy as jnp
    >>> projection_l1_sphere([jnp.array([2., -2.])])
    [Array([ 0.5, -0.5], dtype=float32)]
    """
    moduli = projection_simplex(jax.tree_util.tree_map(jnp.abs, tree), scale)
    return ft.mul(jax.tree_util.tree_map(jnp.sign, tree), moduli)


def projection_l1_ball(tree: PyTree, scale: Any = 1) -> PyTree:
    """Projection onto the l1 ball ``||p||_1 <= scale`` (``tree`` itself when inside).

    Args:
      tree: the tree to project.
      scale: the ball's radius.

    Returns:
      The projected tree, same structure.

    >>> import jax.numpy as jnp
    >>> projection_l1_ball([jnp.array([2., -2.])]), projection_l1_ball([jnp.array([.2, .3])])
    ([Array([ 0.5, -0.5], dtype=float32)], [Array([0.2, 0.3], dtype=float32)])
    """
    return jax.lax.cond(ft.norm(tree, ord=1) <= scale, lambda t: t,
                        lambda t: projection_l1_sphere(t, scale), tree)


def projection_l2_sphere(tree: PyTree, scale: Any = 1) -> PyTree:
    """Projection onto the l2 sphere ``||p||_2 = scale``: ``x`` rescaled to that norm.

    Args:
      tree: the tree to project.
      scale: the sphere's radius.

    Returns:
      The projected tree, same structure.

    >>> import jax.numpy as jnp
    >>> projection_l2_sphere([jnp.array([3., 4.])], 10.)
    [Array([6., 8.], dtype=float32)]
    """
    return ft.scale(scale / ft.norm(tree), tree)


def projection_l2_ball(tree: PyTree, scale: Any = 1) -> PyTree:
    """Projection onto the l2 ball ``||p||_2 <= scale``: ``x * scale / max(||x||, scale)``.

    Args:
      tree: the tree to project.
      scale: the ball's radius.

    Returns:
      The projected tree, same structure.

    >>> import jax.numpy as jnp
    >>> projection_l2_ball([jnp.array([3., 4.])])
    [Array([0.6, 0.8], dtype=float32)]
    """
    sq = ft.norm(tree, squared=True)
    return ft.scale(scale / jnp.sqrt(jnp.maximum(sq, scale ** 2)), tree)


def projection_linf_ball(tree: PyTree, scale: Any = 1) -> PyTree:
    """Projection onto the l-infinity ball ``max |p| <= scale``: clipping to ``[-scale, scale]``.

    Args:
      tree: the tree to project.
      scale: the ball's radius.

    Returns:
      The projected tree, same structure.

    >>> import jax.numpy as jnp
    >>> projection_linf_ball([jnp.array([-3., 0.5])])
    [Array([-1. ,  0.5], dtype=float32)]
    """
    return projection_box(tree, lower=ft.full_like(tree, -scale),
                          upper=ft.full_like(tree, scale))


def projection_vector(x: PyTree, a: PyTree) -> PyTree:
    """Projection of ``x`` onto the line spanned by ``a``: ``<x, a> / <a, a> * a``.

    Args:
      x: the tree to project.
      a: the direction, a tree like ``x``.

    Returns:
      A tree like ``a``.

    >>> import jax.numpy as jnp
    >>> projection_vector([jnp.array([2., 1.])], [jnp.array([1., 0.])])
    [Array([2., 0.], dtype=float32)]
    """
    return ft.scale(ft.vdot(x, a) / ft.vdot(a, a), a)


def projection_hyperplane(x: PyTree, a: PyTree, b: Any) -> PyTree:
    """Projection onto the hyperplane ``<a, p> = b``: ``x + (b - <x, a>) / <a, a> * a``.

    Args:
      x: the tree to project.
      a: the hyperplane's normal, a tree like ``x``.
      b: the hyperplane's offset, a scalar.

    Returns:
      The projected tree, same structure.

    >>> import jax.numpy as jnp
    >>> projection_hyperplane([jnp.array([2., 1.])], [jnp.array([1., 0.])], 1.)
    [Array([1., 1.], dtype=float32)]
    """
    return ft.add_scale(x, (b - ft.vdot(x, a)) / ft.vdot(a, a), a)


def projection_halfspace(x: PyTree, a: PyTree, b: Any) -> PyTree:
    """Projection onto the halfspace ``<a, p> <= b`` (``x`` itself when inside).

    Args:
      x: the tree to project.
      a: the boundary's normal, a tree like ``x``.
      b: the boundary's offset, a scalar.

    Returns:
      The projected tree, same structure.

    >>> import jax.numpy as jnp
    >>> projection_halfspace([jnp.array([2., 1.])], [jnp.array([1., 0.])], 1.)
    [Array([1., 1.], dtype=float32)]
    """
    step = jnp.minimum((b - ft.vdot(x, a)) / ft.vdot(a, a), 0)
    return ft.add_scale(x, step, a)
