"""functrain.families.quasi_newton.optimizers: lbfgs against optax, every iterate of jitted runs
that use ``value_and_grad_from_state`` as optax's docs show; convergence; errors.

The fixed-learning-rate variant (no line search) is also in the parity tables
(tests/parity/test_optax_parity.py) and the property tests (tests/test_properties.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from helpers import fast_jit
from optimizer_checks import check_float64_params_stay_float64


def rosenbrock(w):
    return jnp.sum(100.0 * (w[1:] - w[:-1] ** 2) ** 2 + (1.0 - w[:-1]) ** 2)


COND = jnp.asarray(np.logspace(0, 4, 6), jnp.float32)  # condition number 1e4


def ill_conditioned(w):
    return 0.5 * jnp.sum(COND * (w["a"] - 1.0) ** 2) + 0.5 * jnp.sum(w["b"] ** 2)


A = jnp.asarray([[1, -2], [3, 4j], [-4 + 2j, 5 - 3j], [-2 - 2j, 6]], jnp.complex64)
Y = jnp.asarray([1 - 1j, 2.0, 0.5j, -1.0], jnp.complex64)


def complex_least_squares(z):
    return jnp.sum(jnp.abs(A @ z - Y) ** 2)


def run(m, opt, f, params, steps, conj=False):
    """Every iterate of ``steps`` jitted steps, the last state, and the trace count."""
    traces = []
    value_and_grad = m.value_and_grad_from_state(f)

    @fast_jit
    def step(p, s):
        traces.append(1)
        v, g = value_and_grad(p, state=s)
        if conj:
            g = jax.tree_util.tree_map(jnp.conj, g)
        u, s = opt.update(g, s, p, value=v, grad=g, value_fn=f)
        return m.apply_updates(p, u), s

    state, out = opt.init(params), []
    for _ in range(steps):
        params, state = step(params, state)
        out.append(params)
    return out, state, len(traces)


def assert_same_iterates(make, f, params, steps, conj=False, rtol=2e-5, atol=1e-6):
    ours, state, traces = run(ft, make(ft), f, params, steps, conj)
    theirs, ref_state, _ = run(optax, make(optax), f, params, steps, conj)
    for t, (x, y) in enumerate(zip(ours, theirs)):
        for xl, yl in zip(jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(y)):
            np.testing.assert_allclose(xl, yl, rtol=rtol, atol=atol, err_msg=f"step {t}")
    assert traces == 1
    return ours, state


def test_rosenbrock_matches_optax_and_converges():
    ours, state = assert_same_iterates(lambda m: m.lbfgs(), rosenbrock,
                                       jnp.array([-1.2, 1.0]), 40)
    np.testing.assert_allclose(ours[-1], [1.0, 1.0], atol=1e-4)
    assert isinstance(state[0], ft.ScaleByLBFGSState)
    assert isinstance(state[2], ft.ScaleByZoomLinesearchState)


def test_ill_conditioned_quadratic_matches_optax():
    ours, _ = assert_same_iterates(lambda m: m.lbfgs(memory_size=4), ill_conditioned,
                                   {"a": jnp.zeros(6), "b": jnp.ones(3)}, 30)
    assert ill_conditioned(ours[-1]) < 1e-3 * ill_conditioned({"a": jnp.zeros(6),
                                                              "b": jnp.ones(3)})


@pytest.mark.parametrize("name,make", [
    ("backtracking", lambda m: m.lbfgs(linesearch=m.scale_by_backtracking_linesearch(
        15, store_grad=True))),
    ("zoom_keep_capped", lambda m: m.lbfgs(memory_size=3, linesearch=m.scale_by_zoom_linesearch(
        8, max_learning_rate=0.5, curv_rtol=0.5, approx_dec_rtol=None))),
    ("zoom_limit_hit", lambda m: m.lbfgs(linesearch=m.scale_by_zoom_linesearch(
        2, initial_guess_strategy="one"))),
    ("learning_rate_schedule", lambda m: m.lbfgs(learning_rate=lambda c: 1.0 / (1.0 + c),
                                                 scale_init_precond=False)),
])
def test_rosenbrock_variants_match_optax(name, make):
    ours, _ = assert_same_iterates(make, rosenbrock, jnp.array([-1.2, 1.0, 0.5, -0.3]), 30)
    assert np.all(np.isfinite(ours[-1])), name


def test_complex_least_squares_matches_optax():
    ours, _ = assert_same_iterates(lambda m: m.lbfgs(), complex_least_squares,
                                   jnp.zeros(2, jnp.complex64), 15, conj=True)
    z = np.asarray(ours[-1])
    exact = np.linalg.lstsq(np.asarray(A), np.asarray(Y), rcond=None)[0]
    np.testing.assert_allclose(z, exact, atol=1e-4)


def test_without_linesearch_is_a_fixed_step():
    """linesearch=None: no value_fn needed; unknown keywords are ignored."""
    opt = ft.lbfgs(learning_rate=0.1, linesearch=None)
    w = jnp.array([3.0, 4.0])
    u, state = opt.update(w, opt.init(w), w, unknown=1)
    np.testing.assert_allclose(u, -0.1 * w / 5.0, rtol=1e-6)  # first step: g / |g|
    assert isinstance(state[2], ft.EmptyState)


def test_float64():
    check_float64_params_stay_float64("lbfgs")


def test_errors():
    with pytest.raises(ValueError, match="memory_size must be >= 1"):
        ft.lbfgs(memory_size=0)
    with pytest.raises(TypeError, match="lbfgs: learning_rate must be a real number"):
        ft.lbfgs(learning_rate="fast")
    with pytest.raises(TypeError, match="lbfgs: linesearch is a int"):
        ft.lbfgs(linesearch=3)
    opt, w = ft.lbfgs(), jnp.ones(2)
    with pytest.raises(ValueError, match="needs the keyword argument 'value'"):
        opt.update(w, opt.init(w), w)
