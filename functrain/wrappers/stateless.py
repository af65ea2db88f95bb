"""Transformations from plain functions, and mapping over the params inside a state.

* ``stateless(f)``: a transformation from a function of the whole updates tree
  (and the params);
* ``stateless_with_tree_map(f)``: the same from a function of one array;
* ``init_empty_state``: the ``init`` of a transformation that keeps no state;
* ``tree_map_params``: apply a function to every params-shaped tree inside an
  optimizer's state (e.g. to build sharding specs for the state from those
  of the params).

Names, arguments and results are optax 0.2.8's.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax

from functrain import tree as ft
from functrain.transforms.base import (EmptyState, GradientTransformation, OptState, Params,
                                       Updates)

Array = jax.Array
PyTree = Any


def init_empty_state(params: Params) -> EmptyState:
    """The ``init`` of a transformation that keeps no state: returns ``EmptyState()``.

    Args:
      params: the parameters (ignored).

    Returns:
      ``EmptyState()``.

    >>> import jax.numpy as jnp
    >>> init_empty_state({'w': jnp.ones(2)})
    EmptyState()
    """
    del params
    return EmptyState()


def _check_function(owner: str, f: Any) -> None:
    if not callable(f):
        raise TypeError(f"{owner}: f must be a function, got {type(f).__name__}.")


def stateless(f: Callable[[Updates, Optional[Params]], Updates]) -> GradientTransformation:
    """A transformation without state from ``f(updates, params) -> updates``.

    ``f`` receives the whole updates tree and the params (``None`` when
    ``update`` is called without them).

    Args:
      f: the function of the updates tree and the params (or ``None``).

    Returns:
      A ``GradientTransformation`` whose state is ``EmptyState()``.

    >>> import jax, jax.numpy as jnp, functrain
    >>> tx = functrain.stateless(lambda u, p: jax.tree_util.tree_map(lambda g: -g, u))
    >>> tx.update({'w': jnp.ones(2)}, tx.init({'w': jnp.ones(2)}))
    ({'w': Array([-1., -1.], dtype=float32)}, EmptyState())
    """
    _check_function("stateless", f)

    def update_fn(updates: Updates, state: OptState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, EmptyState]:
        del state, extra_args
        return f(updates, params), EmptyState()

    return GradientTransformation(init_empty_state, update_fn)


def stateless_with_tree_map(f: Callable[[Array, Optional[Array]], Array]
                            ) -> GradientTransformation:
    """A transformation without state from ``f(update_leaf, param_leaf) -> update_leaf``.

    ``f`` is mapped over the leaves of the updates (and of the params, which
    must then have the same structure; ``None`` for each leaf when ``update``
    is called without params).

    Args:
      f: the function of one update array and its parameter array (or ``None``).

    Returns:
      A ``GradientTransformation`` whose state is ``EmptyState()``.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.stateless_with_tree_map(lambda g, p: g * p)
    >>> params = {'w': jnp.array([2., 3.])}
    >>> tx.update({'w': jnp.ones(2)}, tx.init(params), params)[0]
    {'w': Array([2., 3.], dtype=float32)}
    """
    _check_function("stateless_with_tree_map", f)

    def update_fn(updates: Updates, state: OptState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, EmptyState]:
        del state, extra_args
        if params is None:
            return jax.tree_util.tree_map(lambda g: f(g, None), updates), EmptyState()
        ft.check_structure(updates, params, "params", "updates")
        return jax.tree_util.tree_map(f, updates, params), EmptyState()

    return GradientTransformation(init_empty_state, update_fn)


class _ParamsSlot:
    """A tree with no leaves standing for the params when an ``init`` is traced.

    Wherever an optimizer's ``init`` puts a tree like the params (a moment, an
    accumulator), it puts this object; everything else (counts) is an array.
    """


jax.tree_util.register_pytree_node(_ParamsSlot, lambda _: ((), None),
                                   lambda aux, children: _ParamsSlot())


def tree_map_params(initable: Any, f: Callable[..., Any], state: OptState, /, *rest: Any,
                    transform_non_params: Optional[Callable[[Any], Any]] = None,
                    is_leaf: Optional[Callable[[Any], bool]] = None) -> OptState:
    """Apply ``f`` to every params-shaped tree inside an optimizer state.

    ``initable`` (the optimizer, or its ``init``) is run on a placeholder that
    stands for the params: the parts of its state built from the params (the
    moments, the accumulators) are where ``state`` holds params-shaped trees,
    and ``f`` is mapped over those leaf by leaf (with the matching leaves of
    ``rest``). Other fields (step counts) are kept, or passed through
    ``transform_non_params``. Typical use: sharding specs for the state from
    those of the params.

    Args:
      initable: the optimizer (an object with ``init``) or its ``init``.
      f: the function applied to each leaf of each params-shaped tree, with
        the matching leaves of ``rest`` as further arguments.
      state: the optimizer state (as made by ``initable``) to map over.
      *rest: trees like the params, passed to ``f`` leaf by leaf.
      transform_non_params: applied to every other leaf of the state
        (``None``: those are kept as they are).
      is_leaf: passed to ``jax.tree_util.tree_map`` over the params-shaped
        trees (e.g. to stop at ``MaskedNode`` placeholders).

    Returns:
      A tree like ``state`` with ``f``'s results in place of the params-shaped
      trees.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adam(0.1)
    >>> params = {'w': jnp.ones(2)}
    >>> state = opt.init(params)
    >>> specs = functrain.tree_map_params(opt, lambda x: x.shape, state,
    ...                                   transform_non_params=lambda x: None)
    >>> specs[0].mu, specs[0].count
    ({'w': (2,)}, None)
    """
    if not callable(f):
        raise TypeError(f"tree_map_params: f must be a function, got {type(f).__name__}.")
    init = getattr(initable, "init", None)
    if not callable(init):
        if not callable(initable):
            raise TypeError(f"tree_map_params: initable must be an optimizer (an object "
                            f"with init) or an init function, got "
                            f"{type(initable).__name__}.")
        init = initable
    slots = init(_ParamsSlot())

    def map_one(slot: Any, value: Any) -> Any:
        if isinstance(slot, _ParamsSlot):
            return jax.tree_util.tree_map(f, value, *rest, is_leaf=is_leaf)
        return value if transform_non_params is None else transform_non_params(value)

    return jax.tree_util.tree_map(map_one, slots, state,
                                  is_leaf=lambda x: isinstance(x, _ParamsSlot))
