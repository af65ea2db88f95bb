"""functrain.contrib's learning-rate-free optimizers (prodigy, dadapt_adamw, dog, dowg,
mechanize, cocob) against optax.contrib step by step, DoG and COCOB against their papers'
formulas in numpy, state from shapes alone, complex leaves, and named errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib  # noqa: F401
import pytest

import functrain as ft
from functrain.families.parameter_free.parameter_free import scale_by_dog
from helpers import (FORMULA_GRADS, FORMULA_P0, assert_same_trajectory, check_against_formula,
                     make_params, matrices_only, trajectory)

STEPS = 30


def _schedule(c):
    return 0.5 + 0.5 * jnp.cos(c / 10.0)


SETTINGS = {
    "prodigy lr, decay, d0": lambda lib: lib.contrib.prodigy(
        0.5, weight_decay=0.01, estim_lr0=1e-3),
    "prodigy safeguard, beta3, coef, schedule": lambda lib: lib.contrib.prodigy(
        _schedule, betas=(0.8, 0.99), beta3=0.9, eps=1e-6, estim_lr0=1e-3, estim_lr_coef=2.0,
        safeguard_warmup=True),
    "dadapt_adamw lr, decay, d0": lambda lib: lib.contrib.dadapt_adamw(
        0.5, weight_decay=0.01, estim_lr0=1e-3),
    "dadapt_adamw betas, schedule": lambda lib: lib.contrib.dadapt_adamw(
        _schedule, betas=(0.8, 0.99), eps=1e-6, estim_lr0=1e-2),
    "dog default": lambda lib: lib.contrib.dog(),
    "dog learning_rate step, masked decay": lambda lib: lib.contrib.dog(
        init_step=("learning_rate", 0.01), weight_decay=0.1, mask=matrices_only),
    "dog distance, schedule": lambda lib: lib.contrib.dog(
        _schedule, init_step=("distance", 0.1), eps=1e-6),
    "dowg default": lambda lib: lib.contrib.dowg(),
    "dowg init dist, masked decay": lambda lib: lib.contrib.dowg(
        0.5, init_estim_sq_dist=0.1, eps=1e-3, weight_decay=0.1, mask=matrices_only),
    "mechanize sgd": lambda lib: lib.contrib.mechanize(lib.sgd(1.0)),
    "mechanize adam, 3 betas, decay": lambda lib: lib.contrib.mechanize(
        lib.adam(1.0), weight_decay=0.1, eps=1e-6, s_init=1e-4, num_betas=3),
    "cocob default": lambda lib: lib.contrib.cocob(),
    "cocob alpha, masked decay, schedule": lambda lib: lib.contrib.cocob(
        _schedule, alpha=10.0, eps=1e-6, weight_decay=0.1, mask=matrices_only),
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_matches_optax_contrib(name):
    make = SETTINGS[name]
    assert_same_trajectory(make(ft), make(optax), steps=STEPS, name=name)


def test_mechanize_passes_extra_args_to_its_base_optimizer():
    make = lambda lib: lib.contrib.mechanize(lib.polyak_sgd(max_learning_rate=0.5))  # noqa: E731
    assert_same_trajectory(make(ft), make(optax), steps=20, with_value=True, name="polyak")


def _complex_tree():
    rng = np.random.default_rng(4)
    return {"w": jnp.asarray(rng.standard_normal((3, 2)) + 1j * rng.standard_normal((3, 2)),
                             jnp.complex64),
            "b": jnp.zeros(2, jnp.complex64), "r": jnp.ones(2, jnp.float32)}


def _complex_grads(p):
    loss = lambda q: sum(jnp.sum(jnp.abs(x - 1 + 2j) ** 2)  # noqa: E731
                         for x in jax.tree_util.tree_leaves(q))
    return jax.tree_util.tree_map(jnp.conj, jax.grad(loss)(p))


@pytest.mark.parametrize("which", ["dog", "dowg"])
def test_dog_and_dowg_complex_params_match_optax(which):
    make = lambda lib: getattr(lib.contrib, which)(0.5)  # noqa: E731
    assert_same_trajectory(make(ft), make(optax), params=_complex_tree(),
                           grads=_complex_grads, steps=20, name=which)


@pytest.mark.parametrize("make", [lambda: ft.contrib.prodigy(), lambda: ft.contrib.dadapt_adamw(),
                                  lambda: ft.contrib.mechanize(ft.sgd(1.0)),
                                  lambda: ft.contrib.cocob()],
                         ids=["prodigy", "dadapt_adamw", "mechanize", "cocob"])
def test_real_only_optimizers_reject_complex_leaves_by_name(make):
    with pytest.raises(TypeError, match=r"does not support complex parameters: params leaf "
                                        r"\['b'\] is complex64"):
        make().init(_complex_tree())


def _ref_dog(init_dist):
    """DoG (Ivgi et al., 2023, Algorithm 1) in float64 on FORMULA_P0 / FORMULA_GRADS."""
    x, x0, r, gsum, out = FORMULA_P0.copy(), FORMULA_P0.copy(), init_dist, 0.0, []
    for g in FORMULA_GRADS:
        r = max(r, np.linalg.norm(x - x0))
        gsum += np.sum(g ** 2)
        x = x - r / np.sqrt(gsum + 1e-8) * g
        out.append(x.copy())
    return out


def _ref_cocob(alpha=100.0, eps=1e-8):
    """COCOB-Backprop (Orabona & Tommasi, 2017, Algorithm 2), entry-wise, in float64."""
    x0 = FORMULA_P0.copy()
    x, L, G, R, theta, out = x0.copy(), np.full_like(x0, eps), 0 * x0, 0 * x0, 0 * x0, []
    for g in FORMULA_GRADS:
        L = np.maximum(L, np.abs(g))
        G = G + np.abs(g)
        R = np.maximum(R - g * (x - x0), 0)
        theta = theta - g
        x = x0 + theta / (L * np.maximum(G + L, alpha * L)) * (L + R)
        out.append(x.copy())
    return out


def test_dog_and_cocob_follow_their_papers():
    check_against_formula(ft.contrib.dog(init_step=("distance", 0.3)), _ref_dog(0.3))
    heuristic = 1e-2 * (1 + np.linalg.norm(FORMULA_P0))
    check_against_formula(ft.contrib.dog(init_step=("heuristic", 1e-2)), _ref_dog(heuristic))
    check_against_formula(ft.contrib.cocob(), _ref_cocob())
    check_against_formula(ft.contrib.cocob(alpha=2.0, eps=1e-3), _ref_cocob(2.0, 1e-3))


FACTORIES = {
    "prodigy": lambda lib: lib.contrib.prodigy(),
    "dadapt_adamw": lambda lib: lib.contrib.dadapt_adamw(),
    "dog heuristic": lambda lib: lib.contrib.dog(weight_decay=0.1),
    "dowg": lambda lib: lib.contrib.dowg(),
    "mechanize": lambda lib: lib.contrib.mechanize(lib.adam(1.0)),
    "cocob": lambda lib: lib.contrib.cocob(),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_state_from_shapes_alone_and_optax_layout(name):
    """``jax.eval_shape(opt.init, abstract)`` works (optax's prodigy, dog and dowg keep the
    initial params: here they are copied with array ops), and the state has optax's fields,
    values, shapes and dtypes."""
    params = make_params()
    opt = FACTORIES[name](ft)
    state = opt.init(params)
    abstract = jax.tree_util.tree_map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
    shapes = jax.eval_shape(opt.init, abstract)
    assert (jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), shapes)
            == jax.tree_util.tree_map(lambda x: (jnp.shape(x), jnp.result_type(x)), state))
    ref = FACTORIES[name](optax).init(params)
    names = lambda s: [type(x).__name__ for x in (s if isinstance(s, tuple) and not  # noqa
                                                     hasattr(s, "_fields") else (s,))]
    assert names(state) == names(ref)
    ours, theirs = jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(ref)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert jnp.shape(a) == jnp.shape(b) and jnp.result_type(a) == jnp.result_type(b)
        np.testing.assert_array_equal(a, b)
    param_ids = {id(x) for x in jax.tree_util.tree_leaves(params)}
    assert not param_ids & {id(x) for x in ours}, "the initial params must be copies"


def test_inject_hyperparams_changes_no_number():
    params = make_params()
    grads = jax.tree_util.tree_map(lambda p: jnp.stack([p * 0.5 + 0.1] * 6), params)
    for factory, args, kwargs in [
            (ft.contrib.mechanize, (ft.sgd(1.0),), dict(weight_decay=0.1, num_betas=3)),
            (ft.contrib.dog, (), dict(learning_rate=0.5, init_step=("distance", 0.1))),
            (ft.contrib.prodigy, (), dict(learning_rate=0.5, estim_lr0=1e-3))]:
        a = trajectory(factory(*args, **kwargs), ft.apply_updates, params, grads)
        b = trajectory(ft.inject_hyperparams(factory)(*args, **kwargs), ft.apply_updates,
                       params, grads)
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7, err_msg=factory.__name__)


def test_bad_input_errors_name_the_argument_or_leaf():
    params = {"w": jnp.ones((2, 2)), "b": jnp.ones(2)}
    with pytest.raises(ValueError, match="prodigy: b2 must be in"):
        ft.contrib.prodigy(betas=(0.9, 1.0))
    with pytest.raises(TypeError, match="betas must be a pair"):
        ft.contrib.dadapt_adamw(betas=0.9)
    with pytest.raises(ValueError, match="estim_lr0 must be >="):
        ft.contrib.prodigy(estim_lr0=0.0)
    with pytest.raises(ValueError, match="init_step must be a pair"):
        ft.contrib.dog(init_step=("guess", 1.0))
    with pytest.raises(ValueError, match="init_step value must be finite"):
        scale_by_dog(("distance", float("inf")))
    with pytest.raises(ValueError, match="num_betas must be >= 1"):
        ft.contrib.mechanize(ft.sgd(1.0), num_betas=0)
    with pytest.raises(TypeError, match="mechanize: num_betas must be an int .* 6.0"):
        ft.contrib.mechanize(ft.sgd(1.0), num_betas=6.0)  # a shape: optax fails in init
    with pytest.raises(TypeError, match="mechanize: base_optimizer is a str"):
        ft.contrib.mechanize("sgd")
    with pytest.raises(ValueError, match="scale_by_cocob: eps must be"):
        ft.contrib.cocob(eps=0.0)
    with pytest.raises(ValueError, match="weight_decay must be >= 0"):
        ft.contrib.dowg(weight_decay=-1.0)
    for name, opt in [("prodigy", ft.contrib.prodigy()), ("dadapt_adamw",
                                                          ft.contrib.dadapt_adamw()),
                      ("scale_by_dog", ft.contrib.dog()), ("scale_by_dowg", ft.contrib.dowg()),
                      ("mechanize", ft.contrib.mechanize(ft.sgd(1.0))),
                      ("scale_by_cocob", ft.contrib.scale_by_cocob())]:
        state = opt.init(params)
        with pytest.raises(ValueError, match=f"{name} needs the current parameters"):
            opt.update(params, state)
        bad = {"w": jnp.ones((2, 2)), "b": jnp.ones(3)}
        with pytest.raises(ValueError, match=r"leaf \['b'\] has shape \(3,\)"):
            opt.update(bad, state, bad)
    with pytest.raises(TypeError, match=r"prodigy: params leaf \['n'\] has dtype int32"):
        ft.contrib.prodigy().init({"n": jnp.zeros(2, jnp.int32)})
    with pytest.raises(TypeError, match="ProdigyState"):
        ft.contrib.prodigy().update(params, (), params)
