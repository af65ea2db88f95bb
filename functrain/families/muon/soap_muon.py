"""SOAP-Muon (Vyas et al., 2025): Muon's momentum preconditioned in SOAP's eigenbasis, then
orthogonalized.

Muon orthogonalizes the momentum ``M`` of each hidden matrix; SOAP-Muon first whitens it
the way SOAP whitens Adam's step: ``M`` is rotated into the eigenbases ``Q_L``, ``Q_R`` of
the moving averages of ``G G^T`` and ``G^T G`` (Shampoo's statistics), divided there by
the root of its own running second moment, rotated back and rescaled to ``M``'s norm; then
Newton-Schulz and Muon's width scale. It is the core of modded-nanogpt's optimizer-track
records #44-#46 (the record's code, read for its rule: ``soap_precondition_momentum``,
``soap_update_preconditioner`` and ``Muon.step``, on its default path). optax does not
have it.

Built from functrain's pieces: the eigenbasis math of :mod:`functrain.matrix.eigenbases`
(the Gram statistics, the rotations, and the refresh: ``eigh`` at the first update, then
every ``precondition_frequency`` steps one power-iteration step and QR with the columns
sorted by their Rayleigh quotients, the second moment permuted along), which SOAP uses;
Muon's batched Newton-Schulz over the tree, its width scale and its AdamW split
(:mod:`functrain.families.muon.muon`). ``MuonDimensionNumbers`` work as for SOAP: each layer of
a stacked leaf (each entry of its other axes) keeps statistics, bases and second moment of
its own.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from functrain import tree as ft
from functrain.arg_checks import (check_betas, check_bools, check_nonnegative, check_range,
                                  check_state_type)
from functrain.declarations import declare_optimizer, hyperparameters, state_value_kinds
from functrain.families.muon.muon import (check_options, muon_family, orthogonalize_tree,
                                          resolve_coeffs, scale_by_shape)
from functrain.matrix.dimension_numbers import (LayerView, MuonDimensionNumbers,
                                                check_dimension_numbers, dims_of_leaves,
                                                from_layers, layer_view, leaf_axes, stacked_shape,
                                                to_layers)
from functrain.engine.program import leaf_compute_dtype, state_compute_dtype
from functrain.engine.protocol import (GradientTransformation, MaskOrFn, Params, ScalarOrSchedule,
                                       Updates)
from functrain.engine.counts import safe_increment
from functrain.families.adam.optimizers import adamw
from functrain.matrix.blocks import map_by_shape
from functrain.matrix.eigenbases import flatten_eigenbasis_inputs, gram, refresh_bases, rotate
from functrain.numerics import ema_update
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["SoapMuonState", "scale_by_soap_muon", "soap_muon"]

_OWNER = "scale_by_soap_muon"
_DIMS = "weight_dimension_numbers"


@state_value_kinds(mu="signed", nu="unsigned", stats="matrix", bases="orthogonal")
class SoapMuonState(NamedTuple):
    """State of :func:`scale_by_soap_muon`.

    Attributes:
      count: the number of ``update`` calls so far (int32).
      mu: Muon's momentum, a tree like the params.
      nu: the second moment of the momentum in the rotated basis, a tree like the params
        (entry ``[i, j]`` of a matrix belongs to the ``i``-th / ``j``-th eigenvectors).
      stats: per leaf, ``(L, R)``: the moving averages of ``G G^T`` ``(rows, rows)`` and
        ``G^T G`` ``(cols, cols)``, rows the reduction axes' size and cols the output axes'
        (stacked over a leaf's layer axes: ``(layers, rows, rows)``); ``(1, 1)``
        placeholders for a zero-size leaf.
      bases: per leaf, the eigenbases ``(Q_L, Q_R)``, laid out like ``stats``.

    >>> import jax.numpy as jnp
    >>> state = scale_by_soap_muon().init({'w': jnp.zeros((3, 2))})
    >>> [q.shape for q in state.bases['w']]
    [(3, 3), (2, 2)]
    """

    count: Array
    mu: Any
    nu: Any
    stats: Any
    bases: Any


class _Layout(NamedTuple):
    view: LayerView  # the leaf as a stack of layers
    layers: int      # how many
    rows: int        # the product of the reduction axes' sizes
    cols: int        # the product of the output axes' sizes
    rotated: bool    # False for a zero-size leaf: no statistics, the momentum as it is


def _layout(shape: tuple, dims: Any, where: str) -> _Layout:
    shape = tuple(int(d) for d in shape)
    view = layer_view(dims, shape, where, _OWNER, _DIMS)
    red, out = leaf_axes(dims, shape, where, _OWNER, _DIMS)
    rows, cols = (math.prod(shape[a] for a in axes) for axes in (red, out))
    layers = math.prod(view.layers)
    return _Layout(view, layers, rows, cols, layers * rows * cols > 0)


def _matrix_shapes(lay: _Layout) -> list:
    if not lay.rotated:
        return [(1, 1), (1, 1)]
    return [stacked_shape(lay.view, (d, d)) for d in (lay.rows, lay.cols)]


class _Hyper(NamedTuple):
    beta: Any
    b2: Any
    eps: Any
    precondition_frequency: Any
    nesterov: bool


def _rotate_stack(x: Array, bases: tuple, back: bool) -> Array:
    """``Q_L^T X Q_R`` for each layer of ``x`` ``(n, rows, cols)`` (``back``: ``Q_L X Q_R^T``)."""
    return jax.vmap(lambda x, ql, qr: rotate(x, (ql, qr), (True, True), back=back))(x, *bases)


def _frobenius(x: Array) -> Array:
    return jnp.sqrt(jnp.sum(jnp.square(x), axis=(-2, -1), keepdims=True))


def _soap_muon_leaf(g: Array, mu: Array, nu: Array, stats: tuple, bases: tuple, count: Array,
                    hp: _Hyper, lay: _Layout) -> tuple:
    """One leaf's step before Newton-Schulz (arrays in its compute dtype): ``(P, mu, nu,
    stats, bases)``, the bases (and ``nu``'s order) refreshed after this step's use.

    ``count`` is the number of earlier calls: on the first (0) there is no basis yet, so
    ``P`` is the momentum itself and ``nu`` stays zero; the statistics are set and their
    eigenvectors taken after it.
    """
    mu = ema_update(g, mu, hp.beta)
    m = ema_update(g, mu, hp.beta) if hp.nesterov else mu
    if not lay.rotated:
        return m, mu, nu, stats, bases
    n = lay.layers
    g3, m3, v3 = (to_layers(x, lay.view).reshape(n, lay.rows, lay.cols) for x in (g, m, nu))
    stats, bases = (tuple(s.reshape((n,) + s.shape[-2:]) for s in x) for x in (stats, bases))
    rot = _rotate_stack(m3, bases, back=False)
    new_v = ema_update(jnp.square(rot), v3, hp.b2)
    root = jnp.sqrt(jnp.maximum(new_v, hp.eps ** 2))
    # a zero root has a zero numerator (new_v >= (1 - b2) rot^2): 0, not 0/0, with eps = 0
    p3 = _rotate_stack(rot / jnp.where(root > 0, root, 1), bases, back=True)
    norm = _frobenius(p3)
    p3 = p3 * (_frobenius(m3) / jnp.where(norm > 0, norm, 1))
    first = count == 0
    p3, v3 = jnp.where(first, m3, p3), jnp.where(first, v3, new_v)
    # the statistics from the raw gradient, after this step's preconditioning
    stats = tuple(ema_update(jax.vmap(lambda x, k=k: gram(x, k))(g3), s, hp.b2)
                  for k, s in enumerate(stats))
    [(bases, v3)] = refresh_bases([(stats, bases, v3, (True, True))], count,
                                  hp.precondition_frequency, map_by_shape)
    want = _matrix_shapes(lay)
    stats, bases = (tuple(s.reshape(w) for s, w in zip(x, want)) for x in (stats, bases))
    p, nu = (from_layers(x.reshape((n,) + lay.view.layer_shape), lay.view) for x in (p3, v3))
    return p, mu, nu, stats, bases


def _check_leaf_state(where: str, lay: _Layout, stats: Any, bases: Any) -> None:
    want = _matrix_shapes(lay)
    for field, value in (("stats", stats), ("bases", bases)):
        got = [tuple(np.shape(m)) for m in value] if isinstance(value, tuple) else None
        if got != want:
            raise ValueError(f"{_OWNER}: updates leaf {where} needs state .{field} matrices of "
                             f"shapes {want}, got "
                             f"{got if got is not None else type(value).__name__}: was the "
                             f"state made by this transformation's init for these params?")


@hyperparameters(static=("precondition_frequency",), beta="number", b2="number", eps="number",
                 precondition_frequency="int", ns_steps="int")
@shared_args()
def scale_by_soap_muon(beta: float = 0.95, b2: float = 0.9, eps: float = 1e-8,
                       precondition_frequency: int = 1, ns_coeffs: Any = "standard",
                       ns_steps: int = 5, nesterov: bool = True,
                       mu_dtype: Optional[Any] = None, *,
                       weight_dimension_numbers: Any = None) -> GradientTransformation:
    """Rescale updates by SOAP-Muon: the momentum whitened in SOAP's eigenbasis, orthogonalized.

    Update rule, per matrix ``G`` (``rows x cols``: the reduction axes by the output axes,
    see :class:`functrain.contrib.MuonDimensionNumbers`; each layer of a stacked leaf
    apart), as the record's ``Muon.step`` on its default path::

        mu = beta mu + (1 - beta) G
        M = beta mu + (1 - beta) G                     (Nesterov; else M = mu)
        first call (no basis yet):  P = M              (nu untouched)
        later:  X = Q_L^T M Q_R
                nu = b2 nu + (1 - b2) X^2
                P = Q_L [X / sqrt(max(nu, eps^2))] Q_R^T
                P <- P ||M||_F / ||P||_F
        O = NS(P / (||P||_F + eps))                    (Muon's Newton-Schulz)
        L = b2 L + (1 - b2) G G^T;  R = b2 R + (1 - b2) G^T G      (from zero)
        first call:  Q_L, Q_R = eigenvectors of L, R, largest eigenvalue first (eigh)
        call t > 0 with t % precondition_frequency == 0:            (for L; R alike)
            order Q_L's columns by diag(Q_L^T L Q_L), descending, and nu's rows with them
            Q_L = qr(L Q_L).Q                          (one power-iteration step)

    The momentum is the record's ``lerp`` form, ``momentum.lerp_(grad, 1 - mu)`` then
    ``grad.lerp(momentum, mu)``: Nesterov's look-ahead without bias correction (Muon's
    :func:`functrain.contrib.scale_by_muon` bias-corrects; the first step is the same
    direction either way). The statistics take the raw gradient and one decay ``b2`` with
    ``nu`` (the record's ``SOAP_BETA2``); a basis is used from the call after it is set.
    Choices where the record's code differs in form: it rescales ``P`` to ``M``'s norm
    ``sqrt(||M M^T||_F)`` (its ``gram_frobenius_norm_estimate``, the Schatten-4 norm), here
    the Frobenius norm; Newton-Schulz divides by the norm anyway, so the two differ only
    through ``eps``. Its Newton-Schulz is ``(a, b, c) = (2, -1.5, 0.5)`` for 12 steps in
    bfloat16 on ``X / sqrt(||X X^T||_F)``; here Muon's (``ns_coeffs='standard'``, 5
    steps, the Frobenius norm; pass ``ns_coeffs=(2., -1.5, .5), ns_steps=12`` for its
    polynomial). The record's other levers (its radius pin and update floor, the trust gate
    on attention projections, the KL and Shampoo variants) are not here.

    Reference: Vyas et al., 2025, "SOAP-Muon" (nikhilvyas.github.io/SOAP_Muon.pdf), as run
    by modded-nanogpt's optimizer-track records #44-#46; Vyas et al., 2024, "SOAP"
    (arXiv:2409.11321) for the eigenbasis and its refresh.

    Memory per ``m x n`` matrix: ``2 m n`` (``mu``, ``nu``) ``+ 2 (m^2 + n^2)`` (the
    statistics and bases). Each call: four rotations and two Gram products per matrix, a QR
    power step of each statistic every ``precondition_frequency`` calls (``eigh`` on the
    first), Newton-Schulz.

    Args:
      beta: the momentum's decay rate, in ``[0, 1)`` (the record's base ``mu``, which it
        schedules between 0.85 and 0.95: a schedule via ``inject_hyperparams``).
      b2: the decay of the statistics and of ``nu``, in ``[0, 1)``.
      eps: ``nu``'s floor is ``eps^2`` (the record's ``V.clamp_min(eps * eps)``), and the
        Newton-Schulz normalization's epsilon, ``>= 0``.
      precondition_frequency: refresh the bases every this many calls, an integer ``>= 1``.
      ns_coeffs: Newton-Schulz coefficients, as :func:`functrain.contrib.scale_by_muon`
        takes them: a triple, one triple per step, or a preset's name.
      <shared: ns_steps>
      nesterov: Nesterov's look-ahead ``beta mu + (1 - beta) g`` (default ``True``, the
        record's); ``False``: ``mu``.
      <shared: mu_dtype>
      weight_dimension_numbers: the matrix axes of each leaf, as
        :func:`functrain.contrib.scale_by_muon` takes them (``None``: the last two axes,
        leading axes stacked layers); each layer keeps statistics, bases and ``nu`` of its
        own, ``stats`` and ``bases`` stacked over the layer axes.

    Returns:
      A ``GradientTransformation`` whose state is :class:`SoapMuonState`. Leaves of rank
      below 2 are a ``ValueError`` naming the leaf (:func:`soap_muon` sends them to AdamW);
      complex and integer leaves a ``TypeError`` naming it.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_soap_muon()
    >>> g = {'w': jnp.array([[3., 0.], [0., 4.]])}
    >>> state = tx.init(g)
    >>> u, state = tx.update(g, state)  # the first step is Muon's
    >>> [round(float(x), 2) for x in jnp.diag(u['w'])]
    [0.72, 1.12]
    >>> u, state = tx.update(g, state)  # now whitened in the eigenbasis: equal entries
    >>> [round(float(x), 2) for x in jnp.diag(u['w'])]
    [1.11, 1.11]
    """
    check_betas(_OWNER, beta=beta, b2=b2)
    check_nonnegative(_OWNER, eps=eps)
    check_range("precondition_frequency", precondition_frequency, 1.0, owner=_OWNER)
    check_bools(_OWNER, nesterov=nesterov)
    check_options(_OWNER, ns_steps, "frobenius")
    coeffs, safety = resolve_coeffs(ns_coeffs, ns_steps, _OWNER)
    check_dimension_numbers(weight_dimension_numbers, _OWNER)
    spec = MuonDimensionNumbers(-2, -1) if weight_dimension_numbers is None \
        else weight_dimension_numbers
    hp = _Hyper(beta, b2, eps, precondition_frequency, bool(nesterov))

    def layouts(tree: Any, paths: list, leaves: list) -> list:
        dims = dims_of_leaves(spec, tree, _OWNER, _DIMS)
        return [_layout(np.shape(x), d, where or "<root>")
                for where, x, d in zip(paths, leaves, dims)]

    def init_fn(params: Params) -> SoapMuonState:
        paths, leaves, treedef = ft.flatten_with_paths(params)
        ft.check_leaf_dtypes(paths, leaves, [True] * len(leaves), _OWNER, "params",
                             real_only=True)
        stats = [tuple(jnp.zeros(s, ft.compute_dtype(jnp.result_type(x)))
                       for s in _matrix_shapes(lay))
                 for x, lay in zip(leaves, layouts(params, paths, leaves))]
        mu = treedef.unflatten([ft.zeros_like(x, mu_dtype) for x in leaves])
        nu = treedef.unflatten([ft.zeros_like(x) for x in leaves])
        return ft.distinct_buffers(SoapMuonState(jnp.zeros([], jnp.int32), mu, nu,
                                                 treedef.unflatten(stats),
                                                 treedef.unflatten(stats)))

    def update_fn(updates: Updates, state: SoapMuonState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, SoapMuonState]:
        del extra_args
        check_state_type(state, SoapMuonState, _OWNER)
        paths, gs, ps, treedef, fields = flatten_eigenbasis_inputs(updates, state, params,
                                                                   _OWNER)
        lays = layouts(updates, paths, gs)
        for where, lay, s, q in zip(paths, lays, fields["stats"], fields["bases"]):
            _check_leaf_state(where or "<root>", lay, s, q)

        directions, new = [], {name: [] for name in fields}
        for i, (g, p, lay) in enumerate(zip(gs, ps, lays)):
            cd = leaf_compute_dtype(g, p)
            mu, nu, stats, bases = (fields[name][i] for name in fields)
            mu, nu = (x.astype(state_compute_dtype(x, cd)) for x in (mu, nu))
            stats, bases = (tuple(m.astype(state_compute_dtype(m, cd)) for m in x)
                            for x in (stats, bases))
            d, *news = _soap_muon_leaf(g.astype(cd), mu, nu, stats, bases, state.count, hp,
                                       lay)
            directions.append(d)
            for name, value in zip(fields, news):
                new[name].append(jax.tree.map(lambda a, b: a.astype(b.dtype), value,
                                              fields[name][i]))
        o = orthogonalize_tree(treedef.unflatten(directions),
                                dims_of_leaves(spec, updates, _OWNER, _DIMS),
                                jnp.asarray(coeffs, float), ns_steps, "frobenius", eps, False,
                                _OWNER, None, "standard", safety, None)
        out = [x.astype(g.dtype) for x, g in zip(treedef.flatten_up_to(o), gs)]
        return treedef.unflatten(out), SoapMuonState(
            safe_increment(state.count),
            **{name: treedef.unflatten(v) for name, v in new.items()})

    return GradientTransformation(init_fn, update_fn)


@declare_optimizer("beyond optax", "Vyas et al., 2025", optax=None, stressed=True, summary=(
    "SOAP-Muon (Vyas et al., 2025): Muon's momentum whitened by Adam's second moment in SOAP's "
    "eigenbasis, then orthogonalized by Newton-Schulz; AdamW on the other leaves."),
    signature="soap_muon(learning_rate, beta=0.95, b2=0.9, ..., precondition_frequency=1, ...)")
@hyperparameters(static=("precondition_frequency",), learning_rate="schedule", beta="number",
                 b2="number", eps="number", precondition_frequency="int", ns_steps="int",
                 weight_decay="schedule", adam_b1="number", adam_b2="decay", adam_eps_root="number",
                 adam_weight_decay="schedule", adam_learning_rate="schedule or None")
@shared_args()
def soap_muon(learning_rate: ScalarOrSchedule, beta: float = 0.95, b2: float = 0.9,
              eps: float = 1e-8, precondition_frequency: int = 1, ns_coeffs: Any = "standard",
              ns_steps: int = 5, weight_decay: ScalarOrSchedule = 0.0,
              weight_decay_mask: Optional[MaskOrFn] = None, mu_dtype: Optional[Any] = None, *,
              nesterov: bool = True, adam_b1: float = 0.9, adam_b2: float = 0.999,
              adam_eps_root: float = 0.0, adam_weight_decay: ScalarOrSchedule = 0.0,
              adam_learning_rate: Optional[ScalarOrSchedule] = None,
              muon_weight_dimension_numbers: Any = None,
              cautious_weight_decay: bool = False) -> GradientTransformation:
    """SOAP-Muon (Vyas et al., 2025): SOAP-whitened Muon for matrices, AdamW for the rest.

    Update rule for a SOAP-Muon leaf: ``O`` = :func:`scale_by_soap_muon`'s orthogonalized
    whitened momentum; ``p -= lr * (sqrt(max(1, fan_out / fan_in)) O + weight_decay * p)``
    (Muon's width scale, ``fan_in`` / ``fan_out`` the sizes of the reduction / output axes:
    the record's ``max(1, rows / cols)**0.5`` on torch's ``(out, in)`` weights, the same
    factor). Other leaves: ``adamw(adam_learning_rate, adam_b1, adam_b2, eps,
    adam_eps_root, weight_decay=adam_weight_decay, nesterov=nesterov)``, as
    :func:`functrain.contrib.muon`. Which leaves are SOAP-Muon's: as ``muon``, the 2-D
    ones with ``muon_weight_dimension_numbers=None``, else those whose entry is not
    ``None``.

    The defaults are the record's (``b2 = 0.9``, a refresh every step, ``beta = 0.95`` its
    momentum's base, ``eps = 1e-8``), except Newton-Schulz (Muon's; see
    :func:`scale_by_soap_muon` for the record's and the other differences). Beyond Muon's
    momentum it keeps per ``m x n`` matrix two Gram statistics ``(m, m)``, ``(n, n)``, their
    two eigenbases and the rotated second moment ``(m, n)``.

    Reference: Vyas et al., 2025, "SOAP-Muon" (nikhilvyas.github.io/SOAP_Muon.pdf);
    modded-nanogpt's optimizer-track records #44-#46.

    Args:
      learning_rate: SOAP-Muon's step size, a number or a schedule of the step count.
      beta: the momentum's decay rate, in ``[0, 1)``.
      b2: the decay of the Gram statistics and of the rotated second moment, in ``[0, 1)``.
      eps: the second moment's floor is ``eps^2``; also Newton-Schulz's and AdamW's ``eps``.
      precondition_frequency: refresh the eigenbases every this many steps (``>= 1``).
      ns_coeffs: Newton-Schulz coefficients, as :func:`functrain.contrib.muon` takes them.
      <shared: ns_steps>
      weight_decay: decoupled weight decay of the SOAP-Muon leaves (multiplied by
        ``learning_rate``), ``>= 0``.
      weight_decay_mask: where to apply ``weight_decay`` among the SOAP-Muon leaves: a tree
        (or prefix) of bools or a function of the params; ``None``: all.
      mu_dtype: storage dtype of both optimizers' first moments.
      nesterov: Nesterov momentum, for SOAP-Muon and AdamW alike (default ``True``).
      <shared: adam_b1, adam_b2, adam_eps_root, adam_weight_decay, adam_learning_rate>
      muon_weight_dimension_numbers: which leaves are SOAP-Muon's and their matrix axes, as
        :func:`functrain.contrib.muon` takes them (a stacked leaf's layers each keep their
        own statistics).
      cautious_weight_decay: apply the weight decay only where the update and the param
        agree in sign (Cautious Weight Decay, Chen et al., 2025; see
        :func:`functrain.add_decayed_weights`), to ``weight_decay`` and
        ``adam_weight_decay`` alike; default ``False``.

    Returns:
      A ``GradientTransformation`` whose state is ``PartitionState`` with the entries
      ``'muon'`` (``MaskedState((SoapMuonState, EmptyState, EmptyState, EmptyState))``) and
      ``'adam'`` (AdamW's masked state), laid out as :func:`functrain.contrib.muon`'s.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.soap_muon(0.02)
    >>> params = {'w': jnp.ones((4, 3)), 'b': jnp.zeros(3)}
    >>> state = opt.init(params)
    >>> u, state = opt.update({'w': jnp.eye(4, 3), 'b': jnp.ones(3)}, state, params)
    >>> [round(float(x), 4) for x in (u['w'][0, 0], u['b'][0])]  # Muon's first step, AdamW's
    [-0.0137, -0.0295]
    """
    owner = "soap_muon"
    check_betas(owner, beta=beta, b2=b2, adam_b1=adam_b1, adam_b2=adam_b2)
    check_nonnegative(owner, eps=eps, adam_eps_root=adam_eps_root)
    check_range("precondition_frequency", precondition_frequency, 1.0, owner=owner)
    check_range("weight_decay", weight_decay, 0.0, owner=owner)
    check_options(owner, ns_steps, "frobenius")
    resolve_coeffs(ns_coeffs, ns_steps, owner)  # checked here, resolved by scale_by_soap_muon
    spec = (MuonDimensionNumbers() if muon_weight_dimension_numbers is None
            else muon_weight_dimension_numbers)
    direction = [scale_by_soap_muon(beta, b2, eps, precondition_frequency, ns_coeffs, ns_steps,
                                    nesterov, mu_dtype, weight_dimension_numbers=spec),
                 scale_by_shape(spec, None)]
    adam_tx = adamw(learning_rate if adam_learning_rate is None else adam_learning_rate,
                    b1=adam_b1, b2=adam_b2, eps=eps, eps_root=adam_eps_root, mu_dtype=mu_dtype,
                    weight_decay=adam_weight_decay, nesterov=nesterov,
                    cautious_weight_decay=cautious_weight_decay)
    return muon_family(direction, learning_rate, weight_decay, weight_decay_mask, adam_tx,
                       muon_weight_dimension_numbers, cautious=cautious_weight_decay)
