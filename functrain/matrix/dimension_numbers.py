"""Which axes of a leaf are a matrix optimizer's matrix, and which are stacked layers.

A model run with ``jax.lax.scan`` over its layers keeps each kind of weight as one stacked
leaf, ``(layers, m, n)``. To Muon, SOAP, Shampoo and Kron such a leaf is ``layers``
separate ``(m, n)`` weights when given dimension numbers: a NamedTuple
``(reduction_axis, output_axis)``, :class:`functrain.contrib.MuonDimensionNumbers` (optax's
of the same fields works too). The reduction axes become one layer's rows, the output
axes its columns (each group multiplied together), and every other axis is a layer axis.

The one copy of that reading for SOAP, Shampoo and Kron (below the optimizers, so that each
of them can use it):

* :func:`check_dimension_numbers`: the builder's check of the argument (before any math).
* :func:`layer_views`: per leaf of a tree, its :class:`LayerView` (or ``None``: the
  optimizer's own treatment), from one value for every leaf, a tree of them (a prefix of
  the params; ``None`` entries) or a function of the params; each checked against its
  leaf, the errors naming the leaf's key path.
* :func:`to_layers` / :func:`from_layers`: a leaf as a stack ``(layers, rows, cols)`` of
  its layers, and back; :func:`stacked_shape`: per-layer state stacked over the layer axes.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from functrain import tree as ft

Array = jax.Array

__all__ = ["LayerView", "is_dimension_numbers", "check_dimension_numbers", "layer_view",
           "layer_views", "to_layers", "from_layers", "stacked_shape"]

_FIELDS = ("reduction_axis", "output_axis")


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


def is_dimension_numbers(x: Any) -> bool:
    """Whether ``x`` is dimension numbers: a NamedTuple ``(reduction_axis, output_axis)``.

    Args:
      x: anything.

    Returns:
      ``True`` for :class:`functrain.contrib.MuonDimensionNumbers` and any NamedTuple of
      the same fields (optax's), else ``False``.

    >>> from functrain.contrib import MuonDimensionNumbers
    >>> is_dimension_numbers(MuonDimensionNumbers(1, 2)), is_dimension_numbers((1, 2))
    (True, False)
    """
    return isinstance(x, tuple) and getattr(x, "_fields", None) == _FIELDS


def _is_spec_leaf(x: Any) -> bool:
    return x is None or isinstance(x, ft.MaskedNode) or is_dimension_numbers(x)


def _axes(axes: Any) -> Optional[tuple]:
    """``axes`` as a tuple of ints, or ``None`` if it is neither an int nor a sequence of them."""
    def is_int(a: Any) -> bool:
        return isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_))
    if is_int(axes):
        return (int(axes),)
    if isinstance(axes, (tuple, list)) and all(is_int(a) for a in axes):
        return tuple(int(a) for a in axes)
    return None


def _check_one(dims: Any, owner: str, name: str) -> None:
    if not is_dimension_numbers(dims) or any(_axes(a) is None for a in dims):
        raise TypeError(f"{owner}: {name} must hold MuonDimensionNumbers(reduction_axis, "
                        f"output_axis) of ints or sequences of ints (or None), got "
                        f"{type(dims).__name__} {dims!r:.60}.")


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
        if leaf is not None and not isinstance(leaf, ft.MaskedNode):
            _check_one(leaf, owner, name)


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
    _check_one(dims, owner, name)
    shape = tuple(int(d) for d in shape)
    ndim = len(shape)
    red, out = _axes(dims.reduction_axis), _axes(dims.output_axis)
    shown = f"MuonDimensionNumbers(reduction_axis={dims.reduction_axis!r}, " \
            f"output_axis={dims.output_axis!r})"
    for ax in red + out:
        if not -ndim <= ax < ndim:
            raise ValueError(f"{owner}: {name} {shown} names axis {ax}, but leaf {where} has "
                             f"shape {shape} ({ndim} axes).")
    red, out = tuple(a % ndim for a in red), tuple(a % ndim for a in out)
    if len(set(red + out)) != len(red + out):
        raise ValueError(f"{owner}: {name} {shown} repeats an axis for leaf {where} of shape "
                         f"{shape}: the reduction and output axes must be distinct.")
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
    resolved = spec(tree) if callable(spec) else spec
    if resolved is None or is_dimension_numbers(resolved):
        per_slot = [resolved] * len(slots)
    else:
        check_dimension_numbers(resolved, owner, name)
        spec_leaves, spec_def = jax.tree_util.tree_flatten(resolved, is_leaf=_is_spec_leaf)
        try:
            subtrees = spec_def.flatten_up_to(tree)
        except (ValueError, TypeError):
            shape_only = jax.tree_util.tree_map(lambda _: 0, resolved, is_leaf=_is_spec_leaf)
            ft.check_structure(shape_only, tree, "params", f"the {name} of {owner}",
                               prefix=True)
            raise ValueError(f"{owner}: {name} does not fit the params tree ({name}: "
                             f"{spec_def}; params: {jax.tree_util.tree_structure(tree)})."
                             ) from None
        per_slot = []
        for dims, sub in zip(spec_leaves, subtrees):
            dims = dims if is_dimension_numbers(dims) else None
            per_slot += [dims] * len(jax.tree_util.tree_leaves(sub, is_leaf=ft.is_placeholder))
    out = []
    for where, x, dims in zip(ft.key_paths(tree), slots, per_slot):
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

