"""functrain.tree: the public tree math against numpy, and the path-naming checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from functrain import tree as ft

A = {"x": jnp.array([1.0, -2.0]), "y": [jnp.array(3.0), jnp.ones((2, 2))]}
B = {"x": jnp.array([0.5, 4.0]), "y": [jnp.array(-1.0), jnp.full((2, 2), 2.0)]}


def flat(t):
    return np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(t)])


def test_arithmetic_against_numpy():
    np.testing.assert_allclose(flat(ft.add(A, B)), flat(A) + flat(B))
    np.testing.assert_allclose(flat(ft.sub(A, B)), flat(A) - flat(B))
    np.testing.assert_allclose(flat(ft.mul(A, B)), flat(A) * flat(B))
    np.testing.assert_allclose(flat(ft.scale(-3.0, A)), -3.0 * flat(A))
    np.testing.assert_allclose(flat(ft.add_scaled(A, 0.5, B)), flat(A) + 0.5 * flat(B))
    np.testing.assert_allclose(ft.vdot(A, B), flat(A) @ flat(B))
    np.testing.assert_allclose(ft.sum(A), flat(A).sum())
    np.testing.assert_allclose(ft.norm(A), np.linalg.norm(flat(A)), rtol=1e-6)
    np.testing.assert_allclose(ft.norm(A, squared=True), np.sum(flat(A) ** 2), rtol=1e-6)
    np.testing.assert_allclose(flat(ft.where(jnp.array(True), A, B)), flat(A))


def test_constructors_and_cast():
    z = ft.zeros_like(A)
    assert jax.tree_util.tree_structure(z) == jax.tree_util.tree_structure(A)
    assert not flat(z).any()
    np.testing.assert_array_equal(flat(ft.ones_like(A)), np.ones(7))
    np.testing.assert_array_equal(flat(ft.full_like(A, 0.25)), np.full(7, 0.25))
    bf = ft.cast(A, jnp.bfloat16)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(bf))
    ints = ft.cast({"i": jnp.arange(3)}, jnp.float16)
    assert ints["i"].dtype == jnp.arange(3).dtype  # integer leaves are left alone
    assert ft.cast(A, None) is A


def test_norm_of_low_precision_tree_accumulates_in_float32():
    big = {"h": jnp.full((4096,), 300.0, jnp.float16)}
    np.testing.assert_allclose(ft.norm(big), 300.0 * 64.0, rtol=1e-3)


def test_empty_tree_reductions():
    assert float(ft.norm({})) == 0.0
    assert float(ft.vdot([], [])) == 0.0


def test_mismatched_trees_name_paths():
    with pytest.raises(ValueError, match=r"\['y'\]\[1\]"):
        ft.add(A, {"x": A["x"], "y": [A["y"][0]]})


def test_check_structure_reports_type_differences():
    with pytest.raises(ValueError, match="list.*tuple|tuple.*list|container types"):
        ft.check_structure([1, 2], (1, 2), "b", "a")


def test_resolve_mask_prefix_function_and_errors():
    params = {"enc": {"w": 1.0, "b": 2.0}, "dec": 3.0}
    assert ft.resolve_mask({"enc": False, "dec": True}, params, "m") == [True, False, False]
    assert ft.resolve_mask(lambda p: {"enc": {"w": True, "b": False}, "dec": False},
                           params, "m") == [False, False, True]
    assert ft.resolve_mask(True, params, "m") == [True] * 3
    with pytest.raises(ValueError, match="mask of m"):
        ft.resolve_mask({"other": True}, params, "m")
    with pytest.raises(TypeError, match="Python bools"):
        ft.resolve_mask({"enc": jnp.ones(2, bool), "dec": True}, params, "m")


def test_masked_node_holds_no_leaves():
    assert jax.tree_util.tree_leaves({"a": ft.MaskedNode()}) == []


def test_traced_full_like_is_exact_for_non_finite_params():
    """Under jit the fill is derived from the param; inf/NaN entries never leak in."""
    x = jnp.array([jnp.inf, -jnp.inf, jnp.nan, -2.0, 0.0])
    out = jax.jit(lambda x: ft.full_like(x, 0.25))(x)
    np.testing.assert_array_equal(out, np.full(5, 0.25, np.float32))
    zeros = jax.jit(lambda x: ft.zeros_like(x, jnp.bfloat16))(x)
    assert zeros.dtype == jnp.bfloat16 and not bool(jnp.any(zeros != 0))
