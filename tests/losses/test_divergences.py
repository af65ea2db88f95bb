"""functrain.losses.divergences against optax.losses: the Kullback-Leibler divergences (targets
as probabilities or log-probabilities, zero targets), the generalized one and its deprecated
name; values and gradients on the same random inputs (float32 jitted and eager, float64,
bfloat16), ``axis`` and ``where``, and the errors.

Rounding bounds (``helpers.rounding_bound``): each term ``t * (log(t) - log_p)`` rounds three
times, the generalized one adds an ``exp`` and a difference, and the sum over ``d`` entries
rounds ``d`` times: ``d + 5`` steps of ``max|log_p| + max|log t| + 1``.
"""

import warnings

import numpy as np
import jax.numpy as jnp
import optax.losses as ol
import pytest

from functrain import losses
from functrain.jax_compat import enable_x64
from functrain.losses.checks import LossInputError
from helpers import assert_losses_like_optax, loss_case

NAMES = ["kl_divergence", "generalized_kl_divergence", "convex_kl_divergence"]
pytestmark = pytest.mark.filterwarnings("ignore:.*convex_kl_divergence is deprecated")


def pair(name):
    return getattr(losses, name), getattr(ol, name)


def inputs(dtype=np.float32, shape=(4, 3, 5)):
    """Log-predictions, target probabilities (two of them 0), their logs, a mask."""
    rng = np.random.default_rng(3)

    def distribution():
        x = np.exp(2 * rng.standard_normal(shape))
        return x / x.sum(-1, keepdims=True)

    log_p = np.log(distribution()).astype(dtype)
    t = distribution()
    t.flat[1] = t.flat[-2] = 0.0
    return log_p, t.astype(dtype), np.log(distribution()).astype(dtype), rng.random(shape) < 0.7


def bound(log_p, t, d):
    logs = np.abs(np.log(np.asarray(t, np.float64)[np.asarray(t) > 0])).max()
    return dict(steps=d + 5, magnitude=float(np.abs(log_p).max() + logs + 1))


def base_cases(log_p, t, log_t, grads=True):
    g = dict(grad_argnums=(0, 1)) if grads else {}
    b = bound(log_p, t, log_p.shape[-1])
    return ([loss_case(*pair(name), log_p, t, **b, **g) for name in NAMES[:2]]
            + [loss_case(*pair("kl_divergence_with_log_targets"), log_p, log_t, **b, **g)])


def test_float32_and_bfloat16_values_and_gradients_are_optaxs():
    """Zero targets: a finite divergence, NaN gradient in that target (log 0), as optax."""
    log_p, t, log_t, w = inputs()
    b5, b4, b15 = (bound(log_p, t, d) for d in (5, 4, 15))
    with_log = pair("kl_divergence_with_log_targets")
    with np.errstate(divide="ignore"):
        log_t0 = np.log(t)                          # -inf where a target is 0: NaN terms
    cases = ([loss_case(*pair(name), log_p, t, **b4, axis=0) for name in NAMES]
             + [loss_case(*pair(name), log_p, t, **b15, axis=(0, 2)) for name in NAMES[:2]]
             + [loss_case(*pair(name), log_p, t, **b5, where=w, grad_argnums=(0, 1))
                for name in NAMES[:2]]
             + [loss_case(*pair(name), log_p + 0.3, 2 * t, **b5) for name in NAMES[:2]]
             + [loss_case(*pair("kl_divergence"), log_p, t[0, 0], **b5),
                loss_case(*with_log, log_p, log_t, **b5, where=w, axis=1),
                loss_case(*with_log, log_p, log_t0, **b5, grad_argnums=(0, 1))])
    bf16 = base_cases(*inputs(jnp.bfloat16, (3, 4))[:3], grads=False)
    assert_losses_like_optax(*base_cases(log_p, t, log_t), *cases, *bf16)


def test_float64_values_and_gradients_are_optaxs():
    with enable_x64():
        assert_losses_like_optax(*base_cases(*inputs(np.float64, (3, 4))[:3]))


def test_eager_values_are_optaxs():
    log_p, t, _, w = inputs(np.float32, (2, 3))
    assert_losses_like_optax(loss_case(*pair("kl_divergence"), log_p, t, **bound(log_p, t, 3),
                                       where=w), jit=False)


def test_convex_kl_divergence_is_deprecated_as_in_optax():
    log_p, t, _, _ = inputs(np.float32, (2, 3))
    with pytest.warns(DeprecationWarning, match="use generalized_kl_divergence"):
        got = losses.convex_kl_divergence(log_p, t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(got, losses.generalized_kl_divergence(log_p, t))


@pytest.mark.parametrize("call, error, words", [
    (lambda: losses.kl_divergence(np.ones(3), np.ones(3, np.int32)), TypeError,
     "kl_divergence: targets must be a floating-point array"),
    (lambda: losses.kl_divergence_with_log_targets(np.ones(3, np.int32), np.ones(3)),
     TypeError, "log_predictions must be a floating-point array"),
    (lambda: losses.generalized_kl_divergence(np.ones(3), np.ones((2, 3))), LossInputError,
     "targets of shape (2, 3) does not broadcast to the shape of log_predictions, (3,)"),
    (lambda: losses.kl_divergence(np.ones((2, 3)), np.ones((2, 3)),
                                  where=np.array([True, False])),
     LossInputError, "where of shape (2,) does not broadcast to the input's shape (2, 3)"),
    (lambda: losses.kl_divergence(np.ones((2, 3)), np.ones((2, 3)), axis=(0, 3)),
     LossInputError, "axis=(0, 3) is out of range"),
])
def test_bad_input_is_named_before_any_math(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


def test_errors_have_optaxs_exception_types():
    for lib in (ol, losses):
        with pytest.raises(TypeError):
            lib.kl_divergence(np.ones(3), np.ones(3, np.int32))
        with pytest.raises(ValueError):
            lib.kl_divergence(np.ones((2, 3)), np.ones((2, 3)), where=np.array([True, False]))
