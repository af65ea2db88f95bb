"""functrain.contrib.stable_spam / scale_by_stable_spam (no optax counterpart).

Compared with: Stable-SPAM's Algorithm 1 written out in numpy float64 from the paper and
the authors' PyTorch code, keeping the code's counters (``total_steps``, and one
``state['step']`` per leaf shared by AdaClip, AdaGN and Adam, incremented before the reset
and set to 1 by it) but the paper's reset (the moments zeroed before the step's update,
where the code still updates, and steps with, the old ones for that one step), over 30
steps with resets every 5 steps, the cosine scale over ``total_steps=30``, two 1000x
gradient spikes and weight decay on a masked subset; complex leaves against the same
algorithm on ``|g|``. What the paper claims: AdaGN brings a spiked gradient's norm back
to its running norm (``||g'|| = m_hat / (sqrt(v_hat) + eps)``), and a reset zeroes the
moments. Also ``inject_hyperparams``, jit against eager, errors naming the argument, and
4-bit state that leaves the per-leaf scalar statistics in float32.
"""

from __future__ import annotations

import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import ScaleByStableSpamState, scale_by_stable_spam, stable_spam
from functrain.jax_compat import enable_x64

STEPS = 30
SETTING = dict(b1=0.85, b2=0.99, eps=1e-8, gamma1=0.7, gamma2=0.9, theta=0.99,
               total_steps=30, eta_min=0.5, reset_interval=5)
SPIKES = (7, 18)


def ref_stable_spam(params, grads, lr, b1=0.9, b2=0.999, eps=1e-8, wd=0.0, mask=None,
                    gamma1=0.7, gamma2=0.9, theta=0.999, total_steps=None, eta_min=0.5,
                    reset_interval=1000):
    """Stable-SPAM in numpy, one leaf at a time; params per step."""
    p = {k: np.array(v) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros(np.shape(x)) for k, x in p.items()}
    step = {k: 0 for k in p}
    m_max = {k: 0.0 for k in p}
    m_norm = {k: 0.0 for k in p}
    v_norm = {k: 0.0 for k in p}
    out = []
    for total, g in enumerate(grads, start=1):
        if total_steps is None:
            s = 1.0
        else:
            s = eta_min + (1 - eta_min) * (1 + math.cos(math.pi * total / (total_steps + 1))) / 2
        for key in p:
            p[key] = p[key] * (1 - lr * wd) if (mask is None or mask[key]) else p[key]
            grad = np.array(g[key])
            step[key] += 1
            t = step[key]
            largest = np.max(np.abs(grad)) if grad.size else 0.0
            m_max[key] = theta * m_max[key] + (1 - theta) * largest
            bound = m_max[key] / (1 - theta ** t)
            over = np.abs(grad) > bound
            grad = np.where(over, grad / (largest if largest > 0 else 1.0) * bound, grad)
            n = math.sqrt(np.sum(np.abs(grad) ** 2))
            m_norm[key] = gamma1 * s * m_norm[key] + (1 - gamma1 * s) * n
            v_norm[key] = gamma2 * v_norm[key] + (1 - gamma2) * n ** 2
            m_hat = m_norm[key] / (1 - (gamma1 * s) ** t)
            v_hat = v_norm[key] / (1 - gamma2 ** t)
            if n > 0:
                grad = grad / n * (m_hat / (math.sqrt(v_hat) + eps))
            if reset_interval != 0 and total % reset_interval == 0:  # the paper's reset
                m[key], v[key] = np.zeros_like(m[key]), np.zeros_like(v[key])
                step[key] = t = 1
            b1_s = b1 * s
            m[key] = b1_s * m[key] + (1 - b1_s) * grad
            v[key] = b2 * v[key] + (1 - b2) * np.abs(grad) ** 2
            denom = np.sqrt(v[key]) / math.sqrt(1 - b2 ** t) + eps
            p[key] = p[key] - lr * (m[key] / (1 - b1_s ** t)) / denom
        out.append({k: x.copy() for k, x in p.items()})
    return out


def _problem(dtype, steps=STEPS, complex_leaf=False):
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((5, 3)), "b": rng.standard_normal(3),
              "s": np.asarray(0.5)}
    if complex_leaf:
        params["z"] = rng.standard_normal(4) + 1j * rng.standard_normal(4)
    grads = []
    for k in range(steps):
        g = {key: rng.standard_normal(np.shape(x)) for key, x in params.items()}
        if complex_leaf:
            g["z"] = g["z"] + 1j * rng.standard_normal(4)
        if k in SPIKES:
            g["w"] = g["w"] * np.where(rng.random((5, 3)) < 0.3, 1000.0, 1.0)
            g["s"] = g["s"] * 1000.0
        grads.append(g)
    cast = (lambda t: {k: np.asarray(v, dtype if not np.iscomplexobj(v)
                                     else np.result_type(dtype, np.complex64))
                       for k, v in t.items()})
    return cast(params), [cast(g) for g in grads]


def _run(opt, params, grads, jit=True):
    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return functrain.apply_updates(p, u), s
    step = jax.jit(step) if jit else step
    state, p, out = opt.init(params), params, []
    for g in grads:
        p, state = step(p, state, g)
        out.append(p)
    return out, state


def _assert_close(ours, ref, rtol):
    for t in range(len(ref)):
        for k in ref[t]:
            np.testing.assert_allclose(np.asarray(ours[t][k]), ref[t][k], rtol=rtol,
                                       atol=rtol * 1e-2, err_msg=f"step {t} {k}")


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 2e-4)])
def test_matches_the_algorithm_step_by_step(dtype, rtol):
    with enable_x64(dtype == np.float64):
        mask = {"w": True, "b": False, "s": True}
        params, grads = _problem(dtype)
        ours, state = _run(stable_spam(1e-2, weight_decay=0.1, mask=mask, **SETTING),
                           params, grads)
        _assert_close(ours, ref_stable_spam(params, grads, 1e-2, wd=0.1, mask=mask,
                                            **SETTING), rtol)
        assert isinstance(state[0], ScaleByStableSpamState) and int(state[0].count) == STEPS
        assert ours[-1]["w"].dtype == dtype


def test_complex_leaves_use_the_modulus():
    with enable_x64(True):
        params, grads = _problem(np.float64, complex_leaf=True)
        ours, _ = _run(stable_spam(1e-2, **SETTING), params, grads)
        _assert_close(ours, ref_stable_spam(params, grads, 1e-2, **SETTING), 1e-12)


@pytest.mark.parametrize("changes", [dict(total_steps=None), dict(reset_interval=0),
                                     dict(reset_interval=1), dict(total_steps=10)])
def test_switches_match_the_algorithm(changes):
    # total_steps=10 < 30 steps: the code's cosine turns back up after total_steps + 1.
    with enable_x64(True):
        setting = {**SETTING, **changes}
        params, grads = _problem(np.float64)
        ours, _ = _run(stable_spam(1e-2, **setting), params, grads)
        _assert_close(ours, ref_stable_spam(params, grads, 1e-2, **setting), 1e-12)


def test_jit_and_eager_agree():
    params, grads = _problem(np.float32, steps=12)
    jitted, _ = _run(stable_spam(1e-2, **SETTING), params, grads)
    eager, _ = _run(stable_spam(1e-2, **SETTING), params, grads, jit=False)
    for a, b in zip(jitted, eager):
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-7)


def test_adagn_brings_a_spike_back_to_the_running_norm():
    # With b1 = 0 the first moment is the clipped and normalised gradient g' itself, whose
    # norm is m_hat / (sqrt(v_hat) + eps) (AdaGN, paper eq. 5-7); a 1000x spike (every
    # entry) leaves it within a few times the norms before it.
    tx = scale_by_stable_spam(b1=0.0, reset_interval=0)
    rng = np.random.default_rng(4)
    state, norms = tx.init(jnp.zeros(16)), []
    for k in range(12):
        g = jnp.asarray(rng.standard_normal(16), jnp.float32) * (1000.0 if k == 10 else 1.0)
        _, state = tx.update(g, state)
        t = k + 1
        m_hat = float(state.norm_mean) / (1 - 0.7 ** t)
        v_hat = float(state.norm_sq_mean) / (1 - 0.9 ** t)
        np.testing.assert_allclose(float(jnp.linalg.norm(state.mu)),
                                   m_hat / (math.sqrt(v_hat) + 1e-8), rtol=1e-5)
        norms.append(float(jnp.linalg.norm(state.mu)))
    assert norms[10] < 3 * max(norms[:10]), norms


def test_adaclip_bounds_entries_by_the_running_max():
    # AdaClip: after the spike no entry of the normalised gradient's direction exceeds the
    # bias-corrected moving max (checked through the clipped gradient's shape: a spike on
    # one entry is cut to the running max, the others kept).
    tx = scale_by_stable_spam(b1=0.0, reset_interval=0)
    state = tx.init(jnp.zeros(4))
    g = jnp.asarray([1.0, -0.5, 0.25, 0.5])
    for _ in range(5):
        _, state = tx.update(g, state)
    spike = g.at[0].set(1000.0)
    max_ema = 0.999 * float(state.max_ema) + 0.001 * 1000.0
    bound = max_ema / (1 - 0.999 ** 6)
    _, after = tx.update(spike, state)
    direction = np.asarray(after.mu) / np.linalg.norm(np.asarray(after.mu))
    clipped = np.asarray(spike).copy()
    clipped[0] = 1000.0 / 1000.0 * bound
    np.testing.assert_allclose(direction, clipped / np.linalg.norm(clipped), rtol=1e-4)


def test_a_reset_zeroes_the_moments():
    tx = scale_by_stable_spam(b1=0.9, b2=0.999, reset_interval=4)
    rng = np.random.default_rng(5)
    state = tx.init(jnp.zeros(3))
    for _ in range(3):
        _, state = tx.update(jnp.asarray(rng.standard_normal(3), jnp.float32), state)
    _, after = tx.update(jnp.asarray(rng.standard_normal(3), jnp.float32), state)  # k = 4
    # mu = (1 - b1) g' and nu = (1 - b2) |g'|**2 for the same g': nothing of the old moments
    np.testing.assert_allclose((np.asarray(after.mu) / 0.1) ** 2 * 0.001, after.nu, rtol=1e-5)
    assert float(after.max_ema) > 0 and float(after.norm_mean) > 0  # statistics kept


def test_inject_hyperparams_matches_and_keeps_the_ints_static():
    params, grads = _problem(np.float32, steps=12)
    injected = functrain.inject_hyperparams(stable_spam)(learning_rate=1e-2, **SETTING)
    state = injected.init(params)
    assert {"learning_rate", "gamma1", "theta", "eta_min"} <= set(state.hyperparams)
    assert not {"reset_interval", "total_steps"} & set(state.hyperparams)
    ours, _ = _run(injected, params, grads)
    plain, _ = _run(stable_spam(1e-2, **SETTING), params, grads)
    for a, b in zip(ours, plain):  # float32 hyperparameters: products such as gamma1 * s round
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-7)


def test_defaults_are_the_authors():
    sig = inspect.signature(stable_spam).parameters
    assert {k: sig[k].default for k in ("learning_rate", "b1", "b2", "eps", "weight_decay",
                                        "gamma1", "gamma2", "theta", "total_steps",
                                        "eta_min", "reset_interval")} == dict(
        learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, gamma1=0.7,
        gamma2=0.9, theta=0.999, total_steps=None, eta_min=0.5, reset_interval=1000)


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(theta=1.0), ValueError, r"scale_by_stable_spam: theta must be in \[0.0, 1.0\)"),
    (dict(gamma1=-0.1), ValueError, "scale_by_stable_spam: gamma1 must be in"),
    (dict(eta_min=1.5), ValueError, r"scale_by_stable_spam: eta_min must be in \[0.0, 1.0\]"),
    (dict(total_steps=0), ValueError, "total_steps must be > 0"),
    (dict(total_steps=100.0), TypeError, "stable_spam: total_steps must be an int"),
    (dict(reset_interval=-1), ValueError, "scale_by_stable_spam: reset_interval must be >= 0"),
    (dict(reset_interval="1000"), TypeError, "stable_spam: reset_interval must be an int"),
    (dict(eps=-1e-8), ValueError, "scale_by_stable_spam: eps must be >= 0"),
])
def test_bad_hyperparameters_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        stable_spam(1e-3, **kwargs)


def test_4bit_state_quantizes_the_moments_and_keeps_the_statistics():
    params = {"w": jnp.ones((32, 16)), "b": jnp.ones(4)}
    opt = functrain.quantized_state(stable_spam(1e-2, reset_interval=3), bits=4, min_size=64)
    state = opt.init(params)
    assert state[0].mu["w"].code.startswith("dynamic4_signed")
    assert state[0].nu["w"].code.startswith("linear4_unsigned")
    assert state[0].max_ema["w"].dtype == jnp.float32 and state[0].max_ema["w"].shape == ()
    step = jax.jit(opt.update)
    for k in range(5):
        g = jax.tree_util.tree_map(lambda x: jnp.full_like(x, (-1.0) ** k), params)
        u, state = step(g, state, params)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(u))
    assert float(state[0].norm_mean["w"]) > 0
