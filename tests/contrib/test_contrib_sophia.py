"""functrain.contrib.sophia and hutchinson_estimator_diag_hessian against optax.contrib.

Sophia takes the objective as ``obj_fn=`` (the Hessian estimate's input); the random
Rademacher vectors follow optax's key handling, so trajectories agree step by step.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest

import functrain
from functrain.contrib import HutchinsonState, SophiaState, hutchinson_estimator_diag_hessian
from functrain.contrib import sophia
from helpers import make_params, matrices_only


def objective(p):
    return sum(jnp.sum(jnp.cos(x) * x ** 2 + 0.1 * x ** 4) for x in jax.tree_util.tree_leaves(p))


def trajectory(opt, apply, steps=30, params=None, **extra):
    params = make_params() if params is None else params

    @jax.jit
    def step(p, s):
        u, s = opt.update(jax.grad(objective)(p), s, p, obj_fn=objective, **extra)
        return apply(p, u), s

    state, out = opt.init(params), []
    for _ in range(steps):
        params, state = step(params, state)
        out.append(params)
    return out, state


def assert_same(a, b, rtol=2e-5, atol=1e-6, moved=True):
    for pa, pb in zip(a, b):
        for x, y in zip(jax.tree_util.tree_leaves(pa), jax.tree_util.tree_leaves(pb)):
            np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)
            assert np.all(np.isfinite(np.asarray(x)))
    first, last = jax.tree_util.tree_leaves(a[0]), jax.tree_util.tree_leaves(a[-1])
    assert not moved or any(np.any(np.asarray(x) != np.asarray(y)) for x, y in zip(first, last))


@pytest.mark.parametrize("kwargs", [
    dict(learning_rate=1e-2),
    dict(learning_rate=3e-2, b1=0.9, b2=0.95, gamma=0.05, update_interval=2,
         weight_decay=1e-2, weight_decay_mask=matrices_only),
    dict(learning_rate=optax.linear_schedule(1e-2, 1e-3, 30), clip_threshold=None, eps=1.0,
         update_interval=1),
    dict(learning_rate=1e-2, clip_threshold=0.3, hessian_diagonal_fn=None),  # seed 5 below
])
def test_matches_optax_contrib(kwargs):
    ours_kwargs, theirs_kwargs = dict(kwargs), dict(kwargs)
    if "hessian_diagonal_fn" in kwargs:
        key = jax.random.PRNGKey(5)
        ours_kwargs["hessian_diagonal_fn"] = hutchinson_estimator_diag_hessian(key)
        theirs_kwargs["hessian_diagonal_fn"] = (
            optax.contrib.hutchinson_estimator_diag_hessian(key))
    a, state = trajectory(sophia(**ours_kwargs), functrain.apply_updates)
    b, _ = trajectory(optax.contrib.sophia(**theirs_kwargs), optax.apply_updates)
    assert_same(a, b)
    assert isinstance(state[0], SophiaState) and int(state[0].count) == 30


def test_mu_dtype():
    # The momentum is stored in bfloat16. optax multiplies b1 * mu in bfloat16, functrain
    # in float32 (then stores bfloat16), so they agree to bfloat16's precision only.
    # Without clipping and with eps=1 no sign flip of a tiny momentum is amplified.
    kwargs = dict(learning_rate=1e-2, mu_dtype=jnp.bfloat16, clip_threshold=None, eps=1.0)
    a, state = trajectory(sophia(**kwargs), functrain.apply_updates)
    b, _ = trajectory(optax.contrib.sophia(**kwargs), optax.apply_updates)
    assert_same(a[:1], b[:1], rtol=0, atol=0, moved=False)  # the first step is exact (b1 * 0 rounds the same)
    assert_same(a, b, rtol=5e-3, atol=1e-3)  # bfloat16 rounding (2**-8), accumulated
    assert all(m.dtype == jnp.bfloat16 for m in jax.tree_util.tree_leaves(state[0].mu))
    assert all(n.dtype == jnp.float32 for n in jax.tree_util.tree_leaves(state[0].nu))


def test_custom_hessian_fn_receives_extra_keywords():
    # A user-written estimate (a plain transformation) that needs its own keyword.
    def update(updates, state, params=None, *, curvature, **extra):
        return jax.tree_util.tree_map(lambda g: curvature * jnp.ones_like(g), updates), state

    fn = optax.GradientTransformationExtraArgs(lambda p: optax.EmptyState(), update)
    ours = sophia(0.05, hessian_diagonal_fn=fn, update_interval=3)
    theirs = optax.contrib.sophia(0.05, hessian_diagonal_fn=fn, update_interval=3)
    a, _ = trajectory(ours, functrain.apply_updates, curvature=20.0)
    b, _ = trajectory(theirs, optax.apply_updates, curvature=20.0)
    assert_same(a, b)


def test_hutchinson_matches_optax_and_is_exact_for_a_diagonal_hessian():
    params = make_params()
    ours, theirs = hutchinson_estimator_diag_hessian(), optax.contrib.hutchinson_estimator_diag_hessian()
    s1, s2 = ours.init(params), theirs.init(params)
    for _ in range(3):
        h1, s1 = ours.update(params, s1, params, obj_fn=objective)
        h2, s2 = theirs.update(params, s2, params, obj_fn=objective)
        for x, y in zip(jax.tree_util.tree_leaves(h1), jax.tree_util.tree_leaves(h2)):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    assert isinstance(s1, HutchinsonState)
    np.testing.assert_array_equal(jax.random.key_data(s1.key) if s1.key.dtype != jnp.uint32
                                  else s1.key, s2.key)
    # The objective is separable, so its Hessian is diagonal and z * (H z) = diag(H).
    diag = jax.tree_util.tree_map(
        lambda x: jax.vmap(jax.grad(jax.grad(lambda t: jnp.cos(t) * t ** 2 + 0.1 * t ** 4)))(
            x.ravel()).reshape(x.shape), params)
    for x, y in zip(jax.tree_util.tree_leaves(h1), jax.tree_util.tree_leaves(diag)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_first_step_by_hand():
    # h = 0 before the first estimate: mu_hat / max(0, eps) is clipped to +-clip_threshold.
    opt = sophia(0.1, weight_decay=0.0, clip_threshold=0.5)
    x = jnp.array([1.0, -2.0, 1e-12])
    g = jnp.array([0.2, -0.3, 1e-12])
    u, state = opt.update(g, opt.init(x), x, obj_fn=lambda p: jnp.sum(p ** 2))
    want = -0.1 * np.clip(np.asarray(g) / 1e-8, -0.5, 0.5)
    np.testing.assert_allclose(u, want, rtol=1e-5)
    # The estimate of the Hessian of sum(p^2) is exactly 2: nu = (1 - b2) * 2.
    np.testing.assert_allclose(state[0].nu, 0.01 * 2 * np.ones(3), rtol=1e-6)


def test_state_from_shapes_alone():
    params = make_params()
    abstract = jax.tree_util.tree_map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
    opt = sophia(1e-2)
    assert (jax.tree_util.tree_structure(jax.eval_shape(opt.init, abstract))
            == jax.tree_util.tree_structure(opt.init(params)))


def test_errors():
    params = {"w": jnp.ones(3)}
    opt = sophia(1e-2)
    state = opt.init(params)
    with pytest.raises(ValueError, match="obj_fn"):
        opt.update(params, state, params)
    with pytest.raises(ValueError, match="parameters"):
        opt.update(params, state, obj_fn=objective)
    with pytest.raises(ValueError, match=r"\['w'\]"):
        opt.update({"w": jnp.ones(4)}, state, {"w": jnp.ones(4)}, obj_fn=objective)
    with pytest.raises(ValueError, match="sophia: b1"):
        sophia(1e-2, b1=1.0)
    with pytest.raises(ValueError, match="update_interval"):
        sophia(1e-2, update_interval=0)
    with pytest.raises(ValueError, match="print_win_rate_every_n_steps"):
        sophia(1e-2, verbose=True)
    with pytest.raises(TypeError, match="hessian_diagonal_fn"):
        sophia(1e-2, hessian_diagonal_fn=3)
    with pytest.raises(TypeError, match=r"\['i'\]"):
        opt.init({"i": jnp.zeros(2, jnp.int32)})
    hutch = hutchinson_estimator_diag_hessian()
    with pytest.raises(TypeError, match="obj_fn must be a function"):
        hutch.update(params, hutch.init(params), params, obj_fn=1.0)
