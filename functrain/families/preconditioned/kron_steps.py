"""PSGD Kron's step as named stages: plan, statistics, units and groups, refresh, precondition.

:func:`functrain.contrib.scale_by_kron` composes these, in this order, each step:

1. :func:`plan` (static, per leaf): the leaf's merged shape, its blocks and its factors'
   kinds (triangular or diagonal), or a stacked leaf's layers;
2. :func:`momentum` (the statistics): the bias-corrected momentum ``m`` and the array ``h``
   the preconditioner learns from;
3. :func:`cut_units` and :func:`chunk_groups`: every leaf, block or layer as a unit, and the
   units of one shape and factor structure stacked into groups of at most
   ``functrain.linalg.CHUNK_BYTES`` of factors;
4. :func:`refresh_groups`: each group's factors take one whitening step
   (:func:`functrain.matrix.kron_factors.whitening_step`) in a conditional of its own, on the
   step's one coin flip, with its slice of the one noise draw;
5. :func:`precondition_groups` and :func:`put_back_blocks`: ``P m`` per group, clipped per
   leaf (or layer), and the split leaves' blocks put back.

Each stage is a function of its inputs and the static :class:`KronConfig`, so it can be
called and tested on its own. The math on one group is :mod:`functrain.matrix.kron_factors`'.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from functrain import tree as ft
from functrain.linalg import CHUNK_BYTES, map_stacks
from functrain.matrix.blocks import (block_grid, block_groups, from_blocks, from_layer_blocks,
                                     gather_blocks, layer_block_groups, merged_shape,
                                     scatter_blocks, to_blocks, to_layer_blocks)
from functrain.matrix.dimension_numbers import (LayerView, from_layers, layer_views,
                                                stacked_shape, to_layers)
from functrain.matrix.kron_factors import (diagonal_axes, group_noise, precondition,
                                           whitening_step)
from functrain.matrix.shape_groups import leaf_order
from functrain.numerics import abs_sq, ema_update

__all__ = ["KronConfig", "Plan", "plan", "views_of", "factor_shapes", "init_factors",
           "check_factors", "momentum", "cut_units", "chunk_groups", "stacked_arrays",
           "refresh_groups",
           "precondition_groups", "put_back_blocks"]

Array = jax.Array


class KronConfig(NamedTuple):
    """scale_by_kron's static options (its arguments of the same names)."""

    owner: str
    b1: float
    normalize_grads: bool
    max_size_triangular: int
    max_skew_triangular: Optional[float]
    min_ndim_triangular: int
    memory_save_mode: Optional[str]
    momentum_into_precond_update: bool
    precond_lr: float
    precond_init_scale: Any
    update_clip_rms: Optional[float]
    precond_dtype: Any
    mesh: Any
    block_size: Optional[int]
    merge_dims: bool
    weight_dimension_numbers: Any


class Plan(NamedTuple):
    """How Kron sees one leaf (all static)."""

    shape: tuple            # the leaf's shape, its axes merged with merge_dims
    grid: Optional[tuple]   # per axis of ``shape``, (blocks, length); None: not split
    lead: tuple             # (number of blocks,) for a split leaf, else ()
    block: tuple            # a full-size block's shape (``shape`` when not split)
    kinds: tuple            # per axis of ``block``: True where its factor is diagonal
    view: Optional[LayerView] = None  # a stacked leaf's layers (``shape``: one layer's;
    #                                   ``grid`` set, all ones when not split)


def _kinds(cfg: KronConfig, shape: tuple) -> tuple:
    return diagonal_axes(shape, cfg.max_size_triangular, cfg.max_skew_triangular,
                         cfg.min_ndim_triangular, cfg.memory_save_mode)


def plan(cfg: KronConfig, shape: tuple, view: Optional[LayerView] = None) -> Plan:
    """Merge (``merge_dims``), then split the axes longer than ``block_size``.

    Args:
      cfg: the options.
      shape: the leaf's shape.
      view: a stacked leaf's layers, or ``None``.

    Returns:
      The leaf's :class:`Plan`.
    """
    shape = tuple(shape) if view is None else view.layer_shape
    merged = merged_shape(shape, cfg.max_size_triangular) if cfg.merge_dims else shape
    grid = block_grid(merged, cfg.block_size)
    if not any(k > 1 for k, _ in grid):
        return Plan(merged, None if view is None else grid, (), merged, _kinds(cfg, merged),
                    view)
    block = tuple(b for _, b in grid)
    return Plan(merged, grid, (math.prod(k for k, _ in grid),), block, _kinds(cfg, block),
                view)


def views_of(cfg: KronConfig, tree: Any, leaves: list) -> list:
    """Each leaf's layers (``weight_dimension_numbers``), or ``None`` per leaf.

    Args:
      cfg: the options.
      tree: the params or updates.
      leaves: its leaves.

    Returns:
      One ``LayerView`` or ``None`` per leaf.
    """
    if cfg.weight_dimension_numbers is None:
        return [None] * len(leaves)
    return layer_views(cfg.weight_dimension_numbers, tree, cfg.owner)


def factor_shapes(lay: Plan) -> list:
    """The shapes of a leaf's factors (stacked over blocks and layers).

    Args:
      lay: the leaf's plan.

    Returns:
      One shape per factor: ``(d,)`` diagonal, ``(d, d)`` triangular, ``()`` for a scalar.
    """
    return [stacked_shape(lay.view, lay.lead + ((d,) if diag else (d, d)))
            for d, diag in zip(lay.block, lay.kinds)] if lay.shape else [
                stacked_shape(lay.view, ())]


def init_factors(cfg: KronConfig, p: Any, lay: Plan) -> tuple:
    """A leaf's initial factors: ``precond_init_scale**(1/k)`` times identities.

    Args:
      cfg: the options.
      p: the parameter leaf.
      lay: its plan.

    Returns:
      A tuple of factors in the factors' dtype.
    """
    dtype = cfg.precond_dtype if cfg.precond_dtype is not None else ft.compute_dtype(p.dtype)
    s = cfg.precond_init_scale ** (1.0 / max(len(lay.shape), 1))
    base = [np.ones(fs) if diag else np.broadcast_to(np.eye(fs[-1]), fs)
            for fs, diag in zip(factor_shapes(lay), lay.kinds)]
    if isinstance(s, (int, float, np.number)):  # numpy: no kernel compiled per shape
        return tuple(jnp.asarray(s * b, dtype) for b in base)
    return tuple((s * jnp.asarray(b, dtype)).astype(dtype) for b in base)  # injected


def check_factors(owner: str, paths: list, gs: list, qs: list, lays: list) -> None:
    """Raise ``ValueError`` naming the leaf whose state's factors do not fit its plan.

    Args:
      owner: the transformation, for the message.
      paths: the leaves' key paths.
      gs: the updates' leaves.
      qs: the state's factors per leaf.
      lays: the leaves' plans.

    Returns:
      ``None``.
    """
    for where, g, q, lay in zip(paths, gs, qs, lays):
        want = factor_shapes(lay)
        got = [tuple(jnp.shape(x)) for x in q] if isinstance(q, (tuple, list)) else None
        if got != want:
            raise ValueError(f"{owner}: updates leaf {where} of shape {tuple(g.shape)} needs "
                             f"Kronecker factors of shapes {want}, but the state's .qs has "
                             f"{got}: was the state made by this transformation's init "
                             f"for these params?")


def momentum(cfg: KronConfig, gs: list, mus: list, qs: list, lays: list,
             correction: Array) -> tuple:
    """The statistics: each unit's compute dtype, new momentum, ``m`` and ``h``.

    Args:
      cfg: the options.
      gs, mus, qs: the gradients, momenta and factors (per leaf or stacked leaf).
      lays: their plans.
      correction: the momentum's bias correction ``1 - b1**t``.

    Returns:
      ``(cds, new_mus, ms, hs)``: compute dtypes, the momenta to store (in their dtype),
      the bias-corrected momenta, and what the preconditioner learns from.
    """
    cds, new_mus, ms, hs = [], [], [], []
    for g, mu, q, lay in zip(gs, mus, qs, lays):
        cd = ft.compute_dtype(jnp.promote_types(jnp.promote_types(g.dtype, mu.dtype),
                                                q[0].dtype))
        gc = g.astype(cd)
        if cfg.normalize_grads and lay.view is not None:  # each layer by its own norm
            gc = gc / (jnp.sqrt(jnp.sum(abs_sq(gc), axis=lay.view.perm[len(
                lay.view.layers):], keepdims=True)) + 1e-16)
        elif cfg.normalize_grads:
            gc = gc / (jnp.sqrt(jnp.sum(abs_sq(gc))) + 1e-16)
        new_mu = ema_update(gc, mu.astype(cd), cfg.b1)
        m = new_mu / correction.astype(new_mu.real.dtype)
        cds.append(cd)
        new_mus.append(new_mu.astype(mu.dtype))
        ms.append(m)
        hs.append(m if cfg.momentum_into_precond_update else gc)
    return cds, new_mus, ms, hs


def cut_units(cfg: KronConfig, qs: list, cds: list, lays: list, ms: list, hs: list) -> tuple:
    """Every leaf (in its merged shape), split leaf's blocks of one shape, or stacked leaf's
    layers' blocks as a unit: each is a leaf of its own to the math.

    Args:
      cfg: the options.
      qs, cds, lays, ms, hs: per leaf (or stacked leaf), as :func:`momentum` gives.

    Returns:
      ``(units, like, pieces)``: units ``(leaf, block indices or None, [m (, h)] stacked,
      factors stacked, noise positions, factor ranks)``; ``like``, one abstract array per
      leaf, layer or block in leaf, layer, then row-major block order (the noise is drawn in
      that order); ``pieces``, per split leaf, ``[plan, zero blocks, factors]`` to put the
      results back into.
    """
    units, like, pieces = [], [], {}
    for i, (q, cd, lay) in enumerate(zip(qs, cds, lays)):
        arrays = [ms[i], hs[i]][:1 if cfg.momentum_into_precond_update else 2]
        q = [x.astype(cd) for x in q]
        if lay.grid is None:
            arrays = [x.reshape(lay.shape) for x in arrays]
            units.append((i, None, [x[None] for x in arrays], [x[None] for x in q],
                          [len(like)], tuple(x.ndim for x in q)))
            like.append(jax.ShapeDtypeStruct(lay.shape, hs[i].dtype))
            continue
        if lay.view is None:
            padded = [to_blocks(x.reshape(lay.shape), lay.grid) for x in arrays]
            cut = block_groups(lay.shape, lay.grid)
        else:  # every layer's blocks, layer after layer; the factors likewise
            n = math.prod(lay.view.layers)
            padded = [to_layer_blocks(to_layers(x, lay.view).reshape((n,) + lay.shape),
                                      lay.grid) for x in arrays]
            q = [x.reshape((-1,) + x.shape[len(lay.view.layers) + len(lay.lead):]) for x in q]
            cut = layer_block_groups(n, lay.shape, lay.grid)
        first = len(like)
        pieces[i] = [lay, jnp.zeros_like(padded[0]), q]
        like += [None] * padded[0].shape[0]
        for shape, idx in cut:
            for j in idx:
                like[first + j] = jax.ShapeDtypeStruct(shape, hs[i].dtype)
            units.append((i, idx, [gather_blocks(x, idx, shape) for x in padded],
                          [gather_blocks(x, idx, (d,) * (x.ndim - 1))
                           for x, d in zip(q, shape or (1,))],
                          [first + j for j in idx], tuple(x.ndim - 1 for x in q)))
    return units, like, pieces


def chunk_groups(units: list, cds: list, same_shapes: bool = True) -> list:
    """Units of one shape, factor structure and compute dtype, in groups of at most
    ``CHUNK_BYTES`` of factors (float32 bytes; at least one unit): the refresh's ``d x d``
    products exist for one group at a time.

    Args:
      units: from :func:`cut_units`.
      cds: the leaves' compute dtypes.
      same_shapes: ``False`` gives every unit a group of its own (the per-leaf program).

    Returns:
      A list of groups, each a list of units.
    """
    groups: dict = {}
    for n, (i, _, arrays, _, _, ndims) in enumerate(units):
        gkey = (arrays[0].shape[1:], ndims, jnp.dtype(cds[i]))
        groups.setdefault(gkey if same_shapes else n, []).append(units[n])
    members = []
    for us in groups.values():
        per_matrix = 4 * sum(math.prod(x.shape[1:]) for x in us[0][3])
        cap = max(1, CHUNK_BYTES // max(1, per_matrix))
        chunk, held = [], 0
        for unit in us:
            if chunk and held + unit[3][0].shape[0] > cap:
                members.append(chunk)
                chunk, held = [], 0
            chunk.append(unit)
            held += unit[3][0].shape[0]
        members.append(chunk)
    return members


def _stack(xs: list) -> Array:
    return xs[0] if len(xs) == 1 else jnp.concatenate(xs)


def stacked_arrays(cfg: KronConfig, members: list) -> tuple:
    """Each group's factors, ``m`` and ``h``, stacked.

    Args:
      cfg: the options.
      members: from :func:`chunk_groups`.

    Returns:
      ``(stacked_q, stacked_m, stacked_h)``, one entry per group.
    """
    stacked_q = [[_stack(list(f)) for f in zip(*[u[3] for u in us])] for us in members]
    stacked_m = [_stack([u[2][0] for u in us]) for us in members]
    stacked_h = (stacked_m if cfg.momentum_into_precond_update
                 else [_stack([u[2][-1] for u in us]) for us in members])
    return stacked_q, stacked_m, stacked_h


def refresh_groups(cfg: KronConfig, members: list, units: list, like: list, grouping: Any,
                   leaves: int, noise_key: Array, do_update: Array, stacked_q: list,
                   stacked_h: list, max_gather_rows: int) -> list:
    """Each group's factors after one whitening step, taken where ``do_update``.

    Args:
      cfg: the options.
      members, units, like: from :func:`chunk_groups` and :func:`cut_units`.
      grouping: the same-shape leaf grouping (``functrain.matrix.shape_groups``).
      leaves: how many (stacked) leaves there are.
      noise_key: the step's noise key.
      do_update: the step's coin flip.
      stacked_q, stacked_h: from :func:`stacked_arrays`.
      max_gather_rows: the most rows of the gather that puts the noise in group order.

    Returns:
      The groups' factors (one conditional per group, the same predicate).
    """
    counts = [0] * leaves  # the noise in leaf order, each leaf's as without the grouping
    for u in units:
        counts[u[0]] += len(u[4])
    order = leaf_order(grouping, counts)
    in_leaf_order = [like[order.index(k)] for k in range(len(like))]
    noise_groups = [[order[j] for u in us for j in u[4]] for us in members]

    def refresh(k: int, q: list) -> list:  # group k's factors (the noise: its slice)
        v = group_noise(noise_key, in_leaf_order, noise_groups, max_gather_rows)[k]
        return map_stacks(lambda h, v, *q_lr: whitening_step(list(q_lr[:-1]), h, v, q_lr[-1]),
                          stacked_h[k], v, *q, mesh=cfg.mesh, shared=(cfg.precond_lr,))

    return [jax.lax.cond(do_update, functools.partial(refresh, k), lambda q: q, sq)
            for k, sq in enumerate(stacked_q)]


def precondition_groups(cfg: KronConfig, members: list, stacked_q: list, stacked_m: list,
                        gs: list, qs: list, pieces: dict) -> tuple:
    """``P m`` per group, clipped per leaf; split leaves' blocks left in ``pieces``.

    Args:
      cfg: the options.
      members: from :func:`chunk_groups`.
      stacked_q, stacked_m: the groups' (refreshed) factors and momenta.
      gs, qs: the (stacked) leaves' gradients and stored factors (shapes and dtypes).
      pieces: from :func:`cut_units`; each split leaf's blocks are appended to it.

    Returns:
      ``(out, new_qs)``: per leaf its update and factors, ``None`` for split leaves.
    """
    out, new_qs = [None] * len(gs), [None] * len(gs)
    for us, sq, m in zip(members, stacked_q, stacked_m):
        u = map_stacks(lambda m, *q: precondition(list(q), m), m, *sq, mesh=cfg.mesh)
        if cfg.update_clip_rms is not None:  # divided per leaf, after the slice
            rms = jnp.sqrt(jnp.mean(abs_sq(u), axis=tuple(range(1, u.ndim))))
            clip = jnp.maximum(1, rms / cfg.update_clip_rms)
        at = 0
        for i, idx, _, _, virtual, _ in us:
            n = len(virtual)
            if idx is not None:  # blocks of a split leaf: put back below
                pieces[i].append((idx, u[at:at + n], [s[at:at + n] for s in sq]))
            else:
                ui = u[at] if cfg.update_clip_rms is None else u[at] / clip[at]
                out[i] = ui.reshape(gs[i].shape).astype(gs[i].dtype)
                new_qs[i] = tuple(s[at].astype(x.dtype) for s, x in zip(sq, qs[i]))
            at += n
    return out, new_qs


def put_back_blocks(cfg: KronConfig, pieces: dict, gs: list, qs: list, out: list,
                    new_qs: list) -> None:
    """Split leaves' updates and factors from their blocks, clipped per leaf (or layer).

    Args:
      cfg: the options.
      pieces: from :func:`cut_units`, with :func:`precondition_groups`' blocks.
      gs, qs: the (stacked) leaves' gradients and stored factors.
      out, new_qs: :func:`precondition_groups`' lists, filled in place.

    Returns:
      ``None``.
    """
    clip_rms = cfg.update_clip_rms
    for i, (lay, ub, q, *parts) in pieces.items():
        for idx, ui, qi in parts:
            ub = scatter_blocks(ub, idx, ui)
            q = [scatter_blocks(a, idx, b) for a, b in zip(q, qi)]
        if lay.view is None:
            ui = from_blocks(ub, lay.shape, lay.grid).reshape(gs[i].shape)
            if clip_rms is not None:  # the whole leaf's RMS
                ui = ui / jnp.maximum(1, jnp.sqrt(jnp.mean(abs_sq(ui))) / clip_rms)
        else:
            ui = from_layer_blocks(ub, lay.shape, lay.grid)
            if clip_rms is not None:  # each layer's RMS
                ui = ui / jnp.maximum(1, jnp.sqrt(jnp.mean(abs_sq(ui), axis=tuple(
                    range(1, ui.ndim)), keepdims=True)) / clip_rms)
            ui = from_layers(ui, lay.view)
        out[i] = ui.astype(gs[i].dtype)
        new_qs[i] = tuple(a.reshape(x.shape).astype(x.dtype) for a, x in zip(q, qs[i]))
