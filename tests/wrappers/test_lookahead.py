"""functrain.wrappers.lookahead against optax 0.2.8: fast and slow params at every step.

30 jitted steps on a non-quadratic loss, the gradient taken at the fast params
(as the wrapper expects); each library gets its own ``LookaheadParams`` class,
so the trajectories are compared leaf by leaf, and the states at the end.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from helpers import make_params

STEPS = 30


def loss(params):
    return sum(jnp.sum(jnp.cos(x) + 0.3 * x ** 2) for x in jax.tree_util.tree_leaves(params))


def run(m, opt, steps=STEPS):
    """Params (fast and slow) after each jitted step, and the final state."""
    params = m.LookaheadParams.init_synced(make_params())

    @jax.jit
    def step(p, s):
        u, s = opt.update(jax.grad(loss)(p.fast), s, p)
        return m.apply_updates(p, u), s

    state, out = opt.init(params), []
    for _ in range(steps):
        params, state = step(params, state)
        out.append(params)
    return out, state


CASES = {
    "sgd_sync5": lambda m: m.lookahead(m.sgd(0.05, momentum=0.9), sync_period=5,
                                       slow_step_size=0.5),
    "adam_sync3_reset": lambda m: m.lookahead(m.adam(0.05), 3, 0.8, reset_state=True),
    "sgd_sync1": lambda m: m.lookahead(m.sgd(0.1), sync_period=1, slow_step_size=0.3),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_lookahead_matches_optax(case):
    ours, our_state = run(ft, CASES[case](ft))
    theirs, their_state = run(optax, CASES[case](optax))
    for t, (a, b) in enumerate(zip(ours, theirs)):
        assert type(a).__name__ == "LookaheadParams"
        for part in ("fast", "slow"):
            for x, y in zip(jax.tree_util.tree_leaves(getattr(a, part)),
                            jax.tree_util.tree_leaves(getattr(b, part))):
                np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6,
                                           err_msg=f"{case} step {t} {part}")
    # The slow params moved, and only at the synchronisations.
    slow = [np.asarray(p.slow["dense"]["w"]) for p in ours]
    changed = [t for t in range(1, STEPS) if np.any(slow[t] != slow[t - 1])]
    period = {"sgd_sync5": 5, "adam_sync3_reset": 3, "sgd_sync1": 1}[case]
    assert changed == [t for t in range(1, STEPS) if (t + 1) % period == 0]
    assert type(our_state).__name__ == "LookaheadState"
    assert int(our_state.steps_since_sync) == int(their_state.steps_since_sync)
    for x, y in zip(jax.tree_util.tree_leaves(our_state), jax.tree_util.tree_leaves(their_state)):
        assert x.dtype == y.dtype
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["sgd_sync5", "adam_sync3_reset"])
def test_optax_lookahead_params_are_taken_and_kept(case):
    # Migrating code may keep optax.LookaheadParams (and optax.apply_updates): the
    # updates come back in that class, and the numbers are optax's.
    ours, _ = run(optax, CASES[case](ft))
    theirs, _ = run(optax, CASES[case](optax))
    for a, b in zip(ours, theirs):
        assert type(a) is type(b) is optax.LookaheadParams
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6)


def test_optax_lookahead_state_is_taken():
    params = optax.LookaheadParams.init_synced(make_params())
    state = optax.lookahead(optax.sgd(0.1), 2, 0.5).init(params)  # optax's LookaheadState
    grads = jax.tree_util.tree_map(jnp.cos, params.fast)
    ours = ft.lookahead(ft.sgd(0.1), 2, 0.5).update(grads, state, params)
    theirs = optax.lookahead(optax.sgd(0.1), 2, 0.5).update(grads, state, params)
    assert type(ours[1]).__name__ == "LookaheadState"
    for x, y in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        np.testing.assert_allclose(x, y, rtol=1e-6)


def test_lookahead_sync_by_hand():
    # sgd(1) on grads 1: fast 1 -> 0 -> -1; at the 2nd step slow moves half way: 0.
    opt = ft.lookahead(ft.sgd(1.0), sync_period=2, slow_step_size=0.5)
    params = ft.LookaheadParams.init_synced(jnp.ones(()))
    state = opt.init(params)
    for expected_fast, expected_slow in [(0.0, 1.0), (0.0, 0.0)]:
        u, state = opt.update(jnp.ones(()), state, params)
        params = ft.apply_updates(params, u)
        assert (float(params.fast), float(params.slow)) == (expected_fast, expected_slow)


def test_lookahead_init_takes_plain_params_like_optax():
    params = make_params()
    a = ft.lookahead(ft.adam(0.1), 2, 0.5).init(params)
    b = optax.lookahead(optax.adam(0.1), 2, 0.5).init(params)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(x, y)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="lookahead: sync_period must be >= 1"):
        ft.lookahead(ft.sgd(0.1), sync_period=0, slow_step_size=0.5)
    with pytest.raises(TypeError, match="lookahead: slow_step_size must be a real number"):
        ft.lookahead(ft.sgd(0.1), 2, slow_step_size=None)
    with pytest.raises(TypeError, match="lookahead: fast_optimizer is a float"):
        ft.lookahead(0.1, 2, 0.5)
    opt = ft.lookahead(ft.sgd(0.1), 2, 0.5)
    params = {"w": jnp.ones(2)}
    with pytest.raises(TypeError, match="params as LookaheadParams"):
        opt.update(params, opt.init(params), params)
    pair = ft.LookaheadParams(fast={"w": jnp.ones(2)}, slow={"v": jnp.ones(2)})
    with pytest.raises(ValueError, match="different tree structures"):
        opt.update(params, opt.init(pair), pair)


def test_state_is_stable_under_scan():
    opt = ft.lookahead(ft.adam(0.1), 3, 0.5, reset_state=True)
    params = ft.LookaheadParams.init_synced({"w": jnp.ones(3, jnp.bfloat16)})

    def body(carry, _):
        p, s = carry
        u, s = opt.update(jax.tree_util.tree_map(jnp.sin, p.fast), s, p)
        return (ft.apply_updates(p, u), s), None

    (p, s), _ = jax.jit(lambda p: jax.lax.scan(body, (p, opt.init(p)), None, length=7))(params)
    assert p.fast["w"].dtype == p.slow["w"].dtype == jnp.bfloat16
    assert int(s.steps_since_sync) == 1
