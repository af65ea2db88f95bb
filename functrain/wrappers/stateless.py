"""Transformations from plain functions, and mapping over the params inside a state.

* ``stateless(f)``: a transformation from a function of the whole updates tree
  (and the params);
* ``stateless_with_tree_map(f)``: the same from a function of one array;
* ``init_empty_state``: the ``init`` of a transformation that keeps no state;
* ``tree_map_params``: apply a function to every params-shaped tree inside an
  optimizer's state (e.g. to build sharding specs for the state from those
  of the params); re-exported here, it is :func:`functrain.tree.map_params`
  (defined in :mod:`functrain.tree.state`), the same function under optax's older name.

Names, arguments and results are optax 0.2.8's.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax

from functrain import tree as ft
from functrain.tree import map_params as tree_map_params  # noqa: F401  (re-exported)
from functrain.engine.protocol import (EmptyState, GradientTransformation, OptState, Params,
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
