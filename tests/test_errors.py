"""Bad input across the package: clear errors naming the problem, raised before any array math.

Errors of one module only are tested in that module's file (e.g. the masks and labels of
masked/multi_transform in tests/wrappers/test_masking.py, grouped's in
tests/transforms/test_grouped.py)."""

import jax
import jax.numpy as jnp
import pytest

import functrain as ft

PARAMS = {"decoder": {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}, "encoder": jnp.ones(4)}


def grads_like(tree):
    return jax.tree_util.tree_map(jnp.ones_like, tree)


@pytest.mark.parametrize("opt", [ft.adam(1e-3), ft.lamb(1e-3), ft.sgd(0.1, 0.9),
                                 ft.chain(ft.clip_by_global_norm(1.0), ft.lars(0.1))])
def test_structure_mismatch_names_the_path(opt):
    state = opt.init(PARAMS)
    grads = {"decoder": {"w": jnp.ones((2, 3))}, "encoder": jnp.ones(4)}
    with pytest.raises(ValueError, match=r"\['decoder'\]\['b'\]"):
        opt.update(grads, state, PARAMS)


def test_state_for_other_params_names_the_path():
    opt = ft.adam(1e-3)
    state = opt.init({"a": jnp.ones(2)})
    with pytest.raises(ValueError, match=r"\['b'\]"):
        opt.update({"a": jnp.ones(2), "b": jnp.ones(2)}, state)


def test_shape_mismatch_names_leaf_and_both_shapes():
    opt = ft.adam(1e-3)
    state = opt.init(PARAMS)
    grads = grads_like(PARAMS)
    grads["decoder"]["w"] = jnp.ones((3, 2))
    with pytest.raises(ValueError, match=r"\['decoder'\]\['w'\].*\(3, 2\).*\(2, 3\)"):
        opt.update(grads, state, PARAMS)


def test_params_shape_mismatch():
    opt = ft.lamb(1e-3)
    state = opt.init(PARAMS)
    bad = dict(PARAMS, encoder=jnp.ones(5))
    with pytest.raises(ValueError, match=r"\['encoder'\].*\(4,\).*params.*\(5,\)"):
        opt.update(grads_like(PARAMS), state, bad)


@pytest.mark.parametrize("opt", [ft.lamb(1e-3), ft.lars(1e-3), ft.adamw(1e-3),
                                 ft.lion(1e-3)])
def test_params_required(opt):
    with pytest.raises(ValueError, match="params.*required"):
        opt.update(grads_like(PARAMS), opt.init(PARAMS))


def test_errors_come_before_array_math(monkeypatch):
    """No leaf function runs when the check fails: the engine checks first."""
    opt = ft.adam(1e-3)
    state = opt.init(PARAMS)
    calls = []
    real = jnp.sqrt
    monkeypatch.setattr(jnp, "sqrt", lambda *a, **k: calls.append(1) or real(*a, **k))
    with pytest.raises(ValueError):
        opt.update({"encoder": jnp.ones(4)}, state)
    assert calls == []


@pytest.mark.parametrize("make,arg", [
    (lambda: ft.adam(1e-3, b1=1.0), "b1"),
    (lambda: ft.adam(1e-3, b2=-0.1), "b2"),
    (lambda: ft.adam(1e-3, eps=-1e-8), "eps"),
    (lambda: ft.adam(1e-3, eps_root=-1.0), "eps_root"),
    (lambda: ft.adamw(1e-3, weight_decay=-1e-4), "weight_decay"),
    (lambda: ft.lamb(1e-3, b1=1.5), "b1"),
    (lambda: ft.lamb(1e-3, weight_decay=-0.1), "weight_decay"),
    (lambda: ft.sgd(1e-3, momentum=1.0), "momentum"),
    (lambda: ft.sgd(1e-3, momentum=-0.5), "momentum"),
    (lambda: ft.lars(1e-3, momentum=1.2), "momentum"),
    (lambda: ft.rmsprop(1e-3, momentum=1.0), "momentum"),
    (lambda: ft.rmsprop(1e-3, decay=1.0), "decay"),
    (lambda: ft.clip_by_global_norm(-1.0), "max_norm"),
    (lambda: ft.clip(-1.0), "max_delta"),
    (lambda: ft.lion(1e-3, b2=1.0), "b2"),
    (lambda: ft.adam(1e-3, b1=float("nan")), "b1"),
])
def test_invalid_hyperparameters_name_the_argument(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()


def test_traced_hyperparameters_are_not_checked():
    @jax.jit
    def step(b1, g):
        opt = ft.adam(1e-3, b1=b1)
        return opt.update(g, opt.init(g))[0]

    assert step(jnp.float32(0.5), jnp.ones(2)).shape == (2,)


def test_wrong_state_type():
    opt = ft.adam(1e-3)
    with pytest.raises((TypeError, ValueError), match="init"):
        opt.update(grads_like(PARAMS), ft.sgd(0.1, 0.9).init(PARAMS), PARAMS)


def test_chain_rejects_non_transformations():
    with pytest.raises(TypeError, match="chain argument 1"):
        ft.chain(ft.adam(1e-3), 0.1)


def test_apply_updates_mismatch_names_path():
    with pytest.raises(ValueError, match=r"\['encoder'\]"):
        ft.apply_updates(PARAMS, {"decoder": grads_like(PARAMS["decoder"])})


def test_wrong_state_is_named():
    """Wrappers and named_chain name themselves when given another optimizer's state."""
    params = [jnp.ones(1)]
    with pytest.raises(TypeError, match="MultiSteps"):
        ft.MultiSteps(ft.sgd(0.1), 2).update(params, (), params)
    with pytest.raises(TypeError, match="apply_if_finite"):
        ft.apply_if_finite(ft.sgd(0.1), 2).update(params, (), params)
    with pytest.raises(ValueError, match="named_chain"):
        ft.named_chain(("a", ft.sgd(0.1))).update(params, {"b": ()}, params)
    with pytest.raises(ValueError, match="every_k_schedule"):
        ft.MultiSteps(ft.sgd(0.1), 0)
    with pytest.raises(ValueError, match="unique"):
        ft.named_chain(("a", ft.sgd(0.1)), ("a", ft.sgd(0.1)))


def test_mask_that_does_not_fit():
    opt = ft.adamw(1e-3, mask={"decoder": True, "other": False})
    with pytest.raises(ValueError, match="mask"):
        opt.init(PARAMS)
