"""Hyperparameters in the state: ``inject_hyperparams``, ``inject_stateful_hyperparams``.

The wrapped optimizer is rebuilt inside ``update`` from hyperparameters held
in the state, so a learning rate (or any numeric argument) can change between
steps without recompiling, and schedules are evaluated at the step count.
``inject_stateful_hyperparams`` also takes optax's stateful schedules
(:class:`StatefulSchedule`, e.g. :class:`WrappedSchedule`), whose state lives
in the optimizer's state.
"""

from __future__ import annotations

import inspect
from typing import (Any, Callable, Iterable, NamedTuple, Optional, Protocol, Union,
                    runtime_checkable)

import jax
import jax.numpy as jnp
import numpy as np

from functrain.arg_checks import check_state_type, sorted_labels
from functrain import tree as ft
from functrain.engine.protocol import (GradientTransformation, Params, Updates, call_update,
                                       safe_increment)

Array = jax.Array
PyTree = Any


class HyperparamsDict(dict):
    """The ``hyperparams`` of :class:`InjectHyperparamsState`: a dict that stores arrays.

    A number assigned to it (a Python float, a NumPy scalar, an array) is
    stored as an array of the same dtype and weak type as the value it
    replaces, so a jitted step sees the same input types whatever is assigned
    and never recompiles (a plain dict holding a Python float would add a
    second entry to ``jit`` 's dispatch cache). It is a pytree like a dict.

    Args:
      *args: as for ``dict``: a mapping or an iterable of ``(key, value)``
        pairs. Values given to the constructor are stored as they are; only
        later assignments are converted.
      **kwargs: further ``key=value`` entries, as for ``dict``.

    >>> import jax.numpy as jnp
    >>> h = HyperparamsDict(learning_rate=jnp.asarray(0.1))
    >>> h['learning_rate'] = 0.01
    >>> h
    {'learning_rate': Array(0.01, dtype=float32, weak_type=True)}
    """

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, _like(value, self.get(key)))

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Assign several values (each converted as by ``d[key] = value``).

        Args:
          *args: a mapping or an iterable of ``(key, value)`` pairs, as for
            ``dict.update``.
          **kwargs: further ``key=value`` assignments.

        Returns:
          ``None``; the dict is changed in place.

        >>> import jax.numpy as jnp
        >>> h = HyperparamsDict(b1=jnp.asarray(0.9))
        >>> h.update(b1=0.5)
        >>> h
        {'b1': Array(0.5, dtype=float32, weak_type=True)}
        """
        for key, value in dict(*args, **kwargs).items():
            self[key] = value


def _like(value: Any, old: Any) -> Any:
    if isinstance(value, jax.core.Tracer) or not hasattr(old, "dtype"):
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, (int, float, np.number, np.ndarray, jax.Array)):
        return value
    if getattr(old, "weak_type", False) and np.ndim(value) == 0:
        python = float(value) if jnp.issubdtype(old.dtype, jnp.floating) else int(value)
        weak = jnp.asarray(python)
        if weak.dtype == old.dtype:
            return weak
    return jnp.asarray(value, old.dtype)


jax.tree_util.register_pytree_with_keys(
    HyperparamsDict,
    lambda d: ([(jax.tree_util.DictKey(k), d[k]) for k in sorted(d)], tuple(sorted(d))),
    lambda keys, values: HyperparamsDict(zip(keys, values)),
    flatten_func=lambda d: ([d[k] for k in sorted(d)], tuple(sorted(d))))


class InjectHyperparamsState(NamedTuple):
    """State of :func:`inject_hyperparams`.

    ``hyperparams`` maps each numeric argument's name to its current value
    (an array, in a :class:`HyperparamsDict`); assign to it between steps
    (``state.hyperparams['learning_rate'] = 0.01``) to change it without
    recompiling. Schedules are re-evaluated at ``count`` every step.

    Attributes:
      count: the number of ``update`` calls so far (int32), at which the
        schedules are evaluated.
      hyperparams: a :class:`HyperparamsDict` from each injected argument's
        name to its current value (for a schedule: the value the last step
        used, or after ``init`` the value at step 0).
      inner_state: the wrapped optimizer's state.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.inject_hyperparams(functrain.sgd)(learning_rate=0.1)
    >>> opt.init([jnp.ones(1)]).hyperparams
    {'learning_rate': Array(0.1, dtype=float32, weak_type=True)}
    """

    count: Array
    hyperparams: HyperparamsDict
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


def _hyperparam_dtype(tree: PyTree, hyperparam_dtype: Optional[Any]) -> Any:
    """``hyperparam_dtype``, or the widest floating dtype of ``tree`` (at least float32)."""
    if hyperparam_dtype is not None:
        return hyperparam_dtype
    dtype = jnp.dtype(jnp.float32)
    for x in jax.tree_util.tree_leaves(tree):
        d = getattr(x, "dtype", None)
        if d is not None and jnp.issubdtype(d, jnp.floating):
            dtype = jnp.promote_types(dtype, ft.compute_dtype(d))
    return dtype


def _bind(signature: inspect.Signature, args: tuple, kwargs: dict, owner: str) -> dict:
    """The factory's arguments by name, defaults filled in (``**kwargs`` spread out)."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    arguments: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                raise TypeError(f"{owner}: factories taking *args are not supported; pass "
                                f"those arguments by name.")
        else:
            arguments[name] = value
    return arguments


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
    would round the learning rate). An argument given as a
    :class:`StatefulSchedule` (as optax allows) makes this
    :func:`inject_stateful_hyperparams`, whose state keeps the schedule's.

    Args:
      inner_factory: a function building a ``GradientTransformation`` from
        arguments that can be passed by name, e.g. ``functrain.adam`` or
        ``optax.adam`` (factories taking ``*args`` are not supported).
      static_args: the name (or names) of arguments to keep as Python values,
        never injected (e.g. an int that decides state shapes); each must be
        a parameter of ``inner_factory`` (else ``ValueError``).
      hyperparam_dtype: the dtype floating hyperparameters are stored in;
        ``None`` (the default): the widest floating dtype of the params, at
        least float32.

    Returns:
      A function with ``inner_factory``'s arguments (and docstring) that
      returns a ``GradientTransformation`` whose state is
      ``InjectHyperparamsState(count, hyperparams, inner_state)``.

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
        raise ValueError(f"inject_hyperparams: static_args {sorted_labels(static)} must name "
                         f"parameters of {getattr(inner_factory, '__name__', 'the factory')}, "
                         f"whose parameters are {list(signature.parameters)}.")
    declared = tuple(getattr(inner_factory, "static_hyperparams", ()))

    def wrapped(*args: Any, **kwargs: Any) -> GradientTransformation:
        arguments = _bind(signature, args, kwargs, "inject_hyperparams")
        other, numeric, schedules = {}, {}, {}
        for name, value in arguments.items():
            if _is_static(name, value, static, declared):
                other[name] = value
            elif isinstance(value, StatefulSchedule):  # its state needs the stateful wrapper
                return inject_stateful_hyperparams(inner_factory, static, hyperparam_dtype)(
                    *args, **kwargs)
            elif callable(value):
                schedules[name] = value
            elif isinstance(value, (int, float, np.number, np.ndarray, jax.Array)):
                numeric[name] = value
            else:
                other[name] = value

        def dtype_of(tree: PyTree) -> Any:
            return _hyperparam_dtype(tree, hyperparam_dtype)

        def current(values: dict, count: Array, dtype: Any) -> dict:
            out = {k: _to_dtype(v, dtype) for k, v in values.items()}
            out.update({k: _to_dtype(f(count), dtype) for k, f in schedules.items()})
            return out

        def init_fn(params: Params) -> InjectHyperparamsState:
            count = jnp.zeros([], jnp.int32)
            hparams = current(numeric, count, dtype_of(params))
            return InjectHyperparamsState(count, HyperparamsDict(hparams),
                                          inner_factory(**other, **hparams).init(params))

        def update_fn(updates: Updates, state: InjectHyperparamsState,
                      params: Optional[Params] = None, **extra_args: Any
                      ) -> tuple[Updates, InjectHyperparamsState]:
            check_state_type(state, InjectHyperparamsState, "inject_hyperparams")
            unknown = set(state.hyperparams) - set(numeric) - set(schedules)
            if unknown:
                raise ValueError(f"inject_hyperparams: state.hyperparams has unknown keys "
                                 f"{sorted_labels(unknown)}; the injected hyperparameters are "
                                 f"{sorted_labels(set(numeric) | set(schedules))}.")
            values = {k: state.hyperparams.get(k, v) for k, v in numeric.items()}
            hparams = current(values, state.count,
                              dtype_of(params if params is not None else updates))
            new_updates, inner_state = call_update(
                inner_factory(**other, **hparams), updates, state.inner_state, params,
                extra_args)
            return new_updates, InjectHyperparamsState(safe_increment(state.count),
                                                       HyperparamsDict(hparams),
                                                       inner_state)

        return GradientTransformation(init_fn, update_fn)

    wrapped.__name__ = getattr(inner_factory, "__name__", "wrapped")
    wrapped.__doc__ = getattr(inner_factory, "__doc__", None)
    return wrapped


# --------------------------------------------------------------------------
# Stateful schedules: inject_stateful_hyperparams
# --------------------------------------------------------------------------

@runtime_checkable
class StatefulSchedule(Protocol):
    """A schedule with a state of its own, advanced once per step (optax's protocol).

    ``init() -> state``; ``update(state, **extra_args) -> state``;
    ``__call__(state, **extra_args) -> value``. The extra arguments are those
    of the optimizer's ``update`` (e.g. the loss ``value``), so the schedule
    can react to training (reduce on plateau). :func:`inject_stateful_hyperparams`
    keeps the state in ``hyperparams_states``; :class:`WrappedSchedule` makes
    one of a plain schedule. ``isinstance`` checks for the three methods.

    >>> import jax.numpy as jnp, functrain
    >>> isinstance(functrain.WrappedSchedule(lambda count: 0.1), StatefulSchedule)
    True
    """

    def init(self) -> Any:
        """The initial state.

        Returns:
          The schedule's state (a tree of arrays).
        """

    def update(self, state: Any, **extra_args: Any) -> Any:
        """The state for the next step.

        Args:
          state: the current state.
          **extra_args: the optimizer ``update`` 's extra keyword arguments.

        Returns:
          The new state.
        """

    def __call__(self, state: Any, **extra_args: Any) -> Any:
        """The value at ``state``.

        Args:
          state: the current state.
          **extra_args: the optimizer ``update`` 's extra keyword arguments.

        Returns:
          A scalar.
        """


class WrappedScheduleState(NamedTuple):
    """State of a :class:`WrappedSchedule`: the step count.

    Attributes:
      count: the number of steps so far (int32).

    >>> import functrain
    >>> functrain.WrappedSchedule(lambda count: 0.1).init()
    WrappedScheduleState(count=Array(0, dtype=int32))
    """

    count: Array


class WrappedSchedule:
    """A plain schedule (a function of the step count) as a :class:`StatefulSchedule`.

    Its state is the step count; its value at a state is ``schedule_fn(count)``.

    Args:
      schedule_fn: the schedule, a function of the step count.

    Attributes:
      schedule_fn: the wrapped schedule.

    >>> import functrain
    >>> sched = functrain.WrappedSchedule(functrain.linear_schedule(1.0, 0.0, 10))
    >>> state = sched.update(sched.init())
    >>> float(sched(state))
    0.9
    """

    def __init__(self, schedule_fn: Callable[[Array], Any]) -> None:
        if not callable(schedule_fn):
            raise TypeError(f"WrappedSchedule: schedule_fn must be a function of the step "
                            f"count, got {type(schedule_fn).__name__}.")
        self.schedule_fn = schedule_fn

    def init(self) -> WrappedScheduleState:
        """The initial state: count 0.

        Returns:
          ``WrappedScheduleState(count=0)`` (int32).

        >>> import functrain
        >>> int(functrain.WrappedSchedule(lambda c: c).init().count)
        0
        """
        return WrappedScheduleState(count=jnp.zeros([], jnp.int32))

    def update(self, state: WrappedScheduleState, **extra_args: Any) -> WrappedScheduleState:
        """The next step's state: count + 1 (the extra arguments are ignored).

        Args:
          state: the current state.
          **extra_args: ignored.

        Returns:
          The state with the count advanced (saturating, never wrapping).

        >>> import functrain
        >>> sched = functrain.WrappedSchedule(lambda c: c)
        >>> int(sched.update(sched.init()).count)
        1
        """
        del extra_args
        return WrappedScheduleState(count=safe_increment(state.count))

    def __call__(self, state: WrappedScheduleState, **extra_args: Any) -> Any:
        """``schedule_fn(state.count)`` (the extra arguments are ignored).

        Args:
          state: the current state.
          **extra_args: ignored.

        Returns:
          The schedule's value at the state's count.

        >>> import functrain
        >>> sched = functrain.WrappedSchedule(lambda c: 2 * c)
        >>> int(sched(sched.init()))
        0
        """
        del extra_args
        return self.schedule_fn(state.count)


class InjectStatefulHyperparamsState(NamedTuple):
    """State of :func:`inject_stateful_hyperparams`.

    Attributes:
      count: the number of ``update`` calls so far (int32).
      hyperparams: a :class:`HyperparamsDict` from each injected argument's
        name to the value the last step used (after ``init``: the first
        step's); assign to the numeric (unscheduled) ones between steps.
      hyperparams_states: the state of each scheduled argument's
        :class:`StatefulSchedule`, by name.
      inner_state: the wrapped optimizer's state.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.inject_stateful_hyperparams(functrain.sgd)(
    ...     learning_rate=functrain.linear_schedule(0.1, 0.0, 10))
    >>> opt.init([jnp.ones(1)]).hyperparams_states
    {'learning_rate': WrappedScheduleState(count=Array(0, dtype=int32))}
    """

    count: Array
    hyperparams: HyperparamsDict
    hyperparams_states: dict
    inner_state: Any


def inject_stateful_hyperparams(inner_factory: Callable[..., GradientTransformation],
                                static_args: Union[str, Iterable[str]] = (),
                                hyperparam_dtype: Optional[Any] = None
                                ) -> Callable[..., GradientTransformation]:
    """:func:`inject_hyperparams` that also takes stateful schedules.

    An argument given as a :class:`StatefulSchedule` keeps its state in
    ``state.hyperparams_states``: each step uses its value at the current
    state, then advances it with ``update``; both receive the extra keyword
    arguments of the optimizer's ``update`` (e.g. ``value=loss``). A plain
    schedule (a function of the step count) is wrapped in a
    :class:`WrappedSchedule`. Numeric arguments live in ``state.hyperparams``
    and may be changed between steps, as with :func:`inject_hyperparams`
    (whose rules for static arguments and ``hyperparam_dtype`` apply).

    Args:
      inner_factory: a function building a ``GradientTransformation`` from
        arguments that can be passed by name (e.g. ``functrain.adam``).
      static_args: the name (or names) of arguments to keep as Python values.
      hyperparam_dtype: the dtype floating hyperparameters are stored in;
        ``None``: the widest floating dtype of the params, at least float32.

    Returns:
      A function with ``inner_factory``'s arguments that returns a
      ``GradientTransformation`` whose state is
      :class:`InjectStatefulHyperparamsState`.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.inject_stateful_hyperparams(functrain.sgd)(
    ...     learning_rate=functrain.WrappedSchedule(lambda count: 1.0 / (count + 1)))
    >>> params = [jnp.zeros(1)]
    >>> state = opt.init(params)
    >>> for _ in range(2):
    ...     u, state = opt.update([jnp.ones(1)], state)
    >>> u, float(state.hyperparams['learning_rate'])
    ([Array([-0.5], dtype=float32)], 0.5)
    """
    static = {static_args} if isinstance(static_args, str) else set(static_args)
    signature = inspect.signature(inner_factory)
    if not static.issubset(signature.parameters):
        raise ValueError(f"inject_stateful_hyperparams: static_args {sorted_labels(static)} "
                         f"must name parameters of "
                         f"{getattr(inner_factory, '__name__', 'the factory')}, whose "
                         f"parameters are {list(signature.parameters)}.")
    declared = tuple(getattr(inner_factory, "static_hyperparams", ()))

    def wrapped(*args: Any, **kwargs: Any) -> GradientTransformation:
        arguments = _bind(signature, args, kwargs, "inject_stateful_hyperparams")
        other, numeric, schedules = {}, {}, {}
        for name, value in arguments.items():
            if _is_static(name, value, static, declared):
                other[name] = value
            elif isinstance(value, StatefulSchedule):
                schedules[name] = value
            elif callable(value):
                schedules[name] = WrappedSchedule(value)
            elif isinstance(value, (int, float, np.number, np.ndarray, jax.Array)):
                numeric[name] = value
            else:
                other[name] = value

        def current(values: dict, states: dict, dtype: Any, extra_args: dict) -> dict:
            out = {k: _to_dtype(v, dtype) for k, v in values.items()}
            out.update({k: _to_dtype(f(states[k], **extra_args), dtype)
                        for k, f in schedules.items()})
            return out

        def init_fn(params: Params) -> InjectStatefulHyperparamsState:
            states = {k: f.init() for k, f in schedules.items()}
            hparams = current(numeric, states, _hyperparam_dtype(params, hyperparam_dtype), {})
            return InjectStatefulHyperparamsState(
                jnp.zeros([], jnp.int32), HyperparamsDict(hparams), states,
                inner_factory(**other, **hparams).init(params))

        def update_fn(updates: Updates, state: InjectStatefulHyperparamsState,
                      params: Optional[Params] = None, **extra_args: Any
                      ) -> tuple[Updates, InjectStatefulHyperparamsState]:
            check_state_type(state, InjectStatefulHyperparamsState,
                             "inject_stateful_hyperparams")
            injected = set(numeric) | set(schedules)
            unknown = set(state.hyperparams) - injected
            if unknown or set(state.hyperparams_states) != set(schedules):
                raise ValueError(
                    f"inject_stateful_hyperparams: the state holds hyperparams "
                    f"{sorted_labels(state.hyperparams)} and schedule states "
                    f"{sorted_labels(state.hyperparams_states)}; the injected hyperparameters "
                    f"are {sorted_labels(injected)}, the scheduled ones "
                    f"{sorted_labels(schedules)}: was it made by this optimizer's init?")
            values = {k: state.hyperparams.get(k, v) for k, v in numeric.items()}
            dtype = _hyperparam_dtype(params if params is not None else updates,
                                      hyperparam_dtype)
            hparams = current(values, state.hyperparams_states, dtype, extra_args)
            new_states = {k: f.update(state.hyperparams_states[k], **extra_args)
                          for k, f in schedules.items()}
            new_updates, inner_state = call_update(
                inner_factory(**other, **hparams), updates, state.inner_state, params,
                extra_args)
            return new_updates, InjectStatefulHyperparamsState(
                safe_increment(state.count), HyperparamsDict(hparams), new_states, inner_state)

        return GradientTransformation(init_fn, update_fn)

    wrapped.__name__ = getattr(inner_factory, "__name__", "wrapped")
    wrapped.__doc__ = getattr(inner_factory, "__doc__", None)
    return wrapped
