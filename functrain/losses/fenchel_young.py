"""Fenchel-Young losses: a loss built from any "max" function (Blondel et al., 2020).

optax.losses.make_fenchel_young_loss with its signature and numbers.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from functrain.losses import checks

Array = jax.Array

__all__ = ["make_fenchel_young_loss"]


def make_fenchel_young_loss(max_fun: Callable[..., Any]) -> Callable[..., Array]:
    """The Fenchel-Young loss of a max function (Blondel et al., 2020).

    For a convex "max" function ``max_fun`` (a smoothed maximum over the last axis, e.g.
    ``jax.scipy.special.logsumexp``), the loss of scores ``theta`` and targets ``y`` is
    ``max_fun(theta) - <theta, y>``, computed over the last axis with any leading axes as a
    batch (``max_fun`` sees one vector at a time). Its gradient in ``theta`` is
    ``grad max_fun(theta) - y``: with ``logsumexp`` the loss is the softmax cross-entropy,
    with the sparsemax's max function the sparsemax loss.

    Args:
      max_fun: a function of a vector returning a scalar (it may take keyword arguments).

    Returns:
      ``fenchel_young_loss(scores, targets, **kwargs)``: the losses, ``scores``'s shape
      without the last axis; ``kwargs`` go to ``max_fun`` (optax 0.2.8 drops them). It
      raises a ``LossInputError`` if ``targets`` does not broadcast to ``scores``'s shape,
      and a ``TypeError`` for extra positional arguments (as optax's).

    Raises:
      TypeError: ``max_fun`` is not callable.

    >>> import jax.numpy as jnp
    >>> from jax.scipy.special import logsumexp
    >>> from functrain.losses import make_fenchel_young_loss
    >>> loss = make_fenchel_young_loss(logsumexp)
    >>> loss(jnp.array([[1.2, -0.8, -0.5]]), jnp.array([[1.0, 0.0, 0.0]]))
    Array([0.2761297], dtype=float32)
    """
    if not callable(max_fun):
        raise TypeError(f"make_fenchel_young_loss: max_fun must be a function of a vector, "
                        f"got {max_fun!r}.")

    def fenchel_young_loss(scores: Any, targets: Any, *args: Any, **kwargs: Any) -> Array:
        if args:
            raise TypeError(f"fenchel_young_loss takes scores and targets, and max_fun's "
                            f"other arguments by keyword; got {len(args)} more positional "
                            f"argument(s).")
        scores = checks.numbers("fenchel_young_loss", "scores", scores)
        targets = checks.numbers("fenchel_young_loss", "targets", targets)
        checks.has_last_axis("fenchel_young_loss", "scores", scores)
        checks.fits_shape("fenchel_young_loss", "targets", targets, "scores", scores.shape)

        def one(theta: Array, y: Array) -> Array:
            return max_fun(theta, **kwargs) - jnp.vdot(theta, y)

        return jnp.vectorize(one, signature="(n),(n)->()")(scores, targets)

    return fenchel_young_loss
