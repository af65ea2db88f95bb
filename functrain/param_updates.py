"""Applying updates to parameters: ``apply_updates``, its bfloat16 variant with stochastic
rounding ``apply_updates_stochastic``, and the averages of parameters
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

__all__ = ["apply_updates", "apply_updates_stochastic", "incremental_update",
           "periodic_update"]


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
    ps, us, treedef = _leaf_pairs(params, updates)
    return treedef.unflatten([None if p is None else _add(p, u) for p, u in zip(ps, us)])


def _leaf_pairs(params: Params, updates: Updates) -> tuple[list, list, Any]:
    """``(param leaves, update leaves, treedef)``, the trees' structures and shapes checked
    first (errors name the key path)."""
    ft.check_structure(params, updates, "updates", "params")
    paths, ps, treedef = ft.flatten_with_paths(params)
    us = treedef.flatten_up_to(updates)
    ft.check_shapes(paths, ps, us, "updates", "params")
    return ps, us, treedef


def _add(p: Any, u: Any) -> jax.Array:
    """``p + u`` in the parameter's dtype."""
    p = jnp.asarray(p)
    return (p + u).astype(p.dtype)


def _check_key(key: Any) -> None:
    """Raise a ``TypeError`` naming ``key`` unless it is one JAX PRNG key (new or raw style)."""
    dtype = getattr(key, "dtype", None)
    shape = tuple(getattr(key, "shape", (None,)))
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        ok = shape == ()
    else:
        ok = dtype == jnp.uint32 and shape == (2,)
    if not ok:
        got = (f"{dtype}{list(shape)}" if dtype is not None else type(key).__name__)
        raise TypeError(f"apply_updates_stochastic: key must be one PRNG key "
                        f"(jax.random.key(seed), or a uint32[2] jax.random.PRNGKey(seed)), "
                        f"got {got}.")


def _round_to_bf16_stochastically(x: jax.Array, key: jax.Array) -> jax.Array:
    """float32 ``x`` rounded to one of its two bfloat16 neighbours, unbiasedly.

    A float32's bit pattern is ``hi * 2**16 + lo``; bfloat16 keeps ``hi``. Between
    ``hi * 2**16`` and ``(hi + 1) * 2**16`` (same sign) the value is linear in the
    pattern, so adding ``r`` uniform in ``[0, 2**16)`` and dropping the low 16 bits
    gives ``hi + 1`` with probability ``lo / 2**16``: the expectation is ``x``.
    Infinities and NaNs (whose low bits could carry) are passed through.
    """
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    if x.ndim and x.shape[-1] % 2 == 0:  # two 16-bit draws per 32-bit word: half the cost
        words = jax.random.bits(key, x.shape[:-1] + (x.shape[-1] // 2,), jnp.uint32)
        noise = jnp.stack([words >> 16, words & 0xFFFF], axis=-1).reshape(x.shape)
    else:
        noise = jax.random.bits(key, x.shape, jnp.uint16).astype(jnp.uint32)
    rounded = (bits + noise) & jnp.uint32(0xFFFF0000)
    out = jax.lax.bitcast_convert_type(rounded, jnp.float32)
    return jnp.where(jnp.isfinite(x), out, x).astype(jnp.bfloat16)


def apply_updates_stochastic(params: Params, updates: Updates, key: jax.Array) -> Params:
    """``params + updates`` with bfloat16 parameters rounded stochastically.

    A bfloat16 weight has 8 significant bits: near 1.0 any update smaller than half its
    spacing (``2**-8``) is rounded away by :func:`apply_updates`, so small learning rates
    stall. Here each bfloat16 leaf is added in float32 and rounded to one of the two
    neighbouring bfloat16 values with probabilities that make the result unbiased
    (``E[result] = params + updates``; Gupta et al., 2015, "Deep Learning with Limited
    Numerical Precision"): small updates accumulate in expectation. Leaves of any other
    dtype get :func:`apply_updates`' result exactly. Opt-in; ``apply_updates`` keeps
    optax's signature. Works under ``jax.jit`` and on sharded parameters (each leaf keeps
    its layout; the random bits, JAX's, do not depend on it).

    Args:
      params: the parameter tree.
      updates: a tree of the same structure and shapes.
      key: one PRNG key (``jax.random.key(seed)`` or ``jax.random.PRNGKey(seed)``),
        split into one key per leaf; use a fresh key each step.

    Returns:
      The new parameters, each leaf in its parameter's dtype (``None`` leaves of
      ``params`` stay ``None``).

    >>> import jax, jax.numpy as jnp
    >>> params = {'w': jnp.ones(10000, jnp.bfloat16)}
    >>> updates = {'w': jnp.full(10000, 1e-3)}
    >>> float(apply_updates(params, updates)['w'].astype(jnp.float32).mean())
    1.0
    >>> new = apply_updates_stochastic(params, updates, jax.random.key(0))
    >>> new['w'].dtype, round(float(new['w'].astype(jnp.float32).mean()), 3)
    (dtype(bfloat16), 1.001)
    """
    _check_key(key)
    if params is None:  # as apply_updates: no parameters, nothing to update
        return None
    ps, us, treedef = _leaf_pairs(params, updates)
    keys = jax.random.split(key, max(len(ps), 1))
    out = []
    for i, (p, u) in enumerate(zip(ps, us)):
        if p is None or jnp.result_type(p) != jnp.bfloat16:
            out.append(None if p is None else _add(p, u))
            continue
        total = jnp.asarray(p).astype(jnp.float32) + jnp.asarray(u).astype(jnp.float32)
        out.append(_round_to_bf16_stochastically(total, keys[i]))
    return treedef.unflatten(out)


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
