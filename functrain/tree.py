"""Public pytree math: small functions over whole pytrees, the ones functrain uses itself.

``add``, ``scale``, ``vdot``, ``norm``, ``zeros_like``, ``cast``, ... over
whole trees; ``leaf_norm`` and ``sum_of_squares`` of one array; the dtype
policy (``compute_dtype``); sub-trees by path (``get_path``/``set_path``); and
``map_broadcast`` for Ivy-style arguments that may or may not be trees. The
key-path checks (``check_structure``, ``check_shapes``, masks, ``MaskedNode``)
live in :mod:`functrain.tree_checks` and are re-exported here.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from functrain.tree_checks import (MaskedNode, check_leaf_dtypes, check_shapes,
                                   check_structure, flatten_like, flatten_with_paths,
                                   format_paths, is_mask_function, is_params_placeholder,
                                   is_placeholder, key_paths, resolve_leaf_mask, resolve_mask)

PyTree = Any
Array = jax.Array

__all__ = [
    "add", "sub", "mul", "scale", "add_scaled", "vdot", "sum", "norm", "leaf_norm",
    "zeros_like", "ones_like", "full_like", "cast", "where", "map", "leaves",
    "key_paths", "check_structure", "check_shapes", "MaskedNode", "is_placeholder",
    "sum_of_squares", "get_path", "set_path", "is_single_leaf", "map_broadcast",
]


# --------------------------------------------------------------------------
# Public tree math
# --------------------------------------------------------------------------

def map(fn: Callable[..., Any], tree: PyTree, *rest: PyTree) -> PyTree:  # noqa: A001
    """``fn`` applied leaf by leaf, with a path-naming error on mismatched trees.

    Args:
      fn: called with one leaf of ``tree`` and the matching leaf of each of ``rest``.
      tree: the first tree.
      *rest: more trees of the same structure.

    Returns:
      A tree like ``tree`` holding ``fn``'s results.

    >>> import jax.numpy as jnp
    >>> map(lambda x, y: x * y, {'a': jnp.array([2.])}, {'a': jnp.array([3.])})
    {'a': Array([6.], dtype=float32)}
    """
    for i, other in enumerate(rest):
        check_structure(tree, other, f"tree argument {i + 2}", "the first tree")
    return jax.tree_util.tree_map(fn, tree, *rest)


def add(x: PyTree, y: PyTree) -> PyTree:
    """Leafwise ``x + y``.

    Args:
      x: a tree.
      y: a tree of the same structure.

    Returns:
      The leafwise sum.

    >>> import jax.numpy as jnp
    >>> add({'w': jnp.array([1., 2.])}, {'w': jnp.array([3., 4.])})
    {'w': Array([4., 6.], dtype=float32)}
    """
    return map(jnp.add, x, y)


def sub(x: PyTree, y: PyTree) -> PyTree:
    """Leafwise ``x - y``.

    Args:
      x: a tree.
      y: a tree of the same structure.

    Returns:
      The leafwise difference.

    >>> import jax.numpy as jnp
    >>> sub([jnp.array([3.])], [jnp.array([1.])])
    [Array([2.], dtype=float32)]
    """
    return map(jnp.subtract, x, y)


def mul(x: PyTree, y: PyTree) -> PyTree:
    """Leafwise ``x * y``.

    Args:
      x: a tree.
      y: a tree of the same structure.

    Returns:
      The leafwise product.

    >>> import jax.numpy as jnp
    >>> mul([jnp.array([3.])], [jnp.array([2.])])
    [Array([6.], dtype=float32)]
    """
    return map(jnp.multiply, x, y)


def scale(s: Any, tree: PyTree) -> PyTree:
    """Every leaf multiplied by the scalar ``s`` (leaf dtypes are kept).

    Args:
      s: a scalar.
      tree: a tree of arrays.

    Returns:
      ``s * tree``, each leaf in its own dtype.

    >>> import jax.numpy as jnp
    >>> scale(0.5, {'w': jnp.array([2., 4.])})
    {'w': Array([1., 2.], dtype=float32)}
    """
    return jax.tree_util.tree_map(
        lambda x: (jnp.asarray(s, _promote_float(x.dtype)) * x).astype(x.dtype), tree)


def add_scaled(x: PyTree, s: Any, y: PyTree) -> PyTree:
    """Leafwise ``x + s * y``.

    Args:
      x: a tree.
      s: a scalar.
      y: a tree of the same structure.

    Returns:
      ``x + s * y``, each leaf in ``x``'s dtype.

    >>> import jax.numpy as jnp
    >>> add_scaled([jnp.array(1.)], 2., [jnp.array(3.)])
    [Array(7., dtype=float32)]
    """
    return map(lambda a, b: (a + s * b).astype(a.dtype), x, y)


def vdot(x: PyTree, y: PyTree) -> Array:
    """The inner product of two trees: the sum over leaves of ``vdot(x, y)``.

    Args:
      x: a tree.
      y: a tree of the same structure.

    Returns:
      A scalar.

    >>> import jax.numpy as jnp
    >>> vdot({'a': jnp.array([1., 2.])}, {'a': jnp.array([3., 4.])})
    Array(11., dtype=float32)
    """
    parts = jax.tree_util.tree_leaves(
        map(lambda a, b: jnp.vdot(a.ravel(), b.ravel()), x, y))
    return _total(parts)


def sum(tree: PyTree) -> Array:  # noqa: A001
    """The sum of all entries of all leaves.

    Args:
      tree: a tree of arrays.

    Returns:
      A scalar (float32 zero for an empty tree).

    >>> import jax.numpy as jnp
    >>> sum({'a': jnp.array([1., 2.]), 'b': jnp.array(3.)})
    Array(6., dtype=float32)
    """
    return _total([jnp.sum(x) for x in jax.tree_util.tree_leaves(tree)])


def norm(tree: PyTree, squared: bool = False) -> Array:
    """The L2 norm of a whole tree, as if all leaves were one flat vector.

    Args:
      tree: a tree of arrays (complex leaves count ``|x|``).
      squared: return the squared norm instead.

    Returns:
      A real scalar, accumulated in at least float32.

    >>> import jax.numpy as jnp
    >>> norm({'a': jnp.array([3.]), 'b': jnp.array([4.])})
    Array(5., dtype=float32)
    >>> norm([jnp.array([3j])])
    Array(3., dtype=float32)
    """
    leaves = jax.tree_util.tree_leaves(tree)
    sq = _total([sum_of_squares(x) for x in leaves])
    return sq if squared else jnp.sqrt(sq)


def leaf_norm(x: Array) -> Array:
    """The L2 norm of one array, accumulated in at least float32.

    Safe to differentiate: at an all-zero array the norm is 0 and its gradient
    is 0, not NaN.

    Args:
      x: one array.

    Returns:
      A real scalar, at least float32.

    >>> import jax, jax.numpy as jnp
    >>> leaf_norm(jnp.array([[3.], [4.]]))
    Array(5., dtype=float32)
    >>> jax.grad(leaf_norm)(jnp.zeros(2))
    Array([0., 0.], dtype=float32)
    """
    sq = sum_of_squares(x)
    positive = sq > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1.0)), 0.0)


def sum_of_squares(x: Array) -> Array:
    """``sum(|x|**2)`` of one array, real even for complex ``x``, in at least float32.

    Args:
      x: an array (or a number).

    Returns:
      A real scalar: float32 for 16-bit and integer inputs, else ``x``'s
      (real) precision.

    >>> import jax.numpy as jnp
    >>> sum_of_squares(jnp.array([3., 4.])), sum_of_squares(jnp.array([1j]))
    (Array(25., dtype=float32), Array(1., dtype=float32))
    """
    x = jnp.asarray(x)
    x = x.astype(_promote_float(x.dtype))
    return jnp.sum(jnp.real(x * jnp.conj(x)))


def zeros_like(tree: PyTree, dtype: Optional[Any] = None) -> PyTree:
    """A tree of zeros shaped like ``tree`` (in ``dtype`` if given).

    Sharded leaves keep their sharding: the zeros are placed like the input.

    Args:
      tree: a tree of arrays (or ``jax.ShapeDtypeStruct``).
      dtype: the dtype of the zeros; ``None`` keeps each leaf's.

    Returns:
      A tree of zeros.

    >>> import jax.numpy as jnp
    >>> zeros_like({'w': jnp.ones(2)})
    {'w': Array([0., 0.], dtype=float32)}
    """
    return full_like(tree, 0, dtype)


def ones_like(tree: PyTree, dtype: Optional[Any] = None) -> PyTree:
    """A tree of ones shaped like ``tree``.

    Args:
      tree: a tree of arrays.
      dtype: the dtype of the ones; ``None`` keeps each leaf's.

    Returns:
      A tree of ones.

    >>> import jax.numpy as jnp
    >>> ones_like([jnp.zeros(2)], dtype=jnp.int32)
    [Array([1, 1], dtype=int32)]
    """
    return full_like(tree, 1, dtype)


def full_like(tree: PyTree, fill_value: Any, dtype: Optional[Any] = None) -> PyTree:
    """A tree shaped like ``tree`` filled with ``fill_value``.

    Args:
      tree: a tree of arrays.
      fill_value: the value of every entry.
      dtype: the dtype; ``None`` keeps each leaf's.

    Returns:
      A tree shaped like ``tree``, placed like it (shardings are kept).

    >>> import jax.numpy as jnp
    >>> full_like({'w': jnp.zeros(2)}, 0.5)
    {'w': Array([0.5, 0.5], dtype=float32)}
    """
    return jax.tree_util.tree_map(lambda x: _full_like_leaf(x, fill_value, dtype), tree)


def _full_like_leaf(x: Any, fill_value: Any, dtype: Optional[Any]) -> Array:
    out_dtype = dtype if dtype is not None else x.dtype
    if isinstance(x, jax.core.Tracer):
        # Traced (jit, eval_shape, vmap): derive the fill from ``x`` arithmetically,
        # so the partitioner gives it ``x``'s sharding (auto and explicit meshes).
        # ``shard_alike`` is not usable here: in jax 0.10 its lowering is cached per
        # shape, so every same-shaped leaf lands in ONE sharding group and params
        # with different shardings would share one layout. Non-finite entries are
        # zeroed first, so the fill is exact (never NaN) whatever ``x`` holds.
        zero = jnp.where(jnp.isfinite(x), x, jnp.zeros((), x.dtype)) * jnp.zeros((), x.dtype)
        return zero.astype(out_dtype) + jnp.asarray(fill_value, out_dtype)
    sharding = getattr(x, "sharding", None)
    if sharding is None or isinstance(x, jax.ShapeDtypeStruct) or not getattr(
            x, "committed", True):
        # Uncommitted inputs get uncommitted state, so a jitted step's cache key
        # does not change between the first call and the next (no recompile).
        return jnp.full(jnp.shape(x), fill_value, out_dtype)
    return jnp.full(x.shape, fill_value, out_dtype, device=sharding)


def cast(tree: PyTree, dtype: Optional[Any]) -> PyTree:
    """Every floating leaf cast to ``dtype`` (``None`` leaves the tree unchanged).

    Args:
      tree: a tree of arrays.
      dtype: the floating dtype to cast to, or ``None``.

    Returns:
      The cast tree; non-floating leaves are unchanged.

    >>> import jax.numpy as jnp
    >>> cast({'w': jnp.ones(1)}, jnp.bfloat16)
    {'w': Array([1], dtype=bfloat16)}
    """
    if dtype is None:
        return tree
    return jax.tree_util.tree_map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def where(condition: Any, x: PyTree, y: PyTree) -> PyTree:
    """Leafwise ``jnp.where(condition, x, y)`` with a scalar ``condition``.

    Args:
      condition: a scalar boolean.
      x: the tree taken where ``condition`` holds.
      y: a tree of the same structure, taken elsewhere.

    Returns:
      The selected tree.

    >>> import jax.numpy as jnp
    >>> where(jnp.array(False), [jnp.array([1.])], [jnp.array([2.])])
    [Array([2.], dtype=float32)]
    """
    return map(lambda a, b: jnp.where(condition, a, b), x, y)


def leaves(tree: PyTree) -> list:
    """The leaves of ``tree`` (``MaskedNode`` and ``None`` placeholders dropped).

    Args:
      tree: any tree.

    Returns:
      A list of its leaves in tree order.

    >>> leaves({'a': 1, 'b': [2, None]})
    [1, 2]
    """
    return jax.tree_util.tree_leaves(tree)


def _total(parts: Sequence[Array]) -> Array:
    if not parts:
        return jnp.zeros((), jnp.float32)
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def _promote_float(dtype: Any) -> Any:
    """float32 for low-precision and integer dtypes, else the dtype itself."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize >= 4:
        return dtype
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return dtype
    return jnp.dtype(jnp.float32)


def compute_dtype(dtype: Any) -> Any:
    """The dtype per-leaf math runs in: float32 for 16-bit floats, else unchanged.

    Running float16/bfloat16 math in float32 keeps ``eps`` from underflowing
    (optax's adam gives NaN for float16 zero gradients); results are cast back.

    Args:
      dtype: a leaf's dtype.

    Returns:
      The dtype to compute in.

    >>> import jax.numpy as jnp
    >>> compute_dtype(jnp.float16)
    dtype('float32')
    """
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4:
        return jnp.dtype(jnp.float32)
    return dtype


# --------------------------------------------------------------------------
# Sub-trees by path, and mapping over arguments that may or may not be trees
# --------------------------------------------------------------------------

def is_single_leaf(x: Any) -> bool:
    """Whether ``x`` is one leaf rather than a pytree node (even an empty one).

    Args:
      x: anything.

    Returns:
      ``True`` when ``x`` flattens to itself (an array, a number, ...).

    >>> import jax.numpy as jnp
    >>> is_single_leaf(jnp.ones(2)), is_single_leaf({}), is_single_leaf([1.0])
    (True, False, False)
    """
    treedef = jax.tree_util.tree_structure(x)
    return treedef.num_nodes == 1 and treedef.num_leaves == 1


def _key_value(entry: Any) -> Any:
    """The plain key of one jax key-path entry (index, dict key, attribute)."""
    for attr in ("idx", "key", "name"):
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return entry


def _children(node: Any, where: str) -> tuple[list, list, Any]:
    """The direct children of a pytree node: (keys, children, treedef)."""
    if is_single_leaf(node):
        raise KeyError(f"{where}: cannot index into a leaf of type {type(node).__name__}")
    pairs, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    return [p[0] for p, _ in pairs], [c for _, c in pairs], treedef


def _child_position(keys: list, key: Any, where: str) -> int:
    """Which child ``key`` names: by its key, or by position in a tuple or NamedTuple."""
    for i, entry in enumerate(keys):
        value = _key_value(entry)
        if type(value) is type(key) and value == key:
            return i
    n = len(keys)
    positional = all(isinstance(e, (jax.tree_util.SequenceKey, jax.tree_util.GetAttrKey))
                     for e in keys)
    if positional and isinstance(key, int) and not isinstance(key, bool) and -n <= key < n:
        return key % n
    raise KeyError(f"{where}: no child {key!r}; the node's keys are "
                   f"{[_key_value(e) for e in keys]}")


def get_path(tree: PyTree, path: Sequence[Any], where: str = "get_path") -> Any:
    """The sub-tree of ``tree`` at ``path``, a sequence of keys, indices or attribute names.

    Args:
      tree: any pytree (dicts, lists, tuples, NamedTuples, registered nodes).
      path: one key per level: a dict key, a sequence index, or a NamedTuple
        field name or position.
      where: what to call the lookup in the ``KeyError`` of a bad path.

    Returns:
      The sub-tree found there.

    >>> get_path({'a': [1.0, (2.0, 3.0)]}, ('a', 1, 0))
    2.0
    """
    path = tuple(path)
    for depth, key in enumerate(path):
        keys, children, _ = _children(tree, f"{where} at {path[:depth + 1]!r}")
        tree = children[_child_position(keys, key, f"{where} at {path[:depth + 1]!r}")]
    return tree


def set_path(tree: PyTree, path: Sequence[Any], value: Any) -> PyTree:
    """A copy of ``tree`` with the sub-tree at ``path`` replaced by ``value``.

    Args:
      tree: any pytree.
      path: as for :func:`get_path`.
      value: the new sub-tree.

    Returns:
      A new tree of the same node types; ``tree`` itself is not modified.

    >>> set_path({'a': [1.0, 2.0]}, ('a', 1), 5.0)
    {'a': [1.0, 5.0]}
    """
    path = tuple(path)
    if not path:
        return value
    keys, children, treedef = _children(tree, "set_path")
    i = _child_position(keys, path[0], "set_path")
    children = list(children)
    children[i] = set_path(children[i], path[1:], value)
    return treedef.unflatten(children)


def map_broadcast(fn: Callable[..., Any], names: Sequence[str], args: Sequence[Any],
                  num_outputs: int = 1) -> Any:
    """``fn`` leaf by leaf over the arguments that are trees; single leaves go to every call.

    This is how Ivy's ``Container`` arithmetic behaves: tree arguments must
    share one structure (checked first; the ``ValueError`` names the key
    paths), single arrays or numbers are broadcast to every leaf.

    Args:
      fn: the per-leaf function, called with one value per argument.
      names: the arguments' names, for error messages.
      args: the arguments, each a pytree or a single leaf.
      num_outputs: how many values ``fn`` returns per leaf.

    Returns:
      A tree (or a tuple of ``num_outputs`` trees) shaped like the tree
      arguments; ``fn(*args)`` itself when no argument is a tree.

    >>> import jax.numpy as jnp
    >>> map_broadcast(lambda w, s: w * s, ('w', 's'), ({'a': jnp.ones(2)}, 3.0))
    {'a': Array([3., 3.], dtype=float32)}
    """
    tree_positions = [i for i, a in enumerate(args) if not is_single_leaf(a)]
    if not tree_positions:
        return fn(*args)
    ref = tree_positions[0]
    treedef = jax.tree_util.tree_structure(args[ref])
    for i in tree_positions[1:]:
        if jax.tree_util.tree_structure(args[i]) != treedef:
            # check_structure names the differing key paths. It reads MaskedNode
            # placeholders as leaves, so it may accept what a plain flatten does
            # not: then raise here.
            check_structure(args[ref], args[i], f"`{names[i]}`", f"`{names[ref]}`")
            raise ValueError(f"`{names[i]}` and `{names[ref]}` have different tree "
                             f"structures: {treedef} vs {jax.tree_util.tree_structure(args[i])}")
    columns = [jax.tree_util.tree_leaves(a) if i in tree_positions else None
               for i, a in enumerate(args)]
    results = [fn(*[col[k] if col is not None else args[i] for i, col in enumerate(columns)])
               for k in range(treedef.num_leaves)]
    if num_outputs == 1:
        return treedef.unflatten(results)
    return tuple(treedef.unflatten([r[j] for r in results]) for j in range(num_outputs))
