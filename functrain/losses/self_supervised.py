"""Self-supervised and metric-learning losses: NT-Xent (SimCLR's contrastive loss) and the
triplet margin loss.

optax.losses' functions with their signatures, defaults and numbers; the shapes are checked
before any array math.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from functrain.losses import checks
from functrain.losses.primitives import unit_vectors

Array = jax.Array

__all__ = ["ntxent", "triplet_margin_loss"]


def ntxent(embeddings: Any, labels: Any, temperature: Any = 0.07) -> Array:
    """The normalized temperature-scaled cross-entropy, NT-Xent (Chen et al., 2020).

    With ``s_ij`` the cosine similarity of embeddings ``i`` and ``j`` divided by
    ``temperature``, each positive pair ``(i, j)`` (same label, ``i != j``) contributes
    ``-log(exp(s_ij) / (exp(s_ij) + sum over negatives k of exp(s_ik)))``, the negatives of
    ``i`` being the embeddings with another label; the loss is the mean over all positive
    pairs (NaN if there is none, 0 if no embedding has a negative). The cosine's squared
    norms are floored at the dtype's machine epsilon, so a zero embedding has a finite
    gradient.

    Args:
      embeddings: float embeddings, shape ``[batch, feature_length]``.
      labels: the group of each embedding (same label: a positive pair), shape ``[batch]``.
      temperature: the temperature dividing the similarities.

    Returns:
      The loss, a scalar.

    Raises:
      TypeError: ``embeddings`` are not floats.
      LossInputError: the shapes do not fit.

    >>> import jax, jax.numpy as jnp
    >>> from functrain.losses import ntxent
    >>> embeddings = jnp.array([[1.0, 0.0], [0.8, 0.3], [0.0, 1.0], [0.4, 0.9]])
    >>> jax.jit(ntxent)(embeddings, jnp.array([0, 0, 1, 1]), 0.5)
    Array(0.54056543, dtype=float32)
    """
    owner = "ntxent"
    embeddings = checks.floats(owner, "embeddings", embeddings)
    labels = checks.numbers(owner, "labels", labels)
    if embeddings.ndim != 2 or labels.ndim != 1:
        raise checks.LossInputError(
            f"{owner}: embeddings must have shape [batch, feature_length] and labels "
            f"[batch]; got {embeddings.shape} and {labels.shape}.")
    if labels.shape[0] != embeddings.shape[0]:
        raise checks.LossInputError(
            f"{owner}: labels and embeddings must have the same leading dimension, found "
            f"{labels.shape[0]} for labels and {embeddings.shape[0]} for embeddings.")
    unit = unit_vectors(embeddings, -1, jnp.finfo(embeddings.dtype).eps)
    # All pairs' cosines as one product (full float32 precision on every backend).
    cosines = jnp.matmul(unit, unit.T, precision=jax.lax.Precision.HIGHEST)
    similarity = cosines / temperature
    same = labels[:, None] == labels[None, :]
    positive = same & ~jnp.eye(labels.shape[0], dtype=bool)
    negative = ~same
    # log(exp(s_ij) + sum_k exp(s_ik)) for every pair, the negatives' sum taken once per i.
    log_negatives = jax.nn.logsumexp(similarity, axis=-1, where=negative, keepdims=True)
    log_denominator = jnp.logaddexp(similarity, log_negatives)
    losses = log_denominator - similarity
    return jnp.sum(losses, where=positive) / jnp.sum(positive)


def triplet_margin_loss(anchors: Any, positives: Any, negatives: Any, axis: int = -1,
                        norm_degree: Any = 2, margin: Any = 1.0, eps: Any = 1e-6) -> Array:
    """The triplet margin loss (Balntas et al., 2016).

    ``max(d(anchors, positives) - d(anchors, negatives) + margin, 0)`` with the distance
    ``d(x, y) = (sum(|x - y|**norm_degree) + eps)**(1 / norm_degree)`` over ``axis``: zero
    once every negative is farther from its anchor than the positive by ``margin``. The
    ``eps`` inside keeps the gradient finite where ``x == y``.

    functrain takes the absolute value ``|x - y|``, so every ``norm_degree > 0`` gives a
    distance; optax 0.2.8 raises ``x - y`` itself to the power (its numbers are the same for
    even degrees; odd degrees give signed sums, fractional ones NaN).

    Args:
      anchors: float embeddings, shape ``[batch, feature_dim]``.
      positives: embeddings like the anchors (same class), broadcastable to their shape.
      negatives: embeddings unlike the anchors, broadcastable to their shape.
      axis: the feature axis the distances are taken over.
      norm_degree: ``p`` of the ``p``-norm distance, > 0 (2: Euclidean).
      margin: the margin by which the negative should be farther than the positive.
      eps: added to the sum of powers before the root.

    Returns:
      The losses, ``anchors``'s shape without ``axis``.

    Raises:
      TypeError: an input is not floats.
      LossInputError: the shapes or ``axis`` do not fit, or a concrete ``norm_degree`` is
        not > 0 (for 0 also a ``ZeroDivisionError``, as optax's).

    >>> import jax.numpy as jnp
    >>> from functrain.losses import triplet_margin_loss
    >>> anchors = jnp.array([[0.0, 0.0], [1.0, 1.0]])
    >>> positives = jnp.array([[0.1, 0.1], [1.1, 1.1]])
    >>> negatives = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    >>> triplet_margin_loss(anchors, positives, negatives)
    Array([0.14142442, 0.14142442], dtype=float32)
    """
    owner = "triplet_margin_loss"
    anchors = checks.floats(owner, "anchors", anchors)
    positives = checks.floats(owner, "positives", positives)
    negatives = checks.floats(owner, "negatives", negatives)
    checks.fits_shape(owner, "positives", positives, "anchors", anchors.shape)
    checks.fits_shape(owner, "negatives", negatives, "anchors", anchors.shape)
    (reduced,) = checks.axes(owner, axis, anchors.ndim)
    checks.positive_number(owner, "norm_degree", norm_degree)

    def distance(other: Array) -> Array:
        powers = jnp.sum(jnp.abs(anchors - other) ** norm_degree, axis=reduced)
        return (powers + eps) ** (1 / norm_degree)

    return jnp.maximum(distance(positives) - distance(negatives) + margin, 0)
