"""How the matrix optimizers cut a leaf: merging small axes, splitting long ones into blocks.

The one copy of the rules that :mod:`functrain.families.preconditioned.shampoo`,
:mod:`functrain.families.preconditioned.soap` and :mod:`functrain.families.preconditioned.kron` share (also importable
under its former name ``functrain.contrib.partition``):

* :func:`merged_shape` multiplies neighbouring axes together while the product
  stays ``<= max_dim`` (SOAP's ``merge_dims`` rule; Kron's with
  ``merge_dims=True``). Shampoo's matrix view ``(prod(shape[:-1]),
  shape[-1])`` is its own fixed merge.
* :func:`block_grid` splits each axis longer than ``block_size`` into ``k =
  ceil(d / block_size)`` blocks of ``b = ceil(d / k)`` (the last one ``d -
  (k - 1) b`` long): Shampoo's rule, used by all three with ``block_size``.
* :func:`to_blocks` / :func:`from_blocks` put a leaf's blocks on a leading
  axis, in row-major order over the grid, zero-padded to whole blocks, and back.
* :func:`block_groups`, :func:`gather_blocks` and :func:`scatter_blocks` give
  the blocks without padding, grouped by shape (an axis split unevenly gives a
  shorter last block): SOAP and Kron precondition each block as a separate
  leaf of its own shape.
* :func:`to_layer_blocks`, :func:`from_layer_blocks` and :func:`layer_block_groups` do
  the same for a stack of layers ``(layers,) + shape`` (a scanned model's stacked
  weight, ``functrain.matrix.dimension_numbers``): every layer cut alike, its
  blocks layer after layer on one leading axis.
* :func:`map_by_shape` runs a decomposition over many stacks of blocks (or leaves),
  one :func:`functrain.linalg.map_matrices` call per matrix shape.
"""

from __future__ import annotations

import itertools
import math
import numbers
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from functrain.linalg import map_matrices

Array = jax.Array

__all__ = ["check_block_size", "merged_shape", "block_grid", "to_blocks", "from_blocks",
           "block_groups", "gather_blocks", "scatter_blocks", "to_layer_blocks",
           "from_layer_blocks", "layer_block_groups", "map_by_shape"]


def check_block_size(owner: str, block_size: Any) -> Optional[int]:
    """``block_size`` as an ``int`` (or ``None``), or a ``ValueError`` naming it.

    Args:
      owner: the transformation's name, for the message.
      block_size: ``None`` (no blocks) or an integer ``>= 1``. It decides the
        state's shapes, so it cannot be traced.

    Returns:
      ``None`` or ``int(block_size)``.

    >>> check_block_size("scale_by_soap", 128)
    128
    >>> check_block_size("scale_by_soap", 0)
    Traceback (most recent call last):
    ...
    ValueError: scale_by_soap: block_size must be None or an integer >= 1 (it sets the state's shapes, so it cannot be traced), got 0.
    """
    if block_size is None:
        return None
    if isinstance(block_size, (bool, np.bool_)) or not isinstance(block_size, numbers.Integral) \
            or block_size < 1:
        raise ValueError(f"{owner}: block_size must be None or an integer >= 1 (it sets the "
                         f"state's shapes, so it cannot be traced), got {block_size!r}.")
    return int(block_size)


def merged_shape(shape: Sequence[int], max_dim: int) -> tuple[int, ...]:
    """Neighbouring axes multiplied together while the product stays ``<= max_dim``.

    Axes are taken left to right into a running product; an axis that would
    take it above ``max_dim`` starts a new one (an axis longer than
    ``max_dim`` stands alone). Leaves with fewer than two axes, or no
    entries, are returned unchanged. Axes of size 1 disappear into their
    neighbours.

    Args:
      shape: the leaf's shape.
      max_dim: the largest merged axis.

    Returns:
      The merged shape (the product of its axes is ``shape``'s).

    >>> merged_shape((4, 4, 64), 256)
    (16, 64)
    >>> merged_shape((3, 300, 2), 256)
    (3, 300, 2)
    >>> merged_shape((2, 2, 6), 4)
    (4, 6)
    """
    shape = tuple(int(d) for d in shape)
    if len(shape) < 2 or math.prod(shape) == 0:
        return shape
    out, run = [], 1
    for d in shape:
        if run * d <= max_dim:
            run *= d
        elif run > 1:
            out.append(run)
            run = d
        else:
            out.append(d)
    if run > 1 or not out:
        out.append(run)
    return tuple(out)


def block_grid(shape: Sequence[int], block_size: Optional[int],
               split: Optional[Sequence[bool]] = None) -> tuple[tuple[int, int], ...]:
    """Per axis, ``(k, b)``: the axis cut into ``k`` blocks of ``b`` (the last one shorter).

    An axis longer than ``block_size`` (and marked in ``split``) gets ``k =
    ceil(d / block_size)`` blocks of ``b = ceil(d / k) <= block_size``; any
    other axis is one block, ``(1, d)``.

    Args:
      shape: the (merged) shape to cut.
      block_size: the longest block; ``None``: no blocks.
      split: per axis, whether it may be split; ``None``: every axis.

    Returns:
      A tuple of ``(k, b)`` pairs, one per axis.

    >>> block_grid((256, 300, 5), 128)
    ((2, 128), (3, 100), (1, 5))
    >>> block_grid((130, 129), 128, split=(True, False))
    ((2, 65), (1, 129))
    """
    split = (True,) * len(shape) if split is None else tuple(split)
    grid = []
    for d, on in zip(shape, split):
        if not on or block_size is None or d <= block_size:
            grid.append((1, int(d)))
        else:
            k = -(-d // block_size)
            grid.append((k, -(-d // k)))
    return tuple(grid)


def to_blocks(x: Array, grid: Sequence[tuple[int, int]]) -> Array:
    """``x``'s blocks on a leading axis, row-major over the grid, zero-padded to whole blocks.

    Args:
      x: an array of ``len(grid)`` axes.
      grid: :func:`block_grid` of ``x.shape``.

    Returns:
      An array ``(k_1 * ... * k_n, b_1, ..., b_n)``.

    >>> import jax.numpy as jnp
    >>> x = jnp.arange(12.).reshape(3, 4)
    >>> print(to_blocks(x, block_grid(x.shape, 2)))
    [[[ 0.  1.]
      [ 4.  5.]]
    <BLANKLINE>
     [[ 2.  3.]
      [ 6.  7.]]
    <BLANKLINE>
     [[ 8.  9.]
      [ 0.  0.]]
    <BLANKLINE>
     [[10. 11.]
      [ 0.  0.]]]
    """
    n = len(grid)
    pads = [(0, k * b - d) for (k, b), d in zip(grid, x.shape)]
    if any(p for _, p in pads):
        x = jnp.pad(x, pads)
    x = x.reshape([s for k, b in grid for s in (k, b)])
    x = x.transpose([2 * i for i in range(n)] + [2 * i + 1 for i in range(n)])
    return x.reshape((math.prod(k for k, _ in grid),) + tuple(b for _, b in grid))


def from_blocks(blocks: Array, shape: Sequence[int], grid: Sequence[tuple[int, int]]) -> Array:
    """The inverse of :func:`to_blocks`: the blocks put back, the padding cut off.

    Args:
      blocks: an array ``(k_1 * ... * k_n, b_1, ..., b_n)``.
      shape: the shape of the array the blocks were cut from.
      grid: :func:`block_grid` of ``shape``.

    Returns:
      An array of ``shape``.

    >>> import jax.numpy as jnp
    >>> x = jnp.arange(12.).reshape(3, 4)
    >>> grid = block_grid(x.shape, 2)
    >>> bool((from_blocks(to_blocks(x, grid), x.shape, grid) == x).all())
    True
    """
    n = len(grid)
    x = blocks.reshape(tuple(k for k, _ in grid) + tuple(b for _, b in grid))
    x = x.transpose([j for i in range(n) for j in (i, n + i)])
    x = x.reshape(tuple(k * b for k, b in grid))
    if tuple(x.shape) != tuple(shape):
        x = x[tuple(slice(0, d) for d in shape)]
    return x


def block_groups(shape: Sequence[int], grid: Sequence[tuple[int, int]]
                 ) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """The blocks of ``shape`` grouped by their own (unpadded) shape.

    Along an axis of ``k`` blocks of ``b``, the first ``k - 1`` are ``b`` long
    and the last ``d - (k - 1) b``; so a leaf has at most ``2**n`` block shapes.

    Args:
      shape: the (merged) shape that was cut.
      grid: :func:`block_grid` of ``shape``.

    Returns:
      ``(block_shape, indices)`` pairs, the indices (ascending) into
      :func:`to_blocks`'s leading axis; the full-size group first.

    >>> [(s, i.tolist()) for s, i in block_groups((5, 4), block_grid((5, 4), 3))]
    [((3, 2), [0, 1]), ((2, 2), [2, 3])]
    """
    per_axis = []
    for d, (k, b) in zip(shape, grid):
        last = d - (k - 1) * b
        parts = [(b, list(range(k)))] if last == b else [(b, list(range(k - 1))), (last, [k - 1])]
        per_axis.append([p for p in parts if p[1]])
    ks = [k for k, _ in grid]
    out = []
    for choice in itertools.product(*per_axis):
        idx = np.ravel_multi_index(np.meshgrid(*[c[1] for c in choice], indexing="ij"), ks)
        out.append((tuple(c[0] for c in choice), np.sort(idx.reshape(-1))))
    return out


def _is_whole(stack: Array, idx: np.ndarray, sub: Sequence[int]) -> bool:
    lead = stack.ndim - len(sub)
    return (len(idx) == stack.shape[0] and bool(np.all(idx == np.arange(len(idx))))
            and tuple(stack.shape[lead:]) == tuple(sub))


def gather_blocks(stack: Array, idx: np.ndarray, sub: Sequence[int]) -> Array:
    """The entries ``idx`` of a stack, each cut to its leading ``sub`` corner.

    Args:
      stack: an array ``(K, ...)`` (blocks from :func:`to_blocks`, or per-block
        state such as ``(K, b, b)`` statistics).
      idx: indices into the leading axis (a :func:`block_groups` group).
      sub: the shape to keep of the trailing ``len(sub)`` axes, from the start.

    Returns:
      An array ``(len(idx),) + middle axes + sub``; ``stack`` itself when it is
      already that.

    >>> import jax.numpy as jnp, numpy as np
    >>> print(gather_blocks(jnp.arange(8.).reshape(2, 2, 2), np.array([1]), (1, 2)))
    [[[4. 5.]]]
    """
    if _is_whole(stack, idx, sub):
        return stack
    lead = stack.ndim - len(sub)
    out = stack[jnp.asarray(idx)]
    return out[(slice(None),) * lead + tuple(slice(0, s) for s in sub)]


def scatter_blocks(stack: Array, idx: np.ndarray, values: Array) -> Array:
    """``stack`` with the entries ``idx`` set, in their leading corner, to ``values``.

    The inverse of :func:`gather_blocks`: the rest of each entry is kept.

    Args:
      stack: an array ``(K, ...)``.
      idx: indices into the leading axis.
      values: an array ``(len(idx), ...)`` no larger than ``stack``'s entries.

    Returns:
      The updated stack (``values`` itself when it covers the whole stack).

    >>> import jax.numpy as jnp, numpy as np
    >>> print(scatter_blocks(jnp.zeros((2, 2)), np.array([1]), jnp.ones((1, 1))))
    [[0. 0.]
     [1. 0.]]
    """
    sub = values.shape[1:]
    if _is_whole(stack, idx, sub) and stack.ndim == values.ndim:
        return values.astype(stack.dtype)
    where = (jnp.asarray(idx),) + tuple(slice(0, s) for s in sub)
    return stack.at[where].set(values.astype(stack.dtype))


def _with_layers(layers: int, grid: Sequence[tuple[int, int]]) -> tuple:
    """``grid`` with a leading layer axis cut into ``layers`` blocks of one."""
    return ((layers, 1),) + tuple(grid)


def to_layer_blocks(x: Array, grid: Sequence[tuple[int, int]]) -> Array:
    """:func:`to_blocks` of each layer of ``x``, the blocks of layer 0 first, then layer 1's.

    Args:
      x: a stack of layers ``(layers,) + shape``.
      grid: :func:`block_grid` of one layer's ``shape``.

    Returns:
      An array ``(layers * k_1 * ... * k_n, b_1, ..., b_n)``.

    >>> import jax.numpy as jnp
    >>> x = jnp.arange(8.).reshape(2, 1, 4)
    >>> print(to_layer_blocks(x, block_grid((1, 4), 2))[:, 0])
    [[0. 1.]
     [2. 3.]
     [4. 5.]
     [6. 7.]]
    """
    blocks = to_blocks(x, _with_layers(x.shape[0], grid))
    return blocks.reshape(blocks.shape[:1] + blocks.shape[2:])


def from_layer_blocks(blocks: Array, shape: Sequence[int], grid: Sequence[tuple[int, int]]
                      ) -> Array:
    """The inverse of :func:`to_layer_blocks`: each layer put back, the padding cut off.

    Args:
      blocks: an array ``(layers * k_1 * ... * k_n, b_1, ..., b_n)``.
      shape: one layer's shape.
      grid: :func:`block_grid` of ``shape``.

    Returns:
      An array ``(layers,) + shape``.

    >>> import jax.numpy as jnp
    >>> x = jnp.arange(30.).reshape(2, 3, 5)
    >>> grid = block_grid((3, 5), 2)
    >>> bool((from_layer_blocks(to_layer_blocks(x, grid), (3, 5), grid) == x).all())
    True
    """
    layers = blocks.shape[0] // math.prod(k for k, _ in grid)
    return from_blocks(blocks[:, None], (layers,) + tuple(shape), _with_layers(layers, grid))


def layer_block_groups(layers: int, shape: Sequence[int], grid: Sequence[tuple[int, int]]
                       ) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """:func:`block_groups` of every layer: indices into :func:`to_layer_blocks`' leading axis.

    Args:
      layers: the number of layers.
      shape: one layer's (merged) shape.
      grid: :func:`block_grid` of ``shape``.

    Returns:
      ``(block_shape, indices)`` pairs: each block shape of a layer, with the indices of
      those blocks of every layer (ascending).

    >>> [(s, i.tolist()) for s, i in layer_block_groups(2, (5, 4), block_grid((5, 4), 3))]
    [((3, 2), [0, 1, 4, 5]), ((2, 2), [2, 3, 6, 7])]
    """
    return [(sub[1:], idx) for sub, idx in block_groups((layers,) + tuple(shape),
                                                        _with_layers(layers, grid))]


def map_by_shape(fn: Any, items: list, mesh: Optional[jax.sharding.Mesh] = None) -> list:
    """``fn`` of each matrix of each item, same-shape items joined into one call.

    The items whose first stack has one matrix shape and dtype are concatenated
    and go through one :func:`functrain.linalg.map_matrices` call (one matrix
    at a time on CPU; divided over ``mesh``'s devices when given).

    Args:
      fn: a function of one matrix from each stack of an item.
      items: tuples of stacks ``(n, d, d)`` (``n`` may differ between items).
      mesh: a ``jax.sharding.Mesh`` to divide each call over, or ``None``.

    Returns:
      Per item, ``fn``'s outputs stacked over its ``n`` matrices.

    >>> import jax.numpy as jnp
    >>> items = [(2 * jnp.ones((1, 2, 2)),), (jnp.ones((3, 1, 1)),), (jnp.ones((2, 2, 2)),)]
    >>> [y.shape for y in map_by_shape(lambda m: jnp.trace(m), items)]
    [(1,), (3,), (2,)]
    """
    sizes: dict = {}
    for i, item in enumerate(items):
        sizes.setdefault((item[0].shape[1:], item[0].dtype), []).append(i)
    out: list = [None] * len(items)
    for members in sizes.values():
        stacks = [jnp.concatenate([items[i][a] for i in members]) if len(members) > 1
                  else items[members[0]][a] for a in range(len(items[members[0]]))]
        done, at = map_matrices(fn, *stacks, mesh=mesh), 0
        for i in members:
            n = items[i][0].shape[0]
            out[i] = jax.tree.map(lambda y, at=at, n=n: y[at:at + n], done)
            at += n
    return out
