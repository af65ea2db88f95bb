"""SGD-like named optimizers: SGD, LARS, noisy/Polyak/optimistic SGD, signSGD, Signum, Lion, Fromage, Rprop, NovoGrad.

Each is a short ``chain`` of building blocks from :mod:`functrain.transforms`.
"""

from __future__ import annotations

from typing import Any, Optional

from functrain.transforms.base import (GradientTransformation, MaskOrFn, ScalarOrSchedule,
                                       check_momentum)
from functrain.transforms.engine import chain, identity
from functrain.transforms.layerwise import scale_by_novograd, scale_by_trust_ratio
from functrain.transforms.momentum import ema, scale_by_optimistic_gradient, trace
from functrain.transforms.noise import add_noise
from functrain.transforms.scaling import (add_decayed_weights, scale, scale_by_learning_rate,
                                          scale_by_polyak, weight_decay_stage)
from functrain.transforms.sign import scale_by_lion, scale_by_rprop, scale_by_sign


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
    check_momentum("sgd", momentum)
    return chain(
        trace(momentum, nesterov, accumulator_dtype) if momentum is not None else identity(),
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
    check_momentum("lars", momentum)
    return chain(
        add_decayed_weights(weight_decay, mask=weight_decay_mask),
        scale_by_trust_ratio(trust_coefficient=trust_coefficient, eps=eps,
                             mask=trust_ratio_mask),
        scale_by_learning_rate(learning_rate),
        trace(decay=momentum, nesterov=nesterov))


def noisy_sgd(learning_rate: ScalarOrSchedule, eta: float = 0.01, gamma: float = 0.55,
              key: Any = None, *, seed: Optional[int] = None) -> GradientTransformation:
    """SGD with annealed Gaussian gradient noise (Neelakantan et al., 2015).

    ``key`` (or the older ``seed``) defaults to 0, as optax's does.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.noisy_sgd(0.1, eta=0.0, key=0)
    >>> opt.update([jnp.array([2.])], opt.init([jnp.zeros(1)]))[0]
    [Array([-0.2], dtype=float32)]
    """
    if seed is not None and key is not None:
        raise ValueError("noisy_sgd: give key or seed, not both.")
    key = seed if key is None else key
    return chain(add_noise(eta, gamma, 0 if key is None else key),
                 scale_by_learning_rate(learning_rate))


def polyak_sgd(max_learning_rate: float = 1.0, scaling: ScalarOrSchedule = 1.0,
               f_min: float = 0.0, eps: float = 0.0, variant: str = "sps"
               ) -> GradientTransformation:
    """SGD with the Polyak step size (Loizou et al., 2021); pass ``value=loss`` to update.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda x: jnp.sum(x ** 2)
    >>> opt = functrain.polyak_sgd()
    >>> params = jnp.array([1., 2., 3.])
    >>> value, grad = jax.value_and_grad(f)(params)
    >>> u, _ = opt.update(grad, opt.init(params), params, value=value)
    >>> f(functrain.apply_updates(params, u))
    Array(3.5, dtype=float32)
    """
    return chain(sgd(learning_rate=scaling),
                 scale_by_polyak(f_min, max_learning_rate, eps, variant))


def optimistic_gradient_descent(learning_rate: ScalarOrSchedule, alpha: float = 1.0,
                                beta: float = 1.0) -> GradientTransformation:
    """Optimistic gradient descent (Mokhtari et al., 2019), for min-max games.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.optimistic_gradient_descent(0.1)
    >>> opt.update([jnp.array([1.])], opt.init([jnp.zeros(1)]))[0]
    [Array([-0.1], dtype=float32)]
    """
    return chain(scale_by_optimistic_gradient(alpha, beta),
                 scale_by_learning_rate(learning_rate))


def sign_sgd(learning_rate: ScalarOrSchedule) -> GradientTransformation:
    """signSGD (Bernstein et al., 2018): step by the sign of the gradient.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.sign_sgd(0.1)
    >>> opt.update([jnp.array([-3., 2.])], opt.init([jnp.zeros(2)]))[0]
    [Array([ 0.1, -0.1], dtype=float32)]
    """
    return chain(scale_by_sign(), scale_by_learning_rate(learning_rate))


def signum(learning_rate: ScalarOrSchedule, beta: float = 0.9,
           accumulator_dtype: Optional[Any] = None) -> GradientTransformation:
    """Signum (Bernstein et al., 2018): the sign of a (non-debiased) momentum.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.signum(0.1)
    >>> opt.update([jnp.array([-3., 2.])], opt.init([jnp.zeros(2)]))[0]
    [Array([ 0.1, -0.1], dtype=float32)]
    """
    return chain(ema(beta, debias=False, accumulator_dtype=accumulator_dtype),
                 scale_by_sign(), scale_by_learning_rate(learning_rate))


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


def fromage(learning_rate: ScalarOrSchedule, min_norm: float = 1e-6
            ) -> GradientTransformation:
    """Fromage (Bernstein et al., 2020): per-leaf trust ratio with a norm-preserving shrink.

    ``p <- (p - lr * (||p|| / ||g||) g) / sqrt(1 + lr**2)``.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.fromage(1.0)
    >>> params = [jnp.array([3., 4.])]
    >>> u, _ = opt.update([jnp.array([0., 5.])], opt.init(params), params)
    >>> functrain.apply_updates(params, u)
    [Array([ 2.1213202, -0.7071067], dtype=float32)]
    """
    if callable(learning_rate):
        def shrink(count: Array) -> Array:
            return 1 / (1 + learning_rate(count) ** 2) ** 0.5
        return chain(scale_by_trust_ratio(min_norm),
                     scale_by_learning_rate(lambda c: shrink(c) * learning_rate(c)),
                     weight_decay_stage(lambda c: shrink(c) - 1, signed=True))
    mult = 1 / (1 + learning_rate ** 2) ** 0.5
    return chain(scale_by_trust_ratio(min_norm), scale_by_learning_rate(learning_rate * mult),
                 weight_decay_stage(mult - 1, signed=True))


def rprop(learning_rate: float, eta_minus: float = 0.5, eta_plus: float = 1.2,
          min_step_size: float = 1e-6, max_step_size: float = 50.0
          ) -> GradientTransformation:
    """Rprop (Riedmiller & Braun, 1993), full-batch sign-based descent.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.rprop(0.1)
    >>> state = opt.init([jnp.zeros(1)])
    >>> u, state = opt.update([jnp.array([2.])], state)
    >>> opt.update([jnp.array([2.])], state)[0]
    [Array([-0.1], dtype=float32)]
    """
    return chain(scale_by_rprop(learning_rate, eta_minus, eta_plus, min_step_size,
                                max_step_size), scale(-1.0))


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
