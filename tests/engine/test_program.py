"""functrain.engine.program: chain fusion, extra args, empty trees, donation, eval_shape,
recompiles, the dtype policy, and chains mixing functrain and optax transformations."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from helpers import (assert_empty_params_step, assert_same_trajectory, assert_state_donatable,
                     make_grads, make_params)


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


def test_functrain_and_optax_transformations_are_interchangeable():
    """Both libraries' chain take the other's transformations, with optax's numbers.

    functrain.chain(optax..., functrain..., ...) and optax.chain(functrain...,
    optax..., ...) against the pure-optax chain: params and states after every
    one of a few steps.
    """
    assert isinstance(ft.adam(1e-3), ft.GradientTransformation)
    init, update = ft.adam(1e-3)  # a plain (init, update) pair, as optax's
    assert callable(init) and callable(update)

    def build(chain, a, b):
        """clip, adam, decay, trust ratio, lr: from libraries a and b alternately."""
        return chain(a.clip(1.0), b.scale_by_adam(), a.add_decayed_weights(1e-2),
                     b.scale_by_trust_ratio(), a.scale(-1e-2))

    pure = build(optax.chain, optax, optax)
    mixed = {"functrain.chain(optax first)": build(ft.chain, optax, ft),
             "functrain.chain(functrain first)": build(ft.chain, ft, optax),
             "optax.chain(functrain first)": build(optax.chain, ft, optax),
             "optax.chain(optax first)": build(optax.chain, optax, ft)}
    params = make_params()
    grads = make_grads(params, 4)
    for name, opt in mixed.items():
        assert_same_trajectory(opt, pure, params=params, grads=grads, name=name)
        # The states too: same layout (a tuple of five) and the same numbers.
        s_mixed, s_pure = opt.init(params), pure.init(params)
        for t in range(4):
            g = jax.tree_util.tree_map(lambda x: x[t], grads)
            u_mixed, s_mixed = opt.update(g, s_mixed, params)
            u_pure, s_pure = pure.update(g, s_pure, params)
        assert len(s_mixed) == len(s_pure) == 5, name
        for a, b in zip(jax.tree_util.tree_leaves((u_mixed, s_mixed)),
                        jax.tree_util.tree_leaves((u_pure, s_pure))):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-7, err_msg=name)
        assert int(s_mixed[1].count) == 4, name


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


@pytest.mark.parametrize("make", [
    lambda: ft.named_chain(("a", ft.adam(0.1))),
    lambda: ft.chain(ft.zero_nans(), ft.ema(0.9), ft.add_noise(0.1, 0.5, 0),
                     ft.keep_params_nonnegative(), ft.freeze({})),
], ids=["named_chain", "per_leaf"])
def test_empty_params(make):
    assert_empty_params_step(make())


@pytest.mark.parametrize("make", [
    lambda: ft.named_chain(("ema", ft.ema(0.9)), ("sgd", ft.sgd(0.1, momentum=0.9))),
], ids=["named_chain"])
def test_state_can_be_donated_and_abstractly_initialised(make):
    assert_state_donatable(make())


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


def test_chain_fuses_the_stages_into_one_walk_with_optax_numbers(monkeypatch):
    """clip_by_global_norm + lamb: one walk over the tree for five stages; optax's numbers."""
    from functrain.engine import program as engine
    params = make_params()
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    opt = ft.chain(ft.clip_by_global_norm(1.0), ft.lamb(1e-2, weight_decay=0.1))
    blocks = []
    real = engine.run_block
    monkeypatch.setattr(engine, "run_block",
                        lambda stages, *a: blocks.append(len(stages)) or real(stages, *a))
    fused, _ = opt.update(grads, opt.init(params), params)
    assert blocks == [5]  # the global norm is read first, then one pass for all five
    peer = optax.chain(optax.clip_by_global_norm(1.0), optax.lamb(1e-2, weight_decay=0.1))
    unfused, _ = peer.update(grads, peer.init(params), params)  # one tree_map per transform
    for a, b in zip(jax.tree_util.tree_leaves(fused), jax.tree_util.tree_leaves(unfused)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


# --------------------------------------------------------------------------
# The dtype policy: 16-bit leaves computed in float32, results cast back
# --------------------------------------------------------------------------

LOW_PRECISION = {
    "sgd": lambda: ft.sgd(1e-3, momentum=0.9),
    "adam": lambda: ft.adam(1e-3),
    "adamw": lambda: ft.adamw(1e-3),
    "lamb": lambda: ft.lamb(1e-3),
    "lars": lambda: ft.lars(1e-3),
    "rmsprop": lambda: ft.rmsprop(1e-3, centered=True),
    "adagrad": lambda: ft.adagrad(1e-3),
    "lion": lambda: ft.lion(1e-3),
    "clip_lamb": lambda: ft.chain(ft.clip_by_global_norm(0.0), ft.lamb(1e-3)),
}


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("name", sorted(LOW_PRECISION))
def test_low_precision_zero_gradients_give_finite_updates(name, dtype):
    params = {"w": jnp.ones((3, 2), dtype), "z": jnp.zeros(4, dtype)}
    opt = LOW_PRECISION[name]()
    state = opt.init(params)
    grads = jax.tree_util.tree_map(jnp.zeros_like, params)
    for _ in range(3):
        updates, state = jax.jit(opt.update)(grads, state, params)
        for u in jax.tree_util.tree_leaves(updates):
            assert u.dtype == dtype
            assert bool(jnp.all(jnp.isfinite(u)))
        params = ft.apply_updates(params, updates)
        assert all(p.dtype == dtype for p in jax.tree_util.tree_leaves(params))


def test_updates_keep_gradient_dtype_with_bf16_params_and_f32_grads():
    params = {"w": jnp.ones(4, jnp.bfloat16)}
    grads = {"w": jnp.full(4, 0.5, jnp.float32)}
    opt = ft.lamb(1e-2)
    updates, state = opt.update(grads, opt.init(params), params)
    assert updates["w"].dtype == jnp.float32
    assert ft.apply_updates(params, updates)["w"].dtype == jnp.bfloat16


def test_global_norm_and_apply_updates_by_hand():
    tree = {"a": jnp.array([3.0, 0.0]), "b": jnp.array(4.0, jnp.bfloat16)}
    np.testing.assert_allclose(ft.global_norm(tree), 5.0, rtol=1e-6)
    assert ft.global_norm(tree).dtype == jnp.float32
    params = {"a": jnp.array([1.0, 2.0]), "b": jnp.array(1.0, jnp.bfloat16)}
    new = ft.apply_updates(params, tree)
    np.testing.assert_array_equal(new["a"], [4.0, 2.0])
    assert new["b"].dtype == jnp.bfloat16 and float(new["b"]) == 5.0
    same, state = ft.identity().update(tree, ft.identity().init(tree))
    assert state == ft.EmptyState()
    for a, b in zip(jax.tree_util.tree_leaves(same), jax.tree_util.tree_leaves(tree)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------
# incremental_update / periodic_update against optax 0.2.8
# --------------------------------------------------------------------------

def test_incremental_update_matches_optax_over_steps():
    # A Polyak average of a moving parameter tree, 30 jitted steps, several step sizes.
    params = make_params()
    for step_size in (0.01, 0.3, 1.0):
        ours = jax.jit(lambda n, o: ft.incremental_update(n, o, step_size))
        theirs = jax.jit(lambda n, o: optax.incremental_update(n, o, step_size))
        avg1 = avg2 = params
        p = params
        for t in range(30):
            p = jax.tree_util.tree_map(lambda x: x + jnp.sin(x + t), p)
            avg1, avg2 = ours(p, avg1), theirs(p, avg2)
            for a, b in zip(jax.tree_util.tree_leaves(avg1), jax.tree_util.tree_leaves(avg2)):
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert ft.incremental_update({"a": None, "b": jnp.ones(1)},
                                 {"a": jnp.zeros(2), "b": jnp.zeros(1)}, 0.25)["a"] is None


def test_periodic_update_matches_optax_with_traced_steps():
    new, old = make_params(), jax.tree_util.tree_map(jnp.zeros_like, make_params())
    ours = jax.jit(lambda s: ft.periodic_update(new, old, s, 3))
    theirs = jax.jit(lambda s: optax.periodic_update(new, old, s, 3))
    for step in range(7):
        a, b = ours(jnp.asarray(step)), theirs(jnp.asarray(step))
        for x, y, n in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b),
                           jax.tree_util.tree_leaves(new)):
            np.testing.assert_array_equal(x, y)
            np.testing.assert_array_equal(x, n if step % 3 == 0 else 0 * n)


def test_incremental_and_periodic_update_errors():
    with pytest.raises(ValueError, match=r"old_tensors leaf \['b'\] has shape \(3,\)"):
        ft.incremental_update({"b": jnp.ones(2)}, {"b": jnp.ones(3)}, 0.1)
    with pytest.raises(ValueError, match="different tree structures"):
        ft.incremental_update({"b": jnp.ones(2)}, {"c": jnp.ones(2)}, 0.1)
    with pytest.raises(ValueError, match="incremental_update: step_size must be"):
        ft.incremental_update({"b": jnp.ones(2)}, {"b": jnp.ones(2)}, float("nan"))
    with pytest.raises(ValueError, match="periodic_update: update_period must be >= 1"):
        ft.periodic_update([jnp.ones(1)], [jnp.ones(1)], 2, 0)


def test_chain_and_named_chain_are_extra_args_transformations():
    """As in optax, the combinators return GradientTransformationExtraArgs (a
    GradientTransformation subclass), and pass extra keywords on."""
    tx = ft.chain(ft.clip(1.0), ft.scale_by_polyak(max_learning_rate=10.0))
    named = ft.named_chain(("clip", ft.clip(1.0)))
    for t in (tx, named):
        assert isinstance(t, ft.GradientTransformationExtraArgs)
        assert isinstance(t, ft.GradientTransformation)
    g = {"w": jnp.array([0.5, -0.5])}
    u, _ = tx.update(g, tx.init(g), g, value=jnp.asarray(1.0))
    # polyak: min(f / (|g|^2 + eps), max lr) * g, with f=1, |g|^2 = 0.5: 2 g
    np.testing.assert_allclose(u["w"], 2 * np.asarray(g["w"]), rtol=1e-5)
