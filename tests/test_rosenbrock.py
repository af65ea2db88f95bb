"""optax's convergence bar: Rosenbrock (a=1, b=100) from (0, 0) to (1, 1) in 10,000 steps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain as ft


def rosenbrock(p):
    x, y = p[0], p[1]
    return (1.0 - x) ** 2 + 100.0 * (y - x ** 2) ** 2


@pytest.mark.parametrize("opt", [ft.adam(1e-2), ft.lamb(1e-3), ft.sgd(1e-3, momentum=0.9)],
                         ids=["adam", "lamb", "sgd_momentum"])
def test_reaches_the_minimum(opt):
    params = jnp.zeros(2)  # one leaf, as optax's test: the trust ratio sees the vector

    @jax.jit
    def run(params):
        def step(carry, _):
            p, s = carry
            u, s = opt.update(jax.grad(rosenbrock)(p), s, p)
            return (ft.apply_updates(p, u), s), None
        return jax.lax.scan(step, (params, opt.init(params)), None, length=10_000)[0][0]

    final = run(params)
    np.testing.assert_allclose(final, [1.0, 1.0], atol=3e-2)
