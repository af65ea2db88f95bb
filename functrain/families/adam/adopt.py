"""ADOPT (Taniguchi et al., 2024): Adam that normalises by the previous second moment.

``scale_by_adopt`` is one :class:`~functrain.engine.stage.LeafStage`; ``adopt`` chains it
with functrain's weight-decay and learning-rate stages (one fused pass). The second moment
takes ``|g|**2`` (``numerics.abs_sq``), so ADOPT without clipping gives optax's numbers on
complex leaves; its clipping has no complex version (a complex leaf raises a ``TypeError``
naming it, where optax fails inside jnp).

Names, arguments, defaults, states and numbers are optax.contrib 0.2.8's. Notation in the
docstrings: ``g`` is the gradient, ``p`` the parameter, ``t`` the step number counted from 1,
``lr`` the learning rate (its value at the step count, counted from 0, when it is a
schedule), ``ema(x, b)`` the moving average ``b avg + (1 - b) x``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_betas, check_nonnegative
from functrain.declarations import declare_optimizer, hyperparameters
from functrain import tree as ft
from functrain.numerics import abs_sq, ema_update
from functrain.families.adam.stages import ScaleByAdamState
from functrain.engine.protocol import GradientTransformation, ScalarOrSchedule
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.counts import safe_increment, zero_count
from functrain.engine.program import chain, stage_transform
from functrain.transforms.scaling import scale_by_learning_rate
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["scale_by_adopt", "adopt"]


def _fourth_root(count: Array) -> Array:
    """optax's default clipping value of ADOPT: ``count ** 0.25``."""
    return count ** 0.25


@hyperparameters(static=("clip_value_fn",), b1="number", b2="number", eps="number")
@shared_args()
def scale_by_adopt(b1: float = 0.9, b2: float = 0.9999, eps: float = 1e-6,
                   mu_dtype: Optional[Any] = None, *, nesterov: bool = False,
                   use_clipping: bool = True,
                   clip_value_fn: Callable[[Array], Array] = _fourth_root
                   ) -> GradientTransformation:
    """Rescale updates by ADOPT's moments (Taniguchi et al., 2024).

    Unlike Adam, the gradient is normalised by the *previous* second moment,
    and the first moment averages the normalised gradients. With ``k`` the
    step count (0 at the first step): ``n = g / max(sqrt(nu), eps)`` (``nu``
    before this step), clipped to ``[-c, c]`` with ``c = clip_value_fn(k)``
    when ``use_clipping``; ``mu = ema(n, b1)`` and ``nu = ema(|g|**2, b2)``,
    except that the first step sets ``nu = |g|**2`` and keeps ``mu = 0`` (so
    its update is 0). The update is ``mu``, or ``ema(n, b1)`` applied once
    more to the new ``mu`` with ``nesterov``. Reference: Taniguchi et al.,
    2024, "ADOPT: Modified Adam Can Converge with Any beta2 with the Optimal
    Rate" (NeurIPS 2024).

    Args:
      <shared: b1, b2>
      eps: the floor of ``sqrt(nu)`` in the denominator, ``>= 0``.
      <shared: mu_dtype>
      nesterov: use Nesterov momentum (see above). Default ``False``.
      use_clipping: clip the normalised gradient (default ``True``, as optax);
        clipping has no complex version, so complex leaves need ``False``.
      clip_value_fn: the clipping bound as a function of the step count
        (counted from 0); default ``count ** 0.25``.

    Returns:
      A ``GradientTransformation`` whose state is
      :class:`~functrain.families.adam.stages.ScaleByAdamState` (as optax's).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.scale_by_adopt()
    >>> params = [jnp.zeros(2)]
    >>> u, state = tx.update([jnp.array([2., -1.])], tx.init(params))
    >>> u, state.nu
    ([Array([0., 0.], dtype=float32)], [Array([4., 1.], dtype=float32)])
    >>> print(tx.update([jnp.array([2., -1.])], state)[0][0].round(4))
    [ 0.1 -0.1]
    """
    check_betas("scale_by_adopt", b1=b1, b2=b2)
    check_nonnegative("scale_by_adopt", eps=eps)
    if use_clipping and not callable(clip_value_fn):
        raise TypeError(f"scale_by_adopt: clip_value_fn must be a function of the step "
                        f"count, got {type(clip_value_fn).__name__}.")

    def prepare(glob: dict, _: Any) -> tuple:
        count = glob["count"]
        started = count > 0
        ctx = (jnp.where(started, b1, 1.0), jnp.where(started, b2, 0.0),
               clip_value_fn(count) if use_clipping else None)
        return ctx, {"count": safe_increment(count)}

    def leaf(g: Array, s: Any, p: Any, ctx: tuple) -> tuple:
        b1_now, b2_now, clip_value = ctx
        normalized = g / jnp.maximum(jnp.sqrt(jnp.real(s.nu)), eps)
        if use_clipping:
            normalized = jnp.clip(normalized, -clip_value, clip_value)
        mu = ema_update(normalized, s.mu, b1_now)
        nu = ema_update(abs_sq(g), s.nu, b2_now)
        update = ema_update(normalized, mu, b1_now) if nesterov else mu
        return update, s._replace(mu=mu, nu=nu)

    return stage_transform(LeafStage(
        name="scale_by_adopt", update_leaf=leaf, state_cls=ScaleByAdamState,
        leaf_fields=("mu", "nu"), init_leaf=lambda p: (ft.zeros_like(p, mu_dtype),
                                                       ft.zeros_like(p)),
        init_global=zero_count, prepare=prepare, checks=LeafChecks(real_only=use_clipping)))


@declare_optimizer("contrib", "Taniguchi et al., 2024", optax="contrib", summary=(
    "ADOPT (Taniguchi et al., 2024): Adam that converges for any b2, the second moment lagging "
    "one step."), signature="adopt(learning_rate, b1=0.9, b2=0.9999, eps=1e-6, ...)")
@hyperparameters(static=("clip_value_fn",), learning_rate="schedule", b1="number", b2="number",
                 eps="number")
@shared_args()
def adopt(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.9999,
          eps: float = 1e-6, mu_dtype: Optional[Any] = None, *, nesterov: bool = False,
          use_clipping: bool = True, clip_value_fn: Callable[[Array], Array] = _fourth_root
          ) -> GradientTransformation:
    """ADOPT (Taniguchi et al., 2024): Adam that converges with any ``b2``.

    Update rule (:func:`scale_by_adopt`, ``k`` the step count from 0):
    ``n = clip(g / max(sqrt(nu), eps), -c_k, c_k)`` with the previous ``nu``;
    ``mu = b1 mu + (1 - b1) n``; ``nu = b2 nu + (1 - b2) |g|**2``;
    ``p -= lr * mu``. At the first step ``nu = |g|**2`` and ``mu`` stays 0.
    Reference: Taniguchi et al., 2024, "ADOPT: Modified Adam Can Converge with
    Any beta2 with the Optimal Rate" (NeurIPS 2024).

    Args:
      <shared: learning_rate, b1, b2>
      eps: the floor of ``sqrt(nu)`` in the denominator, ``>= 0``.
      <shared: mu_dtype>
      nesterov: use Nesterov momentum. Default ``False``.
      use_clipping: clip the normalised gradient to ``[-c_k, c_k]`` (default
        ``True``, recommended when training from scratch).
      clip_value_fn: ``c_k`` as a function of the step count; default
        ``count ** 0.25``.

    Returns:
      A ``GradientTransformation``; its state is ``(ScaleByAdamState, <learning
      rate state>)``.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda x: jnp.sum(x ** 2)
    >>> opt = functrain.contrib.adopt(learning_rate=0.1)
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> for _ in range(3):
    ...     updates, state = opt.update(jax.grad(f)(params), state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> print(f"{f(params):.3f}")
    13.655
    """
    return chain(scale_by_adopt(b1, b2, eps, mu_dtype, nesterov=nesterov,
                                use_clipping=use_clipping, clip_value_fn=clip_value_fn),
                 scale_by_learning_rate(learning_rate))
