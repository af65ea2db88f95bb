"""functrain.families.quasi_newton.lbfgs: the direction against the inverse-Hessian matrix built in
numpy, every step against optax, dtypes and errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from helpers import assert_same_trajectory

D = np.array([1.0, 3.0, 10.0, 0.5])


def quad_grad(w):
    return {"a": D[:2] * w["a"] + 0.3 * w["b"][0], "b": D[2:] * w["b"] + 0.3 * w["a"][0]}


def ref_directions(w0, lr, memory, steps, scale_init=True):
    """The L-BFGS directions from the matrix recursion (Nocedal & Wright eq. 7.19), float64.

    H = gamma I, then for each stored pair (oldest first)
    H <- (I - rho s y^T) H (I - rho y s^T) + rho s s^T; the direction is H g.
    """
    flat = lambda t: np.concatenate([np.ravel(t["a"]), np.ravel(t["b"])])  # noqa: E731
    w, pairs, out = flat(w0).astype(np.float64), [], []
    prev_w = prev_g = None
    for k in range(steps):
        g = flat(quad_grad({"a": w[:2], "b": w[2:]}))
        if k > 0:
            pairs = (pairs + [(w - prev_w, g - prev_g)])[-memory:]
        n = len(w)
        if k == 0:
            gamma = min(1.0, 1.0 / np.linalg.norm(g)) if scale_init else 1.0
        else:
            s, y = pairs[-1]
            gamma = (y @ s) / (y @ y) if scale_init else 1.0
        h = gamma * np.eye(n)
        for s, y in pairs:
            rho = 1.0 / (y @ s)
            v = np.eye(n) - rho * np.outer(y, s)
            h = v.T @ h @ v + rho * np.outer(s, s)
        d = h @ g
        out.append(d)
        prev_w, prev_g = w, g
        w = w - lr * d
    return out


@pytest.mark.parametrize("memory,scale_init", [(2, True), (5, False)])
def test_direction_is_the_inverse_hessian_approximation(memory, scale_init):
    w = {"a": jnp.array([1.0, -2.0]), "b": jnp.array([0.5, 3.0])}
    tx = ft.scale_by_lbfgs(memory_size=memory, scale_init_precond=scale_init)
    state, lr = tx.init(w), 0.2
    reference = ref_directions(w, lr, memory, 6, scale_init)
    for k, expected in enumerate(reference):
        d, state = tx.update(quad_grad(w), state, w)
        got = np.concatenate([np.asarray(d["a"]), np.asarray(d["b"])])
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-6, err_msg=f"step {k}")
        w = jax.tree_util.tree_map(lambda p, u: p - lr * u, w, d)
    assert int(state.count) == 6


@pytest.mark.parametrize("kwargs", [dict(memory_size=3), dict(memory_size=1,
                                                            scale_init_precond=False)])
def test_matches_optax_every_step(kwargs):
    """A fixed step along the L-BFGS direction on a coupled convex function, 40 jitted steps.

    Convex (bounded below): on an unbounded one the trajectory diverged to inf within 15
    steps, and where the two libraries' NaNs land depends on rounding."""
    params = {"w": jnp.asarray(np.linspace(-1, 1, 6).reshape(2, 3), jnp.float32),
              "b": jnp.array([0.5, -0.5]), "s": jnp.asarray(2.0)}

    def grads(p):
        return jax.grad(lambda q: jnp.sum(jnp.arange(1.0, 7.0).reshape(2, 3) * q["w"] ** 2)
                        + jnp.sum(q["b"] ** 4) + (q["s"] + 0.3 * jnp.sum(q["w"])) ** 2)(p)

    assert_same_trajectory(ft.chain(ft.scale_by_lbfgs(**kwargs), ft.scale(-0.05)),
                           optax.chain(optax.scale_by_lbfgs(**kwargs), optax.scale(-0.05)),
                           params=params, grads=grads, steps=40, name=str(kwargs),
                           float64=True)  # quasi-Newton divides by s.y: float32 programs
    # that round differently part by more than float32 parity's tolerance (seen: 0.2%)


def test_state_layout_and_16_bit_leaves():
    params = {"w": jnp.ones((2, 3), jnp.bfloat16), "b": jnp.zeros(3, jnp.float32)}
    tx = ft.scale_by_lbfgs(memory_size=4)
    state = tx.init(params)
    ref = optax.scale_by_lbfgs(memory_size=4).init(params)
    assert state._fields == ref._fields  # optax's fields, shapes and dtypes
    assert [jax.tree_util.tree_structure(x) for x in state] == [
        jax.tree_util.tree_structure(x) for x in ref]
    for a, b in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(ref)):
        assert a.shape == b.shape and a.dtype == b.dtype
    step = jax.jit(lambda g, s, p: tx.update(g, s, p))
    for k in range(3):
        grads = jax.tree_util.tree_map(lambda p: (p + k + 1).astype(p.dtype), params)
        u, new = step(grads, state, params)
        for a, b in zip(jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(state)):
            assert a.dtype == b.dtype and a.shape == b.shape
        assert u["w"].dtype == jnp.bfloat16 and np.all(np.isfinite(np.asarray(u["w"], float)))
        params = jax.tree_util.tree_map(lambda p, d: (p - 0.1 * d).astype(p.dtype), params, u)
        state = new
    assert step._cache_size() == 1


def test_errors():
    with pytest.raises(ValueError, match="scale_by_lbfgs: memory_size must be >= 1, got 0"):
        ft.scale_by_lbfgs(memory_size=0)
    for size in (2.5, 3.0):  # a float is not a shape (optax fails in init): refused at build
        with pytest.raises(TypeError, match=f"scale_by_lbfgs: memory_size must be an int .* "
                                            f"{size}"):
            ft.scale_by_lbfgs(memory_size=size)
    with pytest.raises(TypeError, match="lbfgs: memory_size must be an int .* 3.0"):
        ft.lbfgs(memory_size=3.0)
    tx = ft.scale_by_lbfgs(memory_size=2)
    w = {"a": jnp.ones(2), "b": jnp.ones(3)}
    state = tx.init(w)
    with pytest.raises(ValueError, match="scale_by_lbfgs needs the current parameters"):
        tx.update(w, state)
    with pytest.raises(ValueError, match=r"updates leaf \['b'\] has shape \(4,\)"):
        tx.update({"a": jnp.ones(2), "b": jnp.ones(4)}, state, {"a": jnp.ones(2),
                                                                "b": jnp.ones(4)})
    other = ft.scale_by_lbfgs(memory_size=3).init(w)
    with pytest.raises(ValueError, match=r"memory_size=2.*\['a'\].*diff_params_memory"):
        tx.update(w, other, w)
    with pytest.raises(TypeError, match=r"params leaf \['i'\] has dtype int32"):
        tx.init({"i": jnp.ones(2, jnp.int32)})
    with pytest.raises(TypeError, match="scale_by_lbfgs expected its state"):
        tx.update(w, (), w)
