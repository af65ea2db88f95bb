"""Checks of what a user passes to a loss, before any array math, and their error sentences.

Every loss in :mod:`functrain.losses` calls these first, so a wrong dtype, a shape that does
not fit or an axis out of range gets one clear message naming the loss and the argument, where
optax would broadcast it silently into a wrong answer or fail deep inside ``jnp``:

* :func:`floats` / :func:`integers` / :func:`numbers`: the dtype an argument needs (a
  ``TypeError``, as optax's).
* :func:`same_shape`, :func:`fits_shape`: shapes (a :class:`LossInputError`).
* :func:`axes`: an ``axis`` argument as a tuple of non-negative ints.
* :func:`where_mask`: a ``where`` argument as a boolean mask of the input's shape.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from functrain.arg_checks import concrete_real

Array = jax.Array
Axis = Union[int, Sequence[int], None]

__all__ = ["LossInputError", "ZeroArgumentError", "MissingAxisError", "floats", "integers",
           "numbers", "same_shape", "fits_shape", "has_last_axis", "axes", "batch_shape",
           "where_mask", "check_probabilities", "positive_number"]


class LossInputError(ValueError, TypeError):
    """An argument of a loss whose shape, axis or value does not fit.

    A ``ValueError``, and a ``TypeError`` too: for the same mistake optax raises one or the
    other depending on where its array math fails (``jnp``'s broadcasting raises
    ``ValueError``, ``lax``'s ``TypeError``), so ``except`` clauses written for optax catch
    functrain's.
    """


class ZeroArgumentError(LossInputError, ZeroDivisionError):
    """A zero argument that a loss divides by (``triplet_margin_loss``'s ``norm_degree``).

    Also a ``ZeroDivisionError``, what optax raises there.
    """


class MissingAxisError(LossInputError, IndexError):
    """An input without the axis a loss needs: a scalar where a class or channel axis (the
    last) is expected.

    Also an ``IndexError``, what optax raises for some of these.
    """


def has_last_axis(owner: str, name: str, x: Array, what: str = "class") -> None:
    """Raise unless ``x`` has at least one axis (the ``what`` axis, the last).

    Args:
      owner: the loss, for the message.
      name: the argument's name.
      x: the argument (an array).
      what: what the last axis holds, for the message.

    Returns:
      ``None``.

    Raises:
      MissingAxisError: ``x`` is a scalar.

    >>> has_last_axis('dice_loss', 'predictions', jnp.array(1.0))
    Traceback (most recent call last):
    ...
    functrain.losses.checks.MissingAxisError: dice_loss: predictions must have a class axis (the last); got a scalar.
    """
    if x.ndim == 0:
        raise MissingAxisError(f"{owner}: {name} must have a {what} axis (the last); got a "
                               f"scalar.")


def _as_array(x: Any) -> Array:
    return x if isinstance(x, jax.Array) else jnp.asarray(x)


def _dtype_name(x: Array) -> str:
    return np.dtype(x.dtype).name


def floats(owner: str, name: str, x: Any) -> Array:
    """``x`` as a JAX array, which must hold floating-point numbers.

    Args:
      owner: the loss, for the message.
      name: the argument's name, for the message.
      x: the argument.

    Returns:
      ``x`` as a ``jax.Array`` (unchanged dtype).

    Raises:
      TypeError: ``x`` holds integers, booleans or complex numbers.

    >>> floats('l2_loss', 'predictions', [1, 2])
    Traceback (most recent call last):
    ...
    TypeError: l2_loss: predictions must be a floating-point array (float32, float64, bfloat16 or float16), got int32; cast it first, e.g. predictions.astype(jnp.float32).
    """
    x = _as_array(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{owner}: {name} must be a floating-point array (float32, float64, "
                        f"bfloat16 or float16), got {_dtype_name(x)}; cast it first, e.g. "
                        f"{name}.astype(jnp.float32).")
    return x


def integers(owner: str, name: str, x: Any) -> Array:
    """``x`` as a JAX array, which must hold integers (class indices).

    Args:
      owner: the loss, for the message.
      name: the argument's name, for the message.
      x: the argument.

    Returns:
      ``x`` as a ``jax.Array``.

    Raises:
      TypeError: ``x`` holds floats, booleans or complex numbers.

    >>> integers('multiclass_sparsemax_loss', 'labels', [0.0, 2.0])
    Traceback (most recent call last):
    ...
    TypeError: multiclass_sparsemax_loss: labels must be an integer array of class indices, got float32; cast it first, e.g. labels.astype(jnp.int32).
    """
    x = _as_array(x)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"{owner}: {name} must be an integer array of class indices, got "
                        f"{_dtype_name(x)}; cast it first, e.g. {name}.astype(jnp.int32).")
    return x


def numbers(owner: str, name: str, x: Any, *, bools: bool = True) -> Array:
    """``x`` as a JAX array of real numbers: floats, integers, and booleans unless ``bools``
    is False.

    Args:
      owner: the loss, for the message.
      name: the argument's name, for the message.
      x: the argument.
      bools: whether booleans are accepted.

    Returns:
      ``x`` as a ``jax.Array``.

    Raises:
      TypeError: ``x`` holds complex numbers (or booleans, with ``bools=False``).

    >>> numbers('hinge_loss', 'targets', [1, -1]).dtype
    dtype('int32')
    """
    x = _as_array(x)
    ok = jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer) or (
        bools and x.dtype == jnp.bool_)
    if not ok:
        kinds = "real numbers (floats, integers or booleans)" if bools else (
            "real numbers (floats or integers)")
        raise TypeError(f"{owner}: {name} must hold {kinds}, got {_dtype_name(x)}.")
    return x


def same_shape(owner: str, a_name: str, a: Array, b_name: str, b: Array) -> None:
    """Raise unless ``a`` and ``b`` have the same shape.

    Args:
      owner: the loss, for the message.
      a_name: the first argument's name.
      a: the first argument (an array).
      b_name: the second argument's name.
      b: the second argument (an array).

    Returns:
      ``None``.

    Raises:
      LossInputError: the shapes differ.

    >>> same_shape('squared_error', 'predictions', jnp.ones((2, 3)), 'targets', jnp.ones(3))
    Traceback (most recent call last):
    ...
    functrain.losses.checks.LossInputError: squared_error: predictions and targets must have the same shape, got (2, 3) and (3,).
    """
    if a.shape != b.shape:
        raise LossInputError(f"{owner}: {a_name} and {b_name} must have the same shape, got "
                             f"{a.shape} and {b.shape}.")


def fits_shape(owner: str, name: str, x: Array, ref_name: str, shape: tuple) -> None:
    """Raise unless ``x`` broadcasts to ``shape`` (the reference argument's) without growing it.

    Args:
      owner: the loss, for the message.
      name: the argument's name.
      x: the argument (an array).
      ref_name: the name of the argument whose shape is ``shape``.
      shape: the shape ``x`` must broadcast to.

    Returns:
      ``None``.

    Raises:
      LossInputError: ``x`` does not broadcast to ``shape``, or broadcasting would make
        the result larger than ``shape``.

    >>> fits_shape('softmax_cross_entropy', 'labels', jnp.ones((4, 3)), 'logits', (2, 3))
    Traceback (most recent call last):
    ...
    functrain.losses.checks.LossInputError: softmax_cross_entropy: labels of shape (4, 3) does not broadcast to the shape of logits, (2, 3).
    """
    shape = tuple(shape)
    try:
        ok = np.broadcast_shapes(x.shape, shape) == shape
    except ValueError:
        ok = False
    if not ok:
        raise LossInputError(f"{owner}: {name} of shape {x.shape} does not broadcast to the "
                             f"shape of {ref_name}, {shape}.")


def axes(owner: str, axis: Axis, ndim: int, name: str = "axis") -> tuple:
    """``axis`` (an int, a sequence of ints, or ``None`` for all) as a tuple of non-negative
    ints, in the order given.

    Args:
      owner: the loss, for the message.
      axis: the argument.
      ndim: the number of dimensions of the array it indexes.
      name: the argument's name.

    Returns:
      A tuple of distinct ints in ``[0, ndim)``.

    Raises:
      LossInputError: an axis out of range, repeated, or not an int.

    >>> axes('kl_divergence', -1, 2), axes('kl_divergence', None, 2)
    ((1,), (0, 1))
    """
    if axis is None:
        return tuple(range(ndim))
    items = tuple(np.ravel(np.asarray(axis))) if not isinstance(axis, int) else (axis,)
    out = []
    for a in items:
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)):
            raise LossInputError(f"{owner}: {name} must be an int or a tuple of ints, got "
                                 f"{axis!r}.")
        if not -ndim <= int(a) < ndim:
            raise LossInputError(f"{owner}: {name}={axis!r} is out of range for an input with "
                                 f"{ndim} dimensions.")
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise LossInputError(f"{owner}: {name}={axis!r} names an axis twice.")
    return tuple(out)


def batch_shape(shape: tuple, reduced: tuple) -> tuple:
    """``shape`` without the axes in ``reduced``: the shape of a loss reduced over them.

    Args:
      shape: an array's shape.
      reduced: the axes (non-negative ints) reduced away.

    Returns:
      The remaining dimensions, in order.

    >>> batch_shape((2, 3, 4), (1,))
    (2, 4)
    """
    return tuple(d for i, d in enumerate(shape) if i not in reduced)


def where_mask(owner: str, where: Any, shape: tuple, reduced: tuple = (), *,
               per_example: bool = False) -> Optional[Array]:
    """A ``where`` argument as a boolean array that broadcasts to ``shape``.

    With ``per_example``, a mask of the loss's output shape (``shape`` without the
    ``reduced`` axes, one entry per example) is accepted too, and gets the ``reduced`` axes
    back as axes of length 1, so it masks whole examples.

    Args:
      owner: the loss, for the message.
      where: ``None`` or a boolean array.
      shape: the shape of the input it masks.
      reduced: the axes the loss reduces over.
      per_example: whether a mask of the output's shape is accepted.

    Returns:
      ``None`` (no mask) or a boolean ``jax.Array``.

    Raises:
      LossInputError: ``where`` is not boolean, or does not fit ``shape``.

    >>> where_mask('softmax_cross_entropy', jnp.array([True, False]), (2, 3), (1,),
    ...            per_example=True).shape
    (2, 1)
    """
    if where is None:
        return None
    where = _as_array(where)
    if where.dtype != jnp.bool_:
        raise LossInputError(f"{owner}: where must be a boolean array, got "
                             f"{_dtype_name(where)}.")
    out_shape = batch_shape(shape, reduced)
    if per_example and where.ndim == len(out_shape) and where.ndim < len(shape):
        try:
            fits = np.broadcast_shapes(where.shape, out_shape) == out_shape
        except ValueError:
            fits = False
        if fits:
            return jnp.expand_dims(where, reduced)
    try:
        ok = np.broadcast_shapes(where.shape, tuple(shape)) == tuple(shape)
    except ValueError:
        ok = False
    if not ok:
        also = f" or to the loss's shape {out_shape}" if per_example else ""
        raise LossInputError(f"{owner}: where of shape {where.shape} does not broadcast to the "
                             f"input's shape {tuple(shape)}{also}.")
    return where


def check_probabilities(owner: str, name: str, p: Array, flag: str) -> None:
    """For concrete ``p`` (not under ``jit``): raise unless it holds probabilities.

    Several classes on the last axis: each vector must sum to 1 (to numpy's ``allclose``
    defaults, rtol 1e-5, atol 1e-8). One channel: each entry must be in ``[0, 1]``.
    Traced values are not checked.

    Args:
      owner: the loss, for the message.
      name: the argument's name.
      p: the argument.
      flag: the argument that said ``p`` holds probabilities (``apply_softmax=False``).

    Returns:
      ``None``.

    Raises:
      LossInputError: ``p`` is concrete and not probabilities.

    >>> check_probabilities('dice_loss', 'predictions', jnp.array([[0.5, 0.6]]),
    ...                     'apply_softmax=False')
    Traceback (most recent call last):
    ...
    functrain.losses.checks.LossInputError: dice_loss: with apply_softmax=False, predictions must be valid probability distributions that sum to 1 over the class axis (the last); the sums range over [1.1, 1.1].
    """
    if isinstance(p, jax.core.Tracer) or p.size == 0:
        return
    values = np.asarray(p, dtype=np.float64)
    if p.shape[-1] == 1:
        low, high = float(values.min()), float(values.max())
        if low < 0 or high > 1:
            raise LossInputError(f"{owner}: with {flag}, {name} must hold probabilities in "
                                 f"[0, 1]; they range over [{low:.6g}, {high:.6g}].")
        return
    sums = values.sum(axis=-1)
    if not np.allclose(sums, 1.0):
        raise LossInputError(f"{owner}: with {flag}, {name} must be valid probability "
                             f"distributions that sum to 1 over the class axis (the last); "
                             f"the sums range over [{sums.min():.6g}, {sums.max():.6g}].")


def positive_number(owner: str, name: str, value: Any) -> None:
    """For a concrete ``value``: raise unless it is a number > 0 (traced values pass).

    Args:
      owner: the loss, for the message.
      name: the argument's name.
      value: the argument.

    Returns:
      ``None``.

    Raises:
      ZeroArgumentError: ``value`` is 0.
      LossInputError: ``value`` is concrete and negative or NaN.

    >>> positive_number('triplet_margin_loss', 'norm_degree', 0)
    Traceback (most recent call last):
    ...
    functrain.losses.checks.ZeroArgumentError: triplet_margin_loss: norm_degree must be > 0, got 0.
    """
    v = concrete_real(value)
    if v is not None and not v > 0:
        error = ZeroArgumentError if v == 0 else LossInputError
        raise error(f"{owner}: {name} must be > 0, got {value}.")
