"""Control wrappers: when and on what layout a transformation runs.

* ``apply_every``: accumulate the updates, emit their sum every ``k`` steps;
* ``conditionally_transform`` / ``conditionally_mask``: run the inner
  transformation only at the steps a function of the step count picks (the
  other steps pass the updates through, or zero them);
* ``flatten``: run the inner transformation on one flat vector holding every
  leaf.

Each is a plain transformation around the wrapped one (whose stages still run
fused). Branches use ``lax.cond`` with identical output types on both sides,
so they work under ``jit`` and ``scan``. Names, arguments, states and numbers
are optax 0.2.8's.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from functrain.arg_checks import check_range, check_state_type, check_transformation
from functrain.declarations import hyperparameters
from functrain import tree as ft
from functrain.engine.protocol import GradientTransformation, OptState, Params, Updates, call_update
from functrain.engine.counts import safe_increment

Array = jax.Array
PyTree = Any


# --------------------------------------------------------------------------
# apply_every
# --------------------------------------------------------------------------

class ApplyEvery(NamedTuple):
    """State of :func:`apply_every`: a step counter and the accumulated updates.

    Attributes:
      count: steps taken since the last emitted update, ``0 .. k - 1`` (int32).
      grad_acc: the sum of this cycle's updates, a tree like the params.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.apply_every(3).init([jnp.ones(2)])
    ApplyEvery(count=Array(0, dtype=int32), grad_acc=[Array([0., 0.], dtype=float32)])
    """

    count: Array
    grad_acc: Updates


@hyperparameters(k="number")
def apply_every(k: int = 1) -> GradientTransformation:
    """Accumulate the updates and emit their sum every ``k`` steps (zeros in between).

    Only the updates are accumulated: transformations chained before it still
    update their state at every step, so this is not the same as a ``k``
    times larger batch (:class:`~functrain.MultiSteps` is).

    Args:
      k: emit the accumulated sum every ``k`` steps, an int ``>= 1`` (1: every
        step, unchanged).

    Returns:
      A ``GradientTransformation`` whose state is :class:`ApplyEvery`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.apply_every(2)
    >>> state = tx.init([jnp.zeros(1)])
    >>> u, state = tx.update([jnp.array([1.])], state)
    >>> u
    [Array([0.], dtype=float32)]
    >>> tx.update([jnp.array([2.])], state)[0]
    [Array([3.], dtype=float32)]
    """
    check_range("k", k, 1.0, owner="apply_every")

    def init_fn(params: Params) -> ApplyEvery:
        return ApplyEvery(count=jnp.zeros([], jnp.int32), grad_acc=ft.zeros_like(params))

    def update_fn(updates: Updates, state: ApplyEvery, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, ApplyEvery]:
        del params, extra_args
        check_state_type(state, ApplyEvery, "apply_every")
        ft.check_structure(state.grad_acc, updates, "updates", "apply_every state .grad_acc")
        phase = state.count % k
        keep, emit = phase != 0, phase == k - 1

        def accumulate(g: Array, acc: Array) -> Array:
            return (jnp.where(keep, acc, jnp.zeros_like(acc)) + g).astype(acc.dtype)

        grad_acc = jax.tree_util.tree_map(accumulate, updates, state.grad_acc)
        new_updates = jax.tree_util.tree_map(
            lambda acc, g: jnp.where(emit, acc, jnp.zeros_like(acc)).astype(g.dtype),
            grad_acc, updates)
        return new_updates, ApplyEvery(count=safe_increment(state.count) % k,
                                       grad_acc=grad_acc)

    return GradientTransformation(init_fn, update_fn)


# --------------------------------------------------------------------------
# conditionally_transform / conditionally_mask
# --------------------------------------------------------------------------

class ConditionFn(Protocol):
    """The type of ``should_transform_fn``: ``(step, **extra_args) -> bool``.

    ``step`` counts the previous ``update`` calls (an int32 scalar, traced
    under ``jit``); the extra arguments of ``update`` are passed only with
    ``forward_extra_args=True``. It returns a scalar bool (array).

    >>> import jax.numpy as jnp
    >>> every_other: ConditionFn = lambda step, **extra: step % 2 == 0
    >>> bool(every_other(jnp.asarray(4)))
    True
    """

    def __call__(self, step: Array, **extra_args: Any) -> Array:
        """Whether the inner transformation runs at ``step``.

        Args:
          step: the number of previous ``update`` calls (int32 scalar).
          **extra_args: ``update``'s extra keyword arguments, if forwarded.

        Returns:
          A scalar bool (array).
        """


class ConditionallyTransformState(NamedTuple):
    """State of :func:`conditionally_transform`.

    Attributes:
      inner_state: the wrapped transformation's state (unchanged at the steps
        where it does not run).
      step: the number of ``update`` calls so far (int32).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.conditionally_transform(functrain.sgd(0.1), lambda s: s > 0)
    >>> tx.init([jnp.ones(1)]).step
    Array(0, dtype=int32)
    """

    inner_state: Any
    step: Array


class ConditionallyMaskState(NamedTuple):
    """State of :func:`conditionally_mask` (optax's field order: ``step`` first).

    Attributes:
      step: the number of ``update`` calls so far (int32).
      inner_state: the wrapped transformation's state (unchanged at the steps
        where it does not run).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.conditionally_mask(functrain.sgd(0.1), lambda s: s > 0)
    >>> tx.init([jnp.ones(1)]).step
    Array(0, dtype=int32)
    """

    step: Array
    inner_state: Any


def _check_condition_args(owner: str, inner: Any, should_transform_fn: Any) -> None:
    check_transformation(inner, owner)
    if not callable(should_transform_fn):
        raise TypeError(f"{owner}: should_transform_fn must be a function of the step "
                        f"count returning a bool, got {type(should_transform_fn).__name__}.")


def _condition(owner: str, should_transform_fn: Callable, step: Array,
               forward_extra_args: bool, extra_args: dict) -> Array:
    run = jnp.asarray(should_transform_fn(step, **(extra_args if forward_extra_args else {})))
    if run.shape != () or not (run.dtype == jnp.bool_ or jnp.issubdtype(run.dtype, jnp.integer)):
        raise ValueError(f"{owner}: should_transform_fn must return a scalar bool, got "
                         f"dtype {run.dtype} and shape {run.shape}.")
    return run.astype(jnp.bool_)


def _run_or(run: Array, inner: Any, updates: Updates, inner_state: OptState,
            params: Optional[Params], extra_args: dict,
            otherwise: Callable[[Updates], Updates]) -> tuple[Updates, OptState]:
    """``inner.update`` where ``run``, else ``(otherwise(updates), inner_state)``.

    Both branches of the ``lax.cond`` are cast to the inner update's output
    types, so a weakly typed or narrower value on one side cannot break it.
    """
    def step() -> tuple[Updates, OptState]:
        return call_update(inner, updates, inner_state, params, extra_args)

    shapes = jax.eval_shape(step)

    def like(tree: PyTree, reference: PyTree) -> PyTree:
        return jax.tree_util.tree_map(lambda x, s: jnp.asarray(x).astype(s.dtype), tree,
                                      reference)

    def do() -> tuple[Updates, OptState]:
        new_updates, new_state = step()
        return like(new_updates, shapes[0]), like(new_state, shapes[1])

    def skip() -> tuple[Updates, OptState]:
        return like(otherwise(updates), shapes[0]), like(inner_state, shapes[1])

    return jax.lax.cond(run, do, skip)


def conditionally_transform(inner: GradientTransformation, should_transform_fn: ConditionFn,
                            forward_extra_args: bool = False) -> GradientTransformation:
    """Run ``inner`` only at the steps ``should_transform_fn`` picks; elsewhere pass through.

    At the steps where ``should_transform_fn(step)`` is False the updates are
    returned unchanged and ``inner`` 's state is left as it is
    (:func:`conditionally_mask` returns zeros instead).

    Args:
      inner: the transformation to run (functrain's, optax's, or any object
        with ``init`` and ``update``).
      should_transform_fn: ``fn(step, **extra_args) -> bool`` (see
        :class:`ConditionFn`), ``step`` the number of previous ``update`` calls.
      forward_extra_args: also pass ``update`` 's extra keyword arguments
        (e.g. ``value``) to ``should_transform_fn``.

    Returns:
      A ``GradientTransformation`` whose state is
      :class:`ConditionallyTransformState` ``(inner_state, step)``.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.conditionally_transform(functrain.scale(10.0), lambda s: s % 2 == 1)
    >>> state = tx.init([jnp.zeros(1)])
    >>> u, state = tx.update([jnp.ones(1)], state)
    >>> u
    [Array([1.], dtype=float32)]
    >>> tx.update([jnp.ones(1)], state)[0]
    [Array([10.], dtype=float32)]
    """
    _check_condition_args("conditionally_transform", inner, should_transform_fn)

    def init_fn(params: Params) -> ConditionallyTransformState:
        return ConditionallyTransformState(inner_state=inner.init(params),
                                           step=jnp.zeros([], jnp.int32))

    def update_fn(updates: Updates, state: ConditionallyTransformState,
                  params: Optional[Params] = None, **extra_args: Any
                  ) -> tuple[Updates, ConditionallyTransformState]:
        check_state_type(state, ConditionallyTransformState, "conditionally_transform")
        run = _condition("conditionally_transform", should_transform_fn, state.step,
                         forward_extra_args, extra_args)
        new_updates, inner_state = _run_or(run, inner, updates, state.inner_state, params,
                                           extra_args, lambda u: u)
        return new_updates, ConditionallyTransformState(inner_state,
                                                        safe_increment(state.step))

    return GradientTransformation(init_fn, update_fn)


def conditionally_mask(inner: GradientTransformation, should_transform_fn: ConditionFn,
                       forward_extra_args: bool = False) -> GradientTransformation:
    """Run ``inner`` only at the steps ``should_transform_fn`` picks; elsewhere zero updates.

    At the steps where ``should_transform_fn(step)`` is False the updates are
    zeros and ``inner`` 's state is left as it is (:func:`conditionally_transform`
    passes the updates through instead).

    Args:
      inner: the transformation to run (functrain's, optax's, or any object
        with ``init`` and ``update``).
      should_transform_fn: ``fn(step, **extra_args) -> bool`` (see
        :class:`ConditionFn`), ``step`` the number of previous ``update`` calls.
      forward_extra_args: also pass ``update`` 's extra keyword arguments
        (e.g. ``value``) to ``should_transform_fn``.

    Returns:
      A ``GradientTransformation`` whose state is
      :class:`ConditionallyMaskState` ``(step, inner_state)``.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.conditionally_mask(functrain.sgd(1.0), lambda s: s >= 1)
    >>> state = tx.init([jnp.zeros(1)])
    >>> u, state = tx.update([jnp.ones(1)], state)
    >>> u
    [Array([0.], dtype=float32)]
    >>> tx.update([jnp.ones(1)], state)[0]
    [Array([-1.], dtype=float32)]
    """
    _check_condition_args("conditionally_mask", inner, should_transform_fn)

    def init_fn(params: Params) -> ConditionallyMaskState:
        return ConditionallyMaskState(step=jnp.zeros([], jnp.int32),
                                      inner_state=inner.init(params))

    def update_fn(updates: Updates, state: ConditionallyMaskState,
                  params: Optional[Params] = None, **extra_args: Any
                  ) -> tuple[Updates, ConditionallyMaskState]:
        check_state_type(state, ConditionallyMaskState, "conditionally_mask")
        run = _condition("conditionally_mask", should_transform_fn, state.step,
                         forward_extra_args, extra_args)
        new_updates, inner_state = _run_or(run, inner, updates, state.inner_state, params,
                                           extra_args, ft.zeros_like)
        return new_updates, ConditionallyMaskState(safe_increment(state.step), inner_state)

    return GradientTransformation(init_fn, update_fn)


# --------------------------------------------------------------------------
# flatten
# --------------------------------------------------------------------------

def _flat(tree: PyTree) -> Array:
    """Every leaf of ``tree`` raveled and concatenated (dtypes promoted together)."""
    leaves = [jnp.ravel(jnp.asarray(x)) for x in jax.tree_util.tree_leaves(tree)]
    if not leaves:
        return jnp.zeros((0,), jnp.float32)
    return jnp.concatenate(leaves)


def _unflat(like: PyTree, flat: Array) -> PyTree:
    """``flat`` cut back into ``like`` 's leaves, each in its own shape and dtype."""
    leaves, treedef = jax.tree_util.tree_flatten(like)
    out, start = [], 0
    for x in leaves:
        x = jnp.asarray(x)
        size = int(np.prod(x.shape))
        piece = flat[start:start + size].reshape(x.shape)
        if jnp.iscomplexobj(piece) and not jnp.iscomplexobj(x):
            piece = jnp.real(piece)  # a real leaf of a mixed tree: its imaginary part is 0
        out.append(piece.astype(x.dtype))
        start += size
    return treedef.unflatten(out)


def flatten(inner: GradientTransformation) -> GradientTransformation:
    """Run ``inner`` on one flat vector of all the leaves, then cut its output back.

    The leaves are raveled and concatenated (in ``tree_leaves`` order) for both
    ``init`` and ``update``, so ``inner`` sees a single array: fewer, larger
    operations on trees of many small leaves, at the cost of a copy. Each
    output leaf gets its update's shape and dtype back (optax leaves the
    promoted dtype of a mixed-dtype tree).

    Args:
      inner: the transformation to run on the flat vector (functrain's,
        optax's, or any object with ``init`` and ``update``).

    Returns:
      A ``GradientTransformation`` whose state is ``inner`` 's state for the
      flat vector.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.flatten(functrain.clip_by_block_rms(1.0))
    >>> params = {'a': jnp.zeros(2), 'b': jnp.zeros(())}
    >>> u, _ = tx.update({'a': jnp.array([3., 0.]), 'b': jnp.array(0.)}, tx.init(params))
    >>> [round(float(v), 5) for v in u['a']]
    [1.73205, 0.0]
    """
    check_transformation(inner, "flatten")

    def init_fn(params: Params) -> OptState:
        return inner.init(_flat(params))

    def update_fn(updates: Updates, state: OptState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, OptState]:
        flat_params = None
        if params is not None:
            ft.check_structure(updates, params, "params", "updates")
            flat_params = _flat(params)
        flat_updates, new_state = call_update(inner, _flat(updates), state, flat_params,
                                              extra_args)
        return _unflat(updates, flat_updates), new_state

    return GradientTransformation(init_fn, update_fn)
