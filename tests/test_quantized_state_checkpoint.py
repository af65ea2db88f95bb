"""Quantized optimizer state through Orbax checkpoints and ZeRO-1.

* Orbax: 8-bit, 4-bit and fp8 AdamW state saved with ``StandardCheckpointer`` and restored
  into ``jax.eval_shape(opt.init)`` comes back bit-identical (codes, float8 values,
  absmax, the small float32 leaves, the count; the static shape/dtype/code of each
  :class:`~functrain.QuantizedArray`), and a run continued from the restored state is
  bit-identical to the run that never stopped. A checkpoint restored into a state of
  another code (8-bit into fp8 or 4-bit, 4-bit with rank-1 scales into per-block ones,
  ...) raises an error naming both codes: each QuantizedArray names its code in its
  pytree keys, and Orbax restores by key.
* ZeRO-1: with :func:`functrain.sharding.zero_shardings` on 8 CPU devices, each device
  holds the scale (``absmax``) of every block whose codes it holds; where the block count
  divides by 8 both are split along the blocks, block ``i``'s codes and scale on the same
  device, each device 1/8 of the bytes. Ten jitted, donated steps give bit-identical
  parameters and state to one device's, and a checkpoint of the sharded state restores
  into both layouts.
* Parameters split over the 8 devices (model parallel): state from ``jax.jit(opt.init)``,
  ten steps bit-identical to one device's; with explicit mesh axes the blocks follow the
  parameter's split where whole blocks line up.

Each 8-device check runs with explicit mesh axes (``jax.make_mesh``'s default) and with
automatic ones.

The 8-device part runs this file as a script in a subprocess started with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (the flag works only before JAX
starts; this pytest process has one device), as ``tests/test_sharding.py`` does; the
script prints one JSON line ``{check: {"ok": bool, "error": str}}``.
"""

from __future__ import annotations

import json
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp  # the [orbax] extra, which make test installs
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import functrain
from functrain import jax_compat, sharding as fs
from functrain.quantization import CODES, QuantizedArray
from helpers import AXIS_TYPES, SkipCheck, run_on_eight_devices

OPTIMIZERS: dict[str, Callable[[], Any]] = {
    "8bit": lambda: functrain.adamw_8bit(1e-2, weight_decay=1e-2, min_size=64),
    "4bit": lambda: functrain.adamw_4bit(1e-2, weight_decay=1e-2, min_size=64),
    "fp8": lambda: functrain.adamw_fp8(1e-2, weight_decay=1e-2, min_size=64),
}
# The 4-bit state with per-block second-moment scales (not a preset): restores only.
OTHER_CODES: dict[str, Callable[[], Any]] = {
    **OPTIMIZERS, "4bit_block": lambda: functrain.quantized_state(
        functrain.adamw(1e-2, weight_decay=1e-2), bits=4, min_size=64, rank1=False)}
# "w": 8192 values, 32 blocks of 256 (8-bit, fp8) or 64 of 128 (4-bit): divisible by 8.
# "odd": 4800 values, 19 or 38 blocks (not divisible by 8; the last block padded).
# "b": below min_size, stays float32.
SHAPES = {"w": (64, 128), "odd": (24, 200), "b": (8,)}


def make_params() -> dict:
    rng = np.random.default_rng(0)
    return {k: jnp.asarray(rng.standard_normal(s) * 0.5, jnp.float32) for k, s in SHAPES.items()}


def make_grads(step: int) -> dict:
    rng = np.random.default_rng(100 + step)
    return {k: jnp.asarray(rng.standard_normal(s) * 10.0 ** rng.uniform(-3, 0), jnp.float32)
            for k, s in SHAPES.items()}


def step_fn(opt: Any) -> Callable:
    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return functrain.apply_updates(params, updates), state
    return step


def train(step: Callable, params: dict, state: Any, start: int, steps: int) -> tuple:
    for t in range(start, start + steps):
        params, state = step(params, state, make_grads(t))
    return params, state


def is_quantized(x: Any) -> bool:
    return isinstance(x, QuantizedArray)


def assert_bit_identical(a: Any, b: Any, what: str) -> None:
    """Same structure (QuantizedArray's static fields included), dtypes and bytes."""
    assert jax.tree.structure(a) == jax.tree.structure(b), what
    qa = [x for x in jax.tree.leaves(a, is_leaf=is_quantized) if is_quantized(x)]
    qb = [x for x in jax.tree.leaves(b, is_leaf=is_quantized) if is_quantized(x)]
    assert [(q.shape, q.dtype, q.code) for q in qa] == [(q.shape, q.dtype, q.code) for q in qb]
    paths = jax.tree_util.tree_flatten_with_path(a)[0]
    for (path, x), y in zip(paths, jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        where = f"{what}{jax.tree_util.keystr(path)}"
        assert x.dtype == y.dtype and x.shape == y.shape, (where, x.dtype, y.dtype)
        assert np.array_equal(x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8)), where


def has_rank1(tree: Any) -> bool:
    return any(CODES[q.code].scaling == "rank1" for q in jax.tree.leaves(
        tree, is_leaf=is_quantized) if is_quantized(q))


def assert_same_run(a: Any, b: Any, what: str) -> None:
    """Bit-identical, except with rank-1 scaled codes: there the eight-device program's
    float values may differ from one device's by a few ulps (XLA rounds the sharded
    second moment's EMA differently; measured after 13 steps: the scales 3 ulps, the
    parameters 1.2e-7 apart), so the same codes, counts, structure and dtypes, and the
    floating leaves within 1e-6 (absolute and relative)."""
    if not has_rank1(a):
        return assert_bit_identical(a, b, what)
    assert jax.tree.structure(a) == jax.tree.structure(b), what
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
        x, y, where = np.asarray(x), np.asarray(y), f"{what}{jax.tree_util.keystr(path)}"
        assert x.dtype == y.dtype and x.shape == y.shape, where
        if np.issubdtype(x.dtype, np.floating) and x.dtype.itemsize == 4:
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6, err_msg=where)
        else:  # codes (uint8, float8) and counts
            assert np.array_equal(x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8)), where


def save(path: Path, tree: Any) -> None:
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, tree)
    checkpointer.wait_until_finished()


def restore(path: Path, target: Any) -> Any:
    return ocp.StandardCheckpointer().restore(path, target)


# --------------------------------------------------------------------------
# Orbax, one device
# --------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_orbax_round_trip_is_bit_identical_and_the_run_continues_exactly(name, tmp_path):
    opt = OPTIMIZERS[name]()
    step = jax.jit(step_fn(opt), donate_argnums=1)
    params = make_params()
    params, state = train(step, params, opt.init(params), 0, 4)
    kinds = {q.code for q in jax.tree.leaves(state, is_leaf=is_quantized) if is_quantized(q)}
    assert len(kinds) == (1 if name == "fp8" else 2)            # mu's and nu's codes
    codes_dtype = jnp.float8_e4m3fn if name == "fp8" else jnp.uint8
    assert state[0].mu["w"].codes.dtype == codes_dtype

    save(tmp_path / "ckpt", {"params": params, "opt_state": state})
    target = jax.eval_shape(lambda: {"params": params, "opt_state": opt.init(params)})
    restored = restore(tmp_path / "ckpt", target)
    assert_bit_identical(restored, {"params": params, "opt_state": state}, "restored")
    assert isinstance(restored["opt_state"][0].nu["odd"], QuantizedArray)

    # Six more steps from the restored state and from the in-memory one: bit-identical.
    # (The in-memory state is copied first: the step donates it.)
    state_copy = jax.tree.map(jnp.copy, state)
    before = np.asarray(restored["opt_state"][0].mu["w"].codes).view(np.uint8)
    p1, s1 = train(step, restored["params"], restored["opt_state"], 4, 6)
    p2, s2 = train(step, params, state_copy, 4, 6)
    assert_bit_identical({"p": p1, "s": s1}, {"p": p2, "s": s2}, "continued")
    # ... and the state did move (the comparison is not of two frozen states).
    assert not np.array_equal(np.asarray(s1[0].mu["w"].codes).view(np.uint8), before)


@pytest.mark.parametrize("saved,into,codes", [
    ("8bit", "fp8", ("dynamic8_signed", "fp8")),
    ("8bit", "4bit", ("dynamic8_signed", "dynamic4_signed_sr")),
    ("fp8", "8bit", ("fp8", "dynamic8_signed")),
    ("4bit", "4bit_block", ("linear4_unsigned_rank1", "linear4_unsigned")),
    ("4bit_block", "4bit", ("linear4_unsigned", "linear4_unsigned_rank1")),
])
def test_a_restore_into_another_code_raises_naming_both(saved, into, codes, tmp_path):
    # Before the codes were in the keys, 8-bit into fp8 restored silently (uint8 codes
    # cast to float8 values: a mu off by 0.98 of its maximum) and 4-bit block scales
    # were read as rank-1 ones.
    params = make_params()
    state = OTHER_CODES[saved]().init(params)
    save(tmp_path / "ckpt", {"params": params, "opt_state": state})
    target = jax.eval_shape(lambda: {"params": params,
                                     "opt_state": OTHER_CODES[into]().init(params)})
    with pytest.raises(ValueError) as error:
        restore(tmp_path / "ckpt", target)
    message = str(error.value)
    for code in codes:  # each as a whole key (one name is a prefix of another)
        assert f"'codes_{code}'" in message, (code, message[:2000])


# --------------------------------------------------------------------------
# ZeRO-1 on 8 devices (run by the subprocess below)
# --------------------------------------------------------------------------

CHECKS: dict[str, Callable[[], None]] = {}


def held_rows(sharding: Any, shape: tuple) -> dict:
    """device -> the set of first-axis indices (blocks) it holds a piece of."""
    return {d: set(range(*idx[0].indices(shape[0])))
            for d, idx in sharding.devices_indices_map(shape).items()}


def expect_consistent_split(state: Any, shardings: Any, name: str) -> None:
    """Each device holds the absmax of every block it holds codes of; divisible leaves
    are split along the blocks, the same 1/8 of the blocks in codes and absmax."""
    quantized = [(q, s) for q, s in zip(jax.tree.leaves(state, is_leaf=is_quantized),
                                        jax.tree.leaves(shardings, is_leaf=is_quantized))
                 if is_quantized(q)]
    assert len(quantized) == 4, (name, len(quantized))         # mu, nu of w and odd
    for q, s in quantized:
        blocks = q.codes.shape[0]
        assert q.codes.sharding.is_equivalent_to(s.codes, 2), name
        assert q.absmax.sharding.is_equivalent_to(s.absmax, 1), name
        if CODES[q.code].scaling == "rank1":  # scales per row and column, not per block
            assert blocks % 8 or s.codes.spec == P("data", None), (name, s)
            continue
        codes_rows = held_rows(q.codes.sharding, q.codes.shape)
        scale_rows = held_rows(q.absmax.sharding, q.absmax.shape)
        for device, rows in codes_rows.items():
            assert rows <= scale_rows[device], (name, q.shape, device)
        if blocks % 8 == 0:
            assert s.codes.spec == P("data", None) and s.absmax.spec == P("data"), (name, s)
            assert codes_rows == scale_rows, (name, q.shape)
            assert all(len(r) == blocks // 8 for r in codes_rows.values())
            for shard in (*q.codes.addressable_shards, *q.absmax.addressable_shards):
                parent = q.codes if shard.data.ndim == 2 else q.absmax
                assert shard.data.nbytes * 8 == parent.nbytes
        else:  # no whole-block split: each device holds a slice of every block, all scales
            assert s.absmax.is_fully_replicated, (name, s)


def zero1_run(name: str, axis_type: AxisType) -> None:
    mesh = jax.make_mesh((8,), ("data",), axis_types=(axis_type,))
    opt = OTHER_CODES[name]()
    params = make_params()
    replicated = NamedSharding(mesh, P())
    s_sh = fs.zero_shardings(jax.eval_shape(opt.init, params), mesh, "data")
    sharded_step = jax.jit(step_fn(opt), in_shardings=(replicated, s_sh, replicated),
                           out_shardings=(replicated, s_sh), donate_argnums=1)
    single_step = jax.jit(step_fn(opt), donate_argnums=1)

    p8, s8 = train(sharded_step, jax.device_put(params, replicated),
                   jax.device_put(opt.init(params), s_sh), 0, 10)
    p1, s1 = train(single_step, params, opt.init(params), 0, 10)
    expect_consistent_split(s8, s_sh, name)
    assert_same_run({"p": p8, "s": s8}, {"p": p1, "s": s1}, f"{name} 8 vs 1 device")

    # The sharded state's bytes per device: 1/8 of the divisible leaves' codes and scales.
    per_device = fs.per_device_bytes(s8)
    assert len(per_device) == 8 and len(set(per_device.values())) == 1, per_device
    total = sum(x.nbytes for x in jax.tree.leaves(s8))
    assert next(iter(per_device.values())) < 0.3 * total, (per_device, total)

    # A checkpoint of the sharded state restores into the ZeRO-1 layout and onto one
    # device, bit-identical, and the run continues exactly (see assert_same_run) from
    # either.
    with tempfile.TemporaryDirectory() as tmp:
        save(Path(tmp) / "ckpt", {"params": p8, "opt_state": s8})
        zero_target = {"params": jax.tree.map(
            lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=replicated), params),
            "opt_state": fs.abstract_state(opt, params, s_sh)}
        back8 = restore(Path(tmp) / "ckpt", zero_target)
        back1 = restore(Path(tmp) / "ckpt", jax.eval_shape(
            lambda: {"params": params, "opt_state": opt.init(params)}))
    expect_consistent_split(back8["opt_state"], s_sh, name)
    for back in (back8, back1):
        assert_bit_identical(back, {"params": p8, "opt_state": s8}, f"{name} restored")
    q8 = train(sharded_step, back8["params"], back8["opt_state"], 10, 3)
    q1 = train(single_step, back1["params"], back1["opt_state"], 10, 3)
    assert_same_run(q8, q1, f"{name} continued")


def split_params_run(name: str, axis_type: AxisType) -> None:
    """Parameters split over 8 devices on their first dimension (model parallel): the
    state comes from ``opt.init`` under jit, the step has no stated shardings, and ten
    steps equal one device's bit for bit. With explicit axes, ``w``'s blocks follow its
    split (whole blocks per shard) and ``odd``'s (a padded last block) are replicated."""
    mesh = jax.make_mesh((8,), ("data",), axis_types=(axis_type,))
    opt = OTHER_CODES[name]()
    params = make_params()
    split = jax.device_put(params, NamedSharding(mesh, P("data")))
    step = jax.jit(step_fn(opt))
    p8, s8 = train(step, split, jax.jit(opt.init)(split), 0, 10)
    p1, s1 = train(step, params, opt.init(params), 0, 10)
    assert_same_run({"p": p8, "s": s8}, {"p": p1, "s": s1}, f"{name} split vs 1 device")
    for k in params:
        assert p8[k].sharding.is_equivalent_to(NamedSharding(mesh, P("data")), p8[k].ndim)
    if axis_type == AxisType.Explicit:
        for q in (s8[0].mu["w"], s8[0].nu["w"]):
            assert q.codes.sharding.spec == P("data", None), q.codes.sharding
            if CODES[q.code].scaling == "rank1":  # the rows' and columns' maxima: all
                assert q.absmax.sharding.is_fully_replicated, q.absmax.sharding
            else:
                assert q.absmax.sharding.spec == P("data"), q.absmax.sharding
        for q in (s8[0].mu["odd"], s8[0].nu["odd"]):
            assert q.codes.sharding.is_fully_replicated, q.codes.sharding


def needs_axis_type(axis_type: AxisType) -> None:
    if axis_type not in AXIS_TYPES:
        raise SkipCheck(f"explicit mesh axes need JAX >= {jax_compat.EXPLICIT_AXES_JAX} "
                        f"(this is {jax.__version__})")


# Explicit axes (jax.make_mesh's default: sharding in types) and automatic ones.
for _name in ("8bit", "4bit", "4bit_block", "fp8"):  # 4-bit with and without rank-1
    for _type in (AxisType.Explicit, AxisType.Auto):
        def _check(name: str = _name, axis_type: AxisType = _type) -> None:
            needs_axis_type(axis_type)
            zero1_run(name, axis_type)

        def _split(name: str = _name, axis_type: AxisType = _type) -> None:
            needs_axis_type(axis_type)
            split_params_run(name, axis_type)
        CHECKS[f"check_zero1_{_name}_{_type.name.lower()}"] = _check
        CHECKS[f"check_split_params_{_name}_{_type.name.lower()}"] = _split


def run_checks() -> dict:
    assert jax.device_count() == 8, jax.devices()
    results = {}
    for name, fn in CHECKS.items():
        try:
            fn()
            results[name] = {"ok": True, "error": ""}
        except SkipCheck as e:
            results[name] = {"ok": True, "error": "", "skipped": str(e)}
        except Exception:  # noqa: BLE001 -- reported to the parent test
            results[name] = {"ok": False, "error": traceback.format_exc()[-3000:]}
    return results


@pytest.fixture(scope="module")
def eight_device_results(run_once) -> dict:
    return run_once("quantized_state_checkpoint",
                    lambda: run_on_eight_devices(Path(__file__).resolve()))


@pytest.mark.parametrize("name", sorted(CHECKS))
@pytest.mark.long
def test_zero1_on_eight_devices(eight_device_results: dict, name: str) -> None:
    result = eight_device_results.get(name)
    assert result is not None, f"{name} did not run"
    assert result["ok"], result["error"]
    if result.get("skipped"):
        pytest.skip(result["skipped"])


if __name__ == "__main__":
    print(json.dumps(run_checks()))
