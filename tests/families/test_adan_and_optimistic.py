"""Adan (functrain.families.adam.optimizers) and the optimistic methods
(functrain.families.momentum.optimizers, functrain.families.adam.optimistic).

Against optax at every one of 40 jitted steps (several settings each), against a
hand-written numpy formula (optimistic Adam v2 with a non-constant schedule),
optax's signatures, and for each optimizer of optimistic.py: unknown update keywords,
inject_hyperparams, float64 (Adan's are in test_adam_family.py). The default-settings parity cases are also in
tests/parity/test_optax_parity.py.
"""

import inspect
import warnings

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from functrain.families.adam import optimistic
from helpers import (FORMULA_GRADS, FORMULA_P0, assert_same_trajectory, check_against_formula,
                     make_grads, make_params, matrices_only, run_on_formula_inputs)
from optimizer_checks import (check_extra_args_ignored_and_inject_hyperparams,
                              check_float64_params_stay_float64)
from registry import optimizer_names

NAMES = optimizer_names(optimistic) + ["optimistic_gradient_descent"]
STEPS = 40


def quiet(make):
    """``make`` with optimistic_adam's DeprecationWarning (ours and optax's) silenced."""
    def build(m):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return make(m)
    return build


CASES = {
    "adan_settings": lambda m: m.adan(3e-3, b1=0.9, b2=0.8, b3=0.95, eps=1e-6, eps_root=0.0),
    "adan_decay_masked": lambda m: m.adan(1e-2, weight_decay=0.1, mask=matrices_only),
    "adan_schedules": lambda m: m.adan(m.linear_schedule(1e-2, 1e-3, 30),
                                       weight_decay=lambda c: 1e-2 / (1.0 + c)),
    "optimistic_adam": quiet(lambda m: m.optimistic_adam(1e-2)),
    "optimistic_adam_settings": quiet(lambda m: m.optimistic_adam(
        3e-3, 0.5, b1=0.8, b2=0.99, eps=1e-6, eps_root=1e-8, nesterov=False)),
    "optimistic_adam_v2_settings": lambda m: m.optimistic_adam_v2(
        1e-2, alpha=0.5, beta=2.0, b1=0.8, eps_root=1e-8, nesterov=False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_optax_every_step(name):
    params = make_params()
    assert_same_trajectory(CASES[name](ft), CASES[name](optax), params=params,
                           grads=make_grads(params, STEPS), name=name)


# --------------------------------------------------------------------------
# optimistic_adam_v2 with a schedule
# --------------------------------------------------------------------------

def test_v2_with_a_constant_schedule_equals_optax_with_the_constant():
    params = make_params(vector=False)
    ours = ft.optimistic_adam_v2(ft.constant_schedule(3e-3), alpha=0.7, beta=1.5)
    theirs = optax.optimistic_adam_v2(3e-3, alpha=0.7, beta=1.5)
    assert_same_trajectory(ours, theirs, params=params, grads=make_grads(params, STEPS),
                           name="constant schedule")
    assert isinstance(ours.init(params)[-1], ft.ScaleByScheduleState)


def test_v2_with_a_decaying_schedule_equals_optax_with_the_same_schedule():
    params = make_params(vector=False)
    make = lambda m: m.optimistic_adam_v2(m.exponential_decay(1e-2, 5, 0.8), beta=0.5)
    assert_same_trajectory(make(ft), make(optax), params=params,
                           grads=make_grads(params, STEPS), name="exponential_decay")


def ref_optimistic_adam_v2(lr_of, alpha, beta, b1=0.9, b2=0.999, eps=1e-8, nesterov=True):
    """The paper's optimistic Adam in numpy (float64): r_t Adam's direction, r_0 = r_1."""
    p = FORMULA_P0.copy()
    m, v, prev, out = np.zeros_like(p), np.zeros_like(p), None, []
    for t, g in enumerate(FORMULA_GRADS, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = (b1 * m / (1 - b1 ** (t + 1)) + (1 - b1) * g / (1 - b1 ** t)
                 if nesterov else m / (1 - b1 ** t))
        r = m_hat / (np.sqrt(v / (1 - b2 ** t)) + eps)
        prev = r if prev is None else prev
        p = p - lr_of(t - 1) * ((alpha + beta) * r - beta * prev)
        prev = r
        out.append(p)
    return out


def assert_close_to_formula(opt, reference):
    """Like check_against_formula, within float32's ``1 - 0.999**t`` (relative error ~1e-5,
    which the optimism's ``(alpha + beta) r_t - beta r_{t-1}`` amplifies)."""
    for t, (ours, theirs) in enumerate(zip(run_on_formula_inputs(opt), reference, strict=True)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6, err_msg=f"step {t}")


@pytest.mark.parametrize("nesterov", [True, False])
def test_v2_with_a_non_constant_schedule_by_hand(nesterov):
    lr_of = lambda count: 0.1 / (1.0 + count)
    opt = ft.optimistic_adam_v2(lr_of, alpha=0.5, beta=2.0, nesterov=nesterov)
    assert_close_to_formula(opt, ref_optimistic_adam_v2(lr_of, 0.5, 2.0, nesterov=nesterov))


def test_v1_is_v2_with_alpha_the_rate_beta_the_optimism():
    with pytest.warns(DeprecationWarning, match="optimistic_adam_v2"):
        v1 = ft.optimistic_adam(0.05, 0.3)
    assert_close_to_formula(v1, ref_optimistic_adam_v2(lambda count: 1.0, 0.05, 0.3))


def test_v1_rejects_a_schedule_and_names_the_argument():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match="optimistic_adam: learning_rate must be a real"):
            ft.optimistic_adam(ft.constant_schedule(0.1))


# --------------------------------------------------------------------------
# Adan by hand, and errors
# --------------------------------------------------------------------------

def ref_adan(lr, b1=0.98, b2=0.92, b3=0.99, eps=1e-8, eps_root=1e-8, wd=0.0):
    """Algorithm 1 of Xie et al. (2022) as optax applies it, in numpy (float64)."""
    p = FORMULA_P0.copy()
    m, v, n, prev = (np.zeros_like(p) for _ in range(4))
    out = []
    for t, g in enumerate(FORMULA_GRADS, start=1):
        d = np.zeros_like(g) if t == 1 else g - prev
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * d
        n = b3 * n + (1 - b3) * (g + (1 - b2) * d) ** 2
        u = (m / (1 - b1 ** t) + (1 - b2) * v / (1 - b2 ** t)) / (
            np.sqrt(n / (1 - b3 ** t) + eps_root) + eps)
        p = p - lr * (u + wd * p)
        prev = g
        out.append(p)
    return out


@pytest.mark.parametrize("kwargs", [dict(), dict(b1=0.5, b2=0.7, b3=0.9, weight_decay=0.1)],
                         ids=["defaults", "settings"])
def test_adan_by_hand(kwargs):
    wd = kwargs.pop("weight_decay", 0.0)
    opt = ft.adan(0.01, weight_decay=wd, **kwargs)
    check_against_formula(opt, ref_adan(0.01, wd=wd, **kwargs))


@pytest.mark.parametrize("make,message", [
    (lambda: ft.adan(0.1, b3=1.5), "scale_by_adan: b3 must be in [0.0, 1.0), got 1.5."),
    (lambda: ft.adan(0.1, eps_root=-1.0), "scale_by_adan: eps_root must be >= 0.0"),
    (lambda: ft.adan(float("nan")), "adan: learning_rate must be finite"),
    (lambda: ft.optimistic_adam_v2(0.1, alpha="1"), "optimistic_adam_v2: alpha must be a real"),
    (lambda: ft.optimistic_adam_v2(0.1, b2=1.0), "b2 must be in [0.0, 1.0)"),
], ids=["b3", "eps_root", "nan_rate", "alpha_type", "b2"])
def test_bad_hyperparameters_name_the_argument(make, message):
    with pytest.raises((TypeError, ValueError)) as info:
        make()
    assert message in str(info.value)


def test_shape_errors_name_the_leaf():
    opt = ft.adan(0.1)
    state = opt.init({"w": jnp.zeros(3)})
    with pytest.raises(ValueError, match=r"\['w'\]"):
        opt.update({"w": jnp.zeros(4)}, state, {"w": jnp.zeros(4)})


def test_state_layout_is_optax_s():
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    ours, theirs = ft.adan(1e-2).init(params), optax.adan(1e-2).init(params)
    assert type(ours[0]).__name__ == type(theirs[0]).__name__ == "ScaleByAdanState"
    assert ours[0]._fields == theirs[0]._fields
    assert len(ours) == len(theirs) == 3
    v2 = ft.optimistic_adam_v2(1e-2).init(params)
    assert [type(s).__name__ for s in v2] == [
        type(s).__name__ for s in optax.optimistic_adam_v2(1e-2).init(params)]


@pytest.mark.parametrize("name", ["adan", "optimistic_adam", "optimistic_adam_v2",
                                  "scale_by_adan"])
def test_signature_is_optax_s(name):
    ours, theirs = (inspect.signature(getattr(m, name)).parameters for m in (ft, optax))
    # optax's arguments in optax's order; functrain's own come after, keyword-only
    # (adan's cautious_weight_decay)
    assert list(ours)[:len(theirs)] == list(theirs)
    assert all(ours[arg].kind is inspect.Parameter.KEYWORD_ONLY for arg in list(ours)[len(theirs):])
    for arg, p in theirs.items():
        assert (ours[arg].default, ours[arg].kind) == (p.default, p.kind), (name, arg)


# --------------------------------------------------------------------------
# Every optimizer of this file
# --------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("name", NAMES)
def test_extra_args_ignored_and_inject_hyperparams(name):
    check_extra_args_ignored_and_inject_hyperparams(name)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("name", NAMES)
def test_float64_params_stay_float64(name):
    check_float64_params_stay_float64(name)
