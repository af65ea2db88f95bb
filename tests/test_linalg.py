"""functrain.linalg against optax and numpy's eigendecomposition."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain
from functrain import linalg

RNG = np.random.default_rng(0)


def spd(n, cond, seed):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    eig = np.geomspace(1.0, cond, n)
    return (q * eig) @ q.T, q, eig


def test_power_iteration_matches_optax_and_numpy():
    for n, seed in ((4, 0), (7, 1)):
        a, _, eig = spd(n, 10.0, seed)
        a = jnp.asarray(a, jnp.float32)
        ours = jax.jit(linalg.power_iteration)(a)
        theirs = optax.power_iteration(a)
        np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-5)
        np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(ours[0], eig.max(), rtol=1e-4)
        key = jax.random.PRNGKey(3)
        for kw in ({"key": key, "num_iters": 5}, {"v0": jnp.ones(n), "error_tolerance": 1e-3}):
            ours, theirs = linalg.power_iteration(a, **kw), optax.power_iteration(a, **kw)
            np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-5)
            np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-4, atol=1e-5)


def test_power_iteration_on_a_pytree_operator():
    d = {"a": jnp.array([1.0, 5.0]), "b": jnp.array([[2.0, 3.0]])}
    mvp = lambda v: jax.tree_util.tree_map(jnp.multiply, d, v)  # noqa: E731
    v0 = jax.tree_util.tree_map(jnp.ones_like, d)
    ours = linalg.power_iteration(mvp, v0=v0)
    theirs = optax.power_iteration(mvp, v0=v0)
    np.testing.assert_allclose(ours[0], 5.0, rtol=1e-4)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(ours[1]), jax.tree_util.tree_leaves(theirs[1])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for lib in (linalg, optax):
        with pytest.raises(ValueError, match="v0 must be provided"):
            lib.power_iteration(mvp)


@pytest.mark.parametrize("p", [1, 2, 4])
def test_matrix_inverse_pth_root_matches_optax_and_eigh(p):
    for n, cond, seed in ((1, 1.0, 0), (5, 20.0, 1), (8, 100.0, 2)):
        a, q, eig = spd(n, cond, seed)
        a32 = jnp.asarray(a, jnp.float32)
        ours, err = jax.jit(linalg.matrix_inverse_pth_root, static_argnums=1)(a32, p)
        theirs, err_ox = optax.matrix_inverse_pth_root(a32, p)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(err, err_ox, rtol=1e-3, atol=1e-6)
        ridge = 1e-6 * eig.max()
        exact = (q * (eig + ridge) ** (-1.0 / p)) @ q.T
        np.testing.assert_allclose(ours, exact, rtol=2e-3, atol=2e-4)
    assert functrain.matrix_inverse_pth_root is linalg.matrix_inverse_pth_root
