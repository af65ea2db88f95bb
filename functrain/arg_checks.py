"""Checks of what a user passes to a builder or an ``update``: hyperparameters, inner
transformations, states; and the error sentences they share.

Every optimizer, stage, wrapper and whole-tree transformation calls these before any array
math, so a bad argument gets one clear message naming the function and the argument
everywhere. Builders declare their numeric arguments with
:func:`functrain.declarations.hyperparameters` (a table of argument -> kind, checked here by
:func:`check_hyperparameter`); ranges are checked by explicit calls (:func:`check_range`,
:func:`check_betas`, :func:`check_nonnegative`, :func:`check_momentum`). Key-path checks of
trees (structures, shapes, dtypes, masks) are in :mod:`functrain.tree.checks`.
"""

from __future__ import annotations

import numbers
from typing import Any, Iterable, Optional

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["concrete_real", "check_range", "check_betas", "check_momentum", "check_bools",
           "check_nonnegative", "check_positive", "check_hyperparameter", "KINDS",
           "check_transformation", "check_state_type", "needs_params_error",
           "MissingArgumentError", "missing_argument_error", "is_transformation",
           "state_mismatch_error", "sorted_labels"]


# --------------------------------------------------------------------------
# Hyperparameters (concrete values only; traced values pass)
# --------------------------------------------------------------------------

def concrete_real(value: Any) -> Optional[float]:
    """``value`` as a float if it is a concrete real scalar (a number or a 0-d real array).

    ``None`` for anything else: traced values, schedules, strings, bools,
    complex numbers, arrays of other shapes.

    Args:
      value: anything a hyperparameter may be.

    Returns:
      A Python float, or ``None``.

    >>> import jax.numpy as jnp
    >>> concrete_real(0.5), concrete_real(True), concrete_real(jnp.asarray(2, jnp.bfloat16))
    (0.5, None, 2.0)
    """
    if isinstance(value, jax.core.Tracer) or callable(value):
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, (np.ndarray, jax.Array, np.generic)) and np.ndim(value) == 0:
        dtype = np.asarray(value).dtype  # jnp.issubdtype knows bfloat16 and float8
        if jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer):
            return float(value)
    return None


def check_range(name: str, value: Any, low: float, high: Optional[float] = None, *,
                high_inclusive: bool = False, owner: str = "") -> None:
    """Raise ``ValueError`` naming ``name`` if a concrete ``value`` is out of range.

    The range is ``[low, high)`` (or ``[low, high]`` with ``high_inclusive``);
    NaN is always out of range; traced values and schedules are not checked.

    Args:
      name: the argument's name, for the message.
      value: the value to check.
      low: the smallest allowed value.
      high: the bound above, or ``None`` for none.
      high_inclusive: whether ``high`` itself is allowed.
      owner: the function that received it, for the message.

    Returns:
      ``None``; raises ``ValueError`` when the check fails.

    >>> check_range('b1', 1.5, 0.0, 1.0, owner='adam')
    Traceback (most recent call last):
    ...
    ValueError: adam: b1 must be in [0.0, 1.0), got 1.5.
    """
    v = concrete_real(value)
    if v is None:
        return
    bad = v != v or v < low or (high is not None and (v > high if high_inclusive else v >= high))
    if bad:
        where = f"{owner}: " if owner else ""
        if high is None:
            raise ValueError(f"{where}{name} must be >= {low}, got {value}.")
        close = "]" if high_inclusive else ")"
        raise ValueError(f"{where}{name} must be in [{low}, {high}{close}, got {value}.")


#: The kinds of hyperparameter :func:`hyperparameters` knows: ``(schedule allowed, may be
#: infinite)``; a kind ending in ``" or None"`` also accepts ``None``.
KINDS = {"number": (False, False), "schedule": (True, False), "bound": (False, True),
         "decay": (False, False), "int": (False, False)}


def check_hyperparameter(owner: str, name: str, value: Any, kind: str = "number") -> None:
    """Raise if a concrete hyperparameter is not what its kind allows.

    ``"number"``: a finite real number (a Python number or a 0-d real array of
    any dtype, bfloat16 included); ``"schedule"``: that or a schedule (a
    function of the step count); ``"bound"``: a real number that may be
    infinite (a limit that disables itself, such as ``max_norm``); ``"decay"``: a
    number or a decay-rate schedule, a callable of the step count ``t`` (from 1) with a
    ``bias_correction(t)`` method giving ``1 - prod(rate(1..t))`` (e.g.
    ``functrain.contrib.palm_beta2_schedule()``); ``"int"``: an integer (a Python int, a
    numpy integer or a 0-d integer array; not a bool, not a float such as ``8.0``). A kind
    ending in ``" or None"`` also accepts ``None``. Traced values pass
    unchecked.

    Args:
      owner: the optimizer or transformation, for the message.
      name: the argument's name, for the message.
      value: the value given.
      kind: one of :data:`KINDS`, optionally followed by ``" or None"``.

    Returns:
      ``None``; raises ``TypeError`` for a wrong type or shape, ``ValueError``
      for NaN or (except for bounds) an infinity.

    >>> check_hyperparameter('adam', 'learning_rate', '0.1', 'schedule')
    Traceback (most recent call last):
    ...
    TypeError: adam: learning_rate must be a real number or a schedule (a function of the step count), got str '0.1'.
    """
    base, optional = kind.removesuffix(" or None"), kind.endswith(" or None")
    schedule_ok, may_be_infinite = KINDS[base]
    if value is None and optional:
        return
    if isinstance(value, jax.core.Tracer) or (schedule_ok and callable(value)):
        return
    if base == "decay" and callable(value):
        if not callable(getattr(value, "bias_correction", None)):
            raise TypeError(f"{owner}: {name} takes a number or a decay-rate schedule with a "
                            f"bias_correction(t) method (e.g. functrain.contrib."
                            f"palm_beta2_schedule()); a plain schedule gives no bias "
                            f"correction, got {value!r:.40}.")
        return
    if base == "int":
        array = isinstance(value, (np.ndarray, jax.Array))
        if (isinstance(value, (int, np.integer)) and not isinstance(value, bool)) or (
                array and value.ndim == 0 and jnp.issubdtype(value.dtype, jnp.integer)):
            return
        shape = f" of shape {value.shape}" if array else ""
        raise TypeError(f"{owner}: {name} must be an int (a Python or numpy integer), got "
                        f"{type(value).__name__}{shape} {value!r:.40}.")
    what = "a real number" + (" or a schedule (a function of the step count)"
                              if schedule_ok else "")
    v = concrete_real(value)
    if v is None:
        shape = f" of shape {np.shape(value)}" if hasattr(value, "shape") else ""
        raise TypeError(f"{owner}: {name} must be {what}, got {type(value).__name__}"
                        f"{shape} {value!r:.40}.")
    if v != v or (v in (float("inf"), float("-inf")) and not may_be_infinite):
        raise ValueError(f"{owner}: {name} must be finite, got {value}.")


def check_bools(owner: str, **flags: Any) -> None:
    """Raise ``TypeError`` naming the flag unless each keyword's value is a bool.

    Args:
      owner: the function that received them, for the message.
      **flags: name -> value (a Python or numpy bool).

    Returns:
      ``None``; raises ``TypeError`` for the first value that is not a bool.

    >>> check_bools("soap", merge_dims="yes")
    Traceback (most recent call last):
    ...
    TypeError: soap: merge_dims must be a bool, got str 'yes'.
    """
    for name, value in flags.items():
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{owner}: {name} must be a bool, got {type(value).__name__} "
                            f"{value!r:.40}.")


def check_betas(owner: str, **betas: Any) -> None:
    """:func:`check_range` in ``[0, 1)`` for each keyword (decay rates such as ``b1``).

    Args:
      owner: the function that received them, for the message.
      **betas: name -> value.

    Returns:
      ``None``; raises ``ValueError`` when the check fails.

    >>> check_betas('adam', b1=0.9, b2=1.0)
    Traceback (most recent call last):
    ...
    ValueError: adam: b2 must be in [0.0, 1.0), got 1.0.
    """
    for name, value in betas.items():
        check_range(name, value, 0.0, 1.0, owner=owner)


def check_momentum(owner: str, momentum: Any) -> None:
    """:func:`check_range` in ``[0, 1)`` for an optional ``momentum`` (``None`` passes).

    Args:
      owner: the optimizer that received it, for the message.
      momentum: the momentum, or ``None`` for none.

    Returns:
      ``None``; raises ``ValueError`` when the check fails.

    >>> check_momentum('sgd', 1.5)
    Traceback (most recent call last):
    ...
    ValueError: sgd: momentum must be in [0.0, 1.0), got 1.5.
    """
    if momentum is not None:
        check_range("momentum", momentum, 0.0, 1.0, owner=owner)


def check_nonnegative(owner: str, **values: Any) -> None:
    """:func:`check_range` in ``[0, inf)`` for each keyword (``eps``, decays, ...).

    Args:
      owner: the function that received them, for the message.
      **values: name -> value.

    Returns:
      ``None``; raises ``ValueError`` when the check fails.

    >>> check_nonnegative('adam', eps=-1.0)
    Traceback (most recent call last):
    ...
    ValueError: adam: eps must be >= 0.0, got -1.0.
    """
    for name, value in values.items():
        check_range(name, value, 0.0, owner=owner)


def check_positive(owner: str, **values: Any) -> None:
    """Raise ``ValueError`` unless each concrete keyword value is a number ``> 0`` (norms,
    periods); traced values and schedules pass.

    Args:
      owner: the function that received them, for the message.
      **values: name -> value.

    Returns:
      ``None``; raises ``ValueError`` when the check fails.

    >>> check_positive('scale_by_mars', max_norm=0.0)
    Traceback (most recent call last):
    ...
    ValueError: scale_by_mars: max_norm must be > 0, got 0.0.
    """
    for name, value in values.items():
        v = concrete_real(value)
        if v is not None and not v > 0:
            raise ValueError(f"{owner}: {name} must be > 0, got {value}.")


# --------------------------------------------------------------------------
# Inner transformations and states
# --------------------------------------------------------------------------

def is_transformation(x: Any) -> bool:
    """Whether ``x`` has callable ``init`` and ``update`` (a transformation, optax's too).

    Args:
      x: anything.

    Returns:
      ``True`` for a ``GradientTransformation`` or any object shaped like one.

    >>> import functrain
    >>> is_transformation(functrain.adam(0.1)), is_transformation(0.1)
    (True, False)
    """
    return callable(getattr(x, "init", None)) and callable(getattr(x, "update", None))


def check_transformation(tx: Any, owner: str, what: str = "inner") -> None:
    """Raise ``TypeError`` unless ``tx`` has callable ``init`` and ``update``.

    Args:
      tx: the object to check.
      owner: the function that received it, for the message.
      what: how to call the argument in the message.

    Returns:
      ``None``; raises ``TypeError`` when the check fails.

    >>> check_transformation(3, 'masked')
    Traceback (most recent call last):
    ...
    TypeError: masked: inner is a int, not a GradientTransformation (an object with init and update).
    """
    if not is_transformation(tx):
        raise TypeError(f"{owner}: {what} is a {type(tx).__name__}, not a "
                        f"GradientTransformation (an object with init and update).")


def check_state_type(state: Any, cls: type, owner: str) -> None:
    """Raise ``TypeError`` unless ``state`` is a ``cls`` (a state made by ``owner``'s init),
    or a NamedTuple class of the same name and fields (optax's, for code mid-migration).

    Args:
      state: the state passed to ``update``.
      cls: the expected state class.
      owner: the transformation's name, for the message.

    Returns:
      ``None``; raises ``TypeError`` when the check fails.

    >>> check_state_type((), dict, 'scale')
    Traceback (most recent call last):
    ...
    TypeError: scale expected its state as dict, got tuple: was the state made by this transformation's init?
    """
    if isinstance(state, cls) or (type(state).__name__ == cls.__name__ and
                                  getattr(type(state), "_fields", None) ==
                                  getattr(cls, "_fields", False)):
        return  # also optax's class of the same name and fields (code mid-migration)
    raise TypeError(f"{owner} expected its state as {cls.__name__}, got "
                    f"{type(state).__name__}: was the state made by this "
                    f"transformation's init?")


# --------------------------------------------------------------------------
# The error sentences every transformation needs
# --------------------------------------------------------------------------

def needs_params_error(owner: str, call: str = "update(updates, state, params)") -> ValueError:
    """The error for an ``update`` called without the ``params`` it needs.

    Args:
      owner: the transformation's name.
      call: how to call ``update`` instead (with any keywords it also needs).

    Returns:
      A ``ValueError`` to raise.

    >>> needs_params_error('lamb')
    ValueError('lamb needs the current parameters: call update(updates, state, params) with params, a tree like the updates.')
    """
    return ValueError(f"{owner} needs the current parameters: call {call} with params, a "
                      f"tree like the updates.")


class MissingArgumentError(TypeError, ValueError):
    """An ``update`` called without a keyword argument it needs (``value=``, ``grad_fn=``).

    A ``TypeError``, as Python's own for a missing argument (and optax's, whose ``update``
    declares them keyword-only); a ``ValueError`` too, as functrain raised before.
    """


def missing_argument_error(owner: str, name: str) -> MissingArgumentError:
    """The error for an ``update`` called without its keyword argument ``name``.

    Args:
      owner: the transformation's name.
      name: the missing keyword argument.

    Returns:
      A :class:`MissingArgumentError` to raise.

    >>> print(missing_argument_error('momo', 'value'))
    momo needs the keyword argument 'value': call update(updates, state, params, value=...).
    """
    return MissingArgumentError(f"{owner} needs the keyword argument {name!r}: call "
                                f"update(updates, state, params, {name}=...).")


def state_mismatch_error(owner: str, problem: str, made_by: str = "this transformation",
                         error: type = ValueError) -> Exception:
    """The error for a state that does not fit: ``"<owner>: <problem>: was the state made by
    <made_by>'s init?"``.

    Args:
      owner: the transformation's name.
      problem: what does not fit (shapes, structure, types).
      made_by: whose ``init`` should have made it.
      error: the exception class.

    Returns:
      The exception to raise.

    >>> state_mismatch_error('kron', 'the state has 2 factors for a 3-d leaf')
    ValueError("kron: the state has 2 factors for a 3-d leaf: was the state made by this transformation's init?")
    """
    return error(f"{owner}: {problem}: was the state made by {made_by}'s init?")


def sorted_labels(labels: Iterable[Any]) -> list[Any]:
    """``labels`` sorted for an error message, even when they are of mixed types.

    Args:
      labels: hashable labels (strings, ints, ...).

    Returns:
      A list sorted by ``repr``.

    >>> sorted_labels(['b', 1, 'a'])
    ['a', 'b', 1]
    """
    return sorted(labels, key=repr)
