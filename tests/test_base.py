"""The protocol, chain fusion, extra args, empty trees, donation, eval_shape, recompiles."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from conftest import make_grads, make_params


def test_state_layout_matches_an_unfused_chain():
    params = make_params()
    state = ft.lamb(1e-3).init(params)
    assert isinstance(state, tuple) and len(state) == 4
    assert isinstance(state[0], ft.ScaleByAdamState)
    assert all(s == ft.EmptyState() for s in state[1:])
    assert jax.tree_util.tree_structure(state[0].mu) == jax.tree_util.tree_structure(params)


def test_fused_chain_equals_transforms_applied_one_by_one():
    """chain fuses stages into one pass; the numbers equal running each in turn."""
    params = make_params()
    parts = [ft.scale_by_adam(b1=0.8), ft.add_decayed_weights(0.1),
             ft.scale_by_trust_ratio(), ft.trace(0.5, nesterov=True), ft.scale(-0.01)]
    fused = ft.chain(*parts)
    state_f = fused.init(params)
    states = [t.init(params) for t in parts]
    grads = make_grads(params, 5)
    for k in range(5):
        g = jax.tree_util.tree_map(lambda x: x[k], grads)
        u_f, state_f = fused.update(g, state_f, params)
        u = g
        for i, t in enumerate(parts):
            u, states[i] = t.update(u, states[i], params)
        for a, b in zip(jax.tree_util.tree_leaves(u_f), jax.tree_util.tree_leaves(u)):
            np.testing.assert_allclose(a, b, rtol=2e-5)
        for a, b in zip(jax.tree_util.tree_leaves(state_f), jax.tree_util.tree_leaves(states)):
            np.testing.assert_allclose(a, b, rtol=1e-6)


def test_nested_chains_fuse_and_keep_nested_state():
    inner = ft.chain(ft.scale_by_adam(), ft.scale(-0.1))
    outer = ft.chain(ft.clip(1.0), inner, optax.scale(2.0), ft.trace(0.9))
    params = make_params()
    state = outer.init(params)
    assert len(state) == 4 and len(state[1]) == 2
    g = jax.tree_util.tree_map(jnp.ones_like, params)
    u, new_state = outer.update(g, state, params)
    assert jax.tree_util.tree_structure(new_state) == jax.tree_util.tree_structure(state)
    # adam's first step on g=1 is 1/(1+eps); clip, scale -0.1, x2, trace from zero.
    for leaf in jax.tree_util.tree_leaves(u):
        np.testing.assert_allclose(leaf, -0.2 / (1 + 1e-8), rtol=2e-5)


@pytest.mark.parametrize("opt", [ft.adam(1e-3), ft.lamb(1e-3), ft.sgd(0.1),
                                 ft.chain(ft.clip(1.0), optax.scale(0.5))])
def test_unknown_extra_args_are_accepted_and_ignored(opt):
    params = make_params()
    g = jax.tree_util.tree_map(jnp.ones_like, params)
    a, _ = opt.update(g, opt.init(params), params, value=jnp.array(1.0), grad=g)
    b, _ = opt.update(g, opt.init(params), params)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("opt", [ft.adam(1e-3), ft.lamb(1e-3), ft.lars(0.1),
                                 ft.chain(ft.clip_by_global_norm(1.0), ft.adamw(1e-3))])
def test_empty_parameter_trees(opt):
    for empty in ({}, [], ()):
        state = opt.init(empty)
        updates, state = opt.update(empty, state, empty)
        assert updates == empty


def test_donated_jitted_step_runs_and_state_buffers_are_distinct():
    params = make_params()
    opt = ft.chain(ft.clip_by_global_norm(1.0), ft.lamb(1e-3))
    state = opt.init(params)
    leaves = [x for x in jax.tree_util.tree_leaves((params, state)) if x.size]
    pointers = [x.unsafe_buffer_pointer() for x in leaves]
    assert len(set(pointers)) == len(pointers)

    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return ft.apply_updates(params, updates), state

    donated = jax.jit(step, donate_argnums=(0, 1))
    g = jax.tree_util.tree_map(jnp.ones_like, params)
    for _ in range(3):
        params, state = donated(params, state, g)
    assert donated._cache_size() == 1
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(params))


@pytest.mark.parametrize("opt", [ft.adam(1e-3, mu_dtype=jnp.bfloat16), ft.lamb(1e-3),
                                 ft.lars(0.1), ft.sgd(1e-3, 0.9), ft.rmsprop(1e-3),
                                 ft.adagrad(1e-3), ft.lion(1e-3)])
def test_eval_shape_of_init(opt):
    params = make_params()
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    shapes = jax.eval_shape(opt.init, abstract)
    real = opt.init(params)
    for a, b in zip(jax.tree_util.tree_leaves(shapes), jax.tree_util.tree_leaves(real)):
        assert a.shape == b.shape and a.dtype == b.dtype


def test_repeated_jitted_steps_never_recompile():
    params = make_params()
    opt = ft.chain(ft.clip_by_global_norm(1.0),
                   ft.lamb(ft.warmup_cosine_decay_schedule(0.0, 1e-3, 10, 100)))
    state = opt.init(params)

    @jax.jit
    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return ft.apply_updates(params, updates), state

    grads = make_grads(params, 5)
    for k in range(5):
        params, state = step(params, state, jax.tree_util.tree_map(lambda x: x[k], grads))
    assert step._cache_size() == 1


def test_the_canonical_usage():
    """The README's quickstart, verbatim in spirit: loss falls under lamb + clip + schedule."""
    opt = ft.chain(ft.clip_by_global_norm(1.0),
                   ft.lamb(ft.warmup_cosine_decay_schedule(0.0, 0.1, 10, 300)))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((64, 5)), jnp.float32)
    y = x @ jnp.arange(1.0, 6.0) + 0.5
    params = {"w": jnp.ones(5), "b": jnp.zeros(())}

    def loss(params, batch):
        x, y = batch
        return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)

    state = opt.init(params)

    @jax.jit
    def train_step(params, state, batch):
        grads = jax.grad(loss)(params, batch)
        updates, state = opt.update(grads, state, params)
        return ft.apply_updates(params, updates), state

    first = float(loss(params, (x, y)))
    for _ in range(300):
        params, state = train_step(params, state, (x, y))
    assert float(loss(params, (x, y))) < 0.05 * first


def test_functrain_and_optax_transformations_are_interchangeable_tuples():
    init, update = ft.adam(1e-3)
    assert callable(init) and callable(update)
    assert isinstance(ft.adam(1e-3), ft.GradientTransformation)


def test_fusion_switch_changes_the_schedule_not_the_numbers(monkeypatch):
    """FUNCTRAIN_ENGINE_OPT=0 runs one block per stage; results are identical."""
    from functrain.transforms import engine, recompute
    params = make_params()
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    opt = ft.chain(ft.clip_by_global_norm(1.0), ft.lamb(1e-2, weight_decay=0.1))
    blocks = []
    real = engine.run_block
    monkeypatch.setattr(engine, "run_block",
                        lambda stages, *a: blocks.append(len(stages)) or real(stages, *a))
    fused, _ = opt.update(grads, opt.init(params), params)
    assert blocks == [5]  # the global norm is read first, then one pass for all five
    blocks.clear()
    monkeypatch.setenv("FUNCTRAIN_ENGINE_OPT", "0")
    assert not engine.fusion_enabled()
    unfused, _ = opt.update(grads, opt.init(params), params)
    assert blocks == [1, 1, 1, 1, 1]
    for a, b in zip(jax.tree_util.tree_leaves(fused), jax.tree_util.tree_leaves(unfused)):
        np.testing.assert_array_equal(a, b)


def _jitted_steps(opt, params, grads, steps=4):
    @jax.jit
    def run(params):
        state = opt.init(params)
        for _ in range(steps):
            updates, state = opt.update(grads, state, params)
            params = ft.apply_updates(params, updates)
        return params, state
    return run(params)


@pytest.mark.parametrize("make_opt", [
    lambda: ft.lamb(1e-2, weight_decay=0.1),
    lambda: ft.lamb(1e-2, weight_decay=0.1, mask=lambda p: jax.tree_util.tree_map(
        lambda x: x.ndim > 1, p), trust_ratio_mask=lambda p: jax.tree_util.tree_map(
        lambda x: x.ndim > 0, p)),
    lambda: ft.lars(0.1, weight_decay=1e-3, momentum=0.9),
    lambda: ft.chain(ft.clip_by_global_norm(1.0), ft.lamb(1e-2, nu_dtype=jnp.bfloat16)),
], ids=["lamb", "lamb-masks", "lars", "clip-lamb-bf16-nu"])
def test_trust_ratio_recompute_changes_only_rounding(make_opt, monkeypatch):
    """Recomputing the trust ratio's input changes the schedule, not the result beyond rounding.

    The same operations run on the same values; XLA may sum the norm in another
    order, so float32 results agree to a few ulps (bfloat16 leaves to one ulp).
    """
    from functrain.transforms import engine, recompute
    monkeypatch.setattr(recompute, "MIN_BYTES", 0)
    params = make_params()
    params["bf16"] = jnp.linspace(-1, 1, 12, dtype=jnp.bfloat16).reshape(3, 4)
    grads = jax.tree_util.tree_map(lambda p: jnp.cos(3 * p.astype(jnp.float32)).astype(p.dtype),
                                   params)
    assert recompute.enabled()
    on = _jitted_steps(make_opt(), params, grads)
    monkeypatch.setenv("FUNCTRAIN_ENGINE_OPT", "fuse")
    assert engine.fusion_enabled() and not recompute.enabled()
    off = _jitted_steps(make_opt(), params, grads)
    for a, b in zip(jax.tree_util.tree_leaves(on), jax.tree_util.tree_leaves(off)):
        assert a.dtype == b.dtype
        tol = 1e-2 if a.dtype == jnp.bfloat16 else 2e-6
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=tol, atol=tol * 1e-2)


def test_trust_ratio_recompute_removes_the_params_sized_temporary(monkeypatch):
    """A 40 MB leaf: storing LAMB's direction needs a 40 MB XLA temporary; the recompute none."""
    params = {"w": jax.ShapeDtypeStruct((10_000_000,), jnp.float32)}
    opt = ft.lamb(1e-3, weight_decay=0.01)

    def temp_bytes():
        state = jax.eval_shape(opt.init, params)

        def step(p, s, g):
            u, s = opt.update(g, s, p)
            return ft.apply_updates(p, u), s
        compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    with_recompute = temp_bytes()
    monkeypatch.setenv("FUNCTRAIN_ENGINE_OPT", "fuse")
    stored = temp_bytes()
    assert stored >= 40_000_000
    assert with_recompute < 1_000_000


def test_trust_ratio_recompute_under_grad_vmap_and_grouped(monkeypatch):
    """The recomputed input works under jax.grad and jax.vmap (grouped engine) too."""
    from functrain.transforms import engine, recompute
    monkeypatch.setattr(recompute, "MIN_BYTES", 0)
    params = make_params()
    grads = jax.tree_util.tree_map(lambda p: jnp.sin(p) + 0.1, params)

    def loss(p, opt):  # through both norms of the trust ratio and the decay
        updates, _ = opt.update(grads, opt.init(params), p)
        return sum(jnp.sum(u ** 2) for u in jax.tree_util.tree_leaves(updates))

    opt = ft.lamb(1e-2, weight_decay=0.1)
    d_on = jax.grad(loss)(params, opt)
    monkeypatch.setenv("FUNCTRAIN_ENGINE_OPT", "fuse")
    d_off = jax.grad(loss)(params, opt)
    for a, b in zip(jax.tree_util.tree_leaves(d_on), jax.tree_util.tree_leaves(d_off)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9)
    assert any(float(jnp.max(jnp.abs(a))) > 1e-6 for a in jax.tree_util.tree_leaves(d_on))
    monkeypatch.delenv("FUNCTRAIN_ENGINE_OPT")
    grouped = _jitted_steps(ft.grouped(ft.lamb(1e-2, weight_decay=0.1)), params, grads)[0]
    plain = _jitted_steps(ft.lamb(1e-2, weight_decay=0.1), params, grads)[0]
    for a, b in zip(jax.tree_util.tree_leaves(grouped), jax.tree_util.tree_leaves(plain)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_engine_switch_rejects_unknown_values(monkeypatch):
    from functrain.transforms import engine, recompute
    monkeypatch.setenv("FUNCTRAIN_ENGINE_OPT", "fuse,turbo")
    with pytest.raises(ValueError, match="turbo"):
        engine.fusion_enabled()
    monkeypatch.setenv("FUNCTRAIN_ENGINE_OPT", "off")
    assert not engine.fusion_enabled() and not recompute.enabled()


@pytest.mark.parametrize("make", [
    lambda m: m.inject_hyperparams(m.lamb)(learning_rate=1e-2, weight_decay=0.05),
    lambda m: m.MultiSteps(m.lamb(1e-2, weight_decay=0.05), every_k_schedule=2),
    lambda m: m.chain(m.add_decayed_weights(lambda c: 1e-2 / (1.0 + c)),
                      m.scale_by_trust_ratio(), m.scale_by_learning_rate(1e-2)),
    lambda m: m.apply_if_finite(m.lars(0.1, weight_decay=1e-3), 3),
], ids=["inject_hyperparams(lamb)", "MultiSteps(lamb)", "scheduled-decay-trust-ratio",
        "apply_if_finite(lars)"])
def test_trust_ratio_recompute_in_wrappers_matches_optax(make, monkeypatch):
    """Traced hyperparameters, conds and schedules inside the recomputed prefix."""
    from functrain.transforms import engine, recompute
    from test_optax_parity import assert_same_trajectory
    monkeypatch.setattr(recompute, "MIN_BYTES", 0)
    assert_same_trajectory(make(ft), make(optax))


def test_trust_ratio_recompute_in_float64(monkeypatch):
    """x64: float64 literals go through the barrier as float64; same numbers as without it."""
    from functrain.transforms import engine, recompute
    monkeypatch.setattr(recompute, "MIN_BYTES", 0)
    with jax.enable_x64(True):
        params = {"w": jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float64).reshape(3, 4)}
        grads = {"w": jnp.cos(params["w"])}
        on = _jitted_steps(ft.lamb(1e-2, weight_decay=0.1), params, grads)[0]
        monkeypatch.setenv("FUNCTRAIN_ENGINE_OPT", "fuse")
        off = _jitted_steps(ft.lamb(1e-2, weight_decay=0.1), params, grads)[0]
        assert on["w"].dtype == jnp.float64
        np.testing.assert_allclose(on["w"], off["w"], rtol=1e-14)
