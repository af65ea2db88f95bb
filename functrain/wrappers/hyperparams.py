"""Hyperparameters in the state: ``inject_hyperparams``, ``inject_stateful_hyperparams``.

The wrapped optimizer is rebuilt inside ``update`` from hyperparameters held
in the state, so a learning rate (or any numeric argument) can change between
steps without recompiling, and schedules are evaluated at the step count. The
state is optax 0.2.8's :class:`InjectStatefulHyperparamsState`: schedules are
stateful (:class:`StatefulSchedule`; a plain one is wrapped in a
:class:`WrappedSchedule`) and their states live in ``hyperparams_states``.
``inject_stateful_hyperparams`` is the same function under its older name.
"""

from __future__ import annotations

import inspect
from typing import (Any, Callable, Iterable, NamedTuple, Optional, Protocol, Union,
                    runtime_checkable)

import jax
import jax.numpy as jnp
import numpy as np

from functrain.arg_checks import check_state_type, sorted_labels
from functrain.declarations import record_reader
from functrain import tree as ft
from functrain.engine.protocol import (GradientTransformation, GradientTransformationExtraArgs,
                                       Params, Updates, call_update)
from functrain.engine.counts import safe_increment

Array = jax.Array
PyTree = Any


class HyperparamsDict(dict):
    """The ``hyperparams`` of :class:`InjectStatefulHyperparamsState`: a dict that stores arrays.

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
    """optax's older state of ``inject_hyperparams``, kept for code that names the class.

    :func:`inject_hyperparams` returns :class:`InjectStatefulHyperparamsState`, as optax
    0.2.8 does (optax deprecated this class in 0.1.9); this one has no
    ``hyperparams_states``.

    Attributes:
      count: the number of ``update`` calls so far (int32).
      hyperparams: each injected argument's name to its current value.
      inner_state: the wrapped optimizer's state.

    >>> import jax.numpy as jnp
    >>> InjectHyperparamsState(jnp.zeros([], jnp.int32), {}, ()).hyperparams
    {}
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


def _convert_floats(value: Any, dtype: Any) -> Any:
    """A float (Python, NumPy or weakly typed) as an array of ``dtype``; anything else (an
    integer, a strongly typed array) as it is. optax's rule."""
    if isinstance(value, jax.Array) and not getattr(value, "weak_type", False):
        return value
    current = getattr(value, "dtype", None)
    if current is None:
        current = np.asarray(value).dtype
    if jnp.issubdtype(current, jnp.floating):
        return jnp.asarray(value, dtype)
    return value


def _hyperparam_dtype(params: PyTree, hyperparam_dtype: Optional[Any]) -> Any:
    """``hyperparam_dtype``, or the highest dtype of the params (optax's rule; JAX's default
    float for ``None`` params). Where optax's rule gives no real float dtype, a real float:
    for complex params their real dtype (optax would store complex hyperparameters), for
    bfloat16 beside float16 (no order: optax raises) float32, for integer-only params JAX's
    default float (optax would round every float hyperparameter to an integer)."""
    if hyperparam_dtype is not None:
        return hyperparam_dtype
    try:
        dtype = ft.dtype(params, "highest")
    except ValueError:
        dtype = ft.dtype(params, "promote")
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return jnp.finfo(dtype).dtype
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.asarray(0.0).dtype


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


def inject_hyperparams(inner_factory: Callable[..., GradientTransformation],
                       static_args: Union[str, Iterable[str]] = (),
                       hyperparam_dtype: Optional[Any] = None
                       ) -> Callable[..., GradientTransformationExtraArgs]:
    """Make an optimizer's numeric arguments part of its state.

    ``inject_hyperparams(factory)(*args, **kwargs)`` behaves like
    ``factory(*args, **kwargs)``, but every numeric argument lives in
    ``state.hyperparams`` (a dict) and may be changed between steps without
    recompiling a jitted step; arguments given as functions (schedules) are
    evaluated at the step count, and their current value is shown in
    ``hyperparams``. A plain schedule is wrapped in a :class:`WrappedSchedule`
    and an argument given as a :class:`StatefulSchedule` used as it is; their
    states live in ``state.hyperparams_states``, advanced after each step with the
    extra keyword arguments of ``update`` (e.g. ``value=loss``). The state is
    optax 0.2.8's :class:`InjectStatefulHyperparamsState`. ``static_args`` names
    arguments to keep as Python values; booleans, strings, ``None``, masks and
    dtypes are always static, as are the names a factory declares static
    (``@hyperparameters(static=...)``, its ``static_hyperparams`` attribute: e.g.
    adafactor's ``min_dim_size_to_factor``). Floats are stored in ``hyperparam_dtype``, by
    default the highest dtype of the params (as optax: bfloat16 params round
    the learning rate to bfloat16; the real dtype for complex params, float32
    for bfloat16 beside float16, which optax refuses); integers and arrays of
    a fixed dtype keep theirs.

    Args:
      inner_factory: a function building a ``GradientTransformation`` from
        arguments that can be passed by name, e.g. ``functrain.adam`` or
        ``optax.adam`` (factories taking ``*args`` are not supported).
      static_args: the name (or names) of arguments to keep as Python values,
        never injected (e.g. an int that decides state shapes); each must be
        a parameter of ``inner_factory`` (else ``ValueError``).
      hyperparam_dtype: the dtype floating hyperparameters are stored in;
        ``None`` (the default): the highest (real) float dtype of the params.

    Returns:
      A function with ``inner_factory``'s arguments (and docstring) that
      returns a ``GradientTransformationExtraArgs`` whose state is
      ``InjectStatefulHyperparamsState(count, hyperparams, hyperparams_states,
      inner_state)``.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.inject_hyperparams(functrain.sgd)(learning_rate=0.1)
    >>> params = [jnp.ones(1)]
    >>> state = opt.init(params)
    >>> state.hyperparams['learning_rate'] = 0.01
    >>> opt.update([jnp.ones(1)], state)[0]
    [Array([-0.01], dtype=float32)]
    """
    return _inject(inner_factory, static_args, hyperparam_dtype, "inject_hyperparams")


def inject_stateful_hyperparams(inner_factory: Callable[..., GradientTransformation],
                                static_args: Union[str, Iterable[str]] = (),
                                hyperparam_dtype: Optional[Any] = None
                                ) -> Callable[..., GradientTransformationExtraArgs]:
    """:func:`inject_hyperparams` under its older name (optax 0.2.8 deprecates it).

    The same function: an argument given as a :class:`StatefulSchedule` keeps
    its state in ``state.hyperparams_states`` (each step uses its value at the
    current state, then advances it with ``update``; both receive the extra
    keyword arguments of the optimizer's ``update``, e.g. ``value=loss``); a
    plain schedule is wrapped in a :class:`WrappedSchedule`.

    Args:
      inner_factory: a function building a ``GradientTransformation`` from
        arguments that can be passed by name (e.g. ``functrain.adam``).
      static_args: the name (or names) of arguments to keep as Python values.
      hyperparam_dtype: the dtype floating hyperparameters are stored in;
        ``None``: the highest dtype of the params.

    Returns:
      A function with ``inner_factory``'s arguments that returns a
      ``GradientTransformationExtraArgs`` whose state is
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
    return _inject(inner_factory, static_args, hyperparam_dtype, "inject_stateful_hyperparams")


def _inject(inner_factory: Callable[..., GradientTransformation],
            static_args: Union[str, Iterable[str]], hyperparam_dtype: Optional[Any],
            owner: str) -> Callable[..., GradientTransformationExtraArgs]:
    """:func:`inject_hyperparams`, with ``owner`` naming it in errors."""
    static = {static_args} if isinstance(static_args, str) else set(static_args)
    signature = inspect.signature(inner_factory)
    if not static.issubset(signature.parameters):
        raise ValueError(f"{owner}: static_args {sorted_labels(static)} must name parameters "
                         f"of {getattr(inner_factory, '__name__', 'the factory')}, whose "
                         f"parameters are {list(signature.parameters)}.")
    declared = tuple(getattr(inner_factory, "static_hyperparams", ()))

    def wrapped(*args: Any, **kwargs: Any) -> GradientTransformationExtraArgs:
        arguments = _bind(signature, args, kwargs, owner)
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

        def scheduled(states: dict, dtype: Any, extra_args: dict) -> dict:
            return {k: _convert_floats(f(states[k], **extra_args), dtype)
                    for k, f in schedules.items()}

        def init_fn(params: Params) -> InjectStatefulHyperparamsState:
            dtype = _hyperparam_dtype(params, hyperparam_dtype)
            states = {k: f.init() for k, f in schedules.items()}
            hparams = {k: jnp.asarray(_convert_floats(v, dtype)) for k, v in numeric.items()}
            hparams.update(scheduled(states, dtype, {}))
            return InjectStatefulHyperparamsState(
                jnp.zeros([], jnp.int32), HyperparamsDict(hparams), states,
                inner_factory(**other, **hparams).init(params))

        def update_fn(updates: Updates, state: InjectStatefulHyperparamsState,
                      params: Optional[Params] = None, **extra_args: Any
                      ) -> tuple[Updates, InjectStatefulHyperparamsState]:
            check_state_type(state, InjectStatefulHyperparamsState, owner)
            injected = set(numeric) | set(schedules)
            unknown = set(state.hyperparams) - injected
            if unknown or set(state.hyperparams_states) != set(schedules):
                raise ValueError(
                    f"{owner}: the state holds hyperparams {sorted_labels(state.hyperparams)} "
                    f"and schedule states {sorted_labels(state.hyperparams_states)}; the "
                    f"injected hyperparameters are {sorted_labels(injected)}, the scheduled "
                    f"ones {sorted_labels(schedules)}: was it made by this optimizer's init?")
            dtype = _hyperparam_dtype(params, hyperparam_dtype)
            hparams = {k: _convert_floats(state.hyperparams.get(k, v), dtype)
                       for k, v in numeric.items()}
            hparams.update(scheduled(state.hyperparams_states, dtype, extra_args))
            new_states = {k: f.update(state.hyperparams_states[k], **extra_args)
                          for k, f in schedules.items()}
            new_updates, inner_state = call_update(
                inner_factory(**other, **hparams), updates, state.inner_state, params,
                extra_args)
            return new_updates, InjectStatefulHyperparamsState(
                safe_increment(state.count), HyperparamsDict(hparams), new_states, inner_state)

        def read(state: InjectStatefulHyperparamsState) -> tuple:
            """The inner optimizer as the next ``update`` builds it, and its state: the
            injected numbers the state holds, each schedule at its current state."""
            hparams = {k: state.hyperparams[k] for k in numeric}
            hparams.update({k: _like(f(state.hyperparams_states[k]), state.hyperparams[k])
                            for k, f in schedules.items()})
            return ((state.inner_state, inner_factory(**other, **hparams)),)

        tx = GradientTransformationExtraArgs(init_fn, update_fn)
        record_reader(tx, owner, read)
        return tx

    wrapped.__name__ = getattr(inner_factory, "__name__", "wrapped")
    wrapped.__doc__ = getattr(inner_factory, "__doc__", None)
    return wrapped
