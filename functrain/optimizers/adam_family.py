"""The Adam family of named optimizers: Adam(W), NAdam(W), AMSGrad, AdaMax(W), RAdam, Yogi, AdaBelief, LAMB.

Each is a short ``chain`` of building blocks from :mod:`functrain.transforms`;
``chain`` fuses the stages, so e.g. ``lamb`` walks the pytree once per step.
"""

from __future__ import annotations

from typing import Any, Optional

from functrain.transforms.adam import (scale_by_adam, scale_by_adamax, scale_by_amsgrad,
                                       scale_by_belief, scale_by_radam, scale_by_yogi)
from functrain.transforms.base import GradientTransformation, MaskOrFn, ScalarOrSchedule
from functrain.transforms.engine import chain
from functrain.transforms.layerwise import scale_by_trust_ratio
from functrain.transforms.scaling import (add_decayed_weights, scale_by_learning_rate,
                                          weight_decay_stage)


def adam(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-8, eps_root: float = 0.0, mu_dtype: Optional[Any] = None, *,
         nesterov: bool = False, nu_dtype: Optional[Any] = None) -> GradientTransformation:
    """Adam (Kingma & Ba, 2014); ``nesterov=True`` gives NAdam.

    ``nu_dtype`` (beyond optax) sets the storage dtype of the second moment.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adam(1e-2)
    >>> params = {'w': jnp.array([1., -1.])}
    >>> updates, state = opt.update({'w': jnp.array([0.5, -3.])}, opt.init(params))
    >>> updates
    {'w': Array([-0.01,  0.01], dtype=float32)}
    """
    return chain(
        scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov, nu_dtype=nu_dtype),
        scale_by_learning_rate(learning_rate))


def adamw(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, eps_root: float = 0.0, mu_dtype: Optional[Any] = None,
          weight_decay: float = 1e-4, mask: Optional[MaskOrFn] = None, *,
          nesterov: bool = False, nu_dtype: Optional[Any] = None) -> GradientTransformation:
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2019).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adamw(0.1, weight_decay=0.5)
    >>> params = {'w': jnp.array([2.])}
    >>> updates, _ = opt.update({'w': jnp.array([1.])}, opt.init(params), params)
    >>> updates
    {'w': Array([-0.2], dtype=float32)}
    """
    return chain(
        scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov, nu_dtype=nu_dtype),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate))


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


def lamb(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-6, eps_root: float = 0.0, weight_decay: float = 0.0,
         mask: Optional[MaskOrFn] = None, *, trust_ratio_mask: MaskOrFn = True,
         max_trust_ratio: Optional[float] = None, mu_dtype: Optional[Any] = None,
         nu_dtype: Optional[Any] = None) -> GradientTransformation:
    """LAMB: Adam with weight decay and a per-leaf trust ratio (You et al., 2019).

    Beyond optax: ``trust_ratio_mask`` (leaves where it is False, e.g. biases
    and norm scales, skip layer adaptation), ``max_trust_ratio`` (a cap on the
    ratio; None = no cap), ``mu_dtype`` / ``nu_dtype``. Defaults keep optax's
    numbers.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.lamb(0.1)
    >>> params = {'w': jnp.array([3., 4.])}
    >>> updates, _ = opt.update({'w': jnp.array([1., 1.])}, opt.init(params), params)
    >>> print(updates['w'].round(5))
    [-0.35355 -0.35355]
    """
    return chain(
        scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nu_dtype=nu_dtype),
        add_decayed_weights(weight_decay, mask),
        scale_by_trust_ratio(max_trust_ratio=max_trust_ratio, mask=trust_ratio_mask),
        scale_by_learning_rate(learning_rate))
