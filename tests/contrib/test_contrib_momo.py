"""functrain.contrib.momo and momo_adam against optax.contrib, and MoMo's first step by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest

import functrain
from functrain.contrib import MomoAdamState, MomoState, momo, momo_adam
from functrain.jax_compat import enable_x64
from helpers import assert_same_trajectory, loss_value, make_params, trajectory


def grads_at(params):
    # A loss whose gradient is not proportional to the params (so <g, x> and ||d|| differ).
    return jax.grad(lambda p: loss_value(p) + sum(jnp.sum(jnp.sin(3 * x))
                                                  for x in jax.tree_util.tree_leaves(p)))(params)


@pytest.mark.parametrize("name,kwargs", [
    ("momo", dict()),
    ("momo", dict(learning_rate=0.5, beta=0.8, weight_decay=0.1, lower_bound=0.1,
                  adapt_lower_bound=True)),
    ("momo", dict(learning_rate=optax.linear_schedule(1.0, 0.1, 30), lower_bound=-2.0)),
    ("momo_adam", dict()),
    ("momo_adam", dict(learning_rate=0.3, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.05,
                       adapt_lower_bound=True)),
    ("momo_adam", dict(learning_rate=optax.linear_schedule(0.1, 0.01, 30), lower_bound=-1.0)),
])
def test_matches_optax_contrib(name, kwargs):
    ours = getattr(functrain.contrib, name)(**kwargs)
    theirs = getattr(optax.contrib, name)(**kwargs)
    assert_same_trajectory(ours, theirs, grads=grads_at, steps=30, with_value=True, name=name)
    final = trajectory(ours, functrain.apply_updates, make_params(), grads_at, 30, True)
    assert all(np.all(np.isfinite(x)) for x in jax.tree_util.tree_leaves(final))


def test_first_momo_step_by_hand():
    # At the first step d = g, f = loss, gamma = <g, x>: tau = min(lr, (f - lb) / ||g||^2).
    x = jnp.array([1.0, -2.0, 0.5])
    g = jnp.array([0.3, 0.1, -0.4])
    for lr, lb in [(10.0, 0.0), (0.5, 0.0), (10.0, 0.7)]:
        opt = momo(learning_rate=lr, lower_bound=lb)
        u, state = opt.update(g, opt.init(x), x, value=2.0)
        tau = min(lr, (2.0 - lb) / float(jnp.sum(g ** 2)))
        np.testing.assert_allclose(u, -tau * np.asarray(g), rtol=1e-6)
        assert isinstance(state, MomoState) and int(state.count) == 1


def test_zero_gradient_takes_no_step_and_states():
    params = make_params()
    for opt, cls in ((momo(), MomoState), (momo_adam(), MomoAdamState)):
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        u, state = opt.update(zeros, opt.init(params), params, value=1.0)
        assert all(np.all(np.asarray(x) == 0) for x in jax.tree_util.tree_leaves(u))
        assert type(state) is cls


def test_float64_and_bfloat16():
    with enable_x64(True):
        params = {"w": jnp.arange(4.0, dtype=jnp.float64) - 1.5}
        g = {"w": jnp.array([0.1, -0.3, 0.2, 0.4], jnp.float64)}
        for name in ("momo", "momo_adam"):
            ours = getattr(functrain.contrib, name)(learning_rate=0.3)
            theirs = getattr(optax.contrib, name)(learning_rate=0.3)
            u1, s1 = ours.update(g, ours.init(params), params, value=1.5)
            u2, _ = theirs.update(g, theirs.init(params), params, value=1.5)
            assert u1["w"].dtype == jnp.float64 and s1.barf.dtype == jnp.float64
            np.testing.assert_allclose(u1["w"], u2["w"], rtol=1e-12)
    p16 = {"w": jnp.ones(3, jnp.bfloat16)}
    u, state = momo_adam().update(p16, momo_adam().init(p16), p16, value=1.0)
    assert u["w"].dtype == jnp.bfloat16 and state.exp_avg["w"].dtype == jnp.bfloat16


def test_errors():
    params = {"w": jnp.ones(3)}
    opt = momo()
    with pytest.raises(ValueError, match="value=loss"):
        opt.update(params, opt.init(params), params)
    with pytest.raises(ValueError, match="parameters"):
        opt.update(params, opt.init(params), value=1.0)
    with pytest.raises(ValueError, match=r"\['w'\]"):
        opt.update({"w": jnp.ones(4)}, opt.init(params), {"w": jnp.ones(4)}, value=1.0)
    with pytest.raises(ValueError, match="momo: beta"):
        momo(beta=1.5)
    with pytest.raises(ValueError, match="momo_adam: b2"):
        momo_adam(b2=-0.1)
    with pytest.raises(ValueError, match="weight_decay"):
        momo_adam(weight_decay=-1.0)
    with pytest.raises(TypeError, match=r"\['n'\]"):
        opt.init({"n": jnp.zeros(2, jnp.int32)})
    with pytest.raises(TypeError, match="MomoState"):
        opt.update(params, momo_adam().init(params), params, value=1.0)
