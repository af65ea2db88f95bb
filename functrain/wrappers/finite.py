"""Skipping bad steps: ``apply_if_finite`` runs the inner optimizer only on finite updates.

A plain transformation around the wrapped one (the stages inside still run
fused); the branch uses ``lax.cond`` with identical output types on both
sides, so it works under ``jit``, ``scan`` and sharded jit.

Also here: ``skip_not_finite`` and ``skip_large_updates``, the
``should_skip_update_fn`` s (:class:`ShouldSkipUpdateFunction`) that make
:class:`~functrain.MultiSteps` drop a bad micro-batch, as in optax.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Protocol

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_range, check_state_type, check_transformation
from functrain import tree as ft
from functrain.engine.protocol import GradientTransformation, Params, Updates, call_update
from functrain.engine.counts import safe_increment

Array = jax.Array
PyTree = Any


class ApplyIfFiniteState(NamedTuple):
    """State of :func:`apply_if_finite`.

    ``notfinite_count``: consecutive non-finite steps so far (reset to 0 by a
    finite step and by a forced update); ``last_finite``: whether the last
    step was finite; ``total_notfinite``: all non-finite steps seen.

    Attributes:
      notfinite_count: consecutive non-finite steps so far (int32).
      last_finite: whether the last step's updates were all finite (bool).
      total_notfinite: the number of non-finite steps seen in all (int32).
      inner_state: the wrapped optimizer's state, unchanged by skipped steps.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.apply_if_finite(functrain.sgd(0.1), 2)
    >>> tx.init([jnp.ones(1)]).total_notfinite
    Array(0, dtype=int32)
    """

    notfinite_count: Array
    last_finite: Array
    total_notfinite: Array
    inner_state: Any


def apply_if_finite(inner: GradientTransformation,
                    max_consecutive_errors: int) -> GradientTransformation:
    """Skip steps whose updates hold NaN or Inf; give up after too many in a row.

    A non-finite step returns zero updates and leaves ``inner`` 's state
    untouched. After ``max_consecutive_errors`` skipped steps in a row, the
    next non-finite step is applied anyway (as optax); unlike optax, the
    consecutive counter then restarts from zero, so the following bad steps
    are skipped again.

    Args:
      inner: the optimizer to protect (functrain's, optax's, or any object with
        ``init`` and ``update``).
      max_consecutive_errors: how many non-finite steps in a row are skipped
        before one is applied anyway, ``>= 0`` (0: none is skipped).

    Returns:
      A ``GradientTransformation`` whose state is
      ``ApplyIfFiniteState(notfinite_count, last_finite, total_notfinite,
      inner_state)``, as optax's.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.apply_if_finite(functrain.sgd(1.0), max_consecutive_errors=2)
    >>> state = tx.init([jnp.zeros(1)])
    >>> u, state = tx.update([jnp.array([jnp.nan])], state)
    >>> u, int(state.notfinite_count)
    ([Array([0.], dtype=float32)], 1)
    """
    check_transformation(inner, "apply_if_finite")
    check_range("max_consecutive_errors", max_consecutive_errors, 0.0,
                owner="apply_if_finite")

    def init_fn(params: Params) -> ApplyIfFiniteState:
        return ApplyIfFiniteState(jnp.zeros([], jnp.int32), jnp.array(True),
                                  jnp.zeros([], jnp.int32), inner.init(params))

    def update_fn(updates: Updates, state: ApplyIfFiniteState,
                  params: Optional[Params] = None, **extra_args: Any
                  ) -> tuple[Updates, ApplyIfFiniteState]:
        check_state_type(state, ApplyIfFiniteState, "apply_if_finite")
        finite = jnp.array(True)
        for x in jax.tree_util.tree_leaves(updates):
            finite = jnp.logical_and(finite, jnp.all(jnp.isfinite(x)))
        count = jnp.where(finite, 0, safe_increment(state.notfinite_count))
        forced = count > max_consecutive_errors
        apply = jnp.logical_or(finite, forced)

        def step() -> tuple[Updates, Any]:
            return call_update(inner, updates, state.inner_state, params, extra_args)

        shapes = jax.eval_shape(step)

        def do() -> tuple[Updates, Any]:
            new_updates, new_inner = step()
            return new_updates, jax.tree_util.tree_map(
                lambda x, s: jnp.asarray(x).astype(s.dtype), new_inner, shapes[1])

        def skip() -> tuple[Updates, Any]:
            return (jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes[0]),
                    jax.tree_util.tree_map(lambda x, s: jnp.asarray(x).astype(s.dtype),
                                           state.inner_state, shapes[1]))

        new_updates, inner_state = jax.lax.cond(apply, do, skip)
        return new_updates, ApplyIfFiniteState(
            notfinite_count=jnp.where(forced, 0, count).astype(jnp.int32),
            last_finite=finite,
            total_notfinite=jnp.where(finite, state.total_notfinite,
                                      safe_increment(state.total_notfinite)),
            inner_state=inner_state)

    return GradientTransformation(init_fn, update_fn)


# --------------------------------------------------------------------------
# should_skip_update_fn for MultiSteps
# --------------------------------------------------------------------------

class ShouldSkipUpdateFunction(Protocol):
    """The type of ``MultiSteps`` ' ``should_skip_update_fn``.

    ``fn(updates, gradient_step, params) -> (skip, info)``: ``skip`` a scalar
    bool array, True to drop this micro-batch as if it never happened;
    ``info`` any tree of arrays, kept in ``MultiStepsState.skip_state``
    (debugging and monitoring). ``gradient_step`` counts the real updates so
    far (e.g. for an annealed threshold); ``params`` may be ``None``.

    >>> import jax.numpy as jnp, functrain
    >>> fn: ShouldSkipUpdateFunction = functrain.skip_not_finite
    >>> bool(fn([jnp.array([jnp.nan])], jnp.asarray(0), None)[0])
    True
    """

    def __call__(self, updates: Updates, gradient_step: Array, params: Optional[Params]
                 ) -> tuple[Array, Any]:
        """Whether to skip this micro-batch, and what to record about it.

        Args:
          updates: this micro-batch's gradients.
          gradient_step: the number of real updates so far (int32 scalar).
          params: the current parameters, or ``None``.

        Returns:
          ``(skip, info)``: a scalar bool array and a tree of arrays.
        """


def skip_not_finite(updates: Updates, gradient_step: Array, params: Optional[Params]
                    ) -> tuple[Array, dict]:
    """A ``should_skip_update_fn``: skip the micro-batch if any update is NaN or infinite.

    Args:
      updates: the micro-batch's gradients.
      gradient_step: unused (see :class:`ShouldSkipUpdateFunction`).
      params: unused.

    Returns:
      ``(skip, {'should_skip': skip, 'num_not_finite': n})``: ``n`` counts the
      NaN and infinite entries (an integer scalar), ``skip`` is ``n > 0``.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.MultiSteps(functrain.sgd(1.0), 2,
    ...                            should_skip_update_fn=functrain.skip_not_finite)
    >>> state = opt.init([jnp.zeros(2)])
    >>> _, state = opt.update([jnp.array([1., jnp.inf])], state)
    >>> int(state.mini_step), int(state.skip_state['num_not_finite'])
    (0, 1)
    """
    del gradient_step, params
    count = jnp.zeros([], jnp.int32)
    for x in jax.tree_util.tree_leaves(updates):
        count = count + jnp.sum(jnp.logical_not(jnp.isfinite(x)))
    skip = count > 0
    return skip, {"should_skip": skip, "num_not_finite": count}


def skip_large_updates(updates: Updates, gradient_step: Array, params: Optional[Params],
                       max_squared_norm: Any) -> tuple[Array, dict]:
    """A ``should_skip_update_fn``: skip the micro-batch unless ``||updates||^2 < max_squared_norm``.

    Bind the threshold first:
    ``functools.partial(skip_large_updates, max_squared_norm=42.0)``. A NaN
    norm is skipped too. Complex leaves count ``|x|^2``.

    Args:
      updates: the micro-batch's gradients.
      gradient_step: unused (see :class:`ShouldSkipUpdateFunction`).
      params: unused.
      max_squared_norm: the bound on the squared global norm (exclusive), ``>=
        0`` (``inf``: only NaN norms are skipped); a number or a scalar array.

    Returns:
      ``(skip, {'should_skip': skip, 'norm_squared': n})``: ``n`` the squared
      global norm (at least float32), ``skip`` is ``not n < max_squared_norm``.

    >>> import functools, jax.numpy as jnp, functrain
    >>> fn = functools.partial(functrain.skip_large_updates, max_squared_norm=10.0)
    >>> skip, info = fn([jnp.array([3., 4.])], jnp.asarray(0), None)
    >>> bool(skip), float(info['norm_squared'])
    (True, 25.0)
    """
    del gradient_step, params
    check_range("max_squared_norm", max_squared_norm, 0.0, owner="skip_large_updates")
    norm_sq = ft.norm(updates, squared=True)
    skip = jnp.logical_not(norm_sq < max_squared_norm)
    return skip, {"should_skip": skip, "norm_squared": norm_sq}
