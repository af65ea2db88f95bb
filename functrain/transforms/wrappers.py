"""Wrappers: transformations of whole optimizers (masking, partitioning, accumulation, ...).

A wrapper takes one or more ``GradientTransformation`` s (functrain's or
optax's) and changes *where* or *when* they apply: ``masked`` and
``multi_transform`` restrict them to some leaves, ``MultiSteps`` accumulates
micro-batches, ``apply_if_finite`` skips bad steps, ``inject_hyperparams`` moves
the numeric arguments into the state. These are not per-leaf math, so most are
plain transformations; the few that are naturally per leaf (``set_to_zero``,
``freeze``, ``zero_nans``, ``keep_params_nonnegative``, ``ema``) are engine
stages, and ``chain`` fuses them with their neighbours.

Masking a single stage (``masked(add_decayed_weights(...), mask)``) uses the
engine's own per-stage mask, so the result stays a fusable stage whose state is
the stage's own; masking anything else (a chain, an optax transform, another
wrapper) hands the inner transformation trees whose masked-out leaves are
:class:`functrain.tree.MaskedNode` placeholders (no state, no buffers), as
optax does, and keeps its state in :class:`MaskedState`.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Hashable, Iterable, Mapping, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from functrain import tree as ft
from functrain.transforms.base import (EmptyState, GradientTransformation, LeafStage,
                                       _call_update, _plan_of, chain, check_range,
                                       safe_increment, stage_transform, zero_count)

Array = jax.Array
PyTree = Any
Params = Any
Updates = Any
OptState = Any
MaskOrFn = Any


def _placeholder(x: Any) -> bool:
    return x is None or isinstance(x, ft.MaskedNode)


def _check_tx(tx: Any, wrapper: str, what: str = "inner") -> None:
    if not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
        raise TypeError(f"{wrapper}: {what} is a {type(tx).__name__}, not a "
                        f"GradientTransformation (an object with init and update).")


def _check_state(state: Any, cls: type, wrapper: str) -> None:
    if not isinstance(state, cls):
        raise TypeError(f"{wrapper} expected its state as {cls.__name__}, got "
                        f"{type(state).__name__}: was the state made by this wrapper's init?")


def _leaf_flags(mask: Any, tree: PyTree, wrapper: str) -> list[bool]:
    """Per-leaf bools of ``mask`` for the array leaves of ``tree`` (placeholders dropped)."""
    flags = ft.resolve_mask(mask, tree, wrapper)
    slots = jax.tree_util.tree_leaves(tree, is_leaf=_placeholder)
    if len(flags) == len(slots):
        flags = [f for f, x in zip(flags, slots) if not _placeholder(x)]
    return flags


def _mask_tree(tree: PyTree, flags: list[bool]) -> PyTree:
    """``tree`` with the leaves where ``flags`` is False replaced by ``MaskedNode``."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef.unflatten([x if on else ft.MaskedNode() for x, on in zip(leaves, flags)])


def _merge(new_masked: PyTree, old: PyTree, flags: list[bool]) -> PyTree:
    """Leaves of ``new_masked`` where ``flags`` is True, of ``old`` elsewhere."""
    old_leaves, treedef = jax.tree_util.tree_flatten(old)
    new_leaves = treedef.flatten_up_to(new_masked)
    return treedef.unflatten([n if on else o for n, o, on in zip(new_leaves, old_leaves, flags)])


# --------------------------------------------------------------------------
# masked, multi_transform / partition
# --------------------------------------------------------------------------

class MaskedState(NamedTuple):
    """State of :func:`masked` around a non-stage transformation.

    >>> MaskedState(inner_state=())
    MaskedState(inner_state=())
    """

    inner_state: Any


def _stage_mask(outer: MaskOrFn, inner: MaskOrFn, wrapper: str) -> Callable[[PyTree], PyTree]:
    """A mask function: ``outer`` and ``inner`` resolved on the same tree, AND-ed."""
    def mask_fn(tree: PyTree) -> PyTree:
        flags = ft.resolve_mask(outer, tree, wrapper)
        if inner is not None:
            flags = [a and b for a, b in zip(flags, ft.resolve_mask(inner, tree, wrapper))]
        return jax.tree_util.tree_structure(tree, is_leaf=_placeholder).unflatten(flags)
    return mask_fn


def masked(inner: GradientTransformation, mask: MaskOrFn, *,
           mask_compatible_extra_args: bool = False) -> GradientTransformation:
    """Apply ``inner`` only where ``mask`` is True; other leaves pass through unchanged.

    ``mask`` is a tree of bools shaped like the params, a prefix of it (one
    bool for a whole subtree), or a function of the params returning one.
    Masked-out leaves hold no state in ``inner``. A mask that does not fit
    the params raises a ``ValueError`` naming the key paths and the wrapper.
    With ``mask_compatible_extra_args``, extra arguments shaped like the
    updates are masked too (as optax).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.masked(functrain.add_decayed_weights(0.5), {'w': True, 'b': False})
    >>> params = {'w': jnp.array([2.]), 'b': jnp.array([2.])}
    >>> tx.update({'w': jnp.zeros(1), 'b': jnp.zeros(1)}, tx.init(params), params)[0]
    {'b': Array([0.], dtype=float32), 'w': Array([1.], dtype=float32)}
    """
    _check_tx(inner, "masked")
    plan = _plan_of(inner)
    if (len(plan) == 1 and plan[0][0] == () and isinstance(plan[0][1], LeafStage)
            and not plan[0][1].needs_updates):
        # One per-leaf stage: let the engine mask it (stays fusable in a chain).
        stage = plan[0][1]
        return stage_transform(dataclasses.replace(
            stage, mask=_stage_mask(mask, stage.mask, f"masked({stage.name})")))

    def init_fn(params: Params) -> MaskedState:
        flags = _leaf_flags(mask, params, "masked")
        return MaskedState(inner.init(_mask_tree(params, flags)))

    def update_fn(updates: Updates, state: MaskedState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, MaskedState]:
        _check_state(state, MaskedState, "masked")
        if params is not None:
            ft.check_structure(updates, params, "params", "updates")
        flags = _leaf_flags(mask, params if params is not None else updates, "masked")
        if mask_compatible_extra_args:
            structure = jax.tree_util.tree_structure(updates)
            extra_args = {k: _mask_tree(v, flags)
                          if jax.tree_util.tree_structure(v) == structure else v
                          for k, v in extra_args.items()}
        new, inner_state = _call_update(
            inner, _mask_tree(updates, flags), state.inner_state,
            None if params is None else _mask_tree(params, flags), extra_args)
        return _merge(new, updates, flags), MaskedState(inner_state)

    return GradientTransformation(init_fn, update_fn)


class PartitionState(NamedTuple):
    """State of :func:`multi_transform`: each label's (masked) inner state.

    >>> PartitionState(inner_states={'adam': ()})
    PartitionState(inner_states={'adam': ()})
    """

    inner_states: Mapping[Hashable, Any]


MultiTransformState = PartitionState


def _leaf_labels(param_labels: Any, tree: PyTree, wrapper: str) -> list[Any]:
    """One label per leaf slot of ``tree`` (placeholders included)."""
    labels = param_labels(tree) if callable(param_labels) else param_labels
    label_def = jax.tree_util.tree_structure(labels)
    try:
        subtrees = label_def.flatten_up_to(tree)
    except (ValueError, TypeError):
        ft.check_structure(labels, tree, "params", f"the param_labels of {wrapper}",
                           prefix=True)
        raise ValueError(f"the param_labels of {wrapper} do not fit the params tree "
                         f"(labels: {label_def}; params: "
                         f"{jax.tree_util.tree_structure(tree)}).") from None
    out = []
    for label, sub in zip(jax.tree_util.tree_leaves(labels), subtrees):
        out.extend([label] * len(jax.tree_util.tree_leaves(sub, is_leaf=_placeholder)))
    return out


def multi_transform(transforms: Mapping[Hashable, GradientTransformation],
                    param_labels: Any, *, mask_compatible_extra_args: bool = False
                    ) -> GradientTransformation:
    """A different transformation per group of leaves (``partition`` is the same function).

    ``param_labels`` is a tree of labels shaped like the params (or a prefix,
    or a function of the params); leaves labelled ``k`` are updated by
    ``transforms[k]`` alone, which holds state for those leaves only. A label
    without a transformation, or a transformation whose label no leaf has,
    is a ``ValueError`` listing the labels on both sides (an empty params tree
    uses none, and is allowed).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.multi_transform({'fast': functrain.sgd(1.0), 'slow': functrain.sgd(0.1)},
    ...                                {'a': 'fast', 'b': 'slow'})
    >>> params = {'a': jnp.ones(1), 'b': jnp.ones(1)}
    >>> tx.update({'a': jnp.ones(1), 'b': jnp.ones(1)}, tx.init(params))[0]
    {'a': Array([-1.], dtype=float32), 'b': Array([-0.1], dtype=float32)}
    """
    if not isinstance(transforms, Mapping):
        raise TypeError(f"multi_transform: transforms must be a mapping from label to "
                        f"GradientTransformation, got {type(transforms).__name__}.")
    for label, tx in transforms.items():
        _check_tx(tx, "multi_transform", f"transforms[{label!r}]")

    def labels_of(tree: PyTree) -> list[Any]:
        labels = _leaf_labels(param_labels, tree, "multi_transform")
        used = set(labels)
        missing = used - set(transforms)
        unused = set(transforms) - used if labels else set()
        if missing or unused:
            what = (f"labels {_sorted(missing)} have no transformation" if missing else
                    f"transformations {_sorted(unused)} are used by no leaf")
            raise ValueError(f"multi_transform: {what}. Labels in param_labels: "
                             f"{_sorted(used)}; labels in transforms: {_sorted(transforms)}.")
        return labels

    def group_mask(label: Hashable) -> Callable[[PyTree], PyTree]:
        def mask_fn(tree: PyTree) -> PyTree:
            flags = [lab == label for lab in labels_of(tree)]
            return jax.tree_util.tree_structure(tree, is_leaf=_placeholder).unflatten(flags)
        return mask_fn

    groups = {label: masked(tx, group_mask(label),
                            mask_compatible_extra_args=mask_compatible_extra_args)
              for label, tx in transforms.items()}

    def init_fn(params: Params) -> PartitionState:
        labels_of(params)
        return PartitionState({label: tx.init(params) for label, tx in groups.items()})

    def update_fn(updates: Updates, state: PartitionState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, PartitionState]:
        _check_state(state, PartitionState, "multi_transform")
        labels_of(params if params is not None else updates)
        if set(state.inner_states) != set(groups):
            raise ValueError(f"multi_transform: the state holds labels "
                             f"{_sorted(state.inner_states)} but the transforms are "
                             f"{_sorted(groups)}: was it made by this wrapper's init?")
        new_states = {}
        for label, tx in groups.items():
            updates, new_states[label] = tx.update(updates, state.inner_states[label], params,
                                                   **extra_args)
        return updates, PartitionState(new_states)

    return GradientTransformation(init_fn, update_fn)


partition = multi_transform


def _sorted(labels: Iterable[Any]) -> list[Any]:
    return sorted(labels, key=repr)


# --------------------------------------------------------------------------
# MultiSteps: gradient accumulation
# --------------------------------------------------------------------------

class MultiStepsState(NamedTuple):
    """State of :class:`MultiSteps`.

    ``mini_step`` counts micro-batches since the last real update,
    ``gradient_step`` counts real updates, ``acc_grads`` holds the running
    mean (or sum) of the micro-batch gradients, ``skip_state`` what
    ``should_skip_update_fn`` returned last.

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
    never happened. The accumulator is stored in ``accumulator_dtype``; the
    wrapped optimizer gets it cast back to the incoming gradients' dtype, so
    bfloat16 params with float32 gradients work (an optax bug). Works under
    ``jax.jit``, ``jax.lax.scan`` and sharded jit; the inner optimizer runs
    only on real-update steps (a ``lax.cond``).

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
        _check_tx(opt, "MultiSteps", "opt")
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

    @property
    def inner_opt(self) -> GradientTransformation:
        """The wrapped optimizer.

        >>> import functrain
        >>> opt = functrain.sgd(0.1)
        >>> functrain.MultiSteps(opt, 2).inner_opt is opt
        True
        """
        return self._opt

    def _acc(self, x: Array) -> Any:
        if self._accumulator_dtype is None:
            return x.dtype
        return self._accumulator_dtype

    def init(self, params: Params) -> MultiStepsState:
        """The initial state: zero accumulator, counters at zero.

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

        >>> import jax.numpy as jnp, functrain
        >>> opt = functrain.MultiSteps(functrain.sgd(1.0), 1)
        >>> opt.update([jnp.array([2.])], opt.init([jnp.zeros(1)]))[0]
        [Array([-2.], dtype=float32)]
        """
        _check_state(state, MultiStepsState, "MultiSteps")
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
            return _call_update(self._opt, inner_in, state.inner_opt_state, params, extra_args)

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

        >>> import jax.numpy as jnp, functrain
        >>> opt = functrain.MultiSteps(functrain.sgd(0.1), 2)
        >>> bool(opt.has_updated(opt.init([jnp.ones(1)])))
        False
        """
        return jnp.logical_and(state.mini_step == 0, state.gradient_step > 0)

    def gradient_transformation(self) -> GradientTransformation:
        """This wrapper as a plain ``GradientTransformation`` (for ``chain`` etc.).

        >>> import functrain
        >>> tx = functrain.MultiSteps(functrain.sgd(0.1), 2).gradient_transformation()
        >>> isinstance(tx, functrain.GradientTransformation)
        True
        """
        return GradientTransformation(self.init, self.update)


# --------------------------------------------------------------------------
# apply_if_finite
# --------------------------------------------------------------------------

class ApplyIfFiniteState(NamedTuple):
    """State of :func:`apply_if_finite`.

    ``notfinite_count``: consecutive non-finite steps so far (reset to 0 by a
    finite step and by a forced update); ``last_finite``: whether the last
    step was finite; ``total_notfinite``: all non-finite steps seen.

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

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.apply_if_finite(functrain.sgd(1.0), max_consecutive_errors=2)
    >>> state = tx.init([jnp.zeros(1)])
    >>> u, state = tx.update([jnp.array([jnp.nan])], state)
    >>> u, int(state.notfinite_count)
    ([Array([0.], dtype=float32)], 1)
    """
    _check_tx(inner, "apply_if_finite")
    check_range("max_consecutive_errors", max_consecutive_errors, 0.0,
                owner="apply_if_finite")

    def init_fn(params: Params) -> ApplyIfFiniteState:
        return ApplyIfFiniteState(jnp.zeros([], jnp.int32), jnp.array(True),
                                  jnp.zeros([], jnp.int32), inner.init(params))

    def update_fn(updates: Updates, state: ApplyIfFiniteState,
                  params: Optional[Params] = None, **extra_args: Any
                  ) -> tuple[Updates, ApplyIfFiniteState]:
        _check_state(state, ApplyIfFiniteState, "apply_if_finite")
        finite = jnp.array(True)
        for x in jax.tree_util.tree_leaves(updates):
            finite = jnp.logical_and(finite, jnp.all(jnp.isfinite(x)))
        count = jnp.where(finite, 0, safe_increment(state.notfinite_count))
        forced = count > max_consecutive_errors
        apply = jnp.logical_or(finite, forced)

        def step() -> tuple[Updates, Any]:
            return _call_update(inner, updates, state.inner_state, params, extra_args)

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
# inject_hyperparams
# --------------------------------------------------------------------------

class InjectHyperparamsState(NamedTuple):
    """State of :func:`inject_hyperparams`.

    ``hyperparams`` maps each numeric argument's name to its current value
    (an array); assign to it between steps (``state.hyperparams['learning_rate']
    = 0.01``) to change it without recompiling. Schedules are re-evaluated
    at ``count`` every step.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.inject_hyperparams(functrain.sgd)(learning_rate=0.1)
    >>> opt.init([jnp.ones(1)]).hyperparams
    {'learning_rate': Array(0.1, dtype=float32, weak_type=True)}
    """

    count: Array
    hyperparams: dict[str, Any]
    inner_state: Any


def _is_static(name: str, value: Any, static: set, declared: Iterable[str]) -> bool:
    if name in static or name in declared:
        return True
    if value is None or isinstance(value, (bool, np.bool_, str, type, np.dtype)):
        return True
    # Masks and dtypes are never hyperparameters (optax would take a mask
    # function or ``jnp.bfloat16`` for a schedule).
    return "mask" in name or "dtype" in name


def _to_dtype(value: Any, dtype: Any) -> Any:
    """Floats as arrays of ``dtype``; Python floats stay weakly typed when possible."""
    if isinstance(value, jax.Array) and not getattr(value, "weak_type", False):
        return value
    if isinstance(value, jax.core.Tracer) and not jax.typeof(value).weak_type:
        return value
    current = getattr(value, "dtype", None)
    if current is None:
        current = np.asarray(value).dtype
    if not jnp.issubdtype(current, jnp.floating):
        return jnp.asarray(value)
    weak = jnp.asarray(value)
    if weak.dtype == jnp.dtype(dtype) and getattr(weak, "weak_type", False):
        return weak
    return jnp.asarray(value, dtype)


def inject_hyperparams(inner_factory: Callable[..., GradientTransformation],
                       static_args: Union[str, Iterable[str]] = (),
                       hyperparam_dtype: Optional[Any] = None
                       ) -> Callable[..., GradientTransformation]:
    """Make an optimizer's numeric arguments part of its state.

    ``inject_hyperparams(factory)(*args, **kwargs)`` behaves like
    ``factory(*args, **kwargs)``, but every numeric argument lives in
    ``state.hyperparams`` (a dict) and may be changed between steps without
    recompiling a jitted step; arguments given as functions (schedules) are
    evaluated at the step count, and their current value is shown in
    ``hyperparams``. ``static_args`` names arguments to keep as Python values;
    booleans, strings, ``None``, masks and dtypes are always static, as are
    the names a factory lists in its ``static_hyperparams`` attribute (e.g.
    adafactor's ``min_dim_size_to_factor``). Floats are stored in
    ``hyperparam_dtype``, by default the widest floating dtype of the params
    and at least float32 (optax uses the params' dtype, so bfloat16 params
    would round the learning rate).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.inject_hyperparams(functrain.sgd)(learning_rate=0.1)
    >>> params = [jnp.ones(1)]
    >>> state = opt.init(params)
    >>> state.hyperparams['learning_rate'] = 0.01
    >>> opt.update([jnp.ones(1)], state)[0]
    [Array([-0.01], dtype=float32)]
    """
    static = {static_args} if isinstance(static_args, str) else set(static_args)
    signature = inspect.signature(inner_factory)
    if not static.issubset(signature.parameters):
        raise ValueError(f"inject_hyperparams: static_args {_sorted(static)} must name "
                         f"parameters of {getattr(inner_factory, '__name__', 'the factory')}, "
                         f"whose parameters are {list(signature.parameters)}.")
    declared = tuple(getattr(inner_factory, "static_hyperparams", ()))

    def wrapped(*args: Any, **kwargs: Any) -> GradientTransformation:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            kind = signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(value)
            elif kind is inspect.Parameter.VAR_POSITIONAL:
                if value:
                    raise TypeError("inject_hyperparams: factories taking *args are not "
                                    "supported; pass those arguments by name.")
            else:
                arguments[name] = value
        other, numeric, schedules = {}, {}, {}
        for name, value in arguments.items():
            if _is_static(name, value, static, declared):
                other[name] = value
            elif callable(value):
                schedules[name] = value
            elif isinstance(value, (int, float, np.number, np.ndarray, jax.Array)):
                numeric[name] = value
            else:
                other[name] = value

        def dtype_of(tree: PyTree) -> Any:
            if hyperparam_dtype is not None:
                return hyperparam_dtype
            dtype = jnp.dtype(jnp.float32)
            for x in jax.tree_util.tree_leaves(tree):
                d = getattr(x, "dtype", None)
                if d is not None and jnp.issubdtype(d, jnp.floating):
                    dtype = jnp.promote_types(dtype, ft.compute_dtype(d))
            return dtype

        def current(values: dict, count: Array, dtype: Any) -> dict:
            out = {k: _to_dtype(v, dtype) for k, v in values.items()}
            out.update({k: _to_dtype(f(count), dtype) for k, f in schedules.items()})
            return out

        def init_fn(params: Params) -> InjectHyperparamsState:
            count = jnp.zeros([], jnp.int32)
            hparams = current(numeric, count, dtype_of(params))
            return InjectHyperparamsState(count, hparams,
                                          inner_factory(**other, **hparams).init(params))

        def update_fn(updates: Updates, state: InjectHyperparamsState,
                      params: Optional[Params] = None, **extra_args: Any
                      ) -> tuple[Updates, InjectHyperparamsState]:
            _check_state(state, InjectHyperparamsState, "inject_hyperparams")
            unknown = set(state.hyperparams) - set(numeric) - set(schedules)
            if unknown:
                raise ValueError(f"inject_hyperparams: state.hyperparams has unknown keys "
                                 f"{_sorted(unknown)}; the injected hyperparameters are "
                                 f"{_sorted(set(numeric) | set(schedules))}.")
            values = {k: state.hyperparams.get(k, v) for k, v in numeric.items()}
            hparams = current(values, state.count,
                              dtype_of(params if params is not None else updates))
            new_updates, inner_state = _call_update(
                inner_factory(**other, **hparams), updates, state.inner_state, params,
                extra_args)
            return new_updates, InjectHyperparamsState(safe_increment(state.count), hparams,
                                                       inner_state)

        return GradientTransformation(init_fn, update_fn)

    wrapped.__name__ = getattr(inner_factory, "__name__", "wrapped")
    wrapped.__doc__ = getattr(inner_factory, "__doc__", None)
    return wrapped


# --------------------------------------------------------------------------
# named_chain
# --------------------------------------------------------------------------

def named_chain(*transforms: tuple[str, GradientTransformation]) -> GradientTransformation:
    """``chain`` whose state is a dict keyed by the given names.

    The stages inside are fused exactly as in :func:`functrain.chain`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.named_chain(('clip', functrain.clip(1.0)), ('lr', functrain.scale(-0.1)))
    >>> state = tx.init([jnp.zeros(1)])
    >>> sorted(state)
    ['clip', 'lr']
    >>> tx.update([jnp.array([5.])], state)[0]
    [Array([-0.1], dtype=float32)]
    """
    names = []
    for i, item in enumerate(transforms):
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError(f"named_chain argument {i} must be a (name, transformation) "
                            f"pair, got {type(item).__name__}.")
        _check_tx(item[1], "named_chain", f"the transformation named {item[0]!r}")
        names.append(item[0])
    if len(set(names)) != len(names):
        raise ValueError(f"named_chain: names must be unique, got {names}.")
    inner = chain(*(tx for _, tx in transforms))

    def init_fn(params: Params) -> dict:
        return dict(zip(names, inner.init(params)))

    def update_fn(updates: Updates, state: dict, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, dict]:
        if not isinstance(state, Mapping) or set(state) != set(names):
            got = _sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"named_chain expected a state dict with keys {names}, got "
                             f"{got}: was it made by this named_chain's init?")
        new_updates, new = inner.update(updates, tuple(state[n] for n in names), params,
                                        **extra_args)
        return new_updates, dict(zip(names, new))

    return GradientTransformation(init_fn, update_fn)


# --------------------------------------------------------------------------
# Per-leaf wrappers (engine stages)
# --------------------------------------------------------------------------

SetToZeroState = EmptyState
NonNegativeParamsState = EmptyState


def set_to_zero() -> GradientTransformation:
    """Replace every update by zeros (keeps no state).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.set_to_zero()
    >>> tx.update([jnp.array([3.])], tx.init([jnp.zeros(1)]))[0]
    [Array([0.], dtype=float32)]
    """
    return stage_transform(LeafStage("set_to_zero", lambda g, s, p, c: (jnp.zeros_like(g), ())))


def freeze(mask: MaskOrFn) -> GradientTransformation:
    """Zero the updates of the leaves where ``mask`` is True (frozen: no state, no update).

    Other leaves pass through; chain it with an optimizer masked the other way
    (or use ``multi_transform``) so frozen leaves also hold no optimizer state.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.freeze({'emb': True, 'head': False})
    >>> params = {'emb': jnp.ones(1), 'head': jnp.ones(1)}
    >>> tx.update({'emb': jnp.ones(1), 'head': jnp.ones(1)}, tx.init(params))[0]
    {'emb': Array([0.], dtype=float32), 'head': Array([1.], dtype=float32)}
    """
    return stage_transform(LeafStage(
        "freeze", lambda g, s, p, c: (jnp.zeros_like(g), ()),
        mask=_stage_mask(mask, None, "freeze")))


class ZeroNansState(NamedTuple):
    """State of :func:`zero_nans`: per leaf, whether the last update held a NaN.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.zero_nans().init({'w': jnp.ones(2)})
    ZeroNansState(found_nan={'w': Array(False, dtype=bool)})
    """

    found_nan: Any


def zero_nans() -> GradientTransformation:
    """Replace NaNs in the updates by zeros, recording per leaf whether any was found.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.zero_nans()
    >>> u, state = tx.update([jnp.array([1., jnp.nan])], tx.init([jnp.zeros(2)]))
    >>> u, state.found_nan
    ([Array([1., 0.], dtype=float32)], [Array(True, dtype=bool)])
    """
    def leaf(g: Array, s: tuple, p: Any, c: Any) -> tuple:
        nan = jnp.isnan(g)
        return jnp.where(nan, jnp.zeros_like(g), g), (jnp.any(nan),)

    # ``found_nan`` is one bool per leaf, not params-shaped.
    return stage_transform(LeafStage(
        "zero_nans", leaf, ZeroNansState, ("found_nan",),
        lambda p: (jnp.zeros([], jnp.bool_),), shaped_fields=()))


def keep_params_nonnegative() -> GradientTransformation:
    """Shrink updates so no parameter becomes negative (``p + u < 0`` gives ``u = -p``).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.keep_params_nonnegative()
    >>> params = [jnp.array([1., 1.])]
    >>> tx.update([jnp.array([-3., 0.5])], tx.init(params), params)[0]
    [Array([-1. ,  0.5], dtype=float32)]
    """
    return stage_transform(LeafStage(
        "keep_params_nonnegative", lambda g, s, p, c: (jnp.where(p + g < 0, -p, g), ()),
        needs_params=True))


class EmaState(NamedTuple):
    """State of :func:`ema`: the step count and the moving average.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.ema(0.9).init([jnp.ones(1)]).ema
    [Array([0.], dtype=float32)]
    """

    count: Array
    ema: Any


def ema(decay: float, debias: bool = True,
        accumulator_dtype: Optional[Any] = None) -> GradientTransformation:
    """Exponential moving average of the updates: ``m = decay m + (1 - decay) u``.

    The update is ``m``, divided by ``1 - decay**t`` when ``debias``.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.ema(0.5, debias=False)
    >>> u, state = tx.update([jnp.array([2.])], tx.init([jnp.zeros(1)]))
    >>> u
    [Array([1.], dtype=float32)]
    """
    check_range("decay", decay, 0.0, 1.0, high_inclusive=True, owner="ema")

    def prepare(glob: dict, _: Any) -> tuple:
        count = safe_increment(glob["count"])
        return 1 - decay ** count, {"count": count}

    def leaf(g: Array, s: tuple, p: Any, correction: Any) -> tuple:
        m = (1 - decay) * g + decay * s[0]
        return (m / correction if debias else m), (m,)

    return stage_transform(LeafStage(
        "ema", leaf, EmaState, ("ema",), lambda p: (ft.zeros_like(p, accumulator_dtype),),
        zero_count, prepare))


class AddNoiseState(NamedTuple):
    """State of :func:`add_noise`: the step count and the random key.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.add_noise(0.01, 0.55, 0).init([jnp.ones(1)]).count
    Array(0, dtype=int32)
    """

    count: Array
    rng_key: Array


def _as_key(key: Any) -> Array:
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    return jax.random.key(key)


def add_noise(eta: float, gamma: float, key: Any = 0) -> GradientTransformation:
    """Add Gaussian noise of variance ``eta / t**gamma`` at step ``t`` (Neelakantan et al.).

    ``key`` is a ``jax.random.key`` or an int seed; the noise equals optax's
    for the same key. Noise is drawn per leaf, so it is not an engine stage.

    >>> import jax, jax.numpy as jnp, functrain
    >>> tx = functrain.add_noise(eta=0.0, gamma=0.55, key=jax.random.key(0))
    >>> tx.update([jnp.array([1.])], tx.init([jnp.zeros(1)]))[0]
    [Array([1.], dtype=float32)]
    """
    check_range("eta", eta, 0.0, owner="add_noise")

    def init_fn(params: Params) -> AddNoiseState:
        return AddNoiseState(jnp.zeros([], jnp.int32), _as_key(key))

    def update_fn(updates: Updates, state: AddNoiseState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, AddNoiseState]:
        _check_state(state, AddNoiseState, "add_noise")
        count = safe_increment(state.count)
        std = jnp.sqrt(eta / count ** gamma)
        rng_key, sample_key = jax.random.split(state.rng_key)
        leaves, treedef = jax.tree_util.tree_flatten(updates)
        keys = jax.random.split(sample_key, len(leaves)) if leaves else []
        noisy = []
        for x, k in zip(leaves, keys):
            noise = jax.random.normal(k, x.shape, x.dtype)
            cd = ft.compute_dtype(x.dtype)
            noisy.append((x.astype(cd) + std.astype(cd) * noise.astype(cd)).astype(x.dtype))
        return treedef.unflatten(noisy), AddNoiseState(count, rng_key)

    return GradientTransformation(init_fn, update_fn)
