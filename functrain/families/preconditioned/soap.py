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
With ``block_size``, each block of a split leaf is a leaf of its own here; with
``weight_dimension_numbers``, each layer of a stacked leaf.

A whole-tree transformation, not a ``LeafStage``: a leaf's state holds one statistic and
one basis per axis, which the engine's one-array-per-field leaf state cannot carry. The
per-leaf math is a pure function of one leaf (:func:`functrain.families.preconditioned.soap_steps.soap_leaf`, batched over a leaf's
blocks or layers; the rotations and the refresh in ``functrain.matrix.eigenbases``);
with ``mesh`` (and for split or stacked leaves) one conditional refreshes the tree, its
same-size decompositions stacked (and divided over the mesh's devices). The update
checks structures, shapes and dtypes first, naming the leaf, and follows functrain's
dtype policy (16-bit leaves in float32).

This optimizer has no optax counterpart: arguments and defaults are those of
the authors' reference implementation (github.com/nikhilvyas/SOAP), tested
against a numpy transcription of the paper's Algorithm 3.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from functrain import tree as ft
from functrain.matrix.blocks import check_block_size, map_by_shape
from functrain.matrix.eigenbases import flatten_eigenbasis_inputs, refresh_bases
from functrain.matrix.dimension_numbers import (LayerView, check_dimension_numbers,
                                                layer_views, stacked_view)
from functrain.matrix.shape_groups import group_key, shape_groups, stack_units, unstack_units
from functrain.families.preconditioned import soap_steps as ss
from functrain.arg_checks import (check_betas, check_bools, check_nonnegative, check_range,
                                  check_state_type)
from functrain.declarations import declare_optimizer, hyperparameters, state_value_kinds
from functrain.engine.protocol import (GradientTransformation, MaskOrFn, Params, ScalarOrSchedule,
                                       Updates)
from functrain.engine.counts import safe_increment
from functrain.engine.program import (chain, leaf_compute_dtype, state_compute_dtype)
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["SoapState", "scale_by_soap", "soap"]

_OWNER = "scale_by_soap"


@state_value_kinds(mu="signed", nu="unsigned", stats="matrix", bases="orthogonal")
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
        ``(0, 0)``: Orbax refuses to save zero-size arrays). A leaf split by
        ``block_size``: a ``(blocks, b, b)`` stack per rotated axis, row-major block
        order (a shorter last block in the leading corner, the rest zero).
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


# The transformations

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
    check_bools(owner, **flags)


def _check_leaf_state(where: str, lay: ss.Layout, stats: Any, bases: Any) -> None:
    for field, value in (("stats", stats), ("bases", bases)):
        want = ss.matrix_shapes(lay)
        got = [tuple(np.shape(m)) for m in value] if isinstance(value, tuple) else None
        if got != want:
            raise ValueError(f"{_OWNER}: updates leaf {where} (merged shape {lay.shape}) "
                             f"needs state .{field} matrices of shapes {want}, got "
                             f"{got if got is not None else type(value).__name__}: was the "
                             f"state made by this transformation's init for these params?")


@hyperparameters(static=("precondition_frequency", "max_precond_dim", "block_size", "mesh",
                 "weight_dimension_numbers", "group_same_shapes"), b1="number", b2="decay",
                 shampoo_beta="number or None", eps="number", precondition_frequency="number",
                 max_precond_dim="number", block_size="number or None")
def scale_by_soap(b1: float = 0.95, b2: float = 0.95, shampoo_beta: Optional[float] = None,
                  eps: float = 1e-8, precondition_frequency: int = 10,
                  max_precond_dim: int = 10000, merge_dims: bool = False,
                  precondition_1d: bool = False, normalize_grads: bool = False,
                  correct_bias: bool = True, *, block_size: Optional[int] = None,
                  mesh: Optional[jax.sharding.Mesh] = None,
                  weight_dimension_numbers: Any = None,
                  group_same_shapes: bool = False) -> GradientTransformation:
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
    ``precondition_1d``; scalars are plain Adam. Reference: Vyas et al., 2024,
    "SOAP: Improving and Stabilizing Shampoo using Adam" (Algorithm 3), and the
    authors' reference implementation, whose defaults these are.

    Memory per ``m x n`` leaf: ``2 m n + 2 (m^2 + n^2)``. Only ``mu`` and
    ``nu`` follow a sharded weight's sharding; the statistics' and bases'
    layout is XLA's choice (on a 4x2 mesh: bases replicated, rows of ``L_k``
    split like the weight's axis ``k``).

    A property of the algorithm (and the reference code): when a first statistic
    is rank-deficient (``G G^T`` of an ``m x n`` gradient, ``m > n``), ``eigh``'s
    basis of its null space is arbitrary, and later updates depend on it (Adam's
    step is not rotation invariant): runs that differ only in rounding (device
    count, sharding, backend) can then differ by the size of a step.

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
        rotated as ``(16, 64)``; :func:`functrain.matrix.blocks.merged_shape`).
      precondition_1d: rotate 1-D leaves too (one ``(n, n)`` statistic each).
      normalize_grads: divide each leaf's rotated-back direction by its RMS.
      correct_bias: Adam's bias correction, ``sqrt(1 - b2^t) / (1 - b1^t)``,
        applied as a step-size factor (``eps`` is not rescaled), as in the paper.
      block_size: split each rotated axis (after merging) longer than this into
        ``ceil(d / block_size)`` blocks as Shampoo does (the last may be shorter,
        never padded: :func:`functrain.matrix.blocks.block_grid`); each block
        is rotated as a separate leaf would be (own statistics, bases, ``nu``),
        ``normalize_grads`` stays per leaf. A split leaf's ``stats`` and
        ``bases`` are ``(blocks, b, b)`` per axis. ``None`` (the reference's): no blocks.
      mesh: a ``jax.sharding.Mesh``: one conditional refreshes every leaf's
        bases, the decompositions (``eigh`` on the first call, then power step
        and QR) of each size stacked and divided over the mesh's devices (each
        refreshes its share, then the bases are gathered), as distributed
        Shampoo does; the same numbers as one device. ``None``: each leaf
        refreshes its own bases, on every device.
      weight_dimension_numbers: stacked layers (a scanned model's ``(layers, m, n)``
        weights): ``MuonDimensionNumbers(reduction_axis, output_axis)``
        (:class:`functrain.contrib.MuonDimensionNumbers`), one for every leaf, a tree of
        them (``None`` entries) or a function of the params. A leaf given them is a stack
        of separate leaves ``(rows, cols)``, the reduction and the output axes
        multiplied together, one per entry of its other (layer) axes: the same numbers
        as those layers passed as leaves of their own, with ``stats`` and ``bases``
        stacked over the layer axes (``(layers, m, m)``), all layers in one batched
        step (``functrain.matrix.dimension_numbers``). ``None``: every leaf as it is.
      group_same_shapes: run same-shape leaves as one stacked leaf, the state kept per
        leaf: the same numbers, fewer computations, but on XLA:CPU no shorter compile
        (``functrain.matrix.shape_groups``). ``False`` (default): per leaf.

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
                 normalize_grads=normalize_grads, correct_bias=correct_bias,
                 group_same_shapes=group_same_shapes)
    _check_options(_OWNER, b1, b2, shampoo_beta, eps, precondition_frequency,
                   max_precond_dim, flags)
    block_size = check_block_size(_OWNER, block_size)
    check_dimension_numbers(weight_dimension_numbers, _OWNER)
    hp = ss.Hyper(b1, b2, b2 if shampoo_beta is None else shampoo_beta, eps,
                precondition_frequency, bool(normalize_grads), bool(correct_bias))

    def layout(x: Any, view: Optional[LayerView] = None) -> ss.Layout:
        lay = ss.layout(tuple(np.shape(x)) if view is None else view.layer_shape,
                      int(max_precond_dim), bool(merge_dims), bool(precondition_1d), block_size)
        if view is None:
            return lay
        return lay._replace(grid=lay.grid or tuple((1, d) for d in lay.shape), view=view)

    def views_of(tree: Any, leaves: list) -> list:
        if weight_dimension_numbers is None:
            return [None] * len(leaves)
        return layer_views(weight_dimension_numbers, tree, _OWNER)

    def init_fn(params: Params) -> SoapState:
        paths, leaves, treedef = ft.flatten_with_paths(params)
        ft.check_leaf_dtypes(paths, leaves, [True] * len(leaves), _OWNER, "params",
                             real_only=True)
        stats = []
        for x, view in zip(leaves, views_of(params, leaves)):
            lay = layout(x, view)
            dtype = ft.compute_dtype(jnp.result_type(x))
            stats.append(tuple(jnp.zeros(s, dtype) for s in ss.matrix_shapes(lay)))
        zeros = treedef.unflatten([ft.zeros_like(jnp.asarray(x) if not hasattr(x, "dtype")
                                                 else x) for x in leaves])
        return ft.distinct_buffers(SoapState(jnp.zeros([], jnp.int32), zeros, zeros,
                                             treedef.unflatten(stats),
                                             treedef.unflatten(stats)))

    def update_fn(updates: Updates, state: SoapState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, SoapState]:
        del extra_args
        check_state_type(state, SoapState, _OWNER)
        paths, gs, ps, treedef, fields = flatten_eigenbasis_inputs(updates, state, params,
                                                                   _OWNER)
        views = views_of(updates, gs)
        for where, x, v, s, q in zip(paths, gs, views, fields["stats"], fields["bases"]):
            _check_leaf_state(where or "<root>", layout(x, v), s, q)
        # same-shape leaves as one stacked leaf (functrain.matrix.shape_groups)
        leaf_gs, leaf_fields = gs, fields
        grouping = shape_groups([group_key(g, p, *(f[i] for f in fields.values()), static=v)
                               if group_same_shapes else None
                               for i, (g, p, v) in enumerate(zip(gs, ps, views))])
        gs, ps = stack_units(grouping, gs), stack_units(grouping, ps)
        lays = [layout(g, stacked_view(views[m[0]], leaf_gs[m[0]].shape, len(m)))
                for g, m in zip(gs, grouping.units)]
        want = [ss.matrix_shapes(lay) for lay in lays]
        fields = {name: stack_units(grouping, v, want if name in ("stats", "bases") else None)
                  for name, v in fields.items()}

        done, units, owners = [], [], []

        def put(i: int, bases: tuple, nu: Array) -> None:  # a leaf's refreshed bases and nu
            done[i][4] = tuple(q[0] if on else q for q, on in zip(bases, lays[i].rotated))
            done[i][2] = nu[0].reshape(gs[i].shape)

        for i, (g, p, lay) in enumerate(zip(gs, ps, lays)):
            cd = leaf_compute_dtype(g, p)
            mu, nu, stats, bases = (fields[name][i] for name in fields)
            mu, nu = (x.astype(state_compute_dtype(x, cd)) for x in (mu, nu))
            stats, bases = (tuple(m.astype(state_compute_dtype(m, cd)) for m in x)
                            for x in (stats, bases))
            args = (g.astype(cd), mu, nu, stats, bases, state.count, hp, lay)
            if lay.grid is not None:  # split: its blocks join the tree's refresh
                done.append(ss.soap_blocks(*args))
                units += [(gr[5], gr[6], gr[4], gr[1].rotated) for gr in done[-1][1:]]
                owners += done[-1][1:]
                continue
            done.append(list(ss.soap_leaf(*args)))
            if any(lay.rotated):
                unit = (*(tuple(m[None] if on else m for m, on in zip(x, lay.rotated))
                          for x in done[i][3:5]), done[i][2].reshape(lay.shape)[None],
                        lay.rotated)
                if mesh is None:  # the leaf's own conditional
                    put(i, *refresh_bases([unit], state.count, hp.precondition_frequency,
                                          map_by_shape)[0])
                else:
                    units.append(unit)
                    owners.append(i)
        if units:  # one conditional for the tree, its decompositions over the mesh's devices
            for owner, (bases, nu) in zip(owners, refresh_bases(
                    units, state.count, hp.precondition_frequency,
                    functools.partial(map_by_shape, mesh=mesh))):
                if isinstance(owner, list):
                    owner[6], owner[4] = bases, nu
                else:
                    put(owner, bases, nu)
        for i, lay in enumerate(lays):
            if lay.grid is not None:
                done[i] = ss.assemble(done[i], gs[i].shape, state.count, hp, lay)
        out, new = [], {name: [] for name in fields}
        for i, (g, (u, *news)) in enumerate(zip(gs, done)):
            out.append(u.astype(g.dtype))
            for name, n in zip(fields, news):
                new[name].append(jax.tree.map(lambda a, b: a.astype(b.dtype), n,
                                              fields[name][i]))
        new_state = SoapState(safe_increment(state.count), **{
            name: treedef.unflatten(unstack_units(grouping, v, leaf_fields[name]))
            for name, v in new.items()})
        return treedef.unflatten(unstack_units(grouping, out, leaf_gs)), new_state

    return GradientTransformation(init_fn, update_fn)


@declare_optimizer("beyond optax", "Vyas et al., 2024", optax=None, stressed=True, summary=(
    "SOAP (Vyas et al., 2024): Adam in Shampoo's eigenbasis, refreshed by power iteration + QR."),
    signature="soap(learning_rate=3e-3, b1=0.95, b2=0.95, ..., precondition_frequency=10)")
@hyperparameters(static=("precondition_frequency", "max_precond_dim", "block_size", "mesh",
                 "weight_dimension_numbers", "group_same_shapes"), learning_rate="schedule",
                 b1="number", b2="decay", shampoo_beta="number or None", eps="number",
                 weight_decay="schedule", precondition_frequency="number", max_precond_dim="number",
                 block_size="number or None")
@shared_args()
def soap(learning_rate: ScalarOrSchedule = 3e-3, b1: float = 0.95, b2: float = 0.95,
         shampoo_beta: Optional[float] = None, eps: float = 1e-8,
         weight_decay: ScalarOrSchedule = 0.01, precondition_frequency: int = 10,
         max_precond_dim: int = 10000, merge_dims: bool = False,
         precondition_1d: bool = False, normalize_grads: bool = False,
         correct_bias: bool = True, weight_decay_mask: Optional[MaskOrFn] = None, *,
         block_size: Optional[int] = None, mesh: Optional[jax.sharding.Mesh] = None,
         weight_dimension_numbers: Any = None, group_same_shapes: bool = False,
         cautious_weight_decay: bool = False) -> GradientTransformation:
    """SOAP (Vyas et al., 2024): Adam in Shampoo's eigenbasis, with decoupled weight decay.

    Update rule: ``N`` = :func:`scale_by_soap`'s direction (Adam's step taken
    in the eigenbases ``Q_L, Q_R`` of Shampoo's statistics ``L = EMA(G G^T)``,
    ``R = EMA(G^T G)``, rotated back), then ``W -= learning_rate * (N +
    weight_decay * W)``. The bases come from ``eigh`` on the first call (whose
    update is only the weight decay) and are refreshed every
    ``precondition_frequency`` steps by one power-iteration step and a QR.

    Reference: Vyas et al., 2024, "SOAP: Improving and Stabilizing Shampoo
    using Adam" (arXiv:2409.11321). The defaults are the authors' reference
    implementation's (``SOAP(lr=3e-3, betas=(.95, .95), weight_decay=.01,
    precondition_frequency=10)``, their README's for transformers): ``b1 = b2
    = 0.95`` as in their tuned Shampoo/Adam baselines; ``shampoo_beta`` follows
    ``b2``; a refresh every 10 steps keeps the ``O(d^3)`` QR cheap (SOAP degrades
    far less than Shampoo as the frequency drops); ``max_precond_dim=10000``
    rotates every axis of ordinary layers, each basis at most ``10^8`` numbers
    (a vocabulary axis stays unrotated); vectors get plain Adam.

    Differences from the reference code: the weight decay is optax-style, ``W
    -= lr * (N + wd W)`` (the reference multiplies the updated weight by ``1 -
    lr wd``: a difference of order ``lr^2 wd``), also on the first call (which
    the reference skips); its ``data_format='channels_last'`` has no counterpart.

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
      block_size: split axes longer than this into blocks, each preconditioned
        apart (see :func:`scale_by_soap`); ``None``: no blocks.
      mesh: divide each refresh's decompositions over this mesh's devices
        (see :func:`scale_by_soap`).
      weight_dimension_numbers: stacked layers: each layer of a leaf given
        ``MuonDimensionNumbers`` is preconditioned as a leaf of its own (see
        :func:`scale_by_soap`); ``None``: every leaf as it is.
      group_same_shapes: run same-shape leaves as one stack (see :func:`scale_by_soap`).
      <shared: cautious_weight_decay>

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
                               normalize_grads, correct_bias, block_size=block_size,
                               mesh=mesh, weight_dimension_numbers=weight_dimension_numbers,
                               group_same_shapes=group_same_shapes),
                 add_decayed_weights(weight_decay, weight_decay_mask,
                                     cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate))
