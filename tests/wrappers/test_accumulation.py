"""functrain.wrappers.accumulation: MultiSteps by hand, in low precision, under shard_map and
on two devices (every step against optax in tests/parity/test_optax_parity.py)."""

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from functrain import jax_compat
from helpers import assert_empty_params_step, assert_state_donatable


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
        return shard_map(inner, mesh=mesh, in_specs=(spec, spec, spec),
                         out_specs=(spec, spec))(params, state, g)

    # jax.shard_map from JAX 0.6.1, with its replication checks on. Before, the experimental
    # one, whose replication check rejects any lax.cond whose branches differ in replication
    # (its error asks for check_rep=False): functrain's shard_map helper.
    shard_map = getattr(jax, "shard_map", None) or jax_compat.shard_map

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
    lambda: ft.MultiSteps(ft.adam(0.1), 2).gradient_transformation(),
], ids=["MultiSteps"])
def test_empty_params(make):
    assert_empty_params_step(make())


@pytest.mark.parametrize("make", [
    lambda: ft.MultiSteps(ft.adam(0.1), 2).gradient_transformation(),
], ids=["MultiSteps"])
def test_state_can_be_donated_and_abstractly_initialised(make):
    assert_state_donatable(make())
