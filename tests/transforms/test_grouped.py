"""functrain.transforms.grouped (issue 5, P2): the ungrouped engine's numbers, stacked state."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain as F
from functrain.transforms.grouped import GroupedState


def _params():
    p = {f"layer{i}": {"w": jnp.full((6, 4), 0.1 * (i + 1)) + jnp.arange(24.).reshape(6, 4) / 50,
                       "b": jnp.full((4,), 0.02 * i), "scale": jnp.ones((4,))}
         for i in range(20)}                               # 20 same-shape leaves per kind
    p["scalar"] = jnp.asarray(0.7, jnp.float32)  # not weak-typed
    p["empty"] = jnp.zeros((0,))
    p["zero"] = jnp.zeros((3, 3))                          # a zero leaf: trust ratio 1
    p["big"] = jnp.linspace(-1., 1., 200).reshape(10, 20)  # bigger than max_leaf_size below
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), p)  # none weak-typed


def _grads(p, i):
    return jax.tree_util.tree_map(lambda x: jnp.sin(3.0 * x + i) + 0.05 * i, p)


def _train(tx, params, steps=20):
    state = tx.init(params)
    step = jax.jit(lambda p, s, i: _apply(tx, p, s, i), donate_argnums=(0, 1))
    p = jax.tree_util.tree_map(jnp.array, params)
    for i in range(steps):
        p, state = step(p, state, jnp.float32(i))
    return p, state, step


def _apply(tx, p, s, i):
    u, s = tx.update(_grads(p, i), s, p)
    return F.apply_updates(p, u), s


def _wd_mask(p):
    return jax.tree_util.tree_map_with_path(
        lambda path, x: not any(getattr(k, "key", None) in ("b", "scale") for k in path), p)


OPTS = {
    "lamb": lambda: F.lamb(1e-2, weight_decay=1e-2),
    "lars": lambda: F.lars(1e-2, weight_decay=1e-3),
    "adam": lambda: F.adam(1e-2),
    "adamw": lambda: F.adamw(1e-2, weight_decay=1e-2),
    "sgd-momentum": lambda: F.sgd(1e-2, momentum=0.9),
    "clip-lamb-schedule": lambda: F.chain(
        F.clip_by_global_norm(0.5), F.lamb(F.linear_schedule(1e-2, 1e-3, 20), weight_decay=1e-2)),
    "lamb-masks": lambda: F.lamb(1e-2, weight_decay=1e-2, mask=_wd_mask,
                                 trust_ratio_mask=_wd_mask),
    "lars-masks": lambda: F.lars(1e-2, weight_decay=1e-3, weight_decay_mask=_wd_mask,
                                 trust_ratio_mask=_wd_mask),
}


def _assert_close(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(OPTS))
def test_same_params_as_ungrouped(name):
    params = _params()
    ref, _, _ = _train(OPTS[name](), params)
    got, state, step = _train(F.grouped(OPTS[name](), max_group=8, max_leaf_size=100), params)
    _assert_close(ref, got)
    assert isinstance(state, GroupedState)
    # 20 same-shape leaves with max_group 8: chunks of 8, 8, 4 per kind.
    sizes = sorted({x.shape[0] for g in state.groups for st in g for f in st
                    for x in jax.tree_util.tree_leaves(f)})
    assert not sizes or sizes == [4, 8]
    # one compile for all 20 steps (no recompilation across steps)
    assert step._cache_size() == 1


def test_max_leaf_size_and_max_group():
    params = _params()
    tx = F.grouped(F.adam(1e-2), max_group=16, max_leaf_size=100)
    st = tx.init(params)
    mu_groups = [g[0][0] for g in st.groups]
    # 'b' and 'scale' share shape (4,): 40 leaves -> 16, 16, 8; 'w': 20 -> 16, 4
    assert sorted(x.shape for x in mu_groups) == [(4, 6, 4), (8, 4), (16, 4), (16, 4), (16, 6, 4)]
    # the 200-element leaf is over max_leaf_size; the scalar, empty and zero leaves are alone
    assert sorted(np.shape(x) for x in st.singles[0][0]) == [(), (0,), (3, 3), (10, 20)]
    # without max_leaf_size everything same-shaped groups; max_group=100 makes one group a kind
    st = F.grouped(F.adam(1e-2), max_group=100).init(params)
    assert sorted(g[0][0].shape[0] for g in st.groups) == [20, 40]


def test_masked_stage_state_and_no_params_update():
    params = _params()
    tx = F.grouped(F.adamw(1e-2, weight_decay=1e-2, mask=_wd_mask))
    st = tx.init(params)
    ref = F.adamw(1e-2, weight_decay=1e-2, mask=_wd_mask)
    g = _grads(params, 1.0)
    u1, _ = tx.update(g, st, params)
    u2, _ = ref.update(g, ref.init(params), params)
    _assert_close(u1, u2)
    # without params (no stage needs them): grouping by the updates' shapes
    tx2, ref2 = F.grouped(F.adam(1e-2)), F.adam(1e-2)
    _assert_close(tx2.update(g, tx2.init(params))[0], ref2.update(g, ref2.init(params))[0])


def test_eval_shape_and_jit_init():
    params = _params()
    tx = F.grouped(F.lamb(1e-2))
    shapes = jax.eval_shape(tx.init, params)
    real = jax.jit(tx.init)(params)
    assert jax.tree_util.tree_structure(shapes) == jax.tree_util.tree_structure(real)
    for s, r in zip(jax.tree_util.tree_leaves(shapes), jax.tree_util.tree_leaves(real)):
        assert s.shape == r.shape and s.dtype == r.dtype


def test_bfloat16_params_keep_dtype_policy():
    params = {f"w{i}": jnp.full((5,), 0.3 * (i + 1), jnp.bfloat16) for i in range(4)}
    g = jax.tree_util.tree_map(lambda x: jnp.full_like(x, 0.1), params)
    for make in (lambda: F.lamb(1e-2), lambda: F.adam(1e-2)):
        ref, tx = make(), F.grouped(make())
        u_ref, s_ref = ref.update(g, ref.init(params), params)
        u, s = tx.update(g, tx.init(params), params)
        _assert_close(u_ref, u)
        assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(u))


def test_bad_inputs():
    import optax  # the test suite may import optax; functrain never does
    with pytest.raises(TypeError, match="not one"):
        F.grouped(optax.adam(1e-2))
    with pytest.raises(TypeError, match="chain position"):
        F.grouped(F.chain(F.adam(1e-2), optax.scale(1.0)))
    with pytest.raises(TypeError, match="GradientTransformation"):
        F.grouped(object())
    with pytest.raises(ValueError, match="max_group"):
        F.grouped(F.adam(1e-2), max_group=0)
    with pytest.raises(ValueError, match="max_leaf_size"):
        F.grouped(F.adam(1e-2), max_leaf_size=-1)
    params = _params()
    tx = F.grouped(F.lamb(1e-2))
    st = tx.init(params)
    with pytest.raises(ValueError, match="needs the current parameters"):
        tx.update(params, st)
    bad = dict(params, zero=jnp.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"\['zero'\]"):
        tx.update(bad, st, params)
    with pytest.raises(TypeError, match="GroupedState"):
        tx.update(params, F.lamb(1e-2).init(params), params)
    other = dict(params, layer0=dict(params["layer0"], w=jnp.zeros((6, 5))))
    with pytest.raises(ValueError, match="grouped"):
        tx.update(other, st, other)


def test_donation_reuses_buffers():
    params = {f"w{i}": jnp.ones((64,)) for i in range(8)}
    tx = F.grouped(F.adam(1e-2))
    state = tx.init(params)
    step = jax.jit(lambda p, s: _apply(tx, p, s, 0.0), donate_argnums=(0, 1))
    mu = state.groups[0][0][0]
    p2, s2 = step(params, state)
    assert mu.is_deleted()  # the stacked state buffer was donated
    assert all(x.is_deleted() for x in params.values())
    step(p2, s2)
