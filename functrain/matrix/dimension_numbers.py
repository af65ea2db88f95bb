"""Which axes of a leaf form the matrix of a Muon-style optimizer, checked per leaf.

Dimension numbers (``functrain.contrib.MuonDimensionNumbers``, or optax's: any
NamedTuple with the fields ``reduction_axis`` and ``output_axis``) name a leaf's
reduction axes (contracted with the input) and output axes; every other axis is a
batch axis. Given as one value, a tree of them (``None`` for leaves left out) or a
function of the tree, they are resolved per leaf (:func:`dims_of_slots`,
:func:`dims_of_leaves`), checked against each leaf's shape with its key path in the
error (:func:`leaf_axes`), and turn a leaf into a ``(batch, rows, cols)`` stack
(:func:`matrix_view`). The one copy that :mod:`functrain.contrib.muon` and the Muon
family use.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import numpy as np

from functrain import tree as ft

__all__ = ["DIMS_FIELDS", "is_dims", "dims_key", "check_dims_type", "leaf_axes",
           "dims_of_slots", "dims_of_leaves", "MatrixView", "matrix_view"]

#: The fields of dimension numbers (``MuonDimensionNumbers``, optax's alike).
DIMS_FIELDS = ("reduction_axis", "output_axis")


def _axes_tuple(axes: Any) -> tuple:
    return (axes,) if isinstance(axes, (int, np.integer)) else tuple(axes)


def is_dims(x: Any) -> bool:
    """Whether ``x`` is dimension numbers: a NamedTuple with the fields :data:`DIMS_FIELDS`.

    Args:
      x: anything.

    Returns:
      ``True`` for functrain's or optax's ``MuonDimensionNumbers``.

    >>> from functrain.contrib import MuonDimensionNumbers
    >>> is_dims(MuonDimensionNumbers(0, 1)), is_dims((0, 1))
    (True, False)
    """
    return isinstance(x, tuple) and getattr(x, "_fields", None) == DIMS_FIELDS


def dims_key(dims: Any) -> tuple:
    """Dimension numbers as a hashable ``(reduction axes, output axes)`` pair of tuples.

    Args:
      dims: dimension numbers (see :func:`is_dims`).

    Returns:
      ``(tuple of reduction axes, tuple of output axes)``, as given (negative axes kept).

    >>> from functrain.contrib import MuonDimensionNumbers
    >>> dims_key(MuonDimensionNumbers((0, 1), -1))
    ((0, 1), (-1,))
    """
    return (_axes_tuple(dims.reduction_axis), _axes_tuple(dims.output_axis))


def check_dims_type(dims: Any, owner: str, name: str) -> None:
    """Raise ``TypeError`` unless each field of ``dims`` is an int or a sequence of ints.

    Args:
      dims: dimension numbers.
      owner: the function named in the error.
      name: the argument named in the error.

    Returns:
      ``None``.

    >>> from functrain.contrib import MuonDimensionNumbers
    >>> check_dims_type(MuonDimensionNumbers(0, 1.5), "muon", "dims")
    Traceback (most recent call last):
    ...
    TypeError: muon: dims must hold MuonDimensionNumbers of ints or sequences of ints, got MuonDimensionNumbers(reduction_axis=0, output_axis=1.5).
    """
    for axes in (dims.reduction_axis, dims.output_axis):
        ok = isinstance(axes, (int, np.integer)) or (
            isinstance(axes, (tuple, list)) and all(isinstance(a, (int, np.integer)) for a in axes))
        if not ok or isinstance(axes, bool):
            raise TypeError(f"{owner}: {name} must hold MuonDimensionNumbers of ints or sequences "
                            f"of ints, got {dims!r}.")


def leaf_axes(dims: Any, shape: tuple, where: str, owner: str) -> tuple[tuple, tuple]:
    """A leaf's reduction and output axes, non-negative, checked against its shape.

    Args:
      dims: dimension numbers.
      shape: the leaf's shape.
      where: the leaf, as named in an error (its key path).
      owner: the function named in an error.

    Returns:
      ``(reduction axes, output axes)``; ``ValueError`` naming ``where`` for a leaf of rank
      below 2, an axis out of range or an axis named twice.

    >>> from functrain.contrib import MuonDimensionNumbers
    >>> leaf_axes(MuonDimensionNumbers(-2, -1), (4, 3, 5), "['w']", "muon")
    ((1,), (2,))
    """
    ndim = len(shape)
    if ndim < 2:
        raise ValueError(f"{owner}: leaf {where} has shape {shape}, but Muon orthogonalizes "
                         f"matrices (rank >= 2). muon() sends such leaves to AdamW; with "
                         f"scale_by_muon leave them out with functrain.masked.")
    red, out = dims_key(dims)
    for ax in red + out:
        if not -ndim <= ax < ndim:
            raise ValueError(f"{owner}: {dims} names axis {ax}, but leaf {where} has shape "
                             f"{shape} ({ndim} axes).")
    red, out = tuple(a % ndim for a in red), tuple(a % ndim for a in out)
    if len(set(red + out)) != len(red + out):
        raise ValueError(f"{owner}: {dims} repeats an axis (the reduction and output axes "
                         f"must be distinct) for leaf {where} of shape {shape}.")
    return red, out


def _is_spec_leaf(x: Any) -> bool:
    return x is None or isinstance(x, ft.MaskedNode) or is_dims(x)


def dims_of_slots(spec: Any, tree: Any, owner: str, name: str) -> list:
    """One dimension numbers (or ``None``) per leaf slot of ``tree``, placeholders included.

    Args:
      spec: one value for every leaf, a tree of them (a prefix of ``tree``; ``None`` marks
        leaves left out), or a function of ``tree`` returning one.
      tree: the tree (updates or params).
      owner: the function named in an error.
      name: the argument named in an error.

    Returns:
      A list with one entry per leaf slot (``jax.tree_util.tree_leaves`` order, with
      ``functrain.tree`` placeholders counted).

    >>> import jax.numpy as jnp
    >>> from functrain.contrib import MuonDimensionNumbers
    >>> dims_of_slots({'w': MuonDimensionNumbers(), 'b': None},
    ...               {'w': jnp.ones((2, 3)), 'b': jnp.ones(3)}, "muon", "dims")
    [None, MuonDimensionNumbers(reduction_axis=0, output_axis=1)]
    """
    slots = jax.tree_util.tree_leaves(tree, is_leaf=ft.is_placeholder)
    resolved = spec(tree) if callable(spec) else spec
    if resolved is None or is_dims(resolved):
        if resolved is not None:
            check_dims_type(resolved, owner, name)
        return [resolved] * len(slots)
    spec_leaves, spec_def = jax.tree_util.tree_flatten(resolved, is_leaf=_is_spec_leaf)
    try:
        subtrees = spec_def.flatten_up_to(tree)
    except (ValueError, TypeError):
        ft.check_structure(resolved, tree, "params", f"the {name} of {owner}", prefix=True)
        raise ValueError(f"{owner}: {name} does not fit the params tree ({name}: {spec_def}; "
                         f"params: {jax.tree_util.tree_structure(tree)}).") from None
    out = []
    for dims, sub in zip(spec_leaves, subtrees):
        if not _is_spec_leaf(dims):
            raise TypeError(f"{owner}: {name} must hold MuonDimensionNumbers or None, got "
                            f"{type(dims).__name__} {dims!r:.40}.")
        if is_dims(dims):
            check_dims_type(dims, owner, name)
        else:
            dims = None
        out.extend([dims] * len(jax.tree_util.tree_leaves(sub, is_leaf=ft.is_placeholder)))
    return out


def dims_of_leaves(spec: Any, tree: Any, owner: str, name: str) -> list:
    """Per array leaf of ``tree`` (placeholders skipped): its dimension numbers, checked.

    Args:
      spec: as :func:`dims_of_slots`'s.
      tree: the tree.
      owner: the function named in an error.
      name: the argument named in an error.

    Returns:
      A list with one dimension numbers per array leaf; ``ValueError`` naming the leaf's
      key path where ``spec`` gives none or they do not fit its shape.

    >>> import jax.numpy as jnp
    >>> from functrain.contrib import MuonDimensionNumbers
    >>> dims_of_leaves(MuonDimensionNumbers(), {'w': jnp.ones(3)}, "muon", "dims")
    Traceback (most recent call last):
    ...
    ValueError: muon: leaf ['w'] has shape (3,), but Muon orthogonalizes matrices (rank >= 2). muon() sends such leaves to AdamW; with scale_by_muon leave them out with functrain.masked.
    """
    dims = dims_of_slots(spec, tree, owner, name)
    paths = ft.key_paths(tree)
    slots = jax.tree_util.tree_leaves(tree, is_leaf=ft.is_placeholder)
    out = []
    for path, x, d in zip(paths, slots, dims):
        if ft.is_placeholder(x):
            continue
        if d is None:
            raise ValueError(f"{owner}: {name} gives no MuonDimensionNumbers for leaf {path}: "
                             f"scale_by_muon orthogonalizes every leaf it sees (muon() sends "
                             f"such leaves to AdamW).")
        leaf_axes(d, np.shape(x), path, owner)
        out.append(d)
    return out


class MatrixView(NamedTuple):
    """How one leaf is seen as a stack of matrices (all static; :func:`matrix_view`).

    Attributes:
      perm: the transpose: batch axes, then reduction axes, then output axes.
      sizes: ``(batch, rows, cols)`` after the transpose, the reshape.
      swapped: ``rows > cols``: Newton-Schulz runs on the transpose.

    >>> MatrixView((0, 1), (1, 4, 3), True).swapped
    True
    """

    perm: tuple
    sizes: tuple
    swapped: bool


def matrix_view(shape: tuple, red: tuple, out: tuple) -> MatrixView:
    """The transpose and reshape that make a leaf a ``(batch, rows, cols)`` stack.

    Args:
      shape: the leaf's shape.
      red: its reduction axes, non-negative (:func:`leaf_axes`).
      out: its output axes, non-negative.

    Returns:
      A :class:`MatrixView`.

    >>> matrix_view((3, 3, 8, 16), (0, 1, 2), (3,))
    MatrixView(perm=(0, 1, 2, 3), sizes=(1, 72, 16), swapped=True)
    """
    batch = tuple(a for a in range(len(shape)) if a not in red + out)
    perm = batch + red + out
    sizes = tuple(math.prod(shape[a] for a in axes) for axes in (batch, red, out))
    return MatrixView(perm, sizes, sizes[1] > sizes[2])
