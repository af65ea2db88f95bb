"""README.md's "What it does beyond optax" table, row by row, backed by tests.

Each row of the table (between ``<!-- table:beyond-optax:start -->`` and
``<!-- table:beyond-optax:end -->``) claims what functrain does and what optax 0.2.8 does.
``ROW_TESTS`` names, for each row (its first cell, exactly as written), the tests that
check its claim: tests elsewhere in ``tests/``, and the ``test_row_*`` tests of this file
where no other test checked the claim (or checked only functrain's side of it). A change of
behaviour then fails a named test until the README says the new truth.

``test_every_row_of_the_beyond_optax_table_names_its_tests`` keeps the two in step: every
row has an entry, every entry is a row, and every test named exists (read with ``ast``,
nothing imported).

When a row changes:

* reworded first cell: rename its key in ``ROW_TESTS``;
* new claim: add the tests that check it (write a ``test_row_*`` test here if none does),
  and name them in the row's entry;
* row removed: remove its entry (and any ``test_row_*`` test only it used);
* a named test renamed or moved: update its node id.

Node ids are ``tests/<path>.py::<function>``, without parametrization brackets (a
parametrized test is named once, for all its cases).
"""

from __future__ import annotations

import ast
import inspect
import math
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from functrain import jax_compat
from helpers import FAST_COMPILE, fast_jit, run_on_eight_devices

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TABLE_START = "<!-- table:beyond-optax:start -->"
TABLE_END = "<!-- table:beyond-optax:end -->"
THIS = "tests/test_readme_promises.py"

ROW_TESTS: dict[str, tuple[str, ...]] = {
    "LAMB layer adaptation for biases / norm scales": (
        "tests/families/test_adam_optimizers.py::test_lamb_trust_ratio_mask_skips_adaptation",
        "tests/families/test_adam_optimizers.py::test_lamb_max_trust_ratio_caps_the_ratio",
        f"{THIS}::test_row_lamb_optax_adapts_every_leaf_without_a_cap",
    ),
    "bf16 second moments": (
        "tests/families/test_adam_optimizers.py::"
        "test_nu_dtype_stores_bf16_second_moment_and_stays_close",
        "tests/families/test_adam_optimizers.py::test_bf16_moments_lose_precision_only_in_storage",
        f"{THIS}::test_row_optax_offers_only_mu_dtype",
    ),
    "float16 params, all-zero gradients": (
        "tests/engine/test_program.py::test_low_precision_zero_gradients_give_finite_updates",
        "tests/families/test_adam_optimizers.py::"
        "test_optax_adam_float16_zero_gradients_is_nan_and_ours_is_zero",
    ),
    "`clip_by_global_norm(0.0)` on zero gradients": (
        "tests/transforms/test_clipping.py::test_clip_by_global_norm_zero_max_norm_zero_grads",
        f"{THIS}::test_row_clip_by_global_norm_zero_on_zero_gradients",
    ),
    "complex parameters": (
        "tests/test_properties.py::test_complex_matches_optax",
        "tests/test_properties.py::test_complex_rejected_with_clear_error",
        "tests/test_errors.py::test_complex_leaves_rejected_where_there_is_no_complex_version",
        f"{THIS}::test_row_complex_second_moments_and_optax_errors",
    ),
    "integer or bool leaves": (
        "tests/engine/test_integer_leaves.py::"
        "test_integer_params_of_stateful_stages_keep_float_state",
        "tests/engine/test_integer_leaves.py::test_bool_leaves_are_refused_naming_the_leaf",
        "tests/test_errors.py::test_bool_updates_are_rejected_naming_the_leaf",
        f"{THIS}::test_row_bool_leaf_error_names_the_remedy_and_optax_int_moments",
    ),
    '`adam("0.1")`, `adam(float("nan"))`': (
        "tests/test_errors.py::test_bad_learning_rates_name_the_argument_and_optimizer",
        f"{THIS}::test_row_optax_takes_a_string_or_nan_learning_rate",
    ),
    "bad input (tree, shape, missing params, mask, hyperparameter)": (
        "tests/test_errors.py::test_structure_mismatch_names_the_path",
        "tests/test_errors.py::test_shape_mismatch_names_leaf_and_both_shapes",
        "tests/test_errors.py::test_params_shape_mismatch",
        "tests/test_errors.py::test_params_required",
        "tests/test_errors.py::test_mask_that_does_not_fit",
        "tests/test_errors.py::test_invalid_hyperparameters_name_the_argument",
        "tests/test_errors.py::test_errors_come_before_array_math",
        "tests/wrappers/test_masking.py::test_mask_that_does_not_fit_names_path_and_wrapper",
        f"{THIS}::test_row_optax_bad_input_errors_are_generic_or_absent",
    ),
    "`apply_if_finite` after `max_consecutive_errors` non-finite steps": (
        "tests/wrappers/test_finite.py::test_apply_if_finite_counter_resets_after_forced_update",
        f"{THIS}::test_row_apply_if_finite_optax_never_resets_its_counter",
    ),
    "state of `jax.jit(opt.init)` for sharded params": (
        # its check_model_parallel_state_follows_params and check_explicit_axes_state_follows_params
        "tests/test_sharding.py::test_on_eight_devices",
        f"{THIS}::test_row_jit_init_state_follows_sharded_params",
    ),
    "Muon on stacked layers, conv kernels": (
        "tests/contrib/test_contrib_muon.py::test_stacked_leaf_equals_separate_layers",
        "tests/contrib/test_contrib_muon.py::test_conv_kernel_equals_its_reshaped_matrix",
        f"{THIS}::test_row_optax_muon_takes_2d_leaves_only_by_default",
    ),
    "Muon's Newton-Schulz memory": (
        "tests/contrib/test_contrib_muon.py::test_newton_schulz_memory_does_not_grow_with_ns_steps",
        f"{THIS}::test_row_newton_schulz_temporaries_at_5_and_20_steps",
    ),
    "Muon, `reshape_batch_axis` on meshes with explicit axes (`jax.make_mesh`'s default)": (
        # its check_muon_model_sharded_weight and check_reshape_batch_axis_explicit_axes
        "tests/test_sharding.py::test_on_eight_devices",
        f"{THIS}::test_row_muon_and_reshape_batch_axis_on_explicit_axes",
    ),
    "`multi_transform` label with no leaves": (
        "tests/wrappers/test_masking.py::test_transformation_no_leaf_uses_is_allowed_as_in_optax",
        "tests/wrappers/test_masking.py::"
        "test_label_without_transform_and_unused_transform_list_both_sides",
    ),
    "line searches": (
        "tests/families/test_quasi_newton_linesearch.py::test_jitted_step_compiles_once",
        "tests/families/test_quasi_newton_linesearch.py::test_stops_cleanly_at_the_step_limit",
        "tests/families/test_quasi_newton_linesearch.py::test_rosenbrock_matches_optax",
    ),
    "8-bit, 4-bit and fp8 optimizer state for any optimizer": (
        "tests/test_quantized_state.py::test_state_bytes_per_parameter",
        "tests/test_quantized_state.py::test_8bit_adamw_meets_bitsandbytes_bars",
        "tests/test_quantized_state.py::test_4bit_adamw_against_float32",
        "tests/test_quantized_state.py::test_fp8_adamw_against_float32",
        "tests/test_quantized_engine.py::test_per_leaf_pass_gives_the_whole_state_paths_numbers",
        "tests/test_quantized_engine.py::test_compiled_scratch_is_one_leaf_at_a_time",
        f"{THIS}::test_row_quantized_state_bytes_and_peak_on_the_benchmark_tree",
        f"{THIS}::test_row_optax_offers_only_mu_dtype",
    ),
    "ZeRO-1 state sharding, sharded checkpoint restore": (
        "tests/test_sharding.py::test_zero_shardings_on_one_device_mesh",
        "tests/test_sharding.py::test_zero_shardings_errors_name_the_problem",
        "tests/test_sharding.py::test_state_shardings_single_device",
        "tests/test_sharding.py::test_state_shardings_follow_a_mesh_on_one_device",
        # its check_zero1_matches_single_device and check_zero1_per_device_bytes
        "tests/test_sharding.py::test_on_eight_devices",
        "tests/test_integrations.py::"
        "test_orbax_restore_into_sharded_layout_from_functrain_sharding",
    ),
    "Ivy / MLX / MXNet gradient API": (
        "tests/test_grad.py::test_functrain_grad_is_the_function",
        "tests/test_grad.py::test_top_level_exports",
        "tests/test_grad.py::test_value_and_grad_seed",
        "tests/test_grad.py::test_jac_seed",
        "tests/test_grad.py::test_execute_with_gradients_seed_container",
        "tests/test_grad.py::test_stop_gradient_blocks_the_gradient",
        "tests/test_compat.py::test_module_exports",
        "tests/test_compat.py::test_adam_step_seed_one_container",
        "tests/test_compat.py::test_adam_update_seed_array",
        "tests/test_compat.py::test_lamb_update_seed_array",
        "tests/test_compat.py::test_lars_update_seed_arrays",
        "tests/test_compat.py::test_gradient_descent_update_seed_arrays",
        "tests/test_compat.py::test_optimizer_update_seed_arrays",
    ),
    "a whole optimizer chain": (
        "tests/engine/test_program.py::"
        "test_chain_fuses_the_stages_into_one_walk_with_optax_numbers",
    ),
}


# --------------------------------------------------------------------------
# The table and the mapping agree
# --------------------------------------------------------------------------

def table_rows(text: str) -> list[str]:
    """The first cell of each row of the beyond-optax table in ``text`` (header and
    separator left out), stripped, in order."""
    start, end = text.index(TABLE_START), text.index(TABLE_END)
    lines = [line.strip() for line in text[start + len(TABLE_START):end].splitlines()]
    rows = [line for line in lines if line.startswith("|")]
    assert len(rows) > 2, "the beyond-optax table has no rows"
    # An escaped pipe (\|) is part of a cell.
    return [re.split(r"(?<!\\)\|", row)[1].strip() for row in rows[2:]]


def top_level_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def named_test_problems(mapping: dict[str, tuple[str, ...]]) -> list[str]:
    """What is wrong with the node ids of ``mapping`` (claim -> the tests that check it):
    an entry that names no test, a node id that is not ``tests/<file>.py::<test function>``
    (no parametrization brackets), a file that does not exist, or a function that is not a
    top-level function of its file (read with ``ast``, nothing imported). Empty: all good."""
    functions: dict[str, set[str]] = {}
    problems = []
    for key, node_ids in mapping.items():
        if not node_ids:
            problems.append(f"{key!r}: no test named")
        for node_id in node_ids:
            path, sep, name = node_id.partition("::")
            if not sep or "[" in name or "::" in name or not name.startswith("test"):
                problems.append(f"{key!r}: {node_id!r} is not tests/<file>.py::<test function>")
                continue
            if not (path.startswith("tests/") and path.endswith(".py")
                    and (ROOT / path).is_file()):
                problems.append(f"{key!r}: {node_id!r}: no file {path}")
                continue
            if path not in functions:
                functions[path] = top_level_functions(ROOT / path)
            if name not in functions[path]:
                problems.append(f"{key!r}: {node_id!r}: {path} has no top-level {name}")
    return problems


def test_every_row_of_the_beyond_optax_table_names_its_tests():
    rows = table_rows(README.read_text())
    assert len(rows) == len(set(rows)), f"two rows share a first cell: {rows}"
    missing = [row for row in rows if row not in ROW_TESTS]
    assert not missing, f"README rows with no entry in ROW_TESTS: {missing}"
    stale = [key for key in ROW_TESTS if key not in rows]
    assert not stale, f"ROW_TESTS entries that are no README row: {stale}"
    problems = named_test_problems(ROW_TESTS)
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------
# The rows' claims no other test checked (optax's side, mostly)
# --------------------------------------------------------------------------

def test_row_lamb_optax_adapts_every_leaf_without_a_cap():
    """optax.lamb has no trust_ratio_mask and no max_trust_ratio: a bias leaf's first step
    is scaled by ||p|| / ||u|| however large. functrain's lamb does the same by default; its
    trust_ratio_mask leaves a leaf out, and max_trust_ratio caps the ratio."""
    parameters = inspect.signature(optax.lamb).parameters
    assert "trust_ratio_mask" not in parameters and "max_trust_ratio" not in parameters
    params = {"w": jnp.array([3.0, 4.0]), "b": jnp.array([300.0, 400.0])}
    grads = {"w": jnp.array([1.0, -1.0]), "b": jnp.array([1.0, -1.0])}
    adam_step = np.array([1.0, -1.0]) / (1 + 1e-6)  # g / (|g| + eps), eps 1e-6
    ratio = lambda p: np.linalg.norm(p) / np.linalg.norm(adam_step)  # noqa: E731

    optimizers = (optax.lamb(0.1), ft.lamb(0.1),
                  ft.lamb(0.1, trust_ratio_mask={"w": True, "b": False}, max_trust_ratio=2.0))
    first_steps = fast_jit(lambda g, p: [opt.update(g, opt.init(p), p)[0] for opt in optimizers])
    theirs, default, ours = first_steps(grads, params)
    assert ratio(params["b"]) > 300  # the bias leaf is adapted, uncapped
    for key in params:
        np.testing.assert_allclose(theirs[key], -0.1 * ratio(params[key]) * adam_step,
                                   rtol=1e-5)
        np.testing.assert_allclose(default[key], theirs[key], rtol=1e-5)
    assert ratio(params["w"]) > 2.0
    np.testing.assert_allclose(ours["w"], -0.1 * 2.0 * adam_step, rtol=1e-5)  # capped
    np.testing.assert_allclose(ours["b"], -0.1 * adam_step, rtol=1e-5)        # left out


def test_row_optax_offers_only_mu_dtype():
    """optax's adam and adamw take a mu_dtype and no nu_dtype (its lamb neither), and optax
    has no quantized state; functrain's adam, adamw and lamb take nu_dtype too."""
    for name in ("adam", "adamw"):
        parameters = inspect.signature(getattr(optax, name)).parameters
        assert "mu_dtype" in parameters and "nu_dtype" not in parameters, name
    assert "nu_dtype" not in inspect.signature(optax.lamb).parameters
    with pytest.raises(TypeError, match="nu_dtype"):
        optax.adam(1e-3, nu_dtype=jnp.bfloat16)
    assert not [name for name in dir(optax) if "quantiz" in name.lower() or "bit" in name]
    for name in ("adam", "adamw", "lamb"):
        opt = getattr(ft, name)(1e-3, nu_dtype=jnp.bfloat16)
        assert opt.init({"w": jnp.ones(3)})[0].nu["w"].dtype == jnp.bfloat16, name


def test_row_clip_by_global_norm_zero_on_zero_gradients():
    """max_norm 0 and zero gradients: functrain gives zeros, optax 0/0 = NaN."""
    grads = {"a": jnp.zeros(3), "b": jnp.zeros(())}
    ours, _ = ft.clip_by_global_norm(0.0).update(grads, ft.clip_by_global_norm(0.0).init(grads))
    theirs, _ = optax.clip_by_global_norm(0.0).update(
        grads, optax.clip_by_global_norm(0.0).init(grads))
    for u in jax.tree_util.tree_leaves(ours):
        np.testing.assert_array_equal(u, 0.0)
    for u in jax.tree_util.tree_leaves(theirs):
        assert bool(jnp.all(jnp.isnan(u)))


def test_row_complex_second_moments_and_optax_errors():
    """adam's second moment of a complex gradient is (1 - b2) |g|^2 in both libraries;
    sm3, rprop and clip: functrain raises a TypeError naming the complex leaf, optax's sm3
    raises, and its rprop and clip fail in jnp.clip."""
    params = jnp.asarray([1 + 2j, -0.5j], jnp.complex64)
    grads = jnp.asarray([3 - 4j, 1j], jnp.complex64)
    for m in (ft, optax):
        opt = m.adam(0.1)
        _, state = opt.update(grads, opt.init(params))
        np.testing.assert_allclose(state[0].nu, 1e-3 * np.abs(np.asarray(grads)) ** 2,
                                   rtol=1e-5, err_msg=m.__name__)

    tree = {"w": jnp.ones(2), "z": jnp.ones(2, jnp.complex64)}
    makes = {"sm3": lambda m: m.sm3(0.1), "rprop": lambda m: m.rprop(0.1),
             "clip": lambda m: m.clip(1.0)}
    for name, make in makes.items():
        with pytest.raises(TypeError, match=r"\['z'\] is complex64"):
            make(ft).init(tree)
        theirs = make(optax)
        match = ("does not support complex" if name == "sm3"
                 else "Clip received a complex value")  # jnp.clip's message
        with pytest.raises(ValueError, match=match):
            theirs.update(tree, theirs.init(tree), tree)


def test_row_bool_leaf_error_names_the_remedy_and_optax_int_moments():
    """A bool leaf: a TypeError naming it and the way out (masked / multi_transform).
    Integer params: optax's adam keeps int32 moments, its second moment truncated to 0
    after the first step; functrain's are float32."""
    params = {"w": jnp.ones(2), "on": jnp.asarray([True, False])}
    with pytest.raises(TypeError, match=r"\['on'\] has dtype bool.*masked or multi_transform"):
        ft.adam(0.1).init(params)

    ints = {"a": 1, "b": 2}
    theirs = optax.adam(1e-3)
    state = theirs.init(ints)
    assert state[0].mu["a"].dtype == state[0].nu["a"].dtype == jnp.int32
    _, state = theirs.update(ints, state, ints)
    assert int(state[0].nu["a"]) == 0 and int(state[0].nu["b"]) == 0  # 0.001 and 0.004
    ours = ft.adam(1e-3)
    _, state = ours.update(ints, ours.init(ints), ints)
    assert state[0].nu["a"].dtype == jnp.float32
    np.testing.assert_allclose([state[0].nu["a"], state[0].nu["b"]], [1e-3, 4e-3], rtol=1e-5)


def test_row_optax_takes_a_string_or_nan_learning_rate():
    """optax.adam("0.1") is built and fails at update with an index error from inside;
    optax.adam(nan) is accepted and steps NaN. functrain refuses both when built."""
    params = grads = jnp.ones(2)
    opt = optax.adam("0.1")
    with pytest.raises(TypeError, match="scalar index"):
        opt.update(grads, opt.init(params))
    opt = optax.adam(float("nan"))
    updates, _ = opt.update(grads, opt.init(params))
    assert bool(jnp.all(jnp.isnan(updates)))
    with pytest.raises(TypeError, match="adam: learning_rate must be a real number"):
        ft.adam("0.1")
    with pytest.raises(ValueError, match="adam: learning_rate must be finite"):
        ft.adam(float("nan"))


def test_row_optax_bad_input_errors_are_generic_or_absent():
    """Where functrain names the key path (and the shapes), optax raises JAX's generic
    tree error (structure, mask) or nothing (a gradient of a broadcastable shape, an
    out-of-range hyperparameter)."""
    params = {"decoder": {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}, "encoder": jnp.ones(4)}
    ones = lambda tree: jax.tree_util.tree_map(jnp.ones_like, tree)  # noqa: E731
    missing_b = {"decoder": {"w": jnp.ones((2, 3))}, "encoder": jnp.ones(4)}
    broadcastable = ones(params)
    broadcastable["decoder"]["b"] = jnp.ones(1)

    for m in (ft, optax):
        opt = m.adam(1e-3)
        state = opt.init(params)
        with pytest.raises(ValueError) as structure:
            opt.update(missing_b, state, params)
        masked = m.adamw(1e-3, mask={"decoder": True, "other": False})
        with pytest.raises(ValueError) as mask:
            masked.init(params)
        if m is ft:
            assert "['decoder']['b']" in str(structure.value)
            assert "mask" in str(mask.value) and "['other']" in str(mask.value)
            with pytest.raises(ValueError, match=r"\['decoder'\]\['b'\] has shape \(1,\)"):
                opt.update(broadcastable, state, params)
            with pytest.raises(ValueError, match="b1"):
                ft.adam(1e-3, b1=1.0)
        else:
            assert "['decoder']['b']" not in str(structure.value)
            assert "mask" not in str(mask.value)
            updates, _ = opt.update(broadcastable, state, params)  # no error
            assert updates["decoder"]["b"].shape == (3,)
            optax.adam(1e-3, b1=1.0)  # no error
            optax.adam(1e-3, eps=-1e-8)


def test_row_apply_if_finite_optax_never_resets_its_counter():
    """Six non-finite steps, max_consecutive_errors=2: optax applies the third and every
    later one; functrain applies the third, resets, and skips the next two again."""
    bad = [jnp.array([jnp.inf])]
    applied = {}
    for m in (ft, optax):
        opt = m.apply_if_finite(m.sgd(1.0), max_consecutive_errors=2)
        state = opt.init([jnp.zeros(1)])
        applied[m.__name__] = []
        for _ in range(6):
            updates, state = opt.update(bad, state)
            applied[m.__name__].append(bool(np.all(np.asarray(updates[0]) != 0)))
    assert applied == {"functrain": [False, False, True, False, False, True],
                       "optax": [False, False, True, True, True, True]}


def test_row_optax_muon_takes_2d_leaves_only_by_default():
    """optax's scale_by_muon refuses a 3-D leaf without dimension numbers, and its muon
    gives a 3-D leaf to Adam; functrain's scale_by_muon takes the leading axis as layers."""
    stacked = jnp.asarray(np.random.default_rng(0).standard_normal((3, 5, 4)), jnp.float32)
    theirs = optax.contrib.scale_by_muon()
    with pytest.raises(ValueError, match="weight dimension numbers must be provided"):
        theirs.update(stacked, theirs.init(stacked))
    params = {"stack": jnp.ones((3, 5, 4)), "w": jnp.ones((5, 4))}
    state = optax.contrib.muon(0.1).init(params)
    assert isinstance(state.inner_states["muon"].inner_state[0].mu["stack"], optax.MaskedNode)
    assert state.inner_states["adam"].inner_state[0].mu["stack"].shape == (3, 5, 4)

    ours = ft.contrib.scale_by_muon()
    first_step = lambda x: ours.update(x, ours.init(x))[0]  # noqa: E731
    updates, layers = fast_jit(lambda x: (first_step(x), [first_step(m) for m in x]))(stacked)
    for i, layer in enumerate(layers):  # each layer orthogonalized alone
        np.testing.assert_allclose(updates[i], layer, rtol=1e-5, atol=1e-6)


def test_row_newton_schulz_temporaries_at_5_and_20_steps():
    """The README's numbers: compiled temporaries of scale_by_muon's step on one 512x512
    matrix, in MB (10^6 bytes): functrain 3.1 at 5 and at 20 steps, optax 8.4 and 24."""
    x = jax.ShapeDtypeStruct((512, 512), jnp.float32)

    def temp_mb(lib, ns_steps):
        tx = lib.contrib.scale_by_muon(ns_steps=ns_steps)
        compiled = jax.jit(tx.update).lower(x, jax.eval_shape(tx.init, x)).compile(
            FAST_COMPILE)
        return compiled.memory_analysis().temp_size_in_bytes / 1e6

    assert round(temp_mb(ft, 5), 1) == round(temp_mb(ft, 20), 1) == 3.1
    assert round(temp_mb(optax, 5), 1) == 8.4
    assert round(temp_mb(optax, 20)) == 24


# --------------------------------------------------------------------------
# 8 simulated devices (a fresh process) and the benchmark's model tree: long
# --------------------------------------------------------------------------

EIGHT_DEVICES = '''
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

import functrain as ft
from functrain import jax_compat

set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh
out = {"device_count": jax.device_count()}

# jax.jit(opt.init) on a parameter split over 8 devices (automatic mesh axes).
mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
split = NamedSharding(mesh, P("data", None))
w = jax.device_put(jnp.ones((16, 8)), split)
out["jit_init"] = {}
for lib in (ft, optax):
    mu = jax.jit(lib.adam(1e-3).init)(w)[0].mu
    out["jit_init"][lib.__name__] = {"devices": len(mu.sharding.device_set),
                                     "follows": bool(mu.sharding.is_equivalent_to(split, 2))}


def error_of(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 -- reported to the test
        return f"{type(e).__name__}: {e}"
    return None


# Explicit mesh axes: contrib.muon on a split weight, reshape_batch_axis on a split batch.
out["explicit"] = None
if jax_compat.jax_at_least(jax_compat.EXPLICIT_AXES_JAX):
    mesh = jax.make_mesh((8,), ("data",))
    explicit = {"default_is_explicit": all(t == jax.sharding.AxisType.Explicit
                                           for t in mesh.axis_types)}
    weight = jnp.asarray(np.random.default_rng(0).standard_normal((64, 32)), jnp.float32)
    rows = NamedSharding(mesh, P("data", None))

    def muon_update(lib, w):
        opt = lib.contrib.muon(1e-2)
        p = {"w": w}
        return opt.update(p, opt.init(p), p)[0]["w"]

    want = jax.jit(lambda w: muon_update(ft, w))(weight)
    with set_mesh(mesh):
        got = jax.jit(lambda w: muon_update(ft, w))(jax.device_put(weight, rows))
    explicit["ft_muon_max_diff"] = float(jnp.max(jnp.abs(got - want)))
    explicit["ft_muon_keeps_split"] = bool(got.sharding.is_equivalent_to(rows, 2))

    def optax_muon():
        with set_mesh(mesh):
            jax.jit(lambda w: muon_update(optax, w))(jax.device_put(weight, rows))

    explicit["optax_muon_error"] = error_of(optax_muon)

    batch = jnp.arange(64 * 3, dtype=jnp.float32).reshape(64, 3)
    want = optax.microbatching.reshape_batch_axis(batch, 8, 0)
    with set_mesh(mesh):
        got = jax.jit(lambda x: ft.microbatching.reshape_batch_axis(x, 8, 0))(
            jax.device_put(batch, NamedSharding(mesh, P("data"))))
    explicit["ft_reshape_equal"] = bool(np.array_equal(np.asarray(got), np.asarray(want)))
    explicit["ft_reshape_split_on_microbatch_axis"] = bool(got.sharding.is_equivalent_to(
        NamedSharding(mesh, P(None, "data", None)), 3))

    def optax_reshape():
        with set_mesh(mesh):
            jax.jit(lambda x: optax.microbatching.reshape_batch_axis(x, 8, 0))(
                jax.device_put(batch, NamedSharding(mesh, P("data"))))

    explicit["optax_reshape_error"] = error_of(optax_reshape)
    out["explicit"] = explicit

print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def eight_devices(run_once, tmp_path_factory) -> dict:
    """The observations of ``EIGHT_DEVICES``, run once in a process with 8 CPU devices."""
    def run() -> dict:
        script = tmp_path_factory.mktemp("readme_promises") / "eight_devices.py"
        script.write_text(EIGHT_DEVICES)
        return run_on_eight_devices(script)

    return run_once("readme_promises_eight_devices", run)


@pytest.mark.long
def test_row_jit_init_state_follows_sharded_params(eight_devices):
    """A (16, 8) parameter split 8 ways over its rows (automatic mesh axes): functrain's
    jax.jit(adam.init) state is split the same way; optax's lands on one device."""
    assert eight_devices["device_count"] == 8
    assert eight_devices["jit_init"]["functrain"] == {"devices": 8, "follows": True}
    assert eight_devices["jit_init"]["optax"] == {"devices": 1, "follows": False}


@pytest.mark.long
def test_row_muon_and_reshape_batch_axis_on_explicit_axes(eight_devices):
    """On jax.make_mesh's default (explicit axes), a weight split over its rows: functrain's
    muon gives one device's numbers and keeps the split, optax's fails ("contracting
    dimensions are sharded"); reshape_batch_axis of a split batch: functrain's gives optax's
    numbers with the split on the microbatch axis, optax's fails ("this reshape is not
    supported")."""
    explicit = eight_devices["explicit"]
    if explicit is None:  # JAX before explicit mesh axes: the row does not apply
        assert not jax_compat.jax_at_least(jax_compat.EXPLICIT_AXES_JAX)
        return
    assert explicit["default_is_explicit"]
    assert explicit["ft_muon_max_diff"] < 1e-5 and explicit["ft_muon_keeps_split"]
    assert "contracting dimensions are sharded" in (explicit["optax_muon_error"] or "").lower()
    assert explicit["ft_reshape_equal"] and explicit["ft_reshape_split_on_microbatch_axis"]
    assert "this reshape is not supported" in (explicit["optax_reshape_error"] or "").lower()


@pytest.mark.long
def test_row_quantized_state_bytes_and_peak_on_the_benchmark_tree():
    """The README's numbers, on benchmarks/quantized_state.py's transformer tree (4.27M
    parameters; shapes only, nothing allocated): AdamW's state 8 -> 2.04 bytes per
    parameter with 8-bit and fp8 state, 1.07 with 4-bit; the compiled step's peak
    (temporaries, outputs and arguments) 0.64x float32 AdamW's with 8-bit state."""
    benchmarks = str(ROOT / "benchmarks")
    if benchmarks not in sys.path:
        sys.path.insert(0, benchmarks)
    import quantized_state as bench

    shapes = jax.eval_shape(bench.transformer_tree)
    n = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes))
    states = {name: jax.eval_shape(opt.init, shapes) for name, opt in {
        "float32": ft.adamw(1e-3), "8-bit": ft.adamw_8bit(1e-3),
        "4-bit": ft.adamw_4bit(1e-3), "fp8": ft.adamw_fp8(1e-3)}.items()}
    per_param = {name: sum(math.prod(x.shape) * x.dtype.itemsize
                           for x in jax.tree_util.tree_leaves(state)) / n
                 for name, state in states.items()}
    assert {name: round(b, 2) for name, b in per_param.items()} == {
        "float32": 8.0, "8-bit": 2.04, "4-bit": 1.07, "fp8": 2.04}, per_param

    def peak(opt, state):
        step = jax.jit(bench.step_fn(opt), donate_argnums=(0, 1))
        memory = step.lower(shapes, state, shapes).compile(FAST_COMPILE).memory_analysis()
        return (memory.temp_size_in_bytes + memory.output_size_in_bytes
                + memory.argument_size_in_bytes)

    ratio = peak(ft.adamw_8bit(1e-3), states["8-bit"]) / peak(ft.adamw(1e-3), states["float32"])
    assert abs(ratio - 0.64) <= 0.005 + 1e-9, ratio  # the README's two digits (0.645 here)
