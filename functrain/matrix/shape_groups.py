"""Same-shape groups: the leaves of a tree that one batched program can run as one stack.

SOAP, Shampoo and Kron compile one set of kernels per leaf they see: on a tree of many
leaves of a few shapes (a transformer's blocks, an unscanned model's layers), the
program, and its compile time, grow with the depth. Grouped, the leaves that share a key
(their shape, dtypes, dimension numbers and state layout) are stacked on a new leading
axis and run as ONE stacked leaf, through the optimizer's own stacked-layers path
(``weight_dimension_numbers``; :func:`functrain.matrix.dimension_numbers.stacked_view`),
so the program has one set of kernels per group; the state stays per leaf (stacked on the
way in, cut on the way out), so its layout, checkpoints and shardings do not change.

* :func:`shape_groups` groups leaf indices by key (:func:`group_key`; ``None``: a leaf
  left alone);
* :func:`stack_units` stacks per-leaf values (arrays, or tuples of them) per group,
  keeping unstacked the placeholders the stacked layout keeps unstacked;
* :func:`unstack_units` cuts per-group results back into per-leaf ones;
* :func:`leaf_order` maps entries (layers, blocks) listed group after group to their
  places in leaf order, where an optimizer draws per-leaf randomness in leaf order.

A group of one leaf is that leaf, unchanged: a tree without repeated shapes runs the
per-leaf program. The numbers are those of the per-leaf program to rounding (the same
formulas on the same operands, batched otherwise: ``tests/contrib/test_same_shape_groups.py``).

Measured (``benchmarks/grouped_compile.py``, results in
``benchmarks/results/matrix_optimizers.md``): grouped, the optimized program has 1.3-6x
fewer computations, but on XLA:CPU the compile is not shorter (and the step not reliably
faster). XLA:CPU compiles one kernel per *distinct* computation and reuses it for
identical ones; each leaf's new state (and update) is cut from its group's stack by a copy
kernel of its own (the offset is a constant of the kernel), so the grouped program has
about as many distinct kernels as the per-leaf one (SOAP, 64 layers: 290 against 219).
A state stored stacked per group would avoid the state's cuts but change its layout
(checkpoints, shardings). So the optimizers take ``group_same_shapes=False`` by default.
"""

from __future__ import annotations

from typing import Any, Hashable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp

Array = jax.Array

__all__ = ["ShapeGroups", "shape_groups", "group_key", "stack_units", "unstack_units",
           "leaf_order"]


class ShapeGroups(NamedTuple):
    """Leaves grouped by key (all static; :func:`shape_groups`).

    Attributes:
      units: per unit (a group, or a leaf alone), its leaves' indices, ascending; the
        units in the order of their first leaf.
      leaves: the number of leaves.

    >>> ShapeGroups(((0, 2), (1,)), 3).units[0]
    (0, 2)
    """

    units: tuple
    leaves: int


def shape_groups(keys: Sequence[Optional[Hashable]]) -> ShapeGroups:
    """The leaves grouped by ``keys``: equal keys one unit, ``None`` a unit of its own.

    Args:
      keys: per leaf, a hashable key (everything that decides the leaf's program: its
        shape, dtypes, dimension numbers, state shapes), or ``None`` for a leaf that is
        not grouped.

    Returns:
      A :class:`ShapeGroups`.

    >>> shape_groups([(4, 4), (3,), (4, 4), None, (3,), (4, 4)]).units
    ((0, 2, 5), (1, 4), (3,))
    """
    units: dict = {}
    for i, key in enumerate(keys):
        units.setdefault(("alone", i) if key is None else ("key", key), []).append(i)
    return ShapeGroups(tuple(tuple(m) for m in units.values()), len(keys))


def _stack(values: list, want: Optional[tuple], where: str) -> Array:
    shape = tuple(jnp.shape(values[0]))
    if want is None or tuple(want) == (len(values),) + shape:
        return jnp.stack(values)
    if tuple(want) == shape:  # a placeholder the stacked layout keeps as it is
        return values[0]
    raise ValueError(f"stack_units: {where} of shape {shape} can be neither stacked over "
                     f"{len(values)} leaves nor kept, to the wanted shape {tuple(want)}.")


def stack_units(groups: ShapeGroups, values: Sequence[Any],
                want: Optional[Sequence[Any]] = None) -> list:
    """Per unit, its leaves' values stacked on a new leading axis.

    Args:
      groups: the grouping.
      values: per leaf, an array, a tuple of arrays, or ``None`` (then the unit's value
        is ``None``).
      want: ``None`` (stack every array), or per unit the shapes the stacked layout
        has, like the values (a shape per array): an array is stacked where that is
        ``(n,) + its shape``, and the first leaf's is kept where it is its own shape (a
        placeholder), else a ``ValueError``. Read only for units of several leaves.

    Returns:
      A list with one value per unit: a unit of one leaf gets that leaf's value itself.

    >>> import jax.numpy as jnp
    >>> g = shape_groups([1, 1])
    >>> [[x.shape for x in v] for v in stack_units(g, [(jnp.ones((2, 2)), jnp.zeros((1, 1))),
    ...                                                 (jnp.ones((2, 2)), jnp.zeros((1, 1)))],
    ...                                             want=[((2, 2, 2), (1, 1))])]
    [[(2, 2, 2), (1, 1)]]
    """
    out = []
    for u, members in enumerate(groups.units):
        first = values[members[0]]
        if len(members) == 1 or first is None:
            out.append(first)
        elif isinstance(first, tuple):
            shapes = (None,) * len(first) if want is None else want[u]
            out.append(tuple(_stack([values[i][k] for i in members], shapes[k], f"entry {k}")
                             for k in range(len(first))))
        else:
            out.append(_stack([values[i] for i in members],
                              None if want is None else want[u], "a value"))
    return out


def _cut(x: Array, n: int, j: int, like: Any) -> Array:
    return x[j] if tuple(x.shape) == (n,) + tuple(jnp.shape(like)) else x


def unstack_units(groups: ShapeGroups, values: Sequence[Any], like: Sequence[Any]) -> list:
    """The inverse of :func:`stack_units`: per leaf, its slice of its unit's value.

    Args:
      groups: the grouping.
      values: per unit, an array or a tuple of arrays (as :func:`stack_units` gives).
      like: per leaf, a value of that leaf's shapes (its input): an array of the unit
        that is ``(n,) + that shape`` is cut, any other (a placeholder kept unstacked)
        is the leaf's as it is.

    Returns:
      A list with one value per leaf.

    >>> import jax.numpy as jnp
    >>> g = shape_groups([1, None, 1])
    >>> [x.tolist() for x in unstack_units(g, [jnp.array([[1.], [2.]]), jnp.zeros(1)],
    ...                                    [jnp.zeros(1)] * 3)]
    [[1.0], [0.0], [2.0]]
    """
    out: list = [None] * groups.leaves
    for value, members in zip(values, groups.units):
        n = len(members)
        for j, i in enumerate(members):
            if n == 1:
                out[i] = value
            elif isinstance(value, tuple):
                out[i] = tuple(_cut(x, n, j, y) for x, y in zip(value, like[i]))
            else:
                out[i] = _cut(value, n, j, like[i])
    return out


def leaf_order(groups: ShapeGroups, counts: Sequence[int]) -> list:
    """Where each entry listed unit after unit sits when listed leaf after leaf.

    Each unit holds ``counts[u]`` entries (layers, blocks), its leaves' in turn (the
    first leaf's ``counts[u] / n``, then the second's, ...); in leaf order every leaf's
    entries come together, the leaves in order.

    Args:
      groups: the grouping.
      counts: per unit, its number of entries (a multiple of its number of leaves).

    Returns:
      A list: for entry ``k`` in unit order, its index in leaf order.

    >>> leaf_order(shape_groups([1, None, 1]), [4, 3])  # leaves of 2, 3 and 2 entries
    [0, 1, 5, 6, 2, 3, 4]
    """
    per_leaf = [0] * groups.leaves
    for members, count in zip(groups.units, counts):
        if count % len(members):
            raise ValueError(f"leaf_order: a unit of {len(members)} leaves holds {count} "
                             f"entries, not a multiple.")
        for i in members:
            per_leaf[i] = count // len(members)
    starts, at = [], 0
    for c in per_leaf:
        starts.append(at)
        at += c
    out = []
    for members, count in zip(groups.units, counts):
        each = count // len(members)
        out += [starts[members[k // each]] + k % each for k in range(count)]
    return out


def group_key(leaf: Any, *related: Any, static: Hashable = ()) -> Optional[tuple]:
    """A leaf's grouping key: the shapes and dtypes of it and of ``related`` values, and
    ``static``; ``None`` (not grouped) for a scalar or empty leaf.

    Args:
      leaf: the leaf (an array).
      related: values whose shapes and dtypes the leaf's program also depends on (its
        parameter, its state: arrays, tuples of them, or ``None``).
      static: anything else hashable that decides the program (its layer view).

    Returns:
      A hashable tuple, or ``None``.

    >>> import jax.numpy as jnp
    >>> group_key(jnp.ones((2, 3)), None, (jnp.zeros((2, 2)),)) == group_key(
    ...     jnp.zeros((2, 3)), None, (jnp.ones((2, 2)),))
    True
    >>> group_key(jnp.ones(()), None) is None
    True
    """
    if jnp.ndim(leaf) == 0 or jnp.size(leaf) == 0:
        return None
    arrays = jax.tree_util.tree_leaves((leaf,) + related)
    return (tuple((tuple(jnp.shape(x)), jnp.result_type(x)) for x in arrays), static)
