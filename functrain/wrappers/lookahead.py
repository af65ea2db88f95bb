"""Lookahead (Zhang et al., 2019): ``k`` steps forward with a fast optimizer, one step back.

The parameters are a pair :class:`LookaheadParams` ``(fast, slow)``. The fast
optimizer steps the fast parameters; every ``sync_period`` steps the slow
parameters move a fraction ``slow_step_size`` of the way to the fast ones, and
the fast parameters are reset to the new slow ones. Names, arguments, states
and numbers are optax 0.2.8's.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from absl import logging
import jax
import jax.numpy as jnp

from functrain.arg_checks import check_range, check_state_type, check_transformation
from functrain.declarations import hyperparameters
from functrain import tree as ft
from functrain.engine.protocol import (GradientTransformation, OptState, Params, Updates,
                                       call_update)

Array = jax.Array
PyTree = Any


class LookaheadParams(NamedTuple):
    """The fast and slow parameters of :func:`lookahead`.

    Compute the gradients at ``fast``; evaluate (test, infer) with ``slow``,
    which generalises better (Zhang et al., 2019, "Lookahead Optimizer: k steps
    forward, 1 step back").

    Attributes:
      fast: the parameters the fast optimizer steps (take gradients here).
      slow: the slowly moving parameters (use them for evaluation).

    >>> import jax.numpy as jnp
    >>> LookaheadParams.init_synced(jnp.ones(2))
    LookaheadParams(fast=Array([1., 1.], dtype=float32), slow=Array([1., 1.], dtype=float32))
    """

    fast: Params
    slow: Params

    @classmethod
    def init_synced(cls, params: Params) -> "LookaheadParams":
        """A pair whose fast and slow parameters are both ``params``.

        Args:
          params: the initial parameters.

        Returns:
          ``LookaheadParams(fast=params, slow=params)``.

        >>> import jax.numpy as jnp
        >>> LookaheadParams.init_synced({'w': jnp.zeros(1)}).slow
        {'w': Array([0.], dtype=float32)}
        """
        return cls(fast=params, slow=params)


class LookaheadState(NamedTuple):
    """State of :func:`lookahead`.

    Attributes:
      fast_state: the fast optimizer's state.
      steps_since_sync: fast steps since the last synchronisation, ``0 ..
        sync_period - 1`` (int32).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.lookahead(functrain.sgd(0.1), sync_period=2, slow_step_size=0.5)
    >>> opt.init(functrain.LookaheadParams.init_synced(jnp.ones(1))).steps_since_sync
    Array(0, dtype=int32)
    """

    fast_state: OptState
    steps_since_sync: Array


@hyperparameters(sync_period="number", slow_step_size="number")
def lookahead(fast_optimizer: GradientTransformation, sync_period: int, slow_step_size: float,
              reset_state: bool = False) -> GradientTransformation:
    """Lookahead (Zhang et al., 2019): a slow copy of the weights pulled towards the fast one.

    With ``u_t`` the fast optimizer's update, ``f``/``s`` the fast and slow
    parameters and ``a = slow_step_size``: on ordinary steps ``f <- f + u_t``
    and ``s`` stays; on every ``sync_period``-th step, with ``d = f + u_t - s``,
    ``s <- s + a d`` and ``f <- s`` (the new slow parameters). The update
    returned is a :class:`LookaheadParams` of both increments: apply it to the
    ``LookaheadParams`` unchanged, or the pair falls out of sync. Paper:
    Zhang, Lucas, Hinton and Ba, "Lookahead Optimizer: k steps forward, 1 step
    back" (2019).

    Args:
      fast_optimizer: the inner optimizer (functrain's, optax's, or any object
        with ``init`` and ``update``); it sees the fast parameters.
      sync_period: fast steps between synchronisations, an int ``>= 1``.
      slow_step_size: the fraction ``a`` of the way the slow parameters move
        towards the fast ones at a synchronisation.
      reset_state: re-initialise the fast optimizer's state (from the fast
        parameters) at every synchronisation.

    Returns:
      A ``GradientTransformation`` whose ``update(grads, state, params)``
      takes the gradients at ``params.fast`` and ``params`` as
      :class:`LookaheadParams` (required; optax's are taken too), returns
      updates of the same class, and whose state is :class:`LookaheadState`.

    >>> import jax, jax.numpy as jnp, functrain
    >>> opt = functrain.lookahead(functrain.sgd(0.1), sync_period=2, slow_step_size=0.5)
    >>> params = functrain.LookaheadParams.init_synced(jnp.ones(1))
    >>> state = opt.init(params)
    >>> for _ in range(2):
    ...     updates, state = opt.update(jnp.ones(1), state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> params
    LookaheadParams(fast=Array([0.9], dtype=float32), slow=Array([0.9], dtype=float32))
    """
    check_transformation(fast_optimizer, "lookahead", "fast_optimizer")
    check_range("sync_period", sync_period, 1.0, owner="lookahead")

    def init_fn(params: Params) -> LookaheadState:
        if _same_fields(params, LookaheadParams):
            fast = params.fast
        else:
            logging.warning("lookahead: params are not LookaheadParams; taking them as the "
                            "fast parameters.")
            fast = params
        return LookaheadState(fast_state=fast_optimizer.init(fast),
                              steps_since_sync=jnp.zeros([], jnp.int32))

    def update_fn(updates: Updates, state: LookaheadState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[LookaheadParams, LookaheadState]:
        if _same_fields(state, LookaheadState):  # ours, or optax's
            state = LookaheadState(*state)
        check_state_type(state, LookaheadState, "lookahead")
        if not _same_fields(params, LookaheadParams):
            raise TypeError(f"lookahead: update needs params as LookaheadParams(fast, slow) "
                            f"(e.g. LookaheadParams.init_synced(params)), got "
                            f"{type(params).__name__}.")
        ft.check_structure(params.fast, params.slow, "params.slow", "params.fast")
        fast_updates, fast_state = call_update(fast_optimizer, updates, state.fast_state,
                                               params.fast, extra_args)
        sync = state.steps_since_sync == sync_period - 1
        diff = jax.tree_util.tree_map(lambda f, u, s: f + u - s, params.fast, fast_updates,
                                      params.slow)
        zero = lambda x: jnp.zeros_like(x)  # noqa: E731
        slow_out = jax.tree_util.tree_map(
            lambda d, s: jnp.where(sync, slow_step_size * d, zero(d)).astype(s.dtype),
            diff, params.slow)
        fast_out = jax.tree_util.tree_map(
            lambda u, d: (u - jnp.where(sync, (1 - slow_step_size) * d, zero(d))).astype(
                u.dtype), fast_updates, diff)
        if reset_state:
            fresh = fast_optimizer.init(params.fast)
            fast_state = jax.tree_util.tree_map(
                lambda now, new: jnp.where(sync, new, now).astype(jnp.asarray(now).dtype),
                fast_state, fresh)
        # In the params' own class (optax's LookaheadParams stays optax's for apply_updates).
        return (type(params)(fast=fast_out, slow=slow_out),
                LookaheadState(fast_state, (state.steps_since_sync + 1) % sync_period))

    return GradientTransformation(init_fn, update_fn)


def _same_fields(x: Any, cls: type) -> bool:
    """Whether ``x`` is a NamedTuple with ``cls``'s fields (``cls``, or optax's of that name)."""
    return isinstance(x, tuple) and getattr(x, "_fields", None) == cls._fields
