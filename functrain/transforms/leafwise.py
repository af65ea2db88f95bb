"""Per-leaf wrappers: ``zero_nans``, ``keep_params_nonnegative``, ``ema``, ``add_noise``.

The first three are engine stages (``chain`` fuses them with their
neighbours). ``add_noise`` draws one random key per leaf from a split of its
state key, which needs the leaf's index, so it is a plain transformation.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain import tree as ft
from functrain.transforms.base import (EmptyState, GradientTransformation, LeafStage,
                                       check_range, safe_increment, stage_transform,
                                       zero_count)
from functrain.transforms.wrappers import _check_state

Array = jax.Array
Params = Any
Updates = Any

NonNegativeParamsState = EmptyState


class ZeroNansState(NamedTuple):
    """State of :func:`zero_nans`: per leaf, whether the last update held a NaN.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.zero_nans().init({'w': jnp.ones(2)})
    ZeroNansState(found_nan={'w': Array(False, dtype=bool)})
    """

    found_nan: Any


def zero_nans() -> GradientTransformation:
    """Replace NaNs in the updates by zeros, recording per leaf whether any was found.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.zero_nans()
    >>> u, state = tx.update([jnp.array([1., jnp.nan])], tx.init([jnp.zeros(2)]))
    >>> u, state.found_nan
    ([Array([1., 0.], dtype=float32)], [Array(True, dtype=bool)])
    """
    def leaf(g: Array, s: tuple, p: Any, c: Any) -> tuple:
        nan = jnp.isnan(g)
        return jnp.where(nan, jnp.zeros_like(g), g), (jnp.any(nan),)

    # ``found_nan`` is one bool per leaf, not params-shaped.
    return stage_transform(LeafStage(
        "zero_nans", leaf, ZeroNansState, ("found_nan",),
        lambda p: (jnp.zeros([], jnp.bool_),), shaped_fields=()))


def keep_params_nonnegative() -> GradientTransformation:
    """Shrink updates so no parameter becomes negative (``p + u < 0`` gives ``u = -p``).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.keep_params_nonnegative()
    >>> params = [jnp.array([1., 1.])]
    >>> tx.update([jnp.array([-3., 0.5])], tx.init(params), params)[0]
    [Array([-1. ,  0.5], dtype=float32)]
    """
    return stage_transform(LeafStage(
        "keep_params_nonnegative", lambda g, s, p, c: (jnp.where(p + g < 0, -p, g), ()),
        needs_params=True))


class EmaState(NamedTuple):
    """State of :func:`ema`: the step count and the moving average.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.ema(0.9).init([jnp.ones(1)]).ema
    [Array([0.], dtype=float32)]
    """

    count: Array
    ema: Any


def ema(decay: float, debias: bool = True,
        accumulator_dtype: Optional[Any] = None) -> GradientTransformation:
    """Exponential moving average of the updates: ``m = decay m + (1 - decay) u``.

    The update is ``m``, divided by ``1 - decay**t`` when ``debias``.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.ema(0.5, debias=False)
    >>> u, state = tx.update([jnp.array([2.])], tx.init([jnp.zeros(1)]))
    >>> u
    [Array([1.], dtype=float32)]
    """
    check_range("decay", decay, 0.0, 1.0, high_inclusive=True, owner="ema")

    def prepare(glob: dict, _: Any) -> tuple:
        count = safe_increment(glob["count"])
        return 1 - decay ** count, {"count": count}

    def leaf(g: Array, s: tuple, p: Any, correction: Any) -> tuple:
        m = (1 - decay) * g + decay * s[0]
        return (m / correction if debias else m), (m,)

    return stage_transform(LeafStage(
        "ema", leaf, EmaState, ("ema",), lambda p: (ft.zeros_like(p, accumulator_dtype),),
        zero_count, prepare))


class AddNoiseState(NamedTuple):
    """State of :func:`add_noise`: the step count and the random key.

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


def add_noise(eta: float, gamma: float, key: Any = 0) -> GradientTransformation:
    """Add Gaussian noise of variance ``eta / t**gamma`` at step ``t`` (Neelakantan et al.).

    ``key`` is a ``jax.random.key`` or an int seed; the noise equals optax's
    for the same key. Noise is drawn per leaf, so it is not an engine stage.

    >>> import jax, jax.numpy as jnp, functrain
    >>> tx = functrain.add_noise(eta=0.0, gamma=0.55, key=jax.random.key(0))
    >>> tx.update([jnp.array([1.])], tx.init([jnp.zeros(1)]))[0]
    [Array([1.], dtype=float32)]
    """
    check_range("eta", eta, 0.0, owner="add_noise")

    def init_fn(params: Params) -> AddNoiseState:
        return AddNoiseState(jnp.zeros([], jnp.int32), _as_key(key))

    def update_fn(updates: Updates, state: AddNoiseState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, AddNoiseState]:
        _check_state(state, AddNoiseState, "add_noise")
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
