"""Shampoo: each weight matrix preconditioned by Kronecker factors ``L^{-1/4} G R^{-1/4}``.

:func:`scale_by_shampoo` is one per-leaf stage on functrain's engine: the two
statistics of one weight (``L = sum G G^H`` and ``R = sum G^H G``, or their
moving averages), their inverse roots (recomputed every
``precondition_frequency`` steps inside a ``lax.cond``, so changing the step
never recompiles), the preconditioned direction, its grafted per-layer norm,
and the momentum. Large dimensions are split into blocks, each preconditioned
apart; the blocks of one weight are batched (one ``eigh`` per side and leaf).
Leaves of rank 0 and 1, and matrices whose both dimensions exceed
``max_precond_dim``, take the diagonal (grafted) optimizer's step instead.

optax has no Shampoo: the numbers are checked against a float64 numpy version
of the papers' pseudo-code (tests/contrib/test_contrib_shampoo.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain import tree as ft
from functrain.matrix.blocks import (check_block_size, from_blocks, from_layer_blocks,
                                     to_blocks, to_layer_blocks)
from functrain.matrix.dimension_numbers import (LayerView, check_dimension_numbers,
                                                from_layers, layer_views, stacked_view,
                                                to_layers)
from functrain.matrix.shape_groups import group_key, shape_groups, stack_units, unstack_units
from functrain.families.preconditioned import shampoo_blocks as sb
from functrain.numerics import ema_update, nesterov_mu_hat
from functrain.declarations import declare_optimizer, hyperparameters, state_value_kinds
from functrain.engine.counts import corrections
from functrain.arg_checks import check_betas, check_bools, check_nonnegative, check_range
from functrain.engine.protocol import GradientTransformation, MaskOrFn, ScalarOrSchedule
from functrain.engine.stage import LeafChecks, LeafStage, as_array
from functrain.engine.program import chain, leaf_compute_dtype, run_block, state_compute_dtype
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.docstrings import shared_args

Array = jax.Array

_GRAFT_TYPES = ("adam", "adagrad", "sgd", None)
_FIELDS = ("mu", "nu", "stats_l", "stats_r", "precond_l", "precond_r")


@state_value_kinds(mu="signed", nu="unsigned", stats_l="matrix", stats_r="matrix",
                   precond_l="symmetric", precond_r="symmetric")
class ShampooState(NamedTuple):
    """State of :func:`scale_by_shampoo`.

    Attributes:
      count: the number of steps taken (int32).
      mu: the momentum of the (grafted) update, a tree like the params.
      nu: the diagonal second moment of the grafted optimizer (Adam's moving
        average, or Adagrad's sum, also used by the diagonal fallback), a tree
        like the params; a ``(1,)`` placeholder per leaf with ``graft_type='sgd'``.
      stats_l: per leaf, the left statistics of each block, ``(blocks, b, b)``
        (at least float32); a ``(1,)`` placeholder where the rows get no
        preconditioner (not ``(0,)``: Orbax refuses to save zero-size arrays).
      stats_r: the right statistics, likewise for the columns.
      precond_l: the inverse roots of ``stats_l`` last computed (identity at
        first), same shapes.
      precond_r: those of ``stats_r``.

    >>> import jax.numpy as jnp
    >>> state = scale_by_shampoo().init({'w': jnp.zeros((3, 2)), 'b': jnp.zeros(2)})
    >>> state.stats_l['w'].shape, state.stats_r['w'].shape, state.stats_l['b'].shape
    ((1, 3, 3), (1, 2, 2), (1,))
    """

    count: Array
    mu: Any
    nu: Any
    stats_l: Any
    stats_r: Any
    precond_l: Any
    precond_r: Any


def _check_state_shapes(s: Any, shape: tuple, lay: Optional[sb.Layout],
                        view: Optional[LayerView]) -> None:
    want_l, want_r = sb.stat_shapes(lay, view)
    for name, want in (("stats_l", want_l), ("stats_r", want_r), ("precond_l", want_l),
                       ("precond_r", want_r)):
        got = tuple(getattr(s, name).shape)
        if got != want:
            raise ValueError(
                f"scale_by_shampoo state .{name} has shape {got} for a leaf of shape {shape}, "
                f"expected {want}: was the state made with another block_size, "
                f"max_precond_dim or weight_dimension_numbers?")


def _statistics_blocks(cfg: sb.Config, gs: list, ps: list, views: list, olds: list,
                       ctx: sb.Context) -> tuple:
    """Per leaf its diagonal direction and blocks, and the blocks of every group of one
    size stacked with their statistics and roots.

    Returns ``(leaves, stacked)``: per leaf ``(x, layout, direction, [mu, nu, sl, sr, pl,
    pr], group key, (start, count), layer view)``; per group key ``[blocks, L, R, P_L,
    P_R]`` stacked over the group's leaves.
    """
    leaves = []
    groups: dict = {}  # key -> [blocks, L, R, P_L, P_R]: lists over the group's leaves
    filled: dict = {}  # key -> blocks stacked so far
    for g, p, view, *old in zip(gs, ps, views, *olds):
        cd = leaf_compute_dtype(g, None if p is None else as_array(p))
        s = [o.astype(state_compute_dtype(o, cd)) for o in old]
        lay = sb.leaf_layout(cfg, g, view)
        x = g.astype(cd)
        direction, s[1] = sb.diagonal_direction(cfg, x, s[1], ctx)
        key = slot = None
        if lay is not None:
            # one dtype per group: a complex leaf never stacks with a real one
            key = (lay.br, lay.bc, lay.left, lay.right, jnp.result_type(x, s[2]))
            stats = s[2:]
            if view is None:
                blocks = to_blocks(x.reshape(lay.rows, lay.cols), sb.grid(lay))
            else:  # every layer's blocks, layer after layer
                blocks = to_layer_blocks(to_layers(x, view), sb.grid(lay))
                stats = [v.reshape((-1,) + v.shape[-2:]) if v.ndim > 1 else v for v in stats]
            blocks = blocks.astype(s[2].dtype)
            for lst, value in zip(groups.setdefault(key, [[] for _ in range(5)]),
                                  [blocks] + stats):
                lst.append(value)
            slot = (filled.get(key, 0), blocks.shape[0])
            filled[key] = slot[0] + slot[1]
        leaves.append((x, lay, direction, s, key, slot, view))
    stacked = {key: [jnp.concatenate(lst) if len(lst) > 1 else lst[0] for lst in members]
               for key, members in groups.items()}
    return leaves, stacked


def _directions(cfg: sb.Config, leaves: list, done: dict, gs: list, olds: list,
                ctx: sb.Context) -> tuple:
    """Each leaf's preconditioned (grafted) direction through the momentum: ``(updates,
    new state fields)``."""
    out, new = [], [[] for _ in _FIELDS]
    for (x, lay, direction, s, key, slot, view), g, old in zip(leaves, gs, zip(*olds)):
        u = direction
        if lay is not None:
            start, count = slot
            part = [a[start:start + count] for a in done[key]]
            s[2:] = [part[k].reshape(s[k + 1].shape) if on else s[k + 1] for k, on in
                     ((1, lay.left), (2, lay.right), (3, lay.left), (4, lay.right))]
            if view is None:
                d = from_blocks(part[5], (lay.rows, lay.cols), sb.grid(lay))
                d = d.reshape(x.shape).astype(x.dtype)
                if cfg.graft_type is not None:
                    d = d * sb.graft(d, direction, None)
            else:  # each layer grafted to its own norm
                d = from_layer_blocks(part[5], (lay.rows, lay.cols), sb.grid(lay))
                d = d.astype(x.dtype)
                if cfg.graft_type is not None:
                    d = d * sb.graft(d, to_layers(direction, view), tuple(range(1, d.ndim)))
                d = from_layers(d, view)
            u = jnp.where(ctx.precondition, d, direction)
        s[0] = ema_update(u, s[0], cfg.b1)
        o = (nesterov_mu_hat(u, s[0], cfg.b1, ctx.mu, ctx.next_mu) if cfg.nesterov
             else s[0] / ctx.mu)
        out.append(o.astype(g.dtype))
        for lst, n, o_ in zip(new, s, old):
            lst.append(n.astype(o_.dtype))
    return out, new


@hyperparameters(static=("block_size", "max_precond_dim", "mesh", "weight_dimension_numbers",
                 "group_same_shapes"), b1="number", b2="number", eps="number", matrix_eps="number",
                 block_size="number or None", max_precond_dim="number",
                 precondition_frequency="number", start_preconditioning_step="number")
@shared_args()
def scale_by_shampoo(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-10,
                     matrix_eps: float = 1e-6, *, block_size: Optional[int] = 128,
                     max_precond_dim: int = 4096, precondition_frequency: int = 1,
                     start_preconditioning_step: int = 5, graft_type: Optional[str] = "adam",
                     nesterov: bool = True, mu_dtype: Optional[Any] = None,
                     mesh: Optional[jax.sharding.Mesh] = None,
                     weight_dimension_numbers: Any = None,
                     group_same_shapes: bool = False) -> GradientTransformation:
    """Shampoo's preconditioned, grafted, momentum direction (Gupta et al., 2018; Anil et al., 2020).

    Per leaf viewed as a matrix ``G`` (``prod(shape[:-1]) x shape[-1]``), and
    per block of it, at step ``t``::

        L = b2 L + w G G^H;   R = b2 R + w G^H G          (w = 1 - b2, or 1 if b2 == 1)
        every precondition_frequency steps from start_preconditioning_step:
            P_L = (L + matrix_eps lambda_max(L) I)^(-1/4), likewise P_R  (eigh, >= float32)
        D = P_L G P_R
        g_graft = the diagonal optimizer's step: Adam's g / (sqrt(nu / (1 - b2^t)) + eps),
                  Adagrad's g / (sqrt(sum g^2) + eps), or SGD's g
        u = D ||g_graft||_F / ||D||_F   (the whole leaf's norms; t < start: u = g_graft)
        m = b1 m + (1 - b1) u;  out = m / (1 - b1^t)   (or Nesterov's look-ahead)

    A side whose dimension exceeds ``max_precond_dim`` gets no preconditioner
    (identity) and the other side's root becomes ``-1/2`` (``-1/(2k)`` for
    ``k`` preconditioned sides, as in the paper for order-``k`` tensors).
    Leaves of rank 0 or 1, and matrices with neither side preconditioned, take
    ``u = g_graft`` at every step (with ``graft_type=None``: Adagrad's). A
    dimension longer than ``block_size`` is split into ``k = ceil(d /
    block_size)`` blocks of ``ceil(d / k)`` (the last one zero-padded, which
    changes no number); each block of the weight has its own ``L`` and ``R``.

    Defaults follow Anil et al.'s distributed Shampoo reference
    (google-research/scalable_shampoo): ``b1=0.9``, ``b2=0.999`` (moving
    averages of the statistics; ``b2=1`` gives the original Shampoo's sums),
    ``eps=1e-10`` (its ``diagonal_epsilon``), ``matrix_eps=1e-6`` (its
    relative ``matrix_epsilon``), ``block_size=128`` (its recommended value),
    ``max_precond_dim=4096`` (its ``skip_preconditioning_dim_size_gt``),
    ``precondition_frequency=1`` (its ``preconditioning_compute_steps``),
    ``start_preconditioning_step=5`` and Nesterov momentum. Two choices differ,
    so that a learning rate tuned for Adam carries over: grafting defaults to
    Adam's norm (the reference's default is SGD's; the paper grafts from
    AdaGrad/Adam), and the momentum is a bias-corrected moving average (the
    reference's ``moving_average_for_momentum=True``, plus Adam's correction).

    References: Gupta, Koren & Singer, 2018, "Shampoo: Preconditioned
    Stochastic Tensor Optimization"; Anil, Gupta, Koren, Regan & Singer, 2020,
    "Scalable Second Order Optimization for Deep Learning".

    Args:
      b1: the momentum's decay, in ``[0, 1)``.
      b2: the statistics' decay (and Adam grafting's), in ``[0, 1]``; ``1``
        sums them (then ``graft_type`` may not be ``'adam'``).
      eps: added to the diagonal optimizer's root (grafting and fallback).
      matrix_eps: the ridge of the inverse roots, relative to each block's
        largest eigenvalue, ``>= 0``.
      block_size: the largest block along a dimension, an integer ``>= 1``
        (:func:`functrain.matrix.blocks.block_grid`); ``None``: no blocks.
      max_precond_dim: a matrix dimension above this gets no preconditioner.
      precondition_frequency: recompute the inverse roots every this many
        steps (``>= 1``), counted from ``start_preconditioning_step``.
      start_preconditioning_step: the first step (1-based) that uses Shampoo's
        direction; earlier steps take the grafted optimizer's (``>= 1``).
      graft_type: whose per-layer norm the update takes: ``'adam'``,
        ``'adagrad'``, ``'sgd'`` (the gradient's norm), or ``None`` (no
        grafting: Shampoo's own step size).
      nesterov: use Nesterov's look-ahead momentum.
      <shared: mu_dtype>
      mesh: a ``jax.sharding.Mesh``: each refresh's ``eigh`` calls are divided
        over all of its devices (each device decomposes its share of the
        blocks, then the roots are gathered), as distributed Shampoo does;
        the same numbers as one device. ``None``: every device computes every
        block.
      weight_dimension_numbers: stacked layers (a scanned model's ``(layers, m, n)``
        weights): ``MuonDimensionNumbers(reduction_axis, output_axis)``
        (:class:`functrain.contrib.MuonDimensionNumbers`), one for every leaf, a tree of
        them (``None`` entries) or a function of the params. A leaf given them is a stack
        of separate ``rows x cols`` matrices (the reduction and the output axes
        multiplied together), one per entry of its other (layer) axes, each with its
        own blocks, statistics and grafted norm: the same numbers as those layers passed
        as leaves of their own, the statistics stacked over the layer axes (``(layers,
        blocks, b, b)``), all layers' blocks batched with the tree's
        (``functrain.matrix.dimension_numbers``). ``None``: every leaf as it is.
      group_same_shapes: run same-shape leaves as one stacked leaf, the state kept per
        leaf: the same numbers, fewer computations, but on XLA:CPU no shorter compile
        (``functrain.matrix.shape_groups``). ``False`` (default): per leaf.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ShampooState`.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_shampoo(b1=0.0, b2=1.0, start_preconditioning_step=1, graft_type=None)
    >>> g = {'w': jnp.array([[2., 0.], [0., 1.]])}
    >>> u, state = tx.update(g, tx.init(g))
    >>> print(jnp.round(jnp.diag(u['w']), 3))  # (G G^T)^(-1/4) G (G^T G)^(-1/4) = I
    [1. 1.]
    """
    owner = "scale_by_shampoo"
    check_betas(owner, b1=b1)
    check_range("b2", b2, 0.0, 1.0, high_inclusive=True, owner=owner)
    check_nonnegative(owner, eps=eps, matrix_eps=matrix_eps)
    block_size = check_block_size(owner, block_size)
    check_dimension_numbers(weight_dimension_numbers, owner)
    _check_int(owner, "max_precond_dim", max_precond_dim, 1)
    check_range("precondition_frequency", precondition_frequency, 1.0, owner=owner)
    check_range("start_preconditioning_step", start_preconditioning_step, 1.0, owner=owner)
    check_bools(owner, group_same_shapes=group_same_shapes)
    if graft_type not in _GRAFT_TYPES:
        raise ValueError(f"{owner}: graft_type must be one of {list(_GRAFT_TYPES)}, got "
                         f"{graft_type!r}.")
    if graft_type == "adam" and isinstance(b2, (int, float)) and b2 == 1:
        raise ValueError(f"{owner}: graft_type='adam' needs b2 < 1 (its moving average); "
                         f"with b2=1 (summed statistics) use graft_type='adagrad'.")
    uses_nu = graft_type != "sgd"
    bias = corrections(b1, b2 if graft_type == "adam" else None, nesterov=nesterov)
    cfg = sb.Config(b1, b2, eps, matrix_eps, graft_type, nesterov, mesh, block_size,
                    max_precond_dim)

    def prepare(glob: dict, updates: Any) -> tuple:
        bc, counted = bias(glob, updates)
        t = counted["count"]
        started = t >= start_preconditioning_step
        refresh = started & (jnp.mod(t - start_preconditioning_step,
                                     precondition_frequency) == 0)
        return sb.Context(bc.mu, bc.next_mu, bc.nu, refresh, started), counted

    def views_of(tree: Any, n: int) -> list:
        if weight_dimension_numbers is None:
            return [None] * n
        return layer_views(weight_dimension_numbers, tree, owner)

    def init_leaf(p: Any, view: Optional[LayerView] = None) -> tuple:
        sl, sr = sb.stat_shapes(sb.leaf_layout(cfg, p, view), view)
        sdt = jnp.promote_types(p.dtype, jnp.float32)
        nu = ft.zeros_like(p) if uses_nu else jnp.zeros((1,), p.dtype)

        def eye(shape: tuple) -> Array:
            if len(shape) == 1:
                return jnp.zeros(shape, sdt)
            return jnp.broadcast_to(jnp.eye(shape[-1], dtype=sdt), shape)

        return (ft.zeros_like(p, mu_dtype), nu, jnp.zeros(sl, sdt), jnp.zeros(sr, sdt),
                eye(sl), eye(sr))

    shaped = ("mu", "nu") if uses_nu else ("mu",)
    # The engine's stage for init and for its input checks (structure, shapes, dtypes,
    # state type; its own arithmetic is the identity, left to XLA to drop). The math runs
    # over the whole tree so that same-size blocks of all leaves are batched.
    checks = LeafStage(
        name=owner, update_leaf=lambda g, s, p, ctx: (g, tuple(s)), state_cls=ShampooState,
        leaf_fields=_FIELDS, init_leaf=init_leaf,
        init_global=lambda: {"count": jnp.zeros([], jnp.int32)}, prepare=prepare,
        checks=LeafChecks(shaped_fields=shaped))

    def init_fn(params: Any) -> Any:
        if weight_dimension_numbers is None:
            return checks.init_state(params)
        # the engine calls init_leaf once per leaf, in order: each with its leaf's view
        views = iter(views_of(params, 0))
        return dataclasses.replace(checks, init_leaf=lambda p: init_leaf(p, next(views))
                                   ).init_state(params)

    def update_fn(updates: Any, state: Any, params: Any = None, **extra_args: Any) -> tuple:
        run_block((checks,), updates, (state,), params, extra_args)
        ctx, counted = prepare({"count": state.count}, updates)
        paths, gs, treedef = ft.flatten_with_paths(updates)
        ft.check_leaf_dtypes(paths, gs, [True] * len(gs), checks.name, "updates")
        gs = [as_array(g) for g in gs]
        views = views_of(updates, len(gs))
        ps = [None] * len(gs) if params is None else treedef.flatten_up_to(params)
        olds = [treedef.flatten_up_to(getattr(state, f)) for f in _FIELDS]
        for g, view, *old in zip(gs, views, *olds):
            _check_state_shapes(checks.leaf_state(old), tuple(g.shape),
                                sb.leaf_layout(cfg, g, view), view)
        # same-shape leaves as one stacked leaf (functrain.matrix.shape_groups)
        leaf_gs, leaf_olds = gs, olds
        grouping = shape_groups([group_key(g, p, *old, static=view) if group_same_shapes
                               else None for g, p, view, *old in zip(gs, ps, views, *olds)])
        views = [stacked_view(views[m[0]], gs[m[0]].shape, len(m),
                              sb.matrix_shape(gs[m[0]].shape))
                 for m in grouping.units]
        gs, ps = stack_units(grouping, gs), stack_units(grouping, ps)
        want = [sb.stat_shapes(sb.leaf_layout(cfg, g, v), v) for g, v in zip(gs, views)]
        olds = [stack_units(grouping, o, None if k == 0 or (k == 1 and uses_nu) else
                            [(1,) if k == 1 else w[k % 2] for w in want])
                for k, o in enumerate(olds)]
        leaves, stacked = _statistics_blocks(cfg, gs, ps, views, olds, ctx)
        done = sb.precondition_groups(cfg, stacked, ctx)
        out, new = _directions(cfg, leaves, done, gs, olds, ctx)
        new_state = ShampooState(counted["count"], *(
            treedef.unflatten(unstack_units(grouping, v, o)) for v, o in zip(new, leaf_olds)))
        return treedef.unflatten(unstack_units(grouping, out, leaf_gs)), new_state

    return GradientTransformation(init_fn, update_fn)


def _check_int(owner: str, name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{owner}: {name} must be an integer >= {low} (it sets the state's "
                         f"shapes, so it cannot be traced), got {value!r}.")


@declare_optimizer("beyond optax", "Gupta et al., 2018; Anil et al., 2020", optax=None,
                   stressed=True, summary=(
    "Shampoo (Gupta et al., 2018; Anil et al., 2020): `L^{-1/4} G R^{-1/4}`, blocked, grafted to "
    "Adam's per-layer norm, diagonal fallback."), signature=(
    "shampoo(learning_rate, b1=0.9, b2=0.999, ..., block_size=128, precondition_frequency=1, "
    "graft_type='adam')"))
@hyperparameters(static=("block_size", "max_precond_dim", "mesh", "weight_dimension_numbers",
                 "group_same_shapes"), learning_rate="schedule", b1="number", b2="number",
                 eps="number", matrix_eps="number", weight_decay="schedule",
                 block_size="number or None", max_precond_dim="number",
                 precondition_frequency="number", start_preconditioning_step="number")
@shared_args()
def shampoo(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
            eps: float = 1e-10, matrix_eps: float = 1e-6,
            weight_decay: ScalarOrSchedule = 0.0, mask: Optional[MaskOrFn] = None, *,
            block_size: Optional[int] = 128, max_precond_dim: int = 4096,
            precondition_frequency: int = 1, start_preconditioning_step: int = 5,
            graft_type: Optional[str] = "adam", nesterov: bool = True,
            mu_dtype: Optional[Any] = None,
            mesh: Optional[jax.sharding.Mesh] = None,
            weight_dimension_numbers: Any = None,
            group_same_shapes: bool = False,
            cautious_weight_decay: bool = False) -> GradientTransformation:
    """Shampoo (Gupta et al., 2018), as scaled by Anil et al. (2020): Kronecker-factored preconditioning.

    Update rule: ``p <- p - learning_rate * (s + weight_decay * p)`` with ``s``
    :func:`scale_by_shampoo`'s direction: per weight matrix ``G`` (each block
    of it), ``L^{-1/4} G R^{-1/4}`` with ``L = sum G G^H`` and ``R = sum G^H
    G`` (moving averages with ``b2 < 1``), taking the grafted optimizer's
    per-layer norm (Adam's by default), through momentum ``b1``. The weight
    decay is decoupled (AdamW's; Loshchilov & Hutter, 2019). Vectors and
    scalars take the grafted (Adam / Adagrad) step. See
    :func:`scale_by_shampoo` for the defaults (Anil et al.'s reference) and
    the two places they differ from it.

    References: Gupta, Koren & Singer, 2018, "Shampoo: Preconditioned
    Stochastic Tensor Optimization"; Anil, Gupta, Koren, Regan & Singer, 2020,
    "Scalable Second Order Optimization for Deep Learning".

    Args:
      learning_rate: the step size, a number or a schedule of the step count.
      b1: the momentum's decay, in ``[0, 1)``.
      b2: the statistics' (and Adam grafting's) decay, in ``[0, 1]``.
      eps: the diagonal optimizer's epsilon.
      matrix_eps: the inverse roots' ridge, relative to the largest eigenvalue.
      weight_decay: decoupled weight decay (multiplied by ``learning_rate``).
      mask: where to apply the weight decay: a tree (or prefix) of bools or a
        function of the params; ``None``: every leaf.
      block_size: the largest block along a dimension (``None``: no blocks).
      max_precond_dim: a matrix dimension above this gets no preconditioner.
      precondition_frequency: recompute the inverse roots every this many steps.
      start_preconditioning_step: the first step using Shampoo's direction.
      graft_type: ``'adam'``, ``'adagrad'``, ``'sgd'`` or ``None``.
      nesterov: Nesterov momentum.
      mu_dtype: storage dtype of the momentum.
      mesh: divide each refresh's decompositions over this mesh's devices
        (see :func:`scale_by_shampoo`).
      weight_dimension_numbers: stacked layers: each layer of a leaf given
        ``MuonDimensionNumbers`` is preconditioned as a leaf of its own (see
        :func:`scale_by_shampoo`); ``None``: every leaf as it is.
      group_same_shapes: run same-shape leaves as one stack (see
        :func:`scale_by_shampoo`).
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation`` whose state is ``(ShampooState, EmptyState,
      EmptyState)``.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.shampoo(1e-2)
    >>> params = {'w': jnp.ones((4, 3)), 'b': jnp.zeros(3)}
    >>> state = opt.init(params)
    >>> u, state = opt.update({'w': jnp.eye(4, 3), 'b': jnp.ones(3)}, state, params)
    >>> print(round(float(u['b'][0]), 4))  # Adam's first step, Nesterov's look-ahead
    -0.0147
    """
    check_range("weight_decay", weight_decay, 0.0, owner="shampoo")
    return chain(
        scale_by_shampoo(b1, b2, eps, matrix_eps, block_size=block_size,
                         max_precond_dim=max_precond_dim,
                         precondition_frequency=precondition_frequency,
                         start_preconditioning_step=start_preconditioning_step,
                         graft_type=graft_type, nesterov=nesterov, mu_dtype=mu_dtype,
                         mesh=mesh, weight_dimension_numbers=weight_dimension_numbers,
                         group_same_shapes=group_same_shapes),
        add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
        scale_by_learning_rate(learning_rate))


__all__ = ["ShampooState", "scale_by_shampoo", "shampoo"]
