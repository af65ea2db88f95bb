"""functrain.contrib.galore / scale_by_galore against optax.contrib 0.2.8.

Both sides take the projector from ``jnp.linalg.svd`` of the same float32 gradient,
so the singular vectors (each fixed by an SVD only up to its sign) are the same
ones and the trajectories can be compared as they are, step by step (30 jitted
steps, projectors refreshed several times). Independently of optax: the projector
has orthonormal columns spanning the gradient's leading singular vectors, the
base optimizer's state has the low-rank shapes, and with an identity base the
update is the gradient's best rank-r approximation (which is sign-invariant).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib  # noqa: F401
import pytest

import functrain
from functrain.contrib import GaLoreDimensionNumbers as OursDims
from helpers import assert_same_trajectory, make_grads, make_params

STEPS = 30


def _dims(lib):
    d = lib.contrib.GaLoreDimensionNumbers
    return {"dense": {"w": d(reduction_axis=1, output_axis=0), "b": None},
            "layers": [None, d(reduction_axis=(0, 1), output_axis=2)], "scalar": None}


SETTINGS = {
    "rank=2, gap=5": lambda lib: lib.contrib.galore(1e-2, rank=2, update_proj_gap=5),
    "rank=1, gap=7, scale, wd mask": lambda lib: lib.contrib.galore(
        1e-2, rank=1, update_proj_gap=7, scale=0.25, weight_decay=1e-2,
        mask=lambda p: jax.tree_util.tree_map(lambda x: x.ndim > 1, p)),
    "tree of dimension numbers, lion base": lambda lib: lib.contrib.galore(
        1e-3, rank=2, update_proj_gap=4, base_optimizer=lib.scale_by_lion(),
        weight_dimension_numbers=_dims(lib)),
    "callable dimension numbers": lambda lib: lib.contrib.galore(
        1e-2, rank=1, update_proj_gap=3,
        weight_dimension_numbers=lambda p: _dims(lib)),
    "scale_by_galore, schedule lr base": lambda lib: lib.chain(
        lib.contrib.scale_by_galore(rank=2, update_proj_gap=10,
                                    base_optimizer=lib.sgd(lambda c: 0.1 / (1 + c))),
        lib.scale(0.1)),
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_matches_optax_contrib_step_by_step(name):
    assert_same_trajectory(SETTINGS[name](functrain), SETTINGS[name](optax), steps=STEPS,
                           name=name)


@pytest.mark.parametrize("how", ["tree", "function", "one"])
def test_optax_dimension_numbers_are_taken_as_ours(how):
    # optax.contrib.GaLoreDimensionNumbers, as code migrating from optax passes them.
    one = optax.contrib.GaLoreDimensionNumbers(1, 0)
    spec = {"tree": _dims(optax), "function": lambda p: _dims(optax), "one": one}[how]
    make = lambda lib, dims: lib.contrib.galore(  # noqa: E731
        1e-2, rank=2, update_proj_gap=4, weight_dimension_numbers=dims)
    params = None
    theirs = make(optax, _dims(optax))
    if how == "one":  # one value for every leaf (optax wants a tree): matrices only
        params = {"a": jnp.ones((4, 3)), "b": jnp.arange(10.0).reshape(5, 2)}
        theirs = make(optax, {"a": one, "b": one})
    assert_same_trajectory(make(functrain, spec), theirs, params=params, steps=STEPS, name=how)


def test_state_layout_matches_optax_and_is_low_rank():
    params = make_params()
    ours = functrain.contrib.scale_by_galore(rank=2).init(params)
    theirs = optax.contrib.scale_by_galore(rank=2).init(params)
    assert type(ours).__name__ == "GaLoreState" and ours._fields == theirs._fields
    shape = lambda t: jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), t)  # noqa: E731
    assert shape(ours.projector) == shape(theirs.projector)
    assert shape(ours.base_optimizer_state.mu) == shape(theirs.base_optimizer_state.mu)
    # (4, 3) matrix, m >= n: P is 4 x 2 and Adam's moments are 2 x 3.
    assert ours.projector["dense"]["w"].shape == (4, 2)
    assert ours.base_optimizer_state.mu["dense"]["w"].shape == (2, 3)
    assert ours.projector["dense"]["b"].shape == (0, 0)


def test_identity_base_gives_the_best_rank_r_approximation():
    rng = np.random.default_rng(0)
    g = {"tall": jnp.asarray(rng.standard_normal((6, 4)), jnp.float32),
         "wide": jnp.asarray(rng.standard_normal((3, 5)), jnp.float32)}
    tx = functrain.contrib.scale_by_galore(rank=2, base_optimizer=functrain.identity())
    u, state = tx.update(g, tx.init(g))
    for key, x in g.items():
        a, s, bt = np.linalg.svd(np.asarray(x, np.float64), full_matrices=False)
        best = (a[:, :2] * s[:2]) @ bt[:2]
        np.testing.assert_allclose(np.asarray(u[key]), best, rtol=1e-4, atol=1e-5)
        p = np.asarray(state.projector[key], np.float64)
        np.testing.assert_allclose(p.T @ p, np.eye(2), atol=1e-5)
    # Between refreshes the projector is kept: a new gradient is projected on the old P.
    g2 = jax.tree_util.tree_map(lambda x: x[::-1], g)
    u2, state2 = tx.update(g2, state)
    np.testing.assert_array_equal(state2.projector["tall"], state.projector["tall"])
    p = np.asarray(state.projector["tall"], np.float64)
    np.testing.assert_allclose(np.asarray(u2["tall"]), p @ p.T @ np.asarray(g2["tall"]),
                               rtol=1e-4, atol=1e-5)


def test_complex_unprojected_leaves_match_optax():
    rng = np.random.default_rng(1)
    params = {"w": jnp.asarray(rng.standard_normal((4, 3)), jnp.float32),
              "z": jnp.asarray(rng.standard_normal(3) + 1j * rng.standard_normal(3),
                               jnp.complex64)}
    grads = make_grads(params, STEPS)
    grads["z"] = jnp.asarray(rng.standard_normal((STEPS, 3)) + 1j, jnp.complex64)
    assert_same_trajectory(functrain.contrib.galore(1e-2, rank=2, update_proj_gap=5),
                           optax.contrib.galore(1e-2, rank=2, update_proj_gap=5),
                           params=params, grads=grads, name="galore complex")


def test_state_from_shapes_alone():
    params = make_params()
    tx = functrain.contrib.galore(1e-2, rank=2, weight_dimension_numbers=_dims(functrain))
    abstract = jax.tree_util.tree_map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
    got = jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), jax.eval_shape(tx.init, abstract))
    want = jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), tx.init(params))
    assert got == want


def test_empty_params():
    tx = functrain.contrib.galore(1e-2)
    state = tx.init({})
    assert jax.jit(lambda s: tx.update({}, s, {}))(state)[0] == {}


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(rank=0), ValueError, "rank must be positive"),
    (dict(rank=2.0), TypeError, "rank must be an int"),
    (dict(update_proj_gap=0), ValueError, "update_proj_gap must be >= 1"),
    (dict(learning_rate="x"), TypeError, "galore: learning_rate must be a real number"),
])
def test_bad_hyperparameters_are_named(kwargs, error, message):
    kwargs = {"learning_rate": 1e-2, **kwargs}
    with pytest.raises(error, match=message):
        functrain.contrib.galore(**kwargs)


@pytest.mark.parametrize("dims, message", [
    ({"v": OursDims(), "m": None}, r"leaf \['v'\] has shape \(3,\)"),
    ({"v": None, "m": OursDims(0, 0)}, r"leaf \['m'\]: reduction axes \(0,\) and output"),
    ({"v": None, "m": OursDims(0, 1)}, r"leaf \['m'\]: every axis"),
    ({"v": None}, "does not fit the params"),
    ({"v": None, "m": (0, 1)}, r"at leaf \['m'\] must be a GaLoreDimensionNumbers"),
])
def test_bad_dimension_numbers_name_the_leaf(dims, message):
    params = {"v": jnp.ones(3), "m": jnp.ones((2, 3, 4))}
    with pytest.raises((ValueError, TypeError), match=message):
        functrain.contrib.scale_by_galore(weight_dimension_numbers=dims).init(params)


def test_complex_projected_leaf_and_wrong_state_are_named():
    params = {"m": jnp.ones((3, 2), jnp.complex64)}
    tx = functrain.contrib.scale_by_galore(rank=1)
    with pytest.raises(TypeError, match=r"leaf \['m'\] is complex"):
        tx.update(params, tx.init(params))
    state = tx.init({"m": jnp.ones((3, 2))})
    with pytest.raises(ValueError, match=r"leaf \['m'\] needs a projector of shape \(4, 1\)"):
        tx.update({"m": jnp.ones((4, 2))}, state)
    with pytest.raises(TypeError, match="expected its state as GaLoreState"):
        tx.update({"m": jnp.ones((3, 2))}, state._asdict())
