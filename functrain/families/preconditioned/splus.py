"""SPlus (Frans, Levine & Abbeel, 2025): the sign of the momentum in Shampoo's eigenbasis.

Per weight matrix ``G`` (``m x n``) SPlus keeps Shampoo's two gradient statistics, ``L =
EMA(G G^T)`` and ``R = EMA(G^T G)``, and their eigenbases ``Q_L, Q_R``, refreshed by ``eigh``
on the first step and then every ``inverse_every`` steps. The update is the momentum
rotated into the eigenbasis, its sign taken there ("instant sign normalization") and
rotated back, ``Q_L sign(Q_L^T M Q_R) Q_R^T``: bounded whatever the age of the bases, which
is what lets them be refreshed rarely. The step is scaled by ``2 / (m + n)`` so that one
learning rate carries over widths, and the method keeps an EMA of the parameters, where it
is evaluated (:func:`splus_get_eval_params`).

:func:`scale_by_splus` follows Shampoo's pattern (:mod:`functrain.families.preconditioned.shampoo`): a
``LeafStage`` for ``init`` and the engine's input checks, and the math over the whole tree,
so that one ``lax.cond`` refreshes every basis, the ``eigh`` calls one matrix at a time on
CPU (:func:`functrain.matrix.blocks.map_by_shape`, which cannot deadlock XLA:CPU's pool:
docs/matrix_optimizers.md) and divided over a mesh's devices when given one.

optax has no SPlus: the numbers are checked against a float64 numpy version of the
authors' official optax implementation (github.com/kvfrans/splus, ``optax/splus.py``) in
tests/contrib/test_contrib_splus.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from functrain import tree as ft
from functrain.arg_checks import check_betas, check_nonnegative, check_range, check_state_type
from functrain.declarations import declare_optimizer, hyperparameters, state_value_kinds
from functrain.matrix.blocks import map_by_shape
from functrain.numerics import ema_update
from functrain.engine.protocol import (EmptyState, GradientTransformation, MaskOrFn, Params,
                                       ScalarOrSchedule, Updates)
from functrain.engine.stage import LeafChecks, LeafStage, as_array
from functrain.engine.counts import safe_increment
from functrain.engine.program import chain, leaf_compute_dtype, run_block, state_compute_dtype
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["SplusState", "scale_by_splus", "splus", "splus_get_eval_params"]

_OWNER = "scale_by_splus"
_HIGHEST = lax.Precision.HIGHEST
_FIELDS = ("mu", "ema", "stats_l", "stats_r", "bases_l", "bases_r")


@state_value_kinds(mu="signed", ema="keep", stats_l="matrix", stats_r="matrix",
                   bases_l="matrix", bases_r="matrix")
class SplusState(NamedTuple):
    """State of :func:`scale_by_splus`: the official code's ``SPlusState``, its ``ema_rate``
    replaced by the EMA's running weight.

    The EMA, statistics and bases are never stored in low bits (``quantized_state``
    keeps them): an average moving by ``1 - ema_rate = 0.001`` of the parameters per
    step is below an 8-bit code's resolution, and a quantized eigenbasis is no longer
    orthogonal.

    Attributes:
      count: the number of ``update`` calls so far (int32).
      ema_weight: ``1 - ema_rate^count``, the weight of the EMA (the EMA of the
        constant 1, in the same arithmetic), a scalar of the default float dtype:
        :func:`splus_get_eval_params` divides by it.
      mu: the momentum of the gradients, a tree like the params.
      ema: the EMA of the parameters (at least float32), a tree like the params.
      stats_l: per leaf, ``L = EMA(G G^T)`` as a ``(1, m, m)`` stack (Shampoo's
        one-block layout, at least float32); a ``(1,)`` placeholder where the rows
        are not rotated (not a matrix, or ``m >= max_dim``).
      stats_r: ``R = EMA(G^T G)``, ``(1, n, n)``, likewise for the columns.
      bases_l: the eigenvectors of ``stats_l`` at its last refresh (the identity
        at first), same shapes.
      bases_r: those of ``stats_r``.

    >>> import jax.numpy as jnp
    >>> state = scale_by_splus().init({'w': jnp.zeros((3, 2)), 'b': jnp.zeros(2)})
    >>> state.bases_l['w'].shape, state.bases_r['w'].shape, state.bases_l['b'].shape
    ((1, 3, 3), (1, 2, 2), (1,))
    """

    count: Array
    ema_weight: Array
    mu: Any
    ema: Any
    stats_l: Any
    stats_r: Any
    bases_l: Any
    bases_r: Any


def _sides(shape: tuple, max_dim: int) -> tuple[bool, bool]:
    """Which axes of a leaf are rotated: those shorter than ``max_dim`` of a non-empty
    matrix (the official code's ``d < max_dim``); no axis of any other leaf."""
    if len(shape) != 2 or 0 in shape:
        return False, False
    return shape[0] < max_dim, shape[1] < max_dim


def _side_shapes(shape: tuple, max_dim: int) -> tuple[tuple, tuple]:
    dims = shape if len(shape) == 2 else (1, 1)
    return tuple((1, d, d) if on else (1,) for d, on in zip(dims, _sides(shape, max_dim)))


def _mm(a: Array, b: Array) -> Array:
    return jnp.matmul(a, b, precision=_HIGHEST)


def _rotate(x: Array, bases: tuple, sides: tuple, back: bool) -> Array:
    """``Q_L^T X Q_R`` over the rotated sides (into the eigenbasis), or ``Q_L X Q_R^T``."""
    (ql, qr), (left, right) = bases, sides
    if left:
        x = _mm(ql[0] if back else ql[0].T, x)
    if right:
        x = _mm(x, qr[0].T if back else qr[0])
    return x


class _Hyper(NamedTuple):
    b1: Any
    b2: Any
    ema_rate: Any
    eps: Any
    inverse_every: int
    max_dim: int


def _splus_leaf(g: Array, p: Array, mu: Array, ema: Array, stats: tuple, bases: tuple,
                hp: _Hyper) -> tuple:
    """One leaf's ``(u, mu, ema, stats)``; the update uses the bases from before this
    step's refresh, as the official code does."""
    sides = _sides(g.shape, hp.max_dim)
    mu = ema_update(g, mu, hp.b1)
    u = _rotate(jnp.sign(_rotate(mu, bases, sides, back=False)), bases, sides, back=True)
    grams = (lambda x: _mm(x, x.T), lambda x: _mm(x.T, x))
    stats = tuple(ema_update(gram(g.astype(s.dtype))[None], s, hp.b2) if on else s
                  for gram, s, on in zip(grams, stats, sides))
    return u, mu, ema_update(p.astype(ema.dtype), ema, hp.ema_rate), stats


def _eigenbasis(eps: Any) -> Any:
    def fn(s: Array) -> Array:  # the official code's eigh(S + eps I); columns ascending
        return jnp.linalg.eigh(s + eps * jnp.eye(s.shape[-1], dtype=s.dtype))[1]
    return fn


def _check_state_shapes(where: str, s: tuple, shape: tuple, max_dim: int) -> None:
    for name, want in zip(("stats_l", "stats_r"), _side_shapes(shape, max_dim)):
        for field in (name, name.replace("stats", "bases")):
            got = tuple(np.shape(getattr(s, field)))
            if got != want:
                raise ValueError(
                    f"{_OWNER}: state .{field} has shape {got} at updates leaf {where or '<root>'} "
                    f"(shape {shape}), expected {want}: was the state made with another "
                    f"max_dim?")


@hyperparameters(static=("inverse_every", "max_dim", "mesh"), b1="number", b2="number",
                 ema_rate="number", eps="number", inverse_every="int", max_dim="int")
def scale_by_splus(b1: float = 0.9, b2: float = 0.999, ema_rate: float = 0.999,
                   eps: float = 1e-30, inverse_every: int = 100, max_dim: int = 10000, *,
                   mesh: Optional[jax.sharding.Mesh] = None) -> GradientTransformation:
    """SPlus's direction: the momentum's sign in the eigenbasis of Shampoo's statistics.

    Per matrix leaf ``G`` (``m x n``), at step ``t`` (from 1)::

        M = b1 M + (1 - b1) G
        U = Q_L sign(Q_L^T M Q_R) Q_R^T          (with the bases from before this step)
        L = b2 L + (1 - b2) G G^T;   R = b2 R + (1 - b2) G^T G
        if t == 1 or t % inverse_every == 0:  Q_L = eigvecs(L + eps I), Q_R = eigvecs(R + eps I)
        E = ema_rate E + (1 - ema_rate) P         (P: the parameters given to update)

    ``Q_L, Q_R`` start as the identity, so the first update is ``sign(M)``. An axis of
    length ``>= max_dim`` is not rotated (its basis is the identity); leaves that are not
    matrices (vectors, scalars, tensors of rank 3 or more) get ``U = sign(M)``. The
    update is bounded: its Frobenius norm is ``sqrt(m n)`` at most, however stale the
    bases. Reference: Frans, Levine & Abbeel, 2025, "A Stable Whitening Optimizer for
    Efficient Neural Network Training" (arXiv:2506.07254); the defaults and conventions
    are the authors' official optax implementation's (github.com/kvfrans/splus,
    ``optax/splus.py``): the update uses the bases from before the refresh, the
    statistics take the raw gradient, there is no bias correction (the sign makes it
    irrelevant), and the EMA averages the parameters given to ``update`` (the torch
    version averages the parameters after the step). Two storage choices differ from
    it, for low-precision parameters: the statistics, bases and EMA are kept in at least
    float32 (a bfloat16 average with ``ema_rate = 0.999`` would not move).

    Args:
      b1: the momentum's decay, in ``[0, 1)``.
      b2: the statistics' decay, in ``[0, 1)``.
      ema_rate: the decay of the parameters' EMA, in ``[0, 1)``.
      eps: added to the statistics' diagonal before ``eigh``, ``>= 0``.
      inverse_every: refresh the eigenbases every this many steps (and on the
        first), an int ``>= 1``.
      max_dim: axes of this length or longer are not rotated, an int ``>= 1``.
      mesh: a ``jax.sharding.Mesh``: each refresh's ``eigh`` calls (same-size
        statistics stacked) are divided over its devices, then the bases gathered
        (the official code's ``jit_broadcast_computation``); the same numbers as
        one device. ``None``: every device decomposes every statistic.

    Returns:
      A ``GradientTransformation`` whose state is :class:`SplusState`; its ``update``
      needs ``params`` (the EMA). Complex leaves and integer params raise a ``TypeError``
      naming the leaf (integer gradients are computed as floats).

    >>> import jax.numpy as jnp
    >>> tx = scale_by_splus()
    >>> params = {'w': jnp.zeros((2, 2))}
    >>> state = tx.init(params)
    >>> u, state = tx.update({'w': jnp.array([[2., -1.], [0., 3.]])}, state, params)
    >>> print(u['w'])  # the bases start as the identity: sign(M)
    [[ 1. -1.]
     [ 0.  1.]]
    >>> u, state = tx.update({'w': jnp.array([[1., 2.], [3., 1.]])}, state, params)
    >>> print(f"{float(jnp.linalg.norm(u['w'])):.4f}")  # rotated signs: |U|_F = sqrt(m n)
    2.0000
    """
    check_betas(_OWNER, b1=b1, b2=b2, ema_rate=ema_rate)
    check_nonnegative(_OWNER, eps=eps)
    check_range("inverse_every", inverse_every, 1.0, owner=_OWNER)
    check_range("max_dim", max_dim, 1.0, owner=_OWNER)
    hp = _Hyper(b1, b2, ema_rate, eps, int(inverse_every), int(max_dim))

    def init_leaf(p: Any) -> tuple:
        sdt = jnp.promote_types(p.dtype, jnp.float32)
        shapes = _side_shapes(tuple(p.shape), hp.max_dim)
        eye = [jnp.eye(s[-1], dtype=sdt)[None] if len(s) == 3 else jnp.zeros(s, sdt)
               for s in shapes]
        return (ft.zeros_like(p), ft.zeros_like(p, sdt), *(jnp.zeros(s, sdt) for s in shapes),
                *eye)

    def init_global() -> dict:
        return {"count": jnp.zeros([], jnp.int32),
                "ema_weight": jnp.zeros([], dtype=float)}

    # The engine's stage for init and for its input checks (structures, shapes, dtypes,
    # params given, state type); its arithmetic is the identity, which XLA drops. The math
    # runs over the whole tree, so that one conditional refreshes every basis.
    checks = LeafStage(
        name=_OWNER, update_leaf=lambda g, s, p, ctx: (g, tuple(s)), state_cls=SplusState,
        leaf_fields=_FIELDS, init_leaf=init_leaf, init_global=init_global,
        checks=LeafChecks(needs_params=True, shaped_fields=("mu", "ema"), real_only=True))

    def update_fn(updates: Updates, state: SplusState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, SplusState]:
        run_block((checks,), updates, (state,), params, extra_args)
        paths, gs, treedef = ft.flatten_with_paths(updates)
        ft.check_leaf_dtypes(paths, gs, [True] * len(gs), checks.name, "updates")
        gs = [as_array(g) for g in gs]
        ps = [as_array(p) for p in treedef.flatten_up_to(params)]
        olds = [treedef.flatten_up_to(getattr(state, f)) for f in _FIELDS]
        step = safe_increment(state.count)
        refresh = (step == 1) | (step % hp.inverse_every == 0)

        done, items, owners = [], [], []
        for where, g, p, *old in zip(paths, gs, ps, *olds):
            cd = leaf_compute_dtype(g, p)
            mu, ema, *mats = (o.astype(state_compute_dtype(o, cd)) for o in old)
            _check_state_shapes(where, checks.leaf_state(old), tuple(g.shape), hp.max_dim)
            u, mu, ema, stats = _splus_leaf(g.astype(cd), p.astype(cd), mu, ema,
                                            tuple(mats[:2]), tuple(mats[2:]), hp)
            done.append([u.astype(g.dtype), mu, ema, *stats, *mats[2:]])
            for k, on in enumerate(_sides(tuple(g.shape), hp.max_dim)):
                if on:
                    items.append((stats[k], mats[2 + k]))
                    owners.append((len(done) - 1, 5 + k))  # done[i]: u, mu, ema, L, R, Q_L, Q_R
        if items:  # one conditional for the tree; eigh one matrix at a time on CPU
            def fresh(pairs: list) -> list:
                return map_by_shape(_eigenbasis(hp.eps), [(s,) for s, _ in pairs], mesh)

            bases = lax.cond(refresh, fresh, lambda pairs: [q for _, q in pairs], items)
            for (i, k), q in zip(owners, bases):
                done[i][k] = q
        out, new = [], [[] for _ in _FIELDS]
        for (u, *fields), old in zip(done, zip(*olds)):
            out.append(u)
            for lst, n, o in zip(new, fields, old):
                lst.append(n.astype(o.dtype))
        weight = ema_update(1, state.ema_weight, hp.ema_rate).astype(state.ema_weight.dtype)
        return treedef.unflatten(out), SplusState(
            step, weight, *(treedef.unflatten(v) for v in new))

    return GradientTransformation(checks.init_function(), update_fn)


def _path_name(path: tuple) -> str:
    """A key path as the official code writes it: the keys joined by ``/``."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
                    for k in path)


def _scale_by_shape(nonstandard_constant: Any, nonstandard_strings: tuple,
                    max_dim: int) -> GradientTransformation:
    """Multiply each leaf by SPlus's shape-aware factor (see :func:`splus`)."""

    def factor(path: tuple, shape: tuple) -> Any:
        name = _path_name(path).lower()
        if (len(shape) == 2 and max(shape) < max_dim and sum(shape) > 0
                and not any(s.lower() in name for s in nonstandard_strings)):
            return 2.0 / sum(shape)
        return nonstandard_constant

    def update_fn(updates: Updates, state: Any, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, Any]:
        del params, extra_args
        check_state_type(state, EmptyState, "splus (shape scaling)")
        return jax.tree_util.tree_map_with_path(
            lambda path, u: u * factor(path, np.shape(u)), updates), state

    return GradientTransformation(lambda params: EmptyState(), update_fn)


def _check_strings(value: Any) -> tuple:
    if isinstance(value, str) or not all(isinstance(s, str) for s in value):
        raise TypeError(f"splus: nonstandard_strings must be a sequence of strings (such as "
                        f"('embed', 'layernorm')), got {value!r:.60}.")
    return tuple(value)


@declare_optimizer("beyond optax", "Frans, Levine & Abbeel, 2025", optax=None, stressed=True,
                   summary=(
    "SPlus (Frans et al., 2025): the sign of the momentum in Shampoo's eigenbasis (refreshed "
    "every 100 steps), scaled by `2 / (m + n)`, evaluated at an EMA of the parameters."),
    signature="splus(learning_rate, b1=0.9, b2=0.999, ema_rate=0.999, ..., inverse_every=100)")
@hyperparameters(static=("inverse_every", "max_dim", "mesh", "nonstandard_strings"),
                 learning_rate="schedule", b1="number", b2="number", ema_rate="number",
                 eps="number", inverse_every="int", nonstandard_constant="number",
                 weight_decay="schedule", max_dim="int")
@shared_args()
def splus(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
          ema_rate: float = 0.999, eps: float = 1e-30, inverse_every: int = 100,
          nonstandard_constant: float = 0.001,
          nonstandard_strings: Sequence[str] = ("embed", "layernorm"),
          weight_decay: ScalarOrSchedule = 1e-2, mask: Optional[MaskOrFn] = None,
          max_dim: int = 10000, *, mesh: Optional[jax.sharding.Mesh] = None,
          cautious_weight_decay: bool = False) -> GradientTransformation:
    """SPlus (Frans, Levine & Abbeel, 2025): a stable whitening optimizer.

    Update rule: ``U`` = :func:`scale_by_splus`'s direction (the sign of the momentum in
    the eigenbasis of Shampoo's statistics, rotated back), then ``P -= learning_rate * s
    * (U + weight_decay * P)`` with the shape-aware factor ``s = 2 / (m + n)`` for an ``m
    x n`` matrix whose axes are both shorter than ``max_dim`` and whose key path (its
    keys joined by ``/``, case-insensitive) contains none of ``nonstandard_strings``, and
    ``s = nonstandard_constant`` for every other leaf (vectors, scalars, embeddings,
    tensors of rank 3 or more). Evaluate at :func:`splus_get_eval_params`, the
    bias-corrected EMA of the parameters: the paper's iterate averaging, which removes
    the parameter noise of a large learning rate.

    Reference: Frans, Levine & Abbeel, 2025, "A Stable Whitening Optimizer for Efficient
    Neural Network Training" (arXiv:2506.07254). Arguments and defaults are the authors'
    official optax implementation's (github.com/kvfrans/splus, ``optax/splus.py``), which
    the numpy reference of the tests transcribes: the factor multiplies the weight decay
    too (the chain is SPlus, weight decay, learning rate, factor). Where its torch version
    differs (decay applied after the step, the EMA taken after the step, ``> max_dim``
    comparisons, no ``nonstandard_strings``), this follows the optax one. Its
    ``jit_broadcast_computation`` is ``mesh=`` here; ``verbose`` has no counterpart.

    Args:
      learning_rate: the step size, a number or a schedule of the step count (the paper
        tunes it; the official torch default is ``0.1``).
      b1: the momentum's decay, in ``[0, 1)``.
      b2: the decay of the statistics ``L, R``, in ``[0, 1)``.
      ema_rate: the decay of the parameters' EMA, in ``[0, 1)``.
      eps: added to the statistics' diagonal before ``eigh``, ``>= 0``.
      inverse_every: refresh the eigenbases every this many steps (and on the first).
      nonstandard_constant: the factor of the leaves that are not ordinary matrices.
      nonstandard_strings: key-path substrings marking matrices that take
        ``nonstandard_constant`` (embeddings, stacked layer norms).
      weight_decay: decoupled weight decay (multiplied by the learning rate and the
        factor), ``>= 0``; a number or a schedule.
      mask: where to apply the weight decay: a tree (or prefix) of bools or a function
        of the params; ``None``: every leaf.
      max_dim: axes of this length or longer are not rotated, and such matrices take
        ``nonstandard_constant``.
      mesh: divide each refresh's ``eigh`` calls over this mesh's devices (see
        :func:`scale_by_splus`).
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation`` whose state is ``(SplusState, EmptyState, EmptyState,
      EmptyState)``; its ``update`` needs ``params``.

    >>> import jax, jax.numpy as jnp, functrain
    >>> a = jnp.diag(jnp.array([10., 1.]))
    >>> f = lambda p: jnp.sum((a @ p['w'] - 1.) ** 2)
    >>> opt = functrain.contrib.splus(0.3, ema_rate=0.9, weight_decay=0.0)
    >>> @jax.jit
    ... def step(params, state):
    ...     updates, state = opt.update(jax.grad(f)(params), state, params)
    ...     return functrain.apply_updates(params, updates), state
    >>> params = {'w': jnp.zeros((2, 2))}
    >>> state = opt.init(params)
    >>> for _ in range(200):
    ...     params, state = step(params, state)
    >>> eval_params = functrain.contrib.splus_get_eval_params(state)  # evaluate here
    >>> # from 4.0: the iterate bounces at the step's scale (loss > 1), its average does not
    >>> print(float(f(params)) > 1.0, float(f(eval_params)) < 0.1)
    True True
    """
    check_range("weight_decay", weight_decay, 0.0, owner="splus")
    strings = _check_strings(nonstandard_strings)
    return chain(scale_by_splus(b1, b2, ema_rate, eps, inverse_every, max_dim, mesh=mesh),
                 add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate),
                 _scale_by_shape(nonstandard_constant, strings, int(max_dim)))


def splus_get_eval_params(state: Any) -> Params:
    """The parameters to evaluate a :func:`splus` run at: the EMA of its iterates.

    ``E / (1 - ema_rate^t)`` after ``t`` updates: the bias-corrected exponential moving
    average of the parameters given to ``update`` (the paper's iterate averaging; the
    official helper of the same name). The divisor is the state's ``ema_weight``, the
    EMA of the constant 1. A constant parameter comes back to within rounding, not
    exactly: each update rounds ``E`` and the weight once, so after ``t`` updates the
    average of a constant is within ``2 t`` ulps of the EMA's dtype (measured: the last
    digit differs on about half of the entries). Use it for validation, test and the final model,
    and keep training from the parameters themselves. Before the first update (``t = 0``)
    it is undefined (NaN). Its dtype is the EMA's, at least float32: cast it for
    low-precision models.

    Args:
      state: the state of a :func:`splus` optimizer (the chain's tuple, or any state
        holding exactly one :class:`SplusState`), or that :class:`SplusState`.

    Returns:
      A tree like the params: the averaged parameters.

    Raises:
      ValueError: ``state`` holds no :class:`SplusState`, or more than one.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.splus(0.1)
    >>> params = {'w': jnp.array([[1.0, 2.0]])}
    >>> state = opt.init(params)
    >>> _, state = opt.update({'w': jnp.ones((1, 2))}, state, params)
    >>> functrain.contrib.splus_get_eval_params(state)  # one step: the parameters given
    {'w': Array([[1., 2.]], dtype=float32)}
    """
    found = [s for s in jax.tree_util.tree_leaves(
        state, is_leaf=lambda x: isinstance(x, SplusState)) if isinstance(s, SplusState)]
    if len(found) != 1:
        raise ValueError(f"splus_get_eval_params needs the state of a splus optimizer (holding "
                         f"one SplusState), got {type(state).__name__} holding {len(found)}.")
    s = found[0]
    return jax.tree_util.tree_map(lambda e: e / s.ema_weight.astype(e.dtype), s.ema)
