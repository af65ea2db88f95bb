"""Moment-based rescaling: Adam, RMS, centred RMS, RSS (Adagrad) and Lion.

Each transformation is the per-array math of one leaf (a ``_leaf`` function)
plus a ``prepare`` step that computes the scalar bias corrections once per
step; the tree engine in :mod:`functrain.transforms.base` lifts it.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain import tree as ft
from functrain.transforms.base import (GradientTransformation, LeafStage, check_range,
                                       safe_increment, stage_transform, zero_count)

Array = jax.Array


class ScaleByAdamState(NamedTuple):
    """State of :func:`scale_by_adam`: step count and first/second moments.

    >>> import jax.numpy as jnp
    >>> scale_by_adam().init({'w': jnp.zeros(2)}).count
    Array(0, dtype=int32)
    """

    count: Array
    mu: Any
    nu: Any


class ScaleByRmsState(NamedTuple):
    """State of :func:`scale_by_rms` without bias correction.

    >>> import jax.numpy as jnp
    >>> scale_by_rms(initial_scale=1.0).init([jnp.zeros(2)]).nu
    [Array([1., 1.], dtype=float32)]
    """

    nu: Any


class ScaleByRmsWithCountState(NamedTuple):
    """State of :func:`scale_by_rms` with bias correction.

    >>> import jax.numpy as jnp
    >>> type(scale_by_rms(bias_correction=True).init([jnp.zeros(2)])).__name__
    'ScaleByRmsWithCountState'
    """

    count: Array
    nu: Any


class ScaleByRStdDevState(NamedTuple):
    """State of :func:`scale_by_stddev` without bias correction.

    >>> import jax.numpy as jnp
    >>> scale_by_stddev().init([jnp.zeros(1)]).mu
    [Array([0.], dtype=float32)]
    """

    mu: Any
    nu: Any


class ScaleByRStdDevWithCountState(NamedTuple):
    """State of :func:`scale_by_stddev` with bias correction.

    >>> import jax.numpy as jnp
    >>> scale_by_stddev(bias_correction=True).init([jnp.zeros(1)]).count
    Array(0, dtype=int32)
    """

    count: Array
    mu: Any
    nu: Any


class ScaleByRssState(NamedTuple):
    """State of :func:`scale_by_rss`: the running sum of squared gradients.

    >>> import jax.numpy as jnp
    >>> scale_by_rss().init([jnp.zeros(2)]).sum_of_squares
    [Array([0.1, 0.1], dtype=float32)]
    """

    sum_of_squares: Any


class ScaleByLionState(NamedTuple):
    """State of :func:`scale_by_lion`: step count and momentum.

    >>> import jax.numpy as jnp
    >>> scale_by_lion().init([jnp.zeros(2)]).mu
    [Array([0., 0.], dtype=float32)]
    """

    count: Array
    mu: Any


def ema(g: Array, m: Array, decay: Any) -> Array:
    """One step of an exponential moving average: ``(1 - decay) g + decay m``.

    >>> import jax.numpy as jnp
    >>> ema(jnp.array(1.), jnp.array(0.), 0.9)
    Array(0.1, dtype=float32, weak_type=True)
    """
    return (1 - decay) * g + decay * m


def _bias_corrections(count: Array, *decays: Any) -> tuple:
    return tuple(1 - d ** count for d in decays)


def _counted_bias_correction(decay: Any, enabled: bool) -> Any:
    """``prepare`` of the RMS family: ``1 - decay**count`` when bias correction is on."""
    def prepare(glob: dict, _: Any) -> tuple:
        if not enabled:
            return None, {}
        count = safe_increment(glob["count"])
        return _bias_corrections(count, decay), {"count": count}
    return prepare


def _check_betas(owner: str, **betas: Any) -> None:
    for name, value in betas.items():
        check_range(name, value, 0.0, 1.0, owner=owner)


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                  eps_root: float = 0.0, mu_dtype: Optional[Any] = None, *,
                  nesterov: bool = False, nu_dtype: Optional[Any] = None
                  ) -> GradientTransformation:
    """Rescale updates by Adam's bias-corrected moments (Kingma & Ba, 2014).

    ``mu = b1 mu + (1-b1) g``, ``nu = b2 nu + (1-b2) g**2``, and the update is
    ``mu_hat / (sqrt(nu_hat + eps_root) + eps)``. With ``nesterov`` the first
    moment uses Nesterov momentum (NAdam). ``mu_dtype`` / ``nu_dtype`` set the
    storage dtype of the moments; the arithmetic always runs in at least
    float32, so bfloat16 moments lose precision only in storage.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_adam()
    >>> params = {'w': jnp.array([1., -2.])}
    >>> updates, state = tx.update(params, tx.init(params))
    >>> updates['w']
    Array([ 1., -1.], dtype=float32)
    """
    _check_betas("scale_by_adam", b1=b1, b2=b2)
    check_range("eps", eps, 0.0, owner="scale_by_adam")
    check_range("eps_root", eps_root, 0.0, owner="scale_by_adam")

    def init_leaf(p: Array) -> tuple:
        return (ft.zeros_like(p, mu_dtype), ft.zeros_like(p, nu_dtype))

    def prepare(glob: dict, _: Any) -> tuple:
        count = safe_increment(glob["count"])
        ctx = _bias_corrections(count, b1, b2) + (
            _bias_corrections(safe_increment(count), b1) if nesterov else ())
        return ctx, {"count": count}

    def leaf(g: Array, state: tuple, p: Any, ctx: tuple) -> tuple:
        mu, nu = ema(g, state[0], b1), ema(g * g, state[1], b2)
        if nesterov:
            mu_hat = b1 * (mu / ctx[2]) + (1 - b1) * (g / ctx[0])
        else:
            mu_hat = mu / ctx[0]
        return mu_hat / (jnp.sqrt(nu / ctx[1] + eps_root) + eps), (mu, nu)

    return stage_transform(LeafStage(
        "scale_by_adam", leaf, ScaleByAdamState, ("mu", "nu"), init_leaf, zero_count,
        prepare))


def scale_by_rms(decay: float = 0.9, eps: float = 1e-8, initial_scale: float = 0.0,
                 eps_in_sqrt: bool = True, bias_correction: bool = False
                 ) -> GradientTransformation:
    """Rescale updates by the root of a moving average of squared gradients.

    ``nu = decay nu + (1-decay) g**2``; the update is ``g / sqrt(nu + eps)``
    (or ``g / (sqrt(nu) + eps)`` with ``eps_in_sqrt=False``); optional bias
    correction of ``nu``.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_rms(initial_scale=1.0)
    >>> updates, _ = tx.update([jnp.array(2.)], tx.init([jnp.array(0.)]))
    >>> print(round(float(updates[0]), 4))
    1.7541
    """
    _check_betas("scale_by_rms", decay=decay)
    check_range("eps", eps, 0.0, owner="scale_by_rms")
    state_cls = ScaleByRmsWithCountState if bias_correction else ScaleByRmsState

    prepare = _counted_bias_correction(decay, bias_correction)

    def leaf(g: Array, state: tuple, p: Any, ctx: Any) -> tuple:
        nu = ema(g * g, state[0], decay)
        nu_hat = nu / ctx[0] if bias_correction else nu
        return _rms_scale(g, nu_hat, eps, eps_in_sqrt), (nu,)

    return stage_transform(LeafStage(
        "scale_by_rms", leaf, state_cls, ("nu",),
        lambda p: (ft.full_like(p, initial_scale),),
        zero_count if bias_correction else dict, prepare))


def _rms_scale(g: Array, second: Array, eps: Any, eps_in_sqrt: bool) -> Array:
    if eps_in_sqrt:
        return g * jax.lax.rsqrt(second + eps)
    return g / (jnp.sqrt(second) + eps)


def scale_by_stddev(decay: float = 0.9, eps: float = 1e-8, initial_scale: float = 0.0,
                    eps_in_sqrt: bool = True, bias_correction: bool = False
                    ) -> GradientTransformation:
    """Rescale updates by a running estimate of the gradients' standard deviation.

    Centred RMSProp: ``g / sqrt(nu - mu**2 + eps)`` with ``mu`` and ``nu`` the
    moving averages of ``g`` and ``g**2``.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_stddev(initial_scale=1.0)
    >>> updates, _ = tx.update([jnp.array(2.)], tx.init([jnp.array(0.)]))
    >>> print(round(float(updates[0]), 4))
    1.7817
    """
    _check_betas("scale_by_stddev", decay=decay)
    check_range("eps", eps, 0.0, owner="scale_by_stddev")
    state_cls = ScaleByRStdDevWithCountState if bias_correction else ScaleByRStdDevState

    prepare = _counted_bias_correction(decay, bias_correction)

    def leaf(g: Array, state: tuple, p: Any, ctx: Any) -> tuple:
        mu, nu = ema(g, state[0], decay), ema(g * g, state[1], decay)
        mu_hat, nu_hat = (mu / ctx[0], nu / ctx[0]) if bias_correction else (mu, nu)
        return _rms_scale(g, nu_hat - mu_hat * mu_hat, eps, eps_in_sqrt), (mu, nu)

    return stage_transform(LeafStage(
        "scale_by_stddev", leaf, state_cls, ("mu", "nu"),
        lambda p: (ft.zeros_like(p), ft.full_like(p, initial_scale)),
        zero_count if bias_correction else dict, prepare))


def scale_by_rss(initial_accumulator_value: float = 0.1, eps: float = 1e-7
                 ) -> GradientTransformation:
    """Rescale updates by the root of the running sum of squares (Adagrad).

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
        sos = g * g + state[0]
        inv = jnp.where(sos > 0, jax.lax.rsqrt(sos + eps), 0.0)
        return inv * g, (sos,)

    return stage_transform(LeafStage(
        "scale_by_rss", leaf, ScaleByRssState, ("sum_of_squares",),
        lambda p: (ft.full_like(p, initial_accumulator_value),)))


def scale_by_lion(b1: float = 0.9, b2: float = 0.99, mu_dtype: Optional[Any] = None,
                  mode: Literal["hard", "smooth", "refined"] = "hard",
                  smooth_beta: float = 1.0) -> GradientTransformation:
    """Rescale updates with the Lion rule (Chen et al., 2023).

    The update is ``sign((1-b1) g + b1 mu)`` (``tanh`` of it in ``'smooth'``
    mode, sign only outside [-1, 1] in ``'refined'`` mode); then
    ``mu = b2 mu + (1-b2) g``.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_lion()
    >>> updates, _ = tx.update([jnp.array([0.3, -2.])], tx.init([jnp.zeros(2)]))
    >>> updates
    [Array([ 1., -1.], dtype=float32)]
    """
    _check_betas("scale_by_lion", b1=b1, b2=b2)
    if mode not in ("hard", "smooth", "refined"):
        raise ValueError(f"scale_by_lion: mode must be 'hard', 'smooth' or 'refined', "
                         f"got {mode!r}.")

    def prepare(glob: dict, _: Any) -> tuple:
        return None, {"count": safe_increment(glob["count"])}

    def leaf(g: Array, state: tuple, p: Any, ctx: Any) -> tuple:
        x = (1.0 - b1) * g + b1 * state[0]
        if mode == "hard":
            u = jnp.sign(x)
        elif mode == "smooth":
            u = jnp.tanh(smooth_beta * x)
        else:
            u = jnp.where(jnp.abs(x) < 1.0, x, jnp.sign(x))
        return u, (ema(g, state[0], b2),)

    return stage_transform(LeafStage(
        "scale_by_lion", leaf, ScaleByLionState, ("mu",),
        lambda p: (ft.zeros_like(p, mu_dtype),), zero_count, prepare))
