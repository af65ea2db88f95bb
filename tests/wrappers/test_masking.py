"""functrain.wrappers.masking: masked, multi_transform, partition, freeze (by hand; every step
against optax in tests/parity/test_optax_parity.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from functrain.tree import MaskedNode
import registry
from helpers import (assert_empty_params_step, assert_state_donatable, loss_value,
                     matrices_only)


def test_masked_weight_decay_by_hand():
    opt = ft.chain(ft.masked(ft.add_decayed_weights(0.1), {"w": True, "b": False}),
                   ft.sgd(0.5))
    params = {"w": jnp.array([2., -4.]), "b": jnp.array([3.])}
    state = opt.init(params)
    grads = {"w": jnp.array([1., 1.]), "b": jnp.array([1.])}
    for _ in range(3):
        u, state = opt.update(grads, state, params)
        expected_w = params["w"] - 0.5 * (grads["w"] + 0.1 * params["w"])
        expected_b = params["b"] - 0.5 * grads["b"]
        params = ft.apply_updates(params, u)
        np.testing.assert_allclose(params["w"], expected_w, rtol=1e-6)
        np.testing.assert_allclose(params["b"], expected_b, rtol=1e-6)


def test_masked_out_leaves_hold_no_state():
    params = {"w": jnp.ones((3, 3)), "b": jnp.ones(3)}
    state = ft.masked(ft.adam(1e-2), {"w": True, "b": False}).init(params)
    adam_state = state.inner_state[0]
    assert isinstance(adam_state.mu["b"], MaskedNode)
    assert isinstance(adam_state.nu["b"], MaskedNode)
    assert [x.shape for x in jax.tree_util.tree_leaves(state)] == [(), (3, 3), (3, 3)]
    frozen = ft.freeze({"w": True, "b": False}).init(params)
    assert jax.tree_util.tree_leaves(frozen) == []
    # multi_transform: each group's optimizer holds state for its own leaves only.
    state = ft.multi_transform({"x": ft.adam(1e-2), "y": ft.sgd(0.1, momentum=0.9)},
                               {"w": "x", "b": "y"}).init(params)
    assert [x.shape for x in jax.tree_util.tree_leaves(state.inner_states["x"])] == \
        [(), (3, 3), (3, 3)]
    assert [x.shape for x in jax.tree_util.tree_leaves(state.inner_states["y"])] == [(3,)]


def test_stage_mask_inside_a_placeholder_tree_hits_the_right_leaves():
    """A masked optimizer behind apply_if_finite inside masked: flags index real leaves."""
    params = {'a': jnp.array([1.]), 'b': jnp.array([1.]), 'c': jnp.array([1.])}
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    results = []
    for lib in (ft, optax):
        opt = lib.masked(lib.apply_if_finite(
            lib.adamw(0.1, weight_decay=0.5, mask={'a': True, 'b': False, 'c': False}), 2),
            {'a': False, 'b': True, 'c': True})
        results.append(opt.update(grads, opt.init(params), params)[0])
    for x, y in zip(jax.tree_util.tree_leaves(results[0]), jax.tree_util.tree_leaves(results[1])):
        np.testing.assert_allclose(x, y, rtol=1e-6)


def test_freeze_and_partition_by_hand():
    params = {"w": jnp.array([1.0, 2.0]), "b": jnp.array([3.0])}
    grads = {"w": jnp.array([1.0, -1.0]), "b": jnp.array([2.0])}
    opt = ft.chain(ft.freeze({"w": False, "b": True}), ft.sgd(0.5))
    u, _ = opt.update(grads, opt.init(params), params)
    np.testing.assert_allclose(u["w"], [-0.5, 0.5])
    np.testing.assert_array_equal(u["b"], [0.0])
    opt = ft.partition({"fast": ft.sgd(1.0), "off": ft.set_to_zero()}, {"w": "fast", "b": "off"})
    u, _ = opt.update(grads, opt.init(params), params)
    np.testing.assert_allclose(u["w"], [-1.0, 1.0])
    np.testing.assert_array_equal(u["b"], [0.0])


@pytest.mark.parametrize("make", [
    lambda: ft.masked(ft.adam(0.1), {}),
    lambda: ft.multi_transform({"a": ft.adam(0.1)}, {}),
], ids=["masked", "multi_transform"])
def test_empty_params(make):
    assert_empty_params_step(make())


@pytest.mark.parametrize("make", [
    lambda: ft.masked(ft.adamw(0.1, mask=matrices_only), {"w": True, "b": False}),
    lambda: ft.multi_transform({"x": ft.adam(0.1), "y": ft.lion(0.1)}, {"w": "x", "b": "y"}),
], ids=["masked", "multi_transform"])
def test_state_can_be_donated_and_abstractly_initialised(make):
    assert_state_donatable(make())


# --------------------------------------------------------------------------
# Errors name the wrapper and the key path
# --------------------------------------------------------------------------

def test_mask_that_does_not_fit_names_path_and_wrapper():
    params = {"encoder": {"w": jnp.ones(2)}, "decoder": {"w": jnp.ones(2)}}
    with pytest.raises(ValueError, match=r"masked.*\['decoder'\]|\['decoder'\].*masked"):
        ft.masked(ft.adam(0.1), {"encoder": True}).init(params)
    with pytest.raises(ValueError, match=r"masked.*\['decoder'\]|\['decoder'\].*masked"):
        ft.masked(ft.add_decayed_weights(0.1), {"encoder": True}).init(params)
    with pytest.raises(ValueError, match=r"freeze.*\['decoder'\]|\['decoder'\].*freeze"):
        ft.freeze({"encoder": True, "head": False}).init(params)


def test_labels_that_do_not_fit_name_path_and_wrapper():
    params = {"encoder": {"w": jnp.ones(2)}, "decoder": {"w": jnp.ones(2)}}
    with pytest.raises(ValueError,
                       match=r"multi_transform.*\['decoder'\]|\['decoder'\].*multi_transform"):
        ft.multi_transform({"a": ft.adam(0.1)}, {"encoder": "a"}).init(params)


def test_label_without_transform_and_unused_transform_list_both_sides():
    params = {"w": jnp.ones(2), "b": jnp.ones(2)}
    with pytest.raises(ValueError, match=r"\['c'\] have no transformation.*\['a', 'c'\].*"
                                         r"\['a', 'b'\]"):
        ft.multi_transform({"a": ft.adam(0.1), "b": ft.sgd(0.1)},
                           {"w": "a", "b": "c"}).init(params)


def test_transformation_no_leaf_uses_is_allowed_as_in_optax():
    """A label no leaf has: no error, and optax's numbers and state structure."""
    params = {"w": jnp.ones((2, 2)), "b": jnp.ones(2)}
    grads = {"w": jnp.full((2, 2), 0.5), "b": jnp.array([1.0, -2.0])}
    results = []
    for m in (ft, optax):
        tx = m.multi_transform({"a": m.adam(0.1), "b": m.sgd(0.1, momentum=0.9)},
                               {"w": "a", "b": "a"})
        state = tx.init(params)
        for _ in range(3):
            updates, state = tx.update(grads, state, params)
        results.append((updates, state))
    (ours, our_state), (theirs, their_state) = results
    for key in params:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=2e-5)  # the parity tolerance
    # The same layout (each library has its own MaskedNode class, so compare the text).
    assert repr(our_state.inner_states["b"]) == repr(their_state.inner_states["b"])


# --------------------------------------------------------------------------
# selective_transform against optax 0.2.8
# --------------------------------------------------------------------------

from helpers import assert_same_trajectory, make_params  # noqa: E402

FREEZE_MASKS = {
    "some": {"dense": {"w": False, "b": True}, "layers": [True, False], "scalar": False},
    "prefix": {"dense": True, "layers": False, "scalar": True},
    "none": False,
}


@pytest.mark.parametrize("case", sorted(FREEZE_MASKS))
def test_selective_transform_matches_optax(case):
    mask = FREEZE_MASKS[case]
    make = lambda m: m.selective_transform(m.adam(0.05), freeze_mask=mask)  # noqa: E731
    assert_same_trajectory(make(ft), make(optax), steps=30, name=case)
    params = make_params()
    a, b = make(ft).init(params), make(optax).init(params)
    assert sorted(a.inner_states) == sorted(b.inner_states) == ["freeze", "train"]
    # Frozen leaves hold no optimizer state (MaskedNode), as in optax.
    shapes = [[x.shape for x in jax.tree_util.tree_leaves(s.inner_states["train"])]
              for s in (a, b)]
    assert shapes[0] == shapes[1]


def test_selective_transform_everything_frozen():
    params = make_params()
    tx = ft.selective_transform(ft.sgd(0.1), freeze_mask=jnp.asarray(True))
    u, _ = tx.update(params, tx.init(params), params)
    assert all(bool(jnp.all(x == 0)) for x in jax.tree_util.tree_leaves(u))


def test_selective_transform_errors_name_the_argument():
    with pytest.raises(TypeError, match="selective_transform: optimizer is a float"):
        ft.selective_transform(0.1, freeze_mask=True)
    with pytest.raises(TypeError, match="freeze_mask must be a bool or a tree of bools"):
        ft.selective_transform(ft.sgd(0.1), freeze_mask=lambda p: True)
    with pytest.raises(TypeError, match=r"freeze_mask\['w'\] must be a bool, got str"):
        ft.selective_transform(ft.sgd(0.1), freeze_mask={"w": "yes"})
    with pytest.raises(TypeError):
        ft.selective_transform(ft.sgd(0.1), {"w": True})  # keyword-only, as in optax


def _keys_and_nodes(tree):
    """The tree's paths, with optax's and functrain's MaskedNode both shown as 'MaskedNode'."""
    leaves = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda x: type(x).__name__ == "MaskedNode")[0]
    return [(jax.tree_util.keystr(k), "MaskedNode" if type(v).__name__ == "MaskedNode"
             else np.shape(v)) for k, v in leaves]


def test_prefix_mask_state_has_optax_layout_and_reads_optax_state():
    """A mask switching off a whole subtree with one bool: one MaskedNode for it in the state,
    as optax's masked keeps (conformance: optax's test_masked_state_structure); a state made
    by optax's masked is read by functrain's update, and both continue with optax's numbers."""
    params = {"a": jnp.ones(2), "b": {"c": jnp.ones(3), "d": jnp.ones(4)}}
    mask = {"a": True, "b": False}
    ours = ft.masked(ft.sgd(0.1, momentum=0.9), mask)
    theirs = optax.masked(optax.sgd(0.1, momentum=0.9), mask)
    s_ft, s_ox = ours.init(params), theirs.init(params)
    assert isinstance(s_ft.inner_state[0].trace["b"], MaskedNode)
    assert _keys_and_nodes(s_ft) == _keys_and_nodes(s_ox)
    s_mixed = s_ox  # optax's state, continued by functrain
    for t in range(3):
        g = jax.tree.map(lambda x: jnp.sin(x * (t + 1.0)), params)
        u_ox, s_ox = theirs.update(g, s_ox, params)
        u_ft, s_ft = jax.jit(ours.update)(g, s_ft, params)
        u_mx, s_mixed = ours.update(g, s_mixed, params)
        for u in (u_ft, u_mx):
            for a, b in zip(jax.tree.leaves(u), jax.tree.leaves(u_ox)):
                np.testing.assert_allclose(a, b, rtol=1e-6)
        assert _keys_and_nodes(s_ft) == _keys_and_nodes(s_ox)
        assert _keys_and_nodes(s_mixed) == _keys_and_nodes(s_ox)


def test_full_mask_reads_optax_state():
    """optax's MaskedNode class in a state (a per-leaf mask) is a placeholder here too."""
    p, m = {"a": jnp.ones(2), "b": jnp.ones(3)}, {"a": True, "b": False}
    state = optax.masked(optax.sgd(0.1, momentum=0.9), m).init(p)
    u, _ = ft.masked(ft.sgd(0.1, momentum=0.9), m).update(p, state, p)
    np.testing.assert_allclose(u["a"], -0.1 * p["a"])
    np.testing.assert_array_equal(u["b"], p["b"])


BEYOND_OPTAX = sorted(n for n, r in registry.REGISTRY.items()
                      if not r.reference.startswith("optax."))


@pytest.mark.parametrize("name", BEYOND_OPTAX)
def test_optax_masked_takes_every_optimizer_optax_lacks(name):
    """``optax.masked(opt, mask)`` of every optimizer optax lacks (each with its own init)
    inits and steps, giving functrain.masked's updates; the masked-out matrix passes
    through. (apollo's init read optax's MaskedNode as a leaf: "Cannot determine dtype".)"""
    record = registry.REGISTRY[name]
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.standard_normal((4, 3)), jnp.float32),
              "v": jnp.asarray(rng.standard_normal((5, 4)), jnp.float32),
              "b": jnp.asarray(rng.standard_normal(3), jnp.float32)}
    mask = {"w": True, "v": False, "b": True}
    grads = jax.tree.map(lambda x: jnp.cos(2 * x), params)
    extra = record.update_kwargs(loss_value, params)
    ours, theirs = ft.masked(record.make(ft), mask), optax.masked(record.make(ft), mask)
    u_ft, _ = ours.update(grads, ours.init(params), params, **extra)
    u_ox, _ = theirs.update(grads, theirs.init(params), params, **extra)
    np.testing.assert_array_equal(u_ox["v"], grads["v"])
    for key in ("w", "b"):
        np.testing.assert_allclose(u_ox[key], u_ft[key], rtol=1e-6, atol=1e-9,
                                   err_msg=f"{name} {key}")
