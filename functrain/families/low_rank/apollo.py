"""APOLLO and APOLLO-Mini (Zhu et al., 2024): AdamW-like steps with SGD-like memory.

Adam's update divides each gradient entry by its own statistics; APOLLO approximates
that rescaling by one factor per channel (APOLLO) or per tensor (APOLLO-Mini), read off
an Adam that runs in a random low-rank projection of the gradient. Per weight matrix
``G`` (``m x n``): a Gaussian ``P`` of ``r`` rows (regenerated from a seed every
``update_proj_gap`` steps) projects ``G`` to ``R`` (``m x r`` or ``r x n``), Adam's
moments of ``R`` give ``N = mu / (sqrt(nu) + eps)``, and the full-rank step is ``G``
times the ratio of ``N``'s norm to ``R``'s, per channel or per tensor, with Fira's
norm-growth limiter. The state is the two low-rank moments: ``2 r max(m, n)`` numbers
instead of AdamW's ``2 m n``. optax does not have it.

The projection is never stored: it is drawn from ``seed``, the leaf's position in the
tree and the step count, so the state is built from the params' shapes alone and two runs
give the same numbers. The step is a whole-tree transformation (the Gaussian's key needs
the leaf's position); the per-matrix math is in small functions below, on the stacks of
matrices that ``functrain.matrix.dimension_numbers`` makes of each leaf.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from functrain import tree as ft
from functrain.arg_checks import (check_betas, check_nonnegative, check_positive, check_range,
                                  check_state_type, state_mismatch_error)
from functrain.declarations import declare_optimizer, hyperparameters, state_value_kinds
from functrain.matrix.dimension_numbers import (MuonDimensionNumbers, dims_of_slots, is_dims,
                                                leaf_axes, matrix_view)
from functrain.engine.program import chain, leaf_compute_dtype, state_compute_dtype
from functrain.engine.protocol import (GradientTransformation, MaskOrFn, Params, ScalarOrSchedule,
                                       Updates)
from functrain.engine.stage import as_array
from functrain.engine.counts import BiasCorrections, corrections
from functrain.numerics import abs_sq, adam_direction, ema_update
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.docstrings import shared_args

Array = jax.Array
PyTree = Any

__all__ = ["ApolloState", "scale_by_apollo", "apollo", "apollo_mini"]

# The official code's constants: the floor of the norms' quotients (its 1e-8).
RATIO_EPS = 1e-8
SCALE_TYPES = ("channel", "tensor")


@state_value_kinds(mu="signed", nu="unsigned", norm="keep")
class ApolloState(NamedTuple):
    """State of :func:`scale_by_apollo`.

    Attributes:
      count: the number of steps taken (int32).
      mu: per projected leaf, Adam's first moment of the projected gradient ``R``:
        ``batch + (m, r)`` when ``m >= n`` else ``batch + (r, n)`` (``m``: the output
        axes' size, ``n``: the reduction axes'; ``batch``: the other axes' sizes); per
        other leaf, Adam's first moment (params-shaped).
      nu: the second moments, shaped as ``mu`` (real for complex leaves).
      norm: per projected leaf, the norm-growth limiter's last norm of each matrix
        (shape ``batch``); an unused scalar for the other leaves (not a zero-size
        array, which Orbax cannot save).

    >>> import jax.numpy as jnp
    >>> state = scale_by_apollo(rank=2).init({'w': jnp.zeros((8, 6)), 'b': jnp.zeros(6)})
    >>> state.mu['w'].shape, state.mu['b'].shape, state.norm['w'].shape  # w: m=6 < n=8
    ((2, 8), (6,), ())
    """

    count: Array
    mu: Any
    nu: Any
    norm: Any


class _Plan(NamedTuple):
    """How one projected leaf is a stack of ``(m, n)`` matrices (all static)."""

    perm: tuple       # batch axes, output axes, reduction axes
    inverse: tuple
    permuted: tuple   # the leaf's shape after the transpose
    batch: tuple      # the batch axes' sizes
    m: int
    n: int
    rank: int
    right: bool       # m >= n: R = G P^T (m x r), one channel per row; else P^T G

    @property
    def low_shape(self) -> tuple:
        return self.batch + ((self.m, self.rank) if self.right else (self.rank, self.n))


def _plans(spec: Any, tree: PyTree, rank: int, owner: str) -> list:
    """Per leaf slot: ``None`` (placeholder or AdamW leaf) or the leaf's :class:`_Plan`."""
    name = "weight_dimension_numbers"
    slots = jax.tree_util.tree_leaves(tree, is_leaf=ft.is_placeholder)
    if spec is None:
        dims = [MuonDimensionNumbers(0, 1) if np.ndim(x) == 2 else None for x in slots]
    elif is_dims(spec):
        dims = [spec if np.ndim(x) >= 2 else None for x in slots]
        dims_of_slots(spec, tree, owner, name)  # checks the axes' types
    else:
        dims = dims_of_slots(spec, tree, owner, name)
    plans = []
    for path, x, d in zip(ft.key_paths(tree), slots, dims):
        if ft.is_placeholder(x) or d is None:
            plans.append(None)
            continue
        shape = tuple(np.shape(x))
        if len(shape) < 2:
            raise ValueError(f"{owner}: {name} gives leaf {path} of shape {shape} matrix axes, "
                             f"but APOLLO projects arrays of 2 or more axes: give it None "
                             f"(AdamW).")
        red, out = leaf_axes(d, shape, path, owner)
        view = matrix_view(shape, out, red)  # rows: the output axes (torch's (out, in))
        batch, m, n = view.sizes
        plans.append(_Plan(view.perm, tuple(int(i) for i in np.argsort(view.perm)),
                           tuple(shape[a] for a in view.perm),
                           tuple(shape[a] for a in view.perm[:len(shape) - len(red + out)]),
                           m, n, min(rank, m, n), m >= n))
    return plans


def _projection(key: Array, plan: _Plan, dtype: Any) -> Array:
    """The Gaussian ``P`` of each matrix, variance ``1 / r``: ``(b, r, n)`` or ``(b, m, r)``."""
    b = math.prod(plan.batch)
    shape = (b, plan.rank, plan.n) if plan.right else (b, plan.m, plan.rank)
    p = jax.random.normal(key, shape, jnp.float32).astype(dtype)
    return p / math.sqrt(max(plan.rank, 1))


def _norm(x: Array, axes: tuple) -> Array:
    return jnp.sqrt(jnp.sum(abs_sq(x), axis=axes, keepdims=True))


@hyperparameters(static=("rank", "seed"), rank="number", update_proj_gap="number", scale="number",
                 b1="number", b2="decay", eps="number", norm_growth_limit="number or None",
                 seed="number")
@shared_args()
def scale_by_apollo(rank: int = 256, update_proj_gap: int = 200, scale: float = 1.0,
                    scale_type: str = "channel", b1: float = 0.9, b2: float = 0.999,
                    eps: float = 1e-6, *, norm_growth_limit: Optional[float] = 1.01,
                    scale_front: bool = False, seed: int = 0,
                    weight_dimension_numbers: Any = None,
                    mu_dtype: Optional[Any] = None) -> GradientTransformation:
    """Rescale updates by APOLLO's rule (Zhu et al., 2024, Algorithm 1; the official code).

    Per projected leaf, each matrix ``G`` (``m x n``, ``m``: the output axes, ``n``: the
    reduction axes), at step ``t`` (from 1), with ``r = min(rank, m, n)``:

    - ``P`` is ``normal(key, shape) / sqrt(r)`` in float32, ``shape = (r, n)`` if
      ``m >= n`` else ``(m, r)``, ``key = fold_in(fold_in(PRNGKey(seed), i), (t - 1) //
      update_proj_gap)`` (``i``: the leaf's position in the flattened tree, stacked
      matrices drawn together): a new projection every ``update_proj_gap`` steps.
    - ``R = G P^T`` if ``m >= n`` else ``P^T G``; ``mu = b1 mu + (1 - b1) R``, ``nu = b2 nu
      + (1 - b2) |R|**2``; ``N = mu / (sqrt(nu) + eps)`` (no bias correction here).
    - ``s = ||N|| / (||R|| + 1e-8)``: per channel (norms over the projected axis: one
      factor per row if ``m >= n``, per column otherwise) for ``scale_type='channel'``,
      over the matrix for ``'tensor'``; ``S = s G``.
    - Fira's norm-growth limiter, from step 2: ``S /= max(||S|| / (prev + 1e-8), gamma) /
      gamma`` with ``gamma = norm_growth_limit``, ``prev`` the last step's ``||S||``.
    - the update is ``sqrt(scale) S sqrt(1 - b2**t) / (1 - b1**t)`` (``sqrt(scale)``
      multiplies before the limiter with ``scale_front``).

    Every other leaf gets the official code's AdamW direction ``mu / (sqrt(nu) + eps)
    sqrt(1 - b2**t) / (1 - b1**t)`` (Adam with ``eps`` not bias-corrected).

    Where the paper and the official code (github.com/zhuhanqing/APOLLO) differ, this
    follows the code: the ``sqrt(scale)`` factor, the limiter's placement, ``eps`` and the
    bias corrections. Two choices of this port: the projection is drawn from the seed, the
    leaf's position and the step (the code draws it from a per-parameter seed chain), and
    ``rank`` is capped at ``min(m, n)`` (the code is not; a larger rank stores more than
    Adam). Reference: Zhu, Zhang, Cong, Liu, Park, Chandra, Long, Pan, Wang & Lee, 2024,
    "APOLLO: SGD-like Memory, AdamW-level Performance" (arXiv:2412.05270).

    Args:
      rank: the projection's rank ``r``, a positive int (capped at ``min(m, n)``).
      update_proj_gap: draw a new projection every this many steps, ``>= 1``.
      scale: the update of projected leaves is multiplied by ``sqrt(scale)``, ``> 0``.
      scale_type: ``'channel'`` (APOLLO) or ``'tensor'`` (APOLLO-Mini).
      <shared: b1>
      b2: decay rate of the second moment, in ``[0, 1)`` (or a decay schedule).
      eps: added to ``sqrt(nu)``, ``>= 0``.
      norm_growth_limit: the limiter's ``gamma`` (``> 1``), or ``None`` for no limiter.
      scale_front: apply ``sqrt(scale)`` before the limiter (the code's ``--scale_front``).
      seed: the projections' seed (an int).
      weight_dimension_numbers: which leaves are projected and their matrix axes:
        ``None`` (every 2-D leaf, axis 0 its input axis, axis 1 its output axis), one
        ``MuonDimensionNumbers`` (every leaf of 2 or more axes), a tree like the params
        with ``MuonDimensionNumbers`` or ``None`` (AdamW) at each leaf, or a function of
        the params returning one. Axes in neither group are batch axes (stacked layers).
      mu_dtype: storage dtype of the first moments; ``None``: each parameter's.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ApolloState`.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_apollo(rank=1, scale_type='tensor')
    >>> g = {'w': jnp.ones((4, 3))}
    >>> u, state = tx.update(g, tx.init(g))
    >>> state.mu['w'].shape  # the rank-1 moments of the 3 x 4 matrix (output x input axes)
    (1, 4)
    >>> bool(jnp.all(u['w'] == u['w'][0, 0]))  # one factor for the whole gradient
    True
    """
    owner = "scale_by_apollo"
    if not isinstance(rank, (int, np.integer)) or isinstance(rank, bool):
        raise TypeError(f"{owner}: rank must be an int, got {type(rank).__name__}.")
    check_positive(owner, rank=rank, scale=scale)
    check_range("update_proj_gap", update_proj_gap, 1.0, owner=owner)
    check_betas(owner, b1=b1, b2=b2)
    check_nonnegative(owner, eps=eps)
    if scale_type not in SCALE_TYPES:
        raise ValueError(f"{owner}: scale_type must be one of {SCALE_TYPES}, got "
                         f"{scale_type!r}.")
    if norm_growth_limit is not None:
        check_range("norm_growth_limit", norm_growth_limit, 1.0, owner=owner)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise TypeError(f"{owner}: seed must be an int, got {type(seed).__name__}.")
    spec = weight_dimension_numbers
    root = math.sqrt(scale)

    def init_fn(params: Params) -> ApolloState:
        plans = _plans(spec, params, rank, owner)
        slots, treedef = jax.tree_util.tree_flatten(params, is_leaf=ft.is_placeholder)
        ft.check_leaf_dtypes(ft.key_paths(params), slots, [True] * len(slots), owner,
                             "params")
        mus, nus, norms = [], [], []
        for x, plan in zip(slots, plans):
            if ft.is_placeholder(x):
                mus.append(x), nus.append(x), norms.append(x)
                continue
            dtype = as_array(x).dtype
            real = np.zeros((), dtype).real.dtype
            shape = tuple(np.shape(x)) if plan is None else plan.low_shape
            mus.append(jnp.zeros(shape, dtype if mu_dtype is None else mu_dtype))
            nus.append(jnp.zeros(shape, real))
            norms.append(jnp.zeros(() if plan is None else plan.batch,
                                   ft.compute_dtype(real)))
        return ft.distinct_buffers(ApolloState(
            jnp.zeros([], jnp.int32), treedef.unflatten(mus), treedef.unflatten(nus),
            treedef.unflatten(norms)))

    def matrix_step(x: Array, mu: Array, nu: Array, prev: Array, key: Array, plan: _Plan,
                    ctx: BiasCorrections, first: Array) -> tuple:
        """One stack of matrices ``x`` (b, m, n): its update and new mu, nu, prev."""
        real = jnp.real(x).dtype
        p = _projection(key, plan, real)
        r_low = x @ jnp.swapaxes(p, -1, -2) if plan.right else jnp.swapaxes(p, -1, -2) @ x
        mu = ema_update(r_low, mu, b1)
        nu = ema_update(abs_sq(r_low), nu, ctx.b2)
        direction = adam_direction(mu, nu, None, None, eps)
        axes = ((-1,) if plan.right else (-2,)) if scale_type == "channel" else (-2, -1)
        s = x * (_norm(direction, axes) / (_norm(r_low, axes) + RATIO_EPS))
        if scale_front:
            s = s * root
        if norm_growth_limit is not None:
            size = _norm(s, (-2, -1))[:, 0, 0]
            limiter = jnp.where(first, 1.0, jnp.maximum(size / (prev + RATIO_EPS),
                                                        norm_growth_limit) / norm_growth_limit)
            s = s / limiter[:, None, None]
            prev = size / limiter
        if not scale_front:
            s = s * root
        return s, mu, nu, prev

    def update_fn(updates: Updates, state: ApolloState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, ApolloState]:
        del extra_args
        check_state_type(state, ApolloState, owner)
        slots, treedef = jax.tree_util.tree_flatten(updates, is_leaf=ft.is_placeholder)
        paths = ft.key_paths(updates)
        if params is not None:
            ft.check_structure(updates, params, "params", "updates")
            ps = treedef.flatten_up_to(params)
            ft.check_shapes(paths, ps, slots, "updates", "params")
        else:
            ps = [None] * len(slots)
        ft.check_leaf_dtypes(paths, slots, [True] * len(slots), owner, "updates")
        plans = _plans(spec, updates, rank, owner)
        fields = [ft.flatten_like(treedef, getattr(state, f), f"{owner} state .{f}", updates,
                                  "updates") for f in ("mu", "nu", "norm")]
        for path, g, plan, mu, nrm in zip(paths, slots, plans, fields[0], fields[2]):
            if ft.is_placeholder(g):
                continue
            want = (tuple(np.shape(g)) if plan is None else plan.low_shape,
                    () if plan is None else plan.batch)
            if (tuple(np.shape(mu)), tuple(np.shape(nrm))) != want:
                raise state_mismatch_error(
                    owner, f"updates leaf {path} needs moments of shape {want[0]} and a norm "
                    f"of shape {want[1]}, but the state has {tuple(np.shape(mu))} and "
                    f"{tuple(np.shape(nrm))}", "this transformation for these params")
        ctx, glob = corrections(b1, b2)({"count": state.count}, None)
        refresh = state.count // update_proj_gap
        base = jax.random.PRNGKey(seed)
        correction = jnp.sqrt(ctx.nu) / ctx.mu
        out, new = [], ([], [], [])
        for i, (g, p, plan, mu, nu, nrm) in enumerate(zip(slots, ps, plans, *fields)):
            if ft.is_placeholder(g):
                out.append(g)
                for lst, old in zip(new, (mu, nu, nrm)):
                    lst.append(old)
                continue
            g = as_array(g)
            cd = leaf_compute_dtype(g, None if p is None else as_array(p))
            x = g.astype(cd)
            real = jnp.real(jnp.zeros((), cd)).dtype  # nu and norm are real, also for complex
            mu_c, nu_c, nrm_c = (a.astype(state_compute_dtype(a, d))
                                 for a, d in ((mu, cd), (nu, real), (nrm, real)))
            if plan is None:
                mu_n, nu_n = ema_update(x, mu_c, b1), ema_update(abs_sq(x), nu_c, ctx.b2)
                u, nrm_n = adam_direction(mu_n, nu_n, None, None, eps), nrm_c
            else:
                b = math.prod(plan.batch)
                mat = jnp.transpose(x, plan.perm).reshape(b, plan.m, plan.n)
                low = (b,) + plan.low_shape[len(plan.batch):]
                key = jax.random.fold_in(jax.random.fold_in(base, i), refresh)
                u, mu_n, nu_n, nrm_n = matrix_step(
                    mat, mu_c.reshape(low), nu_c.reshape(low), nrm_c.reshape(b), key, plan,
                    ctx, state.count == 0)
                u = jnp.transpose(u.reshape(plan.permuted), plan.inverse)
                mu_n, nu_n = mu_n.reshape(mu.shape), nu_n.reshape(nu.shape)
                nrm_n = nrm_n.reshape(nrm.shape)
            out.append((u * correction).astype(g.dtype))
            for lst, old, val in zip(new, (mu, nu, nrm), (mu_n, nu_n, nrm_n)):
                lst.append(val.astype(old.dtype))
        return treedef.unflatten(out), ApolloState(glob["count"], *(treedef.unflatten(lst)
                                                                    for lst in new))

    return GradientTransformation(init_fn, update_fn)


_SIGNATURE_TAIL = "b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0, ...)"


@declare_optimizer("beyond optax", "Zhu et al., 2024", optax=None, stressed=True, summary=(
    "APOLLO (Zhu et al., 2024): the gradient scaled per channel by the ratio of an Adam step "
    "to the gradient in a random rank-`r` projection: SGD-like memory."),
    signature=f"apollo(learning_rate=1e-3, rank=256, update_proj_gap=200, scale=1.0, "
              f"scale_type='channel', {_SIGNATURE_TAIL}")
@hyperparameters(static=("rank", "seed"), learning_rate="schedule", rank="number",
                 update_proj_gap="number", scale="number", b1="number", b2="decay", eps="number",
                 weight_decay="schedule", norm_growth_limit="number or None", seed="number")
@shared_args()
def apollo(learning_rate: ScalarOrSchedule = 1e-3, rank: int = 256, update_proj_gap: int = 200,
           scale: float = 1.0, scale_type: str = "channel", b1: float = 0.9, b2: float = 0.999,
           eps: float = 1e-6, weight_decay: ScalarOrSchedule = 0.0,
           mask: Optional[MaskOrFn] = None, *, norm_growth_limit: Optional[float] = 1.01,
           scale_front: bool = False, seed: int = 0, weight_dimension_numbers: Any = None,
           mu_dtype: Optional[Any] = None, cautious_weight_decay: bool = False
           ) -> GradientTransformation:
    """APOLLO (Zhu et al., 2024): AdamW-level steps with SGD-like memory.

    Update rule: ``p -= learning_rate * (D + weight_decay * p)`` with ``D``
    :func:`scale_by_apollo`'s direction: for a projected weight, its gradient times the
    per-channel ratio of the norms of an Adam step and of the gradient, both in a random
    rank-``r`` projection redrawn every ``update_proj_gap`` steps, with Fira's norm-growth
    limiter and a ``sqrt(scale)`` factor; for the other leaves the official code's AdamW.
    The state of a projected ``m x n`` weight is ``2 r max(m, n)`` numbers (AdamW's: ``2 m
    n``). The defaults are the official code's (README: ``rank=256``, ``scale=1``,
    ``update_proj_gap=200``; its AdamW class: ``lr=1e-3``, ``eps=1e-6``; its scripts train
    with ``lr=1e-2``). Its weight decay multiplies the params after the step (``p = (p -
    lr D)(1 - lr wd)``); here, as ``adamw``, before (``p - lr (D + wd p)``): the two differ
    by ``lr**2 wd D``, nothing at the code's default ``weight_decay=0``.

    The code projects the attention and MLP weights and sends the embeddings and the
    output head to AdamW (its training script's choice); here every 2-D leaf is projected
    by default: pass ``weight_dimension_numbers`` to choose.

    Reference: Zhu, Zhang, Cong, Liu, Park, Chandra, Long, Pan, Wang & Lee, 2024, "APOLLO:
    SGD-like Memory, AdamW-level Performance" (arXiv:2412.05270); official code
    github.com/zhuhanqing/APOLLO.

    Args:
      <shared: learning_rate>
      rank: the projection's rank, a positive int (capped at each matrix's smaller side).
      update_proj_gap: draw a new projection every this many steps, ``>= 1``.
      scale: the projected leaves' updates are multiplied by ``sqrt(scale)``, ``> 0``.
      scale_type: ``'channel'`` (APOLLO) or ``'tensor'`` (APOLLO-Mini).
      <shared: b1, b2>
      eps: added to ``sqrt(nu)``, ``>= 0``.
      <shared: weight_decay>
      mask: which leaves get weight decay (a tree of bools or a function of params).
      norm_growth_limit: the norm-growth limiter's ``gamma`` (``> 1``), ``None``: off.
      scale_front: apply ``sqrt(scale)`` before the limiter.
      seed: the projections' seed.
      weight_dimension_numbers: which leaves are projected, as :func:`scale_by_apollo`.
      mu_dtype: storage dtype of the first moments.
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation``: ``chain(scale_by_apollo, add_decayed_weights,
      scale_by_learning_rate)``.

    >>> import jax.numpy as jnp
    >>> from functrain.contrib import apollo
    >>> opt = apollo(1e-2, rank=4)
    >>> params = {'w': jnp.zeros((16, 8)), 'b': jnp.zeros(8)}
    >>> state = opt.init(params)
    >>> state[0].mu['w'].shape  # 4 x 16 numbers per moment instead of 16 x 8
    (4, 16)
    >>> u, state = opt.update({'w': jnp.ones((16, 8)), 'b': jnp.ones(8)}, state, params)
    >>> print(round(float(u['b'][0]), 4))  # AdamW's first step on a vector
    -0.01
    """
    return chain(scale_by_apollo(rank, update_proj_gap, scale, scale_type, b1, b2, eps,
                                 norm_growth_limit=norm_growth_limit, scale_front=scale_front,
                                 seed=seed, weight_dimension_numbers=weight_dimension_numbers,
                                 mu_dtype=mu_dtype),
                 add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate))


@declare_optimizer("beyond optax", "Zhu et al., 2024", optax=None, stressed=True, summary=(
    "APOLLO-Mini (Zhu et al., 2024): APOLLO at rank 1 with one scaling factor per tensor: "
    "two numbers per row or column of each matrix."),
    signature=f"apollo_mini(learning_rate=1e-3, rank=1, update_proj_gap=200, scale=128.0, "
              f"{_SIGNATURE_TAIL}")
@hyperparameters(static=("rank", "seed"), learning_rate="schedule", rank="number",
                 update_proj_gap="number", scale="number", b1="number", b2="decay", eps="number",
                 weight_decay="schedule", norm_growth_limit="number or None", seed="number")
@shared_args()
def apollo_mini(learning_rate: ScalarOrSchedule = 1e-3, rank: int = 1,
                update_proj_gap: int = 200, scale: float = 128.0, b1: float = 0.9,
                b2: float = 0.999, eps: float = 1e-6, weight_decay: ScalarOrSchedule = 0.0,
                mask: Optional[MaskOrFn] = None, *, norm_growth_limit: Optional[float] = 1.01,
                scale_front: bool = False, seed: int = 0, weight_dimension_numbers: Any = None,
                mu_dtype: Optional[Any] = None, cautious_weight_decay: bool = False
                ) -> GradientTransformation:
    """APOLLO-Mini (Zhu et al., 2024): APOLLO with a rank-1 projection and tensor-wise scaling.

    Update rule: :func:`apollo` with ``scale_type='tensor'``: each projected weight's
    gradient ``G`` is multiplied by one factor, ``||N|| / ||R||`` (``R``: ``G`` projected
    to rank 1 by a Gaussian vector, ``N``: Adam's step on ``R``), limited by the
    norm-growth limiter and multiplied by ``sqrt(scale)``; the other leaves get the
    official code's AdamW. An ``m x n`` weight keeps ``2 max(m, n)`` numbers. The
    defaults are the official README's for APOLLO-Mini (``rank=1``, ``scale=128``; the
    130M script uses ``scale=192`` with ``scale_front=True``).

    Reference: Zhu et al., 2024, "APOLLO: SGD-like Memory, AdamW-level Performance"
    (arXiv:2412.05270); github.com/zhuhanqing/APOLLO.

    Args:
      <shared: learning_rate>
      rank: the projection's rank (1 for APOLLO-Mini).
      update_proj_gap: draw a new projection every this many steps, ``>= 1``.
      scale: the projected leaves' updates are multiplied by ``sqrt(scale)``, ``> 0``.
      <shared: b1, b2>
      eps: added to ``sqrt(nu)``, ``>= 0``.
      <shared: weight_decay>
      mask: which leaves get weight decay.
      norm_growth_limit: the norm-growth limiter's ``gamma`` (``> 1``), ``None``: off.
      scale_front: apply ``sqrt(scale)`` before the limiter.
      seed: the projections' seed.
      weight_dimension_numbers: which leaves are projected, as :func:`scale_by_apollo`.
      mu_dtype: storage dtype of the first moments.
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation``, :func:`apollo` with ``scale_type='tensor'``.

    >>> import jax.numpy as jnp
    >>> from functrain.contrib import apollo_mini
    >>> opt = apollo_mini(1e-2)
    >>> state = opt.init({'w': jnp.zeros((16, 8))})
    >>> state[0].mu['w'].shape, state[0].nu['w'].shape
    ((1, 16), (1, 16))
    """
    return apollo(learning_rate, rank, update_proj_gap, scale, "tensor", b1, b2, eps,
                  weight_decay, mask, norm_growth_limit=norm_growth_limit,
                  scale_front=scale_front, seed=seed,
                  weight_dimension_numbers=weight_dimension_numbers, mu_dtype=mu_dtype,
                  cautious_weight_decay=cautious_weight_decay)
