"""functrain.compensated_params: 16-bit weights trained as float32 master weights (no optax
counterpart). Checked against a numpy transcription of Kahan's compensated step, against
float32 master weights over a run (within the compensation's rounding, derived below), and
for composition (quantized_state, optax's apply_updates, Orbax, non-16-bit leaves)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

import functrain

BF16 = ml_dtypes.bfloat16


def half_spacing(w, p_dtype):
    """Half the spacing of ``p_dtype`` above ``|w|``: 2^(E - p - 1), ``|w|`` in [2^(E-1), 2^E)
    (numpy's frexp; the weights here are normal numbers)."""
    _, exponent = np.frexp(w.astype(np.float32))
    return np.ldexp(np.float32(1), exponent - (ml_dtypes.finfo(p_dtype).nmant + 2))


def numpy_decode(c, w, p_dtype):
    if c.dtype == np.int8:
        return c.astype(np.float32) * (half_spacing(w, p_dtype) / np.float32(127))
    return c.astype(np.float32)


def numpy_step(p, c, u, p_dtype, c_dtype):
    """Kahan's compensated step in numpy: the new weight, the update that makes it, and the
    new compensation (float32 arithmetic, rounded as stated; int8: the error in 127ths of
    half the new weight's spacing)."""
    m = p.astype(np.float32) + numpy_decode(c, p, p_dtype)
    target = m + u.astype(np.float32)
    new_p = target.astype(p_dtype)
    update = (new_p.astype(np.float32) - p.astype(np.float32)).astype(p_dtype)
    applied = (p.astype(np.float32) + update.astype(np.float32)).astype(p_dtype)
    error = target - applied.astype(np.float32)
    if c_dtype == np.int8:
        k = np.round(error / half_spacing(applied, p_dtype) * np.float32(127))
        return applied, update, np.clip(k, -127, 127).astype(np.int8)
    return applied, update, error.astype(c_dtype)


@pytest.mark.parametrize("p_dtype, jp_dtype", [(BF16, jnp.bfloat16),
                                               (np.float16, jnp.float16)])
@pytest.mark.parametrize("c_dtype, jc_dtype", [(BF16, jnp.bfloat16), (np.float32, jnp.float32),
                                               (np.int8, jnp.int8)])
def test_one_step_is_the_numpy_transcription(p_dtype, jp_dtype, c_dtype, jc_dtype):
    rng = np.random.default_rng(0)
    p = rng.normal(size=(64,)).astype(p_dtype)
    g = rng.normal(size=(64,)).astype(np.float32)
    lr = 3e-3
    opt = functrain.compensated_params(functrain.sgd(lr), compensation_dtype=jc_dtype)
    params = {"w": jnp.asarray(p, jp_dtype)}
    state = opt.init(params)
    # A first step to make the compensation nonzero, then the step compared.
    u1, state = opt.update({"w": jnp.asarray(g)}, state, params)
    params = functrain.apply_updates(params, u1)
    c = np.asarray(state.compensation["w"]).astype(c_dtype)
    p1 = np.asarray(params["w"]).astype(p_dtype)
    assert np.any(c != 0)
    g2 = rng.normal(size=(64,)).astype(np.float32)
    updates, state = opt.update({"w": jnp.asarray(g2)}, state, params)
    new_params = functrain.apply_updates(params, updates)
    sgd_update = np.float32(-lr) * g2  # sgd's update in float32
    want_p, want_u, want_c = numpy_step(p1, c, sgd_update, p_dtype, c_dtype)
    np.testing.assert_array_equal(np.asarray(updates["w"]), want_u)
    np.testing.assert_array_equal(np.asarray(new_params["w"]).astype(p_dtype), want_p)
    np.testing.assert_array_equal(np.asarray(state.compensation["w"]).astype(c_dtype), want_c)
    # optax's apply_updates makes the same weights of the same updates.
    np.testing.assert_array_equal(np.asarray(optax.apply_updates(params, updates)["w"]),
                                  np.asarray(new_params["w"]))


def run(opt, params, grads, steps):
    state = opt.init(params)
    step = jax.jit(lambda p, s, g: (lambda u, s: (functrain.apply_updates(p, u), s))(
        *opt.update(g, s, p)))
    for t in range(steps):
        params, state = step(params, state, jax.tree.map(lambda x: x[t], grads))
    return params, state


def test_tracks_float32_master_weights_where_plain_bfloat16_stalls():
    # Adam with lr 1e-4 on weights near 1: each update (about 1e-4) is under half bfloat16's
    # spacing there (2^-9 ~ 2e-3), so plain bfloat16 weights never move. Compensated, each
    # step's only error is the compensation's rounding: |c| <= half the weight's spacing,
    # 2^-8 |p|, kept to 2^-9 of itself in bfloat16, so at most 2^-17 |p| per step (a bound;
    # the errors mostly cancel).
    steps, lr = 300, 1e-4
    rng = np.random.default_rng(1)
    w = (1.0 + 0.1 * rng.normal(size=(128,))).astype(np.float32)
    grads = {"w": jnp.asarray(rng.normal(size=(steps, 128)), jnp.float32)}
    start = {"w": jnp.asarray(w, jnp.bfloat16)}
    master, _ = run(functrain.adam(lr), {"w": start["w"].astype(jnp.float32)}, grads, steps)
    plain, _ = run(functrain.adam(lr), start, grads, steps)
    reference = np.asarray(master["w"])
    moved = np.abs(reference - np.asarray(start["w"], np.float32))
    assert np.array_equal(np.asarray(plain["w"]), np.asarray(start["w"]))  # stalled
    # int8: the error in 127ths of half the spacing, 2^-8 |p|: at most 2^-8 |p| / 254 a step.
    for c_dtype, per_step in ((jnp.bfloat16, 2.0 ** -17), (jnp.int8, 2.0 ** -8 / 254)):
        opt = functrain.compensated_params(functrain.adam(lr), c_dtype)
        ours, state = run(opt, start, grads, steps)
        value = np.asarray(functrain.compensated_master(ours, state)["w"])
        error = np.abs(value - reference)
        assert np.all(error <= steps * per_step * np.abs(reference) + 2.0 ** -24), c_dtype
        assert np.median(error) < 0.1 * np.median(moved), c_dtype


def test_float32_compensation_gives_float32_master_weights_exactly():
    # With a float32 compensation, c = t - round(t) is exact (Sterbenz: t and its rounding are
    # within a factor 2), and p + c = t again: the float32 master weights, bit for bit.
    steps = 100
    rng = np.random.default_rng(4)
    start = {"w": jnp.asarray(1.0 + 0.1 * rng.normal(size=(64,)), jnp.bfloat16)}
    grads = {"w": jnp.asarray(rng.normal(size=(steps, 64)), jnp.float32)}
    master, _ = run(functrain.adam(1e-4), {"w": start["w"].astype(jnp.float32)}, grads, steps)
    ours, state = run(functrain.compensated_params(functrain.adam(1e-4), jnp.float32), start,
                      grads, steps)
    value = np.asarray(ours["w"], np.float32) + np.asarray(state.compensation["w"])
    np.testing.assert_array_equal(value, np.asarray(master["w"]))


def test_other_leaves_get_the_inner_update_unchanged():
    params = {"f32": jnp.linspace(-1.0, 1.0, 5), "bf16": jnp.ones(3, jnp.bfloat16)}
    grads = {"f32": jnp.arange(5.0), "bf16": jnp.ones(3, jnp.bfloat16)}
    inner = functrain.adamw(1e-2)
    ours, state = functrain.compensated_params(inner).update(
        grads, functrain.compensated_params(inner).init(params), params)
    theirs, _ = inner.update(grads, inner.init(params), params)
    np.testing.assert_array_equal(ours["f32"], theirs["f32"])
    assert isinstance(state.compensation["f32"], functrain.MaskedNode)
    assert ours["bf16"].dtype == jnp.bfloat16


def test_composes_with_quantized_state():
    rng = np.random.default_rng(2)
    w = jnp.asarray(1.0 + 0.1 * rng.normal(size=(16, 512)), jnp.bfloat16)  # >= min_size
    grads = {"w": jnp.asarray(rng.normal(size=(50, 16, 512)), jnp.float32)}
    opt = functrain.compensated_params(functrain.quantized_state(functrain.adamw(1e-4), bits=8))
    params, state = run(opt, {"w": w}, grads, 50)
    leaves = jax.tree_util.tree_leaves(state.inner_state,
                                       is_leaf=lambda x: isinstance(x, functrain.QuantizedArray))
    assert any(isinstance(x, functrain.QuantizedArray) for x in leaves)
    moved = np.abs(np.asarray(params["w"], np.float32) + np.asarray(
        state.compensation["w"], np.float32) - np.asarray(w, np.float32))
    assert 1e-4 < np.median(moved) < 1e-2  # 50 steps of about 1e-4


def test_orbax_round_trip_continues_bit_identically(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    rng = np.random.default_rng(3)
    params = {"w": jnp.asarray(rng.normal(size=(16,)), jnp.bfloat16)}
    grads = {"w": jnp.asarray(rng.normal(size=(6, 16)), jnp.float32)}
    opt = functrain.compensated_params(functrain.adam(1e-3))
    p3, s3 = run(opt, params, jax.tree.map(lambda x: x[:3], grads), 3)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "state", s3)
    checkpointer.wait_until_finished()
    restored = checkpointer.restore(tmp_path / "state", jax.eval_shape(opt.init, params))
    state, p = restored, p3
    for t in range(3, 6):
        u, state = opt.update(jax.tree.map(lambda x: x[t], grads), state, p)
        p = functrain.apply_updates(p, u)
    whole, _ = run(opt, params, grads, 6)
    np.testing.assert_array_equal(np.asarray(p["w"]), np.asarray(whole["w"]))


def test_errors():
    with pytest.raises(ValueError, match="compensated_params: compensation_dtype must be "
                                         "jnp.bfloat16, jnp.float16, jnp.float32 or jnp.int8, "
                                         "got 'uint8'"):
        functrain.compensated_params(functrain.sgd(0.1), compensation_dtype="uint8")
    with pytest.raises(TypeError, match="compensated_params: inner is a float"):
        functrain.compensated_params(0.1)
    opt = functrain.compensated_params(functrain.sgd(0.1))
    params = {"w": jnp.ones(2, jnp.bfloat16)}
    with pytest.raises(ValueError, match="compensated_params"):
        opt.update(params, opt.init(params))
