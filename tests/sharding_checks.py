"""Multi-device checks for functrain.sharding, run on 8 simulated CPU devices.

``tests/test_sharding.py`` runs this file in a subprocess started with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (the flag only works
before JAX initialises, and the main pytest process has one device). Each
``check_*`` function raises on failure; ``python tests/sharding_checks.py``
runs them all and prints one JSON line ``{name: {"ok": bool, "error": str}}``.
Importing this module runs nothing.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import traceback
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import functrain as ft
import stacked_sharding_checks  # noqa: E402  (sharded stacked weights)
import matrix_sharding_checks  # noqa: E402  (tests/ is on sys.path: pytest and `python tests/...`)
from functrain import jax_compat, sharding as fs
from helpers import (AXIS_TYPES, LAYOUTS_JAX, LAYOUTS_WHY, PREFERRED_AXIS_TYPE, SkipCheck,
                     set_mesh)
from functrain.jax_compat import enable_x64

# The checks run in float64 (main() enables x64; the model, its batches and the other
# test arrays are float64), so a comparison with one device never depends on the order the
# devices sum in: float64 rounding differences, amplified by ten optimizer steps, stay
# below 1e-12, where float32's (seen: 3e-6 after 3 ACProp steps) crossed float32's own
# tolerance. rtol as docs/scaling.md promises; atol for entries that cross zero (params are O(1)).
DTYPE = jnp.float64
RTOL, ATOL = 2e-5, 1e-6
CHECKS: dict[str, Callable[[], None]] = {}


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS[fn.__name__] = fn
    return fn


def needs_jax(version: str, why: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """A check that runs on JAX >= ``version``; on an older JAX it reports itself skipped
    with ``why`` (test_sharding.py skips its test with that reason)."""
    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            if not jax_compat.jax_at_least(version):
                raise SkipCheck(f"needs JAX >= {version} (this is {jax.__version__}): {why}")
            fn()
        run.__name__, run.__doc__ = fn.__name__, fn.__doc__
        return run
    return wrap


# --------------------------------------------------------------------------
# A small model whose leaves all have distinct shapes (so a state buffer's
# parameter is known from its shape alone) and one leaf, ``extra`` (5,),
# that no mesh axis divides.
# --------------------------------------------------------------------------

SHAPES = {"proj": (16, 16), "w1": (16, 32), "b1": (32,), "w2": (32, 8), "b2": (8,),
          "extra": (5,)}
MODEL_SPECS = {"proj": P("data", "model"), "w1": P(None, "model"), "b1": P("model"),
               "w2": P("model", None), "b2": P(), "extra": P()}
STEPS = 10


def model_params(seed: int = 0) -> dict:
    """The parameters of the model above (not helpers.make_params: this tree's shapes divide
    the mesh axes and tell its state buffers apart; this script runs alone, on 8 devices)."""
    rng = np.random.default_rng(seed)
    return {k: jnp.asarray(rng.standard_normal(s) * 0.5, DTYPE) for k, s in SHAPES.items()}


def make_batches(seed: int = 1, steps: int = STEPS, batch: int = 64) -> tuple:
    rng = np.random.default_rng(seed)
    xs = jnp.asarray(rng.standard_normal((steps, batch, 16)), DTYPE)
    ys = jnp.asarray(rng.standard_normal((steps, batch, 8)), DTYPE)
    return xs, ys


def loss(p: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    h = jnp.tanh((x @ p["proj"]) @ p["w1"] + p["b1"])
    out = h @ p["w2"] + p["b2"]
    return jnp.mean((out - y) ** 2) + 1e-2 * jnp.sum(jnp.sin(p["extra"]))


def pointwise_loss(p: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    """A loss without contractions: explicit-axis meshes need no out_sharding hints."""
    c = 1.0 + jnp.mean(x) + jnp.mean(y)
    return sum(jnp.sum(jnp.sin(v) * c + 0.1 * v * v) for v in p.values())


def make_step(opt: Any, nan_at: int = -1, loss: Callable = loss) -> Callable:
    def step(p, s, x, y, i):
        g = jax.grad(loss)(p, x, y)
        if nan_at >= 0:  # a non-finite gradient on step ``nan_at``
            g = jax.tree_util.tree_map(lambda t: jnp.where(i == nan_at, jnp.nan, t), g)
        u, s = opt.update(g, s, p)
        return ft.apply_updates(p, u), s
    return step


# name -> (optimizer, step at which the gradient is NaN or -1). The first group
# is compared number by number against one device; all are checked for layouts.
CORE = ("adam", "lamb", "lars", "clip+adamw", "MultiSteps", "apply_if_finite",
        "MultiSteps(lamb)")


@functools.lru_cache(maxsize=None)
def cases() -> dict:
    return {
        "adam": (ft.adam(1e-2), -1),
        "lamb": (ft.lamb(1e-2, weight_decay=1e-3), -1),
        "lars": (ft.lars(1e-1, weight_decay=1e-4), -1),
        "clip+adamw": (ft.chain(ft.clip_by_global_norm(1.0),
                                ft.adamw(1e-2, weight_decay=1e-2)), -1),
        "MultiSteps": (ft.MultiSteps(ft.adam(1e-2), every_k_schedule=3), -1),
        "apply_if_finite": (ft.apply_if_finite(ft.adam(1e-2), max_consecutive_errors=2), 4),
        "MultiSteps(lamb)": (ft.MultiSteps(ft.lamb(1e-2), every_k_schedule=2), -1),
        "adam(mu bf16)": (ft.adam(1e-2, mu_dtype=jnp.bfloat16), -1),
        "sgd(nesterov)": (ft.sgd(1e-2, momentum=0.9, nesterov=True), -1),
        "rmsprop(centered)": (ft.rmsprop(1e-3, centered=True, momentum=0.9), -1),
        "adagrad": (ft.adagrad(1e-2), -1),
        "lion": (ft.lion(1e-4), -1),
        "adamw(mask)": (ft.adamw(1e-2, mask=lambda p: {k: k.startswith("w") for k in p}), -1),
        "masked": (ft.masked(ft.adam(1e-2), {k: k != "extra" for k in SHAPES}), -1),
        "multi_transform": (ft.multi_transform(
            {"a": ft.adam(1e-2), "s": ft.sgd(1e-2, momentum=0.9)},
            {k: "a" if k.startswith("w") else "s" for k in SHAPES}), -1),
        "inject_hyperparams": (ft.inject_hyperparams(ft.adam)(learning_rate=1e-2), -1),
    }


def multi_step(names: tuple, loss: Callable = loss) -> Callable:
    """One jitted function stepping several optimizers side by side (one compile)."""
    steps = {n: make_step(cases()[n][0], cases()[n][1], loss) for n in names}

    def step(ps, ss, x, y, i):
        out = {n: steps[n](ps[n], ss[n], x, y, i) for n in names}
        return {n: o[0] for n, o in out.items()}, {n: o[1] for n, o in out.items()}
    return step


def init_all(names: tuple, params: Any, **jit_kwargs: Any) -> dict:
    return jax.jit(lambda p: {n: cases()[n][0].init(p) for n in names}, **jit_kwargs)(params)


@functools.lru_cache(maxsize=None)
def single_device() -> dict:
    """name -> parameters after ``STEPS`` jitted steps on one device, for ``CORE``."""
    params = {n: model_params() for n in CORE}
    states = init_all(CORE, model_params())
    xs, ys = make_batches()
    step = jax.jit(multi_step(CORE))
    for i in range(STEPS):
        params, states = step(params, states, xs[i], ys[i], i)
    return params


def assert_close(got: Any, want: Any, what: str) -> None:
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(got)[0],
                            jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL,
                                   err_msg=f"{what}: leaf {jax.tree_util.keystr(path)}")


def mesh_1d(types: Any = PREFERRED_AXIS_TYPE) -> Any:
    return jax.make_mesh((8,), ("data",), axis_types=(types,))


def mesh_2d(types: Any = PREFERRED_AXIS_TYPE) -> Any:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(types, types))


def keystr(path: Any) -> str:
    return jax.tree_util.keystr(path)


def state_leaves(state: Any) -> list:
    return jax.tree_util.tree_flatten_with_path(state)[0]


def spec_of_shape(shape: tuple) -> Any:
    """The model-parallel spec of the parameter with this (unique) shape."""
    return MODEL_SPECS[next(k for k, s in SHAPES.items() if s == shape)]


def expect_follow_params(state: Any, mesh: Any, what: str) -> None:
    """Every state leaf shaped like a param has that param's sharding; scalars replicated."""
    for path, x in state_leaves(state):
        if x.ndim == 0:
            assert x.sharding.is_fully_replicated and x.sharding.device_set == set(
                mesh.devices.flat), f"{what}: scalar {keystr(path)} is {x.sharding}"
            continue
        want = NamedSharding(mesh, spec_of_shape(x.shape))
        assert x.sharding.is_equivalent_to(want, x.ndim), (
            f"{what}: {keystr(path)} {x.shape} is {x.sharding}, want spec {want.spec}")


# --------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------

@check
def check_eight_devices() -> None:
    assert jax.device_count() == 8, f"expected 8 simulated devices, got {jax.device_count()}"


def zero1_step(names: tuple, mesh: Any, params: dict) -> tuple:
    """Jitted ZeRO-1 data-parallel step: params replicated, state split over ``data``."""
    batch = NamedSharding(mesh, P("data"))
    p_sh = {n: jax.tree_util.tree_map(lambda x: x.sharding, params[n]) for n in names}
    s_sh = {n: fs.zero_shardings(fs.abstract_state(cases()[n][0], params[n]), mesh, "data")
            for n in names}
    step = jax.jit(multi_step(names), in_shardings=(p_sh, s_sh, batch, batch, None),
                   out_shardings=(p_sh, s_sh), donate_argnums=(0, 1))
    return step, s_sh


@functools.lru_cache(maxsize=None)
def zero1_run() -> tuple:
    """``CORE`` trained data parallel on 8 devices with ZeRO-1 state.

    One program per optimizer: XLA's CPU runtime can deadlock when one program
    holds many independent collectives and the host has few cores.
    Returns (name -> params, name -> state, name -> state shardings).
    """
    mesh = mesh_1d()
    replicated = NamedSharding(mesh, P())
    xs, ys = make_batches()
    data = NamedSharding(mesh, P(None, "data"))
    xs, ys = jax.device_put(xs, data), jax.device_put(ys, data)
    out_p, out_s, out_sh = {}, {}, {}
    for name in CORE:
        params = {name: jax.device_put(model_params(), replicated)}
        step, s_sh = zero1_step((name,), mesh, params)
        states = init_all((name,), params[name], out_shardings=s_sh)
        for i in range(STEPS):
            params, states = step(params, states, xs[i], ys[i], i)
        out_p[name], out_s[name], out_sh[name] = params[name], states[name], s_sh[name]
    return out_p, out_s, out_sh


def expect_zero1_layout(state: Any, what: str) -> None:
    """Every param-shaped buffer: 1/8 on each device, except the indivisible ``extra``."""
    n_split = 0
    for path, x in state_leaves(state):
        shards = x.addressable_shards
        assert len({s.device for s in shards}) == 8, f"{what}: {keystr(path)} not on 8 devices"
        if x.ndim == 0 or x.shape == SHAPES["extra"]:
            assert all(s.data.shape == x.shape for s in shards), (
                f"{what}: {keystr(path)} {x.shape} should be replicated")
            continue
        sizes = {s.data.size for s in shards}
        assert sizes == {x.size // 8}, f"{what}: {keystr(path)} shard sizes {sizes}, " \
                                       f"want {x.size // 8} of {x.size}"
        assert len({str(s.index) for s in shards}) == 8, f"{what}: {keystr(path)} shards overlap"
        n_split += 1
    assert n_split > 0, f"{what}: no moment buffer found"


@check
def check_zero1_matches_single_device() -> None:
    params, states, s_sh = zero1_run()
    for name in ("adam", "lamb", "lars", "clip+adamw"):
        assert_close(params[name], single_device()[name],
                     f"{name} ZeRO-1 on 8 devices vs 1 device")
        expect_zero1_layout(states[name], name)
        for (path, x), s in zip(state_leaves(states[name]),
                                jax.tree_util.tree_leaves(s_sh[name])):
            assert x.sharding.is_equivalent_to(s, x.ndim), f"{name}: {keystr(path)} resharded"


@check
def check_zero1_per_device_bytes() -> None:
    state = zero1_run()[1]["adam"]
    per_device = fs.per_device_bytes(state)
    assert len(per_device) == 8
    params = model_params()
    big = sum(x.nbytes for k, x in params.items() if k != "extra")
    # mu and nu: the big leaves split 8 ways, ``extra`` replicated; plus the int32 count.
    want = 2 * (big // 8 + params["extra"].nbytes) + 4
    assert set(per_device.values()) == {want}, f"{per_device} != {want}"
    replicated = fs.per_device_bytes(
        jax.device_put(cases()["adam"][0].init(params), NamedSharding(mesh_1d(), P())))
    assert set(replicated.values()) == {2 * (big + params["extra"].nbytes) + 4}


@check
def check_zero_shardings_rules() -> None:
    mesh = mesh_2d()
    sd = lambda shape, spec=None: jax.ShapeDtypeStruct(
        shape, jnp.float32, sharding=None if spec is None else NamedSharding(mesh, spec))
    tree = {"row": sd((8, 3)), "col": sd((3, 8)), "odd": sd((3, 5)), "scalar": sd(()),
            "model_sharded": sd((16, 8), P(None, "model")),
            "already": sd((8, 8), P("data")), "masked": ft.MaskedNode(), "none": None,
            "taken": sd((8, 4), P("model", None))}
    got = fs.zero_shardings(tree, mesh, "data")
    want = {"row": P("data", None), "col": P(None, "data"), "odd": P(None, None),
            "scalar": P(), "model_sharded": P("data", "model"), "already": P("data", None),
            "taken": P("model", "data")}
    for k, spec in want.items():
        assert got[k].is_equivalent_to(NamedSharding(mesh, spec), len(tree[k].shape)), (
            f"{k}: {got[k].spec} != {spec}")
    assert isinstance(got["masked"], ft.MaskedNode) and got["none"] is None
    small = fs.zero_shardings({"b": sd((8,)), "w": sd((8, 8))}, mesh, min_size=16)
    assert small["b"].spec == P(None) and small["w"].spec == P("data", None), small
    for bad, exc in [(lambda: fs.zero_shardings(tree, mesh, "batch"), ValueError),
                     (lambda: fs.zero_shardings({"w": jax.ShapeDtypeStruct(
                         (8,), jnp.float32, sharding=NamedSharding(
                             jax.make_mesh((8,), ("x",)), P("x")))}, mesh), ValueError)]:
        try:
            bad()
        except exc as e:
            assert "mesh" in str(e), e
        else:
            raise AssertionError("zero_shardings accepted a bad mesh/axis")


def expect_init_follows_params(names: tuple, params: dict, mesh: Any, what: str) -> dict:
    """jit(init), eager init and state_shardings all follow the params; returns the states."""
    abstract = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params)
    states = init_all(names, params)
    for name in names:
        opt, state = cases()[name][0], states[name]
        expect_follow_params(state, mesh, f"{name} {what} jit(init)")
        predicted = fs.state_shardings(opt, abstract)
        ft.tree.check_structure(state, predicted, "state_shardings", "jit(opt.init)")
        for (path, x), s in zip(state_leaves(state), jax.tree_util.tree_leaves(predicted)):
            assert x.sharding.is_equivalent_to(s, x.ndim), (
                f"{name} {what}: state_shardings {keystr(path)} {s} != {x.sharding}")
        shapes = jax.eval_shape(opt.init, abstract)
        assert [(a.shape, a.dtype) for a in jax.tree_util.tree_leaves(shapes)] == [
            (x.shape, x.dtype) for x in jax.tree_util.tree_leaves(state)], name
        for path, x in state_leaves(opt.init(params)):
            if x.ndim:  # eager scalars stay uncommitted; jit replicates them
                assert x.sharding.is_equivalent_to(
                    NamedSharding(mesh, spec_of_shape(x.shape)), x.ndim), (
                    f"{name} {what}: eager init {keystr(path)} is {x.sharding}")
    return states


@check
@needs_jax(LAYOUTS_JAX, LAYOUTS_WHY)
def check_same_shape_leaves_keep_their_own_sharding() -> None:
    """Two params of one shape, one split over ``model`` and one replicated: under
    ``jax.jit(opt.init)`` each state buffer follows its own param (not its twin's)."""
    mesh = mesh_2d(AxisType.Auto)
    params = {"split": jax.device_put(jnp.ones(1024), NamedSharding(mesh, P("model"))),
              "replicated": jax.device_put(jnp.ones(1024), NamedSharding(mesh, P())),
              "rows": jax.device_put(jnp.ones(1024), NamedSharding(mesh, P("data")))}
    for opt in (ft.adam(1e-3), ft.lamb(1e-3), ft.sgd(1e-3, momentum=0.9)):
        state = jax.jit(opt.init)(params)
        for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
            if leaf.shape != (1024,):
                continue
            key = path[-1].key
            want = params[key].sharding
            assert leaf.sharding.is_equivalent_to(want, 1), (
                f"{keystr(path)}: {leaf.sharding} but its param has {want}")


@check
def check_model_parallel_state_follows_params() -> None:
    """4x2 mesh (auto axes), params split over both axes, every optimizer and wrapper;
    the ``CORE`` ones also match one device after 10 steps."""
    mesh = mesh_2d(AxisType.Auto)
    p_sh = {k: NamedSharding(mesh, s) for k, s in MODEL_SPECS.items()}
    names = tuple(cases())
    states = expect_init_follows_params(names, jax.device_put(model_params(), p_sh), mesh,
                                        "(4x2 auto)")
    xs, ys = make_batches()
    # Steps for the CORE ones and the wrappers; the plain optimizers left out run
    # the same engine code as those (keeps the test's compile time down).
    for name in CORE + ("adam(mu bf16)", "masked", "multi_transform", "inject_hyperparams"):
        params = {name: jax.device_put(model_params(), p_sh)}
        state = {name: states[name]}
        # Plain jit, no shardings given: the partitioner must keep every layout.
        step = jax.jit(multi_step((name,)))
        for i in range(STEPS):
            params, state = step(params, state, xs[i], ys[i], i)
        expect_follow_params(state[name], mesh, name + " state after steps")
        expect_follow_params(params[name], mesh, name + " params after steps")
        if name in CORE:
            assert_close(params[name], single_device()[name],
                         f"{name} model-parallel 4x2 vs 1 device")


@check
@needs_jax(jax_compat.EXPLICIT_AXES_JAX, "explicit mesh axes")
def check_explicit_axes_state_follows_params() -> None:
    """The same with explicit mesh axes (jax.make_mesh's default)."""
    mesh = mesh_2d(AxisType.Explicit)
    p_sh = {k: NamedSharding(mesh, s) for k, s in MODEL_SPECS.items()}
    batch = NamedSharding(mesh, P("data"))
    names = tuple(cases())
    states = expect_init_follows_params(names, jax.device_put(model_params(), p_sh), mesh,
                                        "(4x2 explicit)")
    xs, ys = make_batches(steps=2)
    for name in ("clip+adamw", "MultiSteps(lamb)", "apply_if_finite"):
        params = {name: jax.device_put(model_params(), p_sh)}
        state = {name: states[name]}
        # The MLP's matmuls would need out_sharding hints under explicit axes (model
        # code, not optimizer code), so this step uses a pointwise loss.
        step = jax.jit(multi_step((name,), loss=pointwise_loss))
        for i in range(2):
            params, state = step(params, state, jax.device_put(xs[i], batch),
                                 jax.device_put(ys[i], batch), i)
        expect_follow_params(state[name], mesh, name + " (explicit) state after steps")
        expect_follow_params(params[name], mesh, name + " (explicit) params after steps")


@check
def check_trust_ratio_uses_whole_leaf() -> None:
    """lamb/lars on a leaf split over both mesh axes: the trust ratio is the whole leaf's.

    Run twice: as the engine runs small trees (the direction stored), and with
    its trust-ratio recompute forced on (the norm from a recomputed direction).
    """
    from functrain.engine import recompute
    default = recompute.MIN_BYTES
    try:
        for threshold in (default, 0):
            recompute.MIN_BYTES = threshold
            _trust_ratio_uses_whole_leaf()
    finally:
        recompute.MIN_BYTES = default


def _trust_ratio_uses_whole_leaf() -> None:
    mesh = mesh_2d()
    leaf = NamedSharding(mesh, P("data", "model"))
    rng = np.random.default_rng(3)
    # Shards of very different norms: a per-shard ratio would differ by ~100x.
    p = np.asarray(rng.standard_normal((8, 4)) * np.geomspace(0.01, 100, 8)[:, None], np.float32)
    g = np.asarray(rng.standard_normal((8, 4)) * np.geomspace(100, 0.01, 8)[:, None], np.float32)
    lr = 0.1
    for name, opt, expected in [
            # lamb, first step: adam's u = g/(|g|+eps); update = -lr ||p|| / ||u|| u.
            ("lamb", ft.lamb(lr), lambda: (lambda u: -lr * np.linalg.norm(p) / np.linalg.norm(u) * u)(
                g / (np.abs(g) + 1e-6))),
            # lars, first step, no weight decay: -lr * tc ||p|| / ||g|| * g (momentum trace = g).
            ("lars", ft.lars(lr), lambda: -lr * 1e-3 * np.linalg.norm(p) / np.linalg.norm(g) * g)]:
        params = {"w": jax.device_put(jnp.asarray(p), leaf)}
        grads = {"w": jax.device_put(jnp.asarray(g), leaf)}
        update = jax.jit(lambda gr, pa: opt.update(gr, opt.init(pa), pa)[0])
        sharded = update(grads, params)["w"]
        assert sharded.sharding.is_equivalent_to(leaf, 2), sharded.sharding
        single = update({"w": jnp.asarray(g)}, {"w": jnp.asarray(p)})["w"]
        np.testing.assert_allclose(np.asarray(sharded), np.asarray(single), rtol=RTOL, atol=0,
                                   err_msg=f"{name}: sharded vs 1 device")
        np.testing.assert_allclose(np.asarray(sharded), expected(), rtol=1e-5, atol=0,
                                   err_msg=f"{name}: vs the whole-leaf formula")
        # ZeRO-1: params replicated, state split; the ratio is still the whole leaf's.
        rep = NamedSharding(mesh_1d(), P())
        opt_state = fs.zero_shardings(fs.abstract_state(opt, {"w": jnp.asarray(p)}),
                                      mesh_1d())
        zero = jax.jit(lambda gr, pa, st: opt.update(gr, st, pa)[0])(
            jax.device_put({"w": jnp.asarray(g)}, rep), jax.device_put({"w": jnp.asarray(p)}, rep),
            jax.jit(opt.init, out_shardings=opt_state)(jax.device_put({"w": jnp.asarray(p)}, rep)))
        np.testing.assert_allclose(np.asarray(zero["w"]), expected(), rtol=1e-5, atol=0,
                                   err_msg=f"{name}: ZeRO-1 vs the whole-leaf formula")


def collectives(hlo: str) -> dict:
    ops = re.findall(r"\b(all-gather|all-reduce|reduce-scatter|all-to-all|"
                     r"collective-permute)(?:-start)?\(", hlo)
    return {op: ops.count(op) for op in set(ops)}


@check
def check_hlo_no_moment_all_gather() -> None:
    mesh = mesh_1d()
    batch = NamedSharding(mesh, P("data"))
    names = ("adam", "lamb")
    params = {n: jax.device_put(model_params(), NamedSharding(mesh, P())) for n in names}
    p_sh = jax.tree_util.tree_map(lambda x: x.sharding, params)
    xs, ys = make_batches(steps=1)
    x, y = jax.device_put(xs[0], batch), jax.device_put(ys[0], batch)
    # Pure data parallel, state following the replicated params: the gradient
    # all-reduce and nothing else (no buffer is ever resharded).
    states = init_all(names, params[names[0]])
    s_sh = jax.tree_util.tree_map(lambda a: a.sharding, states)
    step = jax.jit(multi_step(names), out_shardings=(p_sh, s_sh))
    ops = collectives(step.lower(params, states, x, y, 0).compile().as_text())
    assert ops.get("all-reduce", 0) >= 1 and set(ops) == {"all-reduce"}, ops
    # ZeRO-1: the moments are updated on their slices and only the new parameters
    # are gathered: at most one all-gather per parameter leaf (``extra`` is
    # replicated, so needs none); gathering moments would take two more per leaf.
    zero_step, z_sh = zero1_step(names, mesh, params)
    # Lowered on the abstract ZeRO-1 state (shapes plus shardings, nothing allocated).
    abstract = {n: fs.abstract_state(cases()[n][0], params[n], z_sh[n]) for n in names}
    ops = collectives(zero_step.lower(params, abstract, x, y, 0).compile().as_text())
    assert 1 <= ops.get("all-gather", 0) <= len(names) * (len(SHAPES) - 1), ("ZeRO-1", ops)
    # The ZeRO-1 state update alone: no all-gather at all.
    state_only = jax.jit(lambda p, s, x, y: multi_step(names)(p, s, x, y, 0)[1],
                         out_shardings=z_sh)
    ops = collectives(state_only.lower(params, jax.device_put(states, z_sh), x, y)
                      .compile().as_text())
    assert "all-gather" not in ops and ops.get("all-reduce", 0) >= 1, ("moment update", ops)


@check
def check_eval_shape_and_abstract_state() -> None:
    mesh = mesh_2d(AxisType.Auto)
    abstract = {k: jax.ShapeDtypeStruct(s, jnp.float32,
                                        sharding=NamedSharding(mesh, MODEL_SPECS[k]))
                for k, s in SHAPES.items()}
    for name, (opt, _) in cases().items():
        shapes = jax.eval_shape(opt.init, abstract)
        target = fs.abstract_state(opt, abstract)
        ft.tree.check_structure(shapes, target, "abstract_state", "eval_shape(init)")
        for (path, a), t in zip(state_leaves(shapes), jax.tree_util.tree_leaves(target)):
            assert (a.shape, a.dtype) == (t.shape, t.dtype), (name, keystr(path))
            want = NamedSharding(mesh, spec_of_shape(a.shape) if a.shape else P())
            assert t.sharding.is_equivalent_to(want, len(a.shape)), (name, keystr(path),
                                                                     t.sharding)


@check
def check_multisteps_and_apply_if_finite_zero1() -> None:
    """The wrappers inside a ZeRO-1 sharded jit step (model parallel: see above)."""
    params, states, _ = zero1_run()
    for name in ("MultiSteps", "apply_if_finite", "MultiSteps(lamb)"):
        got, state = params[name], states[name]
        assert_close(got, single_device()[name], f"{name} ZeRO-1 vs 1 device")
        expect_zero1_layout(state, name)
        if name == "apply_if_finite":
            assert int(state.total_notfinite) == 1 and bool(state.last_finite), state
        else:
            k = 3 if name == "MultiSteps" else 2
            assert int(state.gradient_step) == STEPS // k, state.gradient_step


def contrib_cases() -> dict:
    """label -> (record, setting): every setting of every contrib optimizer in
    tests/registry.py, less the settings that skip this check."""
    import registry  # tests/ is on sys.path (see matrix_sharding_checks above)
    return registry.settings(contrib=True, without="sharding")


@check
def check_contrib_state_follows_params() -> None:
    """Every contrib case on the 4x2 mesh (params split over both axes): ``jit(init)``
    and three plain-jit steps keep each params-shaped state buffer on its param's
    sharding, ``eval_shape(init)`` works from sharded abstract params, and the
    parameters equal one device's after the three steps (the placements from JAX
    ``LAYOUTS_JAX`` on: JAX 0.5.3's propagation moves some of them, e.g. apollo's and
    muon's after plain-jit steps)."""
    mesh = mesh_2d(AxisType.Auto)
    p_sh = {k: NamedSharding(mesh, s) for k, s in MODEL_SPECS.items()}
    abstract = {k: jax.ShapeDtypeStruct(s, jnp.float32, sharding=p_sh[k])
                for k, s in SHAPES.items()}
    xs, ys = make_batches()
    by_shape = {s: k for k, s in SHAPES.items()}
    failures = []
    for name, (record, setting) in contrib_cases().items():
        try:
            opt = record.make(ft, **setting.kwargs)

            def step(p, s, x, y, opt=opt, record=record):
                g = jax.grad(loss)(p, x, y)
                extra = record.update_kwargs(lambda q: loss(q, x, y), p)
                u, s = opt.update(g, s, p, **extra)
                return ft.apply_updates(p, u), s

            jax.eval_shape(opt.init, abstract)
            results = []
            for params in (model_params(), jax.device_put(model_params(), p_sh)):
                state = jax.jit(opt.init)(params)
                run = jax.jit(step)
                for i in range(3):
                    params, state = run(params, state, xs[i], ys[i])
                results.append((params, state))
            (single, _), (sharded, state) = results
            # Placements are checked where JAX places state like its params (LAYOUTS_WHY);
            # on older JAX, the numbers only.
            placed = (state_leaves(state) + state_leaves(sharded)
                      if jax_compat.jax_at_least(LAYOUTS_JAX) else [])
            for path, x in placed:
                if x.ndim and x.shape in by_shape:
                    want = p_sh[by_shape[x.shape]]
                    assert x.sharding.is_equivalent_to(want, x.ndim), (
                        f"{keystr(path)} {x.shape} is {x.sharding}, want {want.spec}")
            assert_close(sharded, single, f"{name} 4x2 vs 1 device")
        except Exception as e:  # noqa: BLE001 -- collected, reported together
            failures.append(f"{name}: {type(e).__name__}: {str(e)[:400]}")
    assert not failures, "\n".join(failures)


@check
def check_muon_model_sharded_weight() -> None:
    """contrib.muon on a (64, 32) weight split 8 ways along its rows, then its columns
    (Newton-Schulz's matmuls contract the split axis), on a mesh with automatic axes and
    on one with explicit axes (where the split is part of the array's type and a matmul
    over a split axis must be told its output sharding): three jitted steps give one
    device's numbers, and the momentum and the weight keep the weight's sharding."""
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((64, 32)), DTYPE)
    grads = jnp.asarray(rng.standard_normal((3, 64, 32)), DTYPE)
    opt = ft.contrib.muon(1e-2, weight_decay=1e-2, adaptive=True)

    def run(w: jax.Array) -> tuple:
        p = {"w": w}
        state = opt.init(p)
        for g in grads:
            u, state = opt.update({"w": g}, state, p)
            p = ft.apply_updates(p, u)
        return p["w"], state.inner_states["muon"].inner_state[0].mu["w"]

    want = jax.jit(run)(w)[0]
    for axis_type in AXIS_TYPES:
        mesh = mesh_1d(axis_type)
        for spec in (P("data", None), P(None, "data")):
            sharding = NamedSharding(mesh, spec)
            with set_mesh(mesh):
                got, mu = jax.jit(run)(jax.device_put(w, sharding))
            where = f"muon, weight sharded as {spec}, {axis_type}"
            assert_close(got, want, where)
            assert mu.sharding.is_equivalent_to(sharding, 2), (where, mu.sharding)
            assert got.sharding.is_equivalent_to(sharding, 2), (where, got.sharding)



@check
@needs_jax(jax_compat.EXPLICIT_AXES_JAX, "explicit mesh axes")
def check_reshape_batch_axis_explicit_axes() -> None:
    """microbatching.reshape_batch_axis on a batch split over explicit mesh axes (a plain
    column-major reshape asks for an output sharding there, in optax too): optax's numbers
    (computed unsharded), the split kept on the microbatch_size axis; other axes' splits
    kept."""
    import optax
    cases = [(mesh_1d(AxisType.Explicit), P("data"), (64, 3), 0, 8),
             (mesh_1d(AxisType.Explicit), P(None, "data"), (3, 64), 1, 16),
             (mesh_2d(AxisType.Explicit), P("data", "model"), (32, 4), 0, 4)]
    for mesh, spec, shape, axis, size in cases:
        x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
        want = optax.microbatching.reshape_batch_axis(x, size, axis)
        with set_mesh(mesh):
            got = jax.jit(lambda t, size=size, axis=axis: ft.microbatching.reshape_batch_axis(
                t, size, axis))(jax.device_put(x, NamedSharding(mesh, spec)))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=str(spec))
        kept = P(*spec[:axis], None, spec[axis], *spec[axis + 1:])
        assert got.sharding.is_equivalent_to(NamedSharding(mesh, kept), got.ndim), (
            spec, got.sharding)

@check
@needs_jax(LAYOUTS_JAX, LAYOUTS_WHY)
def check_mars_came() -> None:
    """contrib.mars and contrib.came on the 4x2 mesh, params split over both axes
    (MODEL_SPECS): three plain-jit steps give one device's numbers; under ``jit(init)``
    the params-shaped state (MARS's mu/nu/prev_grad, CAME's mu) follows each param's
    sharding, and CAME's row statistics (``p.shape[:-1]``) / column statistics
    (``p.shape[:-2] + p.shape[-1:]``) keep the sharding of the param's remaining axes
    (a ``P('data', 'model')`` weight: rows ``P('data')``, columns ``P('model')``)."""
    mesh = mesh_2d(AxisType.Auto)
    p_sh = {k: NamedSharding(mesh, s) for k, s in MODEL_SPECS.items()}
    xs, ys = make_batches()
    for name, opt in (("mars", ft.contrib.mars(1e-2, weight_decay=1e-2)),
                      ("came", ft.contrib.came(1e-2, weight_decay=1e-2))):
        results = []
        for params in (model_params(), jax.device_put(model_params(), p_sh)):
            state = jax.jit(opt.init)(params)
            if len(results) == 1:
                inner = state[0]
                shaped = ("mu", "nu", "prev_grad") if name == "mars" else ("mu",)
                for field in shaped:
                    for k, x in getattr(inner, field).items():
                        assert x.sharding.is_equivalent_to(p_sh[k], x.ndim), (
                            f"{name} .{field}['{k}'] is {x.sharding}, want {p_sh[k].spec}")
                if name == "came":
                    for k, spec in MODEL_SPECS.items():
                        if len(SHAPES[k]) < 2:
                            continue
                        axes = tuple(spec) + (None,) * (2 - len(tuple(spec)))
                        for field, want in (("v_row", axes[0]), ("r_row", axes[0]),
                                            ("v_col", axes[1]), ("r_col", axes[1])):
                            x = getattr(inner, field)[k]
                            assert x.sharding.is_equivalent_to(
                                NamedSharding(mesh, P(want)), 1), (
                                f"came .{field}['{k}'] is {x.sharding}, want P({want!r})")
            run = jax.jit(make_step(opt))
            for i in range(3):
                params, state = run(params, state, xs[i], ys[i], i)
            results.append(params)
        assert_close(results[1], results[0], f"{name} 4x2 vs 1 device")


@check
@needs_jax(LAYOUTS_JAX, LAYOUTS_WHY)
def check_soap() -> None:
    """contrib.soap on the 4x2 mesh, params split over both axes (MODEL_SPECS), eigenbases
    refreshed every 2 steps: three plain-jit steps (eigh, then Adam steps and one QR
    refresh) give one device's numbers, and under ``jit(init)`` and after the steps ``mu``
    and ``nu`` keep each param's sharding. The (d, d) statistics and eigenbases of axis k
    start replicated (``jit(init)``); after a step XLA splits the rows of the statistic
    ``L_k`` (from ``G_(k) G_(k)^T``) like the weight's axis k (a ``P('data', 'model')``
    weight: ``L_0`` is ``P('data')``, ``L_1`` ``P('model')``) and keeps the eigenbases
    (from eigh / QR) replicated, whole on every device (all checked).

    Run in float64 with ``max_precond_dim=16``, so that every rotated statistic has full
    rank after one batch: a rank-deficient one (the 32-axes of w1, w2) has a null space
    whose eigh basis is arbitrary, and SOAP's later updates depend on it, so one device
    and the mesh legitimately differ there (by the size of a step, float64 or not)."""
    mesh = mesh_2d(AxisType.Auto)
    p_sh = {k: NamedSharding(mesh, s) for k, s in MODEL_SPECS.items()}
    opt = ft.contrib.soap(1e-2, precondition_frequency=2, max_precond_dim=16)
    with enable_x64(True):
        xs, ys = (np.asarray(a, np.float64) for a in make_batches())
        start = {k: np.asarray(v, np.float64) for k, v in model_params().items()}
        run = jax.jit(make_step(opt))
        results = []
        for params in (jax.device_put(start), jax.device_put(start, p_sh)):
            state = jax.jit(opt.init)(params)
            for i in range(4):
                if i in (0, 3) and len(results) == 1:
                    inner = state[0]
                    for field in ("mu", "nu"):
                        for k, x in getattr(inner, field).items():
                            assert x.sharding.is_equivalent_to(p_sh[k], x.ndim), (
                                f"soap .{field}['{k}'] is {x.sharding}, want {p_sh[k].spec}")
                    for field in ("stats", "bases"):
                        for k, ms in getattr(inner, field).items():
                            axes = tuple(MODEL_SPECS[k]) + (None,) * len(SHAPES[k])
                            for ax, m in enumerate(ms):
                                rotated = m.shape != (1, 1)  # else a placeholder
                                split = P(axes[ax]) if field == "stats" and i and rotated \
                                    else P()
                                assert m.sharding.is_equivalent_to(
                                    NamedSharding(mesh, split), m.ndim), (
                                    f"soap .{field}['{k}'][{ax}] {m.shape} is {m.sharding}, "
                                    f"want {split}")
                if i < 3:
                    params, state = run(params, state, xs[i], ys[i], i)
            results.append(params)
        assert results[0]["w1"].dtype == np.float64
        assert_close(results[1], results[0], "soap 4x2 vs 1 device")


@check
def check_kron() -> None:
    """contrib.kron on the 4x2 mesh, params split over both axes (MODEL_SPECS), the
    preconditioner updated at every step: three jitted steps give one device's numbers
    (the whitening noise is one threefry draw, the same numbers however it is split).
    ``mu`` has each param's sharding under ``jit(init)``, and after the steps wherever the
    param is split (a replicated param's ``mu`` may be split further by XLA: measured,
    ``b2`` (8,) ``P()`` gets ``P('model')``). The Kronecker factors (``(d, d)``
    triangular, ``(d,)`` diagonal) start replicated (``jit(init)``: checked); after a step
    XLA places them (measured: a triangular factor's columns split like the weight's axis,
    ``proj`` ``P('data', 'model')``: ``Q_0`` ``P(None, 'data')``, ``Q_1`` ``P(None,
    'model')``), which this check leaves to XLA. The PRNG key stays replicated."""
    mesh = mesh_2d(AxisType.Auto)
    p_sh = {k: NamedSharding(mesh, s) for k, s in MODEL_SPECS.items()}
    xs, ys = make_batches()
    opt = ft.contrib.kron(1e-2, weight_decay=1e-2, preconditioner_update_probability=1.0)
    run = jax.jit(make_step(opt))
    results = []
    for params in (model_params(), jax.device_put(model_params(), p_sh)):
        state = jax.jit(opt.init)(params)
        for i in range(4):
            if len(results) == 1:
                inner = state[0]
                for k, x in inner.mu.items():
                    if i == 0 or not p_sh[k].is_fully_replicated:
                        assert x.sharding.is_equivalent_to(p_sh[k], x.ndim), (
                            f"kron .mu['{k}'] is {x.sharding}, want {p_sh[k].spec}")
                assert inner.key.sharding.is_fully_replicated, inner.key.sharding
                if i == 0:
                    for k, qs in inner.qs.items():
                        for ax, q in enumerate(qs):
                            assert q.sharding.is_fully_replicated, (
                                f"kron .qs['{k}'][{ax}] is {q.sharding} after jit(init)")
            if i < 3:
                params, state = run(params, state, xs[i], ys[i], i)
        results.append(params)
    assert_close(results[1], results[0], "kron 4x2 vs 1 device")


@check
@needs_jax(LAYOUTS_JAX, LAYOUTS_WHY)
def check_shampoo() -> None:
    """contrib.shampoo on the 4x2 mesh, params split over both axes (MODEL_SPECS): three
    plain-jit steps (the roots recomputed each step from step 1) give one device's
    numbers, and ``mu`` and ``nu`` keep each param's sharding under ``jit(init)`` and
    after the steps. The statistics and roots start replicated; after a step XLA places
    them as it sees fit (not asserted). ``matrix_eps=1e-3``: with 1e-6, float32 inverse
    roots of statistics summed in another order differ near the smallest eigenvalues by
    ~1.5e-5 absolute after 3 steps, over this file's tolerance."""
    mesh = mesh_2d(AxisType.Auto)
    p_sh = {k: NamedSharding(mesh, s) for k, s in MODEL_SPECS.items()}
    opt = ft.contrib.shampoo(1e-2, matrix_eps=1e-3, start_preconditioning_step=1)
    xs, ys = make_batches()
    run = jax.jit(make_step(opt))
    results = []
    for params in (model_params(), jax.device_put(model_params(), p_sh)):
        state = jax.jit(opt.init)(params)
        for i in range(4):
            if len(results) == 1 and i in (0, 3):
                for field in ("mu", "nu"):
                    for k, x in getattr(state[0], field).items():
                        assert x.sharding.is_equivalent_to(p_sh[k], x.ndim), (
                            f"shampoo .{field}['{k}'] is {x.sharding}, want {p_sh[k].spec}")
            if i < 3:
                params, state = run(params, state, xs[i], ys[i], i)
        results.append(params)
    assert_close(results[1], results[0], "shampoo 4x2 vs 1 device")


CHECKS.update(matrix_sharding_checks.CHECKS)  # the matrix optimizers' refresh splits
CHECKS.update(stacked_sharding_checks.CHECKS)  # sharded stacked weights


def main(names: list[str]) -> None:
    jax.config.update("jax_enable_x64", True)  # DTYPE
    results = {}
    for name in names or list(CHECKS):
        try:
            CHECKS[name]()
            results[name] = {"ok": True, "error": ""}
        except SkipCheck as e:
            results[name] = {"ok": True, "error": "", "skipped": str(e)}
        except Exception:  # noqa: BLE001 -- reported to the parent test
            results[name] = {"ok": False, "error": traceback.format_exc(limit=6)}
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
