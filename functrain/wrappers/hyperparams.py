"""Hyperparameters in the state: ``inject_hyperparams``.

The wrapped optimizer is rebuilt inside ``update`` from hyperparameters held
in the state, so a learning rate (or any numeric argument) can change between
steps without recompiling, and schedules are evaluated at the step count.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from functrain import tree as ft
from functrain.transforms.base import (GradientTransformation, Params, Updates, call_update,
                                       check_state_type, safe_increment, sorted_labels)

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
