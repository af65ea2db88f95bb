"""Tests for functrain.sharding.

The multi-device checks live in ``tests/sharding_checks.py`` and run once, in a
subprocess with 8 simulated CPU devices (``--xla_force_host_platform_device_count``
only works before JAX starts, and this pytest process already has one device);
each check is reported here as its own test. The rest runs in-process on one
device.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import functrain
from functrain import sharding as fs
from helpers import run_on_eight_devices

CHECKS_FILE = Path(__file__).with_name("sharding_checks.py")


def _load_check_names() -> list[str]:
    spec = importlib.util.spec_from_file_location("_functrain_sharding_checks", CHECKS_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines functions only; runs nothing
    return list(module.CHECKS)


CHECK_NAMES = _load_check_names()


@pytest.fixture(scope="module")
def eight_device_results(run_once) -> dict:
    return run_once("sharding_checks", lambda: run_on_eight_devices(CHECKS_FILE))


@pytest.mark.parametrize("name", CHECK_NAMES)
@pytest.mark.long
def test_on_eight_devices(eight_device_results: dict, name: str) -> None:
    result = eight_device_results.get(name)
    assert result is not None, f"{name} did not run"
    assert result["ok"], result["error"]
    if result.get("skipped"):
        pytest.skip(result["skipped"])


def test_required_sharding_checks_exist() -> None:
    # Each behaviour sharding must keep has a check (guards against one silently dropped).
    for needed in ["zero1_matches_single_device", "model_parallel_state_follows_params",
                   "trust_ratio_uses_whole_leaf", "hlo_no_moment_all_gather",
                   "multisteps_and_apply_if_finite", "eval_shape"]:
        assert any(needed in n for n in CHECK_NAMES), needed


# --------------------------------------------------------------------------
# One device, in-process
# --------------------------------------------------------------------------

PARAMS = {"w": jnp.arange(12.0).reshape(4, 3), "b": jnp.array([0.5, -1.0, 2.0]),
          "s": jnp.array(0.25)}

OPTIMIZERS = {
    "adam": functrain.adam(1e-3, mu_dtype=jnp.bfloat16),
    "lamb": functrain.lamb(1e-3),
    "lars": functrain.lars(1e-3),
    "rmsprop": functrain.rmsprop(1e-3, initial_scale=0.3, centered=True, momentum=0.9),
    "adagrad": functrain.adagrad(1e-2, initial_accumulator_value=0.1),
    "sgd": functrain.sgd(1e-2, momentum=0.9),
    "clip+adamw": functrain.chain(functrain.clip_by_global_norm(1.0), functrain.adamw(1e-3)),
    "adamw(mask)": functrain.adamw(1e-3, mask={"w": True, "b": False, "s": False}),
    "masked": functrain.masked(functrain.adam(1e-3), {"w": True, "b": False, "s": False}),
    "MultiSteps": functrain.MultiSteps(functrain.adam(1e-3), every_k_schedule=2),
    "apply_if_finite": functrain.apply_if_finite(functrain.lamb(1e-3), 2),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_jit_init_equals_eager_init(name: str) -> None:
    """The traced initialisation (shard_alike path) gives the same numbers and dtypes."""
    opt = OPTIMIZERS[name]
    eager, traced = opt.init(PARAMS), jax.jit(opt.init)(PARAMS)
    functrain.tree.check_structure(eager, traced, "jit(init)", "init")
    for a, b in zip(jax.tree_util.tree_leaves(eager), jax.tree_util.tree_leaves(traced)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_state_shardings_single_device(name: str) -> None:
    opt = OPTIMIZERS[name]
    state = jax.jit(opt.init)(PARAMS)
    predicted = fs.state_shardings(opt, PARAMS)
    functrain.tree.check_structure(state, predicted, "state_shardings", "jit(init)")
    for x, s in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(predicted)):
        assert x.sharding.is_equivalent_to(s, x.ndim), (x.sharding, s)
    abstract = fs.abstract_state(opt, jax.eval_shape(lambda: PARAMS))
    assert [(a.shape, a.dtype) for a in jax.tree_util.tree_leaves(abstract)] == [
        (x.shape, x.dtype) for x in jax.tree_util.tree_leaves(state)]


def test_state_shardings_follow_a_mesh_on_one_device() -> None:
    mesh = jax.make_mesh((1, 1), ("data", "model"))
    specs = {"w": P("data", "model"), "b": P("model"), "s": P()}
    abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, specs[k]))
                for k, v in PARAMS.items()}
    shardings = fs.state_shardings(functrain.lamb(1e-3), abstract)
    assert shardings[0].mu["w"].spec == P("data", "model")
    assert shardings[0].nu["b"].spec == P("model")
    assert shardings[0].count == NamedSharding(mesh, P())
    # Masked leaves keep their placeholder.
    masked = fs.state_shardings(OPTIMIZERS["masked"], abstract)
    assert isinstance(masked.inner_state[0].mu["b"], functrain.MaskedNode)
    assert masked.inner_state[0].mu["w"].spec == P("data", "model")


def test_state_shardings_of_quantized_state() -> None:
    """adamw_8bit's state: a quantized leaf is a node (codes, scales) of other shapes, so
    replicated; a small leaf left in float32 beside it keeps its parameter's sharding."""
    mesh = jax.make_mesh((1, 1), ("data", "model"))
    shapes = {"w": ((64, 128), P("data", "model")), "b": ((8,), P("model"))}
    abstract = {k: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))
                for k, (shape, spec) in shapes.items()}
    opt = functrain.adamw_8bit(1e-3, min_size=64)
    shardings = fs.state_shardings(opt, abstract)
    assert jax.tree.structure(shardings) == jax.tree.structure(jax.eval_shape(opt.init,
                                                                               abstract))
    assert isinstance(shardings[0].mu["w"], functrain.QuantizedArray)
    assert shardings[0].mu["w"].codes.spec == P() and shardings[0].nu["w"].absmax.spec == P()
    assert shardings[0].mu["b"].spec == P("model")
    assert jax.tree.structure(fs.abstract_state(opt, abstract)) == jax.tree.structure(
        jax.eval_shape(opt.init, abstract))


def test_state_shardings_odd_shaped_buffers_are_replicated() -> None:
    # sm3 keeps, per matrix, one vector of statistics per axis (shapes (4,) and (3,) for a
    # (4, 3) weight, optax's layout): they have no parameter layout to follow, so they are
    # replicated, while same-shaped buffers beside them follow their parameter.
    mesh = jax.make_mesh((1, 1), ("data", "model"))
    specs = {"w": P("data", "model"), "b": P("model"), "s": P()}
    abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, specs[k]))
                for k, v in PARAMS.items()}
    shardings = fs.state_shardings(functrain.sm3(1e-3), abstract)[0]
    assert [a.spec for a in shardings.mu["w"]] == [P(), P()]
    assert shardings.mu["s"][0].spec == P() and shardings.mu["b"][0].spec == P("model")
    assert shardings.nu["w"].spec == P("data", "model")


def test_zero_shardings_on_one_device_mesh() -> None:
    mesh = jax.make_mesh((1,), ("data",))
    state = functrain.adam(1e-3).init(PARAMS)
    shardings = fs.zero_shardings(state, mesh)
    assert shardings[0].mu["w"].spec == P("data", None)
    assert shardings[0].mu["b"].spec == P("data")
    assert shardings[0].mu["s"].spec == P()
    assert shardings[0].count.spec == P()
    placed = jax.device_put(state, shardings)
    assert placed[0].mu["w"].sharding == shardings[0].mu["w"]
    kept = fs.zero_shardings(state, mesh, min_size=4)
    assert kept[0].mu["b"].spec == P(None) and kept[0].mu["w"].spec == P("data", None)


def test_zero_shardings_errors_name_the_problem() -> None:
    mesh = jax.make_mesh((1,), ("data",))
    with pytest.raises(ValueError, match="axis 'batch' is not in the mesh"):
        fs.zero_shardings({"w": jnp.zeros(2)}, mesh, axis="batch")
    with pytest.raises(TypeError, match=r"\['tag'\] is a str"):
        fs.zero_shardings({"tag": "x", "w": jnp.zeros(2)}, mesh)
    other = jax.make_mesh((1,), ("model",))
    leaf = jax.ShapeDtypeStruct((2,), jnp.float32, sharding=NamedSharding(other, P("model")))
    with pytest.raises(ValueError, match=r"\['w'\] is sharded over mesh axis 'model'"):
        fs.zero_shardings({"w": leaf}, mesh)


def test_per_device_bytes_one_device() -> None:
    state = functrain.adam(1e-3).init(PARAMS)
    (total,) = fs.per_device_bytes(state).values()
    assert total == sum(x.nbytes for x in jax.tree_util.tree_leaves(state))
    assert fs.per_device_bytes({"np": np.zeros(3)}) == {}
