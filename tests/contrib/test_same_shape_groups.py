"""``group_same_shapes`` of soap, shampoo and kron: same-shape leaves run as one stack.

Compared with: the same optimizer with ``group_same_shapes=False`` (the per-leaf program,
which their own test files check against the papers' algorithms in numpy), on one tree,
over 20 steps that include SOAP's first ``eigh`` and six power-step + QR refreshes,
Shampoo's inverse roots (every third step from step 2, in blocks of 3) and Kron's coin
flips (probability 0.5: factor updates with triangular solves on some steps, none on
others, the noise drawn per leaf). The tree holds groups of square matrices, vectors,
3-axis tensors and stacked leaves (``weight_dimension_numbers``), a leaf of a shape of its
own and a scalar, interleaved, so a wrong pairing of stacked members and leaves, or noise
drawn in another order, cannot hide. Only square matrices: a rank-deficient first SOAP
statistic leaves ``eigh``'s null-space basis to rounding (soap.py's docstring).

The two programs compute the same formulas on the same operands, in batches of another
size, so XLA may round single operations differently (an FMA in a vectorized loop, a
reduction's order), ~1 ulp per operation. Tolerances: float64, 1e-10 relative (20 steps
of ~100 operations, each off by at most ~1e-16, through Shampoo's inverse fourth root,
whose condition number here is below 1e3); float32, 100 ulps of each array's largest
entry (measured: SOAP and Kron agree to the bit, Shampoo to 1.5 ulps).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import MuonDimensionNumbers as Dims
from functrain.jax_compat import enable_x64
from helpers import all_equations

STEPS = 20
SHAPES = {"q": (5, 5), "b1": (5,), "k": (5, 5), "t1": (2, 3, 4), "alone": (4, 4),
          "v": (5, 5), "b2": (5,), "t2": (2, 3, 4), "s": (), "st1": (2, 5, 5), "st2": (2, 5, 5)}
DIMS = {k: (Dims(-2, -1) if k.startswith("st") else None) for k in SHAPES}
SCALE_BY = {
    "soap": lambda **kw: functrain.contrib.scale_by_soap(precondition_frequency=3, **kw),
    "shampoo": lambda **kw: functrain.contrib.scale_by_shampoo(
        start_preconditioning_step=2, precondition_frequency=3, block_size=3, **kw),
    "kron": lambda **kw: functrain.contrib.scale_by_kron(
        preconditioner_update_probability=0.5, seed=5, **kw),
}
NAMED = {"soap": functrain.contrib.soap, "shampoo": functrain.contrib.shampoo,
         "kron": functrain.contrib.kron}


def _tree(dtype, seed, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return {k: jnp.asarray(rng.normal(size=s), dtype) for k, s in shapes.items()}


def _run(opt, params, grads):
    """Updates of every step and the final state (the state's first entry)."""
    step = jax.jit(lambda p, s, g: opt.update(g, s, p))
    state, out = opt.init(params), []
    for g in grads:
        u, state = step(params, state, g)
        out.append(u)
    return out, state


def _assert_close(got, want, dtype, where):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, where
    if dtype == "float64":
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13, err_msg=where)
    else:
        scale = float(np.max(np.abs(want))) if want.size else 0.0
        np.testing.assert_allclose(got, want, rtol=0,
                                   atol=100 * np.finfo(np.float32).eps * scale, err_msg=where)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", list(SCALE_BY))
@pytest.mark.long
def test_grouped_equals_per_leaf_over_refreshes(name, dtype):
    with enable_x64(dtype == "float64"):
        params = _tree(jnp.dtype(dtype), seed=1)
        grads = [_tree(jnp.dtype(dtype), seed=10 + t) for t in range(STEPS)]
        grouped, state = _run(SCALE_BY[name](weight_dimension_numbers=DIMS,
                                             group_same_shapes=True), params, grads)
        per_leaf, want_state = _run(SCALE_BY[name](weight_dimension_numbers=DIMS,
                                                   group_same_shapes=False), params, grads)
    moved = set()
    for t, (u, v) in enumerate(zip(grouped, per_leaf)):
        for k in SHAPES:
            _assert_close(u[k], v[k], dtype, f"update of {k} at step {t}")
            if np.any(np.asarray(v[k]) != 0):
                moved.add(k)
    assert moved == set(SHAPES)
    # the same state layout (per leaf), the same numbers
    assert jax.tree_util.tree_structure(state) == jax.tree_util.tree_structure(want_state)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(state),
                            jax.tree_util.tree_leaves(want_state)):
        assert x.dtype == y.dtype, path
        if jnp.issubdtype(x.dtype, jnp.floating):
            _assert_close(x, y, dtype, f"state {jax.tree_util.keystr(path)}")
        else:  # count, Kron's key
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", list(NAMED))
def test_named_optimizer_trajectory_float64(name):
    """The named optimizers pass the argument on: the params of 6 steps (weight decay and
    learning rate applied) of the grouped and the per-leaf program agree."""
    shapes = {"a": (4, 4), "b": (4, 4), "c": (4,), "d": (4,)}
    with enable_x64(True):
        params0 = _tree(jnp.float64, seed=2, shapes=shapes)
        grads = [_tree(jnp.float64, seed=20 + t, shapes=shapes) for t in range(6)]
        ends = []
        for grouped in (True, False):
            opt = NAMED[name](0.1, group_same_shapes=grouped)
            step = jax.jit(lambda p, s, g, opt=opt: (
                functrain.apply_updates(p, opt.update(g, s, p)[0]), opt.update(g, s, p)[1]))
            params, state = params0, opt.init(params0)
            for g in grads:
                params, state = step(params, state, g)
            ends.append(params)
    for k in shapes:
        assert not np.allclose(ends[0][k], params0[k])
        np.testing.assert_allclose(ends[0][k], ends[1][k], rtol=1e-10, atol=1e-13, err_msg=k)


def _program_counts(name, leaves, grouped):
    """(decompositions anywhere, top-level conditionals) in the jaxpr of one update on
    ``leaves`` (4, 4) leaves."""
    params = {f"w{i:02d}": jnp.ones((4, 4)) for i in range(leaves)}
    opt = SCALE_BY[name](group_same_shapes=grouped)
    jaxpr = jax.make_jaxpr(opt.update)(params, opt.init(params), params)
    eqns = all_equations(jaxpr)
    decomps = sum(e.primitive.name in ("eigh", "qr", "householder_product", "geqrf",
                                       "triangular_solve") for e in eqns)
    return decomps, sum(e.primitive.name == "cond" for e in jaxpr.jaxpr.eqns)


@pytest.mark.parametrize("name", list(SCALE_BY))
def test_grouped_program_does_not_grow_with_the_leaves(name):
    """Grouped, 3 and 12 leaves of one shape give as many decompositions and conditionals
    (one stack); per leaf, SOAP's grow with the leaves (its conditional per leaf)."""
    assert _program_counts(name, 3, True) == _program_counts(name, 12, True)
    if name == "soap":
        assert _program_counts(name, 12, False)[1] == 12
        assert _program_counts(name, 12, True)[1] == 1


@pytest.mark.long
def test_groups_split_by_dtype_and_dimension_numbers():
    """Leaves of one shape but another dtype, or other dimension numbers, are other groups:
    a bfloat16 pair and a float32 pair, and a (3, 4, 4) pair stacked over axis 0 next to
    a (3, 4, 4) pair of whole tensors: the same numbers as per leaf (float32, to the bit
    here or 100 ulps), and the bfloat16 updates stay bfloat16."""
    shapes = {"a": (3, 4, 4), "b": (3, 4, 4), "c": (3, 4, 4), "d": (3, 4, 4)}
    dims = {"a": Dims(-2, -1), "b": None, "c": Dims(-2, -1), "d": None}
    params = _tree(jnp.float32, seed=3, shapes=shapes)
    params.update(h1=jnp.ones((4, 4), jnp.bfloat16), h2=jnp.full((4, 4), 2, jnp.bfloat16),
                  f1=jnp.ones((4, 4)), f2=jnp.full((4, 4), 3.0))
    dims.update(h1=None, h2=None, f1=None, f2=None)
    grads = [jax.tree_util.tree_map(lambda x, t=t: (x * (t + 1) + jnp.arange(x.size).reshape(
        x.shape) % 3).astype(x.dtype), params) for t in range(4)]
    for name in SCALE_BY:
        ours, _ = _run(SCALE_BY[name](weight_dimension_numbers=dims, group_same_shapes=True),
                       params, grads)
        theirs, _ = _run(SCALE_BY[name](weight_dimension_numbers=dims,
                                        group_same_shapes=False), params, grads)
        for t, (u, v) in enumerate(zip(ours, theirs)):
            assert u["h1"].dtype == jnp.bfloat16
            for k in params:
                _assert_close(u[k], v[k], "float32", f"{name} step {t} {k}")


def test_mesh_and_grouping_give_the_same_numbers():
    """With a one-device mesh (the tree's decompositions in one conditional, mapped over
    the mesh) grouped and per leaf agree, float64."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
    shapes = {"a": (4, 4), "b": (4, 4), "c": (4, 4), "v": (4,)}
    with enable_x64(True):
        params = _tree(jnp.float64, seed=4, shapes=shapes)
        grads = [_tree(jnp.float64, seed=40 + t, shapes=shapes) for t in range(7)]
        for name in SCALE_BY:
            ours, _ = _run(SCALE_BY[name](mesh=mesh, group_same_shapes=True), params, grads)
            theirs, _ = _run(SCALE_BY[name](mesh=mesh, group_same_shapes=False), params,
                             grads)
            for t, (u, v) in enumerate(zip(ours, theirs)):
                for k in shapes:
                    _assert_close(u[k], v[k], "float64", f"{name} step {t} {k}")


@pytest.mark.parametrize("name", list(NAMED))
def test_group_same_shapes_must_be_a_bool(name):
    with pytest.raises(TypeError, match="group_same_shapes must be a bool, got str"):
        SCALE_BY[name](group_same_shapes="yes")
