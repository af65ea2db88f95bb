"""GaLore (Zhao et al., 2024): run an optimizer on low-rank projections of the gradients.

Each projected weight's gradient ``G`` (seen as an ``m x n`` matrix) is
multiplied by a projector ``P`` with ``rank`` orthonormal columns: the leading
left singular vectors of ``G`` when ``m >= n`` (``R = P^T G``, ``r x n``), else
the leading right ones (``R = G P``, ``m x r``). The base optimizer runs on
``R``, so its state is ``rank``-sized; its update ``N`` is projected back
(``P N`` or ``N P^T``) and scaled. ``P`` is recomputed from the SVD of the
current gradient every ``update_proj_gap`` steps (the first step included) and
kept in between.

The base optimizer sees a tree of a different shape from the params (the
projected leaves), so ``scale_by_galore`` is a whole-tree transformation
around it; the per-matrix math (the layout, the SVD, the two projections) is
in small per-array functions here, and the base optimizer's own stages still
run fused. Names, arguments, state and numbers are optax.contrib 0.2.8's: the
SVD is ``jnp.linalg.svd`` of the float32 gradient, as optax's, so both pick the
same singular vectors (an SVD fixes each vector only up to its sign).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp

from functrain.arg_checks import (check_range, check_state_type, check_transformation,
                                  state_mismatch_error)
from functrain.declarations import declare_optimizer, hyperparameters
from functrain import tree as ft
from functrain.families.adam.stages import scale_by_adam
from functrain.engine.protocol import (GradientTransformation, MaskOrFn, OptState, Params,
                                       ScalarOrSchedule, Updates, call_update)
from functrain.engine.counts import safe_increment
from functrain.engine.program import chain
from functrain.matrix.dimension_numbers import is_dims
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.docstrings import shared_args

Array = jax.Array
PyTree = Any

__all__ = ["GaLoreDimensionNumbers", "GaLoreState", "scale_by_galore", "galore"]


class GaLoreDimensionNumbers(NamedTuple):
    """Which axes of a weight form the rows and the columns of the matrix GaLore projects.

    A weight stored with more than two axes (attention projections as
    ``(embed, heads, head_dim)``) is transposed and reshaped to ``(prod of
    reduction axes, prod of output axes)`` for the projection and back after
    it. Every axis must be in exactly one of the two groups.

    Attributes:
      reduction_axis: the input axis or axes (the rows); default 0.
      output_axis: the output axis or axes (the columns); default 1.

    >>> GaLoreDimensionNumbers(reduction_axis=0, output_axis=(1, 2)).output_axis
    (1, 2)
    """

    reduction_axis: Union[Sequence[int], int] = 0
    output_axis: Union[Sequence[int], int] = 1


class GaLoreState(NamedTuple):
    """State of :func:`scale_by_galore` (optax's fields and order).

    Attributes:
      count: the number of steps taken (int32).
      base_optimizer_state: the base optimizer's state, for the projected
        (low-rank) shapes of projected leaves and the full shapes of the others.
      projector: the projector ``P`` of each projected leaf (``m x r`` or
        ``n x r``); a ``(0, 0)`` array for the others.

    >>> import jax.numpy as jnp, functrain
    >>> state = functrain.contrib.scale_by_galore(rank=2).init({'w': jnp.ones((6, 4))})
    >>> state.projector['w'].shape
    (6, 2)
    """

    count: Array
    base_optimizer_state: OptState
    projector: Any


class _Layout(NamedTuple):
    """How one leaf is seen as a matrix: permutation, matrix shape, which side P is on."""

    perm: tuple
    inverse: tuple
    permuted_shape: tuple
    rows: int
    cols: int
    rank: int
    left: bool  # P holds left singular vectors (rows >= cols)


def _axes(axes: Union[Sequence[int], int], ndim: int) -> tuple:
    return tuple(a % ndim for a in ((axes,) if isinstance(axes, int) else axes))


def _layout(shape: tuple, dims: GaLoreDimensionNumbers, rank: int, where: str) -> _Layout:
    """The matrix view of an array of ``shape`` under ``dims`` (errors name ``where``)."""
    ndim = len(shape)
    if ndim < 2:
        raise ValueError(f"scale_by_galore: leaf {where} has shape {shape}, but GaLore "
                         f"projects only arrays with 2 or more axes: give it None in "
                         f"weight_dimension_numbers.")
    rows_axes = _axes(dims.reduction_axis, ndim)
    cols_axes = _axes(dims.output_axis, ndim)
    if set(rows_axes) & set(cols_axes):
        raise ValueError(f"scale_by_galore: leaf {where}: reduction axes {rows_axes} and "
                         f"output axes {cols_axes} must be disjoint (shape {shape}).")
    if len(set(rows_axes) | set(cols_axes)) != ndim:
        raise ValueError(f"scale_by_galore: leaf {where}: every axis of shape {shape} must "
                         f"be a reduction or an output axis, got reduction {rows_axes} and "
                         f"output {cols_axes}.")
    perm = rows_axes + cols_axes
    inverse = tuple(sorted(range(ndim), key=lambda i: perm[i]))
    rows = math.prod(shape[a] for a in rows_axes)
    cols = math.prod(shape[a] for a in cols_axes)
    return _Layout(perm, inverse, tuple(shape[a] for a in perm), rows, cols,
                   min(rank, rows, cols), rows >= cols)


def _as_matrix(x: Array, lay: _Layout) -> Array:
    return jnp.transpose(x, lay.perm).reshape(lay.rows, lay.cols)


def _from_matrix(x: Array, lay: _Layout) -> Array:
    return jnp.transpose(x.reshape(lay.permuted_shape), lay.inverse)


def _shapes(lay: _Layout) -> tuple:
    """(projector shape, projected shape) of a leaf."""
    if lay.left:
        return (lay.rows, lay.rank), (lay.rank, lay.cols)
    return (lay.cols, lay.rank), (lay.rows, lay.rank)


def _new_projector(g2: Array, lay: _Layout, dtype: Any) -> Array:
    """The leading singular vectors of ``g2`` (float32 SVD), as ``P``'s columns."""
    u, _, vh = jnp.linalg.svd(g2.astype(jnp.float32), full_matrices=False)
    p = u[:, :lay.rank] if lay.left else vh[:lay.rank, :].T
    return p.astype(dtype)


def _project(g2: Array, projector: Array, lay: _Layout) -> Array:
    return projector.T @ g2 if lay.left else g2 @ projector


def _project_back(n: Array, projector: Array, lay: _Layout) -> Array:
    return projector @ n if lay.left else n @ projector.T


def _resolve_dims(spec: Any, tree: PyTree, paths: list, leaves: list, treedef: Any) -> list:
    """Per leaf: its ``GaLoreDimensionNumbers``, or ``None`` (not projected)."""
    if spec is None:
        return [GaLoreDimensionNumbers() if jnp.ndim(x) == 2 else None for x in leaves]
    if is_dims(spec):
        return [spec if jnp.ndim(x) >= 2 else None for x in leaves]
    if callable(spec):
        spec = spec(tree)
    try:
        dims = treedef.flatten_up_to(spec)
    except (ValueError, TypeError):
        raise ValueError(f"scale_by_galore: weight_dimension_numbers must be a "
                         f"GaLoreDimensionNumbers, a tree like the params with "
                         f"GaLoreDimensionNumbers or None at the leaves, or a function "
                         f"of the params returning one; its structure "
                         f"{jax.tree_util.tree_structure(spec)} does not fit the params' "
                         f"{treedef}.") from None
    for where, d in zip(paths, dims):
        if d is not None and not is_dims(d):
            raise TypeError(f"scale_by_galore: weight_dimension_numbers at leaf {where} must "
                            f"be a GaLoreDimensionNumbers or None, got {type(d).__name__}.")
    return dims


@hyperparameters(static=("rank",), rank="number", update_proj_gap="number", scale="number")
def scale_by_galore(rank: int = 128, update_proj_gap: int = 200, scale: float = 1.0,
                    base_optimizer: Optional[GradientTransformation] = None,
                    weight_dimension_numbers: Optional[Any] = None
                    ) -> GradientTransformation:
    """Run ``base_optimizer`` on GaLore's low-rank projections of the gradients (Zhao et al., 2024).

    Per projected leaf, seen as an ``m x n`` matrix ``G``: every
    ``update_proj_gap`` steps (from the first) ``P`` becomes the first
    ``r = min(rank, m, n)`` left singular vectors of ``G`` if ``m >= n``, else the
    right ones; ``R = P^T G`` (or ``G P``) goes to the base optimizer, whose
    update ``N`` comes back as ``scale * P N`` (or ``scale * N P^T``). Other
    leaves go to the base optimizer unprojected and come back unscaled.
    Reference: Zhao et al., 2024, "GaLore: Memory-Efficient LLM Training by
    Gradient Low-Rank Projection".

    The base optimizer gets no params (the projected shapes differ from
    theirs): use a gradient-only transformation (``scale_by_adam``, ...), and
    :func:`galore` 's ``weight_decay`` for weight decay.

    Args:
      rank: the projection's rank, a positive int (capped by each matrix's
        smaller side).
      update_proj_gap: recompute the projectors every this many steps, ``>= 1``.
      scale: multiplies the updates of projected leaves.
      base_optimizer: the transformation run on the projected gradients;
        ``None`` is ``scale_by_adam()``.
      weight_dimension_numbers: which leaves are projected, and how: ``None``
        (every 2-D leaf, rows = axis 0), one :class:`GaLoreDimensionNumbers`
        (every leaf with 2 or more axes), a tree like the params with
        ``GaLoreDimensionNumbers`` or ``None`` at the leaves, or a function of
        the params returning such a tree.

    Returns:
      A ``GradientTransformation`` whose state is :class:`GaLoreState`.
      Complex leaves that would be projected raise a ``TypeError`` (the SVD is
      taken in float32, as optax's); unprojected complex leaves are fine.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.scale_by_galore(rank=1, base_optimizer=functrain.identity())
    >>> g = {'w': jnp.array([[3., 0.], [0., 1.], [0., 0.]])}
    >>> tx.update(g, tx.init(g))[0]['w']
    Array([[3., 0.],
           [0., 0.],
           [0., 0.]], dtype=float32)
    """
    if base_optimizer is None:
        base_optimizer = scale_by_adam()
    check_transformation(base_optimizer, "scale_by_galore", "base_optimizer")
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise TypeError(f"scale_by_galore: rank must be an int, got {type(rank).__name__}.")
    if rank <= 0:
        raise ValueError(f"scale_by_galore: rank must be positive, got {rank}.")
    check_range("update_proj_gap", update_proj_gap, 1.0, owner="scale_by_galore")
    spec = weight_dimension_numbers

    def layouts(tree: PyTree) -> tuple:
        paths, leaves, treedef = ft.flatten_with_paths(tree)
        dims = _resolve_dims(spec, tree, paths, leaves, treedef)
        lays = [None if d is None else _layout(tuple(jnp.shape(x)), d, rank, where)
                for where, x, d in zip(paths, leaves, dims)]
        return paths, leaves, treedef, lays

    def init_fn(params: Params) -> GaLoreState:
        paths, leaves, treedef, lays = layouts(params)
        projectors, proxies = [], []
        for x, lay in zip(leaves, lays):
            x = jnp.asarray(x)
            if lay is None:
                projectors.append(jnp.zeros((0, 0), x.dtype))
                proxies.append(jnp.zeros_like(x))
            else:
                p_shape, r_shape = _shapes(lay)
                projectors.append(jnp.zeros(p_shape, x.dtype))
                proxies.append(jnp.zeros(r_shape, x.dtype))
        return GaLoreState(jnp.zeros([], jnp.int32),
                           base_optimizer.init(treedef.unflatten(proxies)),
                           treedef.unflatten(projectors))

    def update_fn(updates: Updates, state: GaLoreState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, GaLoreState]:
        check_state_type(state, GaLoreState, "scale_by_galore")
        if params is not None:
            ft.check_structure(updates, params, "params", "updates")
        paths, gs, treedef, lays = layouts(updates)
        ft.check_leaf_dtypes(paths, gs, [True] * len(gs), "scale_by_galore", "updates")
        olds = ft.flatten_like(treedef, state.projector, "scale_by_galore state .projector",
                               updates, "updates")
        refresh = state.count % update_proj_gap == 0
        low, projectors = [], []
        for where, g, old, lay in zip(paths, gs, olds, lays):
            g = jnp.asarray(g)
            if lay is None:
                low.append(g)
                projectors.append(old)
                continue
            if jnp.iscomplexobj(g):
                raise TypeError(f"scale_by_galore: leaf {where} is complex ({g.dtype}); "
                                f"GaLore's SVD projection is real only: give the leaf None "
                                f"in weight_dimension_numbers, or wrap the optimizer in "
                                f"split_real_and_imaginary.")
            expected = _shapes(lay)[0]
            if tuple(old.shape) != expected:
                raise state_mismatch_error(
                    "scale_by_galore", f"updates leaf {where} needs a projector of shape "
                    f"{expected}, but the state's has shape {tuple(old.shape)}",
                    "this transformation for these params")
            g2 = _as_matrix(g, lay)
            projector = jax.lax.cond(refresh, lambda: _new_projector(g2, lay, g.dtype),
                                     lambda: old.astype(g.dtype))
            low.append(_project(g2, projector, lay))
            projectors.append(projector)
        low_updates, base_state = call_update(base_optimizer, treedef.unflatten(low),
                                              state.base_optimizer_state, None, extra_args)
        out = []
        for g, n, projector, lay in zip(gs, treedef.flatten_up_to(low_updates), projectors,
                                        lays):
            if lay is None:
                out.append(n)
            else:
                full = _from_matrix(_project_back(n, projector, lay), lay)
                out.append((scale * full).astype(jnp.asarray(g).dtype))
        return treedef.unflatten(out), GaLoreState(safe_increment(state.count), base_state,
                                                   treedef.unflatten(projectors))

    return GradientTransformation(init_fn, update_fn)


@declare_optimizer("contrib", "Zhao et al., 2024", optax="contrib", stressed=True, summary=(
    "GaLore (Zhao et al., 2024): the base optimizer in a low-rank projection of each matrix's "
    "gradient."), signature="galore(learning_rate, rank, ...)")
@hyperparameters(static=("rank",), learning_rate="schedule", rank="number",
                 update_proj_gap="number", scale="number", weight_decay="schedule")
@shared_args()
def galore(learning_rate: ScalarOrSchedule, rank: int = 128, update_proj_gap: int = 200,
           scale: float = 1.0, base_optimizer: Optional[GradientTransformation] = None,
           weight_decay: ScalarOrSchedule = 0.0, mask: Optional[MaskOrFn] = None,
           weight_dimension_numbers: Optional[Any] = None, *,
           cautious_weight_decay: bool = False) -> GradientTransformation:
    """GaLore (Zhao et al., 2024): memory-efficient training by low-rank gradient projection.

    Update rule, per projected weight ``W`` (an ``m x n`` matrix, ``m >= n``; the
    other case projects from the right): every ``update_proj_gap`` steps ``P =
    U[:, :r]`` from the SVD of the gradient ``G``; ``N = base(P^T G)``;
    ``W -= lr * (scale * P N + weight_decay * W)``. Unprojected leaves (vectors,
    scalars) get ``base(G)`` in full. The base optimizer's state has the
    projected shapes: ``2 r n`` numbers for Adam instead of ``2 m n``.
    Reference: Zhao et al., 2024, "GaLore: Memory-Efficient LLM Training by
    Gradient Low-Rank Projection".

    Args:
      <shared: learning_rate>
      rank: the projection's rank, a positive int.
      update_proj_gap: recompute the projectors every this many steps, ``>= 1``.
      scale: multiplies the updates of projected leaves.
      base_optimizer: a gradient-only transformation for the projected
        gradients (not ``adamw``: it would need params); ``None`` is
        ``scale_by_adam()``. If it has its own learning rate, set
        ``learning_rate=1.0`` here.
      weight_decay: the decoupled weight decay, applied in the full parameter
        space, ``>= 0``; a number or a schedule.
      mask: where to apply the weight decay: a tree of bools (or a prefix), or
        a function of the params returning one; ``None`` decays every leaf.
      weight_dimension_numbers: which leaves are projected, and how (see
        :func:`scale_by_galore`).
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation``; its state is ``(GaLoreState, <weight decay
      state>, <learning rate state>)``.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda x: jnp.sum(jnp.square(x['w']))
    >>> opt = functrain.contrib.galore(learning_rate=0.01, rank=16)
    >>> params = {'w': jnp.ones((100, 100)), 'b': jnp.ones((100,))}
    >>> state = opt.init(params)
    >>> for _ in range(5):
    ...     updates, state = opt.update(jax.grad(f)(params), state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> print(f"{f(params):.2E}")
    9.90E+03
    """
    return chain(scale_by_galore(rank, update_proj_gap, scale, base_optimizer,
                                 weight_dimension_numbers),
                 add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate))
