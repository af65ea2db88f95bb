"""functrain.gradient_release: each layer's optimizer step inside the backward pass.

Compared with: the ordinary step (``jax.value_and_grad`` of the whole loss, then the optimizer
on the whole tree) of the same model, in float64: for element-wise optimizers on the stacked
model itself; for per-matrix and wrapped ones (Muon, ``quantized_state``,
``compensated_params``) on the model written unrolled, each layer its own leaf, which is what
"one layer's update depends on that layer alone" means; a Flax ``nn.scan`` transformer against
its own ordinary step. The clipping by the previous step's norm against its formula.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import MuonDimensionNumbers
from functrain.jax_compat import enable_x64

LAYERS, WIDTH, VOCAB, SEQ = 3, 8, 11, 5


# ----------------------------------------------------------------------------- a plain-JAX model
def embed(rest, tokens):
    return rest["tok"][tokens] * rest["scale"]


def layer(p, x):
    h = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * p["gain"]
    return x + jnp.tanh(h @ p["w_in"]) @ p["w_out"]


def head(rest, x, tokens):
    logits = x @ rest["out"]
    logp = jax.nn.log_softmax(logits[:, :-1])
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))


def loss(params, tokens):
    x, _ = jax.lax.scan(lambda x, p: (layer(p, x), None), embed(params, tokens),
                        params["layers"])
    return head(params, x, tokens)


def unrolled_loss(params, tokens):
    x = embed(params, tokens)
    for i in range(LAYERS):
        x = layer(params[f"layer_{i}"], x)
    return head(params, x, tokens)


def make_params(dtype=jnp.float64, seed=0):
    rng = np.random.default_rng(seed)
    normal = lambda *s: jnp.asarray(0.5 * rng.normal(size=s), dtype)  # noqa: E731
    return {"tok": normal(VOCAB, WIDTH), "scale": jnp.asarray(1.0, dtype),
            "layers": {"gain": 1 + normal(LAYERS, WIDTH), "w_in": normal(LAYERS, WIDTH, 16),
                       "w_out": normal(LAYERS, 16, WIDTH)},
            "out": normal(WIDTH, VOCAB)}


def unroll(params):
    out = {k: v for k, v in params.items() if k != "layers"}
    for i in range(LAYERS):
        out[f"layer_{i}"] = jax.tree.map(lambda a: a[i], params["layers"])
    return out


def batches(n, seed=1):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.integers(0, VOCAB, size=(4, SEQ))) for _ in range(n)]


def ordinary(opt, params, data, loss_fn=loss):
    state = opt.init(params)

    @jax.jit
    def step(params, state, tokens):
        value, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, state = opt.update(grads, state, params)
        return functrain.apply_updates(params, updates), state, value

    out = []
    for tokens in data:
        params, state, value = step(params, state, tokens)
        out.append((params, value))
    return out


def released(opt, params, data, **kw):
    release = functrain.gradient_release(opt, embed, layer, head, **kw)
    state = release.init(params)
    step = jax.jit(release.step)
    out = []
    for tokens in data:
        params, state, value = step(params, state, tokens)
        out.append((params, value))
    return out, state


def assert_close(got, want, rtol, atol):
    for (gp, gv), (wp, wv) in zip(got, want):
        np.testing.assert_allclose(gv, wv, rtol=rtol, atol=atol)
        for a, b in zip(jax.tree.leaves(gp), jax.tree.leaves(wp)):
            np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                                       rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------- numbers
@pytest.mark.parametrize("make", [
    lambda: functrain.sgd(0.3, momentum=0.9, nesterov=True),
    lambda: functrain.adamw(functrain.linear_schedule(0.05, 0.01, 4), weight_decay=0.1),
    lambda: functrain.lion(1e-2, weight_decay=0.5),
    lambda: functrain.chain(functrain.clip(0.05), functrain.adam(0.02)),
], ids=["sgd_nesterov", "adamw_schedule", "lion", "clip_adam"])
def test_element_wise_optimizers_match_the_ordinary_step_in_float64(make):
    with enable_x64():
        params, data = make_params(), batches(4)
        want = ordinary(make(), params, data)
        got, state = released(make(), params, data)
        # the same arithmetic in another order: a few float64 ulps of O(1) numbers
        assert_close(got, want, rtol=1e-11, atol=1e-12)
    counts = [x for x in jax.tree.leaves(state.layers) if x.dtype == jnp.int32]
    assert all(np.all(np.asarray(c) == 4) for c in counts)  # one count per layer, all 4


def test_per_matrix_optimizers_match_the_unrolled_model():
    """Muon (per matrix) on a layer's slice = Muon on that layer as its own leaf."""
    dims_layer = {"gain": None, "w_in": MuonDimensionNumbers(0, 1),
                  "w_out": MuonDimensionNumbers(0, 1)}
    rest_dims = {"tok": None, "scale": None, "out": None}
    with enable_x64():
        params, data = make_params(), batches(3)
        unrolled_dims = {**rest_dims, **{f"layer_{i}": dims_layer for i in range(LAYERS)}}
        want = ordinary(functrain.contrib.muon(0.02, muon_weight_dimension_numbers=unrolled_dims),
                        unroll(params), data, unrolled_loss)
        got, _ = released(functrain.contrib.muon(0.02, muon_weight_dimension_numbers=dims_layer),
                          params, data,
                          rest_optimizer=functrain.contrib.muon(
                              0.02, muon_weight_dimension_numbers=rest_dims))
        assert_close([(unroll(p), v) for p, v in got], want, rtol=1e-10, atol=1e-11)


def test_quantized_state_and_compensated_bf16_params_compose():
    """8-bit moments and bfloat16 params with compensation: per layer as the unrolled model.

    Both runs do the same float32/bfloat16 arithmetic on the same numbers, so they agree to
    float32 rounding of the gradients' summation order."""
    opt = lambda: functrain.compensated_params(  # noqa: E731
        functrain.quantized_state(functrain.adamw(1e-2), bits=8))
    params, data = jax.tree.map(lambda x: x.astype(jnp.bfloat16), make_params(jnp.float32)), \
        batches(3)
    want = ordinary(opt(), unroll(params), data, unrolled_loss)
    got, state = released(opt(), params, data)
    assert state.layers.compensation["w_in"].dtype == jnp.bfloat16
    for (gp, gv), (wp, wv) in zip(got, want):
        np.testing.assert_allclose(gv, wv, rtol=1e-2)
        for a, b in zip(jax.tree.leaves(unroll(gp)), jax.tree.leaves(wp)):
            assert a.dtype == b.dtype == jnp.bfloat16
            # the losses' gradients in bfloat16 differ by rounding: a few bfloat16 ulps
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                       rtol=4 * 2.0 ** -8, atol=1e-2)


def test_clipping_by_the_previous_steps_global_norm():
    """Step 1 unclipped; step t scaled by min(1, c / ||g_{t-1}||), g the raw gradients."""
    c = 0.05
    with enable_x64():
        params, data = make_params(), batches(3)
        got, state = released(functrain.sgd(0.5), params, data, clip_norm=c)
        p, prev = params, None
        for (gp, _), tokens in zip(got, data):
            g = jax.grad(loss)(p, tokens)
            norm = float(functrain.global_norm(g))
            scale = 1.0 if prev is None else min(1.0, c / prev)
            p = jax.tree.map(lambda x, gx: x - 0.5 * scale * gx, p, g)
            prev = norm
            for a, b in zip(jax.tree.leaves(gp), jax.tree.leaves(p)):
                np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)
        assert abs(float(state.grad_norm) - prev) < 1e-12 * prev
        assert prev > c  # the clip bound: the test would not see it otherwise


# ----------------------------------------------------------------------------- Flax nn.scan
def test_a_flax_scanned_transformer_matches_its_ordinary_step():
    pytest.importorskip("flax")
    import flax.linen as nn
    import scanned_transformer as st

    scanned, _ = st.models(layers=3, width=16, heads=2, hidden=32)
    with enable_x64():
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.normal(size=(2, 6, 5)))
        y = jnp.asarray(rng.normal(size=(2, 6, 16)))
        params = st.init_params(scanned, x)
        opt = lambda: functrain.adamw(1e-2, weight_decay=0.1)  # noqa: E731

        def f_embed(rest, batch):
            return nn.Dense(16).apply({"params": rest["embed"]}, batch[0])

        def f_layer(p, h):
            return st.Block(2, 32).apply({"params": p}, h)[0]

        def f_head(rest, h, batch):
            return jnp.mean((nn.LayerNorm().apply({"params": rest["final_ln"]}, h)
                             - batch[1]) ** 2)

        want = ordinary(opt(), params, [(x, y)] * 3,
                        lambda p, b: st.mse(scanned, p, b[0], b[1]))
        release = functrain.gradient_release(opt(), f_embed, f_layer, f_head)
        state, step, got = release.init(params), jax.jit(release.step), []
        p = params
        for _ in range(3):
            p, state, value = step(p, state, (x, y))
            got.append((p, value))
        assert_close(got, want, rtol=1e-10, atol=1e-11)


# ----------------------------------------------------------------------------- errors
def test_whole_tree_stages_and_bad_params_are_refused():
    with pytest.raises(ValueError, match="'clip_by_global_norm'.*previous step"):
        functrain.gradient_release(
            functrain.chain(functrain.clip_by_global_norm(1.0), functrain.adam(1e-3)),
            embed, layer, head)
    with pytest.raises(ValueError, match="rest_optimizer has the stage 'normalize_by_update_norm'"):
        functrain.gradient_release(functrain.adam(1e-3), embed, layer, head,
                                   rest_optimizer=functrain.normalize_by_update_norm())
    with pytest.raises(ValueError, match="clip_norm must be > 0"):
        functrain.gradient_release(functrain.adam(1e-3), embed, layer, head, clip_norm=0.0)
    release = functrain.gradient_release(functrain.adam(1e-3), embed, layer, head)
    with pytest.raises(ValueError, match="stacked layers under 'layers'"):
        release.init({"tok": jnp.ones((3, 2))})
    bad = make_params(jnp.float32)
    bad["layers"]["gain"] = jnp.ones((LAYERS + 1, WIDTH))
    with pytest.raises(ValueError, match=r"same leading \(layer\) axis.*\['gain'\]"):
        release.init(bad)
    with pytest.raises(ValueError, match="GradientReleaseState"):
        release.step(make_params(jnp.float32), functrain.adam(1e-3).init({}), batches(1)[0])


# ----------------------------------------------------------------------------- checkpoints
def test_orbax_round_trip_of_the_state_continues_the_run_exactly(tmp_path):
    """The state (per-layer 8-bit moments, bfloat16 compensation, the norm) saved after two
    steps and restored: the next step gives the same params, bit for bit."""
    ocp = pytest.importorskip("orbax.checkpoint")
    opt = functrain.compensated_params(functrain.quantized_state(functrain.adamw(1e-2), bits=8))
    release = functrain.gradient_release(opt, embed, layer, head, clip_norm=1.0)
    step = jax.jit(release.step)
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), make_params(jnp.float32))
    state = release.init(params)
    data = batches(3)
    for tokens in data[:2]:
        params, state, _ = step(params, state, tokens)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "ckpt", {"params": params, "state": state})
    checkpointer.wait_until_finished()
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                          {"params": params, "state": state})
    restored = ocp.StandardCheckpointer().restore(tmp_path / "ckpt", target)
    assert jax.tree.structure(restored["state"]) == jax.tree.structure(state)
    a = step(params, state, data[2])[0]
    b = step(restored["params"], restored["state"], data[2])[0]
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and np.array_equal(np.asarray(x).view(np.uint16),
                                                     np.asarray(y).view(np.uint16))


# ----------------------------------------------------------------------------- devices
ZERO1_SCRIPT = '''
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
sys.path.insert(0, "tests")
import functrain
import test_gradient_release as t

jax.config.update("jax_enable_x64", True)
opt = functrain.quantized_state(functrain.adamw(1e-2), bits=8)
release = functrain.gradient_release(opt, t.embed, t.layer, t.head, clip_norm=1.0)
params = t.make_params(jnp.float32)
rng = np.random.default_rng(3)
data = [jnp.asarray(rng.integers(0, t.VOCAB, size=(8, t.SEQ))) for _ in range(3)]

def run(params, state, place):
    step = jax.jit(release.step)
    for tokens in data:
        params, state, loss = step(params, state, place(tokens))
    return params, state

one = run(params, release.init(params), lambda x: x)
mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
replicated = NamedSharding(mesh, P())
state = release.init(params)
state = jax.device_put(state, functrain.sharding.zero_shardings(state, mesh))
many = run(jax.device_put(params, replicated), state,
           lambda x: jax.device_put(x, NamedSharding(mesh, P("data"))))
split = [len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated
         for x in jax.tree.leaves(many[1]) if x.ndim]
diff = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
           for a, b in zip(jax.tree.leaves(one[0]), jax.tree.leaves(many[0])))
print(json.dumps({"diff": diff, "split": sum(split), "arrays": len(split),
                  "devices": len(jax.devices())}))
'''


@pytest.mark.long
def test_zero1_state_on_eight_devices_gives_the_one_device_numbers(tmp_path):
    """Data-parallel batch, replicated params, ZeRO-1 state (8-bit moments) on 8 CPU devices:
    the params of three steps as on one device, to float32 rounding of the reductions."""
    from helpers import run_on_eight_devices
    script = tmp_path / "zero1_release.py"
    script.write_text(ZERO1_SCRIPT)
    out = run_on_eight_devices(script)
    assert out["devices"] == 8 and out["split"] >= 6, out
    assert out["diff"] < 1e-5, out


MUON_MESH_SCRIPT = '''
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
sys.path.insert(0, "tests")
import functrain
from functrain.contrib import MuonDimensionNumbers
import test_gradient_release as t

jax.config.update("jax_enable_x64", True)
dims = {"gain": None, "w_in": MuonDimensionNumbers(0, 1), "w_out": MuonDimensionNumbers(0, 1)}
mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))

def release(mesh):
    return functrain.gradient_release(
        functrain.contrib.muon(0.02, muon_weight_dimension_numbers=dims, mesh=mesh),
        t.embed, t.layer, t.head, rest_optimizer=functrain.adam(0.01))

params = t.make_params(jnp.float64)
data = t.batches(3)

def run(release, params, place):
    state, step = release.init(params), jax.jit(release.step)
    for tokens in data:
        params, state, loss = step(params, state, place(tokens))
    return params, step.lower(params, state, place(data[0])).compile().as_text()

one, hlo_one = run(release(None), params, lambda x: x)
replicated = NamedSharding(mesh, P())
many, hlo = run(release(mesh), jax.device_put(params, replicated),
                lambda x: jax.device_put(x, replicated))
diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
           for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(many)))
print(json.dumps({"diff": diff, "devices": len(jax.devices()),
                  "all_gathers": hlo.count(" all-gather("),
                  "all_gathers_without_mesh": hlo_one.count(" all-gather("),
                  "dtype": str(jax.tree.leaves(many)[0].dtype)}))
'''


@pytest.mark.long
def test_muon_with_mesh_inside_the_release_loop_gives_the_one_device_numbers(tmp_path):
    """Muon with ``mesh=`` (each layer's matrices divided over 8 CPU devices for Newton-Schulz)
    as the released optimizer: three steps in float64 give the params of Muon without a mesh,
    and the program gathers the orthogonalized matrices back (at least one all-gather)."""
    from helpers import run_on_eight_devices
    script = tmp_path / "muon_mesh_release.py"
    script.write_text(MUON_MESH_SCRIPT)
    out = run_on_eight_devices(script)
    assert out["devices"] == 8 and out["dtype"] == "float64", out
    assert out["all_gathers"] >= 1 and out["all_gathers_without_mesh"] == 0, out
    assert out["diff"] < 1e-12, out
