"""Modifiers for any optimizer: cautious updates (Liang et al., 2024), the MARS
variance-reduced gradient (Yuan et al., 2024), PaLM's ``b2`` schedule (Chowdhery et al.,
2022) and HeavyBall's trust-region update clipping, as HeavyBall offers them for every
optimizer.

``cautious(optimizer)`` wraps a whole optimizer (its state is the optimizer's own, so
checkpoints keep their layout); ``mars_correction()`` is a stage to put in front of any
optimizer with ``chain``. ``cautious_adamw`` and ``cautious_lion`` apply the caution to the
step direction only, as the paper's Algorithm 2 does, so weight decay is never masked.
``palm_beta2_schedule()`` is a decay-rate schedule: pass it as ``b2`` to adam, adamw,
nadam(w), amsgrad, adabelief, lamb, laprop, soap or their ``scale_by_*`` stages, or as muon's
``adam_b2``. optax has none of
these. HeavyBall's other update clippings are existing transforms: its RMS clip is
``clip_by_block_rms``, its global L2 clip ``clip_by_global_norm``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain import tree as ft
from functrain.arg_checks import (check_betas, check_nonnegative, check_positive, check_range,
                                  check_transformation)
from functrain.declarations import declare_optimizer, hyperparameters
from functrain.numerics import mars_corrected_gradient
from functrain.families.adam.stages import scale_by_adam
from functrain.engine.protocol import (GradientTransformation, GradientTransformationExtraArgs,
                                       MaskOrFn, OptState, Params, ScalarOrSchedule, Updates,
                                       call_update)
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.program import chain, stage_transform
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.families.sign.stages import scale_by_lion
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["cautious", "cautious_adamw", "cautious_lion", "MarsCorrectionState",
           "mars_correction", "DecaySchedule", "palm_beta2_schedule", "trust_region_clip"]


# --------------------------------------------------------------------------
# Cautious updates
# --------------------------------------------------------------------------

def _caution(u: Any, g: Any, descent_sign: float) -> Any:
    """Keep the components of ``u`` that agree with the descent direction of ``g``, scaled
    by ``size / (kept + 1)`` (per array, as the authors' code)."""
    if u is None or g is None:
        return u
    agree = jnp.real(u * jnp.conj(g)) * descent_sign > 0
    scale = agree.size / (jnp.sum(agree) + 1.0)
    return jnp.where(agree, u * scale.astype(jnp.result_type(u)), jnp.zeros_like(u))


def _cautious(inner: GradientTransformation, descent_sign: float,
              owner: str) -> GradientTransformationExtraArgs:
    check_transformation(inner, owner, "optimizer")

    def update_fn(updates: Updates, state: OptState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, OptState]:
        new_updates, new_state = call_update(inner, updates, state, params, extra_args)
        ft.check_structure(new_updates, updates, "updates", f"{owner}: the inner updates")
        masked = jax.tree.map(lambda u, g: _caution(u, g, descent_sign), new_updates, updates,
                              is_leaf=lambda x: x is None)
        return masked, new_state

    return GradientTransformationExtraArgs(inner.init, update_fn)


@declare_optimizer("beyond optax", "Liang et al., 2024", optax=None, summary=(
    "Cautious updates (Liang et al., 2024): keep the update components whose sign agrees with "
    "the descent direction, rescaled by `size / (kept + 1)`; for any optimizer, or on the step "
    "direction only (the presets, weight decay unmasked)."))
@hyperparameters()  # none of its own: current_hyperparams reports the optimizer's
def cautious(optimizer: GradientTransformation) -> GradientTransformationExtraArgs:
    """Cautious updates (Liang et al., 2024) for any optimizer.

    With ``u`` the optimizer's update (added to the params, as in optax) and ``g`` the
    gradient, each array keeps the components where ``u`` descends (``u * g < 0``; for
    complex leaves ``Re(u conj(g)) < 0``) and scales them by ``size / (kept + 1)``, so the
    update keeps its overall size; the others are zero. The state is the optimizer's own.
    Everything the optimizer adds, weight decay included, is masked; ``cautious_adamw`` and
    ``cautious_lion`` mask the step direction only, as the paper does. Reference: Liang,
    Chen, Liu & Liu, 2024, "Cautious Optimizers: Improving Training with One Line of Code".

    Args:
      optimizer: any ``GradientTransformation`` (functrain's, optax's or your own).

    Returns:
      A ``GradientTransformationExtraArgs`` with the optimizer's ``init`` and state.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.cautious(functrain.sgd(1.0, momentum=0.9))
    >>> state = opt.init(jnp.zeros(2))
    >>> u, state = opt.update(jnp.array([1., 1.]), state)
    >>> u, state = opt.update(jnp.array([1., -0.5]), state)  # momentum: -1.9, -0.4
    >>> u  # the second component would climb: zero; 2 / (1 + 1) keeps the scale
    Array([-1.9,  0. ], dtype=float32)
    """
    return _cautious(optimizer, -1.0, "cautious")


@declare_optimizer("beyond optax", "Liang et al., 2024", optax=None, listed_with="cautious",
    signature="cautious_adamw(...)")
@hyperparameters(learning_rate="schedule", b1="number", b2="number", eps="number",
                 eps_root="number", weight_decay="schedule")
@shared_args()
def cautious_adamw(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
                   eps: float = 1e-8, eps_root: float = 0.0, mu_dtype: Optional[Any] = None,
                   weight_decay: ScalarOrSchedule = 1e-4, mask: Optional[MaskOrFn] = None,
                   *, cautious_weight_decay: bool = False) -> GradientTransformation:
    """C-AdamW (Liang et al., 2024, Algorithm 2): AdamW whose Adam direction is cautious.

    ``d = mu_hat / (sqrt(nu_hat + eps_root) + eps)`` as in ``adamw``; ``phi = (d g > 0)``;
    the update is ``-learning_rate (d phi size / (sum(phi) + 1) + weight_decay p)``. Weight
    decay is not masked. Arguments and defaults are ``functrain.adamw``'s.

    Args:
      <shared: learning_rate, b1, b2>
      eps: added to the denominator's square root.
      eps_root: added inside the square root.
      mu_dtype: storage dtype of the first moment.
      weight_decay: decoupled weight decay (a number or a schedule).
      mask: which leaves get weight decay.
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation`` whose state is ``adamw``'s.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.cautious_adamw(0.1, weight_decay=0.0)
    >>> params = jnp.zeros(2)
    >>> u, _ = opt.update(jnp.array([1., -2.]), opt.init(params), params)
    >>> print(u.round(4))  # both agree: Adam's first step +-0.1, times 2 / (2 + 1)
    [-0.0667  0.0667]
    """
    return chain(_cautious(scale_by_adam(b1, b2, eps, eps_root, mu_dtype), 1.0,
                           "cautious_adamw"),
                 add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate))


@declare_optimizer("beyond optax", "Liang et al., 2024", optax=None, listed_with="cautious",
    signature="cautious_lion(...)")
@hyperparameters(learning_rate="schedule", b1="number", b2="number", weight_decay="schedule")
@shared_args()
def cautious_lion(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.99,
                  mu_dtype: Optional[Any] = None, weight_decay: ScalarOrSchedule = 1e-3,
                  mask: Optional[MaskOrFn] = None, *, cautious_weight_decay: bool = False
                  ) -> GradientTransformation:
    """C-Lion (Liang et al., 2024): Lion whose sign step is cautious.

    ``d = sign(b1 mu + (1 - b1) g)`` as in ``lion``; ``phi = (d g > 0)``; the update is
    ``-learning_rate (d phi size / (sum(phi) + 1) + weight_decay p)``. Arguments and
    defaults are ``functrain.lion``'s.

    Args:
      <shared: learning_rate>
      b1: the interpolation rate of the sign step, in ``[0, 1)``.
      b2: decay rate of the momentum, in ``[0, 1)``.
      mu_dtype: storage dtype of the momentum.
      weight_decay: decoupled weight decay (a number or a schedule).
      mask: which leaves get weight decay.
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation`` whose state is ``lion``'s.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.cautious_lion(0.1, weight_decay=0.0)
    >>> params = jnp.zeros(3)
    >>> u, _ = opt.update(jnp.array([1., -2., 0.]), opt.init(params), params)
    >>> u
    Array([-0.1,  0.1,  0. ], dtype=float32)
    """
    return chain(_cautious(scale_by_lion(b1, b2, mu_dtype), 1.0, "cautious_lion"),
                 add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate))


# --------------------------------------------------------------------------
# The MARS correction
# --------------------------------------------------------------------------

class MarsCorrectionState(NamedTuple):
    """State of :func:`mars_correction`.

    Attributes:
      prev_grad: the gradient of the previous step (zeros before the first).

    >>> import jax.numpy as jnp, functrain
    >>> functrain.contrib.mars_correction().init({'w': jnp.ones(2)}).prev_grad
    {'w': Array([0., 0.], dtype=float32)}
    """

    prev_grad: Any


@declare_optimizer("beyond optax", "Yuan et al., 2024", optax=None, summary=(
    "The MARS variance-reduced gradient (Yuan et al., 2024) as a stage in front of any "
    "optimizer: `chain(mars_correction(), lion(1e-4))`."))
@hyperparameters(gamma="number", b1="number", max_norm="bound or None")
def mars_correction(gamma: float = 0.025, b1: float = 0.95,
                    max_norm: Optional[float] = 1.0) -> GradientTransformation:
    """The MARS variance-reduced gradient (Yuan et al., 2024) in front of any optimizer.

    ``c_t = g_t + gamma b1 / (1 - b1) (g_t - g_{t-1})``, clipped per array to norm
    ``max_norm`` (the approximate variant of the paper's Algorithm 1, one gradient per step,
    ``g_0 = 0``); put it first in a chain: ``chain(mars_correction(), functrain.lion(1e-4))``.
    ``functrain.contrib.mars`` is MARS-AdamW with the same correction in one stage.

    Args:
      gamma: the strength of the correction, ``>= 0`` (0 with no clip: the gradient itself).
      b1: the momentum of the optimizer it feeds (the paper ties the weight to it), in
        ``[0, 1)``.
      max_norm: the per-array norm ``c`` is clipped to, ``> 0``, or ``None`` for no clip.

    Returns:
      A ``GradientTransformation`` whose state is :class:`MarsCorrectionState`.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.chain(functrain.contrib.mars_correction(gamma=0.5, b1=0.5,
    ...                                                         max_norm=None),
    ...                       functrain.sgd(1.0))
    >>> state = opt.init(jnp.zeros(1))
    >>> u, state = opt.update(jnp.array([1.]), state)
    >>> u, state = opt.update(jnp.array([3.]), state)   # 3 + 0.5 (3 - 1)
    >>> u
    Array([-4.], dtype=float32)
    """
    check_nonnegative("mars_correction", gamma=gamma)
    check_betas("mars_correction", b1=b1)
    if max_norm is not None:
        check_positive("mars_correction", max_norm=max_norm)
    weight = gamma * b1 / (1 - b1)

    def leaf(g: Array, s: Any, p: Any, ctx: Any) -> tuple:
        return mars_corrected_gradient(g, s.prev_grad, weight, max_norm), s._replace(prev_grad=g)

    return stage_transform(LeafStage(
        name="mars_correction", update_leaf=leaf, state_cls=MarsCorrectionState,
        leaf_fields=("prev_grad",), init_leaf=lambda p: (ft.zeros_like(p),)))


# --------------------------------------------------------------------------
# Decay-rate schedules
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DecaySchedule:
    """A decay rate that changes with the step: ``rate(t)`` and its bias correction.

    Calling it gives the rate at step ``t`` (counted from 1); ``bias_correction(t)`` gives
    ``1 - prod(rate(1), ..., rate(t))``, what the Adam family divides its moving average by
    (``1 - b**t`` for a constant ``b``). Stages whose ``b2`` table kind is ``"decay"`` take
    one.

    Attributes:
      rate: ``t -> b_t``.
      correction: ``t -> 1 - prod(b_1..b_t)``.

    >>> import jax.numpy as jnp
    >>> constant = DecaySchedule(lambda t: 0.5, lambda t: 1 - 0.5 ** t)
    >>> constant(3), constant.bias_correction(3)
    (0.5, 0.875)
    """

    rate: Callable[[Any], Any]
    correction: Callable[[Any], Any]

    def __call__(self, count: Any) -> Any:
        return self.rate(count)

    def bias_correction(self, count: Any) -> Any:
        """``1 - prod(rate(1..count))``.

        Args:
          count: the step number, counted from 1.

        Returns:
          The bias correction at ``count``.
        """
        return self.correction(count)


@hyperparameters(exponent="number")
def palm_beta2_schedule(exponent: float = 0.8) -> DecaySchedule:
    """PaLM's second-moment decay ``b2_t = 1 - t**(-exponent)`` (Chowdhery et al., 2022).

    Early steps average over few gradients (``b2_1 = 0``: the first second moment is the
    squared gradient), later ones over about ``t**exponent``. Since ``b2_1 = 0`` the product
    of the rates is 0 and no bias correction is needed (``bias_correction`` is 1). Reference:
    Chowdhery et al., 2022, "PaLM: Scaling Language Modeling with Pathways", section 5.

    The rate is computed in the count's float type: an integer count gives the default
    float (float64 under ``jax_enable_x64``, as optax's schedules give for a Python or int64
    count), weakly typed like a Python-float ``b2``; a float count keeps its dtype.

    Args:
      exponent: ``> 0``; PaLM's 0.8.

    Returns:
      A :class:`DecaySchedule` to pass as ``b2``.

    >>> import jax.numpy as jnp, functrain
    >>> b2 = functrain.contrib.palm_beta2_schedule()
    >>> print(jnp.round(b2(jnp.array([1., 2., 1000.])), 4))
    [0.     0.4257 0.996 ]
    >>> opt = functrain.adam(1e-3, b2=b2)
    """
    check_positive("palm_beta2_schedule", exponent=exponent)

    def as_float(count: Any) -> Any:
        # Times a Python float: an integer count becomes the default float, weakly typed
        # like a constant b2 (float64 under jax_enable_x64, and float32 moments stay
        # float32); a float count keeps its dtype.
        return jnp.asarray(count) * 1.0

    def rate(count: Any) -> Any:
        return 1.0 - as_float(count) ** (-exponent)

    def correction(count: Any) -> Any:
        return jnp.ones_like(as_float(count))

    return DecaySchedule(rate, correction)


# --------------------------------------------------------------------------
# HeavyBall's trust-region update clipping
# --------------------------------------------------------------------------

@declare_optimizer("beyond optax", "HeavyBall's update clipping (no paper)", optax=None, summary=(
    "HeavyBall's default update clipping: each component soft-bounded, `clip(scale (lerp "
    "tanh(u/scale) + (1-lerp) sign(u) log(1+abs(u)/scale)), -2, 2)`. HeavyBall's RMS and "
    "global-L2 clippings are `clip_by_block_rms` and `clip_by_global_norm`."))
@hyperparameters(lerp="number", scale="number")
def trust_region_clip(lerp: float = 0.9, scale: float = 1.5) -> GradientTransformation:
    """A soft elementwise bound on the update: HeavyBall's default update clipping.

    Each component ``u`` becomes, with ``x = u / scale``,
    ``clip(scale * (lerp * tanh(x) + (1 - lerp) * sign(x) * log(1 + |x|)), -2, 2)``:
    about ``u`` for small components, growing only logarithmically for large ones, never
    beyond 2 in magnitude. Put it after an optimizer's direction, before the learning rate:
    ``chain(scale_by_adam(), trust_region_clip(), scale_by_learning_rate(lr))``.
    Reference: Nestler, HeavyBall (PyTorch optimizer library, v3, 2026), its
    ``trust_region_clip_``, the default update clipping of its PSGD optimizers.

    Args:
      lerp: in ``[0, 1]``, the weight of ``tanh`` against the logarithmic part.
      scale: ``> 0``, the component size where the bound starts to bend.

    Returns:
      A stateless ``GradientTransformation`` (real leaves only: a complex leaf raises).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.trust_region_clip()
    >>> u = [jnp.array([0.01, 1.0, 1000.0])]
    >>> print(jnp.round(tx.update(u, tx.init(u))[0][0], 4))
    [0.01   0.8634 2.    ]
    """
    check_range("lerp", lerp, 0.0, 1.0, high_inclusive=True, owner="trust_region_clip")
    check_positive("trust_region_clip", scale=scale)

    def leaf(u: Array, state: Any, p: Any, ctx: Any) -> tuple:
        x = u / scale
        t = jnp.tanh(x)
        soft = lerp * t + (1 - lerp) * jnp.sign(x) * jnp.log1p(jnp.abs(x))
        return jnp.clip(scale * soft, -2.0, 2.0), ()

    return stage_transform(LeafStage(name="trust_region_clip", update_leaf=leaf,
                                     checks=LeafChecks(real_only=True)))
