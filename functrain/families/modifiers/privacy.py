"""Differential privacy (Abadi et al., 2016): DP-SGD's aggregation and the ``dpsgd`` optimizer.

``differentially_private_aggregate`` takes **per-example** gradients (every
leaf has the batch on axis 0, e.g. from ``jax.vmap(jax.grad(loss))``), clips
each example to global L2 norm ``l2_norm_clip``
(:func:`functrain.per_example_global_norm_clip`), sums them, adds Gaussian
noise of standard deviation ``l2_norm_clip * noise_multiplier`` and divides by
the batch size. The clipping needs each example's norm over the whole tree,
and the noise one key per leaf, so it is a plain transformation (not an engine
stage); it must come first in a chain. The noise follows optax 0.2.8's key
handling exactly (same key, same noise), and so do the names, arguments and
state.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_momentum, check_range, check_state_type
from functrain.declarations import declare_optimizer, hyperparameters
from functrain import tree as ft
from functrain.engine.protocol import GradientTransformation, Params, ScalarOrSchedule, Updates
from functrain.transforms.clipping import per_example_global_norm_clip
from functrain.engine.program import chain, identity
from functrain.transforms.accumulation import trace
from functrain.transforms.scaling import scale_by_learning_rate

Array = jax.Array

__all__ = ["DifferentiallyPrivateAggregateState", "differentially_private_aggregate", "dpsgd"]


class DifferentiallyPrivateAggregateState(NamedTuple):
    """State of :func:`differentially_private_aggregate`: the random key.

    Attributes:
      rng_key: a typed ``jax.random.key``, split at every step (one part kept,
        one per leaf for this step's noise).

    >>> import jax, jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.differentially_private_aggregate(1.0, 0.5, key=0)
    >>> tx.init({'w': jnp.ones(2)}).rng_key.shape
    ()
    """

    rng_key: Array


def _canonical_key(key: Any) -> Array:
    """A typed key: ``key`` itself if it is one, else ``jax.random.key(key)`` (an int seed)."""
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    if isinstance(key, jax.Array) and key.dtype == jnp.uint32 and key.shape == (2,):
        raise TypeError("differentially_private_aggregate: key must be a typed key "
                        "(jax.random.key) or an int seed, got a raw uint32 PRNGKey: wrap "
                        "it with jax.random.wrap_key_data.")
    try:
        return jax.random.key(key)
    except TypeError as err:
        raise TypeError(f"differentially_private_aggregate: key must be a jax.random.key or "
                        f"an int seed, got {type(key).__name__} {key!r:.40}.") from err


@declare_optimizer("contrib", "Abadi et al., 2016", optax="contrib",
    summary="DP-SGD (Abadi et al., 2016): per-example clipping and Gaussian noise.",
    signature="differentially_private_aggregate(...)")
@hyperparameters(l2_norm_clip="number", noise_multiplier="number", seed="int or None")
def differentially_private_aggregate(l2_norm_clip: float, noise_multiplier: float,
                                     key: Any = None, *, seed: Optional[int] = None
                                     ) -> GradientTransformation:
    """DP-SGD's aggregation (Abadi et al., 2016): clip each example, sum, add noise, average.

    For a batch of ``B`` per-example gradients ``g_i`` (the batch on axis 0 of
    every leaf), with ``C = l2_norm_clip`` and ``n_i`` the global L2 norm of
    ``g_i``: the update is ``(sum_i g_i min(1, C / n_i) + C * noise_multiplier
    * z) / B`` with ``z`` standard normal noise, a fresh draw per leaf and step.
    Reference: Abadi et al., "Deep Learning with Differential Privacy" (2016).

    The key is split at each step as optax does, so the noise equals optax's for
    the same key. Gradient accumulation wrappers (``MultiSteps``,
    ``apply_every``) do not fit this transformation: it aggregates itself.

    Args:
      l2_norm_clip: the largest global L2 norm each example keeps, ``>= 0``.
      noise_multiplier: the noise's standard deviation relative to
        ``l2_norm_clip``, ``>= 0``.
      key: a ``jax.random.key`` or an int seed; ``None`` means seed 0 (optax's
        default, with which it warns).
      seed: the older name of ``key`` (an int seed), keyword only; give ``key``
        or ``seed``, not both.

    Returns:
      A ``GradientTransformation`` whose state is
      :class:`DifferentiallyPrivateAggregateState`; its ``update`` takes
      per-example gradients and returns a tree like one example's gradients.
      It raises ``ValueError`` naming the leaf whose axis 0 is not the batch.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.differentially_private_aggregate(1.0, 0.0, key=0)
    >>> per_example = {'w': jnp.array([[3., 4.], [0.3, 0.4]])}
    >>> tx.update(per_example, tx.init({'w': jnp.zeros(2)}))[0]
    {'w': Array([0.45, 0.6 ], dtype=float32)}
    """
    owner = "differentially_private_aggregate"
    check_range("l2_norm_clip", l2_norm_clip, 0.0, owner=owner)
    check_range("noise_multiplier", noise_multiplier, 0.0, owner=owner)
    if seed is not None and key is not None:
        raise ValueError(f"{owner}: give key or seed, not both (seed is the older name of "
                         f"key).")
    key = seed if key is None else key
    key = _canonical_key(0 if key is None else key)
    noise_std = l2_norm_clip * noise_multiplier

    def init_fn(params: Params) -> DifferentiallyPrivateAggregateState:
        paths, leaves, _ = ft.flatten_with_paths(params)
        ft.check_leaf_dtypes(paths, leaves, [True] * len(leaves), owner, "params",
                             real_only=False)
        return DifferentiallyPrivateAggregateState(rng_key=key)

    def update_fn(updates: Updates, state: DifferentiallyPrivateAggregateState,
                  params: Optional[Params] = None, **extra_args: Any
                  ) -> tuple[Updates, DifferentiallyPrivateAggregateState]:
        del params, extra_args
        check_state_type(state, DifferentiallyPrivateAggregateState, owner)
        paths, leaves, treedef = ft.flatten_with_paths(updates)
        ft.check_leaf_dtypes(paths, leaves, [True] * len(leaves), owner, "updates",
                             real_only=False)
        if not leaves:
            return updates, state
        # Checks that every leaf has the batch on axis 0, naming the leaf that has not.
        summed, _ = per_example_global_norm_clip(updates, l2_norm_clip)
        batch = jnp.shape(leaves[0])[0]
        new_key, *keys = jax.random.split(state.rng_key, len(leaves) + 1)
        # The clipped sum in each leaf's own dtype (16-bit gradients stay 16-bit).
        summed = [s.astype(g.dtype) for s, g in zip(treedef.flatten_up_to(summed), leaves)]
        noised = [(g + noise_std * jax.random.normal(k, g.shape, g.dtype)) / batch
                  for g, k in zip(summed, keys)]
        return treedef.unflatten(noised), DifferentiallyPrivateAggregateState(new_key)

    return GradientTransformation(init_fn, update_fn)


@declare_optimizer("contrib", "Abadi et al., 2016", optax="contrib",
    listed_with="differentially_private_aggregate", signature="dpsgd(...)")
@hyperparameters(learning_rate="schedule", l2_norm_clip="number", noise_multiplier="number",
                 seed="int", momentum="number or None")
def dpsgd(learning_rate: ScalarOrSchedule, l2_norm_clip: float, noise_multiplier: float,
          seed: int, momentum: Optional[float] = None, nesterov: bool = False
          ) -> GradientTransformation:
    """DP-SGD (Abadi et al., 2016): SGD on privately aggregated per-example gradients.

    ``chain(differentially_private_aggregate(l2_norm_clip, noise_multiplier,
    seed=seed), trace(momentum, nesterov) if momentum is not None else
    identity(), scale_by_learning_rate(learning_rate))``: the update is
    ``-learning_rate * m`` with ``m`` the (momentum of the) clipped, noised and
    averaged gradient. Pass per-example gradients (the batch on axis 0 of every
    leaf) to ``update``. Reference: Abadi et al., "Deep Learning with
    Differential Privacy" (2016).

    Args:
      learning_rate: the step size (a number or a schedule).
      l2_norm_clip: the largest global L2 norm each example keeps, ``>= 0``.
      noise_multiplier: the noise's standard deviation relative to
        ``l2_norm_clip``, ``>= 0``.
      seed: the int seed of the noise's ``jax.random.key``.
      momentum: the momentum's decay, or ``None`` for none.
      nesterov: use Nesterov momentum.

    Returns:
      A ``GradientTransformation``; its state is a tuple of
      ``DifferentiallyPrivateAggregateState``, the momentum's state (or
      ``EmptyState``) and the learning rate's.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.dpsgd(0.1, l2_norm_clip=1.0, noise_multiplier=0.0, seed=0)
    >>> params = {'w': jnp.zeros(2)}
    >>> per_example = {'w': jnp.array([[3., 4.], [0.3, 0.4]])}
    >>> opt.update(per_example, opt.init(params), params)[0]
    {'w': Array([-0.045, -0.06 ], dtype=float32)}
    """
    check_momentum("dpsgd", momentum)
    return chain(
        differentially_private_aggregate(l2_norm_clip=l2_norm_clip,
                                         noise_multiplier=noise_multiplier, seed=seed),
        trace(decay=momentum, nesterov=nesterov) if momentum is not None else identity(),
        scale_by_learning_rate(learning_rate))
