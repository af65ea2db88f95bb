"""functrain.tree.checks: key paths, structure and shape checks, masks, MaskedNode.

functrain.tree re-exports these; the tests call them where they are defined.
"""

import jax
import jax.numpy as jnp
import pytest

from functrain import tree
from functrain.tree import checks as ft


def test_tree_re_exports_the_checks():
    for name in ("MaskedNode", "is_placeholder", "key_paths", "check_structure", "check_shapes",
                 "flatten_with_paths", "flatten_like", "resolve_mask", "resolve_leaf_mask"):
        assert getattr(tree, name) is getattr(ft, name), name


def test_check_structure_reports_type_differences():
    with pytest.raises(ValueError, match="list.*tuple|tuple.*list|container types"):
        ft.check_structure([1, 2], (1, 2), "b", "a")


def test_check_structure_and_shapes_name_the_paths():
    ref = {"enc": {"w": jnp.ones(2), "b": jnp.ones(3)}}
    ft.check_structure(ref, {"enc": {"w": 0, "b": 0}}, "grads", "params")
    with pytest.raises(ValueError, match=r"\['enc'\]\['b'\]"):
        ft.check_structure(ref, {"enc": {"w": 0}}, "grads", "params")
    paths, leaves, _ = ft.flatten_with_paths(ref)
    assert paths == ["['enc']['b']", "['enc']['w']"]
    with pytest.raises(ValueError, match=r"grads leaf \['enc'\]\['w'\] has shape \(5,\) "
                                         r"but params has shape \(2,\)"):
        ft.check_shapes(paths, leaves, [jnp.ones(3), jnp.ones(5)], "grads", "params")


def test_resolve_mask_prefix_function_and_errors():
    params = {"enc": {"w": 1.0, "b": 2.0}, "dec": 3.0}
    assert ft.resolve_mask({"enc": False, "dec": True}, params, "m") == [True, False, False]
    assert ft.resolve_mask(lambda p: {"enc": {"w": True, "b": False}, "dec": False},
                           params, "m") == [False, False, True]
    assert ft.resolve_mask(True, params, "m") == [True] * 3
    with pytest.raises(ValueError, match="mask of m"):
        ft.resolve_mask({"other": True}, params, "m")
    with pytest.raises(TypeError, match="Python bools"):
        ft.resolve_mask({"enc": jnp.ones(2, bool), "dec": True}, params, "m")


def test_masked_node_holds_no_leaves():
    assert jax.tree_util.tree_leaves({"a": ft.MaskedNode()}) == []


def test_placeholders_and_key_paths():
    assert ft.is_placeholder(ft.MaskedNode()) and ft.is_placeholder(None)
    assert not ft.is_placeholder(0.0) and not ft.is_placeholder(())
    assert ft.key_paths({"decoder": {"w": 1, "b": ft.MaskedNode()}, "x": [None]}) == [
        "['decoder']['b']", "['decoder']['w']", "['x'][0]"]
