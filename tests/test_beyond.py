"""What functrain does beyond optax: low precision, zero norms, saturation, caps, dtypes."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft

ALL = {
    "sgd": lambda: ft.sgd(1e-3, momentum=0.9),
    "adam": lambda: ft.adam(1e-3),
    "adamw": lambda: ft.adamw(1e-3),
    "lamb": lambda: ft.lamb(1e-3),
    "lars": lambda: ft.lars(1e-3),
    "rmsprop": lambda: ft.rmsprop(1e-3, centered=True),
    "adagrad": lambda: ft.adagrad(1e-3),
    "lion": lambda: ft.lion(1e-3),
    "clip_lamb": lambda: ft.chain(ft.clip_by_global_norm(0.0), ft.lamb(1e-3)),
}


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("name", sorted(ALL))
def test_low_precision_zero_gradients_give_finite_updates(name, dtype):
    params = {"w": jnp.ones((3, 2), dtype), "z": jnp.zeros(4, dtype)}
    opt = ALL[name]()
    state = opt.init(params)
    grads = jax.tree_util.tree_map(jnp.zeros_like, params)
    for _ in range(3):
        updates, state = jax.jit(opt.update)(grads, state, params)
        for u in jax.tree_util.tree_leaves(updates):
            assert u.dtype == dtype
            assert bool(jnp.all(jnp.isfinite(u)))
        params = ft.apply_updates(params, updates)
        assert all(p.dtype == dtype for p in jax.tree_util.tree_leaves(params))


def test_optax_adam_float16_zero_gradients_is_nan_and_ours_is_zero():
    """The case the feature exists for: optax's eps underflows in float16."""
    params = jnp.ones(3, jnp.float16)
    grads = jnp.zeros(3, jnp.float16)
    theirs = optax.adam(1e-3)
    u_theirs, _ = theirs.update(grads, theirs.init(params))
    assert bool(jnp.all(jnp.isnan(u_theirs)))
    ours = ft.adam(1e-3)
    u_ours, _ = ours.update(grads, ours.init(params))
    np.testing.assert_array_equal(u_ours, np.zeros(3, np.float16))


def test_clip_by_global_norm_zero_max_norm_zero_grads():
    tx = ft.clip_by_global_norm(0.0)
    grads = {"a": jnp.zeros(3), "b": jnp.zeros(())}
    updates, _ = tx.update(grads, tx.init(grads))
    for u in jax.tree_util.tree_leaves(updates):
        np.testing.assert_array_equal(u, 0.0)


def test_clip_by_global_norm_zero_max_norm_nonzero_grads_gives_zeros():
    tx = ft.clip_by_global_norm(0.0)
    updates, _ = tx.update([jnp.array([3.0, 4.0])], tx.init([jnp.zeros(2)]))
    np.testing.assert_array_equal(updates[0], [0.0, 0.0])


@pytest.mark.parametrize("make", [lambda: ft.lamb(0.1), lambda: ft.lars(0.1),
                                  lambda: ft.scale_by_trust_ratio()])
def test_trust_ratio_with_zero_params_or_zero_updates_is_one(make):
    opt = make()
    params = {"zero_p": jnp.zeros(3), "zero_g": jnp.ones(3)}
    grads = {"zero_p": jnp.array([1.0, -2.0, 0.5]), "zero_g": jnp.zeros(3)}
    updates, _ = opt.update(grads, opt.init(params), params)
    leaves = jax.tree_util.tree_leaves(updates)
    assert all(bool(jnp.all(jnp.isfinite(u))) for u in leaves)
    # Ratio 1: the update of the zero-param leaf is the un-adapted one.
    plain = ft.scale_by_trust_ratio().update(grads, (), params)[0]
    np.testing.assert_allclose(plain["zero_p"], grads["zero_p"])
    np.testing.assert_array_equal(updates["zero_g"], 0.0)


def test_step_counter_saturates_instead_of_wrapping():
    opt = ft.adam(1e-3)
    params = jnp.ones(2)
    state = opt.init(params)
    top = jnp.iinfo(jnp.int32).max
    adam_state = state[0]._replace(count=jnp.asarray(top - 1, jnp.int32))
    state = (adam_state,) + state[1:]
    for _ in range(3):
        updates, state = opt.update(jnp.ones(2), state)
        assert int(state[0].count) == top
        assert bool(jnp.all(jnp.isfinite(updates)))


def test_schedule_counter_saturates():
    tx = ft.scale_by_schedule(lambda c: c.astype(jnp.float32))
    state = ft.ScaleByScheduleState(count=jnp.asarray(jnp.iinfo(jnp.int32).max, jnp.int32))
    _, state = tx.update([jnp.ones(1)], state)
    assert int(state.count) == jnp.iinfo(jnp.int32).max


@pytest.mark.parametrize("make", [
    lambda **k: ft.adam(1e-2, **k), lambda **k: ft.adamw(1e-2, **k),
    lambda **k: ft.lamb(1e-2, **k)])
def test_nu_dtype_stores_bf16_second_moment_and_stays_close(make):
    params = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)}
    grads = [jax.tree_util.tree_map(lambda p: jnp.sin(p * (k + 1)), params) for k in range(20)]

    def run(opt):
        state, p = opt.init(params), params
        for g in grads:
            u, state = opt.update(g, state, p)
            p = ft.apply_updates(p, u)
        return p, state

    low, state = run(make(mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16))
    full, _ = run(make())
    assert state[0].mu["w"].dtype == jnp.bfloat16
    assert state[0].nu["w"].dtype == jnp.bfloat16
    assert low["w"].dtype == jnp.float32
    np.testing.assert_allclose(low["w"], full["w"], rtol=0, atol=5e-3)


def test_bf16_moments_lose_precision_only_in_storage():
    """With bf16 mu, functrain's trajectory is closer to float32 Adam than optax's."""
    rng = np.random.default_rng(0)
    params = jnp.asarray(rng.standard_normal(256), jnp.float32)
    grads = jnp.asarray(rng.standard_normal((50, 256)) * 10.0 ** rng.uniform(-3, 3, (50, 256)),
                        jnp.float32)

    def run(opt, apply):
        @jax.jit
        def go(p):
            def step(c, g):
                p, s = c
                u, s = opt.update(g, s, p)
                return (apply(p, u), s), None
            return jax.lax.scan(step, (p, opt.init(p)), grads)[0][0]
        return np.asarray(go(params))

    exact = run(ft.adam(1e-2), ft.apply_updates)
    ours = run(ft.adam(1e-2, mu_dtype=jnp.bfloat16), ft.apply_updates)
    theirs = run(optax.adam(1e-2, mu_dtype=jnp.bfloat16), optax.apply_updates)
    assert np.abs(ours - exact).max() < np.abs(theirs - exact).max()


def test_updates_keep_gradient_dtype_with_bf16_params_and_f32_grads():
    params = {"w": jnp.ones(4, jnp.bfloat16)}
    grads = {"w": jnp.full(4, 0.5, jnp.float32)}
    opt = ft.lamb(1e-2)
    updates, state = opt.update(grads, opt.init(params), params)
    assert updates["w"].dtype == jnp.float32
    assert ft.apply_updates(params, updates)["w"].dtype == jnp.bfloat16
