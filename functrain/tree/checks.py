"""Checks that name the offending leaf: tree structures, shapes, masks and placeholders.

``check_structure``, ``check_shapes``, ``check_leaf_dtypes``, ``key_paths`` /
``format_paths`` / ``flatten_with_paths`` / ``flatten_like``, the masks
(``MaskedNode``, ``resolve_mask``, ``resolve_leaf_mask``, ``is_mask_function``) and the
placeholders (``is_placeholder``, ``is_params_placeholder``). The engine
(:mod:`functrain.engine.program`) and the wrappers call these before any array
math, so a mismatch raises an error that names the key path of the leaf at fault and
what was expected. :mod:`functrain.tree` re-exports them
(``functrain.tree.check_structure`` and so on; its ``__all__`` lists
``check_structure``, ``check_shapes``, ``key_paths``, ``MaskedNode`` and
``is_placeholder``).

This module imports no other functrain module. optax.tree's functions are not here:
the arithmetic is in :mod:`functrain.tree.ops`, the state helpers (``get``, ``set``,
``get_all_with_path``, ``map_params``) in :mod:`functrain.tree.state`, the rest in
:mod:`functrain.tree`.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any
KeyPath = tuple

__all__ = ["MaskedNode", "is_placeholder", "key_paths", "check_structure", "check_shapes",
           "format_paths", "is_mask_function", "is_params_placeholder", "check_leaf_dtypes",
           "flatten_with_paths", "flatten_like", "resolve_mask", "resolve_leaf_mask"]


class MaskedNode(tuple):
    """Placeholder for a leaf that a mask left out: an empty pytree node.

    It has no children, so masked-out leaves hold no state and no buffers.

    Attributes:
      (none): an empty tuple; ``MaskedNode()`` is all there is.

    >>> import jax
    >>> jax.tree_util.tree_leaves({'a': MaskedNode(), 'b': 1.0})
    [1.0]
    """

    __slots__ = ()

    def __new__(cls) -> "MaskedNode":
        return super().__new__(cls, ())

    def __repr__(self) -> str:
        return "MaskedNode()"


jax.tree_util.register_pytree_node(
    MaskedNode, lambda _: ((), None), lambda _aux, _children: MaskedNode())


def is_placeholder(x: Any) -> bool:
    """Whether ``x`` stands in for a leaf that is not there: ``None`` or a ``MaskedNode``.

    Args:
      x: any pytree node or leaf.

    Returns:
      ``True`` for ``None``, :class:`MaskedNode` and optax's ``MaskedNode`` (an empty
      tuple class of that name: states made by optax's ``masked`` are read as they are),
      else ``False``.

    >>> is_placeholder(MaskedNode()), is_placeholder(None), is_placeholder(0.0)
    (True, True, False)
    """
    return x is None or isinstance(x, MaskedNode) or (
        type(x).__name__ == "MaskedNode" and isinstance(x, tuple) and not x)


# --------------------------------------------------------------------------
# Structure and shape checks with key paths
# --------------------------------------------------------------------------

def key_paths(tree: PyTree) -> list[str]:
    """Key paths of the leaves of ``tree`` (placeholders included), as strings.

    Args:
      tree: any tree.

    Returns:
      One key-path string per leaf (``MaskedNode``/``None`` placeholders count as leaves).

    >>> key_paths({'decoder': {'w': 1, 'b': 2}})
    ["['decoder']['b']", "['decoder']['w']"]
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_placeholder)
    return [jax.tree_util.keystr(p) for p, _ in flat]


def _node_description(tree: PyTree) -> dict[str, str]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_placeholder)
    return {jax.tree_util.keystr(p): type(x).__name__ for p, x in flat}


def check_structure(reference: PyTree, other: PyTree, other_name: str,
                    reference_name: str, *, prefix: bool = False) -> None:
    """Raise a ``ValueError`` naming the key paths where two trees differ.

    With ``prefix=True``, ``reference`` only has to be a prefix of ``other``.

    Args:
      reference: the tree taken as right (e.g. the params).
      other: the tree to check (e.g. the updates).
      other_name: how to call ``other`` in the message.
      reference_name: how to call ``reference`` in the message.
      prefix: accept ``reference`` being a prefix of ``other``.

    Returns:
      ``None``; raises ``ValueError`` naming the differing key paths.

    >>> check_structure({'w': 1}, {'w': 2, 'b': 3}, 'grads', 'params')
    Traceback (most recent call last):
    ...
    ValueError: grads and params have different tree structures: ['b'] in grads is missing from params.
    """
    ref_def = jax.tree_util.tree_structure(reference, is_leaf=is_placeholder)
    other_def = jax.tree_util.tree_structure(other, is_leaf=is_placeholder)
    if ref_def == other_def:
        return
    if prefix:
        try:
            ref_def.flatten_up_to(other)
            return
        except (ValueError, TypeError):
            pass
    ref_paths, other_paths = key_paths(reference), key_paths(other)
    ref_set, other_set = set(ref_paths), set(other_paths)
    problems = []
    extra = [p for p in other_paths if p not in ref_set]
    missing = [p for p in ref_paths if p not in other_set]
    if extra:
        problems.append(f"{format_paths(extra)} in {other_name} "
                        f"{'is' if len(extra) == 1 else 'are'} missing from {reference_name}")
    if missing:
        problems.append(f"{format_paths(missing)} in {reference_name} "
                        f"{'is' if len(missing) == 1 else 'are'} missing from {other_name}")
    if not problems:
        ref_nodes, other_nodes = _node_description(reference), _node_description(other)
        diffs = [p for p in ref_paths if ref_nodes[p] != other_nodes.get(p)]
        if diffs:
            p = diffs[0]
            problems.append(f"at {p or 'the root'} {reference_name} has {ref_nodes[p]} but "
                            f"{other_name} has {other_nodes.get(p)}")
        else:
            problems.append(f"the container types differ ({reference_name}: {ref_def}; "
                            f"{other_name}: {other_def})")
    raise ValueError(f"{other_name} and {reference_name} have different tree structures: "
                     + "; ".join(problems) + ".")


def format_paths(paths: Sequence[str], limit: int = 6) -> str:
    """Key paths joined for an error message, at most ``limit`` of them.

    Args:
      paths: key-path strings (``''`` is the root).
      limit: how many to show before "(and N more)".

    Returns:
      One string.

    >>> format_paths(["['a']", "['b']", ''], limit=2)
    "['a'], ['b'] (and 1 more)"
    """
    shown = [p or "<root>" for p in paths[:limit]]
    more = f" (and {len(paths) - limit} more)" if len(paths) > limit else ""
    return ", ".join(shown) + more


def check_shapes(paths: Sequence[str], reference: Sequence[Any], other: Sequence[Any],
                 other_name: str, reference_name: str) -> None:
    """Raise a ``ValueError`` naming the first leaf whose shapes differ.

    Args:
      paths: the key paths of the leaves, for the message.
      reference: the reference leaves (e.g. the params').
      other: the leaves to check, in the same order.
      other_name: how to call ``other`` in the message.
      reference_name: how to call ``reference`` in the message.

    Returns:
      ``None``; raises ``ValueError`` at the first leaf whose shapes differ
      (placeholders are skipped).

    >>> import jax.numpy as jnp
    >>> check_shapes(["['w']"], [jnp.zeros(2)], [jnp.zeros(3)], 'grads', 'params')
    Traceback (most recent call last):
    ...
    ValueError: grads leaf ['w'] has shape (3,) but params has shape (2,) there.
    """
    for path, a, b in zip(paths, reference, other):
        if is_placeholder(a) or is_placeholder(b):
            continue
        sa, sb = np.shape(a), np.shape(b)
        if sa != sb:
            raise ValueError(f"{other_name} leaf {path or '<root>'} has shape {sb} but "
                             f"{reference_name} has shape {sa} there.")


def flatten_with_paths(tree: PyTree) -> tuple[list[str], list[Any], Any]:
    """(key path strings, leaves, treedef) of ``tree``.

    Args:
      tree: any tree.

    Returns:
      ``(paths, leaves, treedef)``: key-path strings, leaves, and the treedef.

    >>> flatten_with_paths({'a': 1})[:2]
    (["['a']"], [1])
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return [jax.tree_util.keystr(p) for p, _ in flat], [x for _, x in flat], treedef


def flatten_like(treedef: Any, tree: PyTree, tree_name: str, reference: PyTree,
                 reference_name: str) -> list[Any]:
    """Flatten ``tree`` up to ``treedef`` (placeholders kept), or raise naming paths.

    Args:
      treedef: the structure to flatten up to.
      tree: the tree to flatten (e.g. a state field).
      tree_name: how to call ``tree`` in an error.
      reference: a tree with structure ``treedef``, for the error message.
      reference_name: how to call ``reference`` in an error.

    Returns:
      The list of ``tree``'s sub-trees at ``treedef``'s leaves.

    >>> import jax
    >>> td = jax.tree_util.tree_structure({'a': 0, 'b': 0})
    >>> flatten_like(td, {'a': MaskedNode(), 'b': 2.}, 'state', {'a': 0, 'b': 0}, 'params')
    [MaskedNode(), 2.0]
    """
    try:
        return treedef.flatten_up_to(tree)
    except (ValueError, TypeError):
        check_structure(reference, tree, tree_name, reference_name)
        raise


def is_mask_function(mask: Any) -> bool:
    """Whether ``mask`` is a function of the params rather than a tree of bools (optax's rule).

    A mask is a function when it is callable and is not a tree of bools: a plain function
    is, and so is a closure that Equinox's ``closure_to_pytree`` turned into a pytree; a
    callable pytree whose leaves are bools (an Equinox module, say) is a tree.

    Args:
      mask: a mask as given to ``masked``, ``add_decayed_weights``, ...

    Returns:
      ``True`` if it is to be called with the params.

    >>> is_mask_function(lambda p: p), is_mask_function({'w': True})
    (True, False)
    """
    if not callable(mask):
        return False
    leaves = jax.tree_util.tree_leaves(mask)
    return not (leaves and all(isinstance(x, (bool, np.bool_)) for x in leaves))


def is_params_placeholder(tree: Any) -> bool:
    """Whether ``tree`` is a childless stand-in for a params tree (as ``optax.tree.map_params`` passes).

    ``map_params`` calls ``init`` with one opaque, leafless pytree node to find
    the params-shaped parts of a state. Masks and labels cannot be resolved
    against it, so wrappers pass it through unmasked, as optax's do.

    Args:
      tree: the ``params`` given to ``init``.

    Returns:
      ``True`` for a registered pytree node of a custom class with no children.

    >>> is_params_placeholder({}), is_params_placeholder(MaskedNode())
    (False, False)
    """
    if tree is None or isinstance(tree, (MaskedNode, dict, list, tuple)):
        return False
    treedef = jax.tree_util.tree_structure(tree)
    return treedef.num_leaves == 0 and treedef.num_nodes == 1


def check_leaf_dtypes(paths: Sequence[str], leaves: Sequence[Any], active: Sequence[bool],
                      owner: str, what: str, *, real_only: bool = False,
                      integers: bool = False) -> None:
    """Raise ``TypeError`` naming the first active leaf whose dtype ``owner`` cannot take.

    Floating and complex leaves always fit (complex ones unless ``real_only``); bool
    leaves never do. Integer leaves fit where ``integers`` is set: the engine computes
    them, and keeps their per-leaf state, in the float jnp's arithmetic gives them
    (float32, float64 with x64).

    Args:
      paths: the key paths of the leaves.
      leaves: the leaves (arrays or Python numbers).
      active: which leaves ``owner`` transforms (masked-out leaves are not checked).
      owner: the transformation, for the message.
      what: what the leaves are ("params", "updates"), for the message.
      real_only: reject complex leaves too (``owner`` has no complex version).
      integers: accept integer (not bool) leaves.

    Returns:
      ``None``; raises ``TypeError`` when a leaf does not fit.

    >>> import jax.numpy as jnp
    >>> check_leaf_dtypes(["['step']"], [jnp.zeros((), jnp.int32)], [True], 'adam', 'params')
    Traceback (most recent call last):
    ...
    TypeError: adam: params leaf ['step'] has dtype int32, but adam updates floating or complex leaves. Leave it out with functrain.masked or multi_transform (e.g. a step counter kept in params).
    >>> check_leaf_dtypes(["['n']"], [jnp.ones(2, jnp.int32)], [True], 'sgd', 'updates',
    ...                   integers=True)
    """
    for path, x, on in zip(paths, leaves, active):
        if not on or is_placeholder(x):
            continue
        dtype = jnp.result_type(x) if not hasattr(x, "dtype") else np.dtype(x.dtype)
        where = path or "<root>"
        out = "leave it out with functrain.masked or multi_transform"
        if dtype == np.bool_:
            raise TypeError(f"{owner}: {what} leaf {where} has dtype bool, which is not a "
                            f"number to optimize (jax.grad refuses bool inputs too). {out.capitalize()}.")
        if (not jnp.issubdtype(dtype, jnp.inexact) and dtype.name != "float0"
                and not (integers and jnp.issubdtype(dtype, jnp.integer))):
            raise TypeError(
                f"{owner}: {what} leaf {where} has dtype {dtype.name}, but {owner} updates "
                f"floating or complex leaves. {out.capitalize()} (e.g. a step counter kept in params).")
        if real_only and jnp.issubdtype(dtype, jnp.complexfloating):
            raise TypeError(
                f"{owner} does not support complex parameters: {what} leaf {where} is "
                f"{dtype.name}. Optimize its real and imaginary parts as two real leaves "
                f"(split_real_and_imaginary-style), or leave it out of {owner} with a mask.")


def resolve_mask(mask: Any, tree: PyTree, wrapper: str) -> list[bool]:
    """Per-leaf Python bools from a mask tree, a prefix of ``tree``, or a function.

    Args:
      mask: ``None`` (all True), a bool, a tree or prefix of bools, or a function
        of ``tree`` returning one of those.
      tree: the tree the mask applies to (placeholders count as leaves).
      wrapper: the wrapper's name, for error messages.

    Returns:
      One Python bool per leaf slot of ``tree``.

    >>> resolve_mask({'w': True, 'b': False}, {'w': 1., 'b': 2.}, 'masked')
    [False, True]
    """
    if is_params_placeholder(tree):
        return []
    if mask is None:
        return [True] * len(jax.tree_util.tree_leaves(tree, is_leaf=is_placeholder))
    if is_mask_function(mask):
        mask = mask(tree)
    if isinstance(mask, (bool, np.bool_)):
        return [bool(mask)] * len(jax.tree_util.tree_leaves(tree, is_leaf=is_placeholder))
    treedef = jax.tree_util.tree_structure(tree, is_leaf=is_placeholder)
    try:
        # The mask may be a prefix: broadcast each mask leaf over its subtree.
        expanded = treedef.flatten_up_to(
            jax.tree_util.tree_map(lambda m, sub: jax.tree_util.tree_map(
                lambda _: m, sub, is_leaf=is_placeholder), mask, _prefix_view(mask, tree)))
    except (ValueError, TypeError):
        check_structure(mask, tree, "params", f"the mask of {wrapper}", prefix=True)
        raise ValueError(f"the mask of {wrapper} does not fit the params tree "
                         f"(mask: {jax.tree_util.tree_structure(mask)}; "
                         f"params: {treedef}).") from None
    out = []
    for path, m in zip(key_paths(tree), expanded):
        if isinstance(m, jax.core.Tracer) or (hasattr(m, "shape") and np.shape(m) != ()):
            raise TypeError(f"the mask of {wrapper} must hold Python bools; at {path} it "
                            f"holds {type(m).__name__} {np.shape(m)}")
        out.append(bool(m))
    return out


def resolve_leaf_mask(mask: Any, tree: PyTree, wrapper: str) -> list[bool]:
    """:func:`resolve_mask` for the array leaves only (placeholder slots dropped).

    This is what the engine indexes by: one flag per leaf of ``tree_leaves(tree)``.

    Args:
      mask: as for :func:`resolve_mask`.
      tree: the tree the mask applies to.
      wrapper: the wrapper's name, for error messages.

    Returns:
      One Python bool per array leaf of ``tree``.

    >>> resolve_leaf_mask({'a': True, 'b': False, 'c': True},
    ...                   {'a': MaskedNode(), 'b': 1., 'c': 2.}, 'm')
    [False, True]
    """
    flags = resolve_mask(mask, tree, wrapper)
    slots = jax.tree_util.tree_leaves(tree, is_leaf=is_placeholder)
    return [f for f, x in zip(flags, slots) if not is_placeholder(x)]


def _prefix_view(prefix: PyTree, tree: PyTree) -> PyTree:
    """``tree`` cut into subtrees, one per leaf of ``prefix``."""
    prefix_def = jax.tree_util.tree_structure(prefix)
    return prefix_def.unflatten(prefix_def.flatten_up_to(tree))
