"""Adam-style moments: Adam, AMSGrad, AdaMax, RAdam, Yogi, AdaBelief and Adan.

Each ``scale_by_*`` is the per-array math of one leaf plus a ``prepare`` step
that advances the step count and computes the scalar bias corrections once per
step; the engine (:mod:`functrain.engine.program`) lifts it over the tree.
The shared formulas (moving averages, bias corrections, Adam's direction,
Nesterov's look-ahead) live in :mod:`functrain.numerics`.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_betas, check_nonnegative
from functrain.declarations import hyperparameters, state_value_kinds
from functrain import tree as ft
from functrain.numerics import (abs_sq, adam_direction, bias_correction_factor, ema_update,
                                nesterov_mu_hat)
from functrain.engine.protocol import GradientTransformation
from functrain.engine.stage import LeafStage
from functrain.engine.counts import BiasCorrections, corrections, safe_increment, zero_count
from functrain.engine.program import stage_transform

Array = jax.Array


@state_value_kinds(mu="signed", nu="unsigned")
class ScaleByAdamState(NamedTuple):
    """State of :func:`scale_by_adam` (also AdaMax, RAdam, Yogi): count and two moments.

    Attributes:
      count: the number of steps taken (int32).
      mu: the first moment, a tree like the params.
      nu: the second moment, a tree like the params.

    >>> import jax.numpy as jnp
    >>> scale_by_adam().init({'w': jnp.zeros(2)}).count
    Array(0, dtype=int32)
    """

    count: Array
    mu: Any
    nu: Any


@state_value_kinds(mu="signed", nu="unsigned", nu_max="unsigned")
class ScaleByAmsgradState(NamedTuple):
    """State of :func:`scale_by_amsgrad`: count, moments and the running max of ``nu``.

    Attributes:
      count: the number of steps taken.
      mu: the first moment.
      nu: the second moment.
      nu_max: the running maximum of the (bias-corrected) second moment.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.scale_by_amsgrad().init([jnp.ones(1)]).nu_max
    [Array([0.], dtype=float32)]
    """

    count: Array
    mu: Any
    nu: Any
    nu_max: Any


@state_value_kinds(mu="signed", nu="unsigned")
class ScaleByBeliefState(NamedTuple):
    """State of :func:`scale_by_belief`: count, first moment, belief (centred) moment.

    Attributes:
      count: the number of steps taken.
      mu: the first moment.
      nu: the moving average of ``(g - mu)**2``.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.scale_by_belief().init([jnp.ones(1)]).nu
    [Array([0.], dtype=float32)]
    """

    count: Array
    mu: Any
    nu: Any


def _first_moment_hat(g: Array, mu: Array, b1: Any, ctx: BiasCorrections,
                      nesterov: bool) -> Array:
    return nesterov_mu_hat(g, mu, b1, ctx.mu, ctx.next_mu) if nesterov else mu / ctx.mu


# --------------------------------------------------------------------------
# Adam
# --------------------------------------------------------------------------

@hyperparameters(b1="number", b2="decay", eps="number", eps_root="number")
def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                  eps_root: float = 0.0, mu_dtype: Optional[Any] = None, *,
                  nesterov: bool = False, nu_dtype: Optional[Any] = None
                  ) -> GradientTransformation:
    """Rescale updates by Adam's bias-corrected moments (Kingma & Ba, 2014).

    ``mu = b1 mu + (1-b1) g``, ``nu = b2 nu + (1-b2) g**2``, and the update is
    ``mu_hat / (sqrt(nu_hat + eps_root) + eps)`` with ``mu_hat = mu / (1 - b1**t)``
    and ``nu_hat = nu / (1 - b2**t)``. With ``nesterov`` the first moment uses
    Nesterov momentum (NAdam). ``mu_dtype`` / ``nu_dtype`` set the
    storage dtype of the moments; the arithmetic always runs in at least
    float32, so bfloat16 moments lose precision only in storage.
    Reference: Kingma & Ba, 2014, "Adam: A Method for Stochastic Optimization";
    NAdam: Dozat, 2016, "Incorporating Nesterov Momentum into Adam".

    Args:
      b1: decay rate of the first moment ``mu`` (the moving average of the
        gradients), in ``[0, 1)``.
      b2: decay rate of the second moment ``nu`` (the moving average of the squared
        gradients), in ``[0, 1)``; or a decay-rate schedule such as
        ``functrain.contrib.palm_beta2_schedule()`` (``1 - t**-0.8``).
      eps: added to the denominator outside the square root, for numerical
        stability; ``>= 0``.
      eps_root: added to ``nu_hat`` inside the square root, ``>= 0``. The default
        0 matches the paper; a small positive value keeps the gradient of the
        update finite when differentiating through it (e.g. in meta-learning).
      mu_dtype: storage dtype of ``mu`` (e.g. ``jnp.bfloat16`` to save memory);
        ``None`` keeps each parameter's dtype.
      nesterov: use Nesterov momentum (NAdam): ``mu_hat = b1 mu / (1 - b1**(t+1))
        + (1 - b1) g / (1 - b1**t)`` looks one step ahead. Default ``False``.
      nu_dtype: storage dtype of ``nu``; ``None`` keeps each parameter's dtype.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByAdamState`.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_adam()
    >>> params = {'w': jnp.array([1., -2.])}
    >>> updates, state = tx.update(params, tx.init(params))
    >>> updates['w']
    Array([ 1., -1.], dtype=float32)
    """
    check_betas("scale_by_adam", b1=b1, b2=b2)
    check_nonnegative("scale_by_adam", eps=eps, eps_root=eps_root)

    def init_leaf(p: Array) -> tuple:
        return (ft.zeros_like(p, mu_dtype), ft.zeros_like(p, nu_dtype))

    def leaf(g: Array, state: Any, p: Any, ctx: BiasCorrections) -> tuple:
        mu, nu = ema_update(g, state.mu, b1), ema_update(abs_sq(g), state.nu, ctx.b2)
        mu_hat = _first_moment_hat(g, mu, b1, ctx, nesterov)
        return adam_direction(mu_hat, nu, None, ctx.nu, eps, eps_root), state._replace(mu=mu, nu=nu)

    return stage_transform(LeafStage(
        name="scale_by_adam", update_leaf=leaf, state_cls=ScaleByAdamState,
        leaf_fields=("mu", "nu"), init_leaf=init_leaf, init_global=zero_count,
        prepare=corrections(b1, b2, nesterov=nesterov)))


# --------------------------------------------------------------------------
# AMSGrad
# --------------------------------------------------------------------------

@hyperparameters(b1="number", b2="decay", eps="number", eps_root="number")
def scale_by_amsgrad(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                     eps_root: float = 0.0, mu_dtype: Optional[Any] = None,
                     bias_correction_mu: bool = True, bias_correction_nu: bool = True
                     ) -> GradientTransformation:
    """Rescale with AMSGrad (Reddi et al., 2018): Adam with a non-decreasing ``nu``.

    ``mu`` and ``nu`` are Adam's moving averages; ``nu_max = max(nu_max, nu_hat)``
    and the update is ``mu_hat / (sqrt(nu_max + eps_root) + eps)``, so the
    effective step size never grows. Reference: Reddi et al., 2018, "On the
    Convergence of Adam and Beyond".

    Args:
      b1: decay rate of the first moment ``mu``, in ``[0, 1)``.
      b2: decay rate of the second moment ``nu``, in ``[0, 1)``.
      eps: added to the denominator outside the square root, ``>= 0``.
      eps_root: added to ``nu_max`` inside the square root, ``>= 0`` (default 0;
        a small positive value keeps derivatives through the update finite).
      mu_dtype: storage dtype of ``mu``; ``None`` keeps each parameter's dtype.
        ``nu`` and ``nu_max`` always use the parameter's dtype.
      bias_correction_mu: divide ``mu`` by ``1 - b1**t`` (default ``True``);
        ``False`` uses the raw moving average.
      bias_correction_nu: divide ``nu`` by ``1 - b2**t`` before taking the running
        maximum (default ``True``); ``False`` takes the maximum of the raw ``nu``.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByAmsgradState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_amsgrad()
    >>> tx.update([jnp.array([-4.])], tx.init([jnp.zeros(1)]))[0]
    [Array([-1.], dtype=float32)]
    """
    check_betas("scale_by_amsgrad", b1=b1, b2=b2)
    check_nonnegative("scale_by_amsgrad", eps=eps, eps_root=eps_root)

    def leaf(g: Array, s: Any, p: Any, ctx: BiasCorrections) -> tuple:
        mu, nu = ema_update(g, s.mu, b1), ema_update(abs_sq(g), s.nu, ctx.b2)
        mu_hat = mu / ctx.mu if bias_correction_mu else mu
        nu_max = jnp.maximum(s.nu_max, nu / ctx.nu if bias_correction_nu else nu)
        return (adam_direction(mu_hat, nu_max, None, None, eps, eps_root),
                s._replace(mu=mu, nu=nu, nu_max=nu_max))

    return stage_transform(LeafStage(
        name="scale_by_amsgrad", update_leaf=leaf, state_cls=ScaleByAmsgradState,
        leaf_fields=("mu", "nu", "nu_max"),
        init_leaf=lambda p: (ft.zeros_like(p, mu_dtype), ft.zeros_like(p), ft.zeros_like(p)),
        init_global=zero_count, prepare=corrections(b1, b2)))


# --------------------------------------------------------------------------
# AdaMax
# --------------------------------------------------------------------------

@hyperparameters(b1="number", b2="number", eps="number")
def scale_by_adamax(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8
                    ) -> GradientTransformation:
    """Rescale by AdaMax's infinity-norm moment (Kingma & Ba, 2014, sec. 7.1).

    ``mu = ema(g)``, ``nu = max(|g| + eps, b2 nu)``; the update is
    ``mu_hat / nu`` (only ``mu`` is bias-corrected). Reference: Kingma & Ba,
    2014, "Adam: A Method for Stochastic Optimization", section 7.1.

    Args:
      b1: decay rate of the first moment ``mu``, in ``[0, 1)``.
      b2: decay rate of the infinity-norm accumulator ``nu``, in ``[0, 1)``.
      eps: added to ``|g|`` before the maximum, so ``nu`` is never 0; ``>= 0``.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByAdamState`
      (``nu`` holds the infinity-norm accumulator).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_adamax()
    >>> tx.update([jnp.array([-2.])], tx.init([jnp.zeros(1)]))[0]
    [Array([-1.], dtype=float32)]
    """
    check_betas("scale_by_adamax", b1=b1, b2=b2)
    check_nonnegative("scale_by_adamax", eps=eps)

    def leaf(g: Array, s: Any, p: Any, ctx: BiasCorrections) -> tuple:
        mu = ema_update(g, s.mu, b1)
        nu = jnp.maximum(jnp.abs(g) + eps, b2 * s.nu)
        return (mu / ctx.mu) / nu, s._replace(mu=mu, nu=nu)

    return stage_transform(LeafStage(
        name="scale_by_adamax", update_leaf=leaf, state_cls=ScaleByAdamState,
        leaf_fields=("mu", "nu"), init_leaf=lambda p: (ft.zeros_like(p), ft.zeros_like(p)),
        init_global=zero_count, prepare=corrections(b1)))


# --------------------------------------------------------------------------
# RAdam
# --------------------------------------------------------------------------

class RAdamContext(NamedTuple):
    """The per-step context of :func:`scale_by_radam`.

    Attributes:
      corrections: this step's :class:`BiasCorrections`.
      r: the rectification factor ``r_t``.
      rectify: whether ``rho_t >= threshold`` (use the adaptive update).

    >>> RAdamContext(BiasCorrections(1), 0.5, False).r
    0.5
    """

    corrections: BiasCorrections
    r: Any
    rectify: Any


@hyperparameters(b1="number", b2="number", eps="number", eps_root="number", threshold="bound")
def scale_by_radam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   eps_root: float = 0.0, threshold: float = 5.0, *,
                   nesterov: bool = False) -> GradientTransformation:
    """Rescale with Rectified Adam (Liu et al., 2020).

    While the variance estimate is unreliable (its length ``rho_t`` below
    ``threshold``) the update is the bias-corrected first moment; afterwards
    Adam's update times the rectification factor ``r_t``:
    ``rho_t = rho_inf - 2 t b2**t / (1 - b2**t)`` with ``rho_inf = 2 / (1 - b2) - 1``,
    ``r_t = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t))``
    and the update is ``r_t mu_hat / (sqrt(nu_hat + eps_root) + eps)``.
    Reference: Liu et al., 2020, "On the Variance of the Adaptive Learning Rate
    and Beyond".

    Args:
      b1: decay rate of the first moment ``mu``, in ``[0, 1)``.
      b2: decay rate of the second moment ``nu``, in ``[0, 1)``.
      eps: added to the denominator outside the square root, ``>= 0``.
      eps_root: added to ``nu_hat`` inside the square root, ``>= 0`` (default 0).
      threshold: the value of ``rho_t`` from which the rectified adaptive update
        is used (default 5, as in optax and the authors' code; the paper's
        Algorithm 2 tests ``rho_t > 4``).
      nesterov: use Nesterov momentum for ``mu_hat`` (as in :func:`scale_by_adam`).
        Default ``False``.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByAdamState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_radam()
    >>> tx.update([jnp.array([3.])], tx.init([jnp.zeros(1)]))[0]
    [Array([3.], dtype=float32)]
    """
    check_betas("scale_by_radam", b1=b1, b2=b2)
    check_nonnegative("scale_by_radam", eps=eps, eps_root=eps_root)
    rho_inf = 2.0 / (1.0 - b2) - 1.0
    bias = corrections(b1, b2, nesterov=nesterov)

    def prepare(glob: dict, updates: Any) -> tuple:
        ctx, new_glob = bias(glob, updates)
        b2t = b2 ** ctx.count
        rho = rho_inf - 2 * ctx.count * b2t / (1 - b2t)
        r = jnp.sqrt((rho - 4.0) * (rho - 2.0) * rho_inf
                     / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho))
        return RAdamContext(ctx, r, rho >= threshold), new_glob

    def leaf(g: Array, s: Any, p: Any, ctx: RAdamContext) -> tuple:
        mu, nu = ema_update(g, s.mu, b1), ema_update(abs_sq(g), s.nu, b2)
        mu_hat = _first_moment_hat(g, mu, b1, ctx.corrections, nesterov)
        adapted = ctx.r.astype(g.dtype) * mu_hat / (
            jnp.sqrt(nu / ctx.corrections.nu + eps_root) + eps)
        return jnp.where(ctx.rectify, adapted, mu_hat), s._replace(mu=mu, nu=nu)

    return stage_transform(LeafStage(
        name="scale_by_radam", update_leaf=leaf, state_cls=ScaleByAdamState,
        leaf_fields=("mu", "nu"), init_leaf=lambda p: (ft.zeros_like(p), ft.zeros_like(p)),
        init_global=zero_count, prepare=prepare))


# --------------------------------------------------------------------------
# Yogi
# --------------------------------------------------------------------------

@hyperparameters(b1="number", b2="number", eps="number", eps_root="number",
                 initial_accumulator_value="number")
def scale_by_yogi(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-3,
                  eps_root: float = 0.0, initial_accumulator_value: float = 1e-6
                  ) -> GradientTransformation:
    """Rescale with Yogi (Zaheer et al., 2018): an additive, sign-controlled ``nu``.

    ``nu = nu - (1-b2) sign(nu - g**2) g**2``; otherwise as Adam: the update is
    ``mu_hat / (sqrt(nu_hat + eps_root) + eps)`` with bias-corrected moments.
    Reference: Zaheer et al., 2018, "Adaptive Methods for Nonconvex Optimization".

    Args:
      b1: decay rate of the first moment ``mu``, in ``[0, 1)``.
      b2: the rate of ``nu``'s additive update, in ``[0, 1)``.
      eps: added to the denominator outside the square root, ``>= 0`` (default
        1e-3, larger than Adam's, as the paper recommends).
      eps_root: added to ``nu_hat`` inside the square root, ``>= 0`` (default 0).
      initial_accumulator_value: the starting value of both ``mu`` and ``nu``
        for every entry (default 1e-6).

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByAdamState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_yogi(initial_accumulator_value=0.0, eps=0.0)
    >>> tx.update([jnp.array([2.])], tx.init([jnp.zeros(1)]))[0]
    [Array([1.], dtype=float32)]
    """
    check_betas("scale_by_yogi", b1=b1, b2=b2)
    check_nonnegative("scale_by_yogi", eps=eps, eps_root=eps_root)

    def leaf(g: Array, s: Any, p: Any, ctx: BiasCorrections) -> tuple:
        g2 = abs_sq(g)
        mu = ema_update(g, s.mu, b1)
        nu = s.nu - (1 - b2) * jnp.sign(s.nu - g2) * g2
        return adam_direction(mu, nu, ctx.mu, ctx.nu, eps, eps_root), s._replace(mu=mu, nu=nu)

    return stage_transform(LeafStage(
        name="scale_by_yogi", update_leaf=leaf, state_cls=ScaleByAdamState,
        leaf_fields=("mu", "nu"),
        init_leaf=lambda p: (ft.full_like(p, initial_accumulator_value),
                             ft.full_like(p, initial_accumulator_value)),
        init_global=zero_count, prepare=corrections(b1, b2)))


# --------------------------------------------------------------------------
# AdaBelief
# --------------------------------------------------------------------------

@hyperparameters(b1="number", b2="decay", eps="number", eps_root="number")
def scale_by_belief(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-16,
                    eps_root: float = 1e-16, *, nesterov: bool = False
                    ) -> GradientTransformation:
    """Rescale by the AdaBelief moments (Zhuang et al., 2020).

    ``mu = ema(g)``, ``s = ema((g - mu)**2) + eps_root``; the update is
    ``mu_hat / (sqrt(s_hat) + eps)`` with bias-corrected moments. Reference:
    Zhuang et al., 2020, "AdaBelief Optimizer: Adapting Stepsizes by the Belief
    in Observed Gradients".

    Args:
      b1: decay rate of the first moment ``mu``, in ``[0, 1)``.
      b2: decay rate of the belief moment ``s``, in ``[0, 1)``.
      eps: added to the denominator outside the square root, ``>= 0``.
      eps_root: added to ``s`` at every step (it is stored, so it accumulates into
        the state), keeping the square root away from 0; ``>= 0``.
      nesterov: use Nesterov momentum for ``mu_hat`` (as in :func:`scale_by_adam`).
        Default ``False``.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByBeliefState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_belief()
    >>> u, _ = tx.update([jnp.array([1.])], tx.init([jnp.zeros(1)]))
    >>> print(round(float(u[0][0]), 4))
    1.1111
    """
    check_betas("scale_by_belief", b1=b1, b2=b2)
    check_nonnegative("scale_by_belief", eps=eps, eps_root=eps_root)

    def leaf(g: Array, s: Any, p: Any, ctx: BiasCorrections) -> tuple:
        mu = ema_update(g, s.mu, b1)
        err = g - mu
        nu = ema_update(abs_sq(err), s.nu, ctx.b2) + eps_root
        mu_hat = _first_moment_hat(g, mu, b1, ctx, nesterov)
        return adam_direction(mu_hat, nu, None, ctx.nu, eps), s._replace(mu=mu, nu=nu)

    return stage_transform(LeafStage(
        name="scale_by_belief", update_leaf=leaf, state_cls=ScaleByBeliefState,
        leaf_fields=("mu", "nu"), init_leaf=lambda p: (ft.zeros_like(p), ft.zeros_like(p)),
        init_global=zero_count, prepare=corrections(b1, b2, nesterov=nesterov)))


# --------------------------------------------------------------------------
# Adan
# --------------------------------------------------------------------------

@state_value_kinds(m="signed", v="signed", n="unsigned", g="signed")
class ScaleByAdanState(NamedTuple):
    """State of :func:`scale_by_adan`: three moving averages, the last gradient, the count.

    The fields and their order are optax's, so states convert one to one.

    Attributes:
      m: the moving average of the gradients.
      v: the moving average of the differences of consecutive gradients.
      n: the moving average of ``|g + (1 - b2) (g - g_prev)|**2``.
      g: the previous step's gradient.
      t: the number of steps taken (int32; optax calls it ``t``, not ``count``).

    >>> import jax.numpy as jnp, functrain
    >>> functrain.scale_by_adan().init([jnp.ones(1)]).t
    Array(0, dtype=int32)
    """

    m: Any
    v: Any
    n: Any
    g: Any
    t: Array


class AdanContext(NamedTuple):
    """The per-step context of :func:`scale_by_adan`, computed once per step.

    Attributes:
      first: whether this is the first step (no previous gradient yet).
      m: ``1 - b1**t``.
      v: ``1 - b2**t``.
      n: ``1 - b3**t``.

    >>> AdanContext(True, 0.02, 0.08, 0.01).first
    True
    """

    first: Any
    m: Any
    v: Any
    n: Any


@hyperparameters(b1="number", b2="number", b3="number", eps="number", eps_root="number")
def scale_by_adan(b1: float = 0.98, b2: float = 0.92, b3: float = 0.99, eps: float = 1e-8,
                  eps_root: float = 0.0) -> GradientTransformation:
    """Rescale by Adan's Nesterov-momentum estimates (Xie et al., 2022).

    With ``d = g - g_prev`` (0 at the first step): ``m = ema(g, b1)``,
    ``v = ema(d, b2)``, ``n = ema(|g + (1 - b2) d|**2, b3)``; the update is
    ``(m_hat + (1 - b2) v_hat) / (sqrt(n_hat + eps_root) + eps)`` with each
    moment bias-corrected (``m_hat = m / (1 - b1**t)``, likewise ``v`` with
    ``b2`` and ``n`` with ``b3``). Reference: Xie et al., 2022, "Adan: Adaptive
    Nesterov Momentum Algorithm for Faster Optimizing Deep Models".

    Args:
      b1: decay rate of the moving average of the gradients, in ``[0, 1)``.
      b2: decay rate of the moving average of the gradient differences, in
        ``[0, 1)``.
      b3: decay rate of the moving average of the squared Nesterov term, in
        ``[0, 1)``.
      eps: added to the denominator outside the square root, ``>= 0``.
      eps_root: added to ``n_hat`` inside the square root, ``>= 0`` (default 0; a
        small positive value keeps derivatives through the update finite).

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByAdanState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_adan(eps=0.0)
    >>> tx.update([jnp.array([-2.])], tx.init([jnp.zeros(1)]))[0]
    [Array([-1.], dtype=float32)]
    """
    check_betas("scale_by_adan", b1=b1, b2=b2, b3=b3)
    check_nonnegative("scale_by_adan", eps=eps, eps_root=eps_root)

    def prepare(glob: dict, updates: Any) -> tuple:
        t = safe_increment(glob["t"])
        return AdanContext(glob["t"] == 0, bias_correction_factor(b1, t),
                           bias_correction_factor(b2, t), bias_correction_factor(b3, t)), {"t": t}

    def leaf(g: Array, s: Any, p: Any, ctx: AdanContext) -> tuple:
        diff = jnp.where(ctx.first, jnp.zeros_like(g), g - s.g)
        m, v = ema_update(g, s.m, b1), ema_update(diff, s.v, b2)
        n = ema_update(abs_sq(g + (1 - b2) * diff), s.n, b3)
        direction = m / ctx.m + (1 - b2) * (v / ctx.v)
        return (adam_direction(direction, n, None, ctx.n, eps, eps_root),
                s._replace(m=m, v=v, n=n, g=g))

    return stage_transform(LeafStage(
        name="scale_by_adan", update_leaf=leaf, state_cls=ScaleByAdanState,
        leaf_fields=("m", "v", "n", "g"),
        init_leaf=lambda p: tuple(ft.zeros_like(p) for _ in range(4)),
        init_global=lambda: {"t": jnp.zeros([], jnp.int32)}, prepare=prepare))
