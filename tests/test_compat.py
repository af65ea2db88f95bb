"""Tests of functrain.compat: Ivy's one-shot update functions.

Every example of seed 001 (Ivy's gradients API) for adam_step, adam_update,
gradient_descent_update, lamb_update, lars_update and optimizer_update is
reproduced with its printed numbers.  Where the docs print ~8 significant
digits we use a tight tolerance (float32 rounding only); where they print 3
we use a tolerance matching that rounding.  Ivy's ``out=`` examples check the
returned value instead (functrain has no ``out=``).  Unusual argument orders
in the docs are kept: the printed numbers were produced that way.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain import compat
from functrain.compat import (
    adam_step,
    adam_update,
    gradient_descent_update,
    lamb_update,
    lars_update,
    optimizer_update,
)

from helpers import loose, tight

A = jnp.array


def assert_tree(check, got, expected):
    """Same tree structure, and every leaf passes ``check``.

    In ``expected``, (nested) lists of numbers are leaves: array literals.
    """
    expected = jax.tree.map(np.asarray, expected, is_leaf=lambda x: isinstance(x, list))
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    jax.tree.map(check, got, expected)


# --------------------------------------------------------------------------
# adam_step: seed 001 examples
# --------------------------------------------------------------------------


def test_adam_step_seed_array_integer_gradients():
    dcdw = A([1, 2, 3])  # integers: promoted to float
    delta, mw, vw = adam_step(dcdw, jnp.ones(3), jnp.ones(1), A(3))
    tight(delta, [0.2020105, 0.22187898, 0.24144873])
    tight(mw, [0.99999998, 1.09999998, 1.19999998])
    tight(vw, [1.00000001, 1.00300001, 1.00800001])
    assert delta.dtype == jnp.float32 and delta.shape == (3,)


def test_adam_step_seed_array_hyperparameters():
    dcdw = A([[1.0, 4.0, -3.0], [2.0, 3.0, 0.5]])
    delta, mw, vw = adam_step(
        dcdw, jnp.zeros((2, 3)), jnp.zeros(3), A(1), beta1=0.86, beta2=0.95, epsilon=1e-6
    )
    loose(delta, [[1.0, 1.0, -1.0], [1.0, 1.0, 1.0]])
    tight(mw, [[0.14, 0.56, -0.42], [0.28, 0.42, 0.07]])
    tight(vw, [[0.05, 0.8, 0.45], [0.2, 0.45, 0.0125]])


def test_adam_step_seed_array_fractional_step():
    # Ivy: adam_step(dcdw, mw, vw, step, out=out); print(out) -> the delta.
    delta, _, _ = adam_step(A([0.1, -0.7, 2]), jnp.ones(1), jnp.ones(1), A(3.6))
    tight(delta, [0.17294501, 0.15770318, 0.20863818])


def test_adam_step_seed_one_container():
    dcdw = {"a": A([0.0, 1.0, 2.0]), "b": A([3.0, 4.0, 5.0])}
    out = adam_step(
        dcdw, A([1.0, 4.0, 9.0]), A([0.0]), A([3.4]), beta1=0.87, beta2=0.976, epsilon=1e-5
    )
    expected = (
        {"a": [6.49e04, 1.74e01, 1.95e01], "b": [2.02, 4.82, 8.17]},
        {"a": [0.87, 3.61, 8.09], "b": [1.26, 4.0, 8.48]},
        {"a": [0.0, 0.024, 0.096], "b": [0.216, 0.384, 0.6]},
    )
    assert_tree(loose, out, expected)
    # The (1,)-shaped step broadcasts inside each leaf; leaves keep shape (3,).
    assert all(leaf.shape == (3,) for leaf in jax.tree.leaves(out))


def test_adam_step_seed_multiple_containers():
    dcdw = {"a": A([0.0, 1.0, 2.0]), "b": A([3.0, 4.0, 5.0])}
    mw = {"a": jnp.zeros(3), "b": jnp.zeros(3)}
    vw = {"a": A([0.0]), "b": A([0.0])}
    out = adam_step(dcdw, mw, vw, A([3.4]), beta1=0.87, beta2=0.976, epsilon=1e-5)
    expected = (
        {"a": [0.0, 0.626, 0.626], "b": [0.626, 0.626, 0.626]},
        {"a": [0.0, 0.13, 0.26], "b": [0.39, 0.52, 0.65]},
        {"a": [0.0, 0.024, 0.096], "b": [0.216, 0.384, 0.6]},
    )
    assert_tree(loose, out, expected)


def test_adam_step_formula_by_hand():
    # One element, written out in double precision.
    g, m, v, t, b1, b2, eps = 0.3, 0.2, 0.05, 5.0, 0.8, 0.9, 1e-3
    m1 = b1 * m + (1 - b1) * g
    v1 = b2 * v + (1 - b2) * g * g
    alpha = math.sqrt(1 - b2**t) / (1 - b1**t + eps)
    want = alpha * m1 / (math.sqrt(v1) + eps)
    delta, mw, vw = adam_step(A(g), A(m), A(v), t, beta1=b1, beta2=b2, epsilon=eps)
    tight(delta, want)
    tight(mw, m1)
    tight(vw, v1)


def test_adam_step_negative_second_moment_is_clamped():
    # sqrt(max(vw, 0)): a (numerically) negative second moment reads as 0.
    delta, _, vw = adam_step(A(0.0), A(1.0), A(-4.0), 1, beta1=0.5, beta2=0.5, epsilon=0.25)
    assert float(vw) == -2.0
    alpha = math.sqrt(0.5) / (0.5 + 0.25)
    tight(delta, alpha * 0.5 / 0.25)


# --------------------------------------------------------------------------
# adam_update: seed 001 examples
# --------------------------------------------------------------------------


def test_adam_update_seed_array():
    w_new, mw, vw = adam_update(A([1.0, 2, 3]), A([0.5, 0.2, 0.1]), A(0.1), jnp.zeros(3), jnp.zeros(1), 1)
    tight(w_new, [0.90000075, 1.90000164, 2.9000032])
    tight(mw, [0.05, 0.02, 0.01])
    tight(vw, [2.50000012e-04, 4.00000063e-05, 1.00000016e-05])


def test_adam_update_seed_array_matrix():
    w = A([[1.0, 2, 3], [4, 2, 4], [6, 4, 2]])
    dcdw = A([[0.1, 0.2, 0.3], [0.4, 0.5, 0.1], [0.1, 0.5, 0.3]])
    w_new, mw, vw = adam_update(
        w, dcdw, A(0.1), jnp.zeros((3, 3)), jnp.zeros(3), 2,
        beta1=0.9, beta2=0.999, epsilon=1e-7, stop_gradients=True,
    )
    tight(w_new, [[0.92558873, 1.92558754, 2.92558718],
                  [3.92558694, 1.92558682, 3.92558861],
                  [5.92558861, 3.92558694, 1.92558718]])
    tight(mw, [[0.01, 0.02, 0.03], [0.04, 0.05, 0.01], [0.01, 0.05, 0.03]])
    tight(vw, [[1.00000016e-05, 4.00000063e-05, 9.00000086e-05],
               [1.60000025e-04, 2.50000012e-04, 1.00000016e-05],
               [1.00000016e-05, 2.50000012e-04, 9.00000086e-05]])


def test_adam_update_seed_one_container_unusual_order():
    # The docs call adam_update(w, dcdw, mw_tm1, vw_tm1, lr, step): the
    # zero "mw_tm1" lands in lr, so the weights do not move.
    w = {"a": A([1.0, 2.0, 3.0]), "b": A([4.0, 5.0, 6.0])}
    dcdw = A([0.5, 0.2, 0.4])
    mw_tm1 = A([0.0, 0.0, 0.0])
    vw_tm1 = A([0.0])
    lr = A(0.01)
    w_new, mw, vw = adam_update(w, dcdw, mw_tm1, vw_tm1, lr, 2)
    assert_tree(loose, w_new, {"a": [1.0, 2.0, 3.0], "b": [4.0, 5.0, 6.0]})
    # Gradients and moments are single arrays, so the moments stay arrays.
    assert isinstance(mw, jax.Array) and isinstance(vw, jax.Array)
    loose(mw, [0.05, 0.02, 0.04])
    loose(vw, [0.01024, 0.01003, 0.01015])


def test_adam_update_seed_multiple_containers():
    # The docs' snippet defines `x` but passes `w`, the weights of the
    # previous example; the printed numbers are for that `w`.
    w = {"a": A([1.0, 2.0, 3.0]), "b": A([4.0, 5.0, 6.0])}
    dcdw = {"a": A([0.1, 0.3, 0.3]), "b": A([0.3, 0.2, 0.2])}
    mw_tm1 = {"a": jnp.zeros(3), "b": jnp.zeros(3)}
    vw_tm1 = {"a": A([0.0]), "b": A([0.0])}
    out = adam_update(
        w, dcdw, A(0.001), mw_tm1, vw_tm1, 3,
        beta1=0.9, beta2=0.999, epsilon=1e-7, stop_gradients=False,
    )
    expected = (
        {"a": [0.99936122, 1.99936116, 2.99936128], "b": [3.99936128, 4.99936104, 5.99936104]},
        {"a": [0.01, 0.03, 0.03], "b": [0.03, 0.02, 0.02]},
        {"a": [1.00000016e-05, 9.00000086e-05, 9.00000086e-05],
         "b": [9.00000086e-05, 4.00000063e-05, 4.00000063e-05]},
    )
    assert_tree(tight, out, expected)


# --------------------------------------------------------------------------
# gradient_descent_update: seed 001 examples
# --------------------------------------------------------------------------


def test_gradient_descent_update_seed_arrays():
    w = A([[1.0, 2, 3], [4, 6, 1], [1, 0, 7]])
    dcdw = A([[0.5, 0.2, 0.1], [0.3, 0.6, 0.4], [0.4, 0.7, 0.2]])
    loose(gradient_descent_update(w, dcdw, A(0.1), stop_gradients=True),
          [[0.95, 1.98, 2.99], [3.97, 5.94, 0.96], [0.96, -0.07, 6.98]])
    # Ivy: gradient_descent_update(w, dcdw, lr, out=out); print(out)
    loose(gradient_descent_update(A([1.0, 2.0, 3.0]), A([0.5, 0.2, 0.1]), A(0.3)),
          [0.85, 1.94, 2.97])


def test_gradient_descent_update_seed_containers():
    w = {"a": A([1.0, 2.0, 3.0]), "b": A([3.48, 5.72, 1.98])}
    assert_tree(loose, gradient_descent_update(w, A([0.5, 0.2, 0.1]), A(0.3)),
                {"a": [0.85, 1.94, 2.97], "b": [3.33, 5.66, 1.95]})
    dcdw = {"a": A([0.5, 0.2, 0.1]), "b": A([2.0, 3.42, 1.69])}
    assert_tree(loose, gradient_descent_update(w, dcdw, A(0.3)),
                {"a": [0.85, 1.94, 2.97], "b": [2.88, 4.69, 1.47]})


# --------------------------------------------------------------------------
# lamb_update: seed 001 examples
# --------------------------------------------------------------------------


def test_lamb_update_seed_array():
    w_new, mw, vw = lamb_update(A([1.0, 2, 3]), A([0.5, 0.2, 0.1]), A(0.1), jnp.zeros(3), jnp.zeros(1), A(1))
    loose(w_new, [0.784, 1.78, 2.78])
    loose(mw, [0.05, 0.02, 0.01])
    loose(vw, [2.5e-04, 4.0e-05, 1.0e-05])


def test_lamb_update_seed_array_matrix():
    w = A([[1.0, 2, 3], [4, 6, 1], [1, 0, 7]])
    dcdw = A([[0.5, 0.2, 0.1], [0.3, 0.6, 0.4], [0.4, 0.7, 0.2]])
    # Ivy: ..., out=out); print(out)
    w_new, _, _ = lamb_update(
        w, dcdw, A(0.1), jnp.zeros((3, 3)), jnp.zeros(3), A(1),
        beta1=0.9, beta2=0.999, epsilon=1e-7, max_trust_ratio=10, decay_lambda=0,
        stop_gradients=True,
    )
    loose(w_new, [[0.639, 1.64, 2.64], [3.64, 5.64, 0.639], [0.639, -0.361, 6.64]])


def test_lamb_update_seed_one_container_unusual_order():
    # lamb_update(w, dcdw, mw_tm1, vw_tm1, lr, step) as in the docs: zero lr.
    w = {"a": A([1.0, 2.0, 3.0]), "b": A([4.0, 5.0, 6.0])}
    w_new, mw, vw = lamb_update(w, A([3.0, 4.0, 5.0]), A([0.0, 0.0, 0.0]), A([0.0]), A(1.0), A([2]))
    assert_tree(loose, w_new, {"a": [1.0, 2.0, 3.0], "b": [4.0, 5.0, 6.0]})
    assert isinstance(mw, jax.Array) and isinstance(vw, jax.Array)
    loose(mw, [0.3, 0.4, 0.5])
    loose(vw, [1.01, 1.01, 1.02])


def test_lamb_update_seed_multiple_containers():
    w = {"a": A([1.0, 3.0, 5.0]), "b": A([3.0, 4.0, 2.0])}
    dcdw = {"a": A([0.2, 0.3, 0.6]), "b": A([0.6, 0.4, 0.7])}
    mw_tm1 = {"a": jnp.zeros(3), "b": jnp.zeros(3)}
    vw_tm1 = {"a": A([0.0]), "b": A([0.0])}
    out = lamb_update(
        w, dcdw, A(0.5), mw_tm1, vw_tm1, A([3.4]),
        beta1=0.9, beta2=0.999, epsilon=1e-7, max_trust_ratio=10, decay_lambda=0,
        stop_gradients=True,
    )
    expected = (
        {"a": [-0.708, 1.29, 3.29], "b": [1.45, 2.45, 0.445]},
        {"a": [0.02, 0.03, 0.06], "b": [0.06, 0.04, 0.07]},
        {"a": [4.0e-05, 9.0e-05, 3.6e-04], "b": [0.00036, 0.00016, 0.00049]},
    )
    assert_tree(loose, out, expected)


# --------------------------------------------------------------------------
# lars_update: seed 001 examples
# --------------------------------------------------------------------------


def test_lars_update_seed_arrays():
    w = A([[3.0, 1, 5], [7, 2, 9]])
    dcdw = A([[0.3, 0.1, 0.2], [0.1, 0.2, 0.4]])
    tight(lars_update(w, dcdw, A(0.1)),
          [[2.34077978, 0.78025991, 4.56051969], [6.78026009, 1.56051981, 8.12103939]])
    # Ivy: lars_update(w, dcdw, lr, out=out); print(out)
    tight(lars_update(A([3.0, 1, 5]), A([0.3, 0.1, 0.2]), A(0.1)),
          [2.52565837, 0.8418861, 4.68377209])


def test_lars_update_seed_containers():
    w = {"a": A([3.2, 2.6, 1.3]), "b": A([1.4, 3.1, 5.1])}
    assert_tree(tight, lars_update(w, A([0.2, 0.4, 0.1]), A(0.1)),
                {"a": [3.01132035, 2.22264051, 1.2056601],
                 "b": [1.1324538, 2.56490755, 4.96622658]})
    dcdw = {"a": A([0.2, 0.4, 0.1]), "b": A([0.3, 0.1, 0.2])}
    assert_tree(tight, lars_update(w, dcdw, A(0.1)),
                {"a": [3.01132035, 2.22264051, 1.2056601],
                 "b": [0.90848625, 2.93616199, 4.77232409]})


# --------------------------------------------------------------------------
# optimizer_update: seed 001 examples
# --------------------------------------------------------------------------


def test_optimizer_update_seed_arrays():
    w = A([1.0, 2.0, 3.0])
    tight(optimizer_update(w, jnp.zeros(3), 3e-4), [1.0, 2.0, 3.0])
    tight(optimizer_update(w, jnp.zeros(3), 3e-4, stop_gradients=True), [1.0, 2.0, 3.0])
    # lr of shape (2,) broadcasts along the last axis of a (2, 2) leaf.
    loose(optimizer_update(A([[1.0, 2.0], [4.0, 5.0]]), A([[4.0, 5.0], [7.0, 8.0]]), A([3e-4, 1e-2])),
          [[0.999, 1.95], [4.0, 4.92]])
    loose(optimizer_update(w, A([4.0, 5.0, 6.0]), A([3e-4]), stop_gradients=False),
          [0.999, 2.0, 3.0])


def test_optimizer_update_seed_containers():
    w = {"a": A([0.0, 1.0, 2.0]), "b": A([3.0, 4.0, 5.0])}
    expected = {"a": [0.0, 1.0, 2.0], "b": [3.0, 4.0, 5.0]}
    assert_tree(tight, optimizer_update(w, A([0.0, 0.0, 0.0]), 3e-4), expected)
    zeros = {"a": jnp.zeros(3), "b": jnp.zeros(3)}
    assert_tree(tight, optimizer_update(w, zeros, 3e-4), expected)
    assert_tree(tight, optimizer_update(w, zeros, A([3e-4]), stop_gradients=False), expected)


def test_optimizer_update_formula():
    w = {"a": A([1.0, 2.0]), "b": A(3.0)}
    g = {"a": A([10.0, -10.0]), "b": A(2.0)}
    assert_tree(tight, optimizer_update(w, g, 0.5), {"a": [-4.0, 7.0], "b": 2.0})
    # a learning rate per leaf
    assert_tree(tight, optimizer_update(w, g, {"a": 0.1, "b": 1.0}), {"a": [0.0, 3.0], "b": 1.0})


# --------------------------------------------------------------------------
# Decay paths, derived by hand (these follow the LAMB / LARS papers).
# --------------------------------------------------------------------------


def test_lars_update_decay_by_hand():
    # ||w|| = 5, ||g|| = 1, decay 0.1: local_lr = 0.1 * 5 / (1 + 0.1 * 5) = 1/3;
    # direction g + 0.1 w = [0.8 + 0.3, 0.6 + 0.4] = [1.1, 1.0].
    w, g = A([3.0, 4.0]), A([0.8, 0.6])
    got = lars_update(w, g, 0.1, decay_lambda=0.1)
    tight(got, [3.0 - 1.1 / 3.0, 4.0 - 1.0 / 3.0])
    # Ivy's formula would divide the rate by ||w|| * decay (= 0.5) and step
    # along g alone: w - 1.0 * g = [2.2, 3.4].  functrain does not.
    assert not np.allclose(got, [2.2, 3.4])


def test_lars_update_decay_per_leaf_norms():
    w = {"x": A([3.0, 4.0]), "y": A([[0.0, 2.0]])}
    g = {"x": A([0.8, 0.6]), "y": A([[1.0, 0.0]])}
    got = lars_update(w, g, 0.1, decay_lambda=0.1)
    # y: ||w|| = 2, ||g|| = 1: local_lr = 0.2 / 1.2 = 1/6; direction [1, 0.2].
    assert_tree(tight, got, {"x": [3.0 - 1.1 / 3.0, 4.0 - 1.0 / 3.0],
                             "y": [[0.0 - 1.0 / 6.0, 2.0 - 0.2 / 6.0]]})


def test_lamb_update_decay_by_hand():
    # step 1 from zero moments with epsilon 0: the adam delta is sign(dcdw)
    # exactly, so eff = [1, -1].  decay 0.5: u = eff + 0.5 w = [2.5, 1.0];
    # ||w|| = 5, ||u|| = sqrt(7.25): r = 5 / sqrt(7.25).
    w, g = A([3.0, 4.0]), A([2.0, -3.0])
    w_new, mw, vw = lamb_update(w, g, 0.1, jnp.zeros(2), jnp.zeros(2), 1,
                                epsilon=0.0, decay_lambda=0.5)
    r = 5.0 / math.sqrt(7.25)
    tight(w_new, [3.0 - 0.1 * r * 2.5, 4.0 - 0.1 * r * 1.0])
    tight(mw, [0.2, -0.3])
    tight(vw, [0.004, 0.009])
    # Ivy would apply lr * r * eff (no decay in the step): [3 - 0.1 r, 4 + 0.1 r].
    assert not np.allclose(w_new, [3.0 - 0.1 * r, 4.0 + 0.1 * r], atol=1e-3)


def test_lamb_update_max_trust_ratio_caps():
    w, g = A([3.0, 4.0]), A([2.0, -3.0])
    # r = 5 / sqrt(7.25) ~ 1.86 is capped at 1: w - 0.1 * [2.5, 1.0].
    w_new, _, _ = lamb_update(w, g, 0.1, jnp.zeros(2), jnp.zeros(2), 1,
                              epsilon=0.0, decay_lambda=0.5, max_trust_ratio=1)
    tight(w_new, [2.75, 3.9])
    # Without decay: eff = [1, -1], ||eff|| = sqrt(2), r = 5 / sqrt(2) ~ 3.54,
    # capped at 2: w - 0.2 * [1, -1].
    w_new, _, _ = lamb_update(w, g, 0.1, jnp.zeros(2), jnp.zeros(2), 1,
                              epsilon=0.0, max_trust_ratio=2)
    tight(w_new, [2.8, 4.2])


# --------------------------------------------------------------------------
# Gradients through the updates (stop_gradients=False), second-order use.
# --------------------------------------------------------------------------


def _reference_lars(w, g, lr, lam):
    wn, gn = jnp.linalg.norm(w), jnp.linalg.norm(g)
    return w - lr * wn / (gn + lam * wn + 1e-12) * (g + lam * w)


def _reference_lamb(w, g, lr, m0, v0, t, lam, b1=0.9, b2=0.999, eps=1e-7, cap=10.0):
    m = b1 * m0 + (1 - b1) * g
    v = b2 * v0 + (1 - b2) * g**2
    eff = jnp.sqrt(1 - b2**t) / (1 - b1**t + eps) * m / (jnp.sqrt(v) + eps)
    u = eff + lam * w
    r = jnp.minimum(jnp.linalg.norm(w) / (jnp.linalg.norm(u) + 1e-12), cap)
    return w - lr * r * u


W0 = A([0.5, -1.0, 2.0])
G0 = A([0.3, 0.2, -0.4])


@pytest.mark.parametrize("name", ["gd", "opt", "adam", "lamb", "lars"])
def test_gradients_flow_only_without_stop(name):
    def new_weights(w, lr, stop):
        if name == "gd":
            return gradient_descent_update(w, G0 * w, lr, stop_gradients=stop)
        if name == "opt":
            return optimizer_update(w, G0 * w, lr, stop_gradients=stop)
        if name == "adam":
            return adam_update(w, G0 * w, lr, jnp.zeros(3), jnp.zeros(3), 2, stop_gradients=stop)[0]
        if name == "lamb":
            return lamb_update(w, G0 * w, lr, jnp.zeros(3), jnp.zeros(3), 2,
                               decay_lambda=0.1, stop_gradients=stop)[0]
        return lars_update(w, G0 * w, lr, decay_lambda=0.1, stop_gradients=stop)

    def loss(w, lr, stop):
        return jnp.sum(jnp.square(new_weights(w, lr, stop)))

    gw, glr = jax.grad(loss, argnums=(0, 1))(W0, 0.1, False)
    assert np.all(np.isfinite(gw)) and float(jnp.abs(glr)) > 1e-4
    gw_s, glr_s = jax.grad(loss, argnums=(0, 1))(W0, 0.1, True)
    assert np.all(np.asarray(gw_s) == 0) and float(glr_s) == 0.0


def test_gradient_descent_meta_gradient_by_hand():
    # L(lr) = sum((w - lr g)^2): dL/dlr = -2 sum((w - lr g) g); dL/dw = 2 (w - lr g).
    lr = 0.1
    gw, glr = jax.grad(lambda w, lr: jnp.sum(jnp.square(
        gradient_descent_update(w, G0, lr, stop_gradients=False))), argnums=(0, 1))(W0, lr)
    w_new = np.asarray(W0) - lr * np.asarray(G0)
    tight(glr, -2 * np.sum(w_new * np.asarray(G0)))
    tight(gw, 2 * w_new)


def test_lars_and_lamb_gradients_match_reference():
    lossl = lambda w, lr: jnp.sum(jnp.sin(lars_update(w, G0 * w, lr, decay_lambda=0.1, stop_gradients=False)))
    refl = lambda w, lr: jnp.sum(jnp.sin(_reference_lars(w, G0 * w, lr, 0.1)))
    for a, b in zip(jax.grad(lossl, (0, 1))(W0, 0.3), jax.grad(refl, (0, 1))(W0, 0.3)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
    m0, v0 = A([0.1, 0.0, -0.2]), A([0.01, 0.02, 0.03])
    lossm = lambda w, lr: jnp.sum(jnp.sin(lamb_update(w, G0 * w, lr, m0, v0, 3, decay_lambda=0.1,
                                                     stop_gradients=False)[0]))
    refm = lambda w, lr: jnp.sum(jnp.sin(_reference_lamb(w, G0 * w, lr, m0, v0, 3.0, 0.1)))
    for a, b in zip(jax.grad(lossm, (0, 1))(W0, 0.3), jax.grad(refm, (0, 1))(W0, 0.3)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
    tight(lamb_update(W0, G0, 0.3, m0, v0, 3, decay_lambda=0.1)[0],
          _reference_lamb(W0, G0, 0.3, m0, v0, 3.0, 0.1))


# --------------------------------------------------------------------------
# jax.jit with a traced step (and traced hyperparameters)
# --------------------------------------------------------------------------


def test_all_updates_under_jit_with_traced_step():
    w, g = A([1.0, -2.0, 3.0]), A([0.5, 0.25, -0.125])
    m, v = A([0.1, 0.2, 0.3]), A([0.01, 0.02, 0.03])

    @jax.jit
    def everything(w, g, m, v, step, lr, lam):
        return (
            adam_step(g, m, v, step),
            adam_update(w, g, lr, m, v, step),
            lamb_update(w, g, lr, m, v, step, decay_lambda=lam, max_trust_ratio=lam * 30),
            lars_update(w, g, lr, decay_lambda=lam),
            gradient_descent_update(w, g, lr),
            optimizer_update(w, g, lr),
        )

    for step in (1, 4, 7.5):
        jitted = everything(w, g, m, v, jnp.asarray(step, jnp.float32), 0.05, 0.1)
        eager = (
            adam_step(g, m, v, step),
            adam_update(w, g, 0.05, m, v, step),
            lamb_update(w, g, 0.05, m, v, step, decay_lambda=0.1, max_trust_ratio=3.0),
            lars_update(w, g, 0.05, decay_lambda=0.1),
            gradient_descent_update(w, g, 0.05),
            optimizer_update(w, g, 0.05),
        )
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-8), jitted, eager)
    # The step is data: one compilation served every step above.
    assert everything._cache_size() == 1


def test_step_kinds_agree():
    g, m, v = A([0.5, -0.25]), A([0.1, 0.2]), A([0.01, 0.02])
    ref = adam_step(g, m, v, 3)
    for step in (3.0, A(3), A(3.0), np.int32(3), A([3])):
        jax.tree.map(tight, adam_step(g, m, v, step), ref)


# --------------------------------------------------------------------------
# Pytrees of several kinds, structure checks
# --------------------------------------------------------------------------


class Params(NamedTuple):
    kernel: jax.Array
    bias: jax.Array


TREES = {
    "dict": lambda a, b: {"k": a, "b": b},
    "nested_list": lambda a, b: [[a], [b, []]],
    "namedtuple": lambda a, b: Params(kernel=a, bias=b),
}


@pytest.mark.parametrize("kind", sorted(TREES))
def test_trees_match_leafwise(kind):
    make = TREES[kind]
    wk, wb = A([[1.0, -2.0], [3.0, 0.5]]), A([0.25, -0.5])
    gk, gb = A([[0.1, 0.2], [-0.3, 0.4]]), A([0.05, 0.5])
    mk, mb = jnp.full((2, 2), 0.01), A([0.0])  # (1,) broadcasts inside the leaf
    vk, vb = jnp.full((2, 2), 0.001), A([0.002])
    w, g, m, v = make(wk, wb), make(gk, gb), make(mk, mb), make(vk, vb)

    def same(tree, leaves):
        want = make(*leaves)
        assert jax.tree.structure(tree) == jax.tree.structure(want)
        jax.tree.map(tight, tree, want)

    for fn, kw in [(lamb_update, {"decay_lambda": 0.01}), (adam_update, {})]:
        out = fn(w, g, 0.1, m, v, 2, **kw)
        outk = fn(wk, gk, 0.1, mk, vk, 2, **kw)
        outb = fn(wb, gb, 0.1, mb, vb, 2, **kw)
        for i in range(3):
            same(out[i], (outk[i], outb[i]))
    ds = adam_step(g, m, v, 2)
    for i in range(3):
        same(ds[i], (adam_step(gk, mk, vk, 2)[i], adam_step(gb, mb, vb, 2)[i]))
    same(lars_update(w, g, 0.1, decay_lambda=0.01),
         (lars_update(wk, gk, 0.1, decay_lambda=0.01), lars_update(wb, gb, 0.1, decay_lambda=0.01)))
    same(gradient_descent_update(w, g, 0.1),
         (gradient_descent_update(wk, gk, 0.1), gradient_descent_update(wb, gb, 0.1)))
    same(optimizer_update(w, g, 0.1), (optimizer_update(wk, gk, 0.1), optimizer_update(wb, gb, 0.1)))


def test_norms_are_per_leaf_not_global():
    w = {"a": A([3.0, 4.0]), "b": A([100.0])}
    g = {"a": A([1.0, 0.0]), "b": A([1.0])}
    got = lars_update(w, g, 0.1)
    # Leaf a alone: ||w|| = 5, ||g|| = 1 -> w - 0.5 g.  A global norm would
    # involve leaf b's 100 and give something else.
    tight(got["a"], [2.5, 4.0])
    tight(got["b"], [100.0 - 10.0])


def test_mismatched_structures_name_the_key_paths():
    w = {"enc": {"w": A([1.0]), "b": A([1.0])}, "dec": A([1.0, 2.0])}
    g = {"enc": {"w": A([1.0]), "c": A([1.0])}, "dec": A([1.0, 2.0, 3.0])}  # also a bad shape
    with pytest.raises(ValueError) as err:
        lars_update(w, g, 0.1)
    msg = str(err.value)
    assert "['enc']['b']" in msg and "['enc']['c']" in msg and "dcdw" in msg
    with pytest.raises(ValueError, match=r"\['enc'\]\['b'\]"):
        adam_step(w, g, A(0.0), 1)
    with pytest.raises(ValueError, match="effective_grad"):  # list vs tuple
        optimizer_update([A(1.0), A(2.0)], (A(1.0), A(2.0)), 0.1)
    with pytest.raises(ValueError, match=r"\['x'\]"):
        lamb_update(w, w, 0.1, w, {"x": A(1.0)}, 1)


def test_empty_tree():
    assert optimizer_update({}, {}, 0.1) == {}
    assert adam_update([], [], 0.1, [], [], 1) == ([], [], [])


def test_module_exports():
    assert set(compat.__all__) == {
        "adam_step", "optimizer_update", "gradient_descent_update",
        "adam_update", "lamb_update", "lars_update",
    }


def test_low_precision_weights_keep_their_dtype():
    w = jnp.array([1.0, -2.0, 3.0], jnp.bfloat16)
    g = jnp.array([0.5, 0.5, -0.5], jnp.bfloat16)
    assert gradient_descent_update(w, g, 1).dtype == jnp.bfloat16
    assert adam_update(w, g, 1, g, g * g, 2)[0].dtype == jnp.bfloat16
    assert lamb_update(w, g, 1, g, g * g, 2, decay_lambda=0.1)[0].dtype == jnp.bfloat16
    assert lars_update(w, g, 1, decay_lambda=0.1).dtype == jnp.bfloat16


def test_gradients_through_zero_weights_are_finite():
    """lamb_update / lars_update with stop_gradients=False at all-zero weights: no NaN."""
    w = jnp.zeros(3)
    g = jnp.array([0.1, -0.2, 0.3])

    def through_lamb(w):
        new_w, _, _ = functrain.lamb_update(w, g, 0.1, jnp.zeros(3), jnp.zeros(3), 1,
                                            stop_gradients=False)
        return jnp.sum(new_w ** 2)

    def through_lars(w):
        return jnp.sum(functrain.lars_update(w, g, 0.1, stop_gradients=False) ** 2)

    for fn in (through_lamb, through_lars):
        assert bool(jnp.all(jnp.isfinite(jax.grad(fn)(w))))
