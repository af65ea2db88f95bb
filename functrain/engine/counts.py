"""Step counts and bias corrections: what a stage's ``prepare`` computes once per step.

A stage that counts steps keeps ``count`` among its global fields (:func:`zero_count`) and
advances it in ``prepare`` (:func:`safe_increment`, or :func:`count_only` as the whole
``prepare``); the Adam-like stages' ``prepare`` is :func:`corrections`, which also returns this
step's :class:`BiasCorrections` (``1 - b1**t``, ``1 - b2**t``, and ``1 - b1**(t+1)`` for
Nesterov momentum); a hyperparameter that may be a schedule is read with :func:`value_at`.
The per-array formulas themselves (``bias_correction_factor``, ``safe_int32_increment``) are
:mod:`functrain.numerics`'.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from functrain.numerics import safe_int32_increment

Array = jax.Array

__all__ = ["safe_increment", "zero_count", "count_only", "value_at", "BiasCorrections",
           "corrections"]


# ``count + 1`` saturating at the dtype's maximum: optax's safe_int32_increment (one copy,
# in numerics.py), under the name functrain has exported since its first release.
safe_increment = safe_int32_increment


def zero_count() -> dict:
    """``{'count': int32 0}``: the global state of stages that count steps.

    Returns:
      A dict with one int32 scalar zero under ``'count'``.

    >>> zero_count()
    {'count': Array(0, dtype=int32)}
    """
    return {"count": jnp.zeros([], jnp.int32)}


def value_at(x: Any, count: Any) -> Any:
    """The value of a hyperparameter that may be a schedule: ``x(count)`` or ``x`` itself.

    Args:
      x: a number, an array, or a schedule (a callable of the step count).
      count: the step count to evaluate a schedule at.

    Returns:
      ``x(count)`` if ``x`` is callable, else ``x``.

    >>> value_at(lambda t: 0.1 * t, 3), value_at(0.5, 3)
    (0.30000000000000004, 0.5)
    """
    return x(count) if callable(x) else x


def count_only(glob: dict, updates: Any) -> tuple[None, dict]:
    """A ``prepare`` that only advances the step count (no context).

    Args:
      glob: the stage's global fields, holding ``count``.
      updates: unused.

    Returns:
      ``(None, {'count': count + 1})``.

    >>> import jax.numpy as jnp
    >>> count_only({'count': jnp.asarray(1)}, None)
    (None, {'count': Array(2, dtype=int32)})
    """
    del updates
    return None, {"count": safe_increment(glob["count"])}


class BiasCorrections(NamedTuple):
    """The per-step context of the Adam family, computed once per step by ``prepare``.

    Attributes:
      count: the step number ``t``, counted from 1.
      mu: ``1 - b1**t``.
      nu: ``1 - b2**t``.
      next_mu: ``1 - b1**(t+1)`` (for Nesterov momentum), else ``None``.
      b2: this step's ``b2`` (the number itself, or a decay-rate schedule's value at ``t``).

    >>> import jax.numpy as jnp
    >>> corrections(0.9, 0.999)({'count': jnp.asarray(0)}, None)[0].mu
    Array(0.1, dtype=float32, weak_type=True)
    """

    count: Array
    mu: Any = None
    nu: Any = None
    next_mu: Any = None
    b2: Any = None


def corrections(b1: Any, b2: Any = None, *, nesterov: bool = False) -> Any:
    """A ``prepare`` that advances ``count`` and returns this step's :class:`BiasCorrections`.

    Args:
      b1: the first moment's decay (``None``: no ``mu`` correction).
      b2: the second moment's decay (``None``: no ``nu`` correction), or a decay-rate
        schedule (a callable of ``t`` with a ``bias_correction(t)`` method, as
        ``functrain.contrib.palm_beta2_schedule()``).
      nesterov: also compute ``1 - b1**(t+1)``.

    Returns:
      ``prepare(glob, updates) -> (BiasCorrections, {'count': t})``.

    >>> import jax.numpy as jnp
    >>> ctx, glob = corrections(0.5, 0.5)({'count': jnp.asarray(1)}, None)
    >>> float(ctx.mu), int(glob['count'])
    (0.75, 2)
    """
    def prepare(glob: dict, _: Any) -> tuple:
        count = safe_increment(glob["count"])
        if callable(b2):
            b2_now, nu = b2(count), b2.bias_correction(count)
        else:
            b2_now, nu = b2, None if b2 is None else 1 - b2 ** count
        return BiasCorrections(
            count,
            None if b1 is None else 1 - b1 ** count,
            nu,
            1 - b1 ** safe_increment(count) if nesterov else None, b2_now), {"count": count}
    return prepare
