"""Shampoo's per-block math: layouts, statistics, inverse roots, grafting.

:func:`functrain.contrib.scale_by_shampoo` sees each weight as a matrix
(:func:`matrix_shape`), cut into blocks (:func:`layout`); per step it takes the grafted
diagonal direction (:func:`diagonal_direction`), updates every group of same-size blocks'
statistics and, in one conditional, their inverse roots, and preconditions them
(:func:`precondition_groups`), then grafts the preconditioned direction to the diagonal
one's norm (:func:`graft`). Each is a function of its inputs and the static
:class:`Config`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.linalg import map_matrices
from functrain.matrix.blocks import block_grid
from functrain.matrix.dimension_numbers import LayerView, stacked_shape
from functrain.numerics import abs_sq, ema_update

__all__ = ["Layout", "Context", "Config", "layout", "matrix_shape", "stat_shapes", "grid",
           "inverse_root", "leaf_layout", "diagonal_direction", "precondition_groups", "graft"]

Array = jax.Array

_HIGHEST = jax.lax.Precision.HIGHEST
_TINY_NORM = 1e-16  # floor of the Shampoo direction's norm when grafting (as the reference)


class Layout(NamedTuple):
    """How one leaf is preconditioned: its matrix view and blocks (all static)."""

    rows: int     # the matrix view: (prod(shape[:-1]), shape[-1])
    cols: int
    left: bool    # whether the rows get a preconditioner (L)
    right: bool   # whether the columns get one (R)
    kr: int       # blocks along the rows, each of br rows (the last one zero-padded)
    br: int
    kc: int
    bc: int


class Context(NamedTuple):
    """Per step: bias corrections and whether to refresh / use the preconditioners."""

    mu: Any        # 1 - b1**t
    next_mu: Any   # 1 - b1**(t+1) (Nesterov)
    nu: Any        # 1 - b2**t (Adam grafting)
    refresh: Array
    precondition: Array


def layout(shape: tuple, block_size: Optional[int], max_precond_dim: int
           ) -> Optional[Layout]:
    """The leaf's layout, or ``None`` for the diagonal fallback (rank < 2, or no side fits)."""
    if len(shape) < 2:
        return None
    rows, cols = matrix_shape(shape)
    left, right = rows <= max_precond_dim, cols <= max_precond_dim
    if not (left or right) or rows * cols == 0:
        return None
    (kr, br), (kc, bc) = block_grid((rows, cols), block_size, split=(left, right))
    return Layout(rows, cols, left, right, kr, br, kc, bc)


def matrix_shape(shape: tuple) -> tuple:
    """The matrix a leaf of ``shape`` is seen as: ``(prod(shape[:-1]), shape[-1])``."""
    return (math.prod(shape[:-1]), shape[-1]) if len(shape) >= 2 else tuple(shape)


def stat_shapes(lay: Optional[Layout], view: Optional[LayerView] = None
                ) -> tuple[tuple, tuple]:
    """Per side, the statistics' shape (stacked over a stacked leaf's layer axes)."""
    if lay is None:
        return (1,), (1,)
    k = lay.kr * lay.kc
    return ((stacked_shape(view, (k, lay.br, lay.br)) if lay.left else (1,)),
            (stacked_shape(view, (k, lay.bc, lay.bc)) if lay.right else (1,)))


def grid(lay: Layout) -> tuple:
    """The blocks per side, ``((kr, br), (kc, bc))``, as ``functrain.matrix.blocks`` takes."""
    return ((lay.kr, lay.br), (lay.kc, lay.bc))


def _ct(x: Array) -> Array:
    return jnp.conj(jnp.swapaxes(x, -1, -2))


def inverse_root(stat: Array, exponent: int, matrix_eps: Any, mesh: Any = None) -> Array:
    """``(S + matrix_eps * lambda_max(S) I)^(-1/exponent)`` of each block, by ``eigh``.

    Runs in the statistics' dtype (at least float32). Negative rounding of the
    eigenvalues is clipped to zero; an all-zero block gives the identity. The
    blocks go through ``eigh`` one at a time on CPU (:func:`map_matrices`): two
    batched ``eigh`` calls running at once can deadlock XLA:CPU.
    """
    w, v = map_matrices(jnp.linalg.eigh, stat, mesh=mesh)
    w = jnp.maximum(w, 0)
    top = jnp.max(w, axis=-1, keepdims=True)
    safe = jnp.where(top > 0, w + matrix_eps * top, 1)
    scale = (safe ** (-1.0 / exponent)).astype(v.dtype)
    root = jnp.matmul(v * scale[..., None, :], _ct(v), precision=_HIGHEST)
    eye = jnp.eye(stat.shape[-1], dtype=stat.dtype)
    return jnp.where(top[..., None] > 0, root, eye)


class Config(NamedTuple):
    """scale_by_shampoo's static options (its arguments of the same names)."""

    b1: Any
    b2: Any
    eps: Any
    matrix_eps: Any
    graft_type: Optional[str]
    nesterov: bool
    mesh: Any
    block_size: Optional[int]
    max_precond_dim: int


def leaf_layout(cfg: Config, x: Any, view: Optional[LayerView]) -> Optional[Layout]:
    """:func:`layout` of a leaf (of one layer of a stacked leaf)."""
    return layout(tuple(x.shape) if view is None else view.layer_shape, cfg.block_size,
                   cfg.max_precond_dim)


def diagonal_direction(cfg: Config, g: Array, nu: Array, ctx: Context) -> tuple[Array, Array]:
    """The grafted (diagonal) optimizer's direction and its new ``nu``."""
    if cfg.graft_type == "sgd":
        return g, nu
    if cfg.graft_type == "adam":
        nu = ema_update(abs_sq(g), nu, cfg.b2)
        return g / (jnp.sqrt(nu / ctx.nu) + cfg.eps), nu
    nu = nu + abs_sq(g)
    return g / (jnp.sqrt(nu) + cfg.eps), nu


def precondition_groups(cfg: Config, groups: dict, ctx: Context) -> dict:
    """Statistics, inverse roots and ``P_L G P_R`` of every group of same-size blocks.

    ``groups`` maps ``(br, bc, left, right, dtype)`` to ``[blocks, L, R, P_L, P_R]``
    stacked over the group's blocks (all leaves). One ``lax.cond`` refreshes
    every group's roots.
    """
    b2 = cfg.b2
    weight = jnp.where(b2 == 1, 1.0, 1.0 - b2)
    for (_, _, left, right, _), g in groups.items():
        if left:
            g[1] = b2 * g[1] + weight * jnp.matmul(g[0], _ct(g[0]), precision=_HIGHEST)
        if right:
            g[2] = b2 * g[2] + weight * jnp.matmul(_ct(g[0]), g[0], precision=_HIGHEST)

    def roots(stats: list) -> list:
        out = []
        for (_, _, left, right, _), (sl, sr, pl, pr) in zip(groups, stats):
            exponent = 2 * (int(left) + int(right))
            out.append((inverse_root(sl, exponent, cfg.matrix_eps, cfg.mesh) if left else pl,
                        inverse_root(sr, exponent, cfg.matrix_eps, cfg.mesh) if right else pr))
        return out

    stats = [tuple(g[1:]) for g in groups.values()]
    new_roots = jax.lax.cond(ctx.refresh, roots,
                             lambda stats: [(pl, pr) for _, _, pl, pr in stats], stats)
    for ((_, _, left, right, _), g), (pl, pr) in zip(groups.items(), new_roots):
        d = g[0]
        if left:
            d = jnp.matmul(pl, d, precision=_HIGHEST)
        if right:
            d = jnp.matmul(d, pr, precision=_HIGHEST)
        g[3:] = [pl, pr]
        g.append(d)
    return groups


def graft(d: Array, direction: Array, axes: Optional[tuple]) -> Array:
    """``||direction|| / ||d||`` (over ``axes``; ``None``: all), in ``d``'s dtype."""
    d_norm = jnp.sqrt(jnp.sum(abs_sq(d), axis=axes, keepdims=axes is not None))
    graft_norm = jnp.sqrt(jnp.sum(abs_sq(direction), axis=axes, keepdims=axes is not None))
    return (graft_norm / jnp.maximum(d_norm, _TINY_NORM)).astype(d.dtype)
