"""SOAP (Vyas et al., 2024): Adam run in the eigenbasis of Shampoo's preconditioner.

Per weight, seen as a tensor with axes ``d_1 .. d_k`` (after the optional merge
of small axes), SOAP keeps one Shampoo statistic per axis, ``L_i = EMA(G_(i)
G_(i)^T)`` (the gradient contracted with itself over every other axis), and
an orthonormal basis ``Q_i`` of its eigenvectors. Adam's second moment lives in
the rotated space: each step the gradient is rotated, ``G' = G x_1 Q_1^T ..
x_k Q_k^T``, Adam's direction is taken there and rotated back. The bases are
set from ``eigh`` of the first statistics, then refreshed every
``precondition_frequency`` steps by one step of power iteration and a QR
decomposition. Axes longer than ``max_precond_dim`` are not rotated (the
identity), and vectors and scalars get plain Adam unless ``precondition_1d``.

Why a whole-tree transformation rather than a ``LeafStage``: a leaf's state
holds a variable number of matrices (one statistic and one basis per axis),
which the engine's one-array-per-field leaf state cannot carry. The per-leaf
math is still a pure function of one leaf (:func:`_soap_leaf`), but for the
refresh with ``mesh``: one conditional for the whole tree, whose same-size
decompositions are stacked and divided over the mesh's devices; the update
checks structures, shapes and dtypes before any array math, naming the leaf,
and follows functrain's dtype policy (16-bit leaves computed in float32).

This optimizer has no optax counterpart: arguments and defaults are those of
the authors' reference implementation (github.com/nikhilvyas/SOAP), tested
against a numpy transcription of the paper's Algorithm 3.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from functrain import tree as ft
from functrain.contrib.partition import merged_shape
from functrain.arg_checks import (check_betas, check_nonnegative, check_range,
                                  check_state_type, hyperparameters)
from functrain.linalg import map_matrices
from functrain.transforms.base import (GradientTransformation, MaskOrFn, Params,
                                       ScalarOrSchedule, Updates, safe_increment)
from functrain.transforms.engine import (chain, leaf_compute_dtype, state_compute_dtype)
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate

Array = jax.Array

__all__ = ["SoapState", "scale_by_soap", "soap"]

_OWNER = "scale_by_soap"
_NORMALIZE_FLOOR = 1e-30  # the reference's floor under the update's RMS (normalize_grads)


class SoapState(NamedTuple):
    """State of :func:`scale_by_soap`.

    Attributes:
      count: the number of ``update`` calls so far (int32). The first call
        only gathers statistics; Adam's step number is ``count - 1``.
      mu: Adam's first moment, a tree like the params, in the original basis.
      nu: Adam's second moment, a tree like the params, in the rotated basis
        (entry ``[i, j]`` belongs to the ``i``-th / ``j``-th eigenvectors).
      stats: per leaf, a tuple with one Shampoo statistic ``(d, d)`` per axis of
        the (merged) leaf; a ``(1, 1)`` placeholder for axes that are not rotated (not
        ``(0, 0)``: Orbax refuses to save zero-size arrays).
      bases: per leaf, the eigenbases ``Q``, laid out like ``stats``.

    >>> import jax.numpy as jnp
    >>> state = scale_by_soap().init({'w': jnp.zeros((3, 2)), 'b': jnp.zeros(2)})
    >>> [q.shape for q in state.bases['w']], [q.shape for q in state.bases['b']]
    ([(3, 3), (2, 2)], [(1, 1)])
    """

    count: Array
    mu: Any
    nu: Any
    stats: Any
    bases: Any


# --------------------------------------------------------------------------
# Per-leaf layout: the merged shape and which of its axes are rotated
# --------------------------------------------------------------------------

class _Layout(NamedTuple):
    shape: tuple    # the shape the matrix math sees (axes merged or not)
    rotated: tuple  # per axis of ``shape``: whether it has a statistic and a basis


def _layout(shape: tuple, max_dim: int, merge_dims: bool, precondition_1d: bool) -> _Layout:
    if len(shape) == 0 or math.prod(shape) == 0:
        return _Layout(tuple(shape), (False,) * len(shape))
    if len(shape) == 1:
        return _Layout(tuple(shape), (precondition_1d and shape[0] <= max_dim,))
    merged = merged_shape(shape, max_dim) if merge_dims else tuple(shape)
    return _Layout(merged, tuple(d <= max_dim for d in merged))


def _matrix_shapes(lay: _Layout) -> list:
    return [(d, d) if r else (1, 1) for d, r in zip(lay.shape, lay.rotated)]


# --------------------------------------------------------------------------
# Per-leaf math
# --------------------------------------------------------------------------

def _rotate(x: Array, bases: tuple, lay: _Layout, back: bool) -> Array:
    """``x x_i Q_i^T`` over the rotated axes (into the eigenbasis), or ``x x_i Q_i`` back."""
    for k, (q, on) in enumerate(zip(bases, lay.rotated)):
        if on:
            x = jnp.moveaxis(jnp.tensordot(x, q, axes=([k], [1 if back else 0])), -1, k)
    return x


def _gram(x: Array, k: int) -> Array:
    """``X_(k) X_(k)^T``: ``x`` contracted with itself over every axis but ``k``."""
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


def _initial_bases(stats: tuple, bases: tuple, nu: Array, lay: _Layout) -> tuple:
    """Eigenvectors of each statistic, largest eigenvalue first."""
    return tuple(_top_eigenvectors(s) if on else q
                 for s, q, on in zip(stats, bases, lay.rotated)), nu


def _refreshed_bases(stats: tuple, bases: tuple, nu: Array, lay: _Layout) -> tuple:
    """One power-iteration step and QR per axis; ``nu`` follows the sorted columns."""
    new = []
    for k, (s, q, on) in enumerate(zip(stats, bases, lay.rotated)):
        if not on:
            new.append(q)
            continue
        q, order = _power_step(s, q)
        nu = jnp.take(nu, order, axis=k)
        new.append(q)
    return tuple(new), nu


def _map_by_size(fn: Any, items: list, mesh: Any) -> list:
    """``fn(*item)`` for each item (a tuple of matrices): the items whose first matrix has
    one shape and dtype stacked into one :func:`map_matrices` call over ``mesh``."""
    sizes: dict = {}
    for i, item in enumerate(items):
        sizes.setdefault((item[0].shape, item[0].dtype), []).append(i)
    out: list = [None] * len(items)
    for members in sizes.values():
        stacks = [jnp.stack([items[i][a] for i in members]) for a in range(len(items[members[0]]))]
        done = map_matrices(fn, *stacks, mesh=mesh)
        for j, i in enumerate(members):
            out[i] = jax.tree.map(lambda y, j=j: y[j], done)
    return out


def _split_refresh(leaves: list, count: Array, hp: _Hyper, mesh: Any) -> list:
    """The bases and ``nu`` of every leaf after one conditional for the whole tree, each
    refresh's decompositions divided over ``mesh``'s devices (:func:`map_matrices`).

    ``leaves``: per leaf ``(stats, bases, nu, layout)``, ``nu`` in the layout's shape.
    The same math as :func:`_initial_bases` / :func:`_refreshed_bases` per leaf.
    """
    axes = [(i, k) for i, (_, _, _, lay) in enumerate(leaves) for k, on in enumerate(lay.rotated)
            if on]

    def keep(ops: list) -> list:
        return [(q, v) for _, q, v in ops]

    def initial(ops: list) -> list:
        new = [[list(q), v] for _, q, v in ops]
        done = _map_by_size(_top_eigenvectors, [(ops[i][0][k],) for i, k in axes], mesh)
        for (i, k), q in zip(axes, done):
            new[i][0][k] = q
        return [(tuple(q), v) for q, v in new]

    def refreshed(ops: list) -> list:
        new = [[list(q), v] for _, q, v in ops]
        done = _map_by_size(_power_step, [(ops[i][0][k], ops[i][1][k]) for i, k in axes], mesh)
        for (i, k), (q, order) in zip(axes, done):
            new[i][0][k] = q
            new[i][1] = jnp.take(new[i][1], order, axis=k)
        return [(tuple(q), v) for q, v in new]

    refresh = (count > 0) & (count % hp.precondition_frequency == 0)
    branch = jnp.where(count == 0, 1, jnp.where(refresh, 2, 0))
    return lax.switch(branch, [keep, initial, refreshed],
                      [(stats, bases, nu) for stats, bases, nu, _ in leaves])


class _Hyper(NamedTuple):
    b1: Any
    b2: Any
    shampoo_beta: Any
    eps: Any
    precondition_frequency: int
    normalize_grads: bool
    correct_bias: bool


def _soap_leaf(g: Array, mu: Array, nu: Array, stats: tuple, bases: tuple, count: Array,
               hp: _Hyper, lay: _Layout, refresh_here: bool = True) -> tuple:
    """One SOAP step on one leaf (arrays in its compute dtype): ``(u, mu, nu, stats, bases)``.

    ``count`` is the number of earlier calls: the first call (0) only sets the
    statistics and bases (zero update, moments untouched); afterwards Adam's
    step number is ``count``. ``refresh_here=False`` leaves the bases (and
    ``nu``'s order) to the caller (:func:`_split_refresh`).
    """
    shape = g.shape
    g, mu, nu = (x.reshape(lay.shape) for x in (g, mu, nu))
    first = count == 0
    if any(lay.rotated):
        g_rot = _rotate(g, bases, lay, back=False)
    else:
        g_rot = g
    t = jnp.maximum(count, 1)  # Adam's step number
    b2, c2 = ((hp.b2(t), hp.b2.bias_correction(t)) if callable(hp.b2)
              else (hp.b2, 1 - hp.b2 ** t.astype(g.dtype)))
    new_mu = hp.b1 * mu + (1 - hp.b1) * g
    new_nu = b2 * nu + (1 - b2) * jnp.square(g_rot)
    direction = _rotate(new_mu, bases, lay, back=False) / (jnp.sqrt(new_nu) + hp.eps)
    n = _rotate(direction, bases, lay, back=True)
    if hp.normalize_grads:
        n = n / (_NORMALIZE_FLOOR + jnp.sqrt(jnp.mean(jnp.square(n))))
    if hp.correct_bias:
        n = n * (jnp.sqrt(c2) / (1 - hp.b1 ** t.astype(g.dtype)))
    u = jnp.where(first, jnp.zeros_like(n), n)
    mu = jnp.where(first, mu, new_mu)
    nu = jnp.where(first, nu, new_nu)

    if any(lay.rotated):
        # from zero statistics: (1 - beta) G G^T on the first call; a schedule (b2's when
        # shampoo_beta is None) at the statistics' own step, count + 1
        beta = hp.shampoo_beta(count + 1) if callable(hp.shampoo_beta) else hp.shampoo_beta
        stats = tuple(beta * s + (1 - beta) * _gram(g, k) if on else s
                      for k, (s, on) in enumerate(zip(stats, lay.rotated)))
    if any(lay.rotated) and refresh_here:
        refresh = (count > 0) & (count % hp.precondition_frequency == 0)
        branch = jnp.where(first, 1, jnp.where(refresh, 2, 0))
        bases, nu = jax.lax.switch(
            branch, [lambda s, q, v: (q, v),
                     lambda s, q, v: _initial_bases(s, q, v, lay),
                     lambda s, q, v: _refreshed_bases(s, q, v, lay)],
            stats, bases, nu)
    return u.reshape(shape), mu.reshape(shape), nu.reshape(shape), stats, bases


# --------------------------------------------------------------------------
# The transformations
# --------------------------------------------------------------------------

def _check_int(owner: str, name: str, value: Any) -> None:
    check_range(name, value, 1.0, owner=owner)
    if not isinstance(value, jax.core.Tracer) and int(value) != value:
        raise ValueError(f"{owner}: {name} must be an integer >= 1, got {value}.")


def _check_options(owner: str, b1: Any, b2: Any, shampoo_beta: Any, eps: Any,
                   precondition_frequency: Any, max_precond_dim: Any, flags: dict) -> None:
    check_betas(owner, b1=b1, b2=b2)
    if shampoo_beta is not None:
        if not isinstance(shampoo_beta, jax.core.Tracer) and np.ndim(shampoo_beta) == 0 \
                and float(shampoo_beta) < 0:
            raise ValueError(f"{owner}: shampoo_beta must be in [0.0, 1.0), got "
                             f"{shampoo_beta}; pass None to use b2 (the reference "
                             f"implementation's -1).")
        check_betas(owner, shampoo_beta=shampoo_beta)
    check_nonnegative(owner, eps=eps)
    _check_int(owner, "precondition_frequency", precondition_frequency)
    _check_int(owner, "max_precond_dim", max_precond_dim)
    for name, value in flags.items():
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{owner}: {name} must be a bool, got {type(value).__name__} "
                            f"{value!r:.40}.")


def _check_leaf_state(where: str, lay: _Layout, stats: Any, bases: Any) -> None:
    want = _matrix_shapes(lay)
    for field, value in (("stats", stats), ("bases", bases)):
        got = [tuple(np.shape(m)) for m in value] if isinstance(value, tuple) else None
        if got != want:
            raise ValueError(f"{_OWNER}: updates leaf {where} (merged shape {lay.shape}) "
                             f"needs state .{field} matrices of shapes {want}, got "
                             f"{got if got is not None else type(value).__name__}: was the "
                             f"state made by this transformation's init for these params?")


@hyperparameters(
    b1="number", b2="decay", shampoo_beta="number or None", eps="number",
    precondition_frequency="number", max_precond_dim="number")
def scale_by_soap(b1: float = 0.95, b2: float = 0.95, shampoo_beta: Optional[float] = None,
                  eps: float = 1e-8, precondition_frequency: int = 10,
                  max_precond_dim: int = 10000, merge_dims: bool = False,
                  precondition_1d: bool = False, normalize_grads: bool = False,
                  correct_bias: bool = True, *, mesh: Optional[jax.sharding.Mesh] = None
                  ) -> GradientTransformation:
    """Rescale updates by SOAP: Adam in the eigenbasis of Shampoo's preconditioner.

    Update rule, per leaf ``G`` (a ``m x n`` matrix here; tensors rotate every
    axis alike). The first call only sets ``L = (1 - s) G G^T``, ``R = (1 - s)
    G^T G`` and ``Q_L, Q_R`` = their eigenvectors (``eigh``, largest first), and
    returns a zero update. At Adam step ``t = 1, 2, ...`` (the later calls)::

        M = b1 M + (1 - b1) G                          (original basis)
        V = b2 V + (1 - b2) (Q_L^T G Q_R)^2            (rotated basis)
        N = Q_L [(Q_L^T M Q_R) / (sqrt(V) + eps)] Q_R^T
        N <- N / (1e-30 + rms(N))                      (if normalize_grads)
        u = sqrt(1 - b2^t) / (1 - b1^t) N              (if correct_bias, else N)
        L = s L + (1 - s) G G^T;  R = s R + (1 - s) G^T G
        if t % precondition_frequency == 0:            (for L; R alike)
            order columns of Q_L by diag(Q_L^T L Q_L), descending, and V's rows with them
            Q_L = qr(L Q_L).Q                          (one power-iteration step)

    with ``s = shampoo_beta`` (``b2`` if ``None``). Axes longer than
    ``max_precond_dim`` keep the identity; a 1-D leaf is plain Adam unless
    ``precondition_1d``; scalars are plain Adam. Reference: Vyas, Morwani,
    Zhao, Kwun, Shapira, Brandfonbrener, Janson & Kakade, 2024, "SOAP:
    Improving and Stabilizing Shampoo using Adam" (Algorithm 3), and the
    authors' reference implementation, whose defaults these are.

    Memory per ``m x n`` leaf: ``2 m n`` (moments) ``+ 2 (m^2 + n^2)``
    (statistics and bases). The statistics and bases of a sharded weight are
    computed in the jitted step like any intermediate; their layout is XLA's
    choice: only ``mu`` and ``nu`` follow the weight's sharding (on a 4x2 mesh,
    XLA keeps the bases replicated and splits the rows of ``L_k`` like the
    weight's axis ``k``).

    A property of the algorithm (the reference code's too): when a first
    statistic is rank-deficient (``L = G G^T`` of an ``m x n`` gradient with
    ``m > n``), ``eigh``'s basis of its null space is arbitrary, and later
    updates depend on that choice (Adam's per-coordinate step is not rotation
    invariant). Runs that differ only in rounding (another device count,
    sharding or backend) can then differ by the size of a step.

    Args:
      b1: decay of the first moment, in ``[0, 1)``.
      b2: decay of the (rotated) second moment, in ``[0, 1)``, or a decay-rate schedule
        such as ``functrain.contrib.palm_beta2_schedule()`` (read at Adam's step; the
        statistics, when ``shampoo_beta`` is ``None``, read it at their own step).
      shampoo_beta: decay of the statistics ``L, R``, in ``[0, 1)``; ``None``
        (the reference's ``-1``) uses ``b2``.
      eps: added to ``sqrt(V)``, ``>= 0``.
      precondition_frequency: refresh the eigenbases every this many Adam
        steps, an integer ``>= 1``.
      max_precond_dim: axes (after merging) longer than this are not rotated;
        an integer ``>= 1``.
      merge_dims: merge neighbouring axes of tensors with 2 or more axes while
        the product stays ``<= max_precond_dim`` (a ``(4, 4, 64)`` kernel is
        rotated as ``(16, 64)``).
      precondition_1d: rotate 1-D leaves too (one ``(n, n)`` statistic each).
      normalize_grads: divide each leaf's rotated-back direction by its RMS.
      correct_bias: Adam's bias correction, ``sqrt(1 - b2^t) / (1 - b1^t)``,
        applied as a step-size factor (``eps`` is not rescaled), as in the paper.
      mesh: a ``jax.sharding.Mesh``: one conditional refreshes every leaf's
        bases, the decompositions (``eigh`` on the first call, one power step
        and QR afterwards) of each size stacked and divided over all of the
        mesh's devices (each device refreshes its share, then the bases are
        gathered; :func:`functrain.linalg.map_matrices`), as distributed
        Shampoo divides its work; the same numbers as one device. ``None``:
        each leaf refreshes its own bases, on every device.

    Returns:
      A ``GradientTransformation`` whose state is :class:`SoapState`. Complex
      and integer leaves raise a ``TypeError`` naming the leaf.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_soap()
    >>> params = {'w': jnp.zeros((2, 2))}
    >>> state = tx.init(params)
    >>> u, state = tx.update({'w': jnp.array([[2., 0.], [0., 1.]])}, state)
    >>> float(jnp.abs(u['w']).max())  # the first call only gathers statistics
    0.0
    >>> u, state = tx.update({'w': jnp.array([[2., 0.], [0., 1.]])}, state)
    >>> jnp.round(u['w'], 4)  # Adam's first step in the eigenbasis: signs
    Array([[1., 0.],
           [0., 1.]], dtype=float32)
    """
    flags = dict(merge_dims=merge_dims, precondition_1d=precondition_1d,
                 normalize_grads=normalize_grads, correct_bias=correct_bias)
    _check_options(_OWNER, b1, b2, shampoo_beta, eps, precondition_frequency,
                   max_precond_dim, flags)
    hp = _Hyper(b1, b2, b2 if shampoo_beta is None else shampoo_beta, eps,
                precondition_frequency, bool(normalize_grads), bool(correct_bias))

    def layout(x: Any) -> _Layout:
        return _layout(tuple(np.shape(x)), int(max_precond_dim), bool(merge_dims),
                       bool(precondition_1d))

    def init_fn(params: Params) -> SoapState:
        paths, leaves, treedef = ft.flatten_with_paths(params)
        ft.check_leaf_dtypes(paths, leaves, [True] * len(leaves), _OWNER, "params",
                             real_only=True)
        stats = []
        for x in leaves:
            dtype = ft.compute_dtype(jnp.result_type(x))
            stats.append(tuple(jnp.zeros(s, dtype) for s in _matrix_shapes(layout(x))))
        zeros = treedef.unflatten([ft.zeros_like(jnp.asarray(x) if not hasattr(x, "dtype")
                                                 else x) for x in leaves])
        return ft.distinct_buffers(SoapState(jnp.zeros([], jnp.int32), zeros, zeros,
                                             treedef.unflatten(stats),
                                             treedef.unflatten(stats)))

    def update_fn(updates: Updates, state: SoapState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, SoapState]:
        del extra_args
        check_state_type(state, SoapState, _OWNER)
        paths, gs, treedef = ft.flatten_with_paths(updates)
        gs = [jnp.asarray(g) for g in gs]
        active = [True] * len(gs)
        ft.check_leaf_dtypes(paths, gs, active, _OWNER, "updates", real_only=True)
        if params is not None:
            ft.check_structure(updates, params, "params", "updates")
            ps = [jnp.asarray(p) for p in treedef.flatten_up_to(params)]
            ft.check_shapes(paths, ps, gs, "updates", "params")
            ft.check_leaf_dtypes(paths, ps, active, _OWNER, "params", real_only=True)
        else:
            ps = [None] * len(gs)
        fields = {}
        for name in ("mu", "nu", "stats", "bases"):
            fields[name] = ft.flatten_like(treedef, getattr(state, name),
                                           f"{_OWNER} state .{name}", updates, "updates")
        for name in ("mu", "nu"):
            ft.check_shapes(paths, fields[name], gs, "updates", f"{_OWNER} state .{name}")
        lays = [layout(g) for g in gs]
        for where, lay, s, q in zip(paths, lays, fields["stats"], fields["bases"]):
            _check_leaf_state(where or "<root>", lay, s, q)

        done = []
        for i, (g, p, lay) in enumerate(zip(gs, ps, lays)):
            cd = leaf_compute_dtype(g, p)
            mu, nu, stats, bases = (fields[name][i] for name in fields)
            mu, nu = (x.astype(state_compute_dtype(x, cd)) for x in (mu, nu))
            stats, bases = (tuple(m.astype(state_compute_dtype(m, cd)) for m in x)
                            for x in (stats, bases))
            done.append(list(_soap_leaf(g.astype(cd), mu, nu, stats, bases, state.count, hp,
                                        lay, refresh_here=mesh is None)))
        split = [i for i, lay in enumerate(lays) if mesh is not None and any(lay.rotated)]
        if split:  # one conditional for the whole tree, its decompositions over the mesh
            refreshed = _split_refresh([(done[i][3], done[i][4], done[i][2].reshape(
                lays[i].shape), lays[i]) for i in split], state.count, hp, mesh)
            for i, (bases, nu) in zip(split, refreshed):
                done[i][4], done[i][2] = bases, nu.reshape(gs[i].shape)
        out, new = [], {name: [] for name in fields}
        for i, (g, (u, *news)) in enumerate(zip(gs, done)):
            olds = [fields[name][i] for name in fields]
            out.append(u.astype(g.dtype))
            for name, n, o in zip(fields, news, olds):
                if isinstance(o, tuple):
                    n = tuple(a.astype(b.dtype) for a, b in zip(n, o))
                else:
                    n = n.astype(o.dtype)
                new[name].append(n)
        new_state = SoapState(safe_increment(state.count),
                              **{name: treedef.unflatten(v) for name, v in new.items()})
        return treedef.unflatten(out), new_state

    return GradientTransformation(init_fn, update_fn)


scale_by_soap.static_hyperparams = (  # type: ignore[attr-defined]  # shapes and branches
    "precondition_frequency", "max_precond_dim", "mesh")


@hyperparameters(
    learning_rate="schedule", b1="number", b2="decay", shampoo_beta="number or None",
    eps="number", weight_decay="schedule", precondition_frequency="number",
    max_precond_dim="number")
def soap(learning_rate: ScalarOrSchedule = 3e-3, b1: float = 0.95, b2: float = 0.95,
         shampoo_beta: Optional[float] = None, eps: float = 1e-8,
         weight_decay: ScalarOrSchedule = 0.01, precondition_frequency: int = 10,
         max_precond_dim: int = 10000, merge_dims: bool = False,
         precondition_1d: bool = False, normalize_grads: bool = False,
         correct_bias: bool = True, weight_decay_mask: Optional[MaskOrFn] = None, *,
         mesh: Optional[jax.sharding.Mesh] = None) -> GradientTransformation:
    """SOAP (Vyas et al., 2024): Adam in Shampoo's eigenbasis, with decoupled weight decay.

    Update rule: ``N`` = :func:`scale_by_soap`'s direction (Adam's step taken
    in the eigenbases ``Q_L, Q_R`` of Shampoo's statistics ``L = EMA(G G^T)``,
    ``R = EMA(G^T G)``, rotated back), then ``W -= learning_rate * (N +
    weight_decay * W)``. The bases come from ``eigh`` on the first call (whose
    update is only the weight decay) and are refreshed every
    ``precondition_frequency`` steps by one power-iteration step and a QR.

    Reference: Vyas, Morwani, Zhao, Kwun, Shapira, Brandfonbrener, Janson &
    Kakade, 2024, "SOAP: Improving and Stabilizing Shampoo using Adam"
    (arXiv:2409.11321). The defaults are the authors' reference
    implementation's (``SOAP(lr=3e-3, betas=(.95, .95), weight_decay=.01,
    precondition_frequency=10)``, as their README recommends for
    transformers): ``b1 = b2 = 0.95`` as in their tuned Shampoo/Adam baselines;
    ``shampoo_beta`` follows ``b2``; a refresh every 10 steps keeps the
    ``O(d^3)`` QR cheap, and the paper finds SOAP degrades far less than
    Shampoo as the frequency drops; ``max_precond_dim=10000`` rotates every
    axis of ordinary layers while keeping each basis at most ``10^8`` numbers
    (e.g. an embedding's vocabulary axis stays unrotated); vectors get plain
    Adam (``precondition_1d=False``), as in the paper's experiments.

    One difference from the reference code: the weight decay is optax-style,
    ``W -= lr * (N + wd W)``, where the reference multiplies the already
    updated weight by ``1 - lr wd`` (a difference of order ``lr^2 wd``), and
    it also applies on the first call (the reference skips that step entirely).
    Its ``data_format='channels_last'`` (a PyTorch memory layout) has no
    counterpart.

    Args:
      learning_rate: the step size, a number or a schedule of the step count.
      b1: decay of the first moment, in ``[0, 1)``.
      b2: decay of the rotated second moment, in ``[0, 1)``, or a decay-rate schedule
        (``functrain.contrib.palm_beta2_schedule()``), as in :func:`scale_by_soap`.
      shampoo_beta: decay of the statistics; ``None`` uses ``b2``.
      eps: added to the square root of the second moment, ``>= 0``.
      weight_decay: decoupled weight decay (multiplied by ``learning_rate``),
        ``>= 0``; a number or a schedule.
      precondition_frequency: refresh the eigenbases every this many steps.
      max_precond_dim: axes longer than this are not rotated.
      merge_dims: merge neighbouring small axes of tensors (see
        :func:`scale_by_soap`).
      precondition_1d: rotate 1-D leaves too.
      normalize_grads: divide each leaf's direction by its RMS.
      correct_bias: Adam's bias correction as a step-size factor.
      weight_decay_mask: where to apply the weight decay: a tree (or prefix)
        of bools or a function of the params; ``None``: every leaf.
      mesh: divide each refresh's decompositions over this mesh's devices
        (see :func:`scale_by_soap`).

    Returns:
      A ``GradientTransformation`` whose state is ``(SoapState, EmptyState,
      EmptyState)``.

    >>> import jax, jax.numpy as jnp, functrain
    >>> a = jnp.diag(jnp.array([10., 1.]))
    >>> f = lambda p: jnp.sum((a @ p['w'] - 1.) ** 2)
    >>> opt = functrain.contrib.soap(0.1, weight_decay=0.0)
    >>> @jax.jit
    ... def step(params, state):
    ...     updates, state = opt.update(jax.grad(f)(params), state, params)
    ...     return functrain.apply_updates(params, updates), state
    >>> params = {'w': jnp.zeros((2, 2))}
    >>> state = opt.init(params)
    >>> for _ in range(30):
    ...     params, state = step(params, state)
    >>> print(f"{float(f({'w': jnp.zeros((2, 2))})):.1f} -> {float(f(params)):.2f}")
    4.0 -> 0.32
    """
    check_range("weight_decay", weight_decay, 0.0, owner="soap")
    return chain(scale_by_soap(b1, b2, shampoo_beta, eps, precondition_frequency,
                               max_precond_dim, merge_dims, precondition_1d,
                               normalize_grads, correct_bias, mesh=mesh),
                 add_decayed_weights(weight_decay, weight_decay_mask),
                 scale_by_learning_rate(learning_rate))


soap.static_hyperparams = (  # type: ignore[attr-defined]  # shapes and branches
    "precondition_frequency", "max_precond_dim", "mesh")
