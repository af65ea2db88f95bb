"""SAM (Foret et al., 2021): sharpness-aware minimization, as optax.contrib's wrapper.

SAM alternates adversarial steps (by ``adv_optimizer``, usually a normalized
gradient ascent step of size ``rho``) with an outer step (by ``optimizer``) that
uses the gradient found at the adversarial point but moves the parameters from
where they were before the adversarial steps. The usual adversarial optimizer
is ``chain(functrain.contrib.normalize(), sgd(rho))``.

``sam`` wraps two optimizers over whole trees (their states are switched
between steps), so it is a plain transformation, in two modes:

* transparent (default): each ``update`` call is one step, adversarial or
  outer; the adversarial points are visible to the caller as parameters.
* opaque (``opaque_mode=True``): each ``update`` call runs the adversarial
  steps internally, calling ``grad_fn(params, i)`` for the gradients there, and
  returns the outer update only.

Names, arguments, states and numbers are optax 0.2.8's.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import (MissingArgumentError, check_range, check_state_type,
                                  check_transformation, needs_params_error)
from functrain.declarations import declare_optimizer, hyperparameters
from functrain import tree as ft
from functrain.engine.protocol import (GradientTransformation, GradientTransformationExtraArgs,
                                       OptState, Params, Updates, call_update)
from functrain.param_updates import apply_updates

Array = jax.Array

__all__ = ["SAMState", "sam"]


class SAMState(NamedTuple):
    """State of :func:`sam` (optax's fields, in optax's order).

    Attributes:
      steps_since_sync: adversarial steps since the last outer step (int32;
        always 0 in opaque mode).
      opt_state: the outer optimizer's state.
      adv_state: the adversarial optimizer's state.
      cache: the parameters of the last outer step (transparent mode), the
        point the outer step moves from; ``None`` in opaque mode.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.sam(functrain.sgd(0.1), functrain.sgd(0.05))
    >>> opt.init({'w': jnp.ones(2)}).steps_since_sync
    Array(0, dtype=int32)
    """

    steps_since_sync: Array
    opt_state: OptState
    adv_state: OptState
    cache: Optional[Params]


def _pick(cond: Array, if_true: Any, if_false: Any) -> Any:
    """``if_true`` where ``cond`` else ``if_false``, leaf by leaf, keeping each leaf's dtype."""
    return jax.tree_util.tree_map(
        lambda a, b: jnp.where(cond, a, b).astype(jnp.asarray(b).dtype), if_true, if_false)


def _negated(tree: Updates) -> Updates:
    return jax.tree_util.tree_map(lambda x: -x, tree)


@declare_optimizer("contrib", "Foret et al., 2021", optax="contrib", summary=(
    "Sharpness-aware minimization (Foret et al., 2021), transparent or opaque (`grad_fn=`)."),
    signature="sam(optimizer, adv_optimizer, ...)")
@hyperparameters(sync_period="number")
def sam(optimizer: GradientTransformation, adv_optimizer: GradientTransformation,
        sync_period: int = 2, reset_state: bool = True, opaque_mode: bool = False,
        batch_axis_name: Optional[str] = None) -> GradientTransformationExtraArgs:
    """SAM (Foret et al., 2021): outer steps taken with gradients at adversarial points.

    Every ``sync_period`` calls form one SAM step. From the outer parameters
    ``x``, ``sync_period - 1`` adversarial steps move ``y <- y - a(g(y))`` with
    ``a`` the adversarial optimizer's update (gradient *ascent*: the sign is
    flipped, so ``chain(normalize(), sgd(rho))`` gives ``y = x + rho g /
    ||g||``); then the outer optimizer's update ``u`` of the gradient at the last
    ``y`` is applied at ``x``: ``x <- x + u``. With ``reset_state`` the
    adversarial optimizer's state is re-initialised after each outer step.
    Reference: Foret, Kleiner, Mobahi and Neyshabur, "Sharpness-Aware
    Minimization for Efficiently Improving Generalization" (2021).

    In the default transparent mode each call is one step: call ``update`` with
    the gradient at the current params (adversarial or not) and apply the
    result. With ``opaque_mode=True`` each call is a whole SAM step: pass
    ``grad_fn=lambda params, i: grads`` (the gradient at the ``i``-th
    adversarial point), called ``sync_period - 1`` times.

    Args:
      optimizer: the outer optimizer (any object with ``init`` and ``update``).
      adv_optimizer: the adversarial optimizer, e.g. ``chain(normalize(),
        sgd(rho))``.
      sync_period: calls per SAM step (adversarial steps plus one), ``>= 1``.
      reset_state: re-initialise the adversarial state after each outer step.
      opaque_mode: run the adversarial steps inside ``update`` (needs
        ``grad_fn``), so that the caller only sees outer steps (e.g. for
        BatchNorm statistics).
      batch_axis_name: in opaque mode under ``pmap``, the axis to average the
        adversarial gradients over with ``jax.lax.pmean``; ``None`` for none.

    Returns:
      A ``GradientTransformationExtraArgs`` whose state is :class:`SAMState`;
      ``update(updates, state, params, grad_fn=None)`` needs ``params``, and
      ``grad_fn`` in opaque mode. Other keywords go to both optimizers.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda x: jnp.sum(x ** 2)
    >>> adv = functrain.chain(functrain.contrib.normalize(), functrain.sgd(0.1))
    >>> opt = functrain.contrib.sam(functrain.sgd(0.1), adv, sync_period=2)
    >>> params = jnp.array([1., 0.])
    >>> state = opt.init(params)
    >>> for _ in range(2):   # one adversarial step, one outer step
    ...     updates, state = opt.update(jax.grad(f)(params), state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> params
    Array([0.78, 0.  ], dtype=float32)
    """
    check_transformation(optimizer, "sam", "optimizer")
    check_transformation(adv_optimizer, "sam", "adv_optimizer")
    # optax takes an integer-valued float (2.0) too; 2.5 would never sync there.
    if (isinstance(sync_period, bool) or not isinstance(sync_period, numbers.Real)
            or not float(sync_period).is_integer()):
        raise TypeError(f"sam: sync_period must be a whole number of calls (an int), got "
                        f"{type(sync_period).__name__} {sync_period!r}.")
    check_range("sync_period", sync_period, 1.0, owner="sam")
    sync_period = int(sync_period)

    # The adversarial point p - a(g) is not an integer: an integer param cannot hold it, so
    # init and update refuse integer params (check_leaf_dtypes without integers=True).

    def init_fn(params: Params) -> SAMState:
        paths, leaves, _ = ft.flatten_with_paths(params)
        ft.check_leaf_dtypes(paths, leaves, [True] * len(leaves), "sam", "params")
        cache = None if opaque_mode else jax.tree_util.tree_map(jnp.copy, params)
        return SAMState(steps_since_sync=jnp.zeros([], jnp.int32),
                        opt_state=optimizer.init(params),
                        adv_state=adv_optimizer.init(params), cache=cache)

    def check_inputs(updates: Updates, state: Any, params: Any) -> None:
        check_state_type(state, SAMState, "sam")
        if params is None:
            raise needs_params_error("sam")
        ft.check_structure(updates, params, "params", "updates")
        paths, gs, treedef = ft.flatten_with_paths(updates)
        ps = treedef.flatten_up_to(params)
        ft.check_leaf_dtypes(paths, ps, [True] * len(ps), "sam", "params")
        ft.check_shapes(paths, ps, gs, "updates", "params")

    def transparent_update(updates: Updates, state: SAMState, params: Optional[Params] = None,
                           *, grad_fn: Optional[Callable] = None, **extra_args: Any
                           ) -> tuple[Updates, SAMState]:
        del grad_fn
        check_inputs(updates, state, params)
        if state.cache is None:
            raise ValueError("sam: the state has no cache: was it made by an opaque_mode=True "
                             "sam's init?")
        first = state.steps_since_sync == 0
        last = state.steps_since_sync == sync_period - 1
        adv_updates, adv_state = call_update(adv_optimizer, updates, state.adv_state, params,
                                             extra_args)
        adv_updates = _negated(adv_updates)
        # The outer step moves from the cached outer params: undo the adversarial moves.
        opt_updates, opt_state = call_update(optimizer, updates, state.opt_state, state.cache,
                                             extra_args)
        opt_updates = jax.tree_util.tree_map(lambda c, p, u: (c - p + u).astype(u.dtype),
                                             state.cache, params, opt_updates)
        cache = _pick(first, params, state.cache)
        new_updates = _pick(last, opt_updates, adv_updates)
        if reset_state:
            adv_state = _pick(last, adv_optimizer.init(params), adv_state)
        else:
            adv_state = _pick(last, state.adv_state, adv_state)
        opt_state = _pick(last, opt_state, state.opt_state)
        return new_updates, SAMState((state.steps_since_sync + 1) % sync_period, opt_state,
                                     adv_state, cache)

    def opaque_update(updates: Updates, state: SAMState, params: Optional[Params] = None,
                      *, grad_fn: Optional[Callable] = None, **extra_args: Any
                      ) -> tuple[Updates, SAMState]:
        if grad_fn is None:
            raise MissingArgumentError("sam: grad_fn must be given when opaque_mode=True: "
                                       "call update(updates, state, params, grad_fn=lambda "
                                       "params, i: grads).")
        if not callable(grad_fn):
            raise TypeError(f"sam: grad_fn must be a function (params, i) -> grads, got "
                            f"{type(grad_fn).__name__}.")
        check_inputs(updates, state, params)
        adv_params, adv_updates, adv_state = params, updates, state.adv_state
        for i in range(sync_period - 1):
            adv_updates, adv_state = call_update(adv_optimizer, adv_updates, adv_state,
                                                 adv_params, extra_args)
            adv_params = apply_updates(adv_params, _negated(adv_updates))
            adv_updates = grad_fn(adv_params, i)
            if batch_axis_name is not None:
                adv_updates = jax.lax.pmean(adv_updates, axis_name=batch_axis_name)
        if reset_state:
            adv_state = adv_optimizer.init(params)
        new_updates, opt_state = call_update(optimizer, adv_updates, state.opt_state, params,
                                             extra_args)
        return new_updates, SAMState(jnp.zeros([], jnp.int32), opt_state, adv_state, None)

    return GradientTransformationExtraArgs(
        init_fn, opaque_update if opaque_mode else transparent_update)
