"""functrain.engine.protocol: the protocol, LeafStage, step counters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain as ft
from functrain.engine import counts
from functrain.engine import protocol as base
from functrain.engine.protocol import GradientTransformation
from functrain.engine.stage import LeafChecks, LeafStage


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
    assert int(counts.safe_increment(jnp.asarray(top - 1, jnp.int8))) == top
    saturated = counts.safe_increment(jnp.asarray(top, jnp.int8))
    assert int(saturated) == top and saturated.dtype == jnp.int8
    assert float(counts.safe_increment(jnp.asarray(2.5))) == 3.5
    count = counts.zero_count()["count"]
    assert count.dtype == jnp.int32 and int(count) == 0
    ctx, glob = counts.count_only({"count": count}, None)
    assert ctx is None and int(glob["count"]) == 1


def test_corrections_are_the_bias_corrections_by_hand():
    ctx, glob = counts.corrections(0.9, 0.99, nesterov=True)({"count": jnp.asarray(2)}, None)
    assert int(glob["count"]) == 3 and int(ctx.count) == 3
    np.testing.assert_allclose([ctx.mu, ctx.nu, ctx.next_mu, ctx.b2],
                               [1 - 0.9 ** 3, 1 - 0.99 ** 3, 1 - 0.9 ** 4, 0.99],
                               atol=2 ** -22)  # float32 powers: a few ulps of 1
    ctx, _ = counts.corrections(None, None)({"count": jnp.asarray(0)}, None)
    assert ctx.mu is None and ctx.nu is None and ctx.next_mu is None


def test_a_stages_input_checks_are_one_field():
    stage = LeafStage(name="s", update_leaf=lambda g, s, p, c: (g, ()),
                      checks=LeafChecks(needs_params=True, real_only=True))
    assert (stage.needs_params, stage.real_only, stage.any_dtype, stage.shaped_fields) == (
        True, True, False, None)
    with pytest.raises(TypeError):
        LeafStage(name="s", update_leaf=lambda g, s, p, c: (g, ()), real_only=True)  # noqa
    tx = ft.stage_transform(stage)
    params = {"w": jnp.ones(2, jnp.complex64)}
    with pytest.raises(TypeError, match=r"\['w'\]"):
        tx.init(params)
    with pytest.raises(ValueError, match="params"):
        ft.stage_transform(LeafStage(name="s", update_leaf=lambda g, s, p, c: (g, ()),
                                     checks=LeafChecks(needs_params=True))).update(
            {"w": jnp.ones(2)}, ft.EmptyState())


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
                      init_global=counts.zero_count, mask={"w": True, "b": False})
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


def test_functrain_transformations_are_optax_transformations_where_optax_is_installed():
    """With optax installed, every functrain transformation is an optax.GradientTransformation
    (an ExtraArgs one is optax's ExtraArgs), so libraries that check optax's types (numpyro's
    SVI) take it; optax's chain then passes extra keywords (Polyak's value=) on to it."""
    import optax
    for tx in (ft.adam(0.1), ft.chain(ft.clip(1.0), ft.sgd(0.1)), ft.contrib.muon(1e-2),
               ft.inject_hyperparams(ft.adam)(learning_rate=0.1),
               GradientTransformation(lambda p: (), lambda u, s, p=None: (u, s))):
        assert isinstance(tx, optax.GradientTransformation), type(tx).__mro__
    assert isinstance(ft.adam(0.1), optax.GradientTransformationExtraArgs)
    params = {"w": jnp.asarray([1.0, -2.0, 0.5])}
    both = optax.chain(ft.polyak_sgd(max_learning_rate=10.0), optax.scale(1.0))
    updates, _ = both.update(params, both.init(params), params, value=jnp.asarray(2.0))
    # Polyak's step: value / ||g||^2 (f_min = 0), times -g.
    np.testing.assert_allclose(updates["w"], -2.0 / 5.25 * params["w"], rtol=1e-6)


SCRIPT_WITHOUT_OPTAX = """
import sys
sys.modules["optax"] = None  # import optax fails, as where it is not installed
import jax.numpy as jnp, functrain
assert functrain.GradientTransformation.__mro__[1].__module__ == "functrain.engine.protocol"
opt = functrain.adam(0.5)
params = {"w": jnp.ones(2)}
updates, _ = opt.update(params, opt.init(params), params)
print(float(updates["w"][0]))
"""


@pytest.mark.parametrize("env", [{}, {"FUNCTRAIN_OPTAX_TYPES": "0"}])
def test_without_optax_the_classes_are_plain_named_tuples(env):
    """Without optax (hidden from the import, or switched off), functrain's classes are
    plain two-field NamedTuples of its own and an optimizer steps as before."""
    import os
    import subprocess
    import sys
    script = SCRIPT_WITHOUT_OPTAX if not env else SCRIPT_WITHOUT_OPTAX.replace(
        'sys.modules["optax"] = None', "import optax")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-2000:]
    # Adam's first step is -lr g / |g| up to float32's bias-correction roundings (1 - 0.999).
    assert abs(float(out.stdout.split()[-1]) + 0.5) < 1e-5
