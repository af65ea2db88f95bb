"""Learning-to-rank losses: the listwise softmax loss.

optax.losses.ranking_softmax_loss with its signature, defaults and numbers. Labels, ``where``
and ``weights`` must broadcast to the logits' shape (checked before any array math).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from functrain.losses import checks
from functrain.losses.primitives import log_softmax, masked_sum

Array = jax.Array

__all__ = ["ranking_softmax_loss"]


def ranking_softmax_loss(logits: Any, labels: Any, *, where: Optional[Any] = None,
                         weights: Optional[Any] = None,
                         reduce_fn: Optional[Callable[..., Any]] = jnp.mean) -> Array:
    """The listwise softmax loss of learning to rank (Cao et al., 2007; Bruch et al., 2019).

    For each list of items, ``-sum(labels * log_softmax(logits))`` over the items (the last
    axis): the cross-entropy of the relevance labels, not normalized, and the model's softmax
    distribution over the list. ``where`` leaves items out of the softmax and the sum (a list
    with no item left has loss 0); ``weights`` multiplies each item's term. ``reduce_fn``
    then reduces the per-list losses; with ``where`` it is called as
    ``reduce_fn(losses, where=lists_with_an_item)``, so ``jnp.mean`` averages over the lists
    that have an item, and is 0 if none has (a function without a ``where`` argument cannot
    be used then).

    Args:
      logits: the items' scores (floats), shape ``[..., list_size]``.
      labels: the items' relevance labels, broadcastable to ``logits``'s shape.
      where: a boolean mask broadcastable to ``logits``'s shape: the valid items.
      weights: per-item weights broadcastable to ``logits``'s shape, or ``None``.
      reduce_fn: what reduces the per-list losses (``jnp.mean``, ``jnp.sum``), or ``None``
        to return them.

    Returns:
      ``reduce_fn`` of the per-list losses (a scalar by default), or the losses of shape
      ``[...]`` with ``reduce_fn=None``.

    Raises:
      TypeError: ``logits`` are not floats, or ``reduce_fn`` is not callable.
      LossInputError: ``labels``, ``where`` or ``weights`` do not fit ``logits``.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import ranking_softmax_loss
    >>> ranking_softmax_loss(jnp.array([[2.0, 1.0, 0.0]]), jnp.array([[1.0, 0.0, 0.0]]))
    Array(0.40760595, dtype=float32)
    """
    owner = "ranking_softmax_loss"
    logits = checks.floats(owner, "logits", logits)
    labels = checks.numbers(owner, "labels", labels)
    checks.fits_shape(owner, "labels", labels, "logits", logits.shape)
    if logits.ndim < 1:
        raise checks.LossInputError(f"{owner}: logits must have a list axis (the last); got "
                                    f"a scalar.")
    if reduce_fn is not None and not callable(reduce_fn):
        raise TypeError(f"{owner}: reduce_fn must be a function (jnp.mean, jnp.sum) or None, "
                        f"got {reduce_fn!r}.")
    reduced = (logits.ndim - 1,)
    where = checks.where_mask(owner, where, logits.shape, reduced)
    if weights is not None:
        weights = checks.numbers(owner, "weights", weights)
        checks.fits_shape(owner, "weights", weights, "logits", logits.shape)
        labels = labels * weights
    log_p = log_softmax(logits, reduced, where)
    if where is None:
        loss = -jnp.sum(labels * log_p, axis=-1)
        return loss if reduce_fn is None else reduce_fn(loss)
    # Masked-out items: log-probability 0 (not -inf), so their labels get no NaN gradient.
    log_p = jnp.where(where, log_p, jnp.zeros_like(log_p))
    loss = -masked_sum(labels * log_p, reduced, where)
    present = jnp.any(jnp.broadcast_to(where, logits.shape), axis=-1)
    loss = jnp.where(present, loss, jnp.zeros_like(loss))
    if reduce_fn is None:
        return loss
    reduced_loss = reduce_fn(loss, where=present)
    if reduce_fn is jnp.mean:  # the mean over no list at all: 0, not NaN
        reduced_loss = jnp.where(jnp.any(present), reduced_loss, jnp.zeros_like(reduced_loss))
    return reduced_loss
