"""SOAP's per-leaf math: the layout, Adam in the eigenbasis, split and stacked leaves.

:func:`functrain.contrib.scale_by_soap` runs :func:`soap_leaf` on each leaf (or
:func:`soap_blocks` on a split or stacked leaf's blocks, batched per block shape, then
:func:`assemble`), and refreshes the bases with ``functrain.matrix.eigenbases``. Each is a
function of its inputs and the static :class:`Hyper` and :class:`Layout`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.matrix.blocks import (block_grid, block_groups, from_blocks, from_layer_blocks,
                                     gather_blocks, layer_block_groups, merged_shape,
                                     scatter_blocks, to_blocks, to_layer_blocks)
from functrain.matrix.dimension_numbers import LayerView, from_layers, stacked_shape, to_layers
from functrain.matrix.eigenbases import gram, rotate

__all__ = ["Layout", "layout", "matrix_shapes", "layers", "Hyper", "adam_b2", "finish",
           "soap_leaf", "soap_blocks", "assemble"]

Array = jax.Array

NORMALIZE_FLOOR = 1e-30  # the reference's floor under the update's RMS (normalize_grads)


# Per-leaf layout: the merged shape, which of its axes are rotated, its blocks

class Layout(NamedTuple):
    """How SOAP sees one leaf (all static)."""

    shape: tuple    # the shape the matrix math sees (axes merged or not)
    rotated: tuple  # per axis of ``shape``: whether it has a statistic and a basis
    grid: Optional[tuple] = None  # per axis of ``shape``, (blocks, length): a split leaf
    view: Optional[LayerView] = None  # a stacked leaf's layers (``shape``: one layer's)


def layout(shape: tuple, max_dim: int, merge_dims: bool, precondition_1d: bool,
            block_size: Optional[int] = None) -> Layout:
    """Merge (``merge_dims``), then split the rotated axes longer than ``block_size``."""
    shape = tuple(shape)
    if len(shape) == 0 or math.prod(shape) == 0:
        return Layout(shape, (False,) * len(shape))
    merged = merged_shape(shape, max_dim) if merge_dims else shape
    rotated = tuple(d <= max_dim and (len(shape) > 1 or precondition_1d) for d in merged)
    grid = block_grid(merged, block_size, split=rotated)
    return Layout(merged, rotated, grid if any(k > 1 for k, _ in grid) else None)


def matrix_shapes(lay: Layout) -> list:
    """The shapes of a leaf's statistics (and bases), one per axis; ``(1, 1)`` where the
    axis is not rotated."""
    if lay.grid is None:
        return [(d, d) if r else (1, 1) for d, r in zip(lay.shape, lay.rotated)]
    k = math.prod(k for k, _ in lay.grid)
    if lay.view is not None:  # stacked over the layer axes; (blocks, b, b) per layer if split
        lead = (k,) if k > 1 else ()
        return [stacked_shape(lay.view, lead + (b, b)) if r else (1, 1)
                for (_, b), r in zip(lay.grid, lay.rotated)]
    return [(k, b, b) if r else (1, 1) for (_, b), r in zip(lay.grid, lay.rotated)]


def layers(lay: Layout) -> int:
    """How many layers a stacked leaf holds."""
    return math.prod(lay.view.layers)


class Hyper(NamedTuple):
    """scale_by_soap's numbers and flags (its arguments of the same names)."""

    b1: Any
    b2: Any
    shampoo_beta: Any
    eps: Any
    precondition_frequency: int
    normalize_grads: bool
    correct_bias: bool


def adam_b2(count: Array, hp: Hyper, dtype: Any) -> tuple:
    """Adam's step number ``t``, ``b2`` at it and ``1 - prod b2`` (its bias correction)."""
    t = jnp.maximum(count, 1)
    if callable(hp.b2):
        return t, hp.b2(t), hp.b2.bias_correction(t)
    return t, hp.b2, 1 - hp.b2 ** t.astype(dtype)


def finish(n: Array, count: Array, hp: Hyper, layers: bool = False) -> Array:
    """A leaf's rotated-back direction ``n`` normalized, bias-corrected, zero on call 0
    (``layers``: ``n`` is a stack of layers, each normalized by its own RMS)."""
    t, _, c2 = adam_b2(count, hp, n.dtype)
    if hp.normalize_grads and layers:
        n = n / (NORMALIZE_FLOOR + jnp.sqrt(jnp.mean(jnp.square(n), axis=tuple(
            range(1, n.ndim)), keepdims=True)))
    elif hp.normalize_grads:
        n = n / (NORMALIZE_FLOOR + jnp.sqrt(jnp.mean(jnp.square(n))))
    if hp.correct_bias:
        n = n * (jnp.sqrt(c2) / (1 - hp.b1 ** t.astype(n.dtype)))
    return jnp.where(count == 0, jnp.zeros_like(n), n)


def soap_leaf(g: Array, mu: Array, nu: Array, stats: tuple, bases: tuple, count: Array,
               hp: Hyper, lay: Layout) -> tuple:
    """One SOAP step on one leaf (arrays in its compute dtype): ``(u, mu, nu, stats, bases)``
    before the refresh of the bases (and ``nu``'s order: :func:`refresh_bases`).

    ``count`` is the number of earlier calls: the first call (0) only sets the
    statistics and bases (zero update, moments untouched); afterwards Adam's
    step number is ``count``.
    """
    shape = g.shape
    g, mu, nu = (x.reshape(lay.shape) for x in (g, mu, nu))
    first = count == 0
    if any(lay.rotated):
        g_rot = rotate(g, bases, lay.rotated, back=False)
    else:
        g_rot = g
    b2 = adam_b2(count, hp, g.dtype)[1]
    new_mu = hp.b1 * mu + (1 - hp.b1) * g
    new_nu = b2 * nu + (1 - b2) * jnp.square(g_rot)
    direction = rotate(new_mu, bases, lay.rotated, back=False) / (jnp.sqrt(new_nu) + hp.eps)
    u = finish(rotate(direction, bases, lay.rotated, back=True), count, hp)
    mu = jnp.where(first, mu, new_mu)
    nu = jnp.where(first, nu, new_nu)

    if any(lay.rotated):
        # from zero statistics: (1 - beta) G G^T on the first call; a schedule (b2's when
        # shampoo_beta is None) at the statistics' own step, count + 1
        beta = hp.shampoo_beta(count + 1) if callable(hp.shampoo_beta) else hp.shampoo_beta
        stats = tuple(beta * s + (1 - beta) * gram(g, k) if on else s
                      for k, (s, on) in enumerate(zip(stats, lay.rotated)))
    return u.reshape(shape), mu.reshape(shape), nu.reshape(shape), stats, bases


def soap_blocks(g: Array, mu: Array, nu: Array, stats: tuple, bases: tuple, count: Array,
                 hp: Hyper, lay: Layout) -> list:
    """A split (or stacked) leaf's blocks through :func:`soap_leaf` (batched per block
    shape; no refresh, normalization or bias correction: :func:`assemble`): per group
    ``[idx, layout, u, mu, nu, stats, bases]``, rotated axes' matrices stacked ``(n, b, b)``.
    A stacked leaf's blocks are its layers' (all of layer 0, then layer 1, ...)."""
    inner = hp._replace(normalize_grads=False, correct_bias=False)
    on = [k for k, r in enumerate(lay.rotated) if r]
    if lay.view is None:
        padded = [to_blocks(x.reshape(lay.shape), lay.grid) for x in (g, mu, nu)]
        groups = block_groups(lay.shape, lay.grid)
    else:
        n = layers(lay)
        padded = [to_layer_blocks(to_layers(x, lay.view).reshape((n,) + lay.shape), lay.grid)
                  for x in (g, mu, nu)]
        stats, bases = (tuple(m.reshape((-1,) + m.shape[-2:]) if r else m
                              for m, r in zip(x, lay.rotated)) for x in (stats, bases))
        groups = layer_block_groups(n, lay.shape, lay.grid)
    out = []

    def with_(matrices: tuple, rotated: list) -> tuple:  # placeholders, blocks' matrices
        new = list(matrices)
        for k, m in zip(on, rotated):
            new[k] = m
        return tuple(new)

    for shape, idx in groups:
        blay = Layout(shape, lay.rotated)

        def step(g: Array, mu: Array, nu: Array, st: list, qs: list, blay: Layout = blay
                 ) -> tuple:
            u, mu, nu, st, _ = soap_leaf(g, mu, nu, with_(stats, st), with_(bases, qs), count,
                                          inner, blay)
            return u, mu, nu, [st[k] for k in on]

        cut = [[gather_blocks(m[k], idx, (shape[k],) * 2) for k in on] for m in (stats, bases)]
        u, m1, m2, st = jax.vmap(step)(*(gather_blocks(x, idx, shape) for x in padded), *cut)
        out.append([idx, blay, u, m1, m2, with_(stats, st), with_(bases, cut[1])])
    return [(padded, stats, bases)] + out


def assemble(parts: list, shape: tuple, count: Array, hp: Hyper, lay: Layout) -> tuple:
    """A split leaf's ``(u, mu, nu, stats, bases)`` from its refreshed block groups."""
    (padded, stats, bases), groups = parts[0], parts[1:]
    u, mu, nu = jnp.zeros_like(padded[0]), padded[1], padded[2]
    stats, bases = list(stats), list(bases)
    for idx, _, gu, gmu, gnu, gst, gq in groups:
        u, mu, nu = (scatter_blocks(a, idx, b) for a, b in ((u, gu), (mu, gmu), (nu, gnu)))
        for k, on in enumerate(lay.rotated):
            if on:
                stats[k] = scatter_blocks(stats[k], idx, gst[k])
                bases[k] = scatter_blocks(bases[k], idx, gq[k])
    if lay.view is None:
        u, mu, nu = (from_blocks(x, lay.shape, lay.grid).reshape(shape) for x in (u, mu, nu))
        return finish(u, count, hp), mu, nu, tuple(stats), tuple(bases)
    u, mu, nu = (from_layer_blocks(x, lay.shape, lay.grid) for x in (u, mu, nu))
    u = finish(u, count, hp, layers=True)
    stats, bases = (tuple(m.reshape(want) for m, want in zip(x, matrix_shapes(lay)))
                    for x in (stats, bases))
    return (*(from_layers(x, lay.view) for x in (u, mu, nu)), stats, bases)
