"""Connectionist temporal classification (CTC): the loss of unsegmented sequence labelling.

optax.losses' ``ctc_loss`` and ``ctc_loss_with_forward_probs`` with their signatures,
defaults and numbers. The forward (alpha) recursion of Graves et al. (2006) runs in log space
as one ``lax.scan`` over time, two states per label position: "the last emitted symbol is a
blank after ``n`` labels" and "the last emitted symbol is label ``n``". The shapes, the label
dtype and ``blank_id`` are checked before any array math.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from functrain.losses import checks
from functrain.losses.primitives import log_softmax

Array = jax.Array

__all__ = ["ctc_loss_with_forward_probs", "ctc_loss"]


def _checked(owner: str, logits: Any, logit_paddings: Any, labels: Any, label_paddings: Any,
             blank_id: Any) -> tuple:
    logits = checks.numbers(owner, "logits", logits, bools=False)
    logit_paddings = checks.numbers(owner, "logit_paddings", logit_paddings)
    labels = checks.numbers(owner, "labels", labels, bools=False)
    label_paddings = checks.numbers(owner, "label_paddings", label_paddings)
    if logits.ndim != 3:
        raise checks.LossInputError(f"{owner}: logits must have shape (batch, time, classes), "
                                    f"got {logits.shape}.")
    batch, steps, num_classes = logits.shape
    if logit_paddings.shape != (batch, steps):
        raise checks.LossInputError(f"{owner}: logit_paddings must have shape (batch, time) = "
                                    f"{(batch, steps)}, got {logit_paddings.shape}.")
    if labels.ndim != 2 or labels.shape[0] != batch:
        raise checks.LossInputError(f"{owner}: labels must have shape (batch, max_labels) with "
                                    f"batch {batch}, got {labels.shape}.")
    if label_paddings.shape != labels.shape:
        raise checks.LossInputError(f"{owner}: label_paddings must have the shape of labels, "
                                    f"{labels.shape}, got {label_paddings.shape}.")
    traced = isinstance(blank_id, jax.core.Tracer) and jnp.issubdtype(blank_id.dtype,
                                                                       jnp.integer)
    if not traced and (not isinstance(blank_id, (int, np.integer, jax.Array))
                       or isinstance(blank_id, bool)
                       or not jnp.issubdtype(np.asarray(blank_id).dtype, jnp.integer)
                       or np.ndim(blank_id) != 0 or not 0 <= int(blank_id) < num_classes):
        raise checks.LossInputError(f"{owner}: blank_id must be an int in [0, {num_classes}), "
                                    f"a class of logits' last axis; got {blank_id!r}.")
    return logits, logit_paddings, labels, label_paddings


def ctc_loss_with_forward_probs(logits: Any, logit_paddings: Any, labels: Any,
                                label_paddings: Any, *, blank_id: int = 0,
                                log_epsilon: Any = -1e5) -> tuple[Array, Array, Array]:
    """The CTC loss (Graves et al., 2006) and its forward log-probabilities.

    CTC sums the probabilities of every alignment of the label sequence to the frames: the
    label sequence with blanks anywhere between its labels (and before and after them) and
    each symbol repeated over consecutive frames (a blank must separate two equal labels).
    The forward recursion in log space, with ``lp = log_softmax(logits)`` per frame,
    ``alpha_blank(t, n)`` (``n`` labels emitted, the current symbol a blank) and
    ``alpha_label(t, n)`` (the current symbol is label ``n``, counting from 0):

    * ``alpha_blank(t, n) = lp_t(blank) + logaddexp(alpha_blank(t-1, n), alpha_label(t-1, n-1))``
    * ``alpha_label(t, n) = lp_t(label_n) + logaddexp(alpha_label(t-1, n), alpha_blank(t-1, n),
      alpha_label(t-1, n-1))``, the last term plus ``log_epsilon`` (a stand-in for
      ``log(0)``) when ``label_n == label_(n-1)``: two equal labels need a blank between,

    from ``alpha_blank(-1, 0) = 0`` and ``log_epsilon`` for every other state (and for the
    missing ``alpha_label(t-1, -1)``). A padded frame leaves the states as they were. The loss of a sequence with
    ``L`` labels is ``-logaddexp(alpha_blank(T-1, L), alpha_label(T-1, L-1))``. Computed in
    float32 at least (16-bit logits give float32 results, as optax's).

    Args:
      logits: ``(B, T, K)`` logits: batch, frames, classes (the blank among them).
      logit_paddings: ``(B, T)``, 1.0 for a padded frame and 0.0 for a real one.
      labels: ``(B, N)`` integer labels in ``[0, K)``, padded on the right (one out of
        range gives NaN).
      label_paddings: ``(B, N)``, 1.0 for a padded label and 0.0 for a real one; each row
        zeros then ones (labels right-padded).
      blank_id: the class of the blank symbol.
      log_epsilon: the stand-in for ``log(0)``.

    Returns:
      ``(loss, logalpha_blank, logalpha_nonblank)``: the ``(B,)`` losses; the ``(T, B, N+1)``
      log-alphas of the blank states (``[t, b, n]``: ``n`` labels emitted) and the
      ``(T, B, N)`` ones of the label states (``[t, b, n]``: at label ``n``). In the last
      frame's row of ``logalpha_blank``, entry ``n >= 1`` is the total
      ``logaddexp(alpha_blank, alpha_label(n - 1))``, whose negative at ``n = L`` is the loss.

    Raises:
      TypeError: ``logits`` or ``labels`` are booleans or complex.
      LossInputError: the shapes or ``blank_id`` do not fit.

    >>> import jax, jax.numpy as jnp
    >>> from functrain.losses import ctc_loss_with_forward_probs
    >>> logits = jnp.log(jnp.array([[[0.6, 0.4], [0.6, 0.4]]]))   # 1 sequence, 2 frames
    >>> loss, _, _ = jax.jit(ctc_loss_with_forward_probs)(logits, jnp.zeros((1, 2)),
    ...                                                   jnp.array([[1]]), jnp.zeros((1, 1)))
    >>> loss                                # -log(0.4 * 0.4 + 0.6 * 0.4 + 0.4 * 0.6)
    Array([0.4462871], dtype=float32)
    """
    return _forward("ctc_loss_with_forward_probs", logits, logit_paddings, labels,
                    label_paddings, blank_id, log_epsilon)


def _forward(owner: str, logits: Any, logit_paddings: Any, labels: Any, label_paddings: Any,
             blank_id: Any, log_epsilon: Any) -> tuple[Array, Array, Array]:
    """The loss and the forward log-alphas (see ctc_loss_with_forward_probs), checked."""
    logits, logit_paddings, labels, label_paddings = _checked(
        owner, logits, logit_paddings, labels, label_paddings, blank_id)
    if not jnp.issubdtype(logits.dtype, jnp.floating):
        logits = logits.astype(jnp.result_type(float))
    log_probs = log_softmax(logits, (2,))
    dtype = jnp.promote_types(log_probs.dtype, jnp.float32)
    log_probs = log_probs.astype(dtype)
    batch, _, _ = logits.shape
    num_labels = labels.shape[1]
    labels = labels.astype(jnp.int32) if not jnp.issubdtype(labels.dtype, jnp.integer) else labels

    blank_lp = log_probs[:, :, blank_id]                                       # (B, T)
    label_lp = jnp.take_along_axis(log_probs, labels[:, None, :], axis=2)      # (B, T, N)
    # Whether label n repeats label n-1: then label n-1 -> label n needs a blank between,
    # and that move gets probability epsilon (log_epsilon added) instead of 1.
    repeats = jnp.concatenate([jnp.zeros((batch, 1), bool), labels[:, 1:] == labels[:, :-1]],
                              axis=1)
    epsilon = jnp.asarray(log_epsilon, dtype)
    blank0 = jnp.concatenate([jnp.zeros((batch, 1), dtype),
                              jnp.full((batch, num_labels), epsilon)], axis=1)
    label0 = jnp.full((batch, num_labels), epsilon)

    def step(carry: tuple, frame: tuple) -> tuple:
        prev_blank, prev_label = carry
        lp_blank, lp_labels, padded = frame
        # blank after n labels: from itself, or from label n-1 (n >= 1)
        from_label = jnp.logaddexp(prev_blank[:, 1:], prev_label)
        blank = jnp.concatenate([prev_blank[:, :1], from_label], axis=1) + lp_blank[:, None]
        # label n: from itself, from the blank after n labels, or from label n-1 (label 0:
        # from nothing, log_epsilon)
        stay = jnp.logaddexp(prev_label, prev_blank[:, :-1])
        skip = jnp.concatenate([jnp.full((batch, 1), epsilon), prev_label[:, :-1]], axis=1)
        skip = skip + jnp.where(repeats, epsilon, jnp.zeros((), dtype))
        label = jnp.logaddexp(stay, skip) + lp_labels
        keep = padded[:, None]
        blank = keep * prev_blank + (1 - keep) * blank
        label = keep * prev_label + (1 - keep) * label
        return (blank, label), (blank, label)

    frames = (blank_lp.T, jnp.moveaxis(label_lp, 1, 0), logit_paddings.T.astype(dtype))
    (last_blank, last_label), (alpha_blank, alpha_label) = jax.lax.scan(
        step, (blank0, label0), frames)
    total = jnp.concatenate(
        [last_blank[:, :1], jnp.logaddexp(last_blank[:, 1:], last_label)], axis=1)
    alpha_blank = alpha_blank.at[-1].set(total)
    lengths = (num_labels - jnp.sum(label_paddings, axis=1)).astype(jnp.int32)
    loss = -jnp.take_along_axis(total, lengths[:, None], axis=1)[:, 0]
    return loss, alpha_blank, alpha_label


def ctc_loss(logits: Any, logit_paddings: Any, labels: Any, label_paddings: Any, *,
             blank_id: int = 0, log_epsilon: Any = -1e5) -> Array:
    """The CTC loss (Graves et al., 2006) of each sequence in the batch.

    ``-log`` of the total probability of the alignments of ``labels`` to the frames; see
    :func:`ctc_loss_with_forward_probs` for the recursion and the arguments.

    Args:
      logits: ``(B, T, K)`` logits: batch, frames, classes (the blank among them).
      logit_paddings: ``(B, T)``, 1.0 for a padded frame and 0.0 for a real one.
      labels: ``(B, N)`` integer labels in ``[0, K)``, padded on the right.
      label_paddings: ``(B, N)``, 1.0 for a padded label and 0.0 for a real one.
      blank_id: the class of the blank symbol.
      log_epsilon: the stand-in for ``log(0)``.

    Returns:
      The ``(B,)`` losses.

    Raises:
      TypeError: ``logits`` or ``labels`` are booleans or complex.
      LossInputError: the shapes or ``blank_id`` do not fit.

    >>> import jax, jax.numpy as jnp
    >>> from functrain.losses import ctc_loss
    >>> logits = jnp.log(jnp.array([[[0.6, 0.4], [0.6, 0.4]]]))
    >>> jax.jit(ctc_loss)(logits, jnp.zeros((1, 2)), jnp.array([[1]]), jnp.zeros((1, 1)))
    Array([0.4462871], dtype=float32)
    """
    loss, _, _ = _forward("ctc_loss", logits, logit_paddings, labels, label_paddings,
                          blank_id, log_epsilon)
    return loss
