"""RMS-scaled named optimizers: RMSProp, Adagrad, Adadelta, SM3, Adafactor.

Each is a short ``chain`` of building blocks from :mod:`functrain.transforms`.

Notation in the docstrings: ``g`` is the gradient, ``p`` the parameter, ``t``
the step number counted from 1, ``lr`` the learning rate (its value at the
step count, counted from 0, when it is a schedule).
"""

from __future__ import annotations

from typing import Any, Optional

import jax.numpy as jnp

from functrain.arg_checks import check_momentum
from functrain.declarations import declare_optimizer, hyperparameters
from functrain.engine.protocol import GradientTransformation, MaskOrFn, ScalarOrSchedule
from functrain.transforms.clipping import clip_by_block_rms
from functrain.engine.program import chain, identity
from functrain.families.rms.factored import scale_by_factored_rms
from functrain.families.layerwise.stages import scale_by_param_block_rms
from functrain.transforms.accumulation import ema, trace
from functrain.families.rms.stages import (scale_by_adadelta, scale_by_rms, scale_by_rss,
                                           scale_by_sm3, scale_by_stddev)
from functrain.transforms.scaling import (learning_rate_stage, scale, scale_by_learning_rate,
                                          weight_decay_stage)
from functrain.docstrings import shared_args


@declare_optimizer("optimizers", "Hinton, 2012", optax="core",
    summary="RMSProp, optionally centred, with momentum and bias correction.",
    signature="rmsprop(learning_rate, decay=0.9, eps=1e-8, ...)")
@hyperparameters(learning_rate="schedule", decay="number", eps="number",
                 initial_scale="number", momentum="number or None")
@shared_args()
def rmsprop(learning_rate: ScalarOrSchedule, decay: float = 0.9, eps: float = 1e-8,
            initial_scale: float = 0.0, eps_in_sqrt: bool = True, centered: bool = False,
            momentum: Optional[float] = None, nesterov: bool = False,
            bias_correction: bool = False) -> GradientTransformation:
    """RMSProp (Hinton), optionally centred, with optional momentum.

    Update rule: ``v = decay v + (1-decay) g**2; u = g / sqrt(v + eps)``
    (``g / (sqrt(v) + eps)`` with ``eps_in_sqrt=False``; centred:
    ``g / sqrt(v - m**2 + eps)`` with ``m = decay m + (1-decay) g``);
    ``p -= lr * u``, or with momentum ``t = momentum t - lr * u; p += t``.

    Reference: Hinton, 2012, "Neural Networks for Machine Learning", lecture
    6e, "rmsprop: Divide the gradient by a running average of its recent
    magnitude"; centred: Graves, 2013, "Generating Sequences With Recurrent
    Neural Networks".

    Args:
      <shared: learning_rate>
      decay: the decay of the moving averages ``v`` (and ``m``), in ``[0, 1)``.
      eps: added to ``v`` inside the square root (or to ``sqrt(v)``, see
        ``eps_in_sqrt``) for numerical stability; ``>= 0``.
      initial_scale: the initial value of ``v``, ``>= 0``; the default 0 is
        optax's (a value such as 1 damps the first steps).
      eps_in_sqrt: add ``eps`` inside the square root (True, the default) or
        to the square root (False).
      centered: divide by an estimate of the gradients' standard deviation
        (``v - m**2``) instead of their RMS; keeps ``m`` in the state too.
      momentum: the decay of a momentum buffer applied after the learning
        rate, in ``[0, 1)``; ``None`` (the default) uses none.
      nesterov: use Nesterov momentum (ignored when ``momentum`` is ``None``).
      bias_correction: divide ``v`` (and ``m``) by ``1 - decay**t``, as Adam
        does; adds a step ``count`` to the state. Off by default, as optax.

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(ScaleByRmsState(nu), EmptyState(),
      EmptyState())`` by default; ``ScaleByRStdDevState(mu, nu)`` when
      centred, the ``...WithCountState`` variants with ``bias_correction``,
      ``TraceState(trace)`` last with momentum and
      ``ScaleByScheduleState(count)`` second for a scheduled learning rate.

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


@declare_optimizer("optimizers", "Duchi et al., 2011", optax="core",
    summary="Adagrad (Duchi et al., 2011).",
    signature="adagrad(learning_rate, initial_accumulator_value=0.1, eps=1e-7)")
@hyperparameters(learning_rate="schedule", initial_accumulator_value="number", eps="number")
@shared_args()
def adagrad(learning_rate: ScalarOrSchedule, initial_accumulator_value: float = 0.1,
            eps: float = 1e-7) -> GradientTransformation:
    """Adagrad (Duchi et al., 2011).

    Update rule: ``s = s + g**2; p -= lr * g / sqrt(s + eps)`` (no change
    where ``s == 0``): each entry's step shrinks with its accumulated
    squared gradients.

    Reference: Duchi et al., 2011, "Adaptive Subgradient Methods for Online
    Learning and Stochastic Optimization".

    Args:
      <shared: learning_rate>
      initial_accumulator_value: the initial value of the sum of squares
        ``s``, ``>= 0``; the default 0.1 (optax's) limits the first steps.
      eps: added to ``s`` inside the square root; ``>= 0``.

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(ScaleByRssState(sum_of_squares),
      EmptyState())`` (``ScaleByScheduleState(count)`` last for a scheduled
      learning rate).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adagrad(1.0, initial_accumulator_value=0.0, eps=0.0)
    >>> opt.update([jnp.array(-3.)], opt.init([jnp.array(0.)]))[0]
    [Array(1., dtype=float32)]
    """
    return chain(scale_by_rss(initial_accumulator_value, eps),
                 scale_by_learning_rate(learning_rate))


@declare_optimizer("optimizers", "Zeiler, 2012", optax="core", summary=(
    "Adadelta (Zeiler, 2012); as in optax, `learning_rate=None` does not negate the updates."),
    signature="adadelta(learning_rate=None, rho=0.9, eps=1e-6, weight_decay=0.0)")
@hyperparameters(learning_rate="schedule or None", rho="number", eps="number",
                 weight_decay="schedule")
def adadelta(learning_rate: Optional[ScalarOrSchedule] = None, rho: float = 0.9,
             eps: float = 1e-6, weight_decay: ScalarOrSchedule = 0.0,
             weight_decay_mask: Optional[MaskOrFn] = None) -> GradientTransformation:
    """Adadelta (Zeiler, 2012), with optional (scheduled) weight decay.

    Update rule: ``g += weight_decay * p; E_g = rho E_g + (1-rho) g**2;
    u = sqrt(E_x + eps) / sqrt(E_g + eps) * g; E_x = rho E_x + (1-rho) u**2;
    p -= lr * u``.

    As in optax, ``learning_rate=None`` applies no learning-rate stage at all,
    so the updates are *not* negated: pass ``learning_rate=1.0`` to descend.

    Reference: Zeiler, 2012, "ADADELTA: An Adaptive Learning Rate Method".

    Args:
      learning_rate: the step size: a number or a schedule (a function of the
        step count, counted from 0, returning the step size to use); ``None``
        (the default) adds no learning-rate stage (see above).
      rho: the decay of the moving averages ``E_g`` (squared gradients) and
        ``E_x`` (squared updates), in ``[0, 1)``.
      eps: added inside both square roots, ``>= 0``; it also sets the size of
        the first steps (``E_x`` starts at 0).
      weight_decay: the weight-decay coefficient added to the gradient before
        the scaling (coupled, L2-style), ``>= 0``; a number or a schedule of
        the step count. A Python ``0`` (the default) adds no decay stage (then
        ``update`` needs no params).
      weight_decay_mask: where to apply the weight decay: a tree of bools
        shaped like the params (or a prefix of it), or a function of the
        params returning one; ``None`` decays every leaf.

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(EmptyState(),
      ScaleByAdaDeltaState(e_g, e_x), EmptyState())`` (a ``count`` state in
      place of an ``EmptyState()`` for each argument given as a schedule).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adadelta(1.0, rho=0.0, eps=1.0)
    >>> params = [jnp.zeros(1)]
    >>> opt.update([jnp.array([1.])], opt.init(params), params)[0]
    [Array([-0.70710677], dtype=float32)]
    """
    return chain(weight_decay_stage(weight_decay, weight_decay_mask),
                 scale_by_adadelta(rho, eps), learning_rate_stage(learning_rate))


@declare_optimizer("optimizers", "Anil et al., 2019", optax="core",
    summary="SM3 (Anil et al., 2019): memory-efficient Adagrad with per-dimension accumulators.")
@hyperparameters(learning_rate="number", momentum="number")
def sm3(learning_rate: float, momentum: float = 0.9) -> GradientTransformation:
    """SM3 (Anil et al., 2019) with a constant learning rate.

    Update rule, per entry ``(i, j, ...)`` of a leaf of rank >= 2:
    ``a = min(r_i, c_j, ...) + g**2`` with one accumulator vector per
    dimension (``r``, ``c``, ...), each then set to the maximum of ``a`` over
    the other axes; ``u = g / sqrt(a + 1e-8)`` (0 where ``a == 0``);
    ``m = momentum m + (1-momentum) u; p -= lr * m``. Vectors (and scalars)
    keep a full accumulator, so memory is ``sum(shape)`` rather than
    ``prod(shape)`` per leaf.

    Reference: Anil et al., 2019, "Memory-Efficient Adaptive Optimization".

    Args:
      learning_rate: the step size, a constant number (not a schedule; wrap
        in :func:`functrain.inject_hyperparams` to change it between steps).
      momentum: the decay of the momentum ``m``, in ``[0, 1)``; 0 disables
        it (the buffer is still kept).

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(ScaleBySM3State(mu, nu),
      EmptyState())``, where ``mu`` holds each leaf's accumulators
      concatenated into one vector and ``nu`` the momentum.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.sm3(1.0, momentum=0.0)
    >>> opt.update([jnp.array([[3., -4.]])], opt.init([jnp.zeros((1, 2))]))[0]
    [Array([[-1.,  1.]], dtype=float32)]
    """
    return chain(scale_by_sm3(momentum), scale(-learning_rate))


@declare_optimizer("optimizers", "Shazeer & Stern, 2018", optax="core",
    summary="Adafactor (Shazeer & Stern, 2018): factored second moments, relative step sizes.",
    signature="adafactor(learning_rate=None, min_dim_size_to_factor=128, ...)")
@hyperparameters(static=("min_dim_size_to_factor",), learning_rate="schedule or None",
                 min_dim_size_to_factor="number", decay_rate="number", decay_offset="number",
                 clipping_threshold="bound or None", momentum="number or None",
                 weight_decay_rate="schedule or None", eps="number")
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

    Update rule: for a factored leaf, row and column moving averages
    ``v_r, v_c`` of ``g**2 + eps`` give ``v_hat = outer(v_r, v_c) / mean(v_r)``
    (other leaves keep a full average ``v_hat``); ``u = g / sqrt(v_hat)``;
    ``u /= max(1, rms(u) / clipping_threshold)``;
    ``u *= lr * max(rms(p), 1e-3)``; optional momentum ``u = ema(u)``;
    ``p -= u + weight_decay_rate * p``. The decay of the averages at step
    ``t`` is ``1 - (t - decay_offset)**(-decay_rate)``.

    Reference: Shazeer & Stern, 2018, "Adafactor: Adaptive Learning Rates with
    Sublinear Memory Cost".

    Args:
      learning_rate: the step size: a number or a schedule (a function of the
        step count, counted from 0, returning the step size to use); ``None``
        (the default) adds no learning-rate stage, so the step is set by the
        parameter scale alone (or by a learning rate chained after it).
      min_dim_size_to_factor: a leaf is factored only if its two largest
        dimensions are both at least this; smaller leaves (and vectors) keep a
        full second moment.
      decay_rate: the exponent of the second-moment decay schedule above
        (``> 0``; the default 0.8 is the paper's).
      decay_offset: subtracted from the step number in the decay schedule
        (e.g. to restart the schedule when fine-tuning); the default 0.
      multiply_by_parameter_scale: scale each leaf's update by the RMS of
        its parameter (at least 1e-3): a relative step size. True by default.
      clipping_threshold: the largest RMS of each leaf's normalised update
        ``u`` (larger ones are scaled down to it), ``>= 0``; ``None`` skips the
        clipping.
      momentum: the decay of a moving average of the updates (without bias
        correction), in ``[0, 1]``; ``None`` (the default) uses none and keeps
        no buffer.
      dtype_momentum: storage dtype of the momentum buffer (float32 by
        default).
      weight_decay_rate: the weight-decay coefficient, added to the update
        after the learning rate and momentum, so it is not multiplied by the
        learning rate; a number or a schedule of the step count. ``None`` (the
        default) means no decay.
      eps: added to ``g**2`` before averaging (regularises the second
        moment), ``>= 0``.
      factored: if False, no leaf is factored (every leaf keeps a full second
        moment).
      weight_decay_mask: where to apply the weight decay: a tree of bools
        shaped like the params (or a prefix of it), or a function of the
        params returning one; ``None`` decays every leaf.

    Returns:
      A ``GradientTransformation`` (``update`` needs params when
      ``multiply_by_parameter_scale`` or ``weight_decay_rate`` is set); its
      state is the tuple of the chained transforms' states, as optax's:
      ``FactoredState(count, v_row, v_col, v)`` first, then one state per
      further stage in the order above (``EmptyState()``, or a ``count`` /
      ``EmaState`` for schedules and momentum).

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
