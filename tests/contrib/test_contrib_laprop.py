"""functrain.contrib.laprop / scale_by_laprop (no optax counterpart).

Compared with: LaProp's Algorithm 1 (Ziyin, Wang & Ueda, 2020) written out in numpy
float64, with the paper's running bias-correction sums ``c_n = b2 c_n + (1 - b2)`` and
``c_m = b1 c_m + (1 - b1)`` (not the closed forms the package uses), over 30 steps with
weight decay on a masked subset; complex leaves against the same algorithm on ``|g|**2``;
and a hand-derived bound: every update coordinate is at most ``1/sqrt(1 - b2)`` for any
``b1`` (the paper's point that ``b1 > b2`` is safe), and the update is scale-free.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from functrain.contrib import ScaleByLapropState, laprop, scale_by_laprop
from functrain.jax_compat import enable_x64
from helpers import run_jitted

STEPS = 30


def ref_laprop(params, grads, lr, b1=0.9, b2=0.999, eps=1e-15, wd=0.0, mask=None):
    """The paper's Algorithm 1 in numpy, plus decoupled weight decay; params per step."""
    p = {k: np.array(v) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    n = {k: np.zeros(np.shape(v)) for k, v in p.items()}
    c_n = c_m = 0.0
    out = []
    for g in grads:
        c_n = b2 * c_n + (1 - b2)
        c_m = b1 * c_m + (1 - b1)
        for k in p:
            n[k] = b2 * n[k] + (1 - b2) * np.abs(g[k]) ** 2
            m[k] = b1 * m[k] + (1 - b1) * g[k] / (np.sqrt(n[k] / c_n) + eps)
            decay = wd * p[k] if (mask is None or mask[k]) else 0.0
            p[k] = p[k] - lr * (m[k] / c_m + decay)
        out.append({k: v.copy() for k, v in p.items()})
    return out


def _problem(dtype, steps=STEPS, complex_leaf=False):
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((5, 3)), "b": rng.standard_normal(3),
              "s": np.asarray(0.5)}
    grads = [{k: rng.standard_normal(np.shape(v)) * 10.0 ** rng.uniform(-2, 1)
              for k, v in params.items()} for _ in range(steps)]
    if complex_leaf:
        params["z"] = rng.standard_normal(4) + 1j * rng.standard_normal(4)
        for g in grads:
            g["z"] = rng.standard_normal(4) + 1j * rng.standard_normal(4)
    cast = (lambda t: {k: np.asarray(v, dtype if not np.iscomplexobj(v)
                                     else np.result_type(dtype, np.complex64))
                       for k, v in t.items()})
    return cast(params), [cast(g) for g in grads]


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_matches_the_papers_algorithm(dtype, rtol):
    with enable_x64(dtype == np.float64):
        mask = {"w": True, "b": False, "s": True}
        params, grads = _problem(dtype)
        ours, state = run_jitted(laprop(1e-2, b1=0.8, b2=0.95, eps=1e-8, weight_decay=0.1,
                                  mask=mask), params, grads)
        ref = ref_laprop(params, grads, 1e-2, b1=0.8, b2=0.95, eps=1e-8, wd=0.1, mask=mask)
        for t in (0, 1, STEPS - 1):
            for k in params:
                np.testing.assert_allclose(np.asarray(ours[t][k], np.float64), ref[t][k],
                                           rtol=rtol, atol=rtol * 1e-2, err_msg=f"step {t} {k}")
        assert isinstance(state[0], ScaleByLapropState)
        assert int(state[0].count) == STEPS
        assert ours[-1]["w"].dtype == dtype


def test_complex_leaves_use_the_squared_modulus():
    with enable_x64(True):
        params, grads = _problem(np.float64, complex_leaf=True)
        ours, _ = run_jitted(laprop(1e-2), params, grads)
        ref = ref_laprop(params, grads, 1e-2)
        np.testing.assert_allclose(np.asarray(ours[-1]["z"]), ref[-1]["z"], rtol=1e-12)


def test_defaults_are_the_authors():
    import inspect
    sig = inspect.signature(laprop).parameters
    assert (sig["learning_rate"].default, sig["b1"].default, sig["b2"].default,
            sig["eps"].default) == (4e-4, 0.9, 0.999, 1e-15)


def test_update_is_bounded_and_scale_free():
    # Hand-derived: nu >= (1 - b2) |g|**2 and 1 - b2**t <= 1, so each quotient has modulus
    # <= 1/sqrt(1 - b2); mu / (1 - b1**t) is a weighted mean of quotients, so the update
    # obeys the same bound for any b1 (the paper's point: b1 > b2 is safe). With eps = 0
    # the update is unchanged when every gradient is scaled by the same factor.
    b1, b2 = 0.99, 0.9
    rng = np.random.default_rng(3)
    grads = [jnp.asarray(rng.standard_normal(4) * 10.0 ** rng.uniform(-4, 2), jnp.float32)
             for _ in range(40)]
    tx = scale_by_laprop(b1, b2, eps=0.0)
    s1, s2 = tx.init(jnp.zeros(4)), tx.init(jnp.zeros(4))
    for g in grads:
        u1, s1 = tx.update(g, s1)
        u2, s2 = tx.update(1e3 * g, s2)
        assert float(jnp.max(jnp.abs(u1))) <= (1 - b2) ** -0.5 * (1 + 1e-5)
        np.testing.assert_allclose(u2, u1, rtol=1e-5)


def test_bad_hyperparameters_are_named():
    with pytest.raises(ValueError, match="scale_by_laprop: b2 must be in"):
        laprop(1e-3, b2=1.0)
    with pytest.raises(ValueError, match="laprop: eps must be finite"):
        laprop(1e-3, eps=float("inf"))
