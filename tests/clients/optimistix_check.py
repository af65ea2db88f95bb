"""optimistix's ``OptaxMinimiser`` driven by whatever ``import optax`` gives: run by
``make clients`` (tests/clients/run_clients.py) once with optax and once with functrain in its
place, and the two runs compared (outcomes, and every argmin bit for bit).

optimistix's released sources (its PyPI sdist) carry no tests, so this file is what CI can
run: the uses of optax that optimistix's own ``tests/test_minimise.py`` makes (``adam``,
``lbfgs`` with its default line search, ``sgd`` chained with the zoom and the backtracking
line searches; float64, forward and reverse autodiff, auxiliary outputs, the derivative of the
argmin through the solve, and a second solver with a different array learning rate that must
not recompile), on textbook test functions whose minima are known in closed form. Given a
checkout of optimistix (``OPTIMISTIX_SRC``), ``make clients`` runs its own test file too.

Not collected by ``make test`` (not named ``test_*.py``).
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax  # functrain, when run under tests/clients/functrain_as_optax.py
import optimistix as optx
import pytest

jax.config.update("jax_enable_x64", True)  # as optimistix's tests run (its own process)

TOL = 1e-8  # the solvers' rtol and atol, as optimistix's tests use


def solvers():
    return {
        "adam": lambda: optx.OptaxMinimiser(optax.adam(learning_rate=3e-3), rtol=TOL, atol=TOL),
        "lbfgs": lambda: optx.OptaxMinimiser(optax.lbfgs(), rtol=TOL, atol=TOL),
        "sgd+zoom": lambda: optx.OptaxMinimiser(
            optax.chain(optax.sgd(learning_rate=1.0),
                        optax.scale_by_zoom_linesearch(15, curv_rtol=jnp.inf)),
            rtol=TOL, atol=TOL),
        "sgd+backtracking": lambda: optx.OptaxMinimiser(
            optax.chain(optax.sgd(learning_rate=1.0),
                        optax.scale_by_backtracking_linesearch(15)),
            rtol=TOL, atol=TOL),
    }


# Test functions (f(y, args) over a pytree y) with their minimum value and a start.
def bowl(y, matrix):
    return y @ matrix @ y  # minimum 0 at 0 for a positive definite matrix


def himmelblau(y, args):
    a, b = y
    c1, c2 = args
    return (a ** 2 + b - c1) ** 2 + (a + b ** 2 - c2) ** 2  # 0 at (3, 2) for c = (11, 7)


def matyas(y, args):
    a, b = y
    c1, c2 = args
    return c1 * (a ** 2 + b ** 2) - c2 * a * b  # 0 at (0, 0)


def beale(y, args):
    a, b = y
    c1, c2, c3 = args
    return ((c1 - a + a * b) ** 2 + (c2 - a + a * b ** 2) ** 2
            + (c3 - a + a * b ** 3) ** 2)  # 0 at (3, 0.5) for c = (1.5, 2.25, 2.625)


def problems():
    rng = np.random.default_rng(0)
    m = rng.normal(size=(3, 3))
    return {
        "bowl": (bowl, jnp.array([1.0, -0.5, 2.0]), jnp.asarray(m @ m.T + np.eye(3))),
        "himmelblau": (himmelblau, [jnp.array(2.0), jnp.array(2.5)],
                       (jnp.array(11.0), jnp.array(7.0))),
        "matyas": (matyas, [jnp.array(6.0), jnp.array(6.0)], (jnp.array(0.26), jnp.array(0.48))),
        "beale": (beale, [jnp.array(2.0), jnp.array(0.0)],
                  (jnp.array(1.5), jnp.array(2.25), jnp.array(2.625))),
    }


def record(request, value):
    """Append the solution to the file the runner compares across the two runs."""
    out = os.environ.get("FUNCTRAIN_CLIENTS_VALUES")
    if out:
        leaves = [np.asarray(x, np.float64).ravel().tolist()
                  for x in jax.tree_util.tree_leaves(value)]
        with open(out, "a") as f:
            f.write(json.dumps({"test": request.node.nodeid, "value": leaves}) + "\n")


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
@pytest.mark.parametrize("solver", sorted(solvers()))
@pytest.mark.parametrize("problem", sorted(problems()))
def test_minimise(request, problem, solver, mode):
    fn, y0, args = problems()[problem]
    has_aux = mode == "bwd"  # each mode once with and once without an auxiliary output
    f = (lambda y, a: (fn(y, a), {"aux": jnp.ones(2)})) if has_aux else fn
    with jax.numpy_dtype_promotion("standard"):
        sol = optx.minimise(f, solvers()[solver](), y0, args=args, has_aux=has_aux,
                            options=dict(autodiff_mode=mode), max_steps=10_000, throw=False)
    record(request, sol.value)
    assert abs(float(fn(sol.value, args))) < 1e-4


@pytest.mark.parametrize("solver", ["lbfgs", "sgd+zoom"])
def test_derivative_of_the_argmin(request, solver):
    # argmin_y (y - c)^T A (y - c) = c, so d argmin / dc is the identity (through optimistix's
    # implicit differentiation of the solve).
    _, _, matrix = problems()["bowl"]

    def argmin(c):
        fn = lambda y, c: (y - c) @ matrix @ (y - c)
        with jax.numpy_dtype_promotion("standard"):
            return optx.minimise(fn, solvers()[solver](), jnp.zeros(3), args=c,
                                 max_steps=10_000).value

    c = jnp.array([0.3, -1.0, 2.0])
    jacobian = jax.jacfwd(argmin)(c)
    record(request, jacobian)
    np.testing.assert_allclose(jacobian, np.eye(3), atol=1e-6)


def test_a_new_solver_with_another_array_learning_rate_does_not_recompile():
    calls = []

    def f(x, _):
        calls.append(None)  # once per trace of the loss
        return x ** 2

    def solver(lr):
        return optx.OptaxMinimiser(
            optax.chain(optax.adam(jnp.array(lr)),
                        optax.scale_by_schedule(optax.piecewise_constant_schedule(
                            1, {200: 0.1}))), rtol=1e-3, atol=1e-3)

    with jax.numpy_dtype_promotion("standard"):
        first = optx.minimise(f, solver(1e-3), 1.0, throw=False)
        traced = len(calls)
        second = optx.minimise(f, solver(1e-2), 1.0, throw=False)
    assert len(calls) == traced
    assert float(first.value) != float(second.value)  # the new rate was used, not the old
