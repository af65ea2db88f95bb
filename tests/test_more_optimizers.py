"""The issue-4 optimizers against optax (50 jitted steps, every step) and by hand.

Also, for every optimizer of the library (old and new): unknown ``update``
keywords are ignored, ``inject_hyperparams`` wraps it with the same numbers,
and float64 params stay float64 (with the numbers of a float64 computation).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from conftest import make_grads  # noqa: F401  (also used by test_wrappers)

STEPS = 50
# Test-only: XLA's cheapest CPU codegen halves compile time; numerics are unchanged.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def make_params(scalar=True):
    """A zero-valued leaf, a scalar leaf, nested containers, mixed shapes."""
    rng = np.random.default_rng(0)
    params = {"dense": {"w": jnp.asarray(rng.standard_normal((4, 3)), jnp.float32),
                        "b": jnp.zeros((3,), jnp.float32)},
              "layers": [jnp.asarray(rng.uniform(1, 2, (2, 2, 2)), jnp.float32)]}
    if scalar:
        params["scalar"] = jnp.asarray(0.7, jnp.float32)
    return params


def loss_value(params):
    """A loss value for the optimizers that take one (Polyak)."""
    return 0.5 * sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(params))


def trajectory(opt, apply_updates, params, grads, with_value=False):
    """Params after each of ``STEPS`` steps of one jitted step function."""

    @jax.jit(compiler_options=FAST_COMPILE)
    def step(p, s, g):
        extra = {"value": loss_value(p)} if with_value else {}
        u, s = opt.update(g, s, p, **extra)
        return apply_updates(p, u), s

    state, out = opt.init(params), []
    for t in range(STEPS):
        params, state = step(params, state, jax.tree_util.tree_map(lambda x: x[t], grads))
        out.append(params)
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *out)


def assert_same_trajectories(name, ours, theirs, params):
    """Every step equal to optax's (rtol 2e-5), and the params really moved."""
    moved = False
    for (path, x), y, p0 in zip(jax.tree_util.tree_flatten_with_path(ours)[0],
                                jax.tree_util.tree_leaves(theirs),
                                jax.tree_util.tree_leaves(params)):
        assert x.dtype == y.dtype
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=1e-6,
                                   err_msg=f"{name} {jax.tree_util.keystr(path)}")
        moved |= bool(np.any(np.asarray(x[-1]) != np.asarray(p0)))
    assert moved, f"{name} never moved the params: the comparison would be vacuous"


def mask_fn(params):
    return jax.tree_util.tree_map(lambda p: p.ndim > 1, params)


# (name) -> (constructor of a module m, whether the scalar leaf is in the tree, value kw)
CASES = {
    "adafactor": (lambda m: m.adafactor(), True, False),
    "adafactor_factored": (lambda m: m.adafactor(1e-2, min_dim_size_to_factor=2, momentum=0.9,
                                                  weight_decay_rate=1e-3, decay_offset=3,
                                                  clipping_threshold=None), True, False),
    "adafactor_unfactored": (lambda m: m.adafactor(
        lambda c: 1e-2 / (1.0 + c), factored=False, multiply_by_parameter_scale=False,
        decay_rate=0.5, eps=1e-20, weight_decay_rate=1e-2, weight_decay_mask=mask_fn),
        True, False),
    "nadam": (lambda m: m.nadam(1e-2, b2=0.99, eps_root=1e-8), True, False),
    "nadamw": (lambda m: m.nadamw(1e-2, b1=0.8, weight_decay=0.1, mask=mask_fn), True, False),
    "adabelief": (lambda m: m.adabelief(1e-2, b1=0.8, eps=1e-10), True, False),
    "adabelief_nesterov": (lambda m: m.adabelief(1e-2, nesterov=True), True, False),
    "adamax": (lambda m: m.adamax(1e-2, b1=0.8, eps=1e-6), True, False),
    "adamaxw": (lambda m: m.adamaxw(1e-2, b2=0.99, weight_decay=lambda c: 1e-2 * c,
                                    mask=mask_fn), True, False),
    "novograd": (lambda m: m.novograd(1e-2, b1=0.8, b2=0.5, eps=1e-4, eps_root=1e-8,
                                      weight_decay=0.01), True, False),
    "radam": (lambda m: m.radam(1e-2), True, False),
    "radam_nesterov": (lambda m: m.radam(1e-2, b2=0.99, threshold=4.0, eps_root=1e-8,
                                         nesterov=True), True, False),
    "sm3": (lambda m: m.sm3(0.1, momentum=0.5), False, False),
    "sign_sgd": (lambda m: m.sign_sgd(1e-3), True, False),
    "signum": (lambda m: m.signum(1e-3, beta=0.8), True, False),
    "amsgrad": (lambda m: m.amsgrad(1e-2, b1=0.8, eps_root=1e-8, bias_correction_nu=False),
                True, False),
    "yogi": (lambda m: m.yogi(1e-2, b1=0.8, b2=0.99, eps=1e-4), True, False),
    "fromage": (lambda m: m.fromage(1e-2), True, False),
    "fromage_schedule": (lambda m: m.fromage(lambda c: 1e-2 / (1.0 + c)), True, False),
    "noisy_sgd": (lambda m: m.noisy_sgd(1e-3, eta=0.1, gamma=0.3, key=jax.random.key(3)),
                  True, False),
    "adadelta": (lambda m: m.adadelta(), True, False),
    "adadelta_decay": (lambda m: m.adadelta(1.0, rho=0.8, eps=1e-4, weight_decay=0.01,
                                            weight_decay_mask=mask_fn), True, False),
    "rprop": (lambda m: m.rprop(1e-2, eta_minus=0.3, eta_plus=1.5, min_step_size=1e-4,
                                max_step_size=0.05), True, False),
    "polyak_sgd": (lambda m: m.polyak_sgd(), True, True),
    "polyak_sgd_plus": (lambda m: m.polyak_sgd(max_learning_rate=0.1, scaling=0.5,
                                               f_min=-1.0, eps=1e-3, variant="sps+"),
                        True, True),
    "optimistic_gradient_descent": (lambda m: m.optimistic_gradient_descent(
        1e-2, alpha=0.5, beta=2.0), True, False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_optax_every_step(name):
    make, scalar, with_value = CASES[name]
    params = make_params(scalar)
    grads = make_grads(params)
    ours = trajectory(make(ft), ft.apply_updates, params, grads, with_value)
    theirs = trajectory(make(optax), optax.apply_updates, params, grads, with_value)
    assert_same_trajectories(name, ours, theirs, params)


# --------------------------------------------------------------------------
# Hand-derived references (independent of optax)
# --------------------------------------------------------------------------

def test_adafactor_factored_by_hand():
    g = jnp.array([[1., 2., 3.], [4., 5., 6.]])
    opt = ft.scale_by_factored_rms(min_dim_size_to_factor=2, decay_rate=0.8, epsilon=0.0)
    u, state = opt.update([g], opt.init([jnp.zeros((2, 3))]))
    # Step 0: decay 1 - 1**-0.8 = 0, so the averages are this step's g**2 means.
    row = np.mean(np.asarray(g) ** 2, axis=1)      # largest axis (1) removed
    col = np.mean(np.asarray(g) ** 2, axis=0)
    expected = np.asarray(g) / np.sqrt(np.outer(row / row.mean(), col))
    np.testing.assert_allclose(u[0], expected, rtol=1e-6)
    assert state.v_row[0].shape == (2,) and state.v_col[0].shape == (3,)
    assert state.v[0].shape == (1,)


def test_sm3_by_hand_with_scalar_leaf():
    # Beyond optax (which fails on scalars): a scalar leaf keeps a full accumulator.
    opt = ft.sm3(1.0, momentum=0.0)
    params = {"s": jnp.array(1.0), "m": jnp.zeros((2, 2))}
    state = opt.init(params)
    g1 = {"s": jnp.array(2.0), "m": jnp.array([[1., 2.], [3., 4.]])}
    u, state = opt.update(g1, state, params)
    np.testing.assert_allclose(u["s"], -1.0, rtol=1e-6)
    np.testing.assert_allclose(u["m"], -np.ones((2, 2)), rtol=1e-6)
    g2 = {"s": jnp.array(1.0), "m": jnp.ones((2, 2))}
    u, state = opt.update(g2, state, params)
    np.testing.assert_allclose(u["s"], -1.0 / np.sqrt(5.0), rtol=1e-6)
    # Row maxima of g1**2: [4, 16]; column maxima: [9, 16]; cover = min(row_i, col_j).
    cover = np.minimum(np.array([[4.], [16.]]), np.array([[9., 16.]]))
    np.testing.assert_allclose(u["m"], -1.0 / np.sqrt(cover + 1.0), rtol=1e-6)


def test_novograd_by_hand():
    opt = ft.novograd(0.1, b1=0.5, b2=0.5, eps=0.0, weight_decay=0.1)
    p = [jnp.array([1., 1.])]
    state = opt.init(p)
    u1, state = opt.update([jnp.array([3., 4.])], state, p)
    m1 = np.array([3., 4.]) / 5.0 + 0.1
    np.testing.assert_allclose(u1[0], -0.1 * m1, rtol=1e-6)
    u2, state = opt.update([jnp.array([0., 1.])], state, p)
    nu2 = 0.5 * 25.0 + 0.5 * 1.0
    m2 = 0.5 * m1 + np.array([0., 1.]) / np.sqrt(nu2) + 0.1
    np.testing.assert_allclose(u2[0], -0.1 * m2, rtol=1e-6)
    assert state[0].nu[0].shape == ()


def test_polyak_needs_value():
    opt = ft.polyak_sgd()
    with pytest.raises(ValueError, match="value="):
        opt.update([jnp.ones(1)], opt.init([jnp.ones(1)]), [jnp.ones(1)])


def test_scale_by_radam_before_and_after_rectification():
    tx = ft.scale_by_radam(b1=0.0, b2=0.5, eps=0.0, threshold=2.5)
    state = tx.init([jnp.zeros(1)])
    # rho_inf = 3; rho_1 = 3 - 2*0.5/0.5 = 1 < 2.5: the first moment alone.
    u, state = tx.update([jnp.array([2.])], state)
    np.testing.assert_allclose(u[0], [2.0])
    # rho_2 = 3 - 4*0.25/0.75 = 5/3 < 2.5 still; rho_3 = 3 - 6*0.125/0.875 = 15/7 < 2.5;
    # rho_4 = 3 - 8/15 = 37/15 < 2.5; rho_5 = 3 - 10/31 = 83/31 > 2.5: rectified Adam.
    for _ in range(3):
        u, state = tx.update([jnp.array([2.])], state)
        np.testing.assert_allclose(u[0], [2.0])
    u, state = tx.update([jnp.array([2.])], state)
    rho, rho_inf = 83 / 31, 3.0
    r = np.sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho))
    np.testing.assert_allclose(u[0], [r * 2.0 / 2.0], rtol=1e-5)


def test_shape_check_still_applies_to_params_shaped_fields():
    opt = ft.novograd(0.1)
    state = opt.init([jnp.zeros(3)])
    with pytest.raises(ValueError, match=r"\(3,\)"):
        opt.update([jnp.zeros(4)], state, [jnp.zeros(4)])


# --------------------------------------------------------------------------
# Every optimizer of the library: extra args, inject_hyperparams, float64
# --------------------------------------------------------------------------

ALL_OPTIMIZERS = {
    # Issue 2 (core).
    "sgd": (ft.sgd, dict(learning_rate=0.1, momentum=0.9)),
    "adam": (ft.adam, dict(learning_rate=0.1)),
    "adamw": (ft.adamw, dict(learning_rate=0.1, weight_decay=0.01)),
    "lamb": (ft.lamb, dict(learning_rate=0.1, weight_decay=0.01)),
    "lars": (ft.lars, dict(learning_rate=0.1, weight_decay=0.01)),
    "rmsprop": (ft.rmsprop, dict(learning_rate=0.1, momentum=0.5, centered=True)),
    "adagrad": (ft.adagrad, dict(learning_rate=0.1)),
    "lion": (ft.lion, dict(learning_rate=0.1)),
    # Issue 4.
    "adafactor": (ft.adafactor, dict(learning_rate=0.1, min_dim_size_to_factor=2,
                                     momentum=0.5, weight_decay_rate=0.01)),
    "nadam": (ft.nadam, dict(learning_rate=0.1)),
    "nadamw": (ft.nadamw, dict(learning_rate=0.1, weight_decay=0.01)),
    "adabelief": (ft.adabelief, dict(learning_rate=0.1)),
    "adamax": (ft.adamax, dict(learning_rate=0.1)),
    "adamaxw": (ft.adamaxw, dict(learning_rate=0.1, weight_decay=0.01)),
    "novograd": (ft.novograd, dict(learning_rate=0.1, weight_decay=0.01)),
    "radam": (ft.radam, dict(learning_rate=0.1, b2=0.9)),
    "sm3": (ft.sm3, dict(learning_rate=0.1)),
    "sign_sgd": (ft.sign_sgd, dict(learning_rate=0.1)),
    "signum": (ft.signum, dict(learning_rate=0.1)),
    "amsgrad": (ft.amsgrad, dict(learning_rate=0.1)),
    "yogi": (ft.yogi, dict(learning_rate=0.1)),
    "fromage": (ft.fromage, dict(learning_rate=0.1)),
    "noisy_sgd": (ft.noisy_sgd, dict(learning_rate=0.1, key=0)),
    "adadelta": (ft.adadelta, dict(learning_rate=1.0, weight_decay=0.01)),
    "rprop": (ft.rprop, dict(learning_rate=0.1)),
    "polyak_sgd": (ft.polyak_sgd, dict(max_learning_rate=0.5)),
    "optimistic_gradient_descent": (ft.optimistic_gradient_descent,
                                    dict(learning_rate=0.1)),
}


def small_tree(dtype=jnp.float32, scalar=True):
    tree = {"w": jnp.arange(6, dtype=dtype).reshape(2, 3) / 7 - 0.3, "b": jnp.zeros(3, dtype)}
    if scalar:
        tree["s"] = jnp.asarray(0.5, dtype)
    return tree


def small_grads(dtype=jnp.float32, steps=3, scalar=True):
    rng = np.random.default_rng(2)
    return [jax.tree_util.tree_map(
        lambda p: jnp.asarray(rng.standard_normal(p.shape), dtype), small_tree(dtype, scalar))
        for _ in range(steps)]


def run_steps(opt, params, grads, **extra):
    """Eager steps (cheap once the primitives are compiled): [(params, updates)], state."""
    state, out = opt.init(params), []
    for g in grads:
        u, state = opt.update(g, state, params, value=loss_value(params), **extra)
        params = ft.apply_updates(params, u)
        out.append((params, u))
    return out, state


def test_all_optimizers_listed():
    exported = {n for n in ("sgd adam adamw lamb lars rmsprop adagrad lion adafactor nadam "
                            "nadamw adabelief adamax adamaxw novograd radam sm3 sign_sgd "
                            "signum amsgrad yogi fromage noisy_sgd adadelta rprop polyak_sgd "
                            "optimistic_gradient_descent").split() if hasattr(ft, n)}
    assert exported == set(ALL_OPTIMIZERS)


@pytest.mark.parametrize("name", sorted(ALL_OPTIMIZERS))
def test_extra_args_ignored_and_inject_hyperparams(name):
    factory, kwargs = ALL_OPTIMIZERS[name]
    params, grads = small_tree(), small_grads(steps=2)
    plain, _ = run_steps(factory(**kwargs), params, grads)
    noisy, _ = run_steps(factory(**kwargs), params, grads,
                         unknown_argument=jnp.ones(()), another="text")
    injected_opt = ft.inject_hyperparams(factory)(**kwargs)
    injected, state = run_steps(injected_opt, params, grads, unknown_argument=1.0)
    rate = "max_learning_rate" if name == "polyak_sgd" else "learning_rate"
    assert rate in state.hyperparams
    for (_, u1), (_, u2), (_, u3) in zip(plain, noisy, injected):
        for a, b, c in zip(*map(jax.tree_util.tree_leaves, (u1, u2, u3))):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_allclose(c, a, rtol=2e-5, atol=1e-6, err_msg=name)
    assert any(np.any(np.asarray(u) != 0) for u in jax.tree_util.tree_leaves(plain[-1][1]))
    # Under jit the hyperparameters are traced: every factory must accept that.
    # (Lowering traces the whole step; compiling would add nothing but time.)
    jax.jit(lambda p, s, g: injected_opt.update(g, s, p, value=loss_value(p))).lower(
        params, state, grads[0])


@pytest.mark.parametrize("name", sorted(ALL_OPTIMIZERS))
def test_float64_params_stay_float64(name):
    factory, kwargs = ALL_OPTIMIZERS[name]
    if name == "adafactor":  # its momentum is float32 unless told otherwise (as optax)
        kwargs = dict(kwargs, dtype_momentum=jnp.float64)
    with jax.enable_x64(True):
        scalar = name != "sm3"  # optax's sm3 fails on scalar leaves
        params = small_tree(jnp.float64, scalar)
        grads = small_grads(jnp.float64, steps=2, scalar=scalar)
        out, state = run_steps(factory(**kwargs), params, grads)
        for p, u in out:
            for x in jax.tree_util.tree_leaves((p, u)):
                assert x.dtype == jnp.float64, name
        for x in jax.tree_util.tree_leaves(state):
            if jnp.issubdtype(x.dtype, jnp.floating):
                assert x.dtype == jnp.float64, (name, x.dtype)
        # The arithmetic is float64 as well: optax under x64 agrees far below
        # float32 rounding (any float32 step in between would show at ~1e-7).
        theirs, _ = run_steps(getattr(optax, name)(**kwargs), params, grads)
        for (p1, _), (p2, _) in zip(out, theirs):
            for a, b in zip(jax.tree_util.tree_leaves(p1), jax.tree_util.tree_leaves(p2)):
                np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13, err_msg=name)
    assert not jax.config.jax_enable_x64
