"""Dimension numbers: which axes of a leaf are a matrix optimizer's matrix, which are
stacked layers; the one copy for Muon and its family, SOAP, Shampoo and Kron.

Dimension numbers (``functrain.contrib.MuonDimensionNumbers``, or optax's: any NamedTuple
with the fields ``reduction_axis`` and ``output_axis``) name a leaf's reduction axes
(contracted with the input: one layer's rows) and output axes (its columns); every other
axis is a batch axis, e.g. the layer axis of a model run with ``jax.lax.scan`` over its
layers, whose stacked ``(layers, m, n)`` leaf is then ``layers`` separate ``(m, n)``
weights. Given as one value, a tree of them (``None`` for leaves left out) or a function of
the tree, they are:

* checked when the builder is called (:func:`check_dims_type`, :func:`check_dimension_numbers`);
* resolved per leaf (:func:`dims_of_slots`, :func:`dims_of_leaves`, :func:`layer_views`) and
  checked against each leaf's shape, the error naming its key path (:func:`leaf_axes`,
  :func:`layer_view`);
* turned into a ``(batch, rows, cols)`` stack: Muon's :func:`matrix_view` (rows <= cols
  after an optional transpose), or SOAP's, Shampoo's and Kron's :func:`to_layers` /
  :func:`from_layers` with per-layer state stacked over the layer axes
  (:func:`stacked_shape`); :func:`stacked_view` is the view of same-shape leaves stacked
  on a new leading axis (``functrain.matrix.shape_groups``).
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from functrain import tree as ft

Array = jax.Array

__all__ = ["MuonDimensionNumbers", "DIMS_FIELDS", "is_dims", "dims_key", "check_dims_type", "check_dimension_numbers",
           "leaf_axes", "dims_of_slots", "entries_per_slot", "dims_of_leaves", "MatrixView",
           "matrix_view", "LayerView", "layer_view", "layer_views", "to_layers", "from_layers",
           "stacked_shape", "stacked_view"]

#: The fields of dimension numbers (``MuonDimensionNumbers``, optax's alike).
DIMS_FIELDS = ("reduction_axis", "output_axis")


class MuonDimensionNumbers(NamedTuple):
    """Which axes of a weight form the matrix Muon orthogonalizes.

    A weight used as ``x @ W = y`` contracts its reduction axes with the input
    and produces its output axes: the matrix is (product of the reduction
    axes' sizes) x (product of the output axes' sizes). Every other axis is a
    batch axis: each of its entries is a separate matrix, orthogonalized
    independently (scan-stacked layers ``(L, m, n)``: ``MuonDimensionNumbers(-2,
    -1)`` treats the ``L`` layers apart). Negative axes count from the end.
    A conv kernel ``(kh, kw, cin, cout)`` is ``MuonDimensionNumbers((0, 1, 2), 3)``.

    Attributes:
      reduction_axis: an axis or a sequence of axes (default 0).
      output_axis: an axis or a sequence of axes (default 1).

    >>> MuonDimensionNumbers((0, 1, 2), 3)
    MuonDimensionNumbers(reduction_axis=(0, 1, 2), output_axis=3)
    """

    reduction_axis: Union[Sequence[int], int] = 0
    output_axis: Union[Sequence[int], int] = 1


def _axes(axes: Any) -> Optional[tuple]:
    """``axes`` as a tuple of ints, or ``None`` if it is neither an int nor a sequence of them."""
    def is_int(a: Any) -> bool:
        return isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_))
    if is_int(axes):
        return (int(axes),)
    if isinstance(axes, (tuple, list)) and all(is_int(a) for a in axes):
        return tuple(int(a) for a in axes)
    return None


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
      dims: dimension numbers (see :func:`is_dims`), checked (:func:`check_dims_type`).

    Returns:
      ``(tuple of reduction axes, tuple of output axes)``, as given (negative axes kept).

    >>> from functrain.contrib import MuonDimensionNumbers
    >>> dims_key(MuonDimensionNumbers((0, 1), -1))
    ((0, 1), (-1,))
    """
    return (_axes(dims.reduction_axis), _axes(dims.output_axis))


def check_dims_type(dims: Any, owner: str, name: str) -> None:
    """Raise ``TypeError`` unless ``dims`` is dimension numbers whose fields are each an int
    or a sequence of ints.

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
    TypeError: muon: dims must hold MuonDimensionNumbers(reduction_axis, output_axis) of ints or sequences of ints (or None), got MuonDimensionNumbers MuonDimensionNumbers(reduction_axis=0, output_axis=1.5).
    """
    if not is_dims(dims) or any(_axes(a) is None for a in dims):
        raise TypeError(f"{owner}: {name} must hold MuonDimensionNumbers(reduction_axis, "
                        f"output_axis) of ints or sequences of ints (or None), got "
                        f"{type(dims).__name__} {dims!r:.80}.")


def _is_spec_leaf(x: Any) -> bool:
    return ft.is_placeholder(x) or is_dims(x)


def check_dimension_numbers(spec: Any, owner: str, name: str = "weight_dimension_numbers"
                            ) -> None:
    """Raise a ``TypeError`` naming ``name`` unless ``spec`` is valid dimension numbers.

    Args:
      spec: ``None``, one dimension-numbers value, a pytree of them (``None`` entries
        allowed) or a function of the params (checked when called, per leaf).
      owner: the transformation's name, for the message.
      name: the argument's name, for the message.

    Returns:
      ``None``.

    >>> check_dimension_numbers((1, 2), "scale_by_soap")
    Traceback (most recent call last):
    ...
    TypeError: scale_by_soap: weight_dimension_numbers must hold MuonDimensionNumbers(reduction_axis, output_axis) of ints or sequences of ints (or None), got int 1.
    """
    if spec is None or callable(spec):
        return
    for leaf in jax.tree_util.tree_leaves(spec, is_leaf=_is_spec_leaf):
        if not ft.is_placeholder(leaf):
            check_dims_type(leaf, owner, name)


def _checked_axes(dims: Any, shape: tuple, where: str, owner: str, name: str
                  ) -> tuple[tuple, tuple]:
    """``dims``' reduction and output axes for a leaf of ``shape``, non-negative, or a
    ``ValueError`` naming the leaf ``where`` (an axis out of range, or named twice)."""
    check_dims_type(dims, owner, name)
    ndim = len(shape)
    red, out = dims_key(dims)
    shown = (f"MuonDimensionNumbers(reduction_axis={dims.reduction_axis!r}, "
             f"output_axis={dims.output_axis!r})")
    for ax in red + out:
        if not -ndim <= ax < ndim:
            raise ValueError(f"{owner}: {name} {shown} names axis {ax}, but leaf {where} has "
                             f"shape {shape} ({ndim} axes).")
    red, out = tuple(a % ndim for a in red), tuple(a % ndim for a in out)
    if len(set(red + out)) != len(red + out):
        raise ValueError(f"{owner}: {name} {shown} repeats an axis for leaf {where} of shape "
                         f"{shape}: the reduction and output axes must be distinct.")
    return red, out


def leaf_axes(dims: Any, shape: tuple, where: str, owner: str,
              name: str = "weight_dimension_numbers") -> tuple[tuple, tuple]:
    """A Muon leaf's reduction and output axes, non-negative, checked against its shape.

    Args:
      dims: dimension numbers.
      shape: the leaf's shape.
      where: the leaf, as named in an error (its key path).
      owner: the function named in an error.
      name: the argument named in an error.

    Returns:
      ``(reduction axes, output axes)``; ``ValueError`` naming ``where`` for a leaf of rank
      below 2, an axis out of range or an axis named twice.

    >>> from functrain.contrib import MuonDimensionNumbers
    >>> leaf_axes(MuonDimensionNumbers(-2, -1), (4, 3, 5), "['w']", "muon")
    ((1,), (2,))
    """
    shape = tuple(int(d) for d in shape)
    if len(shape) < 2:
        raise ValueError(f"{owner}: leaf {where} has shape {shape}, but Muon orthogonalizes "
                         f"matrices (rank >= 2). muon() sends such leaves to AdamW; with "
                         f"scale_by_muon leave them out with functrain.masked.")
    return _checked_axes(dims, shape, where, owner, name)


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
    check_dimension_numbers(resolved, owner, name)
    return [d if is_dims(d) else None
            for d in entries_per_slot(resolved, tree, _is_spec_leaf, owner, name)]


def entries_per_slot(spec: Any, tree: Any, is_entry: Callable[[Any], bool], owner: str,
                     name: str) -> list:
    """A tree prefix of ``tree`` whose leaves are entries (``is_entry``), one entry per slot.

    Each entry of ``spec`` covers every leaf slot (placeholders counted) of the subtree of
    ``tree`` it stands over.

    Args:
      spec: one entry, or a tree prefix of ``tree`` of entries.
      tree: the tree (updates or params).
      is_entry: what counts as an entry (a leaf of ``spec``).
      owner: the function named in an error.
      name: the argument named in an error.

    Returns:
      A list with one entry per leaf slot of ``tree``; ``ValueError`` naming the key paths
      where ``spec`` is not a prefix of ``tree``.

    >>> entries_per_slot({'w': 'a', 'b': 'b'}, {'w': (1, 2), 'b': 3},
    ...                  lambda x: isinstance(x, str), "scion", "norms")
    ['b', 'a', 'a']
    """
    entries, spec_def = jax.tree_util.tree_flatten(spec, is_leaf=is_entry)
    try:
        subtrees = spec_def.flatten_up_to(tree)
    except (ValueError, TypeError):
        shape_only = jax.tree_util.tree_map(lambda _: 0, spec, is_leaf=is_entry)
        ft.check_structure(shape_only, tree, "params", f"the {name} of {owner}", prefix=True)
        raise ValueError(f"{owner}: {name} does not fit the params tree ({name}: {spec_def}; "
                         f"params: {jax.tree_util.tree_structure(tree)}).") from None
    out = []
    for entry, sub in zip(entries, subtrees):
        out.extend([entry] * len(jax.tree_util.tree_leaves(sub, is_leaf=ft.is_placeholder)))
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


class LayerView(NamedTuple):
    """How one leaf is seen as a stack of layers (all static).

    Attributes:
      shape: the leaf's shape.
      perm: its axes in the order layer axes, reduction axes, output axes.
      layers: the sizes of the layer axes (``()``: a single layer).
      layer_shape: one layer as the optimizer sees it: ``(rows, cols)``, the products of
        the reduction axes' and of the output axes' sizes; a group with no axes is left
        out (``(cols,)``: stacked vectors such as a scanned model's biases).

    >>> from functrain.contrib import MuonDimensionNumbers
    >>> layer_view(MuonDimensionNumbers(-2, -1), (4, 3, 5), "['w']", "scale_by_soap")
    LayerView(shape=(4, 3, 5), perm=(0, 1, 2), layers=(4,), layer_shape=(3, 5))
    """

    shape: tuple
    perm: tuple
    layers: tuple
    layer_shape: tuple


def layer_view(dims: Any, shape: tuple, where: str, owner: str,
               name: str = "weight_dimension_numbers") -> LayerView:
    """The :class:`LayerView` of a leaf of ``shape`` under ``dims``, or a ``ValueError``.

    Args:
      dims: dimension numbers ``(reduction_axis, output_axis)``; each an axis or a
        sequence of axes, negative ones counted from the end.
      shape: the leaf's shape.
      where: the leaf's key path, for the message.
      owner: the transformation's name, for the message.
      name: the argument's name, for the message.

    Returns:
      The leaf's layer view.

    >>> from functrain.contrib import MuonDimensionNumbers
    >>> layer_view(MuonDimensionNumbers((1, 2), 3), (2, 3, 3, 8), "['conv']", "kron").layer_shape
    (9, 8)
    >>> layer_view(MuonDimensionNumbers(0, 3), (2, 3), "['w']", "kron")
    Traceback (most recent call last):
    ...
    ValueError: kron: weight_dimension_numbers MuonDimensionNumbers(reduction_axis=0, output_axis=3) names axis 3, but leaf ['w'] has shape (2, 3) (2 axes).
    """
    shape = tuple(int(d) for d in shape)
    ndim = len(shape)
    red, out = _checked_axes(dims, shape, where, owner, name)
    layers = tuple(a for a in range(ndim) if a not in red + out)
    layer_shape = tuple(math.prod(shape[a] for a in group) for group in (red, out) if group)
    return LayerView(shape, layers + red + out, tuple(shape[a] for a in layers), layer_shape)


def layer_views(spec: Any, tree: Any, owner: str, name: str = "weight_dimension_numbers"
                ) -> list:
    """Per array leaf of ``tree`` (placeholders skipped): its :class:`LayerView` or ``None``.

    Args:
      spec: ``None`` (every leaf ``None``), one dimension-numbers value for every leaf, a
        tree of them (a prefix of ``tree``; ``None`` marks leaves the optimizer treats
        as it does without dimension numbers), or a function of ``tree`` giving either.
      tree: the params (or updates) tree; ``None`` and ``MaskedNode`` entries are
        placeholders.
      owner: the transformation's name, for the messages.
      name: the argument's name, for the messages.

    Returns:
      A list, in ``jax.tree_util.tree_leaves`` order of ``tree``'s arrays.

    >>> import jax.numpy as jnp, functrain
    >>> dims = {'w': functrain.contrib.MuonDimensionNumbers(-2, -1), 'b': None}
    >>> params = {'w': jnp.zeros((4, 2, 3)), 'b': jnp.zeros(3)}
    >>> [v and v.layers for v in layer_views(dims, params, "soap")]
    [None, (4,)]
    """
    slots = jax.tree_util.tree_leaves(tree, is_leaf=ft.is_placeholder)
    out = []
    for where, x, dims in zip(ft.key_paths(tree), slots,
                              dims_of_slots(spec, tree, owner, name)):
        if not ft.is_placeholder(x):
            out.append(None if dims is None else
                       layer_view(dims, tuple(np.shape(x)), where or "<root>", owner, name))
    return out


def to_layers(x: Array, view: LayerView) -> Array:
    """The leaf ``x`` as a stack of its layers: ``(prod(view.layers),) + view.layer_shape``.

    Args:
      x: an array of shape ``view.shape``.
      view: its :class:`LayerView`.

    Returns:
      The layers, in row-major order over the layer axes.

    >>> import jax.numpy as jnp
    >>> from functrain.contrib import MuonDimensionNumbers
    >>> x = jnp.arange(12.).reshape(2, 3, 2)
    >>> v = layer_view(MuonDimensionNumbers(0, 2), x.shape, "x", "demo")  # axis 1 holds the layers
    >>> bool((to_layers(x, v)[1] == x[:, 1, :]).all())
    True
    """
    if view.perm != tuple(range(len(view.perm))):
        x = jnp.transpose(x, view.perm)
    return x.reshape((math.prod(view.layers),) + view.layer_shape)


def from_layers(stack: Array, view: LayerView) -> Array:
    """The inverse of :func:`to_layers`: a stack of layers back in the leaf's shape.

    Args:
      stack: an array ``(prod(view.layers),) + view.layer_shape``.
      view: the leaf's :class:`LayerView`.

    Returns:
      An array of shape ``view.shape``.

    >>> import jax.numpy as jnp
    >>> from functrain.contrib import MuonDimensionNumbers
    >>> x = jnp.arange(24.).reshape(2, 3, 4)
    >>> v = layer_view(MuonDimensionNumbers(2, 0), x.shape, "x", "demo")
    >>> bool((from_layers(to_layers(x, v), v) == x).all())
    True
    """
    x = stack.reshape(tuple(view.shape[a] for a in view.perm))
    if view.perm != tuple(range(len(view.perm))):
        x = jnp.transpose(x, np.argsort(view.perm))
    return x


def stacked_shape(view: Optional[LayerView], shape: tuple) -> tuple:
    """The shape of per-layer state ``shape`` stacked over ``view``'s layer axes.

    Args:
      view: the leaf's :class:`LayerView`, or ``None`` (no layers: ``shape`` itself).
      shape: one layer's state's shape.

    Returns:
      ``view.layers + shape``.

    >>> from functrain.contrib import MuonDimensionNumbers
    >>> stacked_shape(layer_view(MuonDimensionNumbers(-2, -1), (4, 3, 5), "w", "demo"), (3, 3))
    (4, 3, 3)
    """
    return tuple(shape) if view is None else tuple(view.layers) + tuple(shape)



def stacked_view(view: Optional[LayerView], shape: tuple, n: int,
                 whole: Optional[tuple] = None) -> Optional[LayerView]:
    """The :class:`LayerView` of ``n`` leaves of ``shape`` stacked on a new leading axis.

    Each stacked leaf is seen as it was: through its own ``view`` (its layers become
    layers of the stack, after the new axis), or, with ``view=None``, whole: its layer
    shape is ``whole`` (by default its own shape, of any rank), which the optimizer cuts
    as it cuts such a leaf. A leaf seen this way runs the same math as that leaf alone
    (``functrain.matrix.shape_groups``).

    Args:
      view: the leaves' common :class:`LayerView`, or ``None``.
      shape: one leaf's shape.
      n: the number of leaves.
      whole: with ``view=None``, the shape the optimizer sees a leaf as, a reshape of
        ``shape`` (Shampoo's ``(prod(shape[:-1]), shape[-1])``); ``None``: ``shape``.

    Returns:
      A view of an array ``(n,) + shape``: layers ``(n,) + view.layers``; for ``n == 1``,
      ``view`` itself (one leaf is not stacked).

    >>> stacked_view(None, (3, 4, 5), 2)
    LayerView(shape=(2, 3, 4, 5), perm=(0, 1, 2, 3), layers=(2,), layer_shape=(3, 4, 5))
    >>> stacked_view(None, (3, 4, 5), 2, whole=(12, 5)).layer_shape
    (12, 5)
    >>> from functrain.contrib import MuonDimensionNumbers
    >>> stacked_view(layer_view(MuonDimensionNumbers(0, 2), (4, 3, 5), "w", "demo"),
    ...              (4, 3, 5), 2).perm
    (0, 2, 1, 3)
    """
    shape = tuple(int(d) for d in shape)
    if n == 1:
        return view
    if view is None:
        return LayerView((n,) + shape, tuple(range(len(shape) + 1)), (n,),
                         shape if whole is None else tuple(int(d) for d in whole))
    return LayerView((n,) + tuple(view.shape), (0,) + tuple(a + 1 for a in view.perm),
                     (n,) + tuple(view.layers), tuple(view.layer_shape))
