"""Gradient noise: ``add_noise`` (Neelakantan et al., 2015).

``add_noise`` draws one random key per leaf from a split of its state key,
which needs the leaf's index in the tree, so it is a plain transformation
rather than an engine stage.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_range, check_state_type
from functrain.declarations import hyperparameters
from functrain import tree as ft
from functrain.engine.protocol import GradientTransformation, Params, Updates
from functrain.engine.counts import safe_increment

Array = jax.Array


class AddNoiseState(NamedTuple):
    """State of :func:`add_noise`: the step count and the random key.

    Attributes:
      count: the number of steps taken (int32).
      rng_key: the random key, split at every step (one half kept, the other
        used for this step's noise).

    >>> import jax.numpy as jnp, functrain
    >>> functrain.add_noise(0.01, 0.55, 0).init([jnp.ones(1)]).count
    Array(0, dtype=int32)
    """

    count: Array
    rng_key: Array


def _as_key(key: Any) -> Array:
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    return jax.random.key(key)


@hyperparameters(eta="number", gamma="number", seed="int or None")
def add_noise(eta: float, gamma: float, key: Any = None, *,
              seed: Optional[int] = None) -> GradientTransformation:
    """Add Gaussian noise of variance ``eta / t**gamma`` at step ``t`` (Neelakantan et al.).

    ``key`` is a ``jax.random.key`` or an int seed; the noise equals optax's
    for the same key. As optax, ``key=None`` means seed 0 and ``seed=`` is the
    older name of ``key``. Noise is drawn per leaf, so it is not an engine stage.

    The update is ``g + sqrt(eta / t**gamma) * n`` with ``n`` standard normal
    noise, a fresh draw per leaf and step, and ``t`` the step counted from 1.
    Reference: Neelakantan et al., 2015, "Adding Gradient Noise Improves Learning
    for Very Deep Networks".

    Args:
      eta: the noise variance at the first step, ``>= 0`` (0: no noise).
      gamma: how fast the variance decays with the step count (the paper uses
        0.55); ``>= 0`` for decaying noise.
      key: a ``jax.random.key`` or an int seed for the noise; ``None`` (the
        default) means seed 0, as optax's default.
      seed: the older name of ``key`` (an int seed), keyword only; give ``key``
        or ``seed``, not both.

    Returns:
      A ``GradientTransformation`` whose state is :class:`AddNoiseState`.

    >>> import jax, jax.numpy as jnp, functrain
    >>> tx = functrain.add_noise(eta=0.0, gamma=0.55, key=jax.random.key(0))
    >>> tx.update([jnp.array([1.])], tx.init([jnp.zeros(1)]))[0]
    [Array([1.], dtype=float32)]
    """
    check_range("eta", eta, 0.0, owner="add_noise")
    if seed is not None and key is not None:
        raise ValueError("add_noise: give key or seed, not both (seed is the older name "
                         "of key).")
    key = seed if key is None else key
    key = 0 if key is None else key

    def init_fn(params: Params) -> AddNoiseState:
        paths, leaves, _ = ft.flatten_with_paths(params)
        ft.check_leaf_dtypes(paths, leaves, [True] * len(leaves), "add_noise", "params")
        return AddNoiseState(jnp.zeros([], jnp.int32), _as_key(key))

    def update_fn(updates: Updates, state: AddNoiseState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, AddNoiseState]:
        check_state_type(state, AddNoiseState, "add_noise")
        paths, gs, _ = ft.flatten_with_paths(updates)
        ft.check_leaf_dtypes(paths, gs, [True] * len(gs), "add_noise", "updates")
        count = safe_increment(state.count)
        std = jnp.sqrt(eta / count ** gamma)
        rng_key, sample_key = jax.random.split(state.rng_key)
        leaves, treedef = jax.tree_util.tree_flatten(updates)
        keys = jax.random.split(sample_key, len(leaves)) if leaves else []
        noisy = []
        for x, k in zip(leaves, keys):
            noise = jax.random.normal(k, x.shape, x.dtype)
            cd = ft.compute_dtype(x.dtype)
            noisy.append((x.astype(cd) + std.astype(cd) * noise.astype(cd)).astype(x.dtype))
        return treedef.unflatten(noisy), AddNoiseState(count, rng_key)

    return GradientTransformation(init_fn, update_fn)
