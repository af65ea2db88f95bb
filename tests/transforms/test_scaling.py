"""functrain.transforms.scaling: scale, schedules, learning rates, weight decay, Polyak, zero."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from helpers import FORMULA_GRADS, FORMULA_P0, assert_updates, updates_of


def test_scale_by_hand():
    assert_updates(updates_of(ft.scale(-0.5)), [-0.5 * g for g in FORMULA_GRADS])
    assert ft.scale(2.0).init(jnp.ones(2)) == ft.EmptyState()


def test_scale_by_schedule_reads_the_count_before_incrementing():
    ours = updates_of(ft.scale_by_schedule(lambda count: 0.1 * (count + 1)))
    assert_updates(ours, [0.1 * (t + 1) * g for t, g in enumerate(FORMULA_GRADS)])
    with pytest.raises(TypeError, match="function of the step count"):
        ft.scale_by_schedule(0.1)


def test_schedule_counter_saturates():
    tx = ft.scale_by_schedule(lambda c: c.astype(jnp.float32))
    state = ft.ScaleByScheduleState(count=jnp.asarray(jnp.iinfo(jnp.int32).max, jnp.int32))
    _, state = tx.update([jnp.ones(1)], state)
    assert int(state.count) == jnp.iinfo(jnp.int32).max


def test_scale_by_learning_rate_by_hand():
    assert_updates(updates_of(ft.scale_by_learning_rate(0.1)), [-0.1 * g for g in FORMULA_GRADS])
    assert_updates(updates_of(ft.scale_by_learning_rate(0.1, flip_sign=False)),
                   [0.1 * g for g in FORMULA_GRADS])
    scheduled = updates_of(ft.scale_by_learning_rate(lambda c: 0.1 / (c + 1)))
    assert_updates(scheduled, [-0.1 / (t + 1) * g for t, g in enumerate(FORMULA_GRADS)])


def test_add_decayed_weights_by_hand():
    assert_updates(updates_of(ft.add_decayed_weights(0.1)),
                   [g + 0.1 * FORMULA_P0 for g in FORMULA_GRADS])
    scheduled = updates_of(ft.add_decayed_weights(lambda c: 0.1 * (c + 1)))
    assert_updates(scheduled, [g + 0.1 * (t + 1) * FORMULA_P0
                               for t, g in enumerate(FORMULA_GRADS)])
    params = {"w": jnp.array([1.0, 2.0]), "b": jnp.array([3.0])}
    tx = ft.add_decayed_weights(0.5, mask={"w": True, "b": False})
    u, _ = tx.update({"w": jnp.zeros(2), "b": jnp.zeros(1)}, tx.init(params), params)
    np.testing.assert_allclose(u["w"], [0.5, 1.0])
    np.testing.assert_array_equal(u["b"], [0.0])
    with pytest.raises(ValueError, match="needs the current parameters: call update"):
        tx.update(params, tx.init(params))
    with pytest.raises(ValueError, match="weight_decay"):
        ft.add_decayed_weights(-0.1)


@pytest.mark.parametrize("zero", [0, 0.0])
def test_a_zero_decay_adds_nothing_as_optax(zero):
    # optax skips a decay that is the number 0: the updates come back bit for bit (a -0.0
    # stays negative, an infinite param does not make 0 * p = NaN); params still required
    params = {"w": jnp.array([jnp.inf, 1.0, -2.0, jnp.nan])}
    grads = {"w": jnp.array([-0.0, 0.5, -0.0, 1.0])}
    for lib in (ft, optax):
        tx = lib.add_decayed_weights(zero)
        got = tx.update(grads, tx.init(params), params)[0]["w"]
        np.testing.assert_array_equal(np.asarray(got).view(np.int32),
                                      np.asarray(grads["w"]).view(np.int32))
    with pytest.raises(ValueError, match="needs the current parameters"):
        ft.add_decayed_weights(zero).update(grads, ft.EmptyState())
    # an injected zero is an array: added, as optax adds it
    tx = ft.inject_hyperparams(ft.add_decayed_weights)(weight_decay=zero)
    got = tx.update(grads, tx.init(params), params)[0]["w"]
    assert np.isnan(np.asarray(got)[0])


@pytest.mark.parametrize("variant", ["sps", "sps+"])
def test_scale_by_polyak_by_hand(variant):
    g = {"a": jnp.array([1.0, 1.0]), "b": jnp.array(2.0)}     # ||g||^2 = 6
    tx = ft.scale_by_polyak(f_min=1.0, max_learning_rate=10.0, eps=2.0, variant=variant)
    u, _ = tx.update(g, tx.init(g), value=jnp.array(5.0))   # (5 - 1) / (6 + 2) = 0.5
    np.testing.assert_allclose(u["a"], [0.5, 0.5], rtol=1e-6)
    np.testing.assert_allclose(u["b"], 1.0, rtol=1e-6)
    capped, _ = ft.scale_by_polyak(max_learning_rate=0.1).update(g, (), value=jnp.array(60.0))
    np.testing.assert_allclose(capped["b"], 0.2, rtol=1e-6)
    below, _ = tx.update(g, (), value=jnp.array(0.0))      # value under f_min
    np.testing.assert_allclose(below["b"], 0.0 if variant == "sps+" else -0.25, rtol=1e-6)
    zero, _ = tx.update({"a": jnp.zeros(2), "b": jnp.array(0.0)}, (), value=jnp.array(5.0))
    assert all(float(jnp.max(jnp.abs(x))) == 0.0 for x in zero.values())
    with pytest.raises(ValueError, match="variant"):
        ft.scale_by_polyak(variant="sps++")


def test_set_to_zero():
    tx = ft.set_to_zero()
    u, state = tx.update({"w": jnp.full(3, jnp.nan)}, tx.init({"w": jnp.ones(3)}))
    np.testing.assert_array_equal(u["w"], np.zeros(3))
    assert jnp.asarray(u["w"]).dtype == jnp.float32


def test_scale_by_learning_rate_default_none_is_identity_as_optax():
    assert inspect.signature(ft.scale_by_learning_rate).parameters["learning_rate"].default \
        is inspect.signature(optax.scale_by_learning_rate).parameters["learning_rate"].default \
        is None
    for flip_sign in (True, False):
        tx = ft.scale_by_learning_rate(flip_sign=flip_sign)
        assert tx.init(jnp.ones(4)) == ft.EmptyState()
        assert_updates(updates_of(tx), FORMULA_GRADS)
        theirs = optax.scale_by_learning_rate(None, flip_sign=flip_sign)
        u, _ = theirs.update(jnp.asarray(FORMULA_GRADS[0]), theirs.init(jnp.ones(4)))
        np.testing.assert_allclose(u, FORMULA_GRADS[0], rtol=1e-7)


@pytest.mark.parametrize("weight_decay", [0.1, lambda count: 0.1 * (count + 1)],
                         ids=["number", "schedule"])
def test_add_decayed_weights_of_none_updates_is_none_as_optax(weight_decay):
    # optax's test_none_argument: None updates give None (and a schedule still counts).
    params = (jnp.ones(2), {"a": jnp.ones(2), "b": jnp.ones(2)})
    ours, theirs = ft.add_decayed_weights(weight_decay), optax.add_decayed_weights(weight_decay)
    u1, s1 = ours.update(None, ours.init(params), params)
    u2, s2 = theirs.update(None, theirs.init(params), params)
    assert u1 is None and u2 is None
    assert [int(x) for x in jax.tree.leaves(s1)] == [int(x) for x in jax.tree.leaves(s2)]
    assert ft.add_decayed_weights(0.1).update(None, 0, params) == (None, 0)  # optax's call
    # Still a stage: a chain fuses it, and ordinary updates are unchanged.
    tx = ft.chain(ours, ft.scale(-1.0))
    u, _ = tx.update(params, tx.init(params), params)
    expected = jax.tree.map(lambda p: -(1.0 + 0.1) * p, params)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.allclose(a, b)), u, expected))
    plan = ft.engine.program.fusion_plan(tx)
    assert [type(stage).__name__ for _, stage in plan] == ["LeafStage", "LeafStage"]
