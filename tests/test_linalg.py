"""functrain.linalg against optax and numpy's eigendecomposition."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain
from functrain import linalg
from helpers import lapack_calls

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


# --------------------------------------------------------------------------
# map_matrices and set_lapack_threads (docs/matrix_optimizers.md, "The Shampoo hang")
# --------------------------------------------------------------------------

def _spd_stack(k, n, seed=0):
    x = np.random.default_rng(seed).normal(size=(k, n, n)).astype(np.float32)
    return jnp.asarray(x @ np.swapaxes(x, -1, -2) + n * np.eye(n, dtype=np.float32))


@pytest.mark.parametrize("k", [1, 3])
def test_map_matrices_gives_vmaps_numbers(k):
    s = _spd_stack(k, 6)
    w, v = jax.jit(lambda s: linalg.map_matrices(jnp.linalg.eigh, s))(s)
    w_np, v_np = np.linalg.eigh(np.asarray(s, np.float64))
    np.testing.assert_allclose(w, w_np, rtol=1e-5)
    # eigenvectors up to sign: compare the projectors v v^T
    np.testing.assert_allclose(np.asarray(v) @ np.swapaxes(np.asarray(v), -1, -2),
                               v_np @ np.swapaxes(v_np, -1, -2), atol=1e-5)
    q, r = linalg.map_matrices(jnp.linalg.qr, s)
    np.testing.assert_allclose(np.asarray(q) @ np.asarray(r), np.asarray(s), rtol=1e-5, atol=1e-4)


def test_map_matrices_takes_several_stacks_and_checks_them():
    a, b = _spd_stack(3, 4), _spd_stack(3, 4, seed=1)
    out = linalg.map_matrices(lambda x, y: x @ y, a, b)
    np.testing.assert_allclose(out, np.asarray(a) @ np.asarray(b), rtol=1e-5)
    with pytest.raises(ValueError, match="same leading dimension"):
        linalg.map_matrices(lambda x, y: x @ y, a, b[:2])
    with pytest.raises(TypeError, match="at least one"):
        linalg.map_matrices(jnp.linalg.eigh)


def test_map_matrices_makes_no_batched_lapack_call_on_cpu():
    # A batched LAPACK call inside a conditional deadlocked XLA:CPU (the Shampoo hang): on
    # CPU every call must see one matrix (num_batch_dims = 0).
    s = _spd_stack(4, 8)
    f = jax.jit(lambda s, p: jax.lax.cond(
        p, lambda s: linalg.map_matrices(jnp.linalg.eigh, s)[1], lambda s: s, s))
    unbatched, batched = lapack_calls(f.lower(s, True).compile().as_text())
    assert unbatched and not batched, batched
    unsafe = jax.jit(lambda s: jnp.linalg.eigh(s)[1]).lower(s).compile().as_text()
    assert lapack_calls(unsafe)[1]  # the check above can fail


def test_set_lapack_threads_sets_and_returns_the_previous_count():
    previous = linalg.set_lapack_threads(3)
    if previous is None:  # SciPy without an OpenBLAS of its own (MKL / Accelerate): a no-op
        assert linalg._lapack_openblas() is None
    else:
        try:
            assert linalg.set_lapack_threads(2) == 3
        finally:
            linalg.set_lapack_threads(previous)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="integer >= 1"):
            linalg.set_lapack_threads(bad)


def test_map_stacks_in_chunks_is_the_whole_stack():
    """``chunk_bytes``: ``fn`` of consecutive chunks (the last one shorter), concatenated,
    equals ``fn`` of the whole stacks, for a tree of outputs and shared arguments; a chunk
    holds at least one matrix."""
    from functrain.linalg import map_stacks
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.normal(size=(7, 4, 6)), jnp.float32)
    b = jnp.asarray(rng.normal(size=(7, 6, 3)), jnp.float32)
    calls = []

    def fn(x, y, scale):
        calls.append(x.shape[0])
        return {"prod": (x @ y) * scale, "norm": jnp.linalg.norm(x, axis=(1, 2))}

    whole = map_stacks(fn, a, b, shared=(2.0,))
    for chunk_bytes, sizes in [(3 * 4 * 4 * 6, [3, 3, 1]), (1, [1] * 7), (10**9, [7])]:
        calls.clear()
        got = map_stacks(fn, a, b, shared=(2.0,), chunk_bytes=chunk_bytes)
        assert calls == sizes
        for k in whole:  # a batch's size may change a reduction's order: float32 ulps
            np.testing.assert_allclose(np.asarray(got[k]), np.asarray(whole[k]), rtol=1e-6)


def test_muon_runs_large_stacks_in_chunks_with_the_same_numbers(monkeypatch):
    """Six (16, 32) matrices and a (32, 16) one (transposed: the same group) under a
    2-matrix chunk budget: four Newton-Schulz loops (one per chunk, the last with one
    matrix), and Muon's updates equal those of one loop over the whole stack."""
    import importlib
    muon_module = importlib.import_module("functrain.families.muon.muon")  # not the function
    rng = np.random.default_rng(1)
    params = {"w": jnp.asarray(rng.normal(size=(6, 16, 32)), jnp.float32),
              "v": jnp.asarray(rng.normal(size=(32, 16)), jnp.float32)}
    grads = jax.tree.map(lambda x: x * 0.5 + 0.1, params)

    sizes = []

    def counted(stack, *args, **kwargs):
        sizes.append(stack.shape[0])
        return linalg.newton_schulz(stack, *args, **kwargs)

    monkeypatch.setattr(muon_module, "newton_schulz", counted)

    def updates(chunk):
        monkeypatch.setattr(muon_module, "CHUNK_BYTES", chunk)
        sizes.clear()
        dims = functrain.contrib.MuonDimensionNumbers(-2, -1)
        opt = functrain.contrib.muon(0.02, muon_weight_dimension_numbers={"w": dims, "v": dims})
        out = jax.jit(lambda g, p: opt.update(g, opt.init(p), p)[0])(grads, params)
        return out, list(sizes)

    (whole, one_run), (chunked, runs) = updates(None), updates(2 * 4 * 16 * 32)
    assert (one_run, runs) == ([7], [2, 2, 2, 1])
    for k in whole:
        np.testing.assert_allclose(np.asarray(chunked[k]), np.asarray(whole[k]),
                                   rtol=1e-6, atol=1e-7)
