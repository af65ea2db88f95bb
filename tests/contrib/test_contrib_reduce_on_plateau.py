"""functrain.contrib.reduce_on_plateau against optax.contrib, and its rules by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest

import functrain
from functrain.contrib import ReduceLROnPlateauState, reduce_on_plateau
from helpers import assert_same_trajectory

# Falling, then flat with noise, then falling again: improvements, plateaus, cooldowns.
VALUES = np.concatenate([np.linspace(2.0, 1.0, 10), 1.0 + 0.01 * np.sin(np.arange(30)),
                         np.linspace(1.0, 0.5, 10)]).astype(np.float32)


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(factor=0.5, patience=2, cooldown=2, atol=0.01, min_scale=0.1),
    dict(factor=0.3, patience=1, rtol=0.0, atol=1e-3, accumulation_size=3),
])
def test_state_matches_optax_at_every_step(kwargs):
    ours, theirs = reduce_on_plateau(**kwargs), optax.contrib.reduce_on_plateau(**kwargs)
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    steps = [jax.jit(lambda u, s, v, tx=tx: tx.update(u, s, params, value=v))
             for tx in (ours, theirs)]
    s1, s2 = ours.init(params), theirs.init(params)
    scales = set()
    for v in VALUES:
        u1, s1 = steps[0](params, s1, v)
        u2, s2 = steps[1](params, s2, v)
        for a, b in zip(s1, s2):
            np.testing.assert_allclose(a, b, rtol=1e-6)
        np.testing.assert_allclose(u1["w"], u2["w"], rtol=1e-6)
        scales.add(float(s1.scale))
    assert len(scales) > 1  # the scale was reduced at least once


def test_optax_state_is_taken():
    # optax's tests (and migrating code) build optax.contrib.ReduceLROnPlateauState by hand:
    # one step on the edge of patience reduces the scale as optax does.
    state = optax.contrib.ReduceLROnPlateauState(
        scale=jnp.asarray(1.0), best_value=jnp.asarray(1.0), plateau_count=jnp.asarray(1),
        cooldown_count=jnp.asarray(0), count=jnp.asarray(0), avg_value=jnp.asarray(0.0))
    params = {"w": jnp.ones(3)}
    ours = jax.jit(lambda s: reduce_on_plateau(patience=2, factor=0.5).update(
        params, s, params, value=jnp.asarray(2.0)))(state)
    theirs = optax.contrib.reduce_on_plateau(patience=2, factor=0.5).update(
        params, state, params, value=jnp.asarray(2.0))
    assert type(ours[1]) is ReduceLROnPlateauState
    assert float(ours[1].scale) == float(theirs[1].scale) == 0.5
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_chained_after_sgd_matches_optax():
    def value_grads(p):
        return jax.tree_util.tree_map(lambda x: x - 0.5, p)
    ours = functrain.chain(functrain.sgd(0.3), reduce_on_plateau(patience=2, factor=0.5))
    theirs = optax.chain(optax.sgd(0.3), optax.contrib.reduce_on_plateau(patience=2,
                                                                         factor=0.5))
    assert_same_trajectory(ours, theirs, grads=value_grads, steps=40, with_value=True)


def test_rules_by_hand():
    tx = reduce_on_plateau(factor=0.5, patience=2, cooldown=1)
    params = {"w": jnp.ones(1)}
    state = tx.init(params)
    scales = []
    for v in [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5]:
        u, state = tx.update(params, state, params, value=v)
        scales.append(float(u["w"][0]))
    # best=1 after step 1; plateaus at steps 2, 3 -> halve at 3; step 4 is the cooldown;
    # plateaus at 5, 6 -> halve at 6; 0.5 improves.
    assert scales == [1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25]
    assert float(state.best_value) == 0.5


def test_state_dtypes_and_shapes_alone():
    params = {"a": jnp.ones(2, jnp.bfloat16), "b": jnp.ones(2, jnp.float32)}
    state = reduce_on_plateau().init(params)
    assert isinstance(state, ReduceLROnPlateauState)
    assert state.scale.dtype == jnp.bfloat16 and state.best_value.dtype == jnp.float32
    shapes = jax.eval_shape(reduce_on_plateau().init, params)
    assert shapes.scale.dtype == jnp.bfloat16
    opt = functrain.chain(functrain.sgd(0.1), reduce_on_plateau())
    assert isinstance(opt.init(params)[1], ReduceLROnPlateauState)


def test_errors():
    with pytest.raises(ValueError, match="factor"):
        reduce_on_plateau(factor=1.5)
    with pytest.raises(ValueError, match="factor"):
        reduce_on_plateau(factor=0.0)
    with pytest.raises(ValueError, match="rtol and atol"):
        reduce_on_plateau(rtol=0.0, atol=0.0)
    with pytest.raises(ValueError, match="rtol"):
        reduce_on_plateau(rtol=1.5)
    with pytest.raises(ValueError, match="atol"):
        reduce_on_plateau(atol=-1.0)
    with pytest.raises(ValueError, match="accumulation_size"):
        reduce_on_plateau(accumulation_size=0)
    tx = reduce_on_plateau()
    params = {"w": jnp.ones(2)}
    with pytest.raises(ValueError, match="value"):
        tx.update(params, tx.init(params), params)
    with pytest.raises(TypeError, match=r"\['i'\] has dtype bool"):
        tx.init({"i": jnp.ones(2, jnp.bool_)})
