"""functrain.contrib.scale_by_radius_pin: the optimizer track's norm control (record #46).

Compared with: the record's steps written out in numpy float64, in the record's own layout
(a torch weight ``(out, in)``, rows = output units): radial brake, per-row then overall floor
(or the scalar floor), a step pinned to the first-order radius, post-pin cautious decay.
Our leaves are ``(in, out)`` with ``MuonDimensionNumbers(0, 1)``, so the reference runs on
the transpose; a stacked leaf's layers each on their own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import (MuonDimensionNumbers, ScaleByRadiusPinState, radius_pin_step,
                               scale_by_radius_pin)
from functrain.jax_compat import enable_x64


def np_record_step(w, u, lr, target_uw=0.3825, row_floor=True, outward=0.5, inward=1.0,
                   cwd=0.0):
    """One step on a torch-layout weight ``w`` (out, in): the new weight."""
    coeff = np.sum(u * w) / max(np.sum(w * w), 1e-12)
    radial = coeff * w
    u = (u - radial) + (outward if coeff < 0 else inward) * radial
    p_fro = max(np.linalg.norm(w), 1e-8)
    u_fro = max(np.linalg.norm(u), 1e-8)
    below = u_fro / p_fro < target_uw
    if row_floor:
        r_row = np.maximum(np.linalg.norm(w, axis=1, keepdims=True), 1e-8)
        s_row = np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-8)
        u2 = u * np.maximum(target_uw * r_row / s_row, 1.0)
        size = target_uw * p_fro if below else u_fro
        u = u2 * (size / max(np.linalg.norm(u2), 1e-8))
    else:
        u = u * (target_uw * p_fro / u_fro if below else 1.0)
    target = max(p_fro - lr * np.sum(u * w) / p_fro, 1e-8)
    mask = (u * w > 0).astype(np.float64)
    w_new = w - lr * u
    w_new = w_new * (target / max(np.linalg.norm(w_new), 1e-8))
    return w_new * (1 - lr * cwd * mask)


def _run(tx, params, directions):
    state, out = tx.init(params), []
    step = jax.jit(tx.update)
    for d in directions:
        u, state = step(d, state, params)
        params = functrain.apply_updates(params, u)
        out.append(params)
    return out, state


@pytest.mark.parametrize("row_floor", [True, False])
@pytest.mark.parametrize("cwd", [0.0, 0.025])
def test_matches_the_record_in_float64(row_floor, cwd):
    """Six steps with a schedule, on a 2-D leaf and a stacked one, each layer its own matrix.

    The directions are small at first (the floor lifts them) and large later (it does not),
    so both branches and both radial signs occur.
    """
    rng = np.random.default_rng(0)
    lr = lambda c: 0.05 / (1.0 + c)  # noqa: E731
    with enable_x64():
        params = {"w": jnp.asarray(rng.normal(size=(6, 4))),
                  "stack": jnp.asarray(rng.normal(size=(3, 5, 4)))}
        dirs = [{k: jnp.asarray(rng.normal(size=v.shape) * (0.05 if t < 3 else 2.0))
                 for k, v in params.items()} for t in range(6)]
        dims = {"w": MuonDimensionNumbers(0, 1), "stack": MuonDimensionNumbers(1, 2)}
        tx = scale_by_radius_pin(lr, row_floor=row_floor, cautious_weight_decay=cwd,
                                 weight_dimension_numbers=dims)
        got, state = _run(tx, params, dirs)
        assert isinstance(state, ScaleByRadiusPinState) and int(state.count) == 6
    ref = {k: np.asarray(v, np.float64) for k, v in params.items()}
    for t, d in enumerate(dirs):
        ref["w"] = np_record_step(ref["w"].T, np.asarray(d["w"]).T, lr(t), row_floor=row_floor,
                                  cwd=cwd).T
        ref["stack"] = np.stack([
            np_record_step(ref["stack"][i].T, np.asarray(d["stack"][i]).T, lr(t),
                           row_floor=row_floor, cwd=cwd).T for i in range(3)])
        for k in ref:
            np.testing.assert_allclose(np.asarray(got[t][k]), ref[k], rtol=1e-12, atol=1e-13)


def test_torch_layout_dims_and_float32():
    """Output axis 0 (torch's ``(out, in)``): the rows are axis 0's, no transpose needed."""
    rng = np.random.default_rng(1)
    w, u = rng.normal(size=(5, 7)), 0.01 * rng.normal(size=(5, 7))
    got = radius_pin_step(jnp.asarray(w, jnp.float32), jnp.asarray(u, jnp.float32), 0.04,
                          (1,), (0,), cautious_weight_decay=0.1)
    assert got.dtype == jnp.float32
    want = np_record_step(w, u, 0.04, cwd=0.1) - w
    # float32 arithmetic on O(1) numbers: a few ulps of the weights
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-6)


def test_norm_is_the_first_order_radius_and_the_floor_binds():
    """Without decay the new norm is ``||W|| - lr <u', W> / ||W||`` exactly (u' the floored,
    braked step), and a tiny direction still moves the matrix by about ``lr target_uw``."""
    rng = np.random.default_rng(2)
    with enable_x64():
        w = jnp.asarray(rng.normal(size=(8, 8)))
        u = jnp.asarray(1e-6 * rng.normal(size=(8, 8)))
        new = w + radius_pin_step(w, u, 0.1, (0,), (1,))
    radius = np.linalg.norm(np.asarray(w))
    moved = np.linalg.norm(np.asarray(new - w)) / radius
    assert 0.3825 * 0.1 * 0.9 < moved < 0.3825 * 0.1 * 1.1
    ref = np_record_step(np.asarray(w).T, np.asarray(u).T, 0.1).T
    np.testing.assert_allclose(np.linalg.norm(np.asarray(new)), np.linalg.norm(ref), rtol=1e-12)


def test_radial_brake_halves_outward_steps_only():
    """A purely radial step: outward it is halved, inward it is kept (the floor off)."""
    with enable_x64():
        w = jnp.array([[3.0, 4.0]])
        out = radius_pin_step(w, -w, 0.1, (1,), (0,), target_uw=0.0)
        inw = radius_pin_step(w, w, 0.1, (1,), (0,), target_uw=0.0)
    np.testing.assert_allclose(np.asarray(out), 0.05 * np.asarray(w), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(inw), -0.1 * np.asarray(w), rtol=1e-12)


def test_bad_arguments_and_complex_leaves():
    with pytest.raises(ValueError, match="target_uw"):
        scale_by_radius_pin(0.1, target_uw=-1.0)
    with pytest.raises(ValueError, match="cautious_weight_decay"):
        scale_by_radius_pin(0.1, cautious_weight_decay=-0.1)
    with pytest.raises(TypeError, match="row_floor"):
        scale_by_radius_pin(0.1, row_floor="yes")
    tx = scale_by_radius_pin(0.1)
    p = {"w": jnp.ones((2, 2), jnp.complex64)}
    with pytest.raises(TypeError, match="complex"):
        tx.update(p, tx.init(p), p)
    with pytest.raises(ValueError, match="rank"):
        q = {"b": jnp.ones(3)}
        tx.update(q, tx.init(q), q)
