"""More optimizers: signSGD/Signum, SM3, Fromage, noisy SGD, Adadelta, Rprop, Polyak SGD, OGD.

Each ``scale_by_*`` is per-leaf math lifted by the engine (see
:mod:`functrain.transforms.base`). Two are not plain elementwise maps:

* **SM3** keeps, per leaf of rank ``r``, one accumulator vector per dimension
  (``r`` vectors of lengths ``shape[i]``). The engine keeps one array per leaf
  and field, so the vectors are stored concatenated in one vector of length
  ``sum(shape)`` (``shaped_fields`` exempts it from the params-shape check);
  the leaf function splits it at static offsets. It is still one leaf's math.
* **Polyak SGD** needs the loss value (an ``update`` keyword) and the global
  norm of all updates, so its scalar step is computed before the leaf pass,
  in the stage's ``prepare``; the stage is built per call around ``value``.

Also here: :func:`weight_decay_stage`, ``add_decayed_weights`` that also takes
a schedule (as optax's does) for the optimizers whose weight decay may be one.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from functrain import tree as ft
from functrain.transforms.base import (EmptyState, GradientTransformation, LeafStage, chain,
                                       check_range, identity, run_block, stage_transform)
from functrain.transforms.optimizers import sgd
from functrain.transforms.scaling import (MaskOrFn, ScalarOrSchedule, add_decayed_weights,
                                          decayed_weights_stage,
                                          scale, scale_by_learning_rate, scale_by_trust_ratio)
from functrain.transforms.leafwise import add_noise, ema

Array = jax.Array


def learning_rate_stage(learning_rate: Optional[ScalarOrSchedule]) -> GradientTransformation:
    """``scale_by_learning_rate``, or ``identity()`` for ``None`` (as optax does).

    >>> import jax.numpy as jnp
    >>> tx = learning_rate_stage(None)
    >>> tx.update([jnp.array(2.)], tx.init([jnp.array(0.)]))[0]
    [Array(2., dtype=float32)]
    """
    return identity() if learning_rate is None else scale_by_learning_rate(learning_rate)


def weight_decay_stage(weight_decay: ScalarOrSchedule, mask: Optional[MaskOrFn] = None, *,
                       signed: bool = False) -> GradientTransformation:
    """``updates + weight_decay * params`` where ``mask`` is True; the decay may be a schedule.

    A Python ``0`` needs no params (an ``identity``); a schedule is evaluated
    at the step count; ``signed=True`` allows negative values (Fromage).

    >>> import jax.numpy as jnp
    >>> tx = weight_decay_stage(lambda count: 0.5 * (count + 1))
    >>> params = [jnp.array([2.])]
    >>> state = tx.init(params)
    >>> u, state = tx.update([jnp.zeros(1)], state, params)
    >>> tx.update([jnp.zeros(1)], state, params)[0]
    [Array([2.], dtype=float32)]
    """
    if not callable(weight_decay) and isinstance(weight_decay, (int, float)) \
            and weight_decay == 0:
        return identity()
    if not signed:
        return add_decayed_weights(weight_decay, mask)
    return decayed_weights_stage(weight_decay, mask)


# --------------------------------------------------------------------------
# signSGD / Signum
# --------------------------------------------------------------------------

ScaleBySignState = EmptyState


def scale_by_sign() -> GradientTransformation:
    """Replace every update by its sign.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_sign()
    >>> tx.update([jnp.array([-3., 0., 2.])], tx.init([jnp.zeros(3)]))[0]
    [Array([-1.,  0.,  1.], dtype=float32)]
    """
    return stage_transform(LeafStage("scale_by_sign", lambda g, s, p, c: (jnp.sign(g), ())))


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


# --------------------------------------------------------------------------
# SM3
# --------------------------------------------------------------------------

class ScaleBySM3State(NamedTuple):
    """State of :func:`scale_by_sm3`.

    ``mu``: per leaf, the per-dimension accumulators concatenated into one
    vector of length ``sum(shape)`` (length 1 for a scalar leaf); ``nu``: the
    momentum, params-shaped.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.scale_by_sm3().init({'w': jnp.ones((2, 3))}).mu['w'].shape
    (5,)
    """

    mu: Any
    nu: Any


def scale_by_sm3(b1: float = 0.9, b2: float = 1.0, eps: float = 1e-8
                 ) -> GradientTransformation:
    """Rescale with SM3 (Anil et al., 2019): memory-efficient Adagrad with cover sets.

    For a leaf of rank >= 2 the accumulator of entry ``(i, j, ...)`` is the
    minimum over dimensions of that dimension's accumulator at its index,
    plus ``g**2``; each dimension then keeps the maximum over the other axes.
    Vectors (and, beyond optax, scalars) keep a full accumulator. The update
    is a ``b1`` momentum of ``g / sqrt(accumulator)``.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_sm3(b1=0.0)
    >>> tx.update([jnp.array([[3., -4.]])], tx.init([jnp.zeros((1, 2))]))[0]
    [Array([[ 1., -1.]], dtype=float32)]
    """
    check_range("b1", b1, 0.0, 1.0, owner="scale_by_sm3")
    check_range("b2", b2, 0.0, 1.0, high_inclusive=True, owner="scale_by_sm3")
    check_range("eps", eps, 0.0, owner="scale_by_sm3")
    if isinstance(b2, (int, float)):
        new_weight = 1.0 if b2 == 1.0 else 1.0 - b2
    else:
        new_weight = jnp.where(b2 == 1.0, 1.0, 1.0 - b2)

    def init_leaf(p: Array) -> tuple:
        size = max(sum(p.shape), 1) if p.ndim >= 2 else max(p.size, 1)
        return (jnp.zeros((size,), p.dtype), ft.zeros_like(p))

    def leaf(g: Array, s: tuple, p: Any, ctx: Any) -> tuple:
        packed, momentum = s
        if g.ndim < 2:
            accum = new_weight * g * g + b2 * packed.reshape(g.shape)
            new_packed = accum.reshape(-1)
        else:
            offsets = np.cumsum((0,) + g.shape)
            parts = [packed[offsets[i]:offsets[i + 1]].reshape(
                [1] * i + [g.shape[i]] + [1] * (g.ndim - i - 1)) for i in range(g.ndim)]
            smallest = parts[0]
            for part in parts[1:]:
                smallest = jnp.minimum(smallest, part)
            accum = new_weight * g * g + b2 * smallest
            new_packed = jnp.concatenate([
                jnp.max(accum, axis=tuple(a for a in range(g.ndim) if a != i))
                for i in range(g.ndim)])
        scaled = g * jnp.where(accum > 0, jax.lax.rsqrt(accum + eps), 0.0)
        nu = (1 - b1) * scaled + b1 * momentum
        return nu, (new_packed, nu)

    return stage_transform(LeafStage(
        "scale_by_sm3", leaf, ScaleBySM3State, ("mu", "nu"), init_leaf,
        shaped_fields=("nu",)))


def sm3(learning_rate: float, momentum: float = 0.9) -> GradientTransformation:
    """SM3 (Anil et al., 2019) with a constant learning rate.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.sm3(1.0, momentum=0.0)
    >>> opt.update([jnp.array([[3., -4.]])], opt.init([jnp.zeros((1, 2))]))[0]
    [Array([[-1.,  1.]], dtype=float32)]
    """
    return chain(scale_by_sm3(momentum), scale(-learning_rate))


# --------------------------------------------------------------------------
# Fromage, noisy SGD
# --------------------------------------------------------------------------

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


# --------------------------------------------------------------------------
# Adadelta
# --------------------------------------------------------------------------

class ScaleByAdaDeltaState(NamedTuple):
    """State of :func:`scale_by_adadelta`: EMAs of squared gradients and updates.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.scale_by_adadelta().init([jnp.ones(1)]).e_x
    [Array([0.], dtype=float32)]
    """

    e_g: Any
    e_x: Any


def scale_by_adadelta(rho: float = 0.9, eps: float = 1e-6) -> GradientTransformation:
    """Rescale with Adadelta (Zeiler, 2012): ``g sqrt(E[dx^2] + eps) / sqrt(E[g^2] + eps)``.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_adadelta(rho=0.0, eps=1.0)
    >>> tx.update([jnp.array([0.])], tx.init([jnp.zeros(1)]))[0]
    [Array([0.], dtype=float32)]
    """
    check_range("rho", rho, 0.0, 1.0, owner="scale_by_adadelta")
    check_range("eps", eps, 0.0, owner="scale_by_adadelta")

    def leaf(g: Array, s: tuple, p: Any, ctx: Any) -> tuple:
        e_g = (1 - rho) * (g * g) + rho * s[0]
        u = (jnp.sqrt(s[1] + eps) / jnp.sqrt(e_g + eps)) * g
        return u, (e_g, (1 - rho) * (u * u) + rho * s[1])

    return stage_transform(LeafStage(
        "scale_by_adadelta", leaf, ScaleByAdaDeltaState, ("e_g", "e_x"),
        lambda p: (ft.zeros_like(p), ft.zeros_like(p))))


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


# --------------------------------------------------------------------------
# Rprop
# --------------------------------------------------------------------------

class ScaleByRpropState(NamedTuple):
    """State of :func:`scale_by_rprop`: per-entry step sizes and the last signed step.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.scale_by_rprop(0.1).init([jnp.ones(2)]).step_sizes
    [Array([0.1, 0.1], dtype=float32)]
    """

    step_sizes: Any
    prev_updates: Any


def scale_by_rprop(learning_rate: float, eta_minus: float = 0.5, eta_plus: float = 1.2,
                   min_step_size: float = 1e-6, max_step_size: float = 50.0
                   ) -> GradientTransformation:
    """Rescale with Rprop (Riedmiller & Braun, 1993): sign-driven per-entry step sizes.

    Where the gradient kept its sign the step grows by ``eta_plus``, where it
    flipped it shrinks by ``eta_minus`` (clipped to the bounds) and that
    entry does not move. As in optax, the update returned at step ``t`` is
    the signed step computed at step ``t - 1`` (zero at the first step).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_rprop(0.1)
    >>> state = tx.init([jnp.zeros(1)])
    >>> u, state = tx.update([jnp.array([2.])], state)
    >>> tx.update([jnp.array([2.])], state)[0]
    [Array([0.1], dtype=float32)]
    """
    check_range("learning_rate", learning_rate, 0.0, owner="scale_by_rprop")
    check_range("min_step_size", min_step_size, 0.0, owner="scale_by_rprop")

    def leaf(g: Array, s: tuple, p: Any, ctx: Any) -> tuple:
        steps, prev = s
        agree = g * prev
        grown = jnp.clip(steps * jnp.where(agree > 0, eta_plus, eta_minus),
                         min_step_size, max_step_size)
        steps = jnp.where(agree == 0, steps, grown)
        flipped = agree < 0
        signed = jnp.where(flipped, jnp.zeros_like(g), steps * jnp.sign(g))
        return jnp.where(flipped, jnp.zeros_like(prev), prev), (steps, signed)

    return stage_transform(LeafStage(
        "scale_by_rprop", leaf, ScaleByRpropState, ("step_sizes", "prev_updates"),
        lambda p: (ft.full_like(p, learning_rate), ft.zeros_like(p))))


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


# --------------------------------------------------------------------------
# Polyak step size
# --------------------------------------------------------------------------

ScaleByPolyakState = EmptyState


def scale_by_polyak(f_min: float = 0.0, max_learning_rate: float = 1.0, eps: float = 0.0,
                    variant: str = "sps") -> GradientTransformation:
    """Scale updates by the Polyak step ``min((f - f_min) / (||u||^2 + eps), max_lr)``.

    ``update`` needs the loss: ``update(updates, state, params, value=loss)``.
    ``variant='sps+'`` uses only the positive part of ``f - f_min``. The step
    is zero where ``||u||^2 + eps`` is at most float64's machine epsilon.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_polyak()
    >>> tx.update([jnp.array([2.])], tx.init([jnp.zeros(1)]), value=jnp.array(1.))[0]
    [Array([0.5], dtype=float32)]
    """
    if variant not in ("sps", "sps+"):
        raise ValueError(f"scale_by_polyak: variant must be 'sps' or 'sps+', got {variant!r}.")
    check_range("eps", eps, 0.0, owner="scale_by_polyak")

    def update_fn(updates: Any, state: EmptyState, params: Optional[Any] = None,
                  value: Optional[Any] = None, **extra_args: Any) -> tuple[Any, EmptyState]:
        if value is None:
            raise ValueError("scale_by_polyak needs the loss value: call "
                             "update(updates, state, params, value=loss).")

        def prepare(glob: dict, tree: Any) -> tuple:
            sq = ft.norm(tree, squared=True)
            gap = jnp.asarray(value - f_min).astype(sq.dtype)
            if variant == "sps+":
                gap = jnp.maximum(gap, 0.0)
            tiny = sq + eps <= np.finfo(float).eps
            step = jnp.where(tiny, 0.0, jnp.minimum(gap / (sq + eps), max_learning_rate))
            return step, glob

        stage = LeafStage("scale_by_polyak", lambda g, s, p, step: (step * g, ()),
                          prepare=prepare, needs_updates=True)
        new_updates, _ = run_block((stage,), updates, (state,), None)
        return new_updates, state

    return GradientTransformation(lambda params: EmptyState(), update_fn)


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


# --------------------------------------------------------------------------
# Optimistic gradient descent
# --------------------------------------------------------------------------

class ScaleByOptimisticGradientState(NamedTuple):
    """State of :func:`scale_by_optimistic_gradient`.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.scale_by_optimistic_gradient().init([jnp.ones(1)]).is_initial_step
    Array(True, dtype=bool)
    """

    is_initial_step: Array
    previous_gradient: Any


def scale_by_optimistic_gradient(alpha: float = 1.0, beta: float = 1.0
                                 ) -> GradientTransformation:
    """Optimistic update ``(alpha + beta) g_t - beta g_{t-1}`` (``g_0`` stands in for ``g_{-1}``).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_optimistic_gradient()
    >>> state = tx.init([jnp.zeros(1)])
    >>> u, state = tx.update([jnp.array([1.])], state)
    >>> tx.update([jnp.array([3.])], state)[0]
    [Array([5.], dtype=float32)]
    """
    def prepare(glob: dict, _: Any) -> tuple:
        return glob["is_initial_step"], {"is_initial_step": jnp.array(False)}

    def leaf(g: Array, s: tuple, p: Any, first: Array) -> tuple:
        prev = jnp.where(first, g, s[0])
        return (alpha + beta) * g - beta * prev, (g,)

    return stage_transform(LeafStage(
        "scale_by_optimistic_gradient", leaf, ScaleByOptimisticGradientState,
        ("previous_gradient",), lambda p: (ft.zeros_like(p),),
        lambda: {"is_initial_step": jnp.array(True)}, prepare))


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

