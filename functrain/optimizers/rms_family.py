"""RMS-scaled named optimizers: RMSProp, Adagrad, Adadelta, SM3, Adafactor.

Each is a short ``chain`` of building blocks from :mod:`functrain.transforms`.
"""

from __future__ import annotations

from typing import Any, Optional

import jax.numpy as jnp

from functrain.transforms.base import (GradientTransformation, MaskOrFn, ScalarOrSchedule,
                                       check_momentum)
from functrain.transforms.clipping import clip_by_block_rms
from functrain.transforms.engine import chain, identity
from functrain.transforms.factored import scale_by_factored_rms
from functrain.transforms.layerwise import scale_by_param_block_rms
from functrain.transforms.momentum import ema, trace
from functrain.transforms.rms import (scale_by_adadelta, scale_by_rms, scale_by_rss,
                                      scale_by_sm3, scale_by_stddev)
from functrain.transforms.scaling import (learning_rate_stage, scale, scale_by_learning_rate,
                                          weight_decay_stage)


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
    check_momentum("rmsprop", momentum)
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


def adadelta(learning_rate: Optional[ScalarOrSchedule] = None, rho: float = 0.9,
             eps: float = 1e-6, weight_decay: ScalarOrSchedule = 0.0,
             weight_decay_mask: Optional[MaskOrFn] = None) -> GradientTransformation:
    """Adadelta (Zeiler, 2012), with optional (scheduled) weight decay.

    As in optax, ``learning_rate=None`` applies no learning-rate stage at all,
    so the updates are *not* negated: pass ``learning_rate=1.0`` to descend.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adadelta(1.0, rho=0.0, eps=1.0)
    >>> params = [jnp.zeros(1)]
    >>> opt.update([jnp.array([1.])], opt.init(params), params)[0]
    [Array([-0.70710677], dtype=float32)]
    """
    return chain(weight_decay_stage(weight_decay, weight_decay_mask),
                 scale_by_adadelta(rho, eps), learning_rate_stage(learning_rate))


def sm3(learning_rate: float, momentum: float = 0.9) -> GradientTransformation:
    """SM3 (Anil et al., 2019) with a constant learning rate.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.sm3(1.0, momentum=0.0)
    >>> opt.update([jnp.array([[3., -4.]])], opt.init([jnp.zeros((1, 2))]))[0]
    [Array([[-1.,  1.]], dtype=float32)]
    """
    return chain(scale_by_sm3(momentum), scale(-learning_rate))


def adafactor(learning_rate: Optional[ScalarOrSchedule] = None,
              min_dim_size_to_factor: int = 128, decay_rate: float = 0.8,
              decay_offset: int = 0, multiply_by_parameter_scale: bool = True,
              clipping_threshold: Optional[float] = 1.0, momentum: Optional[float] = None,
              dtype_momentum: Any = jnp.float32,
              weight_decay_rate: Optional[ScalarOrSchedule] = None, eps: float = 1e-30,
              factored: bool = True, weight_decay_mask: Optional[MaskOrFn] = None
              ) -> GradientTransformation:
    """Adafactor (Shazeer & Stern, 2018): factored second moments, relative step sizes.

    The chain: factored RMS scaling, block-RMS clipping (``clipping_threshold``),
    the learning rate, the parameter-RMS multiplier
    (``multiply_by_parameter_scale``), optional momentum and weight decay,
    and a sign flip; each step is per-leaf, so it runs as one fused pass.
    ``min_dim_size_to_factor`` decides state shapes, so
    ``inject_hyperparams`` keeps it static automatically.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adafactor(learning_rate=0.1)
    >>> params = {'w': jnp.ones((2, 2))}
    >>> u, _ = opt.update({'w': jnp.full((2, 2), 5.)}, opt.init(params), params)
    >>> u
    {'w': Array([[-0.1, -0.1],
                 [-0.1, -0.1]], dtype=float32)}
    """
    txs = [scale_by_factored_rms(factored, decay_rate, decay_offset, min_dim_size_to_factor,
                                 eps)]
    if clipping_threshold is not None:
        txs.append(clip_by_block_rms(clipping_threshold))
    if learning_rate is not None:
        txs.append(scale_by_learning_rate(learning_rate, flip_sign=False))
    if multiply_by_parameter_scale:
        txs.append(scale_by_param_block_rms())
    if momentum is not None:
        txs.append(ema(momentum, debias=False, accumulator_dtype=dtype_momentum))
    if weight_decay_rate is not None:
        txs.append(weight_decay_stage(weight_decay_rate, weight_decay_mask))
    txs.append(scale(-1))
    return chain(*txs)


adafactor.static_hyperparams = ("min_dim_size_to_factor",)  # type: ignore[attr-defined]
