"""optax.tree's arithmetic: whole-tree sums, products, reductions and norms.

The ``optax.tree`` functions that compute (optax 0.2.8's names, signatures and
numbers, written for functrain): ``add``, ``sub``, ``mul``, ``div``, ``scale``,
``add_scale``, ``vdot``, ``sum``, ``max``, ``min``, ``norm``, ``size``, ``clip``,
``conj``, ``real``, ``where``, ``allclose``, ``batch_shape`` and ``sum_of_squares`` of
one array. :mod:`functrain.tree` re-exports them all, so ``functrain.tree.norm(t, ord=1)``
is ``optax.tree.norm(t, ord=1)``. Where optax maps two trees leaf by leaf, a structure
mismatch raises a ``ValueError`` that names the key paths at fault (optax raises a
``ValueError`` too, from ``jax.tree.map``). The moments (``update_moment`` & co.) are in
:mod:`functrain.tree.moments`.

Two deliberate differences, both only in precision: squared norms and sums of
squares of 16-bit leaves accumulate in float32 (optax sums float16 squares in
float16, which overflows at a few hundred), and an empty tree reduces to a
float32 zero rather than the Python ``0``.

The rest of optax.tree is elsewhere: its casts, dtypes and random trees in
:mod:`functrain.tree` itself, its state helpers (``get``, ``set``,
``get_all_with_path``, ``map_params``) in :mod:`functrain.tree.state`; the key-path
checks these functions call are in :mod:`functrain.tree.checks`.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp

from functrain.tree.checks import check_structure
from functrain.tree.moments import abs_sq

PyTree = Any
Array = jax.Array

__all__ = [
    "sum_of_squares", "add", "add_scale", "allclose", "batch_shape", "clip", "conj", "div",
    "max", "min", "mul", "norm", "real", "scale", "size", "sub", "sum", "vdot", "where",
]

_builtin_sum = sum


def _promote_float(dtype: Any) -> Any:
    """float32 for low-precision and integer dtypes, else the dtype itself."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize >= 4:
        return dtype
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return dtype
    return jnp.dtype(jnp.float32)


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
    return jnp.sum(abs_sq(x.astype(_promote_float(x.dtype))))


def _total(parts: Sequence[Array]) -> Array:
    if not parts:
        return jnp.zeros((), jnp.float32)
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def _leaves(tree: PyTree) -> list:
    return jax.tree_util.tree_leaves(tree)


def _paired(fn: Callable[..., Any], name: str, x: PyTree, *rest: PyTree) -> PyTree:
    """``fn`` leaf by leaf over trees of one structure, the mismatch named by key path."""
    for i, other in enumerate(rest):
        check_structure(x, other, f"{name}: tree argument {i + 2}", "the first tree")
    return jax.tree_util.tree_map(fn, x, *rest)


# --------------------------------------------------------------------------
# Arithmetic
# --------------------------------------------------------------------------

def add(tree_x: PyTree, tree_y: PyTree, *other_trees: PyTree) -> PyTree:
    """Leafwise ``tree_x + tree_y (+ ...)``, as ``optax.tree.add``.

    Args:
      tree_x: a tree.
      tree_y: a tree of the same structure.
      *other_trees: more trees of that structure, added too.

    Returns:
      The leafwise sum.

    >>> import jax.numpy as jnp
    >>> add({'w': jnp.array([1., 2.])}, {'w': jnp.array([3., 4.])})
    {'w': Array([4., 6.], dtype=float32)}
    """
    return _paired(lambda *xs: functools.reduce(operator.add, xs), "add", tree_x, tree_y,
                   *other_trees)


def sub(tree_x: PyTree, tree_y: PyTree) -> PyTree:
    """Leafwise ``tree_x - tree_y``.

    Args:
      tree_x: a tree.
      tree_y: a tree of the same structure.

    Returns:
      The leafwise difference.

    >>> import jax.numpy as jnp
    >>> sub([jnp.array([3.])], [jnp.array([1.])])
    [Array([2.], dtype=float32)]
    """
    return _paired(operator.sub, "sub", tree_x, tree_y)


def mul(tree_x: PyTree, tree_y: PyTree) -> PyTree:
    """Leafwise ``tree_x * tree_y``.

    Args:
      tree_x: a tree.
      tree_y: a tree of the same structure.

    Returns:
      The leafwise product.

    >>> import jax.numpy as jnp
    >>> mul([jnp.array([3.])], [jnp.array([2.])])
    [Array([6.], dtype=float32)]
    """
    return _paired(operator.mul, "mul", tree_x, tree_y)


def div(tree_x: PyTree, tree_y: PyTree) -> PyTree:
    """Leafwise ``tree_x / tree_y`` (true division).

    Args:
      tree_x: a tree.
      tree_y: a tree of the same structure.

    Returns:
      The leafwise quotient.

    >>> import jax.numpy as jnp
    >>> div([jnp.array([3.])], [jnp.array([2.])])
    [Array([1.5], dtype=float32)]
    """
    return _paired(operator.truediv, "div", tree_x, tree_y)


def scale(scalar: Any, tree: PyTree) -> PyTree:
    """``scalar * tree``, leaf by leaf, with JAX's promotion (as ``optax.tree.scale``).

    A Python number keeps each leaf's dtype; a float32 array ``scalar`` turns
    16-bit leaves into float32, as in optax.

    Args:
      scalar: a scalar (number or 0-d array).
      tree: a tree of arrays.

    Returns:
      A tree of the same structure.

    >>> import jax.numpy as jnp
    >>> scale(0.5, {'w': jnp.array([2., 4.])})
    {'w': Array([1., 2.], dtype=float32)}
    """
    return jax.tree_util.tree_map(lambda x: scalar * x, tree)


def add_scale(tree_x: PyTree, scalar: Any, tree_y: PyTree) -> PyTree:
    """``tree_x + scalar * tree_y``; ``None`` leaves of ``tree_x`` stay ``None``.

    Args:
      tree_x: a tree (``None`` leaves allowed).
      scalar: a scalar.
      tree_y: a tree of the same structure.

    Returns:
      The combined tree.

    >>> import jax.numpy as jnp
    >>> add_scale([jnp.array(1.)], 2., [jnp.array(3.)])
    [Array(7., dtype=float32, weak_type=True)]
    """
    s = jnp.asarray(scalar)
    return jax.tree_util.tree_map(lambda a, b: None if a is None else a + s * b,
                                  tree_x, tree_y, is_leaf=lambda a: a is None)


def conj(tree: PyTree) -> PyTree:
    """The complex conjugate of every leaf.

    Args:
      tree: a tree of arrays.

    Returns:
      A tree of the same structure.

    >>> import jax.numpy as jnp
    >>> conj([jnp.array([1 + 2j])])
    [Array([1.-2.j], dtype=complex64)]
    """
    return jax.tree_util.tree_map(jnp.conj, tree)


def real(tree: PyTree) -> PyTree:
    """The real part of every leaf.

    Args:
      tree: a tree of arrays.

    Returns:
      A tree of the same structure, real leaves.

    >>> import jax.numpy as jnp
    >>> real([jnp.array([1 + 2j])])
    [Array([1.], dtype=float32)]
    """
    return jax.tree_util.tree_map(jnp.real, tree)


def clip(tree: PyTree, min_value: Optional[Any] = None,
         max_value: Optional[Any] = None) -> PyTree:
    """Every entry clipped to ``[min_value, max_value]`` (``None``: no bound on that side).

    Args:
      tree: a tree of arrays.
      min_value: the lower bound, or ``None``.
      max_value: the upper bound, or ``None``.

    Returns:
      A tree of the same structure.

    >>> import jax.numpy as jnp
    >>> clip({'w': jnp.array([-2., 0.5, 3.])}, -1., 1.)
    {'w': Array([-1. ,  0.5,  1. ], dtype=float32)}
    """
    return jax.tree_util.tree_map(lambda x: jnp.clip(x, min_value, max_value), tree)


def batch_shape(tree: PyTree, shape: tuple[int, ...] = ()) -> PyTree:
    """Every leaf broadcast to leading batch dimensions ``shape``.

    Args:
      tree: a tree of arrays.
      shape: the leading dimensions to add.

    Returns:
      A tree whose leaves have shape ``(*shape, *leaf.shape)``.

    >>> import jax.numpy as jnp
    >>> batch_shape({'w': jnp.ones(2)}, (3,))['w'].shape
    (3, 2)
    """
    return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (*shape, *jnp.shape(x))), tree)


def where(condition: Any, tree_x: PyTree, tree_y: PyTree) -> PyTree:
    """Leafwise ``jnp.where(condition, x, y)``.

    Args:
      condition: a boolean (scalar, or broadcasting against every leaf).
      tree_x: the tree taken where ``condition`` holds.
      tree_y: a tree of the same structure, taken elsewhere.

    Returns:
      The selected tree.

    >>> import jax.numpy as jnp
    >>> where(jnp.array(False), [jnp.array([1.])], [jnp.array([2.])])
    [Array([2.], dtype=float32)]
    """
    return _paired(lambda a, b: jnp.where(condition, a, b), "where", tree_x, tree_y)


# --------------------------------------------------------------------------
# Reductions
# --------------------------------------------------------------------------

def vdot(tree_x: PyTree, tree_y: PyTree) -> Array:
    """The inner product ``sum over leaves of <conj(x), y>``, at the highest matmul precision.

    Args:
      tree_x: a tree (complex leaves are conjugated).
      tree_y: a tree of the same structure.

    Returns:
      A scalar (float32 zero for empty trees).

    >>> import jax.numpy as jnp
    >>> vdot({'a': jnp.array([1., 2.])}, {'a': jnp.array([3., 4.])})
    Array(11., dtype=float32)
    """
    def leaf(a: Any, b: Any) -> Array:
        a, b = jnp.asarray(a), jnp.asarray(b)
        if a.shape != b.shape:
            raise ValueError(f"vdot: leaf shapes differ: {a.shape} vs {b.shape}.")
        return _leaf_vdot(a, b)

    return _total(_leaves(_paired(leaf, "vdot", tree_x, tree_y)))


# <conj(a), b> over all axes, no ravel (costly across devices); jitted, as jnp.vdot is, so
# that eagerly it gives jnp.vdot's bits (XLA fuses the conj into a complex dot only in one
# program); under an outer jit it is inlined, the compiled program unchanged.
_leaf_vdot = jax.jit(lambda a, b: jnp.tensordot(jnp.conj(a), b, a.ndim,
                                                precision=jax.lax.Precision.HIGHEST))


def sum(tree: PyTree, associative_reduction: bool = False) -> Array:  # noqa: A001
    """The sum of all entries of all leaves.

    Args:
      tree: a tree of arrays.
      associative_reduction: add the per-leaf sums as a balanced tree (faster
        to compile for very many leaves; the rounding may differ slightly).

    Returns:
      A scalar (float32 zero for an empty tree).

    >>> import jax.numpy as jnp
    >>> sum({'a': jnp.array([1., 2.]), 'b': jnp.array(3.)})
    Array(6., dtype=float32)
    """
    parts = [jnp.sum(x) for x in _leaves(tree)]
    if not associative_reduction or not parts:
        return _total(parts)
    while len(parts) > 1:
        parts = [parts[i] + parts[i + 1] if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0]


def max(tree: PyTree) -> Array:  # noqa: A001
    """The largest entry of all leaves (``-inf`` for a tree without entries).

    Args:
      tree: a tree of arrays; empty leaves are skipped.

    Returns:
      A scalar.

    >>> import jax.numpy as jnp
    >>> max({'a': jnp.array([1., 5.]), 'b': jnp.array(3.)})
    Array(5., dtype=float32)
    """
    return functools.reduce(jnp.maximum, [jnp.max(x) for x in _leaves(tree) if jnp.size(x)],
                            -float("inf"))


def min(tree: PyTree) -> Array:  # noqa: A001
    """The smallest entry of all leaves (``inf`` for a tree without entries).

    Args:
      tree: a tree of arrays; empty leaves are skipped.

    Returns:
      A scalar.

    >>> import jax.numpy as jnp
    >>> min({'a': jnp.array([1., 5.]), 'b': jnp.array(-3.)})
    Array(-3., dtype=float32)
    """
    return functools.reduce(jnp.minimum, [jnp.min(x) for x in _leaves(tree) if jnp.size(x)],
                            float("inf"))


def size(tree: PyTree) -> int:
    """The number of entries in all leaves.

    Args:
      tree: a tree of arrays.

    Returns:
      A Python int.

    >>> import jax.numpy as jnp
    >>> size({'a': jnp.ones((2, 3)), 'b': jnp.ones(4)})
    10
    """
    return _builtin_sum(int(jnp.size(x)) for x in _leaves(tree))


def norm(tree: PyTree, ord: Union[int, str, float, None] = None,  # noqa: A002
         squared: bool = False) -> Array:
    """The vector norm of a whole tree, as if all leaves were one flat vector.

    ``ord`` is ``None`` or ``2`` (L2), ``1`` (sum of moduli) or ``inf`` /
    ``'inf'`` / ``'infinity'`` (largest modulus); ``squared`` squares the result.

    Args:
      tree: a tree of arrays (complex leaves count ``|x|``).
      ord: the order of the norm.
      squared: return the squared norm.

    Returns:
      A real scalar; L2 norms accumulate in at least float32.

    Raises:
      ValueError: for another ``ord``.

    >>> import jax.numpy as jnp
    >>> norm({'a': jnp.array([3.]), 'b': jnp.array([-4.])})
    Array(5., dtype=float32)
    >>> norm({'a': jnp.array([3.]), 'b': jnp.array([-4.])}, ord=1)
    Array(7., dtype=float32)
    >>> norm([jnp.array([3j])], squared=True)
    Array(9., dtype=float32)
    """
    if ord is None or ord == 2:
        sq = _total([sum_of_squares(x) for x in _leaves(tree)])
        return sq if squared else jnp.sqrt(sq)
    if ord == 1:
        out = _total([jnp.sum(jnp.abs(x)) for x in _leaves(tree)])
    elif ord == jnp.inf or ord in ("inf", "infinity"):
        out = max(jax.tree_util.tree_map(jnp.abs, tree))
    else:
        raise ValueError(f"Unsupported ord: {ord}")
    out = jnp.asarray(out)
    return abs_sq(out) if squared else out


def allclose(a: PyTree, b: PyTree, rtol: Any = 1e-05, atol: Any = 1e-08,
             equal_nan: bool = False) -> Any:
    """Whether two trees are entrywise equal within ``atol + rtol * |b|`` (``jnp.allclose``).

    Args:
      a: a tree.
      b: a tree of the same structure.
      rtol: the relative tolerance.
      atol: the absolute tolerance.
      equal_nan: count NaNs as equal.

    Returns:
      A boolean (a JAX bool array; ``True`` for empty trees).

    >>> import jax.numpy as jnp
    >>> bool(allclose({'w': jnp.array([1., 2.])}, {'w': jnp.array([1., 2. + 1e-7])}))
    True
    """
    flags = _paired(lambda x, y: jnp.allclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan),
                    "allclose", a, b)
    return functools.reduce(operator.and_, _leaves(flags), True)
