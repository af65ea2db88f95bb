"""The named optimizers: each a short chain of per-leaf stages.

``chain`` fuses the stages, so ``lamb`` walks the pytree once per step: Adam
moments, weight decay, the trust ratio's norms and the learning rate are
computed together leaf by leaf.
"""

from __future__ import annotations

from typing import Any, Optional

from functrain.transforms.base import GradientTransformation, chain, check_range, identity
from functrain.transforms.moments import (scale_by_adam, scale_by_lion, scale_by_rms,
                                          scale_by_rss, scale_by_stddev)
from functrain.transforms.scaling import (MaskOrFn, ScalarOrSchedule, add_decayed_weights,
                                          scale_by_learning_rate, scale_by_trust_ratio,
                                          trace)


def _momentum(owner: str, momentum: Any) -> None:
    if momentum is not None:
        check_range("momentum", momentum, 0.0, 1.0, owner=owner)


def sgd(learning_rate: ScalarOrSchedule, momentum: Optional[float] = None,
        nesterov: bool = False, accumulator_dtype: Optional[Any] = None
        ) -> GradientTransformation:
    """Stochastic gradient descent, with optional (Nesterov) momentum.

    >>> import jax, jax.numpy as jnp, functrain
    >>> opt = functrain.sgd(0.1, momentum=0.9)
    >>> params = {'w': jnp.array([1., 2.])}
    >>> state = opt.init(params)
    >>> grads = jax.grad(lambda p: jnp.sum(p['w'] ** 2))(params)
    >>> updates, state = opt.update(grads, state)
    >>> functrain.apply_updates(params, updates)
    {'w': Array([0.8, 1.6], dtype=float32)}
    """
    _momentum("sgd", momentum)
    return chain(
        trace(momentum, nesterov, accumulator_dtype) if momentum is not None else identity(),
        scale_by_learning_rate(learning_rate))


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


def lars(learning_rate: ScalarOrSchedule, weight_decay: float = 0.0,
         weight_decay_mask: MaskOrFn = True, trust_coefficient: float = 0.001,
         eps: float = 0.0, trust_ratio_mask: MaskOrFn = True, momentum: float = 0.9,
         nesterov: bool = False) -> GradientTransformation:
    """LARS: SGD with momentum and a per-leaf trust ratio (You et al., 2017).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.lars(1.0)
    >>> params = {'w': jnp.array([3., 4.])}
    >>> updates, _ = opt.update({'w': jnp.array([0., 2.])}, opt.init(params), params)
    >>> updates
    {'w': Array([ 0.    , -0.005], dtype=float32)}
    """
    _momentum("lars", momentum)
    return chain(
        add_decayed_weights(weight_decay, mask=weight_decay_mask),
        scale_by_trust_ratio(trust_coefficient=trust_coefficient, eps=eps,
                             mask=trust_ratio_mask),
        scale_by_learning_rate(learning_rate),
        trace(decay=momentum, nesterov=nesterov))


def rmsprop(learning_rate: ScalarOrSchedule, decay: float = 0.9, eps: float = 1e-8,
            initial_scale: float = 0.0, eps_in_sqrt: bool = True, centered: bool = False,
            momentum: Optional[float] = None, nesterov: bool = False,
            bias_correction: bool = False) -> GradientTransformation:
    """RMSProp (Hinton), optionally centred, with optional momentum.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.rmsprop(0.01, initial_scale=1.0)
    >>> updates, _ = opt.update([jnp.array(2.)], opt.init([jnp.array(0.)]))
    >>> print(round(float(updates[0]), 5))
    -0.01754
    """
    _momentum("rmsprop", momentum)
    scaler = scale_by_stddev if centered else scale_by_rms
    return chain(
        scaler(decay, eps, initial_scale, eps_in_sqrt, bias_correction),
        scale_by_learning_rate(learning_rate),
        trace(decay=momentum, nesterov=nesterov) if momentum is not None else identity())


def adagrad(learning_rate: ScalarOrSchedule, initial_accumulator_value: float = 0.1,
            eps: float = 1e-7) -> GradientTransformation:
    """Adagrad (Duchi et al., 2011).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adagrad(1.0, initial_accumulator_value=0.0, eps=0.0)
    >>> opt.update([jnp.array(-3.)], opt.init([jnp.array(0.)]))[0]
    [Array(1., dtype=float32)]
    """
    return chain(scale_by_rss(initial_accumulator_value, eps),
                 scale_by_learning_rate(learning_rate))


def lion(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.99,
         mu_dtype: Optional[Any] = None, weight_decay: float = 1e-3,
         mask: Optional[MaskOrFn] = None) -> GradientTransformation:
    """Lion (Chen et al., 2023): sign of an interpolated momentum, decoupled decay.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.lion(0.1, weight_decay=0.0)
    >>> params = [jnp.zeros(2)]
    >>> opt.update([jnp.array([2., -0.1])], opt.init(params), params)[0]
    [Array([-0.1,  0.1], dtype=float32)]
    """
    return chain(scale_by_lion(b1, b2, mu_dtype), add_decayed_weights(weight_decay, mask),
                 scale_by_learning_rate(learning_rate))
