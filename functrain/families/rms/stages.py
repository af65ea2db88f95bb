"""Root-mean-square scaling: RMSProp's moments, centred RMS, Adagrad's sum, Adadelta, SM3.

Each ``scale_by_*`` divides the update by the root of a running statistic of
squared gradients, per array. SM3 keeps, per leaf of rank ``r``, one
accumulator vector per dimension, as a list per leaf (optax's layout: ``mu['w']``
is ``[rows, columns]`` for a matrix); the engine reads and writes each array of
such a list (``shaped_fields`` exempts it from the params-shape check). It is
still one leaf's math.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_betas, check_range
from functrain.declarations import hyperparameters, state_value_kinds
from functrain import tree as ft
from functrain.numerics import abs_sq, ema_update
from functrain.engine.protocol import GradientTransformation
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.counts import safe_increment, zero_count
from functrain.engine.program import stage_transform

Array = jax.Array


@state_value_kinds(nu="unsigned")
class ScaleByRmsState(NamedTuple):
    """State of :func:`scale_by_rms` without bias correction.

    Attributes:
      nu: the moving average of the squared gradients, a tree like the params.

    >>> import jax.numpy as jnp
    >>> scale_by_rms(initial_scale=1.0).init([jnp.zeros(2)]).nu
    [Array([1., 1.], dtype=float32)]
    """

    nu: Any


@state_value_kinds(nu="unsigned")
class ScaleByRmsWithCountState(NamedTuple):
    """State of :func:`scale_by_rms` with bias correction.

    Attributes:
      count: the number of steps taken (int32), for the bias correction.
      nu: the moving average of the squared gradients, a tree like the params.

    >>> import jax.numpy as jnp
    >>> type(scale_by_rms(bias_correction=True).init([jnp.zeros(2)])).__name__
    'ScaleByRmsWithCountState'
    """

    count: Array
    nu: Any


@state_value_kinds(mu="signed", nu="unsigned")
class ScaleByRStdDevState(NamedTuple):
    """State of :func:`scale_by_stddev` without bias correction.

    Attributes:
      mu: the moving average of the gradients, a tree like the params.
      nu: the moving average of the squared gradients, a tree like the params.

    >>> import jax.numpy as jnp
    >>> scale_by_stddev().init([jnp.zeros(1)]).mu
    [Array([0.], dtype=float32)]
    """

    mu: Any
    nu: Any


@state_value_kinds(mu="signed", nu="unsigned")
class ScaleByRStdDevWithCountState(NamedTuple):
    """State of :func:`scale_by_stddev` with bias correction.

    Attributes:
      count: the number of steps taken (int32), for the bias correction.
      mu: the moving average of the gradients, a tree like the params.
      nu: the moving average of the squared gradients, a tree like the params.

    >>> import jax.numpy as jnp
    >>> scale_by_stddev(bias_correction=True).init([jnp.zeros(1)]).count
    Array(0, dtype=int32)
    """

    count: Array
    mu: Any
    nu: Any


@state_value_kinds(sum_of_squares="unsigned")
class ScaleByRssState(NamedTuple):
    """State of :func:`scale_by_rss`: the running sum of squared gradients.

    Attributes:
      sum_of_squares: ``initial_accumulator_value`` plus the sum of all squared
        gradients so far, a tree like the params.

    >>> import jax.numpy as jnp
    >>> scale_by_rss().init([jnp.zeros(2)]).sum_of_squares
    [Array([0.1, 0.1], dtype=float32)]
    """

    sum_of_squares: Any


@state_value_kinds(e_g="unsigned", e_x="unsigned")
class ScaleByAdaDeltaState(NamedTuple):
    """State of :func:`scale_by_adadelta`: EMAs of squared gradients and updates.

    Attributes:
      e_g: the moving average of the squared gradients ``E[g^2]``.
      e_x: the moving average of the squared updates ``E[dx^2]``.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.scale_by_adadelta().init([jnp.ones(1)]).e_x
    [Array([0.], dtype=float32)]
    """

    e_g: Any
    e_x: Any


class ScaleBySM3State(NamedTuple):
    """State of :func:`scale_by_sm3`.

    ``mu``: per leaf, a list of accumulators, one per dimension (as optax's);
    ``nu``: the momentum, params-shaped.

    Attributes:
      mu: per leaf of rank ``r >= 2``, the list of its ``r`` per-dimension
        accumulators (shape ``(shape[d],)`` for dimension ``d``); for a vector
        (or, beyond optax, a scalar) leaf a list of one full accumulator shaped
        like the leaf.
      nu: the momentum of the scaled updates, a tree like the params.

    >>> import jax.numpy as jnp, functrain
    >>> [a.shape for a in functrain.scale_by_sm3().init({'w': jnp.ones((2, 3))}).mu['w']]
    [(2,), (3,)]
    """

    mu: Any
    nu: Any


class RmsCorrection(NamedTuple):
    """The per-step context of the RMS family with bias correction.

    Attributes:
      count: the step number, counted from 1.
      nu: ``1 - decay**count``.

    >>> RmsCorrection(1, 0.1).nu
    0.1
    """

    count: Any
    nu: Any


def _rms_correction(decay: Any, enabled: bool) -> Any:
    """``prepare`` of the RMS family: ``1 - decay**count`` when bias correction is on."""
    def prepare(glob: dict, _: Any) -> tuple:
        if not enabled:
            return None, {}
        count = safe_increment(glob["count"])
        return RmsCorrection(count, 1 - decay ** count), {"count": count}
    return prepare


@hyperparameters(decay="number", eps="number", initial_scale="number")
def scale_by_rms(decay: float = 0.9, eps: float = 1e-8, initial_scale: float = 0.0,
                 eps_in_sqrt: bool = True, bias_correction: bool = False
                 ) -> GradientTransformation:
    """Rescale updates by the root of a moving average of squared gradients.

    ``nu = decay nu + (1-decay) g**2``; the update is ``g / sqrt(nu + eps)``
    (or ``g / (sqrt(nu) + eps)`` with ``eps_in_sqrt=False``); optional bias
    correction of ``nu``. Reference: Tieleman & Hinton, 2012, "Lecture 6.5 -
    RMSProp" (Coursera: Neural Networks for Machine Learning).

    Args:
      decay: decay rate of the moving average ``nu``, in ``[0, 1)``.
      eps: added for numerical stability (inside or outside the square root, see
        ``eps_in_sqrt``); ``>= 0``.
      initial_scale: the starting value of ``nu`` for every entry (default 0;
        some implementations, e.g. TensorFlow's, start at 1).
      eps_in_sqrt: ``True`` (default) divides by ``sqrt(nu + eps)``; ``False`` by
        ``sqrt(nu) + eps``.
      bias_correction: divide ``nu`` by ``1 - decay**t`` (as Adam does) before the
        square root; the state then also counts steps. Default ``False``.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByRmsState`, or
      :class:`ScaleByRmsWithCountState` with ``bias_correction``.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_rms(initial_scale=1.0)
    >>> updates, _ = tx.update([jnp.array(2.)], tx.init([jnp.array(0.)]))
    >>> print(round(float(updates[0]), 4))
    1.7541
    """
    check_betas("scale_by_rms", decay=decay)
    check_range("eps", eps, 0.0, owner="scale_by_rms")
    state_cls = ScaleByRmsWithCountState if bias_correction else ScaleByRmsState

    prepare = _rms_correction(decay, bias_correction)

    def leaf(g: Array, state: tuple, p: Any, ctx: Any) -> tuple:
        nu = ema_update(abs_sq(g), state.nu, decay)
        nu_hat = nu / ctx.nu if bias_correction else nu
        return _rms_scale(g, nu_hat, eps, eps_in_sqrt), state._replace(nu=nu)

    return stage_transform(LeafStage(
        name="scale_by_rms", update_leaf=leaf, state_cls=state_cls, leaf_fields=("nu",),
        init_leaf=lambda p: (ft.full_like(p, initial_scale),),
        init_global=zero_count if bias_correction else dict, prepare=prepare))


def _rms_scale(g: Array, second: Array, eps: Any, eps_in_sqrt: bool) -> Array:
    if eps_in_sqrt:
        return g * jax.lax.rsqrt(second + eps)
    return g * (1 / (jnp.sqrt(second) + eps))  # the reciprocal times g, as optax rounds it


@hyperparameters(decay="number", eps="number", initial_scale="number")
def scale_by_stddev(decay: float = 0.9, eps: float = 1e-8, initial_scale: float = 0.0,
                    eps_in_sqrt: bool = True, bias_correction: bool = False
                    ) -> GradientTransformation:
    """Rescale updates by a running estimate of the gradients' standard deviation.

    Centred RMSProp: ``g / sqrt(nu - mu**2 + eps)`` with ``mu`` and ``nu`` the
    moving averages of ``g`` and ``g**2``. Reference: Graves, 2013, "Generating
    Sequences With Recurrent Neural Networks".

    Args:
      decay: decay rate of both moving averages ``mu`` and ``nu``, in ``[0, 1)``.
      eps: added for numerical stability (inside or outside the square root, see
        ``eps_in_sqrt``); ``>= 0``.
      initial_scale: the starting value of ``nu`` for every entry (default 0);
        ``mu`` always starts at 0.
      eps_in_sqrt: ``True`` (default) divides by ``sqrt(nu - mu**2 + eps)``;
        ``False`` by ``sqrt(nu - mu**2) + eps``.
      bias_correction: divide ``mu`` and ``nu`` by ``1 - decay**t`` before use;
        the state then also counts steps. Default ``False``.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByRStdDevState`, or
      :class:`ScaleByRStdDevWithCountState` with ``bias_correction``.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_stddev(initial_scale=1.0)
    >>> updates, _ = tx.update([jnp.array(2.)], tx.init([jnp.array(0.)]))
    >>> print(round(float(updates[0]), 4))
    1.7817
    """
    check_betas("scale_by_stddev", decay=decay)
    check_range("eps", eps, 0.0, owner="scale_by_stddev")
    state_cls = ScaleByRStdDevWithCountState if bias_correction else ScaleByRStdDevState

    prepare = _rms_correction(decay, bias_correction)

    def leaf(g: Array, state: tuple, p: Any, ctx: Any) -> tuple:
        mu, nu = ema_update(g, state.mu, decay), ema_update(abs_sq(g), state.nu, decay)
        mu_hat, nu_hat = (mu / ctx.nu, nu / ctx.nu) if bias_correction else (mu, nu)
        return (_rms_scale(g, nu_hat - abs_sq(mu_hat), eps, eps_in_sqrt),
                state._replace(mu=mu, nu=nu))

    return stage_transform(LeafStage(
        name="scale_by_stddev", update_leaf=leaf, state_cls=state_cls, leaf_fields=("mu", "nu"),
        init_leaf=lambda p: (ft.zeros_like(p), ft.full_like(p, initial_scale)),
        init_global=zero_count if bias_correction else dict, prepare=prepare))


@hyperparameters(initial_accumulator_value="number", eps="number")
def scale_by_rss(initial_accumulator_value: float = 0.1, eps: float = 1e-7
                 ) -> GradientTransformation:
    """Rescale updates by the root of the running sum of squares (Adagrad).

    ``s = s + g**2``; the update is ``g / sqrt(s + eps)`` (zero where ``s`` is 0).
    Reference: Duchi et al., 2011, "Adaptive Subgradient Methods for Online Learning
    and Stochastic Optimization".

    Args:
      initial_accumulator_value: the starting value of ``s`` for every entry,
        ``>= 0``.
      eps: added inside the square root, for numerical stability; ``>= 0``.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByRssState`.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_rss(initial_accumulator_value=0.0, eps=0.0)
    >>> updates, _ = tx.update([jnp.array(-3.)], tx.init([jnp.array(0.)]))
    >>> updates
    [Array(-1., dtype=float32)]
    """
    check_range("initial_accumulator_value", initial_accumulator_value, 0.0,
                owner="scale_by_rss")
    check_range("eps", eps, 0.0, owner="scale_by_rss")

    def leaf(g: Array, state: tuple, p: Any, ctx: Any) -> tuple:
        sos = abs_sq(g) + state.sum_of_squares
        inv = jnp.where(sos > 0, jax.lax.rsqrt(sos + eps), 0.0)
        return inv * g, state._replace(sum_of_squares=sos)

    return stage_transform(LeafStage(
        name="scale_by_rss", update_leaf=leaf, state_cls=ScaleByRssState,
        leaf_fields=("sum_of_squares",),
        init_leaf=lambda p: (ft.full_like(p, initial_accumulator_value),)))


@hyperparameters(rho="number", eps="number")
def scale_by_adadelta(rho: float = 0.9, eps: float = 1e-6) -> GradientTransformation:
    """Rescale with Adadelta (Zeiler, 2012): ``g sqrt(E[dx^2] + eps) / sqrt(E[g^2] + eps)``.

    ``E[g^2] = rho E[g^2] + (1-rho) g**2``; the update is
    ``dx = g sqrt(E[dx^2] + eps) / sqrt(E[g^2] + eps)`` (with the previous
    ``E[dx^2]``), then ``E[dx^2] = rho E[dx^2] + (1-rho) dx**2``. Reference: Zeiler,
    2012, "ADADELTA: An Adaptive Learning Rate Method".

    Args:
      rho: decay rate of both moving averages, in ``[0, 1)``.
      eps: added inside both square roots, ``>= 0``; it also sets the size of the
        first steps, since ``E[dx^2]`` starts at 0.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByAdaDeltaState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_adadelta(rho=0.0, eps=1.0)
    >>> tx.update([jnp.array([0.])], tx.init([jnp.zeros(1)]))[0]
    [Array([0.], dtype=float32)]
    """
    check_range("rho", rho, 0.0, 1.0, owner="scale_by_adadelta")
    check_range("eps", eps, 0.0, owner="scale_by_adadelta")

    def leaf(g: Array, s: tuple, p: Any, ctx: Any) -> tuple:
        e_g = ema_update(g * g, s.e_g, rho)
        u = (jnp.sqrt(s.e_x + eps) / jnp.sqrt(e_g + eps)) * g
        return u, s._replace(e_g=e_g, e_x=ema_update(u * u, s.e_x, rho))

    return stage_transform(LeafStage(
        name="scale_by_adadelta", update_leaf=leaf, state_cls=ScaleByAdaDeltaState,
        leaf_fields=("e_g", "e_x"),
        init_leaf=lambda p: (ft.zeros_like(p), ft.zeros_like(p))))


@hyperparameters(b1="number", b2="number", eps="number")
def scale_by_sm3(b1: float = 0.9, b2: float = 1.0, eps: float = 1e-8
                 ) -> GradientTransformation:
    """Rescale with SM3 (Anil et al., 2019): memory-efficient Adagrad with cover sets.

    For a leaf of rank >= 2 the accumulator of entry ``(i, j, ...)`` is the
    minimum over dimensions of that dimension's accumulator at its index,
    plus ``g**2``; each dimension then keeps the maximum over the other axes.
    Vectors (and, beyond optax, scalars) keep a full accumulator. The update
    is a ``b1`` momentum of ``g / sqrt(accumulator)``.

    Per entry: ``v = w g**2 + b2 min_d(acc_d)`` (``w = 1`` if ``b2 == 1`` else
    ``1 - b2``), ``acc_d = max over the other axes of v``, and the update is
    ``nu = b1 nu + (1-b1) g / sqrt(v + eps)`` (zero where ``v`` is 0). Reference:
    Anil et al., 2019, "Memory-Efficient Adaptive Optimization".

    Args:
      b1: decay rate of the momentum ``nu``, in ``[0, 1)`` (0: no momentum).
      b2: decay of the accumulators, in ``[0, 1]``. The default 1 sums squared
        gradients (Adagrad-like); below 1 they become a moving average with
        weight ``1 - b2`` on the new ``g**2``.
      eps: added inside the square root, ``>= 0``.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleBySM3State`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_sm3(b1=0.0)
    >>> tx.update([jnp.array([[3., -4.]])], tx.init([jnp.zeros((1, 2))]))[0]
    [Array([[ 1., -1.]], dtype=float32)]
    """
    check_range("b1", b1, 0.0, 1.0, owner="scale_by_sm3")
    check_range("b2", b2, 0.0, 1.0, high_inclusive=True, owner="scale_by_sm3")
    check_range("eps", eps, 0.0, owner="scale_by_sm3")
    if isinstance(b2, (int, float)):
        new_weight = 1.0 if b2 == 1.0 else 1.0 - b2
    else:
        new_weight = jnp.where(b2 == 1.0, 1.0, 1.0 - b2)

    def init_leaf(p: Array) -> tuple:
        shapes = [(d,) for d in p.shape] if p.ndim >= 2 else [p.shape]
        return ([jnp.zeros(shape, p.dtype) for shape in shapes], ft.zeros_like(p))

    def leaf(g: Array, s: tuple, p: Any, ctx: Any) -> tuple:
        if g.size == 0:  # nothing to accumulate (and a max over no entries is undefined)
            return g, s
        if g.ndim < 2:
            accum = new_weight * g * g + b2 * s.mu[0]
            new_mu = [accum]
        else:
            smallest = functools.reduce(jnp.minimum, [
                acc.reshape([1] * i + [g.shape[i]] + [1] * (g.ndim - i - 1))
                for i, acc in enumerate(s.mu)])
            accum = new_weight * g * g + b2 * smallest
            new_mu = [jnp.max(accum, axis=tuple(a for a in range(g.ndim) if a != i))
                      for i in range(g.ndim)]
        scaled = g * jnp.where(accum > 0, jax.lax.rsqrt(accum + eps), 0.0)
        nu = (1 - b1) * scaled + b1 * s.nu
        return nu, s._replace(mu=new_mu, nu=nu)

    return stage_transform(LeafStage(
        name="scale_by_sm3", update_leaf=leaf, state_cls=ScaleBySM3State, leaf_fields=("mu",
        "nu"), init_leaf=init_leaf, checks=LeafChecks(shaped_fields=("nu",), real_only=True)))
