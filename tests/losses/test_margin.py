"""functrain.losses.margin against optax.losses: the hinge and perceptron losses (binary and
multiclass) and the sparsemax losses; values and gradients on the same random inputs (float32
jitted and eager, float64, bfloat16, integer scores), ties (subgradients), labels out of range,
and the errors.

Rounding bounds (``helpers.rounding_bound``): a binary hinge or perceptron loss rounds twice
(a product, a difference) values up to ``max|s * t| + 1``; a multiclass one ``C + 3`` times (a
one-hot product summed over ``C`` classes, a maximum, a difference); the binary sparsemax loss
three times (``(x + 1)**2 / 4``) values up to ``(max|x| + 1)**2``; the multiclass one projects
onto the simplex (a cumulative sum of ``C`` values, a division) and sums ``2 * C`` squares:
``4 * C + 4`` steps of ``(max|s| + 1)**2``.
"""

import numpy as np
import jax.numpy as jnp
import optax.losses as ol
import pytest

from functrain import losses
from functrain.jax_compat import enable_x64
from functrain.losses.checks import LossInputError
from helpers import assert_losses_like_optax, loss_case

BINARY = ["hinge_loss", "perceptron_loss"]
MULTICLASS = ["multiclass_hinge_loss", "multiclass_perceptron_loss", "multiclass_sparsemax_loss"]


def pair(name):
    return getattr(losses, name), getattr(ol, name)


def inputs(dtype=np.float32, shape=(6, 5)):
    """Scores, +-1 targets, 0/1 labels, integer class labels."""
    rng = np.random.default_rng(2)
    scores = (2 * rng.standard_normal(shape)).astype(dtype)
    signs = np.where(rng.random(shape) < 0.5, 1.0, -1.0).astype(dtype)
    bits = (rng.random(shape) < 0.5).astype(np.int32)
    classes = rng.integers(0, shape[-1], shape[:-1]).astype(np.int32)
    return scores, signs, bits, classes


def bounds(scores):
    top = float(np.abs(np.asarray(scores, np.float64)).max()) + 1
    c = scores.shape[-1]
    return dict(binary=dict(steps=2, magnitude=top), multi=dict(steps=c + 3, magnitude=top),
                sparse=dict(steps=3, magnitude=top ** 2),
                multi_sparse=dict(steps=4 * c + 4, magnitude=top ** 2))


def base_cases(scores, signs, bits, classes, grads=True):
    b = bounds(scores)
    g2, g1 = (dict(grad_argnums=(0, 1)), dict(grad_argnums=(0,))) if grads else ({}, {})
    return ([loss_case(*pair(name), scores, signs, **b["binary"], **g2) for name in BINARY]
            + [loss_case(*pair(name), scores, classes, **b["multi"], **g1)
               for name in MULTICLASS[:2]]
            + [loss_case(*pair("multiclass_sparsemax_loss"), scores, classes,
                         **b["multi_sparse"], **g1),
               loss_case(*pair("sparsemax_loss"), scores, bits, **b["sparse"], **g1)])


@pytest.mark.filterwarnings("ignore:jax.nn.one_hot input should be integer")  # optax's
def test_float32_and_bfloat16_values_and_gradients_are_optaxs():
    scores, signs, bits, classes = inputs()
    b = bounds(scores)
    ties = np.zeros_like(scores)
    ties[0] = signs[0]                            # outputs at the hinge's kink
    wild = classes.copy()
    wild[0], wild[1], wild[2] = 7, -1, -9         # out of range: one-hot zeros / clipped
    edges = scores.copy()
    edges[0] = [-1.0, 1.0, -1.0, 1.0, 0.0]        # the sparse_plus kinks
    g = dict(grad_argnums=(0,))
    cases = (
        [loss_case(*pair(name), ties, signs, **b["binary"], grad_argnums=(0, 1))
         for name in BINARY]
        + [loss_case(*pair(name), np.zeros_like(scores), classes, **b["multi"], **g)
           for name in MULTICLASS]                          # every class tied
        + [loss_case(*pair(name), scores, wild, **b["multi"], **g) for name in MULTICLASS[:2]]
        + [loss_case(*pair("multiclass_sparsemax_loss"), scores, wild, **b["multi_sparse"]),
           loss_case(*pair("multiclass_hinge_loss"), scores.reshape(2, 3, 5),
                     classes.reshape(2, 3), **b["multi"]),
           loss_case(*pair("multiclass_perceptron_loss"), scores[0], classes[0], **b["multi"]),
           loss_case(*pair("multiclass_hinge_loss"), scores, classes.astype(np.float32),
                     **b["multi"]),
           loss_case(*pair("multiclass_perceptron_loss"), scores > 0, classes, **b["multi"]),
           loss_case(*pair("hinge_loss"), scores, signs[0], **b["binary"]),
           loss_case(*pair("sparsemax_loss"), edges, bits, **b["sparse"], **g),
           loss_case(*pair("sparsemax_loss"), scores, 0.3 * bits, **b["sparse"]),
           loss_case(*pair("sparsemax_loss"), scores, bits[0], **b["sparse"])])
    assert_losses_like_optax(*base_cases(scores, signs, bits, classes), *cases,
                             *bfloat16_cases())


@pytest.mark.filterwarnings("ignore:scatter inputs have incompatible types")  # optax's
def test_integer_scores_are_optaxs():
    """Integer scores: integer hinge and perceptron losses, float sparsemax ones (as optax)."""
    scores, signs, bits, classes = inputs()
    ints = np.round(scores).astype(np.int32)
    out = assert_losses_like_optax(*base_cases(ints, signs.astype(np.int32), bits, classes,
                                               grads=False))
    assert out[0].dtype == jnp.int32 and out[-1].dtype == jnp.float32


def test_float64_values_and_gradients_are_optaxs():
    """Gradients of the sparsemax losses (the piecewise-linear hinge and perceptron ones'
    are compared in float32)."""
    with enable_x64():
        cases = base_cases(*inputs(np.float64, (3, 4)), grads=False)
        cases[4:] = base_cases(*inputs(np.float64, (3, 4)))[4:]
        assert_losses_like_optax(*cases)


def bfloat16_cases():
    """16-bit scores: the multiclass sparsemax loss is computed in float32 (optax's output
    dtype); optax subtracts the label's score in bfloat16 first, so the two differ by that
    rounding, ``C + 1`` bfloat16 steps of ``(max|s| + 1)**2``."""
    scores, signs, bits, classes = inputs(jnp.bfloat16, (3, 4))
    cases = base_cases(scores, signs, bits, classes, grads=False)
    top = float(np.abs(np.asarray(scores, np.float64)).max()) + 1
    bf16_steps = (4 + 1) * float(jnp.finfo(jnp.bfloat16).eps / jnp.finfo(jnp.float32).eps)
    cases[4] = loss_case(*pair("multiclass_sparsemax_loss"), scores, classes,
                         steps=bf16_steps, magnitude=top ** 2)
    return cases


def test_eager_values_are_optaxs():
    scores, signs, bits, classes = inputs(np.float32, (2, 3))
    b = bounds(scores)
    assert_losses_like_optax(
        loss_case(*pair("multiclass_hinge_loss"), scores, classes, **b["multi"]),
        loss_case(*pair("sparsemax_loss"), scores, bits, **b["sparse"]), jit=False)


@pytest.mark.parametrize("call, error, words", [
    (lambda: losses.hinge_loss(np.ones(3), np.ones(2)), LossInputError,
     "hinge_loss: targets of shape (2,) does not broadcast to the shape of predictor_outputs"),
    (lambda: losses.perceptron_loss(np.ones(3), np.ones((2, 1))), LossInputError,
     "perceptron_loss: predictor_outputs and targets must have the same shape"),
    (lambda: losses.hinge_loss(np.ones(3, bool), np.ones(3)), TypeError,
     "predictor_outputs must hold real numbers (floats or integers), got bool"),
    (lambda: losses.multiclass_hinge_loss(np.ones((2, 3)), np.array([0, 1, 1])), LossInputError,
     "scores must have shape [..., num_classes] and labels the shape [...]"),
    (lambda: losses.multiclass_perceptron_loss(np.ones(3), np.array(True)), TypeError,
     "labels must hold real numbers (floats or integers), got bool"),
    (lambda: losses.multiclass_hinge_loss(np.array(1.0), np.array(0)), LossInputError,
     "got scores () and labels ()"),
    (lambda: losses.multiclass_sparsemax_loss(np.ones(3), np.array(1)), LossInputError,
     "scores must have shape [batch, num_classes] and labels [batch]"),
    (lambda: losses.multiclass_sparsemax_loss(np.ones((2, 3)), np.array([0.0, 1.0])), TypeError,
     "labels must be an integer array of class indices, got float32"),
    (lambda: losses.sparsemax_loss(np.ones(7), np.ones(2)), LossInputError,
     "labels of shape (2,) does not broadcast to the shape of logits, (7,)"),
])
def test_bad_input_is_named_before_any_math(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


def test_errors_have_optaxs_exception_types():
    three, two = jnp.asarray(np.ones(3)), jnp.asarray(np.ones(2))
    for lib in (ol, losses):
        with pytest.raises(TypeError):      # lax's shape error in optax
            lib.hinge_loss(three, two)
        with pytest.raises(ValueError):     # optax's shape check
            lib.perceptron_loss(np.ones(3), np.ones((2, 1)))
        with pytest.raises(ValueError):     # a vector of scores, not a batch
            lib.multiclass_sparsemax_loss(np.ones(3), np.array(1))
        with pytest.raises(TypeError):      # float class labels
            lib.multiclass_sparsemax_loss(np.ones((2, 3)), np.array([0.0, 1.0]))
