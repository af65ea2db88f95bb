"""functrain.losses.self_supervised against optax.losses: NT-Xent and the triplet margin
loss; values and gradients on the same random embeddings (float32 jitted and eager, float64,
bfloat16), a zero embedding, no negatives, no positive pair, and the errors, among them
optax's triplet distance for odd and fractional norm degrees (functrain takes ``|x - y|``).

Rounding bounds (``helpers.rounding_bound``): NT-Xent normalizes (``2 * d + 2`` roundings),
takes ``n`` cosines of ``d`` products, a log-sum-exp over ``n`` and a mean over ``n**2``
pairs: ``3 * d + 2 * n + n**2 + 4`` steps of ``1 / temperature``; the triplet loss sums ``d``
powers, takes a root and two differences: ``d + 6`` steps of the largest distance (cubed for
the third power).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax.losses as ol
import pytest

from functrain import losses
from functrain.jax_compat import enable_x64
from functrain.losses.checks import LossInputError, ZeroArgumentError
from helpers import assert_losses_like_optax, loss_case

NTXENT = (losses.ntxent, ol.ntxent)
TRIPLET = (losses.triplet_margin_loss, ol.triplet_margin_loss)


def inputs(dtype=np.float32, n=8, d=5):
    rng = np.random.default_rng(6)
    embeddings = rng.standard_normal((n, d)).astype(dtype)
    labels = np.sort(rng.integers(0, n // 2, n)).astype(np.int32)
    a, p, q = (rng.standard_normal((4, d)).astype(dtype) for _ in range(3))
    return embeddings, labels, a, p, q


def ntxent_bound(embeddings, temperature=0.07):
    n, d = embeddings.shape
    return dict(steps=3 * d + 2 * n + n * n + 4, magnitude=1 / temperature)


def triplet_bound(a, p, q, degree=2):
    far = max(np.abs(np.asarray(a, np.float64) - p).sum(-1).max(),
              np.abs(np.asarray(a, np.float64) - q).sum(-1).max()) + 1
    return dict(steps=a.shape[-1] + 6, magnitude=float(far) ** max(degree, 1))


def base_cases(embeddings, labels, a, p, q, grads=True):
    g1 = dict(grad_argnums=(0,)) if grads else {}
    g3 = dict(grad_argnums=(0, 1, 2)) if grads else {}
    return [loss_case(*NTXENT, embeddings, labels, **ntxent_bound(embeddings), **g1),
            loss_case(*TRIPLET, a, p, q, **triplet_bound(a, p, q), **g3)]


def test_float32_and_bfloat16_values_and_gradients_are_optaxs():
    embeddings, labels, a, p, q = inputs()
    b = ntxent_bound(embeddings)
    zero = embeddings.copy()
    zero[0] = 0.0                         # a zero embedding: cosines 0, a large gradient
    tb = triplet_bound(a, p, q)
    g3 = dict(grad_argnums=(0, 1, 2))
    # NT-Xent (costly to compile) on four groupings in one case, vmapped: the labels, no
    # negatives (0), no positive pair (NaN), two groups; its gradient on a zero embedding
    # here, on general ones in float64
    groupings = np.stack([labels, np.zeros_like(labels), np.arange(8, dtype=np.int32),
                          np.arange(8, dtype=np.int32) % 2])
    assert_losses_like_optax(
        *base_cases(embeddings, labels, a, p, q)[1:],
        loss_case(*(jax.vmap(f, (None, 0, None)) for f in NTXENT), embeddings, groupings, 0.5,
                  **ntxent_bound(embeddings, 0.5)),
        loss_case(*NTXENT, zero, labels.astype(np.float32), **b, grad_argnums=(0,),
                  grad_magnitude=3 / float(np.sqrt(np.finfo(np.float32).eps))),
        loss_case(*TRIPLET, a, a, q, **tb, **g3),                        # d(a, a) = eps**0.5
        loss_case(*TRIPLET, a, p, q[0], **tb, **g3),
        loss_case(*TRIPLET, a.T, p.T, q.T, **triplet_bound(a.T, p.T, q.T), axis=0),
        loss_case(*TRIPLET, a, p, q, **triplet_bound(a, p, q, 4), norm_degree=4, margin=0.5,
                  eps=1e-3, **g3),
        loss_case(*TRIPLET, a, p, q, **tb, margin=3.0, eps=0.5),
        *base_cases(*inputs(jnp.bfloat16, 6, 3), grads=False))


def test_float64_values_and_gradients_are_optaxs():
    with enable_x64():
        assert_losses_like_optax(*base_cases(*inputs(np.float64, 6, 3)))


def test_eager_values_are_optaxs():
    _, _, a, p, q = inputs(np.float32, 4, 3)
    assert_losses_like_optax(loss_case(*TRIPLET, a, p, q, **triplet_bound(a, p, q)), jit=False)


def test_odd_and_fractional_norm_degrees_are_distances():
    """optax raises ``a - p`` itself to the power: a signed sum for odd degrees, NaN for
    fractional ones; functrain takes ``|a - p|``, a p-norm distance (equal for even ones)."""
    _, _, a, p, q = inputs()
    for degree in (1, 3, 2.5):
        got = losses.triplet_margin_loss(a, p, q, norm_degree=degree, margin=3.0, eps=0.0)
        d_ap = (np.abs(a - p) ** degree).sum(-1) ** (1 / degree)
        d_aq = (np.abs(a - q) ** degree).sum(-1) ** (1 / degree)
        np.testing.assert_allclose(got, np.maximum(d_ap - d_aq + 3.0, 0), rtol=2e-6)
    assert np.isnan(np.asarray(ol.triplet_margin_loss(a, p, q, norm_degree=2.5))).all()


@pytest.mark.parametrize("call, error, words", [
    (lambda: losses.ntxent(np.ones((4, 2), np.int32), np.arange(4)), TypeError,
     "ntxent: embeddings must be a floating-point array"),
    (lambda: losses.ntxent(np.ones((4, 2)), np.arange(3)), LossInputError,
     "labels and embeddings must have the same leading dimension, found 3 for labels and 4"),
    (lambda: losses.ntxent(np.ones((2, 4, 2)), np.arange(2)), LossInputError,
     "embeddings must have shape [batch, feature_length] and labels [batch]"),
    (lambda: losses.triplet_margin_loss(np.ones((4, 2)), np.ones((3, 2)), np.ones((4, 2))),
     LossInputError, "positives of shape (3, 2) does not broadcast to the shape of anchors"),
    (lambda: losses.triplet_margin_loss(np.ones((4, 2)), np.ones((4, 2)), np.ones((4, 2)),
                                        norm_degree=0), ZeroArgumentError,
     "triplet_margin_loss: norm_degree must be > 0, got 0."),
    (lambda: losses.triplet_margin_loss(np.ones((4, 2)), np.ones((4, 2)), np.ones((4, 2)),
                                        norm_degree=-1), LossInputError,
     "norm_degree must be > 0, got -1."),
])
def test_bad_input_is_named_before_any_math(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


def test_errors_have_optaxs_exception_types():
    ones = np.ones((4, 2))
    for lib in (ol, losses):
        with pytest.raises(ValueError):
            lib.ntxent(ones, np.arange(3))
        with pytest.raises(ZeroDivisionError):
            lib.triplet_margin_loss(ones, ones, ones, norm_degree=0)
