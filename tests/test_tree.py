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
    assert ints["i"].dtype == jnp.float16  # every leaf is cast, as optax.tree.cast
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


def test_traced_full_like_is_exact_for_non_finite_params():
    """Under jit the fill is derived from the param; inf/NaN entries never leak in."""
    x = jnp.array([jnp.inf, -jnp.inf, jnp.nan, -2.0, 0.0])
    out = jax.jit(lambda x: ft.full_like(x, 0.25))(x)
    np.testing.assert_array_equal(out, np.full(5, 0.25, np.float32))
    zeros = jax.jit(lambda x: ft.zeros_like(x, jnp.bfloat16))(x)
    assert zeros.dtype == jnp.bfloat16 and not bool(jnp.any(zeros != 0))


def test_leaf_norm_and_sum_of_squares():
    x = jnp.array([[3.0], [4.0]])
    np.testing.assert_allclose(ft.sum_of_squares(x), 25.0)
    np.testing.assert_allclose(ft.sum_of_squares(jnp.array([1j, 2.0])), 5.0)
    assert ft.sum_of_squares(jnp.ones(2, jnp.bfloat16)).dtype == jnp.float32
    assert ft.sum_of_squares(jnp.arange(3)).dtype == jnp.float32
    np.testing.assert_allclose(ft.leaf_norm(x), 5.0)
    # Differentiable at zero: gradient 0, not NaN.
    np.testing.assert_array_equal(jax.grad(ft.leaf_norm)(jnp.zeros(3)), np.zeros(3))
    np.testing.assert_allclose(jax.grad(ft.leaf_norm)(jnp.array([3.0, 4.0])), [0.6, 0.8])


def test_compute_dtype_and_single_leaves():
    assert ft.compute_dtype(jnp.bfloat16) == jnp.float32
    assert ft.compute_dtype(jnp.float16) == jnp.float32
    assert ft.compute_dtype(jnp.float32) == jnp.float32
    assert ft.is_single_leaf(jnp.ones(2)) and ft.is_single_leaf(1.0)
    assert not ft.is_single_leaf({}) and not ft.is_single_leaf([1.0])


def test_get_path_and_set_path():
    from typing import NamedTuple

    class Pair(NamedTuple):
        a: float
        b: tuple

    tree = {"x": [1.0, Pair(2.0, (3.0, 4.0))]}
    assert ft.get_path(tree, ("x", 1, "b", 0)) == 3.0
    assert ft.get_path(tree, ("x", 1, 0)) == 2.0          # a NamedTuple field by position
    assert ft.get_path(tree, ()) is tree
    new = ft.set_path(tree, ("x", 1, "a"), 9.0)
    assert isinstance(new["x"][1], Pair) and new["x"][1].a == 9.0
    assert tree["x"][1].a == 2.0                          # the original is untouched
    with pytest.raises(KeyError, match="no child 'y'"):
        ft.get_path(tree, ("y",))
    with pytest.raises(KeyError, match="cannot index into a leaf"):
        ft.get_path(tree, ("x", 0, 0))


def test_map_broadcast():
    out = ft.map_broadcast(lambda w, s: w * s, ("w", "s"), ({"a": jnp.ones(2)}, 3.0))
    np.testing.assert_array_equal(out["a"], [3.0, 3.0])
    assert ft.map_broadcast(lambda a, b: a + b, ("a", "b"), (1.0, 2.0)) == 3.0
    two = ft.map_broadcast(lambda a, b: (a + b, a - b), ("a", "b"),
                           ([1.0, 2.0], [0.5, 0.5]), num_outputs=2)
    assert two == ([1.5, 2.5], [0.5, 1.5])
    with pytest.raises(ValueError, match="`b`"):
        ft.map_broadcast(lambda a, b: a + b, ("a", "b"), ({"x": 1.0}, {"y": 1.0}))
