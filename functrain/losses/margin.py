"""Margin losses on scores: hinge and perceptron (binary and multiclass), and the sparsemax
losses (binary and multiclass).

optax.losses' functions with their signatures, defaults and numbers. Scores may be integers
where optax allows it (the hinge and perceptron losses of integer scores are integers); shapes
are checked first: binary targets must broadcast to the scores' shape, multiclass labels must
have the scores' shape without the class axis (optax would broadcast a label array of another
shape silently, or fail inside ``lax``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from functrain.losses import checks
from functrain.losses.primitives import sparse_plus
from functrain.projections import projection_simplex

Array = jax.Array

__all__ = ["hinge_loss", "perceptron_loss", "multiclass_hinge_loss",
           "multiclass_perceptron_loss", "sparsemax_loss", "multiclass_sparsemax_loss"]


def _binary(owner: str, outputs: Any, targets: Any, outputs_name: str, targets_name: str,
            same: bool = False) -> tuple:
    outputs = checks.numbers(owner, outputs_name, outputs, bools=False)
    targets = checks.numbers(owner, targets_name, targets, bools=False)
    if same:
        checks.same_shape(owner, outputs_name, outputs, targets_name, targets)
    else:
        checks.fits_shape(owner, targets_name, targets, outputs_name, outputs.shape)
    return outputs, targets


def hinge_loss(predictor_outputs: Any, targets: Any) -> Array:
    """The hinge loss of binary classification: ``max(0, 1 - predictor_outputs * targets)``.

    Zero once an output has the target's sign with a margin of at least 1 (a support vector
    machine's loss).

    Args:
      predictor_outputs: the decision function's outputs (floats or integers).
      targets: -1 or 1, broadcastable to ``predictor_outputs``'s shape.

    Returns:
      The elementwise losses, shaped like ``predictor_outputs`` (integers for integer
      inputs).

    Raises:
      TypeError: an input holds booleans or complex numbers.
      LossInputError: ``targets`` does not broadcast to ``predictor_outputs``'s shape.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import hinge_loss
    >>> hinge_loss(jnp.array([0.5, -2.0, 3.0]), jnp.array([1.0, 1.0, -1.0]))
    Array([0.5, 3. , 4. ], dtype=float32)
    """
    outputs, targets = _binary("hinge_loss", predictor_outputs, targets, "predictor_outputs",
                               "targets")
    return jnp.maximum(0, 1 - outputs * targets)


def perceptron_loss(predictor_outputs: Any, targets: Any) -> Array:
    """The binary perceptron loss: ``max(0, -predictor_outputs * targets)``.

    Zero when an output has the target's sign (no margin); its subgradient is the
    perceptron's update.

    Args:
      predictor_outputs: the model's scores (floats or integers).
      targets: -1 or 1, of the same shape.

    Returns:
      The elementwise losses, shaped like ``predictor_outputs``.

    Raises:
      TypeError: an input holds booleans or complex numbers.
      LossInputError: the shapes differ.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import perceptron_loss
    >>> perceptron_loss(jnp.array([0.5, -2.0, 3.0]), jnp.array([1.0, 1.0, -1.0]))
    Array([0., 2., 3.], dtype=float32)
    """
    outputs, targets = _binary("perceptron_loss", predictor_outputs, targets,
                               "predictor_outputs", "targets", same=True)
    return jnp.maximum(0, -outputs * targets)


def _multiclass(owner: str, scores: Any, labels: Any) -> tuple:
    scores = checks.numbers(owner, "scores", scores)
    labels = checks.numbers(owner, "labels", labels, bools=False)
    if scores.ndim < 1 or labels.shape != scores.shape[:-1]:
        raise checks.LossInputError(
            f"{owner}: scores must have shape [..., num_classes] and labels the shape [...] "
            f"of one label per row; got scores {scores.shape} and labels {labels.shape}.")
    # One-hot rows, by comparison (float labels too: 2.0 is class 2, 2.5 no class).
    classes = jnp.arange(scores.shape[-1])
    return scores, (labels[..., None] == classes).astype(jnp.result_type(float))


def multiclass_hinge_loss(scores: Any, labels: Any) -> Array:
    """The multiclass hinge loss (Crammer and Singer, 2001).

    ``max over classes j of (scores[j] + [j != label]) - scores[label]``: zero once the
    label's score beats every other by a margin of 1. A label out of range has no score
    (counted as 0).

    Args:
      scores: the model's scores, shape ``[..., num_classes]``.
      labels: integer labels (integral floats work too), shape ``[...]``.

    Returns:
      The losses, shape ``[...]``.

    Raises:
      TypeError: ``labels`` are booleans, or an input is complex.
      LossInputError: the shapes do not fit.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import multiclass_hinge_loss
    >>> multiclass_hinge_loss(jnp.array([[1.2, -0.8, -0.5], [0.9, -1.2, 1.1]]), jnp.array([0, 2]))
    Array([0.        , 0.79999995], dtype=float32)
    """
    scores, one_hot = _multiclass("multiclass_hinge_loss", scores, labels)
    return jnp.max(scores + 1.0 - one_hot, axis=-1) - jnp.sum(scores * one_hot, axis=-1)


def multiclass_perceptron_loss(scores: Any, labels: Any) -> Array:
    """The multiclass perceptron loss (Collins, 2002): ``max(scores) - scores[label]``.

    Zero when the label has the highest score; its subgradient is the structured
    perceptron's update. A label out of range has no score (counted as 0).

    Args:
      scores: the model's scores, shape ``[..., num_classes]``.
      labels: integer labels (integral floats work too), shape ``[...]``.

    Returns:
      The losses, shape ``[...]``.

    Raises:
      TypeError: ``labels`` are booleans, or an input is complex.
      LossInputError: the shapes do not fit.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import multiclass_perceptron_loss
    >>> multiclass_perceptron_loss(jnp.array([[1.2, -0.8], [0.9, 1.1]]), jnp.array([0, 0]))
    Array([0.        , 0.20000005], dtype=float32)
    """
    scores, one_hot = _multiclass("multiclass_perceptron_loss", scores, labels)
    return jnp.max(scores, axis=-1) - jnp.sum(scores * one_hot, axis=-1)


def sparsemax_loss(logits: Any, labels: Any) -> Array:
    """The binary sparsemax loss (Blondel et al., 2020, Sec. 4.4), elementwise.

    The Fenchel-Young loss of the sparse sigmoid ``clip((x + 1) / 2, 0, 1)``:
    ``sparse_plus(-logits)`` for a positive label and ``sparse_plus(logits)`` for a zero
    one, where ``sparse_plus(x)`` is 0 for ``x <= -1``, ``(x + 1)**2 / 4`` on ``(-1, 1)`` and
    ``x`` beyond 1. It is zero exactly when the sparse sigmoid of the logit equals the
    label. Any nonzero label counts as 1.

    Args:
      logits: the model's scores (floats or integers).
      labels: 0 or 1, broadcastable to ``logits``'s shape.

    Returns:
      The elementwise losses (floats), shaped like ``logits``.

    Raises:
      TypeError: ``logits`` are booleans, or an input is complex.
      LossInputError: ``labels`` does not broadcast to ``logits``'s shape.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import sparsemax_loss
    >>> sparsemax_loss(jnp.array([-2.0, 0.0, 0.3, 2.0]), jnp.array([0, 1, 0, 0]))
    Array([0.        , 0.25      , 0.42249995, 2.        ], dtype=float32)
    """
    logits = checks.numbers("sparsemax_loss", "logits", logits, bools=False)
    labels = checks.numbers("sparsemax_loss", "labels", labels)
    checks.fits_shape("sparsemax_loss", "labels", labels, "logits", logits.shape)
    return sparse_plus(jnp.where(labels, -logits, logits))


def multiclass_sparsemax_loss(scores: Any, labels: Any) -> Array:
    """The multiclass sparsemax loss (Martins and Astudillo, 2016).

    The Fenchel-Young loss of ``p = sparsemax(scores)``, the Euclidean projection of the
    scores onto the probability simplex:
    ``0.5 * ||e_label - scores||**2 - 0.5 * ||p - scores||**2``. Zero exactly when
    sparsemax puts all its mass on the label; its gradient is ``p - e_label``. A label out of
    range is clipped to ``[0, num_classes - 1]`` (a negative one counts from the end first).

    Args:
      scores: the model's scores, shape ``[batch, num_classes]`` (floats or integers).
      labels: integer labels, shape ``[batch]``.

    Returns:
      The losses, shape ``[batch]`` (floats).

    Raises:
      TypeError: ``scores`` are booleans or complex, or ``labels`` not integers.
      LossInputError: the shapes do not fit.

    >>> import jax, jax.numpy as jnp
    >>> from functrain.losses import multiclass_sparsemax_loss
    >>> jax.jit(multiclass_sparsemax_loss)(jnp.array([[1.2, -0.8, -0.5], [0.9, -1.2, 1.1]]),
    ...                                    jnp.array([0, 2]))
    Array([0.  , 0.16], dtype=float32)
    """
    owner = "multiclass_sparsemax_loss"
    scores = checks.numbers(owner, "scores", scores, bools=False)
    labels = checks.integers(owner, "labels", labels)
    if scores.ndim != 2 or labels.shape != scores.shape[:1]:
        raise checks.LossInputError(
            f"{owner}: scores must have shape [batch, num_classes] and labels [batch]; got "
            f"scores {scores.shape} and labels {labels.shape}.")
    # Computed in float32 at least: 16-bit scores give float32 losses (as optax's), integer
    # scores the default float.
    scores = scores.astype(jnp.promote_types(scores.dtype, jnp.float32)
                           if jnp.issubdtype(scores.dtype, jnp.floating)
                           else jnp.result_type(float))
    num_classes = scores.shape[-1]
    labels = jnp.clip(jnp.where(labels < 0, labels + num_classes, labels), 0, num_classes - 1)
    probabilities = jax.vmap(projection_simplex)(scores)
    target = jax.nn.one_hot(labels, num_classes, dtype=scores.dtype)
    return 0.5 * (jnp.sum((target - scores) ** 2, axis=-1)
                  - jnp.sum((probabilities - scores) ** 2, axis=-1))
