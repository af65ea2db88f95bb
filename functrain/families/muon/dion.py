"""Dion (Ahn et al., 2025): low-rank orthonormalized updates, by one step of power iteration.

Per weight matrix, Dion keeps the momentum ``M`` (shaped like the weight) and a right
factor ``Q`` of rank ``r``. Each step adds the gradient to the momentum, ``B = M + G``;
one power-iteration step from ``Q`` gives an orthonormal left factor ``P = orth(B Q)``
and ``R = B^H P``; the part of ``B`` the update explains is taken out of the momentum
(error feedback: ``M <- B - (1 - mu) P R^H``); the new right factor is ``R`` with
normalized columns; the update is ``P Q^H``, scaled by ``sqrt(d_out / d_in)``.

A whole-tree transformation, not a ``LeafStage``: a leaf's momentum changes through
matrix work on the whole weight, and its ``Q`` is not shaped like it. The work matrices
of every leaf with the same shape are stacked: the matmuls run batched, the QR one matrix
at a time on CPU (:func:`functrain.linalg.map_matrices`), and with ``mesh`` each stack is
divided over the mesh's devices (:func:`functrain.linalg.map_stacks`, as
``muon(mesh=...)`` divides Newton-Schulz). The update checks structures, shapes and dtypes
first, naming the leaf, and follows functrain's dtype policy (16-bit leaves in float32).

This optimizer has no optax counterpart: arguments, defaults and conventions are those of
the authors' code (github.com/microsoft/dion, ``dion/dion.py``), tested against a numpy
transcription of the paper's Algorithm 1 with those conventions.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from functrain import jax_compat, tree as ft
from functrain.arg_checks import check_betas, check_nonnegative, check_range, check_state_type
from functrain.declarations import declare_optimizer, hyperparameters, state_value_kinds
from functrain.linalg import CHUNK_BYTES, map_matrices, map_stacks
from functrain.numerics import abs_sq
from functrain.families.adam.optimizers import adamw
from functrain.families.sign.optimizers import lion
from functrain.engine.protocol import (GradientTransformation, MaskOrFn, Params,
                                       ScalarOrSchedule, Updates)
from functrain.engine.program import chain, leaf_compute_dtype, state_compute_dtype
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.wrappers.masking import multi_transform
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["ScaleByDionState", "scale_by_dion", "dion"]

_OWNER = "scale_by_dion"


@state_value_kinds(mu="signed", q="signed")
class ScaleByDionState(NamedTuple):
    """State of :func:`scale_by_dion`: the momentum and the right factors.

    Attributes:
      mu: the momentum ``M``, a tree like the params.
      q: per leaf of shape ``(..., m, n)``, the right factor ``Q`` of shape
        ``(..., min(m, n), r)`` (one per matrix of a stack), in the leaf's dtype; at
        ``init`` standard normal entries drawn with ``jax.random.PRNGKey(seed)`` (the
        same key for every leaf: ``Q`` depends only on its shape, dtype and ``seed``).

    >>> import jax.numpy as jnp
    >>> state = scale_by_dion(rank=2).init({'w': jnp.zeros((8, 5))})
    >>> state.mu['w'].shape, state.q['w'].shape
    ((8, 5), (5, 2))
    """

    mu: Any
    q: Any


# --------------------------------------------------------------------------
# One leaf as a stack of work matrices
# --------------------------------------------------------------------------

class _View(NamedTuple):
    """How a leaf ``(..., m, n)`` is seen: work matrices ``A`` of ``(rows, cols)``, rows >= cols."""

    transposed: bool  # A is the leaf's transpose (n >= m: the output axis is the long one)
    rows: int
    cols: int
    rank: int


def _view(shape: tuple, rank: Union[int, float], multiple: int) -> _View:
    """The official code's orientation and rank for a weight ``x @ W`` of ``(d_in, d_out)``.

    The authors' torch weight is ``(d_out, d_in)``, transposed when ``d_out < d_in``: the
    orthonormalized factor ``P`` lies along the longer side, along ``d_out`` for a square
    one. Their rank: ``rank_fraction * min(m, n)`` rounded up to a multiple of
    ``rank_multiple_of``, at most ``min(m, n)``.
    """
    m, n = shape[-2:]
    transposed = n >= m
    rows, cols = (n, m) if transposed else (m, n)
    target = rank if isinstance(rank, int) else rank * cols
    return _View(transposed, rows, cols, min(multiple * math.ceil(target / multiple), cols))


def _q_shape(shape: tuple, view: _View) -> tuple:
    return tuple(shape[:-2]) + (view.cols, view.rank)


def _orthonormal(p: Array) -> Array:
    """The ``Q`` factor of one ``p`` (rows >= cols) whose ``R`` has a real diagonal >= 0.

    For ``p`` of full column rank this is the one orthonormal basis ``P`` with ``p = P T``,
    ``T`` upper triangular with a positive diagonal: the authors' randomized Cholesky QR
    returns it up to the signs of its columns, which leave Dion's update unchanged.
    """
    q, r = jnp.linalg.qr(p)
    d = jnp.diagonal(r)
    zero = d == 0
    return q * (jnp.where(zero, 1, d) / jnp.where(zero, 1, jnp.abs(d)))[None, :]


def _dion_stack(a: Array, q: Array, mu: Any, eps: Any) -> tuple:
    """Dion's step on a stack: ``a`` ``(k, rows, cols)`` holds ``B = M + G`` (work view), ``q``
    ``(k, cols, r)``. Returns ``(P Q_new^H, B - (1 - mu) P R^H, Q_new)``."""
    real = jnp.finfo(a.dtype).dtype
    mu, eps = jnp.asarray(mu).astype(real), jnp.asarray(eps).astype(real)
    p = map_matrices(_orthonormal, a @ q)
    r = jnp.conj(jnp.swapaxes(a, -1, -2)) @ p
    # A zero B (a first step with zero gradients): P = 0 and R = Q, as the authors' code.
    zero = jnp.all(a == 0, axis=(-2, -1), keepdims=True)
    p = jnp.where(zero, 0, jnp.nan_to_num(p))
    r = jnp.where(zero, q, jnp.nan_to_num(r))
    new_m = a - (1 - mu) * (p @ jnp.conj(jnp.swapaxes(r, -1, -2)))
    new_q = r / (jnp.sqrt(jnp.sum(abs_sq(r), axis=-2, keepdims=True)) + eps)
    return p @ jnp.conj(jnp.swapaxes(new_q, -1, -2)), new_m, new_q


# --------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------

def _check_rank(owner: str, rank: Any, rank_multiple_of: Any) -> Union[int, float]:
    """``rank`` as an ``int`` (a rank) or a ``float`` in ``(0, 1]`` (a fraction), checked."""
    if isinstance(rank_multiple_of, (bool, np.bool_)) or not isinstance(
            rank_multiple_of, numbers.Integral) or rank_multiple_of < 1:
        raise ValueError(f"{owner}: rank_multiple_of must be an integer >= 1 (it sets the "
                         f"state's shapes, so it cannot be traced), got {rank_multiple_of!r}.")
    if isinstance(rank, (bool, np.bool_)) or not isinstance(rank, numbers.Real):
        raise TypeError(f"{owner}: rank must be an int >= 1 (the rank) or a float in (0, 1] "
                        f"(a fraction of min(m, n)); it sets the state's shapes, so it cannot "
                        f"be traced. Got {type(rank).__name__} {rank!r:.40}.")
    if isinstance(rank, numbers.Integral):
        if rank < 1:
            raise ValueError(f"{owner}: rank must be an int >= 1 or a float in (0, 1], got "
                             f"{rank!r}.")
        return int(rank)
    if not 0 < float(rank) <= 1:
        raise ValueError(f"{owner}: rank as a float is a fraction of min(m, n) and must be in "
                         f"(0, 1], got {rank!r}; pass an int for a rank of its own.")
    return float(rank)


def _check_matrices(paths: list, leaves: list, what: str) -> None:
    for where, x in zip(paths, leaves):
        if np.ndim(x) < 2:
            raise ValueError(f"{_OWNER}: {what} leaf {where or '<root>'} has shape "
                             f"{np.shape(x)}, but Dion updates matrices (the last two axes; "
                             f"leading axes are a stack). dion() sends such leaves to its "
                             f"scalar optimizer; with scale_by_dion leave them out with "
                             f"functrain.masked.")


# --------------------------------------------------------------------------
# The transformations
# --------------------------------------------------------------------------

@hyperparameters(static=("rank", "rank_multiple_of", "seed", "mesh"), mu="number", eps="number",
                 seed="int")
@shared_args()
def scale_by_dion(rank: Union[int, float] = 1.0, mu: float = 0.95, eps: float = 1e-8, *,
                  rank_multiple_of: int = 1, seed: int = 0, mu_dtype: Optional[Any] = None,
                  mesh: Optional[jax.sharding.Mesh] = None) -> GradientTransformation:
    """Rescale updates by Dion: a low-rank orthonormalized momentum (Ahn et al., 2025).

    Update rule, per matrix of a leaf (the last two axes; leading axes are a stack), for a
    weight used as ``x @ W`` of ``(m, n) = (d_in, d_out)``, seen as ``A`` (``W`` or, when
    ``n >= m``, ``W^T``, so that ``A`` has at least as many rows as columns)::

        B = M + G                          (work view of the momentum plus gradient)
        P = orth(B Q)                      (QR, R's diagonal >= 0)
        R = B^H P
        M <- B - (1 - mu) P R^H            (error feedback)
        Q <- R / (||R[:, j]|| + eps)       (column-normalized)
        u = sqrt(n / m) P Q^H              (= sqrt(d_out / d_in); back in W's orientation)

    ``Q`` has ``r`` columns: ``rank`` itself (an int) or ``ceil(rank * min(m, n))`` (a float
    fraction), rounded up to a multiple of ``rank_multiple_of``, at most ``min(m, n)``. A
    matrix with ``B = 0`` gets ``P = 0`` and ``R = Q``.

    Where the paper (Algorithm 1) and the authors' code differ, this follows the code: the
    transposed orientation above (the paper always multiplies ``B Q``); ``eps`` in the
    column normalization; the zero-``B`` rule; and its orthonormalization, whose default
    (randomized Cholesky QR) equals a QR decomposition's ``Q`` up to column signs, which
    leave the update unchanged: Householder QR here, its ``R``'s diagonal made
    non-negative, so that ``Q``'s signs are determined (and a rank-deficient ``B Q`` is
    still orthonormalized). ``Q`` starts as standard normal entries from
    ``jax.random.PRNGKey(seed)`` (the code draws ``torch.randn``).

    Reference: Ahn, Xu, Abreu, Langford, 2025, "Dion: Distributed Orthonormalized
    Updates" (arXiv 2504.05295).

    Args:
      rank: the rank ``r`` of the update: an int ``>= 1``, or a float in ``(0, 1]``, a
        fraction of ``min(m, n)`` (the code's ``rank_fraction``; default 1.0, full rank).
      mu: the momentum factor of the error feedback, in ``[0, 1]``.
      eps: added to the column norms of ``R``, ``>= 0``.
      rank_multiple_of: round ``r`` up to a multiple of this (then cap at ``min(m, n)``).
      seed: the seed of ``Q``'s initial entries.
      <shared: mu_dtype>
      mesh: a ``jax.sharding.Mesh``: each stack of same-shape work matrices is divided over
        its devices (each device runs the step of ``1/N`` of them, the results are
        gathered), with the same numbers as one device; ``None``: every device does all.
        On CPU the QR calls run in SciPy's OpenBLAS: on a loaded machine
        ``functrain.linalg.set_lapack_threads(1)`` avoids its threads' slowdown
        (docs/matrix_optimizers.md).

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByDionState`. Every leaf
      must have at least two axes.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_dion()
    >>> g = {'w': jnp.array([[3., 0.], [4., 0.]])}  # rank 1: its polar factor g / ||g||
    >>> u, state = tx.update(g, tx.init(g))
    >>> print(jnp.round(u['w'], 4))
    [[0.6 0. ]
     [0.8 0. ]]
    """
    rank = _check_rank(_OWNER, rank, rank_multiple_of)
    check_range("mu", mu, 0.0, 1.0, high_inclusive=True, owner=_OWNER)
    check_nonnegative(_OWNER, eps=eps)
    multiple = int(rank_multiple_of)

    def initial_q(x: Any) -> Array:
        shape, dtype = tuple(np.shape(x)), jnp.result_type(x)
        real = ft.compute_dtype(jnp.finfo(dtype).dtype)
        draw = jax.random.normal(jax.random.PRNGKey(seed),
                                 _q_shape(shape, _view(shape, rank, multiple)), real)
        return draw.astype(dtype)

    def init_fn(params: Params) -> ScaleByDionState:
        paths, leaves, treedef = ft.flatten_with_paths(params)
        ft.check_leaf_dtypes(paths, leaves, [True] * len(leaves), _OWNER, "params")
        _check_matrices(paths, leaves, "params")
        return ft.distinct_buffers(ScaleByDionState(
            ft.zeros_like(params, dtype=mu_dtype), treedef.unflatten(
                [initial_q(x) for x in leaves])))

    def update_fn(updates: Updates, state: ScaleByDionState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, ScaleByDionState]:
        del extra_args
        check_state_type(state, ScaleByDionState, _OWNER)
        paths, gs, treedef = ft.flatten_with_paths(updates)
        gs = [jnp.asarray(g) for g in gs]
        ps: list = [None] * len(gs)
        ft.check_leaf_dtypes(paths, gs, [True] * len(gs), _OWNER, "updates")
        if params is not None:
            ft.check_structure(updates, params, "params", "updates")
            ps = [jnp.asarray(p) for p in treedef.flatten_up_to(params)]
            ft.check_shapes(paths, ps, gs, "updates", "params")
            ft.check_leaf_dtypes(paths, ps, [True] * len(ps), _OWNER, "params")
        _check_matrices(paths, gs, "updates")
        mus = ft.flatten_like(treedef, state.mu, f"{_OWNER} state .mu", updates, "updates")
        ft.check_shapes(paths, mus, gs, "updates", f"{_OWNER} state .mu")
        qs = ft.flatten_like(treedef, state.q, f"{_OWNER} state .q", updates, "updates")
        views = [_view(g.shape, rank, multiple) for g in gs]
        for where, g, q, view in zip(paths, gs, qs, views):
            if tuple(np.shape(q)) != _q_shape(g.shape, view):
                raise ValueError(f"{_OWNER}: updates leaf {where or '<root>'} of shape "
                                 f"{g.shape} needs a state .q of shape "
                                 f"{_q_shape(g.shape, view)}, got {np.shape(q)}: was the state "
                                 f"made by this transformation's init for these params?")

        out, new_mus, new_qs = list(gs), list(mus), list(qs)
        specs, groups = {}, {}  # groups: (rows, cols, r, dtype) -> [(leaf, A, Q)]
        for i, (g, p, mu_i, q, view) in enumerate(zip(gs, ps, mus, qs, views)):
            cd = leaf_compute_dtype(g, p)
            b = g.astype(cd) + mu_i.astype(state_compute_dtype(mu_i, cd))
            if b.size == 0:  # nothing to orthonormalize: a zero update, the state kept
                out[i] = jnp.zeros_like(g)
                continue
            # On a mesh with explicit axes a split leaf must be told the split of a matmul
            # over its split axis: Dion needs whole matrices, so it runs on a replicated copy.
            specs[i] = ft.explicit_spec(b)
            if specs[i] is not None:
                b = jax_compat.reshard(b, jax.sharding.PartitionSpec())
            if ft.explicit_spec(q) is not None:
                q = jax_compat.reshard(q, jax.sharding.PartitionSpec())
            a = jnp.swapaxes(b, -1, -2) if view.transposed else b
            key = (view.rows, view.cols, view.rank, jnp.dtype(a.dtype))
            groups.setdefault(key, []).append(
                (i, a.reshape((-1, view.rows, view.cols)),
                 q.astype(a.dtype).reshape((-1, view.cols, view.rank))))
        for members in groups.values():
            stacks = [jnp.concatenate(xs) if len(xs) > 1 else xs[0]
                      for xs in ([a for _, a, _ in members], [q for _, _, q in members])]
            # in chunks: a matrix's step holds about four arrays its size (B^H, the QR's Q,
            # P before and after its zero check), so a quarter of Muon's budget of one
            o, m_new, q_new = map_stacks(_dion_stack, *stacks, mesh=mesh, shared=(mu, eps),
                                         chunk_bytes=CHUNK_BYTES // 4)
            at = 0
            for i, a, _ in members:
                k, g, view = a.shape[0], gs[i], views[i]
                lead = g.shape[:-2]
                work = (view.rows, view.cols)

                def back(x: Array, at: int = at, k: int = k, view: _View = view) -> Array:
                    x = x[at:at + k].reshape(lead + work)
                    return jnp.swapaxes(x, -1, -2) if view.transposed else x

                o_i, m_i = back(o), back(m_new)
                if specs[i] is not None:
                    o_i, m_i = (jax_compat.reshard(x, specs[i]) for x in (o_i, m_i))
                scale = math.sqrt(g.shape[-1] / g.shape[-2])  # sqrt(d_out / d_in)
                out[i] = (scale * o_i).astype(g.dtype)
                new_mus[i] = m_i.astype(mus[i].dtype)
                new_qs[i] = q_new[at:at + k].reshape(lead + (view.cols, view.rank)).astype(
                    qs[i].dtype)
                at += k
        return treedef.unflatten(out), ScaleByDionState(treedef.unflatten(new_mus),
                                                        treedef.unflatten(new_qs))

    return GradientTransformation(init_fn, update_fn)


@declare_optimizer("beyond optax", "Ahn et al., 2025", optax=None, stressed=True, summary=(
    "Dion (Ahn et al., 2025): low-rank orthonormalized updates from one power-iteration step "
    "with error feedback into the momentum, on 2-D leaves; AdamW or Lion on the others."),
    signature="dion(learning_rate, rank=1.0, mu=0.95, weight_decay=0.01, ..., mesh=None)")
@hyperparameters(static=("rank", "rank_multiple_of", "seed", "mesh", "scalar_optimizer"),
                 learning_rate="schedule", mu="number", weight_decay="schedule", eps="number",
                 seed="int", scalar_b1="number", scalar_b2="number",
                 scalar_learning_rate="schedule or None", scalar_weight_decay="schedule or None")
def dion(learning_rate: ScalarOrSchedule, rank: Union[int, float] = 1.0, mu: float = 0.95,
         weight_decay: ScalarOrSchedule = 0.01, eps: float = 1e-8, *,
         rank_multiple_of: int = 1, seed: int = 0, mu_dtype: Optional[Any] = None,
         weight_decay_mask: Optional[MaskOrFn] = None, dion_mask: Optional[MaskOrFn] = None,
         scalar_optimizer: str = "adamw", scalar_b1: float = 0.9, scalar_b2: float = 0.95,
         scalar_learning_rate: Optional[ScalarOrSchedule] = None,
         scalar_weight_decay: Optional[ScalarOrSchedule] = None,
         mesh: Optional[jax.sharding.Mesh] = None,
         cautious_weight_decay: bool = False) -> GradientTransformation:
    """Dion (Ahn et al., 2025): low-rank orthonormalized updates for matrices, AdamW or Lion
    for the other leaves.

    Update rule for a Dion leaf ``W`` of ``(d_in, d_out)``: ``O`` = :func:`scale_by_dion`'s
    ``sqrt(d_out / d_in) P Q^H``; ``W -= lr * (O + weight_decay * W)`` (the authors'
    ``W *= 1 - lr * weight_decay``, then ``W -= lr * sqrt(d_out / d_in) P Q^H``). Other
    leaves: ``adamw(scalar_learning_rate, scalar_b1, scalar_b2, eps,
    weight_decay=scalar_weight_decay)`` or ``lion(...)`` with the same arguments, as the
    authors' ``algorithm="adamw"`` / ``"lion"`` parameter groups.

    Defaults are the authors' ``Dion`` class's (``mu=0.95``, ``rank_fraction=1.0``,
    ``weight_decay=0.01`` for every group, ``betas=(0.9, 0.95)`` for AdamW and Lion,
    ``epsilon=1e-8``). Their README asks for embeddings and the output layer to go to the
    scalar optimizer: leaves of two axes cannot be told apart by shape, so name them in
    ``dion_mask``. Where the paper and the code differ, this follows the code (see
    :func:`scale_by_dion`).

    Reference: Ahn, Xu, Abreu, Langford, 2025, "Dion: Distributed Orthonormalized
    Updates" (arXiv 2504.05295); code: github.com/microsoft/dion.

    Args:
      learning_rate: the step size, a number or a schedule of the step count (the authors'
        ``lr``, before the ``sqrt(d_out / d_in)`` scale).
      rank: an int ``>= 1`` (the rank) or a float in ``(0, 1]`` (a fraction of ``min(d_in,
        d_out)``); see :func:`scale_by_dion`.
      mu: the momentum factor of the error feedback, in ``[0, 1]``.
      weight_decay: decoupled weight decay of the Dion leaves (multiplied by
        ``learning_rate``), ``>= 0``.
      eps: Dion's column-normalization epsilon, also AdamW's ``eps``.
      rank_multiple_of: round the rank up to a multiple of this.
      seed: the seed of the right factors' initial entries.
      mu_dtype: storage dtype of both optimizers' first moments.
      weight_decay_mask: where to apply ``weight_decay`` among the Dion leaves: a tree (or
        prefix) of bools or a function of the params; ``None``: all.
      dion_mask: which leaves go to Dion: a tree (or prefix) of bools or a function of the
        params (True: Dion, for leaves of two or more axes, leading ones a stack; False:
        the scalar optimizer); ``None``: the 2-D leaves.
      scalar_optimizer: ``'adamw'`` or ``'lion'``, for the other leaves.
      scalar_b1: the scalar optimizer's ``b1``.
      scalar_b2: the scalar optimizer's ``b2``.
      scalar_learning_rate: its step size; ``None``: ``learning_rate``.
      scalar_weight_decay: its decoupled weight decay; ``None``: ``weight_decay``.
      mesh: divide Dion's matrix work over this mesh's devices (see
        :func:`scale_by_dion`).
      cautious_weight_decay: apply the weight decay only where the update and the param
        agree in sign (Cautious Weight Decay, Chen et al., 2025; see
        :func:`functrain.add_decayed_weights`), to ``weight_decay`` and the scalar
        optimizer's decay alike; default ``False``.

    Returns:
      A ``GradientTransformation`` whose state is ``PartitionState`` with the entries
      ``'dion'`` (``MaskedState((ScaleByDionState, EmptyState, EmptyState))``) and
      ``'scalar'`` (the scalar optimizer's masked state).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.dion(0.01, rank=0.5)
    >>> params = {'w': jnp.zeros((4, 2)), 'b': jnp.zeros(2)}
    >>> state = opt.init(params)
    >>> g = {'w': jnp.array([[3., 0.], [4., 0.], [0., 0.], [0., 0.]]), 'b': jnp.ones(2)}
    >>> u, state = opt.update(g, state, params)
    >>> [round(float(x), 5) for x in (u['w'][0, 0], u['b'][0])]  # -lr sqrt(2/4) 0.6; AdamW's
    [-0.00424, -0.01]
    """
    owner = "dion"
    check_range("mu", mu, 0.0, 1.0, high_inclusive=True, owner=owner)
    check_betas(owner, scalar_b1=scalar_b1, scalar_b2=scalar_b2)
    check_nonnegative(owner, eps=eps)
    check_range("weight_decay", weight_decay, 0.0, owner=owner)
    if scalar_optimizer not in ("adamw", "lion"):
        raise ValueError(f"{owner}: scalar_optimizer must be 'adamw' or 'lion' (the authors' "
                         f"scalar algorithms), got {scalar_optimizer!r}.")
    dion_tx = chain(
        scale_by_dion(rank, mu, eps, rank_multiple_of=rank_multiple_of, seed=seed,
                      mu_dtype=mu_dtype, mesh=mesh),
        add_decayed_weights(weight_decay, weight_decay_mask, cautious=cautious_weight_decay),
        scale_by_learning_rate(learning_rate))
    lr = learning_rate if scalar_learning_rate is None else scalar_learning_rate
    wd = weight_decay if scalar_weight_decay is None else scalar_weight_decay
    if scalar_optimizer == "adamw":
        scalar_tx = adamw(lr, b1=scalar_b1, b2=scalar_b2, eps=eps, mu_dtype=mu_dtype,
                          weight_decay=wd, cautious_weight_decay=cautious_weight_decay)
    else:
        scalar_tx = lion(lr, b1=scalar_b1, b2=scalar_b2, mu_dtype=mu_dtype, weight_decay=wd,
                         cautious_weight_decay=cautious_weight_decay)

    def labels(tree: Any) -> Any:
        slots = jax.tree_util.tree_leaves(tree, is_leaf=ft.is_placeholder)
        if dion_mask is None:
            flags = [not ft.is_placeholder(x) and np.ndim(x) == 2 for x in slots]
        else:
            flags = ft.resolve_mask(dion_mask, tree, owner)
        return jax.tree_util.tree_structure(tree, is_leaf=ft.is_placeholder).unflatten(
            ["dion" if f else "scalar" for f in flags])

    return multi_transform({"dion": dion_tx, "scalar": scalar_tx}, labels)
