"""Wrappers against optax (50 jitted steps, every step) and against hand-derived numbers."""

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from functrain.tree import MaskedNode
from test_more_optimizers import (assert_same_trajectories, make_grads, make_params,
                                  trajectory)


def by_ndim(params):
    return jax.tree_util.tree_map(lambda p: p.ndim > 1, params)


def labels_fn(params):
    return jax.tree_util.tree_map(lambda p: "matrix" if p.ndim > 1 else "vector", params)


PREFIX_MASK = {"dense": True, "layers": False, "scalar": True}
LABELS = {"dense": {"w": "a", "b": "b"}, "layers": "a", "scalar": "c"}


def nested(m):
    inner = m.multi_transform(
        {"a": m.masked(m.lamb(1e-2, weight_decay=0.1, mask=by_ndim), PREFIX_MASK),
         "b": m.chain(m.clip_by_global_norm(0.5), m.sgd(1e-2, momentum=0.9)),
         "c": m.set_to_zero()}, LABELS)
    return m.MultiSteps(inner, every_k_schedule=3).gradient_transformation()


def hyper(m):
    return m.inject_hyperparams(m.adamw)(
        learning_rate=m.linear_schedule(1e-2, 1e-3, 30), b1=0.8, weight_decay=0.05)


CASES = {
    "masked_stage": lambda m: m.chain(m.scale_by_adam(), m.masked(
        m.add_decayed_weights(0.1), by_ndim), m.scale(-1e-2)),
    "masked_chain_prefix": lambda m: m.masked(m.adam(1e-2), PREFIX_MASK),
    "masked_optimizer_with_own_mask": lambda m: m.masked(
        m.adamw(1e-2, weight_decay=0.5, mask=by_ndim), {"dense": {"w": True, "b": True},
                                                        "layers": [False], "scalar": True}),
    "masked_global_norm": lambda m: m.masked(
        m.chain(m.clip_by_global_norm(1.0), m.sgd(1e-2)), by_ndim),
    "masked_optax_inner": lambda m: m.masked(optax.rmsprop(1e-3, momentum=0.5), by_ndim),
    "multi_transform": lambda m: m.multi_transform(
        {"matrix": m.adam(1e-2), "vector": m.sgd(1e-3, momentum=0.9)}, labels_fn),
    "partition_tree_labels": lambda m: m.partition(
        {"a": m.lion(1e-3), "b": m.adamw(1e-2, weight_decay=0.5), "c": m.set_to_zero()},
        LABELS),
    "multisteps_mean": lambda m: m.MultiSteps(m.adam(1e-2), 4).gradient_transformation(),
    "multisteps_sum_schedule": lambda m: m.MultiSteps(
        m.sgd(1e-3, momentum=0.9), lambda step: 2 + step % 3,
        use_grad_mean=False).gradient_transformation(),
    "nested": nested,
    "inject_hyperparams": hyper,
    "freeze": lambda m: m.chain(m.freeze(by_ndim), m.adam(1e-2)),
    "zero_nans_ema": lambda m: m.chain(m.zero_nans(), m.ema(0.9), m.scale(-1e-2)),
    "ema_no_debias": lambda m: m.chain(m.ema(0.8, debias=False), m.sgd(1e-2)),
    "add_noise": lambda m: m.chain(m.add_noise(0.1, 0.55, jax.random.key(5)), m.sgd(1e-3)),
    "keep_params_nonnegative": lambda m: m.chain(m.sgd(1e-3), m.keep_params_nonnegative()),
    "named_chain": lambda m: m.named_chain(("clip", m.clip(1.0)), ("adam", m.adam(1e-2))),
    "apply_if_finite": lambda m: m.apply_if_finite(m.adam(1e-2), 3),
}


def with_bad_steps(grads):
    """NaN in the scalar's gradient at steps 5, 6 and 20, an Inf at step 30."""
    s = np.array(grads["scalar"])
    s[[5, 6, 20]] = np.nan
    s[30] = np.inf
    return dict(grads, scalar=jnp.asarray(s))


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_optax_every_step(name):
    params = make_params()
    grads = make_grads(params)
    if name in ("apply_if_finite", "zero_nans_ema"):
        grads = with_bad_steps(grads)
    ours = trajectory(CASES[name](ft), ft.apply_updates, params, grads)
    theirs = trajectory(CASES[name](optax), optax.apply_updates, params, grads)
    assert_same_trajectories(name, ours, theirs, params)


# --------------------------------------------------------------------------
# Hand-derived references
# --------------------------------------------------------------------------

def test_masked_weight_decay_by_hand():
    opt = ft.chain(ft.masked(ft.add_decayed_weights(0.1), {"w": True, "b": False}),
                   ft.sgd(0.5))
    params = {"w": jnp.array([2., -4.]), "b": jnp.array([3.])}
    state = opt.init(params)
    grads = {"w": jnp.array([1., 1.]), "b": jnp.array([1.])}
    for _ in range(3):
        u, state = opt.update(grads, state, params)
        expected_w = params["w"] - 0.5 * (grads["w"] + 0.1 * params["w"])
        expected_b = params["b"] - 0.5 * grads["b"]
        params = ft.apply_updates(params, u)
        np.testing.assert_allclose(params["w"], expected_w, rtol=1e-6)
        np.testing.assert_allclose(params["b"], expected_b, rtol=1e-6)


def test_masked_out_leaves_hold_no_state():
    params = {"w": jnp.ones((3, 3)), "b": jnp.ones(3)}
    state = ft.masked(ft.adam(1e-2), {"w": True, "b": False}).init(params)
    adam_state = state.inner_state[0]
    assert isinstance(adam_state.mu["b"], MaskedNode)
    assert isinstance(adam_state.nu["b"], MaskedNode)
    assert [x.shape for x in jax.tree_util.tree_leaves(state)] == [(), (3, 3), (3, 3)]
    frozen = ft.freeze({"w": True, "b": False}).init(params)
    assert jax.tree_util.tree_leaves(frozen) == []
    # multi_transform: each group's optimizer holds state for its own leaves only.
    state = ft.multi_transform({"x": ft.adam(1e-2), "y": ft.sgd(0.1, momentum=0.9)},
                               {"w": "x", "b": "y"}).init(params)
    assert [x.shape for x in jax.tree_util.tree_leaves(state.inner_states["x"])] == \
        [(), (3, 3), (3, 3)]
    assert [x.shape for x in jax.tree_util.tree_leaves(state.inner_states["y"])] == [(3,)]


def test_multisteps_k4_by_hand():
    opt = ft.MultiSteps(ft.sgd(0.1, momentum=0.5), every_k_schedule=4)
    params = {"w": jnp.zeros(2)}
    state = opt.init(params)
    rng = np.random.default_rng(0)
    gs = [jnp.asarray(rng.standard_normal(2), jnp.float32) for _ in range(8)]
    step = jax.jit(opt.update)
    outs = []
    for g in gs:
        u, state = step({"w": g}, state, params)
        outs.append((np.asarray(u["w"]), bool(opt.has_updated(state))))
    mean1, mean2 = np.mean(gs[:4], axis=0), np.mean(gs[4:], axis=0)
    for i in (0, 1, 2, 4, 5, 6):
        np.testing.assert_array_equal(outs[i][0], 0.0)
        assert not outs[i][1]
    np.testing.assert_allclose(outs[3][0], -0.1 * mean1, rtol=1e-6)
    np.testing.assert_allclose(outs[7][0], -0.1 * (mean2 + 0.5 * mean1), rtol=1e-6)
    assert outs[3][1] and outs[7][1]
    assert int(state.gradient_step) == 2 and int(state.mini_step) == 0


def test_multisteps_skip_function_rejects_a_micro_batch():
    opt = ft.MultiSteps(ft.sgd(1.0), 2, should_skip_update_fn=optax.skip_not_finite)
    state = opt.init([jnp.zeros(1)])
    u, state = opt.update([jnp.array([jnp.nan])], state)
    assert int(state.mini_step) == 0 and int(state.skip_state["num_not_finite"]) == 1
    u, state = opt.update([jnp.array([2.])], state)
    u, state = opt.update([jnp.array([4.])], state)
    np.testing.assert_allclose(u[0], [-3.0])


def test_apply_if_finite_nan_step_by_hand():
    opt = ft.apply_if_finite(ft.sgd(0.1, momentum=0.9), max_consecutive_errors=2)
    params = [jnp.array([1.0])]
    state = opt.init(params)
    u, state = opt.update([jnp.array([2.0])], state)
    np.testing.assert_allclose(u[0], [-0.2])
    u, state = opt.update([jnp.array([jnp.nan])], state)
    np.testing.assert_array_equal(u[0], [0.0])
    np.testing.assert_allclose(state.inner_state[0].trace[0], [2.0])  # untouched
    assert int(state.notfinite_count) == 1 and not bool(state.last_finite)
    u, state = opt.update([jnp.array([1.0])], state)
    np.testing.assert_allclose(u[0], [-0.1 * (1.0 + 0.9 * 2.0)], rtol=1e-6)
    assert int(state.notfinite_count) == 0 and int(state.total_notfinite) == 1


def test_apply_if_finite_counter_resets_after_forced_update():
    # optax keeps counting after giving up, so every later bad step is applied;
    # here the counter restarts and the next bad steps are skipped again.
    opt = ft.apply_if_finite(ft.sgd(1.0), max_consecutive_errors=2)
    state = opt.init([jnp.zeros(1)])
    bad = [jnp.array([jnp.inf])]
    applied = []
    for _ in range(6):
        u, state = opt.update(bad, state)
        applied.append(bool(np.all(np.asarray(u[0]) != 0)))
    assert applied == [False, False, True, False, False, True]
    assert int(state.total_notfinite) == 6 and int(state.notfinite_count) == 0


def test_inject_hyperparams_lr_change_by_hand():
    opt = ft.inject_hyperparams(ft.sgd)(learning_rate=0.1, momentum=0.9)
    params = [jnp.array([0.0])]
    state = opt.init(params)
    step = jax.jit(opt.update)
    trace, expected, got = 0.0, [], []
    for t, g in enumerate([1.0, 2.0, -1.0, 0.5]):
        if t == 2:
            state.hyperparams["learning_rate"] = 0.01
        lr = 0.1 if t < 2 else 0.01
        trace = g + 0.9 * trace
        expected.append(-lr * trace)
        u, state = step([jnp.array([g])], state)
        got.append(float(u[0][0]))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert step._cache_size() == 1


def test_inject_hyperparams_compiles_once_for_three_learning_rates():
    opt = ft.inject_hyperparams(ft.adam)(learning_rate=0.1)
    params = {"w": jnp.ones(3)}
    state = opt.init(params)

    @jax.jit
    def train_step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return ft.apply_updates(params, updates), state

    seen = []
    for lr in (0.1, np.float32(0.05), jnp.asarray(0.01, jnp.float32)):
        state.hyperparams["learning_rate"] = lr
        new_params, state = train_step(params, state, {"w": jnp.ones(3)})
        seen.append(float(params["w"][0] - new_params["w"][0]))
        params = new_params
    np.testing.assert_allclose(seen, [0.1, 0.05, 0.01], rtol=1e-4)
    assert train_step._cache_size() == 1


def test_inject_hyperparams_schedule_and_static_args():
    opt = ft.inject_hyperparams(ft.sgd, static_args="nesterov")(
        learning_rate=lambda count: 0.1 * (count + 1), nesterov=False)
    state = opt.init([jnp.zeros(1)])
    us = []
    for _ in range(3):
        u, state = opt.update([jnp.ones(1)], state)
        us.append(float(u[0][0]))
    np.testing.assert_allclose(us, [-0.1, -0.2, -0.3], rtol=1e-6)
    np.testing.assert_allclose(state.hyperparams["learning_rate"], 0.3, rtol=1e-6)
    assert "nesterov" not in state.hyperparams
    with pytest.raises(ValueError, match="static_args"):
        ft.inject_hyperparams(ft.sgd, static_args=("not_an_argument",))


# --------------------------------------------------------------------------
# Precision, jit/scan/sharding, empty trees
# --------------------------------------------------------------------------

def test_multisteps_bf16_params_fp32_grads():
    params = {"w": jnp.asarray([1.0, -2.0, 3.0], jnp.bfloat16)}
    opt = ft.MultiSteps(ft.adafactor(1e-2), every_k_schedule=2)
    state = opt.init(params)
    rng = np.random.default_rng(0)
    gs = jnp.asarray(rng.standard_normal((6, 3)), jnp.float32)

    def body(carry, g):
        p, s = carry
        u, s = opt.update({"w": g}, s, p)
        return (ft.apply_updates(p, u), s), u["w"]

    (final, state), us = jax.jit(lambda p, s: jax.lax.scan(body, (p, s), gs))(params, state)
    assert final["w"].dtype == jnp.bfloat16 and us.dtype == jnp.float32
    assert state.acc_grads["w"].dtype == jnp.float32
    # Same as float32 params run through the same wrapper, up to bf16 rounding.
    ref = {"w": params["w"].astype(jnp.float32)}
    ref_state = opt.init(ref)
    for t in range(6):
        u, ref_state = opt.update({"w": gs[t]}, ref_state, ref)
        np.testing.assert_allclose(us[t], u["w"], rtol=2e-2, atol=1e-4)
        ref = ft.apply_updates(ref, u)
    np.testing.assert_array_equal(np.asarray(us[0]), 0.0)
    assert np.all(np.asarray(us[1]) != 0)


def test_multisteps_under_shard_map():
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
    spec = jax.sharding.PartitionSpec()
    opt = ft.MultiSteps(ft.adam(0.1), 2)
    params = {"w": jnp.ones(4)}
    state = opt.init(params)

    @jax.jit
    def step(params, state, g):
        def inner(params, state, g):
            u, state = opt.update(g, state, params)
            return ft.apply_updates(params, u), state
        return jax.shard_map(inner, mesh=mesh, in_specs=(spec, spec, spec),
                             out_specs=(spec, spec))(params, state, g)

    for g in (1.0, 3.0):
        params, state = step(params, state, {"w": jnp.full(4, g)})
    np.testing.assert_allclose(params["w"], 0.9, rtol=1e-5)


def test_multisteps_on_two_devices_in_a_subprocess():
    code = textwrap.dedent("""
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        import jax, jax.numpy as jnp, numpy as np, functrain as ft
        from jax.sharding import NamedSharding, PartitionSpec as P
        mesh = jax.make_mesh((2,), ("d",))
        shard = NamedSharding(mesh, P("d"))
        opt = ft.MultiSteps(ft.adam(0.1), 2).gradient_transformation()
        params = {"w": jax.device_put(jnp.ones(4), shard)}
        state = opt.init(params)
        step = jax.jit(lambda p, s, g: opt.update(g, s, p))
        for g in (1.0, 3.0):
            u, state = step(params, state, {"w": jax.device_put(jnp.full(4, g), shard)})
        assert u["w"].sharding.is_equivalent_to(shard, 1), u["w"].sharding
        np.testing.assert_allclose(u["w"], -0.1, rtol=1e-5)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize("make", [
    lambda: ft.masked(ft.adam(0.1), {}),
    lambda: ft.multi_transform({"a": ft.adam(0.1)}, {}),
    lambda: ft.MultiSteps(ft.adam(0.1), 2).gradient_transformation(),
    lambda: ft.apply_if_finite(ft.adam(0.1), 2),
    lambda: ft.inject_hyperparams(ft.adam)(0.1),
    lambda: ft.named_chain(("a", ft.adam(0.1))),
    lambda: ft.chain(ft.zero_nans(), ft.ema(0.9), ft.add_noise(0.1, 0.5, 0),
                     ft.keep_params_nonnegative(), ft.freeze({})),
], ids=["masked", "multi_transform", "MultiSteps", "apply_if_finite", "inject_hyperparams",
        "named_chain", "per_leaf"])
def test_empty_params(make):
    opt = make()
    state = opt.init({})
    updates, state = jax.jit(lambda s: opt.update({}, s, {}))(state)
    assert updates == {}


# --------------------------------------------------------------------------
# Errors name the wrapper and the key path
# --------------------------------------------------------------------------

def test_mask_that_does_not_fit_names_path_and_wrapper():
    params = {"encoder": {"w": jnp.ones(2)}, "decoder": {"w": jnp.ones(2)}}
    with pytest.raises(ValueError, match=r"masked.*\['decoder'\]|\['decoder'\].*masked"):
        ft.masked(ft.adam(0.1), {"encoder": True}).init(params)
    with pytest.raises(ValueError, match=r"masked.*\['decoder'\]|\['decoder'\].*masked"):
        ft.masked(ft.add_decayed_weights(0.1), {"encoder": True}).init(params)
    with pytest.raises(ValueError, match=r"freeze.*\['decoder'\]|\['decoder'\].*freeze"):
        ft.freeze({"encoder": True, "head": False}).init(params)


def test_labels_that_do_not_fit_name_path_and_wrapper():
    params = {"encoder": {"w": jnp.ones(2)}, "decoder": {"w": jnp.ones(2)}}
    with pytest.raises(ValueError,
                       match=r"multi_transform.*\['decoder'\]|\['decoder'\].*multi_transform"):
        ft.multi_transform({"a": ft.adam(0.1)}, {"encoder": "a"}).init(params)


def test_label_without_transform_and_unused_transform_list_both_sides():
    params = {"w": jnp.ones(2), "b": jnp.ones(2)}
    with pytest.raises(ValueError, match=r"\['c'\] have no transformation.*\['a', 'c'\].*"
                                         r"\['a', 'b'\]"):
        ft.multi_transform({"a": ft.adam(0.1), "b": ft.sgd(0.1)},
                           {"w": "a", "b": "c"}).init(params)
    with pytest.raises(ValueError, match=r"\['b'\] are used by no leaf.*\['a'\].*\['a', 'b'\]"):
        ft.multi_transform({"a": ft.adam(0.1), "b": ft.sgd(0.1)},
                           {"w": "a", "b": "a"}).init(params)


def test_wrong_state_is_named():
    params = [jnp.ones(1)]
    with pytest.raises(TypeError, match="MultiSteps"):
        ft.MultiSteps(ft.sgd(0.1), 2).update(params, (), params)
    with pytest.raises(TypeError, match="apply_if_finite"):
        ft.apply_if_finite(ft.sgd(0.1), 2).update(params, (), params)
    with pytest.raises(ValueError, match="named_chain"):
        ft.named_chain(("a", ft.sgd(0.1))).update(params, {"b": ()}, params)
    with pytest.raises(ValueError, match="every_k_schedule"):
        ft.MultiSteps(ft.sgd(0.1), 0)
    with pytest.raises(ValueError, match="unique"):
        ft.named_chain(("a", ft.sgd(0.1)), ("a", ft.sgd(0.1)))


def test_functrain_wrappers_accept_optax_and_optax_chain_accepts_them():
    opt = optax.chain(ft.masked(optax.adam(0.1), {"w": True, "b": False}),
                      ft.apply_if_finite(optax.scale(1.0), 1))
    params = {"w": jnp.ones(2), "b": jnp.ones(2)}
    u, _ = opt.update({"w": jnp.ones(2), "b": jnp.ones(2)}, opt.init(params), params)
    np.testing.assert_allclose(u["w"], -0.1, rtol=1e-5)
    np.testing.assert_allclose(u["b"], 1.0)



@pytest.mark.parametrize("make", [
    lambda: ft.masked(ft.adamw(0.1, mask=by_ndim), {"w": True, "b": False}),
    lambda: ft.multi_transform({"x": ft.adam(0.1), "y": ft.lion(0.1)}, {"w": "x", "b": "y"}),
    lambda: ft.MultiSteps(ft.adam(0.1), 2).gradient_transformation(),
    lambda: ft.apply_if_finite(ft.adam(0.1), 2),
    lambda: ft.inject_hyperparams(ft.adamw)(0.1, b1=0.9, b2=0.9),
    lambda: ft.named_chain(("ema", ft.ema(0.9)), ("sgd", ft.sgd(0.1, momentum=0.9))),
], ids=["masked", "multi_transform", "MultiSteps", "apply_if_finite", "inject_hyperparams",
        "named_chain"])
def test_state_can_be_donated_and_abstractly_initialised(make):
    opt = make()
    params = {"w": jnp.ones((2, 2)), "b": jnp.ones(2)}
    abstract = jax.eval_shape(opt.init, params)
    state = opt.init(params)
    assert jax.tree_util.tree_structure(abstract) == jax.tree_util.tree_structure(state)
    buffers = [id(x) for x in jax.tree_util.tree_leaves(state)]
    assert len(buffers) == len(set(buffers))
    step = jax.jit(lambda p, s, g: opt.update(g, s, p), donate_argnums=1)
    for _ in range(2):
        _, state = step(params, state, {"w": jnp.ones((2, 2)), "b": jnp.ones(2)})
    jax.block_until_ready(state)


def test_stage_mask_inside_a_placeholder_tree_hits_the_right_leaves():
    """A masked optimizer behind apply_if_finite inside masked: flags index real leaves."""
    params = {'a': jnp.array([1.]), 'b': jnp.array([1.]), 'c': jnp.array([1.])}
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    results = []
    for lib in (ft, optax):
        opt = lib.masked(lib.apply_if_finite(
            lib.adamw(0.1, weight_decay=0.5, mask={'a': True, 'b': False, 'c': False}), 2),
            {'a': False, 'b': True, 'c': True})
        results.append(opt.update(grads, opt.init(params), params)[0])
    for x, y in zip(jax.tree_util.tree_leaves(results[0]), jax.tree_util.tree_leaves(results[1])):
        np.testing.assert_allclose(x, y, rtol=1e-6)
