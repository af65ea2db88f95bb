"""Bad input across the package: clear errors naming the problem, raised before any array math.

Errors of one module only are tested in that module's file (e.g. the masks and labels of
masked/multi_transform in tests/wrappers/test_masking.py)."""

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
    with pytest.raises(ValueError, match=r"needs the current parameters: call update\(updates, "
                                         r"state, params\) with params"):
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


# --------------------------------------------------------------------------
# Dtypes, hyperparameter types, and optax's peer-suite defects
# --------------------------------------------------------------------------

import numpy as np  # noqa: E402
import optax  # noqa: E402

INT_PARAMS = {"w": jnp.ones((2, 3)), "step": jnp.zeros((), jnp.int32)}


@pytest.mark.parametrize("make", [lambda: ft.add_noise(0.1, 0.5), lambda: ft.contrib.soap(0.1),
                                  lambda: ft.contrib.sam(ft.sgd(0.1), ft.sgd(0.1))],
                         ids=["add_noise", "soap", "sam"])
def test_integer_params_are_rejected_at_init_naming_the_leaf(make):
    """By the transformations with their own update (the engine's stages compute integer
    params as floats, their state in that float: tests/engine/test_integer_leaves.py)."""
    with pytest.raises(TypeError, match=r"\['step'\] has dtype int32.*masked or multi_transform"):
        make().init(INT_PARAMS)


def test_bool_updates_are_rejected_naming_the_leaf():
    opt = ft.adam(0.1)
    state = opt.init({"w": jnp.ones(2)})
    with pytest.raises(TypeError, match=r"updates leaf \['w'\] has dtype bool"):
        opt.update({"w": jnp.ones(2, jnp.bool_)}, state)


@pytest.mark.parametrize("make", [
    lambda: ft.masked(ft.adam(0.1), {"w": True, "step": False}),
    lambda: ft.multi_transform({"opt": ft.adam(0.1), "none": ft.set_to_zero()},
                               {"w": "opt", "step": "none"}),
    lambda: ft.chain(ft.masked(ft.adamw(0.1), {"w": True, "step": False}),
                     ft.freeze({"w": False, "step": True})),
], ids=["masked", "multi_transform", "masked_adamw_and_freeze"])
def test_masked_out_integer_leaves_keep_working(make):
    """A step counter kept in params, masked out of the optimizer, is left alone."""
    opt = make()
    state = opt.init(INT_PARAMS)
    grads = {"w": jnp.ones((2, 3)), "step": jnp.ones((), jnp.int32)}
    updates, _ = opt.update(grads, state, INT_PARAMS)
    assert updates["step"].dtype == jnp.int32
    assert np.all(np.isfinite(updates["w"])) and np.all(updates["w"] < 0)


@pytest.mark.parametrize("make", [lambda: ft.sm3(0.1), lambda: ft.rprop(0.1),
                                  lambda: ft.chain(ft.clip(1.0), ft.sgd(0.1))],
                         ids=["sm3", "rprop", "clip"])
def test_complex_leaves_rejected_where_there_is_no_complex_version(make):
    params = {"w": jnp.ones(2), "z": jnp.ones(2, jnp.complex64)}
    with pytest.raises(TypeError, match=r"does not support complex.*\['z'\] is complex64"):
        make().init(params)


def test_complex_leaves_can_be_masked_out_of_a_real_only_stage():
    params = {"w": jnp.ones(2), "z": jnp.ones(2, jnp.complex64)}
    opt = ft.chain(ft.masked(ft.clip(0.5), {"w": True, "z": False}), ft.sgd(0.1))
    updates, _ = opt.update({"w": jnp.full(2, 3.0), "z": jnp.full(2, 3 + 3j, jnp.complex64)},
                            opt.init(params))
    np.testing.assert_allclose(updates["w"], -0.05)
    np.testing.assert_allclose(updates["z"], -(0.3 + 0.3j), rtol=1e-6)


@pytest.mark.parametrize("value, error, match", [
    ("0.1", TypeError, "learning_rate must be a real number or a schedule"),
    (None, TypeError, "learning_rate must be a real number"),
    (jnp.ones(3), TypeError, r"learning_rate must be .* of shape \(3,\)"),
    (float("nan"), ValueError, "learning_rate must be finite"),
    (float("inf"), ValueError, "learning_rate must be finite"),
    (True, TypeError, "learning_rate must be a real number"),
    (1j, TypeError, "learning_rate must be a real number"),
])
def test_bad_learning_rates_name_the_argument_and_optimizer(value, error, match):
    with pytest.raises(error, match="adam: " + match):
        ft.adam(value)


@pytest.mark.parametrize("make, match", [
    (lambda: ft.adam(0.1, b1=float("nan")), "adam: b1 must be finite"),
    (lambda: ft.adam(0.1, eps="1e-8"), "adam: eps must be a real number"),
    (lambda: ft.lamb(0.1, weight_decay=float("inf")), "lamb: weight_decay must be finite"),
    (lambda: ft.scale_by_adam(b2=None), "scale_by_adam: b2 must be a real number"),
    (lambda: ft.trace(decay=[0.9]), "trace: decay must be a real number"),
])
def test_bad_hyperparameters_name_the_argument(make, match):
    with pytest.raises((TypeError, ValueError), match=match):
        make()


def test_good_hyperparameter_forms_are_accepted():
    ft.adam(jnp.asarray(0.1))                       # a scalar array
    ft.adam(np.float32(0.1), b1=np.float64(0.9))    # numpy scalars
    ft.adam(lambda count: 0.1 / (1 + count))       # a schedule
    ft.adamw(0.1, weight_decay=lambda count: 1e-4)  # a scheduled decay, as optax
    ft.clip_by_global_norm(float("inf"))           # a bound may be infinite
    ft.inject_hyperparams(ft.adam)(learning_rate=0.1)


@pytest.mark.parametrize("make", [
    lambda: ft.masked(ft.adam(0.1), {"w": True, "b": False}),
    lambda: ft.adamw(0.1, mask={"w": True, "b": False}),
    lambda: ft.multi_transform({"a": ft.adam(0.1), "s": ft.sgd(0.1)}, {"w": "a", "b": "s"}),
    lambda: ft.freeze({"w": True, "b": False}),
    lambda: ft.masked(ft.MultiSteps(ft.adam(0.1), 2), {"w": True, "b": False}),
    lambda: ft.chain(ft.clip_by_global_norm(1.0),
                     ft.masked(ft.chain(ft.scale_by_adam(), ft.scale(-0.1)),
                               {"w": True, "b": False})),
], ids=["masked", "adamw_mask", "multi_transform", "freeze", "masked_generic", "chain_masked"])
def test_optax_map_params_works_on_every_wrapper(make):
    """optax.tree.map_params calls init with a leafless placeholder: masks let it through."""
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    opt = make()
    state = opt.init(params)
    mapped = optax.tree.map_params(opt, lambda p: p.shape, state,
                                   transform_non_params=lambda _: None)
    # Every params-shaped array of the state was mapped to its shape, nothing else.
    leaves = jax.tree_util.tree_leaves(mapped, is_leaf=lambda x: isinstance(x, tuple)
                                       and all(isinstance(d, int) for d in x))
    assert all(isinstance(x, tuple) for x in leaves)


class _CallableMask(dict):
    """A mask that is a callable pytree (like an Equinox module): used as a tree."""

    def __call__(self, *args):
        raise AssertionError("a callable pytree mask must not be called")


jax.tree_util.register_pytree_node(
    _CallableMask, lambda d: (tuple(d[k] for k in sorted(d)), tuple(sorted(d))),
    lambda keys, values: _CallableMask(zip(keys, values)))


@pytest.mark.parametrize("wrap", [
    lambda m: ft.masked(ft.sgd(0.1), m), lambda m: ft.adamw(0.1, mask=m),
    lambda m: ft.masked(ft.MultiSteps(ft.sgd(0.1), 1), m)], ids=["masked", "adamw", "generic"])
def test_callable_pytree_masks_are_trees(wrap):
    params = _CallableMask(w=jnp.ones(2), b=jnp.full(2, 3.0))
    opt = wrap(_CallableMask(w=True, b=False))
    updates, _ = opt.update(params, opt.init(params), params)
    # The same as with the mask given as a function returning that tree.
    ref = wrap(lambda p: _CallableMask(w=True, b=False))
    expected, _ = ref.update(params, ref.init(params), params)
    for k in ("w", "b"):
        np.testing.assert_array_equal(updates[k], expected[k])
    assert not np.allclose(updates["w"], updates["b"])


@pytest.mark.parametrize("name", ["adam", "sgd", "lamb", "rmsprop"])
def test_python_number_params_as_in_optax(name):
    params = {"a": 1.0, "b": 2.0}
    opt = getattr(ft, name)(0.1)
    updates, _ = opt.update({"a": 0.5, "b": -1.0}, opt.init(params), params)
    ref = getattr(optax, name)(0.1) if name != "lamb" else None
    if ref is not None:  # optax's lamb fails on Python floats; the others agree
        expected, _ = ref.update({"a": 0.5, "b": -1.0}, ref.init(params), params)
        for k in params:
            np.testing.assert_allclose(updates[k], expected[k], rtol=1e-6)
    new = ft.apply_updates(params, updates)
    assert set(new) == {"a", "b"}


def test_apply_updates_passes_none_through_as_optax():
    import optax
    assert ft.apply_updates(None, None) is None
    assert ft.apply_updates(None, jnp.ones(2)) is optax.apply_updates(None, jnp.ones(2)) is None
    params = {"a": None, "b": jnp.ones(1)}
    out = ft.apply_updates(params, {"a": None, "b": jnp.ones(1)})
    assert out["a"] is None
    np.testing.assert_allclose(out["b"], 2.0)
