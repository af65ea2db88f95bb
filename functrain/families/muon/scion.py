"""Scion: stochastic conditional gradient with a chosen operator norm per layer (Pethick,
Xie, Antonakopoulos, Zhu, Silveti-Falls & Cevher, 2025, "Training Deep Learning Models with
Norm-Constrained LMOs", ICML 2025, arXiv:2502.07529).

Each leaf's step is the linear minimization oracle (LMO) of the momentum over a ball of the
leaf's own norm: ``lmo(d) = argmin_{||x|| <= rho} <d, x>``, which for the norms below is
``-rho * s(d)`` with ``s`` a normalized direction (Muon's orthogonalization for the spectral
norm, a sign, a per-column or per-row normalization). The paper's two algorithms, with the
momentum ``d <- (1 - alpha) d + alpha g`` (``alpha`` is :func:`scion`'s ``momentum``, one
minus the usual decay):

* uSCG (unconstrained): ``x <- x + lr * lmo(d)``, "Unconstrained Scion";
* SCG (constrained): ``x <- (1 - lr) x + lr * lmo(d)``, a convex combination that keeps every
  leaf in its ``rho``-ball: "Scion", and the official code's default (``unconstrained=False``).
  It is weight decay of exactly ``lr`` (``add_decayed_weights(1.0)`` before the learning rate).

The norms, in ``x @ W`` layout (``fan_in``/``fan_out``: the sizes of a leaf's reduction and
output axes, :class:`~functrain.contrib.MuonDimensionNumbers`; a leaf with no matrix view, a
bias or a gain, is one column: ``fan_in = 1``), each with its ``s`` as in the official code
(github.com/LIONS-EPFL/scion, ``scion.py``, its default flags):

=============  ==========================================  ===================================
name           ``s(d)``                                    official class (layers it is for)
=============  ==========================================  ===================================
``spectral``   ``sqrt(fan_out / fan_in) * NS(d)``          ``Spectral`` (hidden matrices)
``colnorm``    each input's slice over the output axes,    ``ColNorm`` (embeddings, one-hot
               ``d / (||d||_2 / sqrt(fan_out) + eps)``     inputs: each token's vector)
``rownorm``    each output's slice over the reduction      ``RowNorm``
               axes, ``d / (||d||_2 sqrt(fan_in) + eps)``
``sign``       ``sign(d) / fan_in``                        ``Sign`` (output layer; biases)
``rms``        ``d / (rms(d) + eps)``, per matrix          ``BiasRMS`` (biases, gains)
=============  ==========================================  ===================================

``NS`` is Muon's Newton-Schulz orthogonalization (Keller Jordan's quintic, 5 steps, as the
official code), batched over the tree as :func:`~functrain.contrib.muon` runs it. The default
(``norms=None``) is the official ``'Auto'``: ``'spectral'`` for leaves of rank >= 2 (each
matrix of their last two axes by default), ``'rms'`` for the others. The paper's and the
official examples' choice for a GPT is ``colnorm`` for the embedding, ``spectral`` for the
hidden matrices and ``sign`` for the output layer, with radii tuned per layer (README: 50 for
the hidden layers, 3000 for a tied embedding / output head). Memory: one momentum per leaf,
as Muon's; optax has no Scion.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from functrain import tree as ft
from functrain.arg_checks import (check_bools, check_hyperparameter, check_nonnegative,
                                  check_positive, check_range, check_state_type)
from functrain.declarations import declare_optimizer, hyperparameters, state_value_kinds
from functrain.families.muon.muon import (check_options, in_compute_dtype, orthogonalize_tree,
                                          resolve_coeffs)
from functrain.matrix.dimension_numbers import (MuonDimensionNumbers, check_dimension_numbers,
                                                dims_of_slots, entries_per_slot, leaf_axes)
from functrain.engine.program import chain, stage_transform
from functrain.engine.protocol import GradientTransformation, Params, ScalarOrSchedule, Updates
from functrain.engine.stage import LeafStage
from functrain.numerics import abs_sq
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate

Array = jax.Array

__all__ = ["ScaleByScionState", "scion_direction", "scale_by_scion", "scion"]

#: The norms, by name; the first three need a matrix view of the leaf.
SCION_NORMS = ("spectral", "colnorm", "rownorm", "sign", "rms")
_MATRIX_NORMS = SCION_NORMS[:3]
_DEFAULT_DIMS = MuonDimensionNumbers(-2, -1)


@state_value_kinds(mu="signed")
class ScaleByScionState(NamedTuple):
    """State of :func:`scale_by_scion`: the momentum ``d``.

    Attributes:
      mu: the momentum, a tree like the params.

    >>> import jax.numpy as jnp
    >>> scale_by_scion().init({'w': jnp.zeros((2, 3))})
    ScaleByScionState(mu={'w': Array([[0., 0., 0.],
           [0., 0., 0.]], dtype=float32)})
    """

    mu: Any


class _Leaf(NamedTuple):
    """One array leaf's plan: its key path, norm, matrix axes (``None``: a column) and radius."""

    path: str
    norm: str
    axes: Optional[tuple]
    scale: Any


def _is_norm_entry(x: Any) -> bool:
    return x is None or isinstance(x, str)


def _check_norms(norms: Any, owner: str) -> None:
    """Every entry of a norms tree (not a function) is a known name or ``None``."""
    if callable(norms):
        return
    for path, name in jax.tree_util.tree_flatten_with_path(norms, is_leaf=_is_norm_entry)[0]:
        if not _is_norm_entry(name):
            raise TypeError(f"{owner}: norms{jax.tree_util.keystr(path)} must be a norm's name "
                            f"or None, got {type(name).__name__} {name!r:.60}.")
        if name is not None and name not in SCION_NORMS:
            raise ValueError(f"{owner}: norms{jax.tree_util.keystr(path)} is {name!r}, not a "
                             f"norm: use one of {list(SCION_NORMS)} (or None, the default).")


def _check_scale(scale: Any, owner: str) -> None:
    for path, rho in jax.tree_util.tree_flatten_with_path(scale, is_leaf=lambda x: x is None)[0]:
        where = f"scale{jax.tree_util.keystr(path)}"
        check_hyperparameter(owner, where, rho, "number")
        check_nonnegative(owner, **{where: rho})


def _check_arguments(owner: str, momentum: Any, norms: Any, scale: Any, eps: Any,
                     ns_coeffs: Any, ns_steps: Any, dims: Any) -> tuple:
    """Checks the builders' shared arguments, naming each; returns the resolved coefficients
    and Newton-Schulz's safety factor."""
    check_positive(owner, momentum=momentum)
    check_range("momentum", momentum, 0.0, 1.0, high_inclusive=True, owner=owner)
    check_nonnegative(owner, eps=eps)
    check_options(owner, ns_steps, "frobenius")
    _check_norms(norms, owner)
    _check_scale(scale, owner)
    check_dimension_numbers(dims, owner)
    return resolve_coeffs(ns_coeffs, ns_steps, owner)


def _plan(norms: Any, scale: Any, dims: Any, tree: Any, owner: str) -> list:
    """A :class:`_Leaf` per array leaf of ``tree``, or a ``ValueError`` naming the leaf."""
    resolved = norms(tree) if callable(norms) else norms
    if callable(norms):
        _check_norms(resolved, owner)
    names = entries_per_slot(resolved, tree, _is_norm_entry, owner, "norms")
    scales = entries_per_slot(scale, tree, lambda x: x is None, owner, "scale")
    all_dims = dims_of_slots(_DEFAULT_DIMS if dims is None else dims, tree, owner,
                             "weight_dimension_numbers")
    plan = []
    for path, x, norm, rho, d in zip(ft.key_paths(tree), jax.tree_util.tree_leaves(
            tree, is_leaf=ft.is_placeholder), names, scales, all_dims):
        if ft.is_placeholder(x):
            continue
        path = path or "<root>"
        shape = tuple(np.shape(x))
        axes = None if d is None or len(shape) < 2 else leaf_axes(d, shape, path, owner)
        norm = norm if norm is not None else "spectral" if axes is not None else "rms"
        if norm in _MATRIX_NORMS and axes is None:
            raise ValueError(f"{owner}: leaf {path} of shape {shape} is given the norm "
                             f"{norm!r}, which needs a matrix (a leaf of rank >= 2 with "
                             f"weight_dimension_numbers): give it 'rms' or 'sign'.")
        plan.append(_Leaf(path, norm, axes, rho))
    return plan


def _direction(d: Array, o: Optional[Array], norm: str, axes: Optional[tuple],
               eps: Any) -> Array:
    """``s(d)`` of the module docstring's table (``o``: ``NS(d)`` for ``'spectral'``)."""
    red, out = axes if axes is not None else ((), tuple(range(d.ndim)))
    fan_in = max(1, math.prod(d.shape[a] for a in red))
    fan_out = max(1, math.prod(d.shape[a] for a in out))
    if norm == "spectral":
        return math.sqrt(fan_out / fan_in) * o
    if norm == "sign":
        return jnp.sign(d) / fan_in
    if norm == "colnorm":
        col = jnp.sqrt(jnp.sum(abs_sq(d), axis=out, keepdims=True))
        return d / (col / math.sqrt(fan_out) + eps)
    if norm == "rownorm":
        row = jnp.sqrt(jnp.sum(abs_sq(d), axis=red, keepdims=True))
        return d / (row * math.sqrt(fan_in) + eps)
    rms = jnp.sqrt(jnp.sum(abs_sq(d), axis=red + out, keepdims=True) / (fan_in * fan_out))
    return d / (rms + eps)


def _directions(tree: Any, plan: list, coeffs: Any, ns_steps: Any, safety: float, eps: Any,
                owner: str) -> Any:
    """``scale * s(d)`` for every array leaf of ``tree``; Newton-Schulz batched over the
    spectral leaves."""
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=ft.is_placeholder)
    arrays = [i for i, x in enumerate(leaves) if not ft.is_placeholder(x)]
    spectral = [(i, leaf) for i, leaf in zip(arrays, plan) if leaf.norm == "spectral"]
    ortho = dict(zip([i for i, _ in spectral], orthogonalize_tree(
        [leaves[i] for i, _ in spectral], [MuonDimensionNumbers(*leaf.axes) for _, leaf in
                                           spectral],
        jnp.asarray(coeffs, float), ns_steps, "frobenius", eps, False, owner, safety=safety)))
    out = list(leaves)
    for i, leaf in zip(arrays, plan):
        out[i] = leaf.scale * _direction(leaves[i], ortho.get(i), leaf.norm, leaf.axes, eps)
    return treedef.unflatten(out)


def scion_direction(x: Array, norm: str,
                    weight_dimension_numbers: Optional[MuonDimensionNumbers] = None, *,
                    eps: float = 1e-8, ns_coeffs: Any = "standard",
                    ns_steps: int = 5) -> Array:
    """The direction ``s(x)`` of one array under a Scion norm: ``lmo(x) = -rho * s(x)``.

    The formulas are the module docstring's table; every ``s`` has norm (of its kind) 1 and
    ``<x, s(x)>`` maximal among such. ``'spectral'`` has every singular value
    ``sqrt(fan_out / fan_in)`` up to Newton-Schulz's accuracy; ``'colnorm'`` each input's
    slice of norm ``sqrt(fan_out)``; ``'sign'`` entries ``+-1 / fan_in``.

    Args:
      x: the array (a momentum, a gradient).
      norm: one of ``'spectral'``, ``'colnorm'``, ``'rownorm'``, ``'sign'``, ``'rms'``.
      weight_dimension_numbers: its matrix axes (``None``: the last two for rank >= 2, else
        ``x`` is a column, ``fan_in = 1``).
      eps: added to the norms divided by.
      ns_coeffs: Newton-Schulz's coefficients (``'spectral'``), as
        :func:`~functrain.contrib.scale_by_muon` takes them.
      ns_steps: Newton-Schulz's steps.

    Returns:
      ``s(x)``, shaped like ``x``.

    >>> import jax.numpy as jnp
    >>> scion_direction(jnp.array([[3., -1.], [0., 2.]]), 'sign')
    Array([[ 0.5, -0.5],
           [ 0. ,  0.5]], dtype=float32)
    """
    owner = "scion_direction"
    x = jnp.asarray(x)
    _check_norms(norm, owner)
    coeffs, safety = resolve_coeffs(ns_coeffs, ns_steps, owner)
    plan = _plan(norm, 1.0, weight_dimension_numbers, x, owner)
    return _directions(x, plan, coeffs, ns_steps, safety, eps, owner)


@hyperparameters(static=("norms", "weight_dimension_numbers"), momentum="number", eps="number",
                 ns_steps="int")
def scale_by_scion(momentum: float = 0.1, *, norms: Any = None, scale: Any = 1.0,
                   eps: float = 1e-8, ns_coeffs: Any = "standard", ns_steps: int = 5,
                   weight_dimension_numbers: Any = None,
                   mu_dtype: Optional[Any] = None) -> GradientTransformation:
    """Scion's direction: each leaf's LMO over its norm's ball of radius ``scale``, negated.

    Update rule, per leaf: ``d = (1 - momentum) d + momentum g`` (no bias correction, as
    the official code: ``d`` starts at zero and every ``s`` below is scale-invariant up to
    ``eps``), then ``u = scale * s(d)`` with ``s`` the leaf's norm's direction
    (:func:`scion_direction`, the module docstring's table): ``-u`` is ``lmo(d)``. Follow it
    with the learning rate (and, for the constrained method, ``add_decayed_weights(1.0)``
    before it): :func:`scion`. Reference: Pethick et al., 2025, "Training Deep Learning
    Models with Norm-Constrained LMOs" (arXiv:2502.07529).

    Args:
      momentum: the weight of the new gradient, in ``(0, 1]`` (the official code's
        ``momentum``, one minus the usual decay: SGD's ``momentum=0.9`` is ``0.1`` here;
        ``1``: no averaging). The README's default 0.1.
      norms: which norm each leaf gets: ``None`` (the official ``'Auto'``: ``'spectral'``
        for leaves with a matrix view, ``'rms'`` for the others), one name for every leaf,
        a tree (or prefix) of names and ``None`` (the default), or a function of the params
        returning one. Names: ``'spectral'``, ``'colnorm'``, ``'rownorm'`` (these need a
        matrix view), ``'sign'``, ``'rms'``.
      scale: the radius ``rho`` of each leaf's ball, ``>= 0``: a number, or a tree (prefix)
        of numbers (the official code's per-group ``scale``).
      eps: added to the norms divided by (the column, row and RMS norms, and Newton-Schulz's
        Frobenius normalization), ``>= 0``.
      ns_coeffs: Newton-Schulz's coefficients, as :func:`~functrain.contrib.scale_by_muon`
        takes them (default: Keller Jordan's, as the official code).
      ns_steps: Newton-Schulz's steps (the official default 5).
      weight_dimension_numbers: each leaf's matrix axes, as
        :func:`~functrain.contrib.scale_by_muon` takes them (``None``: the last two axes of
        every leaf of rank >= 2, earlier axes stacking matrices); a ``None`` entry, or a
        leaf of rank < 2, has no matrix view: it is one column (``fan_in = 1``).
      mu_dtype: the momentum's storage dtype; ``None``: each parameter's.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByScionState`.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_scion(norms={'w': 'spectral', 'b': 'sign'}, scale=2.0)
    >>> g = {'w': jnp.array([[3., 0.], [0., 4.]]), 'b': jnp.array([0.5, -1.0])}
    >>> u, _ = tx.update(g, tx.init(g))
    >>> u['b']
    Array([ 2., -2.], dtype=float32)
    """
    owner = "scale_by_scion"
    coeffs, safety = _check_arguments(owner, momentum, norms, scale, eps, ns_coeffs, ns_steps,
                                      weight_dimension_numbers)

    def leaf(g: Array, s: Any, p: Any, ctx: Any) -> tuple:
        mu = (1 - momentum) * s.mu + momentum * g
        return mu, s._replace(mu=mu)

    average = stage_transform(LeafStage(
        name=owner, update_leaf=leaf, state_cls=ScaleByScionState, leaf_fields=("mu",),
        init_leaf=lambda p: (ft.zeros_like(p, mu_dtype),)))

    def init_fn(params: Params) -> ScaleByScionState:
        _plan(norms, scale, weight_dimension_numbers, params, owner)  # errors name the leaf
        return average.init(params)

    def update_fn(updates: Updates, state: ScaleByScionState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, ScaleByScionState]:
        check_state_type(state, ScaleByScionState, owner)
        d, state = average.update(in_compute_dtype(updates, params, owner), state, params,
                                  **extra_args)
        u = _directions(d, _plan(norms, scale, weight_dimension_numbers, d, owner), coeffs,
                        ns_steps, safety, eps, owner)
        return jax.tree.map(lambda u, g: u if ft.is_placeholder(g) else u.astype(g.dtype),
                            u, updates, is_leaf=ft.is_placeholder), state

    return GradientTransformation(init_fn, update_fn)


@declare_optimizer("beyond optax", "Pethick et al., 2025", optax=None, stressed=True, summary=(
    "Scion (Pethick et al., 2025): a conditional-gradient step to the LMO of the momentum over "
    "each layer's norm ball (spectral for hidden matrices via Newton-Schulz, column-normalized, "
    "sign, RMS), constrained by default: `x <- (1 - lr) x + lr lmo(d)`."),
    signature="scion(learning_rate, momentum=0.1, *, norms=None, scale=1.0, constrained=True, "
              "...)")
@hyperparameters(static=("norms", "weight_dimension_numbers"), learning_rate="schedule",
                 momentum="number", eps="number", ns_steps="int")
def scion(learning_rate: ScalarOrSchedule, momentum: float = 0.1, *, norms: Any = None,
          scale: Any = 1.0, constrained: bool = True, eps: float = 1e-8,
          ns_coeffs: Any = "standard", ns_steps: int = 5, weight_dimension_numbers: Any = None,
          mu_dtype: Optional[Any] = None) -> GradientTransformation:
    """Scion (Pethick et al., 2025): conditional gradient over each layer's norm ball.

    Update rule, per leaf, with ``s`` its norm's direction (:func:`scale_by_scion`, the
    module docstring's table) and ``rho`` its ``scale``: ``d = (1 - momentum) d + momentum
    g``; constrained (SCG, "Scion", the official default): ``x <- (1 - lr) x - lr rho s(d)``,
    which keeps each leaf in its ``rho``-ball; ``constrained=False`` (uSCG, "Unconstrained
    Scion"): ``x <- x - lr rho s(d)``. Every leaf is Scion's (no AdamW side); the state is
    one momentum per leaf. The official code's norm options that are constant factors
    (``Spectral(max=True)``, ``ColNorm(normalized=True)``, ``Sign(normalized=False)``) are
    per-leaf ``scale`` values here; its ``SpectralConv`` (PyTorch ``(out, in, k, k)``) scales
    by ``sqrt(out / in) / k**2``, where ``'spectral'`` with
    ``MuonDimensionNumbers((0, 1, 2), 3)`` on a ``(k, k, in, out)`` kernel gives
    ``sqrt(out / (in k**2))``; its ``BiasRMS`` of a matrix normalizes each column (axis 0),
    ``'rms'`` each matrix (the same for a vector). Its Newton-Schulz runs in bfloat16 with
    ``eps = 1e-7``, here in the updates' compute dtype with ``eps``. Reference: Pethick, Xie, Antonakopoulos, Zhu, Silveti-Falls & Cevher,
    2025, "Training Deep Learning Models with Norm-Constrained LMOs" (ICML 2025,
    arXiv:2502.07529); code github.com/LIONS-EPFL/scion.

    Args:
      learning_rate: ``lr`` (the paper's ``gamma``), a number or a schedule; with
        ``constrained`` it is also the weight decay, so keep it ``<= 1``.
      momentum: the weight of the new gradient in ``d``, in ``(0, 1]`` (one minus the usual
        decay; the README's default 0.1; ``1``: the gradient itself).
      norms: which norm each leaf gets, as :func:`scale_by_scion` takes it (``None``:
        ``'spectral'`` for leaves of rank >= 2, ``'rms'`` for the others; for a GPT the
        paper uses ``'colnorm'`` for the embedding and ``'sign'`` for the output layer).
      scale: each leaf's radius ``rho``: a number or a tree (prefix) of numbers.
      constrained: the constrained method (SCG), default ``True``; ``False``: uSCG.
      eps: as :func:`scale_by_scion`'s.
      ns_coeffs: Newton-Schulz's coefficients, as :func:`~functrain.contrib.muon`'s.
      ns_steps: Newton-Schulz's steps.
      weight_dimension_numbers: each leaf's matrix axes, as :func:`scale_by_scion`'s
        (``None``: the last two axes of leaves of rank >= 2).
      mu_dtype: the momentum's storage dtype.

    Returns:
      A ``GradientTransformation``: ``chain(scale_by_scion(...), add_decayed_weights(1.0),
      scale_by_learning_rate(learning_rate))`` (without the decay when not ``constrained``);
      ``update`` needs the params when ``constrained``.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.scion(0.1, norms={'embed': 'colnorm', 'out': 'sign'},
    ...                               scale={'embed': 1.0, 'out': 10.0})
    >>> params = {'embed': jnp.ones((5, 4)), 'out': jnp.ones((4, 5))}
    >>> u, _ = opt.update(params, opt.init(params), params)
    >>> [round(float(x), 4) for x in (u['embed'][0, 0], u['out'][0, 0])]  # -lr(rho s + x)
    [-0.2, -0.35]
    """
    check_bools("scion", constrained=constrained)
    _check_arguments("scion", momentum, norms, scale, eps, ns_coeffs, ns_steps,
                     weight_dimension_numbers)
    direction = scale_by_scion(momentum, norms=norms, scale=scale, eps=eps,
                               ns_coeffs=ns_coeffs, ns_steps=ns_steps,
                               weight_dimension_numbers=weight_dimension_numbers,
                               mu_dtype=mu_dtype)
    decay = [add_decayed_weights(1.0)] if constrained else []
    return chain(direction, *decay, scale_by_learning_rate(learning_rate))
