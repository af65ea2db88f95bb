"""functrain.families.quasi_newton.linesearch against optax, step by step, and the extra-args protocol.

Every comparison runs one jitted step (``value_and_grad_from_state`` then ``update``,
as optax's docs show) on both libraries and compares every iterate and every
search's ``info``. Also: the search compiles once, stops cleanly at its step limit,
and checks its arguments.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from functrain.families.quasi_newton import linesearch as lsm
from functrain.jax_compat import enable_x64
from helpers import fast_jit


def rosenbrock(w):
    return jnp.sum(100.0 * (w[1:] - w[:-1] ** 2) ** 2 + (1.0 - w[:-1]) ** 2)


def least_squares(w, x, y):
    """An objective with inputs besides the params: passed to update as keywords."""
    return 0.5 * jnp.sum((x @ w["a"] + w["b"] - y) ** 2)


X = jnp.asarray(np.random.default_rng(0).standard_normal((8, 3)), jnp.float32)
Y = jnp.asarray(np.arange(8.0), jnp.float32)
W0 = jnp.array([-1.2, 1.0, 0.5, -0.3])
TREE0 = {"a": jnp.zeros(3), "b": jnp.ones(())}


def run(m, opt, f, params, steps, conj=False, **data):
    """Iterates, infos and the step's trace count of ``steps`` jitted steps of ``opt``."""
    traces = []
    value_and_grad = m.value_and_grad_from_state(f)

    @fast_jit
    def step(p, s):
        traces.append(1)
        v, g = value_and_grad(p, state=s, **data)
        if conj:  # complex params: the steepest-descent direction is conj(grad)
            g = jax.tree_util.tree_map(jnp.conj, g)
        u, s = opt.update(g, s, p, value=v, grad=g, value_fn=f, **data)
        return m.apply_updates(p, u), s

    state, out, infos = opt.init(params), [], []
    for _ in range(steps):
        params, state = step(params, state)
        out.append(params)
        infos.append(state[-1].info)
    return out, infos, len(traces), step


def assert_same(ours, theirs, rtol=2e-5, atol=1e-6):
    (a, ia, _, _), (b, ib, _, _) = ours, theirs
    for t, (x, y) in enumerate(zip(a, b)):
        for xl, yl in zip(jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(y)):
            np.testing.assert_allclose(xl, yl, rtol=rtol, atol=atol, err_msg=f"step {t}")
    for t, (x, y) in enumerate(zip(ia, ib)):
        assert type(x).__name__ == type(y).__name__
        for xl, yl in zip(x, y):
            np.testing.assert_allclose(xl, yl, rtol=rtol, atol=atol, err_msg=f"info step {t}")
    assert not np.allclose(jax.tree_util.tree_leaves(a[-1])[0],
                           jax.tree_util.tree_leaves(a[0])[0]), "the params did not move"


def both(make, f, params, steps, **kw):
    return run(ft, make(ft), f, params, steps, **kw), run(optax, make(optax), f, params,
                                                           steps, **kw)


@pytest.mark.parametrize("name,make", [
    ("sgd_zoom", lambda m: m.chain(m.sgd(1.0), m.scale_by_zoom_linesearch(10))),
    ("sgd_zoom_settings", lambda m: m.chain(m.sgd(1.0), m.scale_by_zoom_linesearch(
        6, max_learning_rate=0.01, increase_factor=3.0, curv_rtol=0.5, approx_dec_rtol=None,
        initial_guess_strategy="one"))),
    ("sgd_backtracking", lambda m: m.chain(m.sgd(1.0), m.scale_by_backtracking_linesearch(
        20, store_grad=True))),
    ("sgd_backtracking_settings", lambda m: m.chain(m.sgd(1.0), m.scale_by_backtracking_linesearch(
        12, slope_rtol=0.3, decrease_factor=0.5, increase_factor=2.0, max_learning_rate=0.05,
        atol=1e-3, rtol=1e-4, store_grad=True))),
])
def test_rosenbrock_matches_optax(name, make):
    ours, theirs = both(make, rosenbrock, W0, 30)
    assert_same(ours, theirs)
    steps = [int(i.num_linesearch_steps) for i in ours[1]]
    assert max(steps) > 1, f"{name}: the search never tried a second step size"


def test_extra_inputs_go_to_value_fn_and_match_optax():
    """value_fn(params, x, y): x and y given to update as keywords (not stored)."""
    for make in (lambda m: m.chain(m.sgd(1.0), m.scale_by_zoom_linesearch(15)),
                 lambda m: m.chain(m.sgd(1.0), m.scale_by_backtracking_linesearch(15))):
        def value_and_grad_run(m):
            opt, p = make(m), TREE0
            s = opt.init(p)

            @fast_jit
            def step(p, s):
                v, g = jax.value_and_grad(least_squares)(p, X, Y)
                u, s = opt.update(g, s, p, value=v, grad=g, value_fn=least_squares, x=X, y=Y)
                return m.apply_updates(p, u), s

            out = []
            for _ in range(10):
                p, s = step(p, s)
                out.append(p)
            return out, [s[-1].info], 1, None

        assert_same(value_and_grad_run(ft), value_and_grad_run(optax))


def test_zoom_info_fields():
    """num_linesearch_steps, decrease_error and curvature_error: optax's, and what they mean."""
    make = lambda m: m.chain(m.sgd(1.0), m.scale_by_zoom_linesearch(10))  # noqa: E731
    ours, theirs = both(make, rosenbrock, W0, 12)
    assert_same(ours, theirs)
    infos = ours[1]
    assert all(isinstance(i, ft.ZoomLinesearchInfo) for i in infos)
    assert [int(i.num_linesearch_steps) for i in infos][:3] == [8, 1, 2]
    for i in infos:  # success: both conditions met
        assert float(i.decrease_error) == 0.0 and float(i.curvature_error) == 0.0
    # A curvature condition no step can meet within max_learning_rate: positive error.
    make = lambda m: m.chain(m.sgd(1.0), m.scale_by_zoom_linesearch(  # noqa: E731
        5, max_learning_rate=1e-4, curv_rtol=0.01))
    ours, theirs = both(make, rosenbrock, W0, 3)
    assert_same(ours, theirs)
    assert float(ours[1][0].curvature_error) > 0 and float(ours[1][0].decrease_error) == 0


@pytest.mark.parametrize("make,limit", [
    (lambda m: m.chain(m.sgd(1.0), m.scale_by_zoom_linesearch(3, approx_dec_rtol=None,
                                                                curv_rtol=0.01)), 3),
    (lambda m: m.chain(m.sgd(1.0), m.scale_by_backtracking_linesearch(2, store_grad=True)), 3),
])
def test_stops_cleanly_at_the_step_limit(make, limit):
    """A search that hits its limit returns finite numbers, optax's, and compiles once."""
    ours, theirs = both(make, rosenbrock, W0, 8)
    assert_same(ours, theirs)
    steps = [int(i.num_linesearch_steps) for i in ours[1]]
    assert max(steps) == limit and min(steps) >= 1, steps
    assert any(float(i.decrease_error) > 0 or float(getattr(i, "curvature_error", 0)) > 0
               for i in ours[1]), "the limit was never what stopped the search"
    for p in ours[0]:
        assert np.all(np.isfinite(p))
    assert ours[2] == 1


def test_nonfinite_objective_gives_a_zero_step():
    """Every trial gives NaN: backtracking takes no step (step size 0), as optax."""
    f = lambda w: jnp.where(jnp.sum(w) > 2.5, jnp.sum(w ** 2), jnp.nan)  # noqa: E731
    for m in (ft, optax):
        opt = m.chain(m.sgd(1.0), m.scale_by_backtracking_linesearch(4))
        w = jnp.array([1.0, 2.0])
        u, s = opt.update(jnp.ones(2), opt.init(w), w, value=f(w), grad=jnp.ones(2),
                          value_fn=f)
        np.testing.assert_array_equal(u, [0.0, 0.0])
        assert float(s[-1].learning_rate) == 0.0 and np.isinf(s[-1].info.decrease_error)


def test_complex_least_squares_matches_optax():
    a = jnp.asarray([[1, -2], [3, 4j], [-4 + 2j, 5 - 3j]], jnp.complex64)
    y = jnp.asarray([1 - 1j, 2.0, 0.5j], jnp.complex64)
    f = lambda z: jnp.sum(jnp.abs(a @ z - y) ** 2)  # noqa: E731
    z0 = jnp.zeros(2, jnp.complex64)
    for make in (lambda m: m.chain(m.sgd(1.0), m.scale_by_zoom_linesearch(10)),
                 lambda m: m.chain(m.sgd(1.0), m.scale_by_backtracking_linesearch(
                     10, store_grad=True))):
        ours, theirs = both(make, f, z0, 10, conj=True)
        assert_same(ours, theirs)
        assert np.abs(np.imag(ours[0][-1])).max() > 0.1


def test_jitted_step_compiles_once():
    """The while_loop carry keeps its shapes and dtypes: one trace, one compilation."""
    for make in (lambda m: m.chain(m.sgd(1.0), m.scale_by_zoom_linesearch(10)),
                 lambda m: m.chain(m.sgd(1.0), m.scale_by_backtracking_linesearch(
                     10, store_grad=True))):
        _, infos, traces, step = run(ft, make(ft), rosenbrock, W0, 6)
        assert traces == 1 and step._cache_size() == 1
        assert len({int(i.num_linesearch_steps) for i in infos}) > 1  # varied trial counts


SEARCHES = {
    "backtracking": lambda m, kw: m.scale_by_backtracking_linesearch(5, **{k: kw for k in (
        "slope_rtol", "decrease_factor", "increase_factor", "max_learning_rate", "atol",
        "rtol")}),
    "zoom": lambda m, kw: m.scale_by_zoom_linesearch(5, **{k: kw for k in (
        "tol", "increase_factor", "slope_rtol", "curv_rtol", "approx_dec_rtol",
        "stepsize_precision")}),
}


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("search", sorted(SEARCHES))
def test_state_dtypes_are_stable_under_x64_with_float64_inputs(search, dtype):
    # optax's test_dtype_stability: float64 hyperparameters and objective, a Python
    # float value; the loop carry and the new state keep init's dtypes (a lax.cond
    # between the new state and the old one needs them equal).
    with enable_x64(True):
        for m in (optax, ft):
            opt = SEARCHES[search](m, jnp.array(1e-5, jnp.float64))
            x = jnp.array([1.0, 2.0], dtype)
            state = opt.init(x)
            f = lambda x: jnp.sum(x ** 2).astype(jnp.float64)  # noqa: E731
            new = opt.update(x, state, x, value=1.0, grad=x, value_fn=f)[1]
            assert (jax.tree.map(lambda a: a.dtype, new)
                    == jax.tree.map(lambda a: a.dtype, state)), m.__name__
            jax.lax.cond(jnp.asarray(True), lambda: new, lambda: state)


@pytest.mark.parametrize("guess", [0.25, 4.0])
def test_zoom_takes_a_python_float_learning_rate_in_its_state(guess):
    # optax's tests set the first guess with optax.tree.set(state, learning_rate=float).
    f = lambda w: jnp.sum((w - 1.0) ** 2) + jnp.sum(w ** 4)  # noqa: E731
    w = jnp.array([0.5, -2.0, 3.0])
    out = {}
    for m in (optax, ft):
        opt = m.scale_by_zoom_linesearch(10)
        state = opt.init(w)._replace(learning_rate=guess)
        value, grad = jax.value_and_grad(f)(w)
        u, new = opt.update(-grad, state, w, value=value, grad=grad, value_fn=f)
        out[m] = (u, new.learning_rate, new.info.num_linesearch_steps)
        assert new.learning_rate.dtype == jnp.float32
    np.testing.assert_allclose(out[ft][0], out[optax][0], rtol=1e-6)
    np.testing.assert_allclose(out[ft][1], out[optax][1], rtol=1e-6)
    assert int(out[ft][2]) == int(out[optax][2])


# --------------------------------------------------------------------------
# value_and_grad_from_state
# --------------------------------------------------------------------------

def test_value_and_grad_from_state_reuses_the_stored_pair():
    f = lambda w: jnp.sum(w ** 2)  # noqa: E731
    opt = ft.chain(ft.sgd(1.0), ft.scale_by_zoom_linesearch(5))
    w = jnp.array([1.0, -2.0])
    state = opt.init(w)
    value_and_grad = ft.value_and_grad_from_state(f)
    v, g = value_and_grad(w, state=state)  # inf stored: computed
    np.testing.assert_allclose(v, 5.0)
    np.testing.assert_allclose(g, [2.0, -4.0])
    fake = (state[0], state[1]._replace(value=jnp.asarray(7.0), grad=jnp.array([3.0, 3.0])))
    v, g = value_and_grad(w, state=fake)  # finite stored: returned as is
    assert float(v) == 7.0 and np.all(np.asarray(g) == 3.0)


def test_value_and_grad_from_state_errors():
    f = lambda w: jnp.sum(w ** 2)  # noqa: E731
    w = jnp.ones(2)
    with pytest.raises(ValueError, match="exactly one 'value'.*nowhere"):
        ft.value_and_grad_from_state(f)(w, state=ft.adam(0.1).init(w))
    no_grad = ft.scale_by_backtracking_linesearch(5).init(w)
    with pytest.raises(ValueError, match=r"'grad'.*state\.grad set to None"):
        ft.value_and_grad_from_state(f)(w, state=no_grad)
    two = (ft.scale_by_zoom_linesearch(5).init(w),) * 2
    with pytest.raises(ValueError, match=r"state\[0\]\.value, state\[1\]\.value"):
        ft.value_and_grad_from_state(f)(w, state=two)


@pytest.mark.parametrize("m", [optax, ft], ids=["optax", "functrain"])
def test_two_searches_in_a_chain_raise_key_error_as_optax(m):
    # optax documents an error when several values are found, and raises KeyError.
    opt = m.chain(m.scale_by_backtracking_linesearch(15), m.scale_by_backtracking_linesearch(15))
    w = jnp.array([1.0, 2.0, 3.0])
    with pytest.raises(KeyError):
        jax.jit(m.value_and_grad_from_state(lambda x: jnp.sum(x ** 2)))(w, state=opt.init(w))


# --------------------------------------------------------------------------
# Errors: before any math, naming the argument or the leaf
# --------------------------------------------------------------------------

def test_update_errors_name_the_argument():
    f = lambda w: jnp.sum(w["a"] ** 2)  # noqa: E731
    w = {"a": jnp.ones(2)}
    for tx, name in ((ft.scale_by_zoom_linesearch(5), "scale_by_zoom_linesearch"),
                     (ft.scale_by_backtracking_linesearch(5), "scale_by_backtracking_linesearch")):
        s = tx.init(w)
        with pytest.raises(ValueError, match=f"{name} needs the keyword argument 'value_fn'"):
            tx.update(w, s, w, value=1.0, grad=w)
        with pytest.raises(ValueError, match=f"{name} needs the current parameters"):
            tx.update(w, s, value=1.0, grad=w, value_fn=f)
        with pytest.raises(TypeError, match=r"Unexpected keyword arguments \['batch'\] in "
                           r"update: value_fn does not take them"):
            tx.update(w, s, w, value=1.0, grad=w, value_fn=f, batch=3)
        with pytest.raises(ValueError, match=r"grad leaf \['a'\] has shape \(3,\)"):
            tx.update(w, s, w, value=1.0, grad={"a": jnp.ones(3)}, value_fn=f)
        with pytest.raises(TypeError, match=f"{name} expected its state"):
            tx.update(w, (), w, value=1.0, grad=w, value_fn=f)


def test_hyperparameter_errors():
    with pytest.raises(ValueError, match="initial_guess_strategy must be 'one' or 'keep'"):
        ft.scale_by_zoom_linesearch(5, initial_guess_strategy="two")
    with pytest.raises(ValueError, match="decrease_factor must be in"):
        ft.scale_by_backtracking_linesearch(5, decrease_factor=1.5)
    with pytest.raises(ValueError, match="max_linesearch_steps must be >= 0"):
        ft.scale_by_zoom_linesearch(-1)
    with pytest.raises(ValueError, match="tol must be finite"):
        ft.scale_by_zoom_linesearch(5, tol=float("nan"))
    ft.scale_by_zoom_linesearch(5, curv_rtol=float("inf"))  # documented: drops the condition
    ft.scale_by_backtracking_linesearch(5, increase_factor=float("inf"))


# --------------------------------------------------------------------------
# verbose=True: why a zoom search failed (the cases of optax's own tests; each
# expectation derived by hand from f(w) = |w|^2 along u = e1)
# --------------------------------------------------------------------------

def zoom_output(capsys, f, w, u, **kwargs):
    """The step size one verbose zoom search takes from ``w`` along ``u``, and what it printed."""
    opt = ft.scale_by_zoom_linesearch(verbose=True, **kwargs)
    state = opt.init(w)
    value, grad = jax.value_and_grad(f)(w)
    _, state = opt.update(u, state, w, value=value, grad=grad, value_fn=f)
    jax.effects_barrier()
    return float(state.learning_rate), capsys.readouterr().out


def sq(w):
    return jnp.dot(w, w)


E1 = jnp.array([1.0, 0.0])


def test_zoom_says_to_raise_max_learning_rate_when_nothing_below_it_brackets(capsys):
    # From w = -60 e1 the slope along u is 2 (s - 60); curvature |slope| <= 0.5 * 120
    # needs s >= 30, above max_learning_rate = 10: phase 1 stops at 10 (1, 2, 4, 8, 10).
    eta, out = zoom_output(capsys, sq, -60 * E1, E1, max_linesearch_steps=10,
                           curv_rtol=0.5, max_learning_rate=10.0)
    assert eta == 10.0
    assert lsm.FLAG_INTERVAL_NOT_FOUND in out and "raise max_learning_rate" in out
    assert lsm.FLAG_CURVATURE_COND_NOT_SATISFIED in out
    assert "After 5 trials: step size taken 10.0" in out
    assert "slope -120.0" in out and lsm.FLAG_NO_STEPSIZE_FOUND not in out


def test_zoom_says_when_the_direction_does_not_descend(capsys):
    # From w = +60 e1 along e1 the slope at 0 is +120: no step decreases f.
    eta, out = zoom_output(capsys, sq, 60 * E1, E1, max_linesearch_steps=18, curv_rtol=0.5)
    assert eta < 1e-5
    assert lsm.FLAG_NO_STEPSIZE_FOUND in out and lsm.FLAG_NOT_A_DESCENT_DIRECTION in out
    assert "It is 120.0." in out and lsm.FLAG_INTERVAL_NOT_FOUND not in out


def test_zoom_says_when_it_ran_out_of_trials_with_decrease_only(capsys):
    # Trials 1, 2, 4, 8, 16 all decrease f but none reaches s >= 30 (curvature): the
    # step limit ends the search at the best step with sufficient decrease, 16.
    eta, out = zoom_output(capsys, sq, -60 * E1, E1, max_linesearch_steps=5, curv_rtol=0.5)
    assert eta == 16.0
    assert "no step size met both conditions in 5 trials" in out
    assert lsm.FLAG_CURVATURE_COND_NOT_SATISFIED in out
    assert "best such step size found: 16.0" in out
    for flag in (lsm.FLAG_NOT_A_DESCENT_DIRECTION, lsm.FLAG_NO_STEPSIZE_FOUND,
                 lsm.FLAG_INTERVAL_NOT_FOUND, lsm.FLAG_INTERVAL_TOO_SMALL):
        assert flag not in out


def test_zoom_says_when_the_bracket_shrank_below_its_precision(capsys):
    # exp(-1/x^2) is flat to float32 near 0: the bracket collapses before curvature holds.
    f = lambda x: jnp.exp(-1.0 / x ** 2)  # noqa: E731
    w = jnp.asarray(-0.2)
    _, out = zoom_output(capsys, f, w, -jax.grad(f)(w), max_linesearch_steps=30)
    assert lsm.FLAG_INTERVAL_TOO_SMALL in out and "Its length: " in out


@pytest.mark.parametrize("verbose", [True, False])
def test_zoom_is_silent_when_it_succeeds_or_is_not_verbose(capsys, verbose):
    w = -60 * E1
    value, grad = jax.value_and_grad(sq)(w)
    steps = 30 if verbose else 5  # with 5 trials it fails (above), silently here
    opt = ft.scale_by_zoom_linesearch(steps, curv_rtol=0.5, verbose=verbose)
    _, state = opt.update(E1, opt.init(w), w, value=value, grad=grad, value_fn=sq)
    jax.effects_barrier()
    assert capsys.readouterr().out == ""
    assert (float(state.learning_rate) >= 30.0) == verbose


# --------------------------------------------------------------------------
# The extra-args protocol (functrain.engine.protocol)
# --------------------------------------------------------------------------

def test_gradient_transformation_extra_args():
    assert isinstance(ft.lbfgs(), ft.GradientTransformationExtraArgs)
    assert isinstance(ft.scale_by_zoom_linesearch(3), ft.GradientTransformation)
    plain = ft.GradientTransformation(lambda p: (), lambda u, s, p=None: (u, s))
    wrapped = ft.with_extra_args_support(plain)
    assert isinstance(wrapped, ft.GradientTransformationExtraArgs)
    assert ft.with_extra_args_support(wrapped) is wrapped
    x = jnp.ones(2)
    np.testing.assert_array_equal(wrapped.update(x, (), None, value=1.0, anything="x")[0], x)
    # An update that takes **kwargs keeps them: Polyak still gets its value, and
    # chain still fuses its stages.
    polyak = ft.with_extra_args_support(ft.polyak_sgd(max_learning_rate=1.0))
    u, _ = polyak.update(x, polyak.init(x), x, value=jnp.asarray(0.5))
    np.testing.assert_allclose(u, -0.25 * x)  # step = value / |g|^2 = 0.5 / 2
    with pytest.raises(TypeError, match="with_extra_args_support: tx is a int"):
        ft.with_extra_args_support(3)
    # chain passes extra args on to an optax transformation that takes them.
    tx = ft.chain(ft.scale(1.0), optax.scale_by_backtracking_linesearch(3))
    f = lambda w: jnp.sum(w ** 2)  # noqa: E731
    u, _ = tx.update(2 * x, tx.init(x), x, value=f(x), grad=2 * x, value_fn=f)
    assert np.all(np.isfinite(u))
