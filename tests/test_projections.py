"""functrain.projections against optax.projections on random pytrees, plus the properties
of a projection: the output lies in the set, and projecting it again changes nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from functrain import projections as fp
from functrain import tree as ft


def random_tree(seed, scale=2.0):
    rng = np.random.default_rng(seed)
    return {"w": jnp.asarray(scale * rng.standard_normal((3, 2)), jnp.float32),
            "b": [jnp.asarray(scale * rng.standard_normal(4), jnp.float32),
                  jnp.asarray(scale * rng.standard_normal(()), jnp.float32)]}


TREES = [random_tree(s, scale) for s, scale in ((0, 2.0), (1, 0.05), (2, 10.0))]


def flat(t):
    return np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(t)])


def same(ours, theirs):
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(theirs)
    np.testing.assert_allclose(flat(ours), flat(theirs), rtol=1e-5, atol=1e-6)


def idempotent(project, tree):
    once = project(tree)
    np.testing.assert_allclose(flat(project(once)), flat(once), rtol=1e-5, atol=1e-6)
    return flat(once)


BALLS = ["projection_simplex", "projection_l1_sphere", "projection_l1_ball",
         "projection_l2_sphere", "projection_l2_ball", "projection_linf_ball"]


@pytest.mark.parametrize("name", BALLS)
def test_norm_sets_match_optax_and_hold(name):
    ours_fn, theirs_fn = getattr(fp, name), getattr(optax.projections, name)
    for tree in TREES:
        for scale in (1.0, 3.5):
            same(ours_fn(tree, scale), theirs_fn(tree, scale))
            out = idempotent(lambda t: ours_fn(t, scale), tree)
            tol = 1e-4 * scale
            if name == "projection_simplex":
                assert out.min() >= 0 and abs(out.sum() - scale) < tol
            elif name == "projection_l1_sphere":
                assert abs(np.abs(out).sum() - scale) < tol
            elif name == "projection_l1_ball":
                assert np.abs(out).sum() <= scale + tol
            elif name == "projection_l2_sphere":
                assert abs(np.linalg.norm(out) - scale) < tol
            elif name == "projection_l2_ball":
                assert np.linalg.norm(out) <= scale + tol
            else:
                assert np.abs(out).max() <= scale
    # Inside the ball, the point is its own projection.
    if name in ("projection_l1_ball", "projection_l2_ball", "projection_linf_ball"):
        small = TREES[1]
        same(ours_fn(small, 100.0), small)


def test_orthant_box_and_hypercube():
    for tree in TREES:
        same(fp.projection_non_negative(tree), optax.projections.projection_non_negative(tree))
        assert flat(idempotent(fp.projection_non_negative, tree)).min() >= 0
        lower, upper = ft.full_like(tree, -0.5), ft.full_like(tree, 1.5)
        same(fp.projection_box(tree, lower, upper),
             optax.projections.projection_box(tree, lower, upper))
        out = idempotent(lambda t: fp.projection_box(t, lower, upper), tree)
        assert out.min() >= -0.5 and out.max() <= 1.5
        # optax's hypercube fails on trees (its scalar lower bound); compare to its box.
        same(fp.projection_hypercube(tree, ft.full_like(tree, 2.0)),
             optax.projections.projection_box(tree, ft.zeros_like(tree),
                                              ft.full_like(tree, 2.0)))
        # A scalar bound applies to every leaf (optax: single arrays only).
        same(fp.projection_box(tree, -0.5, 1.5), fp.projection_box(tree, lower, upper))
        out = idempotent(fp.projection_hypercube, tree)
        assert out.min() >= 0 and out.max() <= 1
    x = TREES[0]["w"]
    same(fp.projection_hypercube(x, 0.7), optax.projections.projection_hypercube(x, 0.7))
    same(fp.projection_box(x, -1.0, 0.2), optax.projections.projection_box(x, -1.0, 0.2))


def test_box_with_a_bound_tree_of_another_structure_names_the_path():
    tree = TREES[0]
    with pytest.raises(ValueError, match=r"\['b'\]\[1\]"):
        fp.projection_box(tree, {"w": -1.0, "b": [-1.0]}, 1.0)


def test_hyperplane_halfspace_vector():
    a = random_tree(7)
    for tree in TREES:
        for b in (-1.0, 0.0, 4.0):
            same(fp.projection_hyperplane(tree, a, b),
                 optax.projections.projection_hyperplane(tree, a, b))
            same(fp.projection_halfspace(tree, a, b),
                 optax.projections.projection_halfspace(tree, a, b))
            on = fp.projection_hyperplane(tree, a, b)
            np.testing.assert_allclose(float(ft.vdot(a, on)), b, atol=1e-3)
            idempotent(lambda t: fp.projection_hyperplane(t, a, b), tree)
            half = idempotent(lambda t: fp.projection_halfspace(t, a, b), tree)
            assert half @ flat(a) <= b + 1e-3
        same(fp.projection_vector(tree, a), optax.projections.projection_vector(tree, a))
        idempotent(lambda t: fp.projection_vector(t, a), tree)


def test_simplex_derivative_matches_optax():
    x = TREES[0]
    v = random_tree(9)
    ours = jax.jvp(lambda t: fp.projection_simplex(t, 2.0), (x,), (v,))
    theirs = jax.jvp(lambda t: optax.projections.projection_simplex(t, 2.0), (x,), (v,))
    same(ours[0], theirs[0])
    same(ours[1], theirs[1])
    g_ours = jax.jit(jax.grad(lambda t: fp.projection_simplex(t)["w"][0, 0]))(x)
    g_theirs = jax.grad(lambda t: optax.projections.projection_simplex(t)["w"][0, 0])(x)
    same(g_ours, g_theirs)
