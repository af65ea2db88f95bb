"""Applying updates to parameters: ``apply_updates``, and the averages of parameters
``incremental_update`` (Polyak) and ``periodic_update`` (a target network's copy), with
optax's signatures and numbers.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from functrain import tree as ft
from functrain.arg_checks import check_range

Params = Any
Updates = Any

__all__ = ["apply_updates", "incremental_update", "periodic_update"]


def apply_updates(params: Params, updates: Updates) -> Params:
    """``params + updates`` leaf by leaf, keeping each parameter's dtype.

    Args:
      params: the parameter tree.
      updates: a tree of the same structure and shapes.

    Returns:
      The new parameters (``None`` leaves of ``params`` stay ``None``).

    >>> import jax.numpy as jnp
    >>> apply_updates({'w': jnp.array([1., 2.])}, {'w': jnp.array([0.5, -1.])})
    {'w': Array([1.5, 1. ], dtype=float32)}
    """
    if params is None:  # as optax: no parameters, nothing to update
        return None
    ft.check_structure(params, updates, "updates", "params")
    paths, ps, treedef = ft.flatten_with_paths(params)
    us = treedef.flatten_up_to(updates)
    ft.check_shapes(paths, ps, us, "updates", "params")
    return treedef.unflatten(
        [None if p is None else (jnp.asarray(p) + u).astype(jnp.asarray(p).dtype)
         for p, u in zip(ps, us)])


def incremental_update(new_tensors: Params, old_tensors: Params, step_size: Any) -> Params:
    """Polyak averaging: ``step_size * new + (1 - step_size) * old``, leaf by leaf.

    Keeps a moving average of the parameters (for evaluation), as
    ``optax.incremental_update`` (Polyak and Juditsky, 1992). ``None`` leaves
    of ``new_tensors`` stay ``None``.

    Args:
      new_tensors: the latest values (e.g. the params after a step).
      old_tensors: the moving average so far, a tree like ``new_tensors``.
      step_size: the weight of the new values, a number or scalar array
        (traced values pass).

    Returns:
      The new average, each leaf in its ``old_tensors`` leaf's dtype.

    >>> import jax.numpy as jnp
    >>> incremental_update({'w': jnp.array([1.])}, {'w': jnp.array([0.])}, 0.1)
    {'w': Array([0.1], dtype=float32)}
    """
    check_range("step_size", step_size, float("-inf"), owner="incremental_update")
    return _pair_map("incremental_update", new_tensors, old_tensors,
                     lambda new, old: step_size * new + (1.0 - step_size) * old)


def periodic_update(new_tensors: Params, old_tensors: Params, steps: Any,
                    update_period: Any) -> Params:
    """``new_tensors`` when ``steps % update_period == 0``, else ``old_tensors``.

    A slow copy of the params, refreshed every ``update_period`` steps (a
    target network, as ``optax.periodic_update``; Mnih et al., 2015).

    Args:
      new_tensors: the latest values.
      old_tensors: the slow copy, a tree like ``new_tensors``.
      steps: the number of steps taken (an int or an integer scalar array,
        traced under ``jit``).
      update_period: refresh every this many steps, ``>= 1``.

    Returns:
      ``new_tensors`` or ``old_tensors`` (each leaf in its ``old_tensors``
      leaf's dtype).

    >>> import jax.numpy as jnp
    >>> periodic_update([jnp.ones(1)], [jnp.zeros(1)], steps=4, update_period=2)
    [Array([1.], dtype=float32)]
    """
    check_range("update_period", update_period, 1.0, owner="periodic_update")
    refresh = jnp.mod(steps, update_period) == 0
    return _pair_map("periodic_update", new_tensors, old_tensors,
                     lambda new, old: jnp.where(refresh, new, old))


def _pair_map(owner: str, new_tensors: Params, old_tensors: Params, fn: Any) -> Params:
    """``fn(new, old)`` on each leaf pair, cast to ``old`` 's dtype (``None`` stays ``None``)."""
    is_none = lambda x: x is None  # noqa: E731
    flat, treedef = jax.tree_util.tree_flatten_with_path(new_tensors, is_leaf=is_none)
    try:
        olds = treedef.flatten_up_to(old_tensors)
    except (ValueError, TypeError):
        ft.check_structure(new_tensors, old_tensors, "old_tensors", "new_tensors")
        raise ValueError(f"{owner}: old_tensors does not have the structure of new_tensors.")
    pairs = [(jax.tree_util.keystr(path), new, old) for (path, new), old in zip(flat, olds)
             if new is not None]
    ft.check_shapes([p for p, _, _ in pairs], [jnp.asarray(n) for _, n, _ in pairs],
                    [jnp.asarray(o) for _, _, o in pairs], "old_tensors", "new_tensors")
    return treedef.unflatten(
        [None if new is None else fn(jnp.asarray(new), jnp.asarray(old)).astype(
            jnp.asarray(old).dtype) for (_, new), old in zip(flat, olds)])
