"""optax.tree's state helpers: find fields of an optimizer state by name, map over its
params-shaped parts.

``get``, ``set`` and ``get_all_with_path`` search a state tree (NamedTuples,
dicts, lists) for a named field, reporting NamedTuple fields as
:class:`NamedTupleKey`; ``map_params`` applies a function to every params-shaped
tree inside a state; ``is_named_tuple`` is the test of a state's named node they
share. Re-exported by :mod:`functrain.tree`, which is where users reach them
(``functrain.tree.get(state, 'count')``); ``map_params`` is also
``functrain.tree_map_params`` (and ``functrain.tree_utils.tree_map_params``), the same
function under optax's older name. The tree arithmetic is in
:mod:`functrain.tree.ops`, the key-path checks in :mod:`functrain.tree.checks`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax

PyTree = Any
KeyPath = tuple

# --------------------------------------------------------------------------
# Optimizer states: find fields by name, map over the params-shaped parts
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False)
class NamedTupleKey:
    """A key-path entry for the field ``name`` of a NamedTuple of class ``tuple_name``.

    ``get``, ``set`` and ``get_all_with_path`` report such entries so a
    ``filtering`` function can tell apart equal field names of different
    states (``ScaleByAdamState.count`` vs ``ScaleByScheduleState.count``).

    optax defines its own class of this name (``optax.tree_utils.NamedTupleKey``, a frozen
    dataclass with the same two fields). Without importing optax, a key here compares
    equal (either way round) and hashes equal to any ``NamedTupleKey`` with the same
    ``tuple_name`` and ``name``, so paths, sets and dict keys mix with optax's; only an
    ``isinstance`` test against optax's class tells them apart. The other entries of a
    path are jax's own (``jax.tree_util.DictKey``, ``SequenceKey``), as in optax.

    Attributes:
      tuple_name: the NamedTuple's class name.
      name: the field's name.

    >>> key = NamedTupleKey('ScaleByAdamState', 'mu')
    >>> str(key), key == NamedTupleKey('ScaleByAdamState', 'mu'), key == 'mu'
    ('ScaleByAdamState.mu', True, False)
    """

    tuple_name: str
    name: str

    def __str__(self) -> str:
        return f"{self.tuple_name}.{self.name}"

    def __eq__(self, other: object) -> bool:
        # Any class named NamedTupleKey with these two fields: optax's too, whose own
        # dataclass __eq__ answers NotImplemented for another class and so defers here.
        if (type(other).__name__ != "NamedTupleKey"
                or not hasattr(other, "tuple_name") or not hasattr(other, "name")):
            return NotImplemented
        return (self.tuple_name, self.name) == (other.tuple_name, other.name)

    def __hash__(self) -> int:
        return hash((self.tuple_name, self.name))  # a frozen dataclass's hash, as optax's


def is_named_tuple(x: Any) -> bool:
    """Whether ``x`` is an instance of a NamedTuple class (a tuple with ``_fields``).

    The one test of what counts as a state's named node: the state helpers here use it,
    and other modules reach it as ``functrain.tree.is_named_tuple`` (imported there,
    not in its ``__all__``): :mod:`functrain.quantized_state`, the zoom line search.

    Args:
      x: any object.

    Returns:
      ``True`` for a NamedTuple instance, ``False`` for anything else (a plain tuple too).

    >>> import functrain
    >>> state = functrain.adam(0.1).init({})
    >>> is_named_tuple(state[0]), is_named_tuple(()), is_named_tuple({'mu': 1})
    (True, False, False)
    """
    return isinstance(x, tuple) and hasattr(x, "_fields")


def _has_any(node: Any, keys: tuple) -> bool:
    """Whether ``node`` has a field/key in ``keys``, or is a NamedTuple named by one."""
    if is_named_tuple(node):
        return any(k in node._fields for k in keys) or type(node).__name__ in keys
    return isinstance(node, dict) and any(k in node for k in keys)


def _named_leaves(tree: PyTree, stop: Callable[[Any], bool]) -> list:
    """(path, node) of the leaves of ``tree`` (stopping at ``stop`` nodes), NamedTuple
    fields entered as :class:`NamedTupleKey`."""
    out = []
    pairs = jax.tree_util.tree_leaves_with_path(
        tree, is_leaf=lambda x: stop(x) or is_named_tuple(x))
    for path, node in pairs:
        if stop(node) or not is_named_tuple(node):
            out.append((path, node))
            continue
        for field in node._fields:
            entry = NamedTupleKey(type(node).__name__, field)
            out += [((*path, entry, *sub), v)
                    for sub, v in _named_leaves(getattr(node, field), stop)]
    return out


def _children(path: KeyPath, node: Any) -> list:
    if is_named_tuple(node):
        return [((*path, NamedTupleKey(type(node).__name__, f)), getattr(node, f))
                for f in node._fields]
    if isinstance(node, dict):
        return [((*path, jax.tree_util.DictKey(k)), v) for k, v in node.items()]
    raise ValueError(f"Subtree must be a dict or a NamedTuple. Got {type(node)}")


def _find(tree: PyTree, key: Any) -> list:
    def stop(x: Any) -> bool:
        return _has_any(x, (key,))

    nodes = [(p, n) for p, n in _named_leaves(tree, stop) if stop(n)]
    found = []
    for path, node in nodes:
        if is_named_tuple(node):
            if type(node).__name__ == key:
                found.append((path, node))
            else:
                found.append(((*path, NamedTupleKey(type(node).__name__, key)),
                              getattr(node, key)))
        else:
            found.append(((*path, jax.tree_util.DictKey(key)), node[key]))
    for path, node in nodes:
        for child_path, child in _children(path, node):
            found += [((*child_path, *p), v) for p, v in _find(child, key)]
    return found


def get_all_with_path(tree: PyTree, key: Any,
                      filtering: Optional[Callable[[KeyPath, Any], bool]] = None) -> list:
    """Every ``(path, value)`` in ``tree`` for a dict key, NamedTuple field or NamedTuple name.

    Args:
      tree: the tree to search (an optimizer state, say).
      key: the key, field or class name to look for.
      filtering: keeps only the pairs for which ``filtering(path, value)`` is true.

    Returns:
      A list of ``(path, value)``; paths are tuples of jax key entries and
      :class:`NamedTupleKey`.

    >>> import jax, jax.numpy as jnp, functrain
    >>> state = functrain.adam(0.1).init({'w': jnp.zeros(2)})
    >>> [[str(entry) for entry in p] for p, _ in get_all_with_path(state, 'count')]
    [['[0]', 'ScaleByAdamState.count']]
    """
    found = _find(tree, key)
    if filtering:
        found = [(p, v) for p, v in found if filtering(p, v)]
    return found


def get(tree: PyTree, key: Any, default: Optional[Any] = None,
        filtering: Optional[Callable[[KeyPath, Any], bool]] = None) -> Any:
    """The one value in ``tree`` for ``key`` (see :func:`get_all_with_path`), or ``default``.

    Args:
      tree: the tree to search.
      key: the dict key, NamedTuple field or NamedTuple class name.
      default: returned when nothing matches.
      filtering: as for :func:`get_all_with_path`.

    Returns:
      The value found, or ``default``.

    Raises:
      KeyError: several values match.

    >>> import jax.numpy as jnp, functrain
    >>> state = functrain.adam(0.1).init({'w': jnp.zeros(2)})
    >>> get(state, 'count')
    Array(0, dtype=int32)
    """
    found = get_all_with_path(tree, key, filtering=filtering)
    if len(found) > 1:
        raise KeyError(f"Found multiple values for '{key}' in {tree}.")
    return found[0][1] if found else default


def _plain_key(entry: Any) -> Any:
    if isinstance(entry, jax.tree_util.DictKey):
        if isinstance(entry.key, (str, int)):
            return entry.key
        raise KeyError("Hashable keys not supported")
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return getattr(entry, attr)
    raise KeyError(f"Tree key '{entry}' of type '{type(entry)}' not valid.")


def set(tree: PyTree, filtering: Optional[Callable[[KeyPath, Any], bool]] = None, /,  # noqa: A001
        **kwargs: Any) -> PyTree:
    """A copy of ``tree`` with the values of the given keys/fields/NamedTuples replaced.

    Args:
      tree: the tree (an optimizer state, say).
      filtering: replace only values where ``filtering(path, value)`` is true.
      **kwargs: ``key=new_value`` for dict keys, NamedTuple fields or
        NamedTuple class names.

    Returns:
      The new tree.

    Raises:
      KeyError: a key has no (filtered) match in ``tree``.

    >>> import jax.numpy as jnp, functrain
    >>> state = functrain.adam(0.1).init({'w': jnp.zeros(2)})
    >>> set(state, count=jnp.asarray(5))[0].count
    Array(5, dtype=int32, weak_type=True)
    """
    for key in kwargs:
        if not get_all_with_path(tree, key, filtering):
            if filtering:
                raise KeyError(f"Found no values matching '{key}' given the filtering "
                               f"operation in {tree}")
            raise KeyError(f"Found no values matching '{key}' in {tree}")
    keys = tuple(kwargs)

    def keep(path: KeyPath, value: Any) -> bool:
        return filtering is None or filtering(path, value)

    def replace(path: KeyPath, node: Any) -> Any:
        if not _has_any(node, keys):
            return node
        if is_named_tuple(node) and type(node).__name__ in kwargs and keep(path, node):
            return kwargs[type(node).__name__]
        new = {}
        for child_path, child in _children(path, node):
            k = _plain_key(child_path[-1])
            if k in kwargs and keep(child_path, child):
                new[k] = kwargs[k]
            elif isinstance(child, (dict, list, tuple)):
                new[k] = replace(child_path, child)
            else:
                new[k] = child
        return node._replace(**new) if is_named_tuple(node) else new

    def stop(x: Any) -> bool:
        return _has_any(x, keys)

    treedef = jax.tree_util.tree_structure(tree, is_leaf=stop)
    return treedef.unflatten([replace(p, n) for p, n in _named_leaves(tree, stop)])


@jax.tree_util.register_pytree_node_class
class _ParamsStandIn:
    """A leafless node passed to ``init`` to find where a state holds params-shaped trees."""

    def tree_flatten(self) -> tuple:
        return (), None

    @classmethod
    def tree_unflatten(cls, aux: Any, children: Any) -> "_ParamsStandIn":
        return cls()


def map_params(initable: Any, f: Callable[..., Any], state: PyTree, /, *rest: Any,
               transform_non_params: Optional[Callable[..., Any]] = None,
               is_leaf: Optional[Callable[[Any], bool]] = None) -> PyTree:
    """``f`` mapped over every params-shaped tree inside an optimizer state.

    The one implementation of both ``functrain.tree.map_params`` (optax's
    ``optax.tree.map_params``) and ``functrain.tree_map_params`` (optax's
    ``optax.tree_utils.tree_map_params``): the two names are the same function.

    ``initable`` (the optimizer, or its ``init``) is run on a leafless stand-in for
    the params: the parts of its state built from the params (the moments, the
    accumulators) are where ``state`` holds params-shaped trees, and ``f`` is mapped
    over those leaf by leaf (with the matching leaves of ``rest``). Other fields (step
    counts) are kept, or passed through ``transform_non_params``. Typical use:
    sharding specs for the state from those of the params.

    Args:
      initable: the optimizer (an object with ``init``) or its ``init(params)``.
      f: the function applied to each leaf of each params-shaped tree, with the
        matching leaves of ``rest`` as further arguments.
      state: the optimizer state (as made by ``initable``) to map over.
      *rest: trees like the params, passed to ``f`` leaf by leaf.
      transform_non_params: applied to every other leaf of the state (``None``:
        those are kept as they are).
      is_leaf: passed to ``jax.tree_util.tree_map`` over the params-shaped trees
        (e.g. to stop at ``MaskedNode`` placeholders).

    Returns:
      A tree like ``state`` with ``f``'s results in place of the params-shaped trees.

    Raises:
      TypeError: ``f`` is not callable, or ``initable`` is neither an optimizer nor
        an ``init`` function.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adam(0.1)
    >>> state = opt.init({'w': jnp.zeros(2)})
    >>> out = map_params(opt, lambda x: x.shape, state, transform_non_params=lambda x: None)
    >>> out[0].mu, out[0].count
    ({'w': (2,)}, None)
    >>> functrain.tree_map_params is functrain.tree.map_params
    True
    """
    if not callable(f):
        raise TypeError(f"tree.map_params / tree_map_params: f must be a function, got "
                        f"{type(f).__name__}.")
    init = getattr(initable, "init", None)
    if not callable(init):
        if not callable(initable):
            raise TypeError(f"tree.map_params / tree_map_params: initable must be an "
                            f"optimizer (an object with init) or an init function, got "
                            f"{type(initable).__name__}.")
        init = initable
    skeleton = init(_ParamsStandIn())

    def one(marker: Any, value: Any) -> Any:
        if isinstance(marker, _ParamsStandIn):
            return jax.tree_util.tree_map(f, value, *rest, is_leaf=is_leaf)
        return value if transform_non_params is None else transform_non_params(value)

    return jax.tree_util.tree_map(one, skeleton, state,
                                  is_leaf=lambda v: isinstance(v, _ParamsStandIn))
