"""functrain.engine.protocol: the protocol, LeafStage, step counters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain as ft
from functrain.engine import protocol as base
from functrain.engine.protocol import GradientTransformation, LeafStage


def test_step_counter_saturates_instead_of_wrapping():
    opt = ft.adam(1e-3)
    params = jnp.ones(2)
    state = opt.init(params)
    top = jnp.iinfo(jnp.int32).max
    adam_state = state[0]._replace(count=jnp.asarray(top - 1, jnp.int32))
    state = (adam_state,) + state[1:]
    for _ in range(3):
        updates, state = opt.update(jnp.ones(2), state)
        assert int(state[0].count) == top
        assert bool(jnp.all(jnp.isfinite(updates)))


def test_safe_increment_and_counters():
    top = jnp.iinfo(jnp.int8).max
    assert int(base.safe_increment(jnp.asarray(top - 1, jnp.int8))) == top
    saturated = base.safe_increment(jnp.asarray(top, jnp.int8))
    assert int(saturated) == top and saturated.dtype == jnp.int8
    assert float(base.safe_increment(jnp.asarray(2.5))) == 3.5
    count = base.zero_count()["count"]
    assert count.dtype == jnp.int32 and int(count) == 0
    ctx, glob = base.count_only({"count": count}, None)
    assert ctx is None and int(glob["count"]) == 1


def test_gradient_transformation_is_a_plain_pair():
    tx = GradientTransformation(lambda p: (), lambda u, s, p=None: (u, s))
    init, update = tx  # unpacks like optax's
    assert init is tx.init and update is tx.update
    assert tuple(GradientTransformation._fields) == ("init", "update")
    assert ft.EmptyState() == () and jax.tree_util.tree_leaves(ft.EmptyState()) == []


def test_leaf_stage_is_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        LeafStage("double", lambda g, s, p, c: (2 * g, ()))  # noqa
    stage = LeafStage(name="double", update_leaf=lambda g, s, p, c: (2 * g, ()))
    with pytest.raises(Exception):  # dataclasses.FrozenInstanceError
        stage.name = "other"
    assert stage.global_fields == [] and stage.state_cls is None


def test_leaf_stage_fields_and_init_state():
    stage = LeafStage(name="adam_like", update_leaf=None, state_cls=ft.ScaleByAdamState,
                      leaf_fields=("mu", "nu"),
                      init_leaf=lambda p: (jnp.zeros_like(p), jnp.ones_like(p)),
                      init_global=base.zero_count, mask={"w": True, "b": False})
    assert stage.global_fields == ["count"]
    state = stage.init_state({"w": jnp.full(2, 3.0), "b": jnp.ones(1)})
    assert isinstance(state, ft.ScaleByAdamState) and int(state.count) == 0
    np.testing.assert_array_equal(state.nu["w"], [1.0, 1.0])
    assert isinstance(state.mu["b"], ft.MaskedNode)  # masked out: no state
    assert stage.leaf_state((1, 2)).nu == 2


def test_call_update_passes_extras_only_when_accepted():
    seen = []
    plain = GradientTransformation(lambda p: (), lambda u, s, p=None: (u, s))
    keen = GradientTransformation(lambda p: (),
                                  lambda u, s, p=None, **kw: (seen.append(kw) or u, s))
    assert not base._accepts_extra_args(plain.update) and base._accepts_extra_args(keen.update)
    u, _ = base.call_update(plain, [jnp.ones(1)], (), None, {"value": 1.0})
    np.testing.assert_array_equal(u[0], [1.0])
    base.call_update(keen, [jnp.ones(1)], (), None, {"value": 2.0})
    assert seen == [{"value": 2.0}]
