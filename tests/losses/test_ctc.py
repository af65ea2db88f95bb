"""functrain.losses.ctc against optax.losses: the CTC loss and its forward log-probabilities
(all three outputs) and gradients on the same random batch (float32, float64, bfloat16 and
integer logits), with padded frames and labels, repeated labels, another
blank, another ``log_epsilon``, sequences too short for their labels, and the errors.

Rounding bound (``helpers.rounding_bound``): each of ``T`` frames adds a log-probability to a
log-sum-exp of up to three states (about 6 roundings), so ``6 * T + K + 4`` steps (the
log-softmax over ``K`` classes first) of the largest state, ``|log_epsilon|`` plus the
log-probabilities of every frame: impossible states hold ``log_epsilon``-sized values, whose
float32 rounding is 0.008 per step.
"""

import numpy as np
import jax.numpy as jnp
import optax.losses as ol
import pytest

from functrain import losses
from functrain.jax_compat import enable_x64
from functrain.losses.checks import LossInputError
from helpers import assert_losses_like_optax, loss_case

FORWARD = (losses.ctc_loss_with_forward_probs, ol.ctc_loss_with_forward_probs)
LOSS = (losses.ctc_loss, ol.ctc_loss)


def inputs(dtype=np.float32, batch=3, frames=8, classes=5):
    rng = np.random.default_rng(8)
    logits = (2 * rng.standard_normal((batch, frames, classes))).astype(dtype)
    logit_paddings = np.zeros((batch, frames), dtype)
    logit_paddings[1, frames - 2:] = 1.0
    logit_paddings[2:, 3:] = 1.0
    labels = np.array([[1, 2, 2, 3], [4, 1, 1, 0], [3, 3, 0, 0]], np.int32)[:batch] % classes
    label_paddings = np.array([[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 1]], dtype)[:batch]
    return logits, logit_paddings, labels, label_paddings


def bound(logits, log_epsilon=-1e5):
    _, frames, classes = logits.shape
    worst = abs(log_epsilon) + frames * (np.abs(np.asarray(logits, np.float64)).max() * 2 + 3)
    return dict(steps=6 * frames + classes + 4, magnitude=float(worst))


def impossible(logit_paddings):
    """Sequence 2 (labels 3, 3: three frames at least) cut to two frames: its loss is of the
    size of ``-log_epsilon``, and every number of it comes from ``log_epsilon``-sized states
    (their rounding, ``|log_epsilon|`` times epsilon, is the bound's magnitude)."""
    cut = logit_paddings.copy()
    cut[2, 2:] = 1.0
    return cut


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")     # optax's, int
@pytest.mark.filterwarnings("ignore:jax.nn.one_hot input should be integer")  # logits/labels
def test_float32_and_16_bit_values_and_gradients_are_optaxs():
    """16-bit logits: their log-softmax in 16 bits, the recursion in float32 (float32 results,
    as optax's); integer logits: as the equal floats."""
    logits, lp, labels, mp = inputs()
    b = bound(logits)
    no_labels = mp.copy()
    no_labels[1] = 1.0
    assert_losses_like_optax(
        loss_case(*FORWARD, logits, lp, labels, mp, **b, grad_argnums=(0,),
                  grad_magnitude=float(np.abs(logits).max()) + 1),
        # another blank and log_epsilon, fractional padding, sequence 1 without labels
        loss_case(*FORWARD, logits, 0.5 * lp, labels, no_labels, **bound(logits, -1e3),
                  blank_id=2, log_epsilon=-1e3),
        loss_case(*LOSS, np.round(logits).astype(np.int32), lp.astype(np.int32),
                  labels.astype(np.float32), mp.astype(np.int32), **b),
        loss_case(*FORWARD, logits, impossible(lp), labels, mp, **b),
        loss_case(*FORWARD, logits.astype(jnp.bfloat16), lp, labels, mp, **b))


def test_float64_values_and_gradients_are_optaxs():
    """Gradients to ``|log_epsilon|``-sized roundings: sequence 2 is impossible."""
    with enable_x64():
        logits, lp, labels, mp = inputs(np.float64)
        b = bound(logits)
        assert_losses_like_optax(loss_case(*FORWARD, logits, impossible(lp), labels, mp, **b,
                                           grad_argnums=(0,), grad_magnitude=b["magnitude"]))


def test_a_sequence_by_hand():
    """Label [1] over two frames with blank 0: the alignments (1, 1), (0, 1), (1, 0). (The
    recursion is a ``lax.scan``, compiled eagerly or not: no eager comparison here.)"""
    p = np.array([[[0.6, 0.4], [0.3, 0.7]]], np.float32)
    got = losses.ctc_loss(np.log(p), np.zeros((1, 2), np.float32), np.array([[1]], np.int32),
                          np.zeros((1, 1), np.float32))
    np.testing.assert_allclose(got, [-np.log(0.4 * 0.7 + 0.6 * 0.7 + 0.4 * 0.3)], rtol=1e-6)


@pytest.mark.parametrize("call, error, words", [
    (lambda: losses.ctc_loss(np.ones((2, 5)), np.zeros((2, 5)), np.ones((2, 3), np.int32),
                             np.zeros((2, 3))),
     LossInputError, "logits must have shape (batch, time, classes), got (2, 5)"),
    (lambda: losses.ctc_loss(np.ones((2, 5, 4)), np.zeros((2, 4)), np.ones((2, 3), np.int32),
                             np.zeros((2, 3))),
     LossInputError, "logit_paddings must have shape (batch, time) = (2, 5), got (2, 4)"),
    (lambda: losses.ctc_loss(np.ones((2, 5, 4)), np.zeros((2, 5)), np.ones((1, 3), np.int32),
                             np.zeros((1, 3))),
     LossInputError, "labels must have shape (batch, max_labels) with batch 2, got (1, 3)"),
    (lambda: losses.ctc_loss(np.ones((2, 5, 4)), np.zeros((2, 5)), np.ones((2, 3), np.int32),
                             np.zeros((2, 2))),
     LossInputError, "label_paddings must have the shape of labels, (2, 3), got (2, 2)"),
    (lambda: losses.ctc_loss(np.ones((2, 5, 4)), np.zeros((2, 5)), np.ones((2, 3), np.int32),
                             np.zeros((2, 3)), blank_id=4),
     LossInputError, "blank_id must be an int in [0, 4), a class of logits' last axis; got 4"),
    (lambda: losses.ctc_loss(np.ones((2, 5, 4)), np.zeros((2, 5)), np.ones((2, 3), bool),
                             np.zeros((2, 3))),
     TypeError, "labels must hold real numbers (floats or integers), got bool"),
])
def test_bad_input_is_named_before_any_math(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


def test_errors_have_optaxs_exception_types():
    logits, paddings = np.ones((2, 5, 4), np.float32), np.zeros((2, 5), np.float32)
    labels, label_paddings = np.ones((2, 3), np.int32), np.zeros((2, 3), np.float32)
    for lib in (ol, losses):
        with pytest.raises(ValueError):      # unequal shapes
            lib.ctc_loss(logits, paddings[:, :4], labels, label_paddings)
        with pytest.raises(TypeError):       # a blank out of range
            lib.ctc_loss(logits, paddings, labels, label_paddings, blank_id=-1)
