"""functrain.engine.recompute: the XLA:CPU trust-ratio recompute.

It must change no number (beyond the rounding of a norm summed in another
order), it must remove LAMB's params-sized temporary, and it must actually run
where it should: these tests count its calls while a step is traced.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from functrain.engine import recompute
from functrain import jax_compat
from functrain.jax_compat import enable_x64
from helpers import assert_same_trajectory, jitted_steps, make_params


# The JAX from which the recompute turns itself on (it removed no temporary before).
MIN_JAX = recompute.MIN_JAX


@pytest.fixture(autouse=True)
def recompute_on_any_jax(monkeypatch):
    """The recompute's numbers are checked on every JAX and backend (a GPU too); whether it
    pays on this one is test_trust_ratio_recompute_removes_the_params_sized_temporary's
    question."""
    monkeypatch.setattr(recompute, "MIN_JAX", "0.0.0")
    monkeypatch.setattr(recompute, "BACKENDS", (jax.default_backend(),))


@pytest.fixture
def spy(monkeypatch):
    """Counts calls of recompute.input_for_norm (engine.py calls it through the module)."""
    calls = []
    real = recompute.input_for_norm

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(recompute, "input_for_norm", counting)
    return calls


def lamb_step_jaxpr() -> str:
    """The jaxpr of one lamb(1e-2, weight_decay=0.1) update on a two-leaf tree."""
    params = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "b": jnp.linspace(0.5, 1.0, 4)}
    grads = jax.tree_util.tree_map(jnp.cos, params)
    opt = ft.lamb(1e-2, weight_decay=0.1)
    state = opt.init(params)
    return str(jax.make_jaxpr(lambda g, s, p: opt.update(g, s, p))(grads, state, params))


TWO_LEAVES = 2


# --------------------------------------------------------------------------
# It runs where it should, and only there
# --------------------------------------------------------------------------

def test_recompute_runs_once_per_leaf_by_default(spy, monkeypatch):
    monkeypatch.setattr(recompute, "MIN_BYTES", 0)
    assert jax.default_backend() in recompute.BACKENDS and recompute.applies(0)
    text = lamb_step_jaxpr()
    assert len(spy) == TWO_LEAVES, f"input_for_norm ran {len(spy)} times for 2 leaves"
    assert "optimization_barrier" in text, "the recomputed input hides no constant"


def test_recompute_is_gated_to_the_listed_backends(spy, monkeypatch):
    monkeypatch.setattr(recompute, "MIN_BYTES", 0)
    monkeypatch.setattr(recompute, "BACKENDS", ())
    assert not recompute.applies(2**40)
    text = lamb_step_jaxpr()
    assert spy == []
    assert "optimization_barrier" not in text


def test_recompute_threshold_is_min_bytes():
    assert recompute.MIN_BYTES == 32 * 2**20  # the default: glibc's mmap threshold
    assert jax.default_backend() == "cpu"
    assert recompute.applies(recompute.MIN_BYTES) is True
    assert recompute.applies(recompute.MIN_BYTES - 1) is False


def test_small_trees_skip_the_recompute_by_default(spy):
    """Below MIN_BYTES (the default) the recompute does not run: it would be slower there."""
    lamb_step_jaxpr()
    assert spy == []


# --------------------------------------------------------------------------
# It changes no number
# --------------------------------------------------------------------------

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
    monkeypatch.setattr(recompute, "MIN_BYTES", 0)
    params = make_params()
    params["bf16"] = jnp.linspace(-1, 1, 12, dtype=jnp.bfloat16).reshape(3, 4)
    grads = jax.tree_util.tree_map(lambda p: jnp.cos(3 * p.astype(jnp.float32)).astype(p.dtype),
                                   params)
    assert recompute.applies(0)
    on = jitted_steps(make_opt(), params, grads)
    monkeypatch.setattr(recompute, "BACKENDS", ())  # off
    assert not recompute.applies(0)
    off = jitted_steps(make_opt(), params, grads)
    for a, b in zip(jax.tree_util.tree_leaves(on), jax.tree_util.tree_leaves(off)):
        assert a.dtype == b.dtype
        tol = 1e-2 if a.dtype == jnp.bfloat16 else 2e-6
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=tol, atol=tol * 1e-2)


@pytest.mark.long
def test_trust_ratio_recompute_under_grad_and_vmap(monkeypatch):
    """The recomputed input works under jax.grad and jax.vmap too."""
    monkeypatch.setattr(recompute, "MIN_BYTES", 0)
    params = make_params()
    grads = jax.tree_util.tree_map(lambda p: jnp.sin(p) + 0.1, params)

    def loss(p, opt):  # through both norms of the trust ratio and the decay
        updates, _ = opt.update(grads, opt.init(params), p)
        return sum(jnp.sum(u ** 2) for u in jax.tree_util.tree_leaves(updates))

    opt = ft.lamb(1e-2, weight_decay=0.1)
    d_on = jax.grad(loss)(params, opt)
    backends = recompute.BACKENDS
    monkeypatch.setattr(recompute, "BACKENDS", ())  # off
    d_off = jax.grad(loss)(params, opt)
    for a, b in zip(jax.tree_util.tree_leaves(d_on), jax.tree_util.tree_leaves(d_off)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9)
    assert any(float(jnp.max(jnp.abs(a))) > 1e-6 for a in jax.tree_util.tree_leaves(d_on))
    monkeypatch.setattr(recompute, "BACKENDS", backends)  # on again
    opt = ft.lamb(1e-2, weight_decay=0.1)  # two copies of the tree, one vmapped step
    stacked_p, stacked_g = (jax.tree_util.tree_map(lambda x: jnp.stack([x, 2 * x]), t)
                            for t in (params, grads))
    stacked = jax.vmap(lambda p, g: opt.update(g, opt.init(p), p)[0])(stacked_p, stacked_g)
    for i in range(2):
        p_i, g_i = (jax.tree_util.tree_map(lambda x: x[i], t) for t in (stacked_p, stacked_g))
        alone = opt.update(g_i, opt.init(p_i), p_i)[0]
        for a, b in zip(jax.tree_util.tree_leaves(stacked), jax.tree_util.tree_leaves(alone)):
            np.testing.assert_allclose(a[i], b, rtol=1e-6, atol=1e-7)


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
    monkeypatch.setattr(recompute, "MIN_BYTES", 0)
    assert_same_trajectory(make(ft), make(optax))


def test_trust_ratio_recompute_in_float64(monkeypatch):
    """x64: float64 literals go through the barrier as float64; same numbers as without it."""
    monkeypatch.setattr(recompute, "MIN_BYTES", 0)
    with enable_x64(True):
        params = {"w": jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float64).reshape(3, 4)}
        grads = {"w": jnp.cos(params["w"])}
        on = jitted_steps(ft.lamb(1e-2, weight_decay=0.1), params, grads)[0]
        monkeypatch.setattr(recompute, "BACKENDS", ())  # off
        off = jitted_steps(ft.lamb(1e-2, weight_decay=0.1), params, grads)[0]
        assert on["w"].dtype == jnp.float64
        np.testing.assert_allclose(on["w"], off["w"], rtol=1e-14)


# --------------------------------------------------------------------------
# It does what it is for: no params-sized temporary
# --------------------------------------------------------------------------

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

    monkeypatch.setattr(recompute, "MIN_JAX", MIN_JAX)
    with_recompute = temp_bytes()
    monkeypatch.setattr(recompute, "BACKENDS", ())  # off
    stored = temp_bytes()
    assert stored >= 40_000_000
    if jax_compat.jax_at_least(MIN_JAX):
        assert with_recompute < 1_000_000
    else:  # off on an older JAX, whose XLA:CPU kept the temporary anyway
        assert not recompute.applies(2**40) and with_recompute == stored
