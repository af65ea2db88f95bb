"""More Adam-like optimizers: NAdam(W), AdaBelief, AdaMax(W), RAdam, AMSGrad, Yogi, NovoGrad.

Each ``scale_by_*`` is the per-array math of one leaf plus a ``prepare`` step
for the scalar bias corrections, as in :mod:`functrain.transforms.moments`;
the optimizers chain it with the learning rate, and ``chain`` fuses the two
into one pass over the tree. NovoGrad's second moment is one number per leaf
(the EMA of the leaf's squared norm): it is still per-leaf math, its state
field is just not params-shaped (``shaped_fields``).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain import tree as ft
from functrain.transforms.base import (GradientTransformation, LeafStage, chain, check_range,
                                       safe_increment, stage_transform, zero_count)
from functrain.transforms.moments import ScaleByAdamState, ema
from functrain.transforms.more import weight_decay_stage
from functrain.transforms.optimizers import adam, adamw
from functrain.transforms.scaling import MaskOrFn, ScalarOrSchedule, leaf_norm, \
    scale_by_learning_rate

Array = jax.Array


def _betas(owner: str, **betas: Any) -> None:
    for name, value in betas.items():
        check_range(name, value, 0.0, 1.0, owner=owner)


def _eps(owner: str, **values: Any) -> None:
    for name, value in values.items():
        check_range(name, value, 0.0, owner=owner)


def _count_and_corrections(*decays: Any) -> Any:
    """A ``prepare``: increment ``count``; ctx = (count, 1 - d**count for each d)."""
    def prepare(glob: dict, _: Any) -> tuple:
        count = safe_increment(glob["count"])
        return (count,) + tuple(1 - d ** count for d in decays), {"count": count}
    return prepare


def _nesterov_mu_hat(g: Array, mu: Array, b1: Any, count: Array) -> Array:
    """NAdam's first moment: ``b1 mu/(1-b1^(t+1)) + (1-b1) g/(1-b1^t)``."""
    return b1 * (mu / (1 - b1 ** safe_increment(count))) + (1 - b1) * (g / (1 - b1 ** count))


# --------------------------------------------------------------------------
# NAdam / NAdamW
# --------------------------------------------------------------------------

def nadam(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, eps_root: float = 0.0, mu_dtype: Optional[Any] = None, *,
          nesterov: bool = True, nu_dtype: Optional[Any] = None) -> GradientTransformation:
    """NAdam (Dozat, 2016): Adam with Nesterov momentum; ``adam(..., nesterov=True)``.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.nadam(0.1)
    >>> opt.update([jnp.array([2.])], opt.init([jnp.zeros(1)]))[0]
    [Array([-0.1], dtype=float32)]
    """
    return adam(learning_rate, b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov,
                nu_dtype=nu_dtype)


def nadamw(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
           eps: float = 1e-8, eps_root: float = 0.0, mu_dtype: Optional[Any] = None,
           weight_decay: float = 1e-4, mask: Optional[MaskOrFn] = None, *,
           nesterov: bool = True, nu_dtype: Optional[Any] = None) -> GradientTransformation:
    """NAdamW: NAdam with decoupled weight decay; ``adamw(..., nesterov=True)``.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.nadamw(0.1, weight_decay=0.5)
    >>> params = [jnp.array([2.])]
    >>> opt.update([jnp.array([2.])], opt.init(params), params)[0]
    [Array([-0.2], dtype=float32)]
    """
    return adamw(learning_rate, b1, b2, eps, eps_root, mu_dtype, weight_decay, mask,
                 nesterov=nesterov, nu_dtype=nu_dtype)


# --------------------------------------------------------------------------
# AdaBelief
# --------------------------------------------------------------------------

class ScaleByBeliefState(NamedTuple):
    """State of :func:`scale_by_belief`: count, first moment, belief (centred) moment.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.scale_by_belief().init([jnp.ones(1)]).nu
    [Array([0.], dtype=float32)]
    """

    count: Array
    mu: Any
    nu: Any


def scale_by_belief(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-16,
                    eps_root: float = 1e-16, *, nesterov: bool = False
                    ) -> GradientTransformation:
    """Rescale by the AdaBelief moments (Zhuang et al., 2020).

    ``mu = ema(g)``, ``s = ema((g - mu)**2) + eps_root``; the update is
    ``mu_hat / (sqrt(s_hat) + eps)`` with bias-corrected moments.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_belief()
    >>> u, _ = tx.update([jnp.array([1.])], tx.init([jnp.zeros(1)]))
    >>> print(round(float(u[0][0]), 4))
    1.1111
    """
    _betas("scale_by_belief", b1=b1, b2=b2)
    _eps("scale_by_belief", eps=eps, eps_root=eps_root)

    def leaf(g: Array, s: tuple, p: Any, ctx: tuple) -> tuple:
        count, c1, c2 = ctx
        mu = ema(g, s[0], b1)
        err = g - mu
        nu = ema(err * err, s[1], b2) + eps_root
        mu_hat = _nesterov_mu_hat(g, mu, b1, count) if nesterov else mu / c1
        return mu_hat / (jnp.sqrt(nu / c2) + eps), (mu, nu)

    return stage_transform(LeafStage(
        "scale_by_belief", leaf, ScaleByBeliefState, ("mu", "nu"),
        lambda p: (ft.zeros_like(p), ft.zeros_like(p)), zero_count,
        _count_and_corrections(b1, b2)))


def adabelief(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
              eps: float = 1e-16, eps_root: float = 1e-16, *,
              nesterov: bool = False) -> GradientTransformation:
    """AdaBelief (Zhuang et al., 2020): Adam scaled by the belief in the gradient.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adabelief(0.1)
    >>> u, _ = opt.update([jnp.array([1.])], opt.init([jnp.zeros(1)]))
    >>> print(round(float(u[0][0]), 5))
    -0.11111
    """
    return chain(scale_by_belief(b1, b2, eps, eps_root, nesterov=nesterov),
                 scale_by_learning_rate(learning_rate))


# --------------------------------------------------------------------------
# AdaMax / AdaMaxW
# --------------------------------------------------------------------------

def scale_by_adamax(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8
                    ) -> GradientTransformation:
    """Rescale by AdaMax's infinity-norm moment (Kingma & Ba, 2014, sec. 7.1).

    ``mu = ema(g)``, ``nu = max(|g| + eps, b2 nu)``; the update is
    ``mu_hat / nu`` (only ``mu`` is bias-corrected).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_adamax()
    >>> tx.update([jnp.array([-2.])], tx.init([jnp.zeros(1)]))[0]
    [Array([-1.], dtype=float32)]
    """
    _betas("scale_by_adamax", b1=b1, b2=b2)
    _eps("scale_by_adamax", eps=eps)

    def leaf(g: Array, s: tuple, p: Any, ctx: tuple) -> tuple:
        mu = ema(g, s[0], b1)
        nu = jnp.maximum(jnp.abs(g) + eps, b2 * s[1])
        return (mu / ctx[1]) / nu, (mu, nu)

    return stage_transform(LeafStage(
        "scale_by_adamax", leaf, ScaleByAdamState, ("mu", "nu"),
        lambda p: (ft.zeros_like(p), ft.zeros_like(p)), zero_count,
        _count_and_corrections(b1)))


def adamax(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
           eps: float = 1e-8) -> GradientTransformation:
    """AdaMax: Adam with the infinity norm in place of the second moment.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adamax(0.1)
    >>> opt.update([jnp.array([-2.])], opt.init([jnp.zeros(1)]))[0]
    [Array([0.1], dtype=float32)]
    """
    return chain(scale_by_adamax(b1, b2, eps), scale_by_learning_rate(learning_rate))


def adamaxw(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
            eps: float = 1e-8, weight_decay: ScalarOrSchedule = 1e-4,
            mask: Optional[MaskOrFn] = None) -> GradientTransformation:
    """AdaMax with decoupled weight decay (which may be a schedule).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adamaxw(0.1, weight_decay=0.5)
    >>> params = [jnp.array([2.])]
    >>> opt.update([jnp.array([-2.])], opt.init(params), params)[0]
    [Array([0.], dtype=float32)]
    """
    return chain(scale_by_adamax(b1, b2, eps), weight_decay_stage(weight_decay, mask),
                 scale_by_learning_rate(learning_rate))


# --------------------------------------------------------------------------
# RAdam
# --------------------------------------------------------------------------

def scale_by_radam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   eps_root: float = 0.0, threshold: float = 5.0, *,
                   nesterov: bool = False) -> GradientTransformation:
    """Rescale with Rectified Adam (Liu et al., 2020).

    While the variance estimate is unreliable (its length ``rho_t`` below
    ``threshold``) the update is the bias-corrected first moment; afterwards
    Adam's update times the rectification factor ``r_t``.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_radam()
    >>> tx.update([jnp.array([3.])], tx.init([jnp.zeros(1)]))[0]
    [Array([3.], dtype=float32)]
    """
    _betas("scale_by_radam", b1=b1, b2=b2)
    _eps("scale_by_radam", eps=eps, eps_root=eps_root)
    rho_inf = 2.0 / (1.0 - b2) - 1.0

    def prepare(glob: dict, _: Any) -> tuple:
        count = safe_increment(glob["count"])
        b2t = b2 ** count
        rho = rho_inf - 2 * count * b2t / (1 - b2t)
        r = jnp.sqrt((rho - 4.0) * (rho - 2.0) * rho_inf
                     / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho))
        return (count, 1 - b1 ** count, 1 - b2t, r, rho >= threshold), {"count": count}

    def leaf(g: Array, s: tuple, p: Any, ctx: tuple) -> tuple:
        count, c1, c2, r, rectify = ctx
        mu, nu = ema(g, s[0], b1), ema(g * g, s[1], b2)
        mu_hat = _nesterov_mu_hat(g, mu, b1, count) if nesterov else mu / c1
        adapted = r.astype(g.dtype) * mu_hat / (jnp.sqrt(nu / c2 + eps_root) + eps)
        return jnp.where(rectify, adapted, mu_hat), (mu, nu)

    return stage_transform(LeafStage(
        "scale_by_radam", leaf, ScaleByAdamState, ("mu", "nu"),
        lambda p: (ft.zeros_like(p), ft.zeros_like(p)), zero_count, prepare))


def radam(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, eps_root: float = 0.0, threshold: float = 5.0, *,
          nesterov: bool = False) -> GradientTransformation:
    """RAdam (Liu et al., 2020): Adam with a rectified warm-up of the adaptive rate.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.radam(0.1)
    >>> opt.update([jnp.array([3.])], opt.init([jnp.zeros(1)]))[0]
    [Array([-0.3], dtype=float32)]
    """
    return chain(scale_by_radam(b1, b2, eps, eps_root, threshold, nesterov=nesterov),
                 scale_by_learning_rate(learning_rate))


# --------------------------------------------------------------------------
# AMSGrad
# --------------------------------------------------------------------------

class ScaleByAmsgradState(NamedTuple):
    """State of :func:`scale_by_amsgrad`: count, moments and the running max of ``nu``.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.scale_by_amsgrad().init([jnp.ones(1)]).nu_max
    [Array([0.], dtype=float32)]
    """

    count: Array
    mu: Any
    nu: Any
    nu_max: Any


def scale_by_amsgrad(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                     eps_root: float = 0.0, mu_dtype: Optional[Any] = None,
                     bias_correction_mu: bool = True, bias_correction_nu: bool = True
                     ) -> GradientTransformation:
    """Rescale with AMSGrad (Reddi et al., 2018): Adam with a non-decreasing ``nu``.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_amsgrad()
    >>> tx.update([jnp.array([-4.])], tx.init([jnp.zeros(1)]))[0]
    [Array([-1.], dtype=float32)]
    """
    _betas("scale_by_amsgrad", b1=b1, b2=b2)
    _eps("scale_by_amsgrad", eps=eps, eps_root=eps_root)

    def leaf(g: Array, s: tuple, p: Any, ctx: tuple) -> tuple:
        _, c1, c2 = ctx
        mu, nu = ema(g, s[0], b1), ema(g * g, s[1], b2)
        mu_hat = mu / c1 if bias_correction_mu else mu
        nu_max = jnp.maximum(s[2], nu / c2 if bias_correction_nu else nu)
        return mu_hat / (jnp.sqrt(nu_max + eps_root) + eps), (mu, nu, nu_max)

    return stage_transform(LeafStage(
        "scale_by_amsgrad", leaf, ScaleByAmsgradState, ("mu", "nu", "nu_max"),
        lambda p: (ft.zeros_like(p, mu_dtype), ft.zeros_like(p), ft.zeros_like(p)),
        zero_count, _count_and_corrections(b1, b2)))


def amsgrad(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
            eps: float = 1e-8, eps_root: float = 0.0, mu_dtype: Optional[Any] = None,
            bias_correction_mu: bool = True, bias_correction_nu: bool = True
            ) -> GradientTransformation:
    """AMSGrad (Reddi et al., 2018).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.amsgrad(0.1)
    >>> opt.update([jnp.array([-4.])], opt.init([jnp.zeros(1)]))[0]
    [Array([0.1], dtype=float32)]
    """
    return chain(scale_by_amsgrad(b1, b2, eps, eps_root, mu_dtype, bias_correction_mu,
                                  bias_correction_nu),
                 scale_by_learning_rate(learning_rate))


# --------------------------------------------------------------------------
# Yogi
# --------------------------------------------------------------------------

def scale_by_yogi(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-3,
                  eps_root: float = 0.0, initial_accumulator_value: float = 1e-6
                  ) -> GradientTransformation:
    """Rescale with Yogi (Zaheer et al., 2018): an additive, sign-controlled ``nu``.

    ``nu = nu - (1-b2) sign(nu - g**2) g**2``; otherwise as Adam.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_yogi(initial_accumulator_value=0.0, eps=0.0)
    >>> tx.update([jnp.array([2.])], tx.init([jnp.zeros(1)]))[0]
    [Array([1.], dtype=float32)]
    """
    _betas("scale_by_yogi", b1=b1, b2=b2)
    _eps("scale_by_yogi", eps=eps, eps_root=eps_root)

    def leaf(g: Array, s: tuple, p: Any, ctx: tuple) -> tuple:
        _, c1, c2 = ctx
        g2 = g * g
        mu = ema(g, s[0], b1)
        nu = s[1] - (1 - b2) * jnp.sign(s[1] - g2) * g2
        return (mu / c1) / (jnp.sqrt(nu / c2 + eps_root) + eps), (mu, nu)

    return stage_transform(LeafStage(
        "scale_by_yogi", leaf, ScaleByAdamState, ("mu", "nu"),
        lambda p: (ft.full_like(p, initial_accumulator_value),
                   ft.full_like(p, initial_accumulator_value)),
        zero_count, _count_and_corrections(b1, b2)))


def yogi(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-3) -> GradientTransformation:
    """Yogi (Zaheer et al., 2018).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.yogi(0.1)
    >>> u, _ = opt.update([jnp.array([2.])], opt.init([jnp.zeros(1)]))
    >>> print(round(float(u[0][0]), 4))
    -0.0999
    """
    return chain(scale_by_yogi(b1, b2, eps), scale_by_learning_rate(learning_rate))


# --------------------------------------------------------------------------
# NovoGrad
# --------------------------------------------------------------------------

class ScaleByNovogradState(NamedTuple):
    """State of :func:`scale_by_novograd`: count, momentum, per-leaf norm moment.

    ``nu`` holds one scalar per leaf (the EMA of its squared norm).

    >>> import jax.numpy as jnp, functrain
    >>> functrain.scale_by_novograd().init({'w': jnp.ones(3)}).nu
    {'w': Array(0., dtype=float32)}
    """

    count: Array
    mu: Any
    nu: Any


def scale_by_novograd(b1: float = 0.9, b2: float = 0.25, eps: float = 1e-8,
                      eps_root: float = 0.0, weight_decay: float = 0.0,
                      mu_dtype: Optional[Any] = None) -> GradientTransformation:
    """Rescale with NovoGrad (Ginsburg et al., 2019): layer-wise second moments.

    Per leaf: ``nu = ema(||g||**2)`` (just ``||g||**2`` at the first step),
    ``m = b1 m + g / (sqrt(nu + eps_root) + eps) + weight_decay * p`` (no
    ``b1 m`` at the first step); the update is ``m``. The norm is of one
    leaf, so this is per-leaf math; ``nu`` is a scalar per leaf, so it is the
    stage's one field that is not params-shaped. Params are needed unless
    ``weight_decay`` is the number 0.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_novograd(eps=0.0)
    >>> tx.update([jnp.array([3., 4.])], tx.init([jnp.zeros(2)]))[0]
    [Array([0.6, 0.8], dtype=float32)]
    """
    _betas("scale_by_novograd", b1=b1, b2=b2)
    _eps("scale_by_novograd", eps=eps, eps_root=eps_root)
    decays = not (isinstance(weight_decay, (int, float)) and weight_decay == 0)

    def prepare(glob: dict, _: Any) -> tuple:
        count = safe_increment(glob["count"])
        return count == 1, {"count": count}

    def leaf(g: Array, s: tuple, p: Any, first: Array) -> tuple:
        sq = leaf_norm(g) ** 2
        nu = jnp.where(first, sq, ema(sq, s[1], b2))
        step = g / (jnp.sqrt(nu + eps_root) + eps)
        if decays:
            step = step + weight_decay * p
        mu = jnp.where(first, step, b1 * s[0] + step)
        return mu, (mu, nu)

    return stage_transform(LeafStage(
        "scale_by_novograd", leaf, ScaleByNovogradState, ("mu", "nu"),
        lambda p: (ft.zeros_like(p, mu_dtype), jnp.zeros([], p.dtype)), zero_count, prepare,
        needs_params=decays, shaped_fields=("mu",)))


def novograd(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.25,
             eps: float = 1e-6, eps_root: float = 0.0, weight_decay: float = 0.0
             ) -> GradientTransformation:
    """NovoGrad (Ginsburg et al., 2019): SGD with layer-wise normalised momentum.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.novograd(0.1, eps=0.0)
    >>> params = [jnp.zeros(2)]
    >>> u, _ = opt.update([jnp.array([3., 4.])], opt.init(params), params)
    >>> print(u[0].round(4))
    [-0.06 -0.08]
    """
    return chain(scale_by_novograd(b1, b2, eps, eps_root, weight_decay),
                 scale_by_learning_rate(learning_rate))
