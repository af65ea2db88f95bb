"""Gradient accumulation: ``MultiSteps`` applies the inner optimizer every k micro-batches.

``MultiSteps`` acts on a whole optimizer, not on leaves, so it is a plain
transformation around the wrapped one; the stages inside still run fused. Its
branch uses ``lax.cond`` with both sides' outputs made identical in shape and
dtype (the source of optax's bfloat16 ``MultiSteps`` bug), so it works under
``jit``, ``scan`` and sharded jit.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from functrain.arg_checks import check_state_type, check_transformation
from functrain.declarations import record_builder, state_value_kinds
from functrain import tree as ft
from functrain.engine.protocol import GradientTransformation, Params, Updates, call_update
from functrain.engine.counts import safe_increment

Array = jax.Array
PyTree = Any


@state_value_kinds()  # accumulated gradients stay exact; the inner state is walked
class MultiStepsState(NamedTuple):
    """State of :class:`MultiSteps`.

    ``mini_step`` counts micro-batches since the last real update,
    ``gradient_step`` counts real updates, ``acc_grads`` holds the running
    mean (or sum) of the micro-batch gradients, ``skip_state`` what
    ``should_skip_update_fn`` returned last.

    Attributes:
      mini_step: micro-batches accumulated since the last real update (int32,
        from 0 to ``k - 1``).
      gradient_step: the number of real updates applied so far (int32); the
        argument of a callable ``every_k_schedule``.
      inner_opt_state: the wrapped optimizer's state, changed only by real
        updates.
      acc_grads: the running mean (or sum) of this cycle's micro-batch
        gradients, a tree like the params, in the accumulator dtype.
      skip_state: the second value ``should_skip_update_fn`` returned last
        (``()`` without one).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.MultiSteps(functrain.sgd(0.1), every_k_schedule=2)
    >>> opt.init({'w': jnp.zeros(2)}).acc_grads
    {'w': Array([0., 0.], dtype=float32)}
    """

    mini_step: Array
    gradient_step: Array
    inner_opt_state: Any
    acc_grads: Any
    skip_state: Any = ()


def _never_skip(updates: Updates, gradient_step: Array, params: Optional[Params]
                ) -> tuple[Array, Any]:
    return jnp.array(False), ()


class MultiSteps:
    """Accumulate gradients over ``k`` micro-batches, then apply one real update.

    Between real updates the returned updates are zeros; on every ``k``-th call
    the wrapped optimizer sees the mean (``use_grad_mean``) or the sum of the
    ``k`` gradients. ``every_k_schedule`` is an int or a function of the
    number of real updates so far. ``should_skip_update_fn(updates,
    gradient_step, params) -> (bool, info)`` can reject a micro-batch as if it
    never happened. The accumulator is stored in ``accumulator_dtype``
    (float32 by default, as optax; pass ``jnp.float64`` to accumulate float64
    gradients in full precision, or ``None`` for the gradients' own dtype);
    the wrapped optimizer gets it cast back to the incoming gradients' dtype,
    so bfloat16 params with float32 gradients work (an optax bug). Works under
    ``jax.jit``, ``jax.lax.scan`` and sharded jit; the inner optimizer runs
    only on real-update steps (a ``lax.cond``).

    Args:
      opt: the optimizer to wrap (functrain's, optax's, or any object with
        ``init`` and ``update``).
      every_k_schedule: how many micro-batches make one real update: an int
        ``>= 1`` (1: every call is a real update), or a function of the number
        of real updates so far returning it.
      use_grad_mean: hand the wrapped optimizer the mean of the ``k``
        gradients (True, the default) or their sum (False).
      should_skip_update_fn: optional
        ``fn(updates, gradient_step, params) -> (skip, info)``: where ``skip``
        (a scalar bool array) is True the micro-batch is dropped (state
        unchanged except ``skip_state = info``); ``None`` never skips.
      accumulator_dtype: the dtype ``acc_grads`` is stored in: float32 by
        default, ``None`` for each gradient's own dtype.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.MultiSteps(functrain.sgd(1.0), every_k_schedule=2)
    >>> params = {'w': jnp.zeros(1)}
    >>> state = opt.init(params)
    >>> u, state = opt.update({'w': jnp.array([1.])}, state, params)
    >>> u, bool(opt.has_updated(state))
    ({'w': Array([0.], dtype=float32)}, False)
    >>> u, state = opt.update({'w': jnp.array([3.])}, state, params)
    >>> u, bool(opt.has_updated(state))
    ({'w': Array([-2.], dtype=float32)}, True)
    """

    def __init__(self, opt: GradientTransformation,
                 every_k_schedule: Union[int, Callable[[Array], Array]],
                 use_grad_mean: bool = True,
                 should_skip_update_fn: Optional[Callable[..., tuple[Array, Any]]] = None,
                 accumulator_dtype: Any = jnp.float32) -> None:
        check_transformation(opt, "MultiSteps", "opt")
        if isinstance(every_k_schedule, (int, np.integer)) and not isinstance(
                every_k_schedule, bool):
            if every_k_schedule < 1:
                raise ValueError(f"MultiSteps: every_k_schedule must be >= 1, got "
                                 f"{every_k_schedule}.")
            k = int(every_k_schedule)
            self._every_k_schedule: Callable[[Array], Any] = lambda step: k
        elif callable(every_k_schedule):
            self._every_k_schedule = every_k_schedule
        else:
            raise TypeError(f"MultiSteps: every_k_schedule must be an int or a function of "
                            f"the step, got {type(every_k_schedule).__name__}.")
        self._opt = opt
        self._use_grad_mean = use_grad_mean
        self._should_skip = should_skip_update_fn or _never_skip
        self._accumulator_dtype = accumulator_dtype
        record_builder(self, "MultiSteps", {}, [opt])  # current_hyperparams reads opt's

    @property
    def inner_opt(self) -> GradientTransformation:
        """The wrapped optimizer.

        Returns:
          The ``opt`` given to the constructor.

        >>> import functrain
        >>> opt = functrain.sgd(0.1)
        >>> functrain.MultiSteps(opt, 2).inner_opt is opt
        True
        """
        return self._opt

    def _acc(self, x: Array) -> Any:
        if self._accumulator_dtype is None:
            return x.dtype
        if jnp.iscomplexobj(x):
            # Complex gradients accumulate as complex numbers of at least that precision
            # (optax's float32 accumulator drops their imaginary parts).
            return jnp.promote_types(self._accumulator_dtype, x.dtype)
        return self._accumulator_dtype

    def init(self, params: Params) -> MultiStepsState:
        """The initial state: zero accumulator, counters at zero.

        Args:
          params: the parameters (a pytree of arrays).

        Returns:
          A :class:`MultiStepsState` holding the wrapped optimizer's initial
          state, a zero accumulator shaped like ``params``, and the
          ``skip_state`` of ``should_skip_update_fn`` on zero updates.

        >>> import jax.numpy as jnp, functrain
        >>> functrain.MultiSteps(functrain.sgd(0.1), 4).init([jnp.ones(1)]).mini_step
        Array(0, dtype=int32)
        """
        gradient_step = jnp.zeros([], jnp.int32)
        _, skip_state = self._should_skip(ft.zeros_like(params), gradient_step, params)
        return MultiStepsState(
            mini_step=jnp.zeros([], jnp.int32), gradient_step=gradient_step,
            inner_opt_state=self._opt.init(params),
            acc_grads=jax.tree_util.tree_map(
                lambda p: ft.zeros_like(p, self._acc(p)), params),
            skip_state=skip_state)

    def update(self, updates: Updates, state: MultiStepsState,
               params: Optional[Params] = None, **extra_args: Any
               ) -> tuple[Updates, MultiStepsState]:
        """Accumulate one micro-batch; every ``k``-th call, run the wrapped optimizer.

        Args:
          updates: this micro-batch's gradients, a tree like the params.
          state: the state from :meth:`init` or the previous ``update``.
          params: the current parameters, handed to the wrapped optimizer (and
            to ``should_skip_update_fn``); ``None`` if not needed.
          **extra_args: further keyword arguments (e.g. ``value``) for the
            wrapped optimizer's ``update``; dropped if it takes none.

        Returns:
          ``(updates, state)``: zeros shaped like ``updates`` between real
          updates, the wrapped optimizer's updates on the ``k``-th call; and
          the new :class:`MultiStepsState`.

        >>> import jax.numpy as jnp, functrain
        >>> opt = functrain.MultiSteps(functrain.sgd(1.0), 1)
        >>> opt.update([jnp.array([2.])], opt.init([jnp.zeros(1)]))[0]
        [Array([-2.], dtype=float32)]
        """
        check_state_type(state, MultiStepsState, "MultiSteps")
        ft.check_structure(updates, state.acc_grads, "MultiSteps state .acc_grads", "updates")
        if params is not None:
            ft.check_structure(updates, params, "params", "updates")
        k = self._every_k_schedule(state.gradient_step)
        skip, skip_state = self._should_skip(updates, state.gradient_step, params)
        skip = jnp.asarray(skip)
        if skip.dtype != jnp.bool_ or skip.shape != ():
            raise ValueError(f"MultiSteps: should_skip_update_fn must return a scalar bool "
                             f"array first, got dtype {skip.dtype} and shape {skip.shape}.")
        n = state.mini_step

        def accumulate(g: Array, acc: Array) -> Array:
            g = g.astype(jnp.promote_types(g.dtype, acc.dtype))
            new = acc + (g - acc) / (n + 1).astype(g.dtype) if self._use_grad_mean else acc + g
            return new.astype(acc.dtype)

        acc = jax.tree_util.tree_map(accumulate, updates, state.acc_grads)
        emit = jnp.logical_and(n == k - 1, jnp.logical_not(skip))
        inner_in = jax.tree_util.tree_map(lambda a, g: a.astype(g.dtype), acc, updates)

        def real_step() -> tuple[Updates, Any]:
            return call_update(self._opt, inner_in, state.inner_opt_state, params, extra_args)

        shapes = jax.eval_shape(real_step)

        def no_step() -> tuple[Updates, Any]:
            zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes[0])
            return zeros, jax.tree_util.tree_map(lambda x, s: jnp.asarray(x).astype(s.dtype),
                                                 state.inner_opt_state, shapes[1])

        def real_step_cast() -> tuple[Updates, Any]:
            new_updates, new_inner = real_step()
            return new_updates, jax.tree_util.tree_map(
                lambda x, s: jnp.asarray(x).astype(s.dtype), new_inner, shapes[1])

        new_updates, inner_state = jax.lax.cond(emit, real_step_cast, no_step)
        keep = lambda new, old: jnp.where(skip, old, new)  # noqa: E731
        acc = jax.tree_util.tree_map(
            lambda a, old: keep(jnp.where(emit, jnp.zeros_like(a), a), old), acc, state.acc_grads)
        return new_updates, MultiStepsState(
            mini_step=keep(safe_increment(n) % jnp.asarray(k, n.dtype), n),
            gradient_step=jnp.where(emit, safe_increment(state.gradient_step),
                                    state.gradient_step),
            inner_opt_state=inner_state, acc_grads=acc, skip_state=skip_state)

    def has_updated(self, state: MultiStepsState) -> Array:
        """True right after a step that applied a real update.

        Args:
          state: a :class:`MultiStepsState` returned by :meth:`update` (or
            :meth:`init`).

        Returns:
          A scalar bool array: True when ``state.mini_step`` is 0 and at least
          one real update has been applied, i.e. right after a real update.

        >>> import jax.numpy as jnp, functrain
        >>> opt = functrain.MultiSteps(functrain.sgd(0.1), 2)
        >>> bool(opt.has_updated(opt.init([jnp.ones(1)])))
        False
        """
        return jnp.logical_and(state.mini_step == 0, state.gradient_step > 0)

    def gradient_transformation(self) -> GradientTransformation:
        """This wrapper as a plain ``GradientTransformation`` (for ``chain`` etc.).

        Returns:
          ``GradientTransformation(self.init, self.update)``; its state is a
          :class:`MultiStepsState`.

        >>> import functrain
        >>> tx = functrain.MultiSteps(functrain.sgd(0.1), 2).gradient_transformation()
        >>> isinstance(tx, functrain.GradientTransformation)
        True
        """
        return GradientTransformation(self.init, self.update)
