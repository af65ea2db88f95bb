"""The tree functions defined in :mod:`functrain.tree` itself (its ``__init__`` re-exports
them with those of :mod:`~functrain.tree.ops`, :mod:`~functrain.tree.state` and
:mod:`~functrain.tree.checks`): ``map``, ``leaves``, ``add_scaled``, ``leaf_norm``, the
``*_like`` constructors, the casts and the dtype policy (``compute_dtype``), the random trees,
sub-trees by path (``get_path`` / ``set_path``), ``map_broadcast`` for Ivy-style arguments,
``distinct_buffers`` and ``explicit_spec``.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp

from functrain.tree.checks import check_structure
from functrain.tree.ops import sum_of_squares

PyTree = Any
Array = jax.Array



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
    if not hasattr(x, "dtype"):  # a Python number, as optax allows
        return jnp.full_like(x, fill_value, dtype=dtype)
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
# Dtypes and random trees (optax.tree's)
# --------------------------------------------------------------------------

def cast(tree: PyTree, dtype: Optional[Any]) -> PyTree:
    """Every leaf cast to ``dtype``; ``None`` returns ``tree`` unchanged.

    Args:
      tree: a tree of arrays.
      dtype: the dtype to cast to, or ``None``.

    Returns:
      The cast tree.

    >>> import jax.numpy as jnp
    >>> cast({'w': jnp.ones(1)}, jnp.bfloat16)
    {'w': Array([1], dtype=bfloat16)}
    """
    if dtype is None:
        return tree
    return jax.tree_util.tree_map(lambda x: x.astype(dtype), tree)


def cast_like(tree: PyTree, other_tree: PyTree) -> PyTree:
    """Each leaf of ``tree`` cast to the dtype of the matching leaf of ``other_tree``.

    Args:
      tree: the tree to cast.
      other_tree: a tree of the same structure; leaves without a ``dtype``
        leave the matching leaf unchanged.

    Returns:
      The cast tree.

    >>> import jax.numpy as jnp
    >>> cast_like({'w': jnp.ones(1)}, {'w': jnp.zeros(1, jnp.float16)})
    {'w': Array([1.], dtype=float16)}
    """
    return map(lambda t, o: t.astype(o.dtype) if hasattr(o, "dtype") else t, tree, other_tree)


def _ordered(d1: Any, d2: Any, want_lower: bool) -> Any:
    promoted = jnp.promote_types(d1, d2)
    if promoted == d1:
        return d2 if want_lower else d1
    if promoted == d2:
        return d1 if want_lower else d2
    raise ValueError(f"Cannot compare dtype of dtype1={d1!r} and dtype2={d2!r}. Neither {d1} "
                     f"nor {d2} can be promoted to the other.")


def dtype(tree: PyTree, mixed_dtype_handler: Optional[str] = None) -> Any:
    """The dtype of a tree's leaves (JAX's default float dtype for an empty tree).

    Args:
      tree: a tree of arrays.
      mixed_dtype_handler: for leaves of different dtypes: ``None`` raises,
        ``'promote'`` gives their promoted dtype, ``'highest'``/``'lowest'``
        the highest/lowest in JAX's promotion order (raising when two cannot
        be ordered).

    Returns:
      A numpy dtype.

    Raises:
      ValueError: mixed dtypes with ``mixed_dtype_handler=None`` (naming the
        leaves), unordered dtypes, or an unknown handler.

    >>> import jax.numpy as jnp
    >>> t = {'a': jnp.ones(1, jnp.float16), 'b': jnp.ones(1)}
    >>> dtype(t, 'lowest'), dtype(t, 'highest')
    (dtype('float16'), dtype('float32'))
    """
    pairs = jax.tree_util.tree_leaves_with_path(tree)
    if not pairs:
        return jnp.asarray([]).dtype
    dtypes = [jnp.asarray(x).dtype for _, x in pairs]
    if mixed_dtype_handler is None:
        bad = [f"Expected dtype={dtypes[0]!r} for {jax.tree_util.keystr(p)} but got {d}."
               for (p, _), d in zip(pairs, dtypes) if d != dtypes[0]]
        if bad:
            raise ValueError("\n".join(bad))
        return dtypes[0]
    if mixed_dtype_handler == "promote":
        return functools.reduce(jnp.promote_types, dtypes)
    if mixed_dtype_handler in ("highest", "lowest"):
        return functools.reduce(
            lambda a, b: _ordered(a, b, mixed_dtype_handler == "lowest"), dtypes)
    raise ValueError(f"Invalid value for mixed_dtype_handler={mixed_dtype_handler!r}, possible "
                     "values are: None, \"promote\", \"highest\", \"lowest\".")


def split_key_like(rng_key: Array, target_tree: PyTree) -> PyTree:
    """One new key per leaf of ``target_tree``, from ``jax.random.split``.

    Args:
      rng_key: the key to split.
      target_tree: the tree whose structure the keys take.

    Returns:
      A tree of keys shaped like ``target_tree``'s structure.

    >>> import jax, jax.numpy as jnp
    >>> keys = split_key_like(jax.random.key(0), {'a': jnp.ones(2), 'b': jnp.ones(3)})
    >>> sorted(keys)
    ['a', 'b']
    """
    treedef = jax.tree_util.tree_structure(target_tree)
    return treedef.unflatten(list(jax.random.split(rng_key, treedef.num_leaves)))


def random_like(rng_key: Array, target_tree: PyTree,
                sampler: Callable[..., Any] = jax.random.normal,
                dtype: Optional[Any] = None) -> PyTree:
    """A tree of random arrays shaped like ``target_tree``, one split key per leaf.

    Args:
      rng_key: the key.
      target_tree: a tree of arrays giving the shapes (and default dtypes).
      sampler: called as ``sampler(key, shape, dtype)`` (and ``out_sharding=``
        the leaf's sharding when it accepts that keyword).
      dtype: the dtype to sample; ``None`` uses each leaf's.

    Returns:
      The random tree.

    >>> import jax, jax.numpy as jnp
    >>> random_like(jax.random.key(0), {'w': jnp.ones(3)})['w'].shape
    (3,)
    """
    keys = split_key_like(rng_key, target_tree)
    takes_sharding = "out_sharding" in inspect.signature(sampler).parameters

    def leaf(x: Any, key: Any) -> Any:
        if takes_sharding:
            return sampler(key, x.shape, dtype or x.dtype, out_sharding=jax.typeof(x).sharding)
        return sampler(key, x.shape, dtype or x.dtype)

    return jax.tree_util.tree_map(leaf, target_tree, keys)


def unwrap_random_key_data(input_tree: PyTree) -> PyTree:
    """Typed PRNG keys replaced by their raw ``key_data`` (other leaves unchanged).

    Args:
      input_tree: a tree of arrays and ``jax.random.key`` objects.

    Returns:
      The tree with every key array replaced by its uint32 data.

    >>> import jax
    >>> unwrap_random_key_data({'k': jax.random.key(0)})['k'].dtype
    dtype('uint32')
    """
    def leaf(x: Any) -> Any:
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return jax.random.key_data(x)
        return x

    return jax.tree_util.tree_map(leaf, input_tree)


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


def distinct_buffers(tree: PyTree) -> PyTree:
    """``tree`` with no buffer in two places: a leaf seen before is replaced by a copy.

    An optimizer state that holds one array under two fields (one zeros array
    for two moments) cannot be donated: ``jax.jit(step, donate_argnums=...)``
    refuses to donate the same buffer twice. ``init`` functions pass their state
    through this.

    Args:
      tree: a tree of arrays (or tracers, or anything else: those are kept).

    Returns:
      The same tree, where every repeated array object after its first place is
      ``jnp.array(x, copy=True)``.

    >>> import jax.numpy as jnp
    >>> z = jnp.zeros(2)
    >>> a, b = distinct_buffers((z, z))
    >>> a is z, b is z
    (True, False)
    """
    seen: dict = {}  # id -> the leaf (a dict: ``set`` is optax.tree's set here)

    def one(x: Any) -> Any:
        if not hasattr(x, "shape"):
            return x
        if id(x) in seen:
            return jnp.array(x, copy=True)
        seen[id(x)] = x
        return x

    return jax.tree_util.tree_map(one, tree)



def explicit_spec(x: Any) -> Any:
    """The ``PartitionSpec`` in ``x``'s type when it is split over explicit mesh axes.

    On a mesh with explicit axes (``jax.make_mesh``'s default), an array's split is
    part of its type, and an operation that cannot tell how to split its output
    (a matmul contracting a split axis, a reshape of a split axis) must be told.
    Under automatic axes, and on one device, the type carries no split.

    Args:
      x: an array or a tracer.

    Returns:
      The ``PartitionSpec`` of ``x``'s type if any of its axes is split, else ``None``.

    >>> import jax.numpy as jnp
    >>> explicit_spec(jnp.zeros((4, 2))) is None
    True
    """
    spec = getattr(getattr(jax.typeof(x), "sharding", None), "spec", None)
    if spec is None or all(s is None for s in spec):
        return None
    return spec
