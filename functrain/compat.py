"""One-shot weight updates with the signatures of Ivy's gradients API.

These are the stateless update functions of the seed documents
(``ivy.adam_step``, ``ivy.adam_update``, ``ivy.lamb_update``,
``ivy.lars_update``, ``ivy.gradient_descent_update`` and
``ivy.optimizer_update``), written JAX-natively.  They exist so that code
ported from Ivy finds every function under the same name, with the same
keyword names, defaults and numbers.  For new code, prefer the
``GradientTransformation`` optimizers of ``functrain`` (``functrain.adam`` and
friends), which carry their state for you.

Every array argument may instead be a pytree (dict, list, tuple, NamedTuple or
any registered pytree).  The function is then applied leaf by leaf: tree
arguments must all have the same structure, and an argument that is a single
array (or Python number) is applied to every leaf, as Ivy does with its
``Container``.  Inside a leaf ordinary numpy broadcasting applies, so ``vw`` of
shape ``(1,)`` works with ``dcdw`` of shape ``(3,)``.  Norms (in
:func:`lamb_update` and :func:`lars_update`) are taken per leaf, never over
the whole tree.  Integer inputs are promoted to the default float dtype.

``step`` may be a Python number or an array, including a value traced under
:func:`jax.jit`.  ``stop_gradients`` must be a Python ``bool`` (it selects
the program, it is not data).
"""

from __future__ import annotations

from typing import Any, Tuple, Union

import jax
import jax.numpy as jnp

from functrain import numerics
from functrain.tree import map_broadcast

__all__ = [
    "adam_step",
    "optimizer_update",
    "gradient_descent_update",
    "adam_update",
    "lamb_update",
    "lars_update",
]

#: An array, or a pytree whose leaves are arrays.
ArrayTree = Any
#: A Python number, an array, or a pytree of either.
NumberOrTree = Union[float, int, jax.Array, Any]

# Added to the denominators of the trust ratios (lamb_update, lars_update).
_NORM_EPS = 1e-12


def _float(x: Any) -> Union[float, jax.Array]:
    """``x`` as a float: Python numbers as Python floats (weakly typed, so they
    keep an array's dtype), arrays with integers and booleans promoted to the
    default float dtype."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jnp.result_type(float))
    return x


# --------------------------------------------------------------------------
# Per-leaf math.
# --------------------------------------------------------------------------


def _adam_step_leaf(dcdw, mw, vw, step, beta1, beta2, epsilon):
    dcdw, mw, vw, step = _float(dcdw), _float(mw), _float(vw), _float(step)
    mw_new = numerics.ema_update(dcdw, mw, beta1)
    vw_new = numerics.ema_update(jnp.square(dcdw), vw, beta2)
    delta = numerics.adam_direction(
        mw_new, vw_new, numerics.bias_correction_factor(beta1, step, precise=True),
        numerics.bias_correction_factor(beta2, step, precise=True), epsilon,
        eps_placement="ivy")
    return delta, mw_new, vw_new


def _optimizer_update_leaf(w, effective_grad, lr, stop_gradients):
    w_new = _float(w) - _float(lr) * _float(effective_grad)
    return jax.lax.stop_gradient(w_new) if stop_gradients else w_new


def _lamb_leaf(w, effective_grad, lr, max_trust_ratio, decay_lambda, stop_gradients):
    w = _float(w)
    u = _float(effective_grad) + decay_lambda * w
    ratio = numerics.trust_ratio(w, u, eps=_NORM_EPS, max_trust_ratio=max_trust_ratio,
                                 one_at_zero=False)
    ratio = ratio.astype(w.dtype)  # norms accumulate in float32; weights keep their dtype
    return _optimizer_update_leaf(w, u, _float(lr) * ratio, stop_gradients)


def _lars_leaf(w, dcdw, lr, decay_lambda, stop_gradients):
    w, dcdw = _float(w), _float(dcdw)
    # The LARS paper's local rate: ||w|| / (||g|| + decay ||w||), then a step along
    # g + decay w.
    local_lr = numerics.trust_ratio(w, dcdw, eps=_NORM_EPS, one_at_zero=False,
                                    p_norm_weight=decay_lambda)
    local_lr = _float(lr) * local_lr.astype(w.dtype)  # weights keep their dtype
    return _optimizer_update_leaf(w, dcdw + decay_lambda * w, local_lr, stop_gradients)


# --------------------------------------------------------------------------
# Public functions.
# --------------------------------------------------------------------------


def adam_step(
    dcdw: ArrayTree,
    mw: ArrayTree,
    vw: ArrayTree,
    step: NumberOrTree,
    *,
    beta1: NumberOrTree = 0.9,
    beta2: NumberOrTree = 0.999,
    epsilon: NumberOrTree = 1e-7,
) -> Tuple[ArrayTree, ArrayTree, ArrayTree]:
    """The Adam step: the effective gradient and the new moment estimates.

    With ``m = beta1*mw + (1-beta1)*dcdw`` and
    ``v = beta2*vw + (1-beta2)*dcdw**2``, the step is
    ``sqrt(1-beta2**step) / (1-beta1**step + epsilon) * m / (sqrt(max(v, 0)) + epsilon)``.
    Unlike optax's ``scale_by_adam`` it is not negated and not scaled by a
    learning rate; :func:`adam_update` does that.

    Args:
      dcdw: gradient of the cost with respect to the weights.
      mw: running average of the gradients (first moment).
      vw: running average of the squared gradients (second moment).
      step: the training step, counted from 1; a number or an array (may be
        traced under ``jax.jit``).
      beta1: forgetting factor of the first moment.
      beta2: forgetting factor of the second moment.
      epsilon: added to both denominators, preventing division by zero.

    Returns:
      ``(delta, mw_new, vw_new)``, each with the structure of the tree
      arguments (arrays if none is a tree).

    Ivy's ``out=`` argument is not carried over: JAX arrays are immutable.

    Example:

    >>> import jax.numpy as jnp
    >>> from functrain import compat
    >>> delta, mw, vw = compat.adam_step(
    ...     jnp.array([1, 2, 3]), jnp.ones(3), jnp.ones(1), jnp.array(3))
    >>> print(delta)
    [0.20201 0.22188 0.24145]
    >>> print(mw)
    [1.  1.1 1.2]
    >>> print(vw)
    [1.    1.003 1.008]
    """
    return map_broadcast(
        _adam_step_leaf,
        ("dcdw", "mw", "vw", "step", "beta1", "beta2", "epsilon"),
        (dcdw, mw, vw, step, beta1, beta2, epsilon),
        num_outputs=3,
    )


def optimizer_update(
    w: ArrayTree,
    effective_grad: ArrayTree,
    lr: NumberOrTree,
    *,
    stop_gradients: bool = True,
) -> ArrayTree:
    """New weights ``w - lr * effective_grad``.

    Args:
      w: the weights.
      effective_grad: the (true or effective) gradient of the cost.
      lr: the learning rate: a number, or an array broadcasting against each
        leaf of ``w`` (e.g. one rate per column), or a tree of those.
      stop_gradients: if True, the new weights are gradient-stopped, so that
        nothing flows back through them; pass False to differentiate through
        the update (meta-learning, second-order use).

    Returns:
      The new weights, with the structure of the tree arguments.

    Ivy's ``out=`` argument is not carried over: JAX arrays are immutable.

    Example:

    >>> import jax.numpy as jnp
    >>> from functrain import compat
    >>> w = {'a': jnp.array([[1., 2.], [4., 5.]]), 'b': jnp.array([1., 1.])}
    >>> new = compat.optimizer_update(
    ...     w, jnp.array([1., 10.]), jnp.array([0.1, 0.01]))
    >>> print(new['a'])
    [[0.9 1.9]
     [3.9 4.9]]
    >>> print(new['b'])
    [0.9 0.9]
    """
    return map_broadcast(
        lambda w_, g_, lr_: _optimizer_update_leaf(w_, g_, lr_, stop_gradients),
        ("w", "effective_grad", "lr"),
        (w, effective_grad, lr),
    )


def gradient_descent_update(
    w: ArrayTree,
    dcdw: ArrayTree,
    lr: NumberOrTree,
    *,
    stop_gradients: bool = True,
) -> ArrayTree:
    """Plain gradient descent: ``w - lr * dcdw``.

    The same as :func:`optimizer_update` with the gradient ``dcdw``.

    Args:
      w: the weights.
      dcdw: gradient of the cost with respect to the weights.
      lr: the learning rate (number, array broadcasting against each leaf, or
        tree).
      stop_gradients: if True, the new weights are gradient-stopped.

    Returns:
      The new weights.

    Example:

    >>> import jax.numpy as jnp
    >>> from functrain import compat
    >>> w = [jnp.array([1., 2., 3.]), (jnp.array(4.),)]
    >>> new = compat.gradient_descent_update(w, jnp.array(1.), 0.5)
    >>> print(new[0], new[1][0])
    [0.5 1.5 2.5] 3.5
    """
    return optimizer_update(w, dcdw, lr, stop_gradients=stop_gradients)


def adam_update(
    w: ArrayTree,
    dcdw: ArrayTree,
    lr: NumberOrTree,
    mw_tm1: ArrayTree,
    vw_tm1: ArrayTree,
    step: NumberOrTree,
    *,
    beta1: NumberOrTree = 0.9,
    beta2: NumberOrTree = 0.999,
    epsilon: NumberOrTree = 1e-7,
    stop_gradients: bool = True,
) -> Tuple[ArrayTree, ArrayTree, ArrayTree]:
    """One Adam update: :func:`adam_step`, then :func:`optimizer_update`.

    Args:
      w: the weights.
      dcdw: gradient of the cost with respect to the weights.
      lr: the learning rate (number, array broadcasting against each leaf, or
        tree).
      mw_tm1: first moment from the previous step.
      vw_tm1: second moment from the previous step.
      step: the training step, counted from 1 (number or array, may be traced).
      beta1: forgetting factor of the first moment.
      beta2: forgetting factor of the second moment.
      epsilon: added to both denominators of :func:`adam_step`.
      stop_gradients: if True, the new weights are gradient-stopped (the
        moments are returned as computed).

    Returns:
      ``(w_new, mw, vw)``.  The moments have the structure of
      ``(dcdw, mw_tm1, vw_tm1, step)``'s tree arguments and ``w_new`` that of
      ``w``: with a tree ``w`` and single-array gradients, the moments stay
      single arrays, as in Ivy.

    Example:

    >>> import jax.numpy as jnp
    >>> from functrain import compat
    >>> w_new, mw, vw = compat.adam_update(
    ...     jnp.array([1., 2., 3.]), jnp.array([0.5, 0.2, 0.1]), 0.1,
    ...     jnp.zeros(3), jnp.zeros(1), 1)
    >>> print(w_new)
    [0.90000075 1.9000016  2.9000032 ]
    >>> print(mw)
    [0.05 0.02 0.01]
    """
    delta, mw, vw = adam_step(
        dcdw, mw_tm1, vw_tm1, step, beta1=beta1, beta2=beta2, epsilon=epsilon
    )
    w_new = optimizer_update(w, delta, lr, stop_gradients=stop_gradients)
    return w_new, mw, vw


def lamb_update(
    w: ArrayTree,
    dcdw: ArrayTree,
    lr: NumberOrTree,
    mw_tm1: ArrayTree,
    vw_tm1: ArrayTree,
    step: NumberOrTree,
    *,
    beta1: NumberOrTree = 0.9,
    beta2: NumberOrTree = 0.999,
    epsilon: NumberOrTree = 1e-7,
    max_trust_ratio: NumberOrTree = 10,
    decay_lambda: NumberOrTree = 0,
    stop_gradients: bool = True,
) -> Tuple[ArrayTree, ArrayTree, ArrayTree]:
    """One LAMB update (You et al., 2019, "Large Batch Optimization for Deep
    Learning: Training BERT in 76 minutes").

    Per leaf: ``eff`` is the :func:`adam_step` delta,
    ``u = eff + decay_lambda * w``,
    ``r = min(||w|| / (||u|| + 1e-12), max_trust_ratio)`` and
    ``w_new = w - lr * r * u``.  Norms are per leaf (per layer).

    With ``decay_lambda=0`` (the default) this gives Ivy's numbers.  With
    weight decay it follows the LAMB paper, and so departs from Ivy: Ivy
    includes the decay term in the norm of the trust ratio but then applies
    ``lr * r * eff``, leaving the decay out of the step itself; functrain
    applies ``lr * r * (eff + decay_lambda * w)``.

    Args:
      w: the weights.
      dcdw: gradient of the cost with respect to the weights.
      lr: the learning rate (number, array broadcasting against each leaf, or
        tree).
      mw_tm1: first moment from the previous step.
      vw_tm1: second moment from the previous step.
      step: the training step, counted from 1 (number or array, may be traced).
      beta1: forgetting factor of the first moment.
      beta2: forgetting factor of the second moment.
      epsilon: added to both denominators of :func:`adam_step`.
      max_trust_ratio: upper bound of the trust ratio ``r``.
      decay_lambda: decoupled weight-decay factor.
      stop_gradients: if True, the new weights are gradient-stopped.

    Returns:
      ``(w_new, mw, vw)``, structured as in :func:`adam_update`.

    Example:

    >>> import jax.numpy as jnp
    >>> from functrain import compat
    >>> w_new, mw, vw = compat.lamb_update(
    ...     jnp.array([1., 2., 3.]), jnp.array([0.5, 0.2, 0.1]), 0.1,
    ...     jnp.zeros(3), jnp.zeros(1), 1)
    >>> print(w_new)
    [0.784 1.784 2.784]
    >>> w_new, _, _ = compat.lamb_update(
    ...     jnp.array([3., 4.]), jnp.array([1., 1.]), 0.1,
    ...     jnp.zeros(2), jnp.zeros(2), 1, decay_lambda=0.5)
    >>> print(w_new)
    [2.67991 3.61589]
    """
    delta, mw, vw = adam_step(
        dcdw, mw_tm1, vw_tm1, step, beta1=beta1, beta2=beta2, epsilon=epsilon
    )
    w_new = map_broadcast(
        lambda w_, d_, lr_, mtr_, dl_: _lamb_leaf(w_, d_, lr_, mtr_, dl_, stop_gradients),
        ("w", "adam_step delta", "lr", "max_trust_ratio", "decay_lambda"),
        (w, delta, lr, max_trust_ratio, decay_lambda),
    )
    return w_new, mw, vw


def lars_update(
    w: ArrayTree,
    dcdw: ArrayTree,
    lr: NumberOrTree,
    *,
    decay_lambda: NumberOrTree = 0,
    stop_gradients: bool = True,
) -> ArrayTree:
    """One LARS update (You et al., 2017, "Large Batch Training of
    Convolutional Networks").

    Per leaf:
    ``local_lr = lr * ||w|| / (||dcdw|| + decay_lambda * ||w|| + 1e-12)`` and
    ``w_new = w - local_lr * (dcdw + decay_lambda * w)``.  Norms are per leaf
    (per layer).

    With ``decay_lambda=0`` (the default) this gives Ivy's numbers.  With
    weight decay it follows the LARS paper, and so departs from Ivy: Ivy
    divides the local rate by ``||w|| * decay_lambda`` and steps along
    ``dcdw`` alone; functrain puts ``decay_lambda * ||w||`` in the
    denominator's sum and steps along ``dcdw + decay_lambda * w``.

    Args:
      w: the weights.
      dcdw: gradient of the cost with respect to the weights.
      lr: the global learning rate (number, array, or tree).
      decay_lambda: weight-decay factor.
      stop_gradients: if True, the new weights are gradient-stopped.

    Returns:
      The new weights.

    Example:

    >>> import jax.numpy as jnp
    >>> from functrain import compat
    >>> w = {'a': jnp.array([3., 4.]), 'b': jnp.array([0., 1.])}
    >>> new = compat.lars_update(w, {'a': jnp.array([0., 2.]),
    ...                                    'b': jnp.array([1., 0.])}, 0.1)
    >>> print(new['a'])
    [3.  3.5]
    >>> print(new['b'])
    [-0.1  1. ]
    """
    return map_broadcast(
        lambda w_, g_, lr_, dl_: _lars_leaf(w_, g_, lr_, dl_, stop_gradients),
        ("w", "dcdw", "lr", "decay_lambda"),
        (w, dcdw, lr, decay_lambda),
    )
