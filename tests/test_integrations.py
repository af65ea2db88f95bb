"""functrain inside the JAX ecosystem: Flax, Equinox and Orbax.

* Flax linen: ``TrainState.create(..., tx=functrain.lamb(...))``.
* Flax NNX: ``nnx.Optimizer(model, functrain.adamw(...), wrt=nnx.Param)``.
* Equinox: ``eqx.filter`` and ``eqx.partition`` / ``eqx.combine`` training.
* Orbax: save and restore the optimizer state and a full train state, also into
  a sharded layout from ``functrain.sharding``; training continues bit-identically.

functrain inside optax (``optax.chain``, optax's wrappers) and optax inside
functrain (``functrain.chain``, functrain's wrappers) are compared step by step
in ``tests/parity/test_optax_parity.py``.

Each result is compared with something independent: the same run with optax's
optimizer (rtol 2e-5), or the same run without the framework or checkpoint in
the middle (bit for bit).

flax, equinox and orbax are optional extras of functrain (``functrain[flax]``,
``[equinox]``, ``[orbax]``) that ``make test`` installs. They are imported at
module level on purpose: if one is missing this module fails to import and the
suite fails; nothing is skipped.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from flax.training import train_state

import functrain
from helpers import matrices_only

ROOT = Path(__file__).resolve().parent.parent
RTOL, ATOL = 2e-5, 1e-6


# ----------------------------------------------------------------------------- helpers
def assert_trees_close(a, b, rtol=RTOL, atol=ATOL):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0],
                            jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol,
                                   err_msg=jax.tree_util.keystr(path))


def assert_trees_identical(a, b):
    """Same structure, dtypes and bits."""
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0],
                            jax.tree_util.tree_leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype, jax.tree_util.keystr(path)
        assert np.array_equal(x, y), (jax.tree_util.keystr(path), np.max(np.abs(x - y)))


def data(n=64, features=8, classes=3, seed=1):
    """A learnable task: labels from a fixed random linear map of the inputs."""
    kx, kw = jax.random.split(jax.random.PRNGKey(seed))
    x = jax.random.normal(kx, (n, features))
    return x, jnp.argmax(x @ jax.random.normal(kw, (features, classes)), axis=-1)


def xent(logits, y):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=-1))


def leaves_changed(before, after):
    return [not np.array_equal(np.asarray(x), np.asarray(y))
            for x, y in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after))]


# ----------------------------------------------------------------------------- Flax linen
class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.LayerNorm()(nn.Dense(16)(x)))
        return nn.Dense(3)(x)


def linen_state(tx):
    model = LinenMLP()
    x, _ = data()
    params = model.init(jax.random.PRNGKey(0), x)["params"]
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)


@jax.jit
def linen_step(state, x, y):
    def loss_fn(params):
        return xent(state.apply_fn({"params": params}, x), y)
    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def linen_train(state, steps):
    x, y = data()
    losses = []
    for _ in range(steps):
        state, loss = linen_step(state, x, y)
        losses.append(float(loss))
    return state, losses


def test_flax_train_state_with_functrain_lamb_matches_optax_lamb():
    def lamb(lib):
        schedule = lib.warmup_cosine_decay_schedule(0.0, 5e-2, 5, 30)
        return lib.chain(lib.clip_by_global_norm(1.0),
                         lib.lamb(schedule, weight_decay=1e-2, mask=matrices_only))

    ours, losses = linen_train(linen_state(lamb(functrain)), 30)
    theirs, _ = linen_train(linen_state(lamb(optax)), 30)
    assert int(ours.step) == 30
    assert losses[-1] < 0.5 * losses[0]
    assert all(leaves_changed(linen_state(lamb(functrain)).params, ours.params))
    assert_trees_close(ours.params, theirs.params)
    # Adam moments and count; the masked decay is in a MaskedState in both (the same layout).
    assert type(ours.opt_state[1][1]).__name__ == type(theirs.opt_state[1][1]).__name__
    assert_trees_close(ours.opt_state[1][0]._asdict(), theirs.opt_state[1][0]._asdict())


# ----------------------------------------------------------------------------- Flax NNX
class NnxMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.dense1 = nnx.Linear(8, 16, rngs=rngs)
        self.norm = nnx.LayerNorm(16, rngs=rngs)
        self.dense2 = nnx.Linear(16, 3, rngs=rngs)
        # Not a Param: wrt=nnx.Param must leave it out of the optimizer.
        self.calls = nnx.BatchStat(jnp.zeros((), jnp.int32))

    def __call__(self, x):
        self.calls.value += 1
        return self.dense2(nnx.relu(self.norm(self.dense1(x))))


# flax 0.11 made the model update's first argument: update(model, grads), was update(grads).
NNX_UPDATE_TAKES_MODEL = "model" in inspect.signature(nnx.Optimizer.update).parameters


def nnx_train(tx, steps):
    model = NnxMLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    x, y = data()

    @nnx.jit
    def step(model, optimizer):
        loss, grads = nnx.value_and_grad(lambda m: xent(m(x), y))(model)
        if NNX_UPDATE_TAKES_MODEL:
            optimizer.update(model, grads)
        else:  # flax before 0.11: the optimizer holds the model
            optimizer.update(grads)
        return loss

    losses = [float(step(model, optimizer)) for _ in range(steps)]
    return model, optimizer, losses


def test_flax_nnx_optimizer_with_functrain_adamw_matches_optax_adamw():
    def adamw(lib):
        return lib.adamw(1e-2, weight_decay=1e-2, mask=matrices_only)

    model, optimizer, losses = nnx_train(adamw(functrain), 25)
    ref_model, ref_optimizer, _ = nnx_train(adamw(optax), 25)
    assert int(optimizer.step.value) == 25
    assert losses[-1] < 0.5 * losses[0]
    # The BatchStat is counted by the forward pass, not touched by the optimizer.
    assert int(model.calls.value) == 25
    params = nnx.state(model, nnx.Param)
    initial = nnx.state(NnxMLP(nnx.Rngs(0)), nnx.Param)
    assert all(leaves_changed(initial, params))
    assert_trees_close(params, nnx.state(ref_model, nnx.Param))
    # Optimizer state holds moments for the 6 Param arrays only (not the BatchStat).
    mu = optimizer.opt_state[0].mu
    assert len(jax.tree_util.tree_leaves(mu)) == 6
    opt_state_type = nnx.training.optimizer.OptState  # nnx.OptState from flax 0.11
    assert_trees_close(nnx.state(optimizer, opt_state_type), nnx.state(ref_optimizer, opt_state_type))


# ----------------------------------------------------------------------------- Equinox
def eqx_model():
    return eqx.nn.MLP(8, 3, 16, depth=2, activation=jax.nn.relu, key=jax.random.PRNGKey(0))


def eqx_train_filtered(opt, steps):
    """The filter style: the model is the pytree, non-arrays filtered out."""
    model = eqx_model()
    state = opt.init(eqx.filter(model, eqx.is_inexact_array))
    x, y = data()

    @eqx.filter_jit
    def step(model, state):
        loss, grads = eqx.filter_value_and_grad(lambda m: xent(jax.vmap(m)(x), y))(model)
        updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_inexact_array))
        return eqx.apply_updates(model, updates), state, loss

    losses = []
    for _ in range(steps):
        model, state, loss = step(model, state)
        losses.append(float(loss))
    return model, state, losses


def eqx_train_partitioned(opt, steps):
    """The partition style: only the arrays go through jit, grad and functrain."""
    params, static = eqx.partition(eqx_model(), eqx.is_inexact_array)
    state = opt.init(params)
    x, y = data()

    @jax.jit
    def step(params, state):
        loss_fn = lambda p: xent(jax.vmap(eqx.combine(p, static))(x), y)
        grads = jax.grad(loss_fn)(params)
        updates, state = opt.update(grads, state, params)
        return functrain.apply_updates(params, updates), state

    for _ in range(steps):
        params, state = step(params, state)
    return eqx.combine(params, static), state


def test_equinox_filter_and_partition_with_functrain_match_optax():
    def opt(lib):
        return lib.chain(lib.clip_by_global_norm(1.0), lib.adamw(1e-2, weight_decay=1e-2))

    model, state, losses = eqx_train_filtered(opt(functrain), 25)
    ref_model, ref_state, _ = eqx_train_filtered(opt(optax), 25)
    part_model, part_state = eqx_train_partitioned(opt(functrain), 25)
    assert losses[-1] < 0.5 * losses[0]
    # The non-array fields (activation, sizes) survive untouched.
    assert model.activation is jax.nn.relu and model.depth == 2
    assert all(leaves_changed(eqx.filter(eqx_model(), eqx.is_inexact_array),
                              eqx.filter(model, eqx.is_inexact_array)))
    assert_trees_close(eqx.filter(model, eqx.is_inexact_array),
                       eqx.filter(ref_model, eqx.is_inexact_array))
    # Partition style and filter style are the same computation.
    assert_trees_close(eqx.filter(model, eqx.is_inexact_array),
                       eqx.filter(part_model, eqx.is_inexact_array), rtol=1e-6, atol=1e-7)
    assert_trees_close(state, part_state, rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------- Orbax
def plain_params():
    k1, k2 = jax.random.split(jax.random.PRNGKey(3))
    return {"dense": {"w": jax.random.normal(k1, (8, 16)) * 0.3, "b": jnp.zeros(16)},
            "out": {"w": jax.random.normal(k2, (16, 3)) * 0.3, "b": jnp.zeros(3)},
            "norm_scale": jnp.ones(16)}


def plain_loss(params, x, y):
    h = jax.nn.relu(x @ params["dense"]["w"] + params["dense"]["b"]) * params["norm_scale"]
    return xent(h @ params["out"]["w"] + params["out"]["b"], y)


def checkpointed_opt():
    schedule = functrain.warmup_cosine_decay_schedule(0.0, 1e-2, 5, 40)
    return functrain.chain(
        functrain.clip_by_global_norm(1.0),
        functrain.lamb(schedule, weight_decay=1e-2, mask=matrices_only,
                       trust_ratio_mask=matrices_only))


def make_plain_step(opt):
    x, y = data()

    def step(params, state):
        grads = jax.grad(plain_loss)(params, x, y)
        updates, state = opt.update(grads, state, params)
        return functrain.apply_updates(params, updates), state
    return jax.jit(step, donate_argnums=(0, 1))


def copy_tree(tree):
    return jax.tree_util.tree_map(jnp.copy, tree)


def test_orbax_optimizer_state_round_trip_continues_bit_identically(tmp_path):
    opt = checkpointed_opt()
    step = make_plain_step(opt)
    params = plain_params()
    state = opt.init(params)
    for _ in range(7):
        params, state = step(params, state)

    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "ckpt", {"params": params, "opt_state": state})
    checkpointer.wait_until_finished()

    target = jax.eval_shape(lambda: {"params": params, "opt_state": state})
    restored = checkpointer.restore(tmp_path / "ckpt", target)
    assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(target)
    assert_trees_identical(restored, {"params": params, "opt_state": state})

    # Continue both the in-memory run and the restored one for 10 steps.
    p_ref, s_ref = copy_tree(params), copy_tree(state)
    p_new, s_new = restored["params"], restored["opt_state"]
    for _ in range(10):
        p_ref, s_ref = step(p_ref, s_ref)
        p_new, s_new = step(p_new, s_new)
    assert_trees_identical((p_new, s_new), (p_ref, s_ref))
    assert int(s_new[1][0].count) == 17
    assert all(leaves_changed(params, p_new))


def test_orbax_full_flax_train_state_round_trip_continues_bit_identically(tmp_path):
    tx = functrain.chain(functrain.clip_by_global_norm(1.0),
                         functrain.lamb(1e-2, weight_decay=1e-2, mask=matrices_only))
    state, _ = linen_train(linen_state(tx), 5)

    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "train_state", state)
    checkpointer.wait_until_finished()
    # The restore target is an abstract TrainState: apply_fn and tx are static fields.
    abstract = jax.eval_shape(lambda: linen_state(tx))
    restored = checkpointer.restore(tmp_path / "train_state", abstract)
    assert isinstance(restored, train_state.TrainState)
    assert int(restored.step) == 5

    continued, _ = linen_train(state, 8)
    resumed, _ = linen_train(restored, 8)
    assert int(resumed.step) == 13
    assert_trees_identical((resumed.params, resumed.opt_state),
                           (continued.params, continued.opt_state))


SHARDED_RESTORE = textwrap.dedent('''
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, jax.numpy as jnp, numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import NamedSharding, PartitionSpec as P
    import functrain
    from functrain import sharding as fsh

    assert len(jax.devices()) == 8
    path = sys.argv[1]
    mesh = jax.make_mesh((4, 2), ("data", "model"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    layout = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "b2": P()}
    params = {"w1": jax.random.normal(k1, (16, 32)) * 0.2, "b1": jnp.zeros(32),
              "w2": jax.random.normal(k2, (32, 8)) * 0.2, "b2": jnp.zeros(8)}
    params = {k: jax.device_put(v, NamedSharding(mesh, layout[k])) for k, v in params.items()}
    x = jax.device_put(jax.random.normal(k3, (64, 16)), NamedSharding(mesh, P("data")))

    def loss(p):
        return jnp.mean((jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]) ** 2)

    opt = functrain.adamw(1e-2, weight_decay=1e-2)

    def step(p, s):
        u, s = opt.update(jax.grad(loss)(p), s, p)
        return functrain.apply_updates(p, u), s
    step = jax.jit(step)

    state = jax.jit(opt.init)(params)
    for _ in range(4):
        params, state = step(params, state)
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(path + "/state", {"params": params, "opt_state": state})
    ckpt.wait_until_finished()

    abstract_params = jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), params)

    def continue_(p, s, n=5):
        for _ in range(n):
            p, s = step(p, s)
        return p, s

    ref = continue_(params, state)

    def same(a, b):
        for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            assert np.array_equal(np.asarray(u), np.asarray(v))

    # 1. Restore straight into the layout opt.init gives: state follows params.
    target = {"params": abstract_params,
              "opt_state": fsh.abstract_state(opt, abstract_params)}
    restored = ckpt.restore(path + "/state", target)
    mu = restored["opt_state"][0].mu
    for k in layout:
        assert mu[k].sharding.is_equivalent_to(NamedSharding(mesh, layout[k]), mu[k].ndim), k
    same(continue_(restored["params"], restored["opt_state"]), ref)

    # 2. Restore into a ZeRO-1 layout: moments also split over the data axis.
    zero = fsh.zero_shardings(fsh.abstract_state(opt, abstract_params), mesh, "data")
    target = {"params": abstract_params,
              "opt_state": fsh.abstract_state(opt, abstract_params, zero)}
    restored = ckpt.restore(path + "/state", target)
    nu_w1 = restored["opt_state"][0].nu["w1"]
    assert nu_w1.sharding.spec == P("data", "model"), nu_w1.sharding.spec
    assert {s.data.shape for s in nu_w1.addressable_shards} == {(4, 16)}
    # The step compiled for this layout may reduce in another order, so the reference is the
    # in-memory state placed in the same layout.
    ref_zero = continue_(params, jax.device_put(state, zero))
    same(continue_(restored["params"], restored["opt_state"]), ref_zero)
    for u, v in zip(jax.tree_util.tree_leaves(ref_zero), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=2e-5, atol=1e-6)
    print("SHARDED RESTORE OK")
''')


def test_orbax_restore_into_sharded_layout_from_functrain_sharding(tmp_path):
    # 8 simulated CPU devices must be configured before JAX starts: a fresh process.
    script = tmp_path / "sharded_restore.py"
    script.write_text(SHARDED_RESTORE)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "SHARDED RESTORE OK" in proc.stdout
