"""functrain.wrappers.monitoring: snapshot, monitor, measure_with_ema against optax 0.2.8.

The same gradients go through functrain's and optax's chains; the params and
the recorded measurements are compared at every step (the measurements are
the state, so they are the point of these wrappers).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from helpers import (assert_empty_params_step, assert_same_trajectory, assert_state_donatable,
                     make_grads, make_params)

STEPS = 30
THRESHOLD = 1.0


def norm_of(m):
    return ft.tree.norm if m is ft else optax.tree.norm


def clipped(m):
    return lambda u: norm_of(m)(u) > THRESHOLD


def snapshot_chain(m):
    return m.chain(m.sgd(0.1, momentum=0.9), m.snapshot("before_clip", norm_of(m)),
                   m.clip_by_global_norm(THRESHOLD))


def monitor_chain(m):
    return m.chain(
        m.adam(0.3),
        m.monitor({"norm": norm_of(m),
                   "clipped_ema": m.measure_with_ema(clipped(m), decay=0.9),
                   "norm_ema_raw": m.measure_with_ema(norm_of(m), 0.5, debias=False)}),
        m.clip_by_global_norm(THRESHOLD))


def states_per_step(opt, steps=STEPS):
    """The states after each of ``steps`` jitted steps on make_params/make_grads."""
    params = make_params()
    grads = make_grads(params, steps)
    apply = ft.apply_updates

    @jax.jit
    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return apply(p, u), s

    state, out = opt.init(params), []
    for t in range(steps):
        params, state = step(params, state, jax.tree_util.tree_map(lambda x: x[t], grads))
        out.append(state)
    return out


def test_snapshot_matches_optax():
    assert_same_trajectory(snapshot_chain(ft), snapshot_chain(optax), steps=STEPS)
    ours, theirs = states_per_step(snapshot_chain(ft)), states_per_step(snapshot_chain(optax))
    values = []
    for a, b in zip(ours, theirs):
        assert type(a[1]).__name__ == "SnapshotState"
        np.testing.assert_allclose(a[1].measurement["before_clip"],
                                   b[1].measurement["before_clip"], rtol=2e-5)
        values.append(float(a[1].measurement["before_clip"]))
    assert max(values) > THRESHOLD  # measured before the clipping


def test_snapshot_init_measures_params_like_optax():
    params = make_params()
    a = ft.snapshot("n", ft.tree.norm).init(params)
    b = optax.snapshot("n", optax.tree.norm).init(params)
    np.testing.assert_allclose(a.measurement["n"], b.measurement["n"], rtol=1e-6)


def test_monitor_matches_optax():
    assert_same_trajectory(monitor_chain(ft), monitor_chain(optax), steps=STEPS)
    ours, theirs = states_per_step(monitor_chain(ft)), states_per_step(monitor_chain(optax))
    emas = []
    for a, b in zip(ours, theirs):
        assert set(a[1].measurements) == set(b[1].measurements)
        for name in b[1].measurements:
            np.testing.assert_allclose(a[1].measurements[name], b[1].measurements[name],
                                       rtol=2e-5, atol=1e-6, err_msg=name)
        for x, y in zip(jax.tree_util.tree_leaves(a[1].measure_states),
                        jax.tree_util.tree_leaves(b[1].measure_states)):
            np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6)
        emas.append(float(a[1].measurements["clipped_ema"]))
    assert any(0.0 < e < 1.0 for e in emas)  # an average of 0s and 1s, not a constant


@pytest.mark.parametrize("debias, accumulator_dtype", [(True, None), (False, None),
                                                       (True, jnp.bfloat16)])
def test_measure_with_ema_matches_optax(debias, accumulator_dtype):
    def make(m):
        return m.measure_with_ema(lambda u: jax.tree_util.tree_map(jnp.mean, u), 0.8,
                                  debias=debias, accumulator_dtype=accumulator_dtype)

    ours, theirs = make(ft), make(optax)
    params = make_params()
    grads = make_grads(params, 6)
    s1, s2 = ours.init(params), theirs.init(params)
    for t in range(6):
        g = jax.tree_util.tree_map(lambda x: x[t], grads)
        a, s1 = ours.update(g, s1, params)
        b, s2 = theirs.update(g, s2, params)
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            assert x.dtype == y.dtype
            np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32),
                                       rtol=2e-5, atol=1e-6)
    assert int(s1[1].count) == 6 and s1[1].ema["dense"]["w"].shape == ()
    for x, y in zip(jax.tree_util.tree_leaves(s1), jax.tree_util.tree_leaves(s2)):
        assert x.dtype == y.dtype
        np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32),
                                   rtol=2e-5, atol=1e-6)


def test_measure_with_ema_by_hand():
    tx = ft.measure_with_ema(lambda u: u[0], decay=0.5)
    state = tx.init([jnp.zeros(())])
    m, out = 0.0, []
    for t, x in enumerate([2.0, 4.0, 1.0], start=1):
        avg, state = tx.update([jnp.asarray(x)], state)
        m = 0.5 * m + 0.5 * x
        out.append((float(avg), m / (1 - 0.5 ** t)))
    np.testing.assert_allclose(*zip(*out), rtol=1e-6)


def test_monitor_state_is_stable_under_jit_and_scan():
    # optax's init holds no measurements, so its state changes structure at the
    # first step; here init already holds them (zeros), so one trace serves all.
    opt = monitor_chain(ft)
    params = make_params()
    state0 = opt.init(params)
    assert float(state0[1].measurements["norm"]) == 0.0
    grads = make_grads(params, 4)

    def body(carry, g):
        p, s = carry
        u, s = opt.update(g, s, p)
        return (ft.apply_updates(p, u), s), s[1].measurements["norm"]

    (_, state), norms = jax.jit(lambda p, s: jax.lax.scan(body, (p, s), grads))(params, state0)
    direct = [float(s[1].measurements["norm"]) for s in states_per_step(opt, 4)]
    np.testing.assert_allclose(norms, direct, rtol=1e-5)


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match="snapshot: measure_name must be a str"):
        ft.snapshot(3, ft.tree.norm)
    with pytest.raises(TypeError, match="snapshot: measure must be a function"):
        ft.snapshot("n", 3)
    with pytest.raises(TypeError, match="monitor: measures must be a dict"):
        ft.monitor([ft.tree.norm])
    with pytest.raises(TypeError, match="monitor: measure 'n' must be a function"):
        ft.monitor({"n": 1.0})
    with pytest.raises(ValueError, match=r"measure_with_ema: decay must be in \[0.0, 1.0\]"):
        ft.measure_with_ema(ft.tree.norm, 1.5)
    with pytest.raises(TypeError, match="measure_with_ema: decay must be a real number"):
        ft.measure_with_ema(ft.tree.norm, "0.9")


MAKERS = {
    "snapshot": lambda: ft.chain(ft.adam(0.1), ft.snapshot("n", ft.tree.norm)),
    "monitor": lambda: ft.chain(ft.monitor({
        "n": ft.tree.norm, "e": ft.measure_with_ema(ft.tree.norm, 0.9)}), ft.adam(0.1)),
}


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_empty_params_and_donatable_state(name):
    assert_empty_params_step(MAKERS[name]())
    assert_state_donatable(MAKERS[name]())
