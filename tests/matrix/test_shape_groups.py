"""functrain.matrix.shape_groups and dimension_numbers.stacked_view, against hand-made
groupings and numpy slicing (the optimizers' use: tests/contrib/test_same_shape_groups.py)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from functrain.contrib import MuonDimensionNumbers as Dims
from functrain.matrix.dimension_numbers import from_layers, layer_view, stacked_view, to_layers
from functrain.matrix.shape_groups import (group_key, leaf_order, shape_groups, stack_units,
                                           unstack_units)


def test_groups_keep_leaf_order_and_leave_none_alone():
    g = shape_groups(["a", None, "b", "a", None, "b", "c"])
    assert g.units == ((0, 3), (1,), (2, 5), (4,), (6,))
    assert g.leaves == 7


def test_keys_tell_shapes_dtypes_and_static_apart():
    x = jnp.ones((2, 3))
    assert group_key(x, (jnp.ones(2),)) == group_key(2 * x, (jnp.zeros(2),))
    assert group_key(x) != group_key(x.astype(jnp.bfloat16))
    assert group_key(x) != group_key(jnp.ones((3, 2)))
    assert group_key(x, (jnp.ones(2),)) != group_key(x, (jnp.ones(3),))
    assert group_key(x, static="a") != group_key(x, static="b")
    assert group_key(jnp.ones(())) is None and group_key(jnp.ones((0, 3))) is None


def test_stack_then_unstack_gives_each_leaf_back():
    rng = np.random.default_rng(0)
    leaves = [jnp.asarray(rng.normal(size=s)) for s in [(2, 2), (3,), (2, 2), (2, 2)]]
    g = shape_groups([x.shape for x in leaves])
    units = stack_units(g, leaves)
    np.testing.assert_array_equal(units[0], np.stack([leaves[0], leaves[2], leaves[3]]))
    assert units[1] is leaves[1]
    back = unstack_units(g, units, leaves)
    for a, b in zip(back, leaves):
        np.testing.assert_array_equal(a, b)


def test_placeholders_the_stacked_layout_keeps_are_not_stacked():
    state = [(jnp.full((2, 2), float(i)), jnp.zeros((1, 1))) for i in range(3)]
    g = shape_groups([0, 0, 0])
    [unit] = stack_units(g, state, want=[[(3, 2, 2), (1, 1)]])
    assert unit[0].shape == (3, 2, 2) and unit[1].shape == (1, 1)
    back = unstack_units(g, [unit], state)
    assert [float(b[0][0, 0]) for b in back] == [0.0, 1.0, 2.0]
    assert all(b[1].shape == (1, 1) for b in back)
    with pytest.raises(ValueError, match=r"entry 1 of shape \(1, 1\) can be neither stacked"):
        stack_units(g, state, want=[[(3, 2, 2), (2, 1, 1)]])


def test_none_values_stay_none():
    assert stack_units(shape_groups([0, 0]), [None, None]) == [None]


def test_leaf_order_of_entries():
    # leaves 0 and 2 grouped (2 entries each: 4 in the unit), leaf 1 alone with 3
    assert leaf_order(shape_groups([1, None, 1]), [4, 3]) == [0, 1, 5, 6, 2, 3, 4]
    # three leaves of one entry, grouped as (0, 2) and (1,)
    assert leaf_order(shape_groups(["x", "y", "x"]), [2, 1]) == [0, 2, 1]
    with pytest.raises(ValueError, match="not a multiple"):
        leaf_order(shape_groups([1, 1]), [3])


def test_stacked_view_cuts_like_numpy():
    """Two (4, 3, 5) leaves with Dims(0, 2) (axis 1 their layers), stacked: the stack's
    layers are leaf 0's three, then leaf 1's, each ``x[:, j, :]``."""
    rng = np.random.default_rng(1)
    xs = [rng.normal(size=(4, 3, 5)).astype(np.float32) for _ in range(2)]
    view = stacked_view(layer_view(Dims(0, 2), (4, 3, 5), "x", "test"), (4, 3, 5), 2)
    assert view.layers == (2, 3) and view.layer_shape == (4, 5)
    stack = jnp.asarray(np.stack(xs))
    layers = to_layers(stack, view)
    for i in range(2):
        for j in range(3):
            np.testing.assert_array_equal(layers[3 * i + j], xs[i][:, j, :])
    np.testing.assert_array_equal(from_layers(layers, view), stack)
    whole = stacked_view(None, (2, 3, 4), 3, whole=(6, 4))
    x = jnp.arange(72.).reshape(3, 2, 3, 4)
    np.testing.assert_array_equal(to_layers(x, whole)[1], np.asarray(x[1]).reshape(6, 4))
    assert stacked_view(None, (2, 3), 1) is None
