"""functrain.losses.segmentation against optax.losses: the Dice loss (Tversky weights, class
weights, reductions, ``ignore_background``, ``axis``, one channel), the binary and the
generalized Dice losses; values and gradients on the same random maps (float32 jitted and
eager, float64, bfloat16), and the errors, among them the two optax fails on: probabilities
under ``jit`` and a single channel of probabilities.

Rounding bound (``helpers.rounding_bound``): a softmax over ``C`` classes (``C + 3``
roundings), three sums over ``s`` pixels and the quotient (``3 * s + 6``), the weights
and the reduction over classes (``C + 4``): ``2 * C + 3 * s + 13`` steps of ``s + 1`` (a sum
of probabilities).
"""

import numpy as np
import jax
import jax.numpy as jnp
import optax.losses as ol
import pytest

from functrain import losses
from functrain.jax_compat import enable_x64
from functrain.losses.checks import LossInputError, MissingAxisError
from helpers import assert_losses_like_optax, loss_case

DICE = (losses.dice_loss, ol.dice_loss)
BINARY = (losses.binary_dice_loss, ol.binary_dice_loss)
GENERALIZED = (losses.multiclass_generalized_dice_loss, ol.multiclass_generalized_dice_loss)


def inputs(dtype=np.float32, shape=(2, 4, 5, 3)):
    """Logits and one-hot targets, shape (batch, height, width, classes)."""
    rng = np.random.default_rng(7)
    logits = rng.standard_normal(shape).astype(dtype)
    targets = np.eye(shape[-1], dtype=dtype)[rng.integers(0, shape[-1], shape[:-1])]
    return logits, targets


def bound(logits, pixels=None):
    pixels = int(np.prod(logits.shape[1:-1])) if pixels is None else pixels
    return dict(steps=2 * logits.shape[-1] + 3 * pixels + 13, magnitude=pixels + 1)


def base_cases(logits, targets, grads=True):
    g = dict(grad_argnums=(0, 1)) if grads else {}
    b = bound(logits)
    return [loss_case(*DICE, logits, targets, **b, **g),
            loss_case(*BINARY, logits[..., 0], targets[..., 0], **b, **g),
            loss_case(*GENERALIZED, logits, targets, **b, **g)]


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # optax's int softmax
def test_float32_and_bfloat16_values_and_gradients_are_optaxs():
    logits, targets = inputs()
    b = bound(logits)
    weights = np.array([1.0, 2.0, 3.0], np.float32)
    g = dict(grad_argnums=(0, 1))
    assert_losses_like_optax(
        *base_cases(logits, targets),
        loss_case(*DICE, logits, targets, **b, reduction="sum", class_weights=weights, **g),
        loss_case(*DICE, logits, targets, **b, reduction="none", alpha=0.3, beta=0.7,
                  smooth=0.1),
        loss_case(*DICE, logits, targets, **b, ignore_background=True, class_weights=weights),
        loss_case(*DICE, logits, targets, **bound(logits, 40), axis=(0, 1, 2)),
        loss_case(*DICE, logits, targets, **bound(logits, 1), axis=()),
        loss_case(*DICE, logits[..., :1], targets[..., :1], **b, **g),   # one channel: sigmoid
        loss_case(*DICE, logits[0, 0], targets[0, 0], **bound(logits, 1)),
        loss_case(*DICE, np.round(logits).astype(np.int32), targets.astype(np.int32), **b),
        loss_case(*BINARY, logits[..., :1], targets[..., :1], **b, smooth=0.3),
        loss_case(*BINARY, logits[0, 0, :, 0], targets[0, 0, :, 0], **bound(logits, 1)),
        loss_case(*BINARY, logits[..., 0], targets[..., :1], **b),   # [...] with [..., 1]
        loss_case(*DICE, logits[..., :1], targets[..., 0], **b),
        loss_case(*GENERALIZED, logits, targets, **b, ignore_background=True, smooth=0.1),
        loss_case(*GENERALIZED, logits, targets * 3e-4, **b, **g),   # small class weights
        loss_case(*GENERALIZED, logits[0, 0], targets[0, 0], **bound(logits, 1)),
        *base_cases(*inputs(jnp.bfloat16, (2, 3, 3)), grads=False))


def test_float64_values_and_gradients_are_optaxs():
    with enable_x64():
        assert_losses_like_optax(*base_cases(*inputs(np.float64, (2, 3, 3))))


def test_eager_values_are_optaxs():
    """Probabilities (``apply_softmax=False``) too: optax's check of them needs concrete
    values."""
    logits, targets = inputs(np.float32, (2, 3, 3))
    probabilities = np.asarray(jax.nn.softmax(logits))
    b = bound(logits)
    assert_losses_like_optax(
        loss_case(*DICE, logits, targets, **b),
        loss_case(*DICE, probabilities, targets, **b, apply_softmax=False),
        loss_case(*GENERALIZED, probabilities, targets, **b, apply_softmax=False), jit=False)


def test_probabilities_work_under_jit_and_for_one_channel():
    """optax checks ``apply_softmax=False`` input with a Python ``if`` (an error under
    ``jit``) and wants every channel to sum to 1 (one channel of probabilities never does);
    functrain checks concrete input only: sums to 1, or values in ``[0, 1]`` for one
    channel."""
    logits, targets = inputs()
    p, one = np.asarray(jax.nn.softmax(logits)), np.asarray(jax.nn.sigmoid(logits[..., 0]))

    @jax.jit
    def both(p, one, logits):
        return (losses.dice_loss(p, targets, apply_softmax=False),
                losses.dice_loss(logits, targets),
                losses.binary_dice_loss(one, targets[..., 0], apply_sigmoid=False),
                losses.binary_dice_loss(logits[..., 0], targets[..., 0]))

    given, computed, given_one, computed_one = both(p, one, logits)
    np.testing.assert_allclose(given, computed, rtol=1e-6)
    np.testing.assert_allclose(given_one, computed_one, rtol=1e-6)
    with pytest.raises(jax.errors.TracerBoolConversionError):
        jax.jit(lambda x: ol.dice_loss(x, targets, apply_softmax=False))(p)
    with pytest.raises(ValueError, match="sum to 1"):
        ol.binary_dice_loss(one, targets[..., 0], apply_sigmoid=False)


@pytest.mark.parametrize("call, error, words", [
    (lambda: losses.dice_loss(np.ones((2, 3)), np.ones((2, 2))), LossInputError,
     "dice_loss: predictions and targets must have the same shape, got (2, 3) and (2, 2)"),
    (lambda: losses.dice_loss(np.ones((2, 3)), np.ones((2, 3)), reduction="max"),
     LossInputError, "reduction must be one of ('mean', 'sum', 'none'), got 'max'"),
    (lambda: losses.dice_loss(np.ones((2, 3)), np.ones((2, 3)), class_weights=np.ones(2)),
     LossInputError, "class_weights must have shape (3,), one weight per class; got (2,)"),
    (lambda: losses.dice_loss(np.ones((2, 4, 3)), np.ones((2, 4, 3)), axis=(1, 2)),
     LossInputError, "axis=(1, 2) includes the class axis (the last)"),
    (lambda: losses.dice_loss(np.full((2, 3), 0.5), np.ones((2, 3)), apply_softmax=False),
     LossInputError, "must be valid probability distributions that sum to 1 over the class"),
    (lambda: losses.binary_dice_loss(np.full((2, 1), 1.5), np.ones((2, 1)),
                                     apply_sigmoid=False),
     LossInputError, "with apply_sigmoid=False, predictions must hold probabilities in [0, 1]"),
    (lambda: losses.binary_dice_loss(np.ones(3, np.int32), np.ones(3)), TypeError,
     "binary_dice_loss: predictions must be a floating-point array"),
    (lambda: losses.binary_dice_loss(np.array(1.0), np.array(1.0)), MissingAxisError,
     "binary_dice_loss: predictions must have a batch or channel axis"),
    (lambda: losses.multiclass_generalized_dice_loss(np.array(1.0), np.array(1.0)),
     MissingAxisError, "predictions must have a class axis (the last); got a scalar"),
])
def test_bad_input_is_named_before_any_math(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


def test_errors_have_optaxs_exception_types():
    for lib in (ol, losses):
        with pytest.raises(ValueError):
            lib.dice_loss(np.ones((2, 3)), np.ones((2, 2)))
        with pytest.raises(ValueError):
            lib.dice_loss(np.ones((2, 3)), np.ones((2, 3)), reduction="max")
        with pytest.raises(IndexError):
            lib.binary_dice_loss(np.array(1.0), np.array(1.0))
        with pytest.raises(TypeError):
            lib.multiclass_generalized_dice_loss(np.array(1.0), np.array(1.0))
