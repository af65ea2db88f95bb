"""functrain.contrib.muon / scale_by_muon against optax.contrib 0.2.8, a numpy Newton-Schulz,
and the per-matrix rules (stacked layers, conv kernels) beyond optax.

Every trajectory test runs jitted steps on a tree of matrices, a vector, a scalar and a
zero leaf and compares every step with optax.contrib (tests/helpers.py).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib  # noqa: F401  (the reference)
import pytest

import functrain
from functrain.contrib import MuonDimensionNumbers, MuonState, muon, scale_by_muon
from functrain.jax_compat import enable_x64
from helpers import all_equations
from helpers import assert_same_trajectory, make_grads, widen

STEPS = 30


def _tree(complex_: bool = False) -> dict:
    rng = np.random.default_rng(0)

    def draw(*shape):
        x = rng.standard_normal(shape)
        if complex_:
            return jnp.asarray(x + 1j * rng.standard_normal(shape), jnp.complex64)
        return jnp.asarray(x, jnp.float32)

    return {"w": draw(4, 3), "u": draw(3, 5), "v": draw(5), "s": draw(),
            "z": jnp.zeros((2, 2), jnp.complex64 if complex_ else jnp.float32)}


def _compare(ours, theirs, params=None, name="", **kw):
    # In float64: Newton-Schulz amplifies rounding, and float32 trajectories of two correct
    # programs drift apart over 30 steps by more than float32 parity's tolerance.
    params = _tree() if params is None else params
    assert_same_trajectory(ours, theirs, params=params, grads=make_grads(params, STEPS),
                           name=name, float64=True, **kw)


def _matrices_only(p):
    return jax.tree_util.tree_map(lambda x: x.ndim == 2, p)


# --------------------------------------------------------------------------
# Against optax.contrib
# --------------------------------------------------------------------------

def _schedule(count):
    return 1e-2 * jnp.minimum(1.0, (count + 1) / 10)


MUON_SETTINGS = {
    "nesterov=False, adaptive": lambda lib: lib.contrib.muon(
        1e-2, nesterov=False, adaptive=True, beta=0.9),
    "spectral, eps, schedule": lambda lib: lib.contrib.muon(_schedule, preconditioning="spectral",
                                                            eps=1e-6),
    "schatten, ns_steps=3": lambda lib: lib.contrib.muon(3e-3, preconditioning="schatten",
                                                         ns_steps=3),
    "weight decay, masks, adam settings": lambda lib: lib.contrib.muon(
        1e-2, weight_decay=0.1, weight_decay_mask={"w": True, "u": False, "v": True,
                                                   "s": True, "z": True},
        adam_b1=0.8, adam_b2=0.99, adam_eps_root=1e-8, adam_weight_decay=0.05,
        adam_learning_rate=_schedule),
    "per-step coefficients": lambda lib: lib.contrib.muon(
        1e-2, ns_coeffs=((3.0, -3.2, 1.2), (3.4445, -4.7750, 2.0315), (2.0, -1.5, 0.5)),
        ns_steps=4, consistent_rms=0.2),
}


@pytest.mark.parametrize("setting", sorted(MUON_SETTINGS))
def test_muon_matches_optax(setting):
    make = MUON_SETTINGS[setting]
    _compare(make(functrain), make(optax), name=setting)


def _dims_tree(lib):
    d = lib.MuonDimensionNumbers
    return {"conv": d((0, 1, 2), 3), "stack": d(1, 2), "w": d(), "b": None, "s": None}


def _dims_params():
    rng = np.random.default_rng(1)
    shapes = {"conv": (3, 3, 2, 4), "stack": (2, 4, 3), "w": (5, 3), "b": (3,), "s": ()}
    return {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in shapes.items()}


def test_muon_dimension_numbers_match_optax():
    # A conv kernel, a stacked leaf whose batch axis is the last one, a matrix, and leaves
    # left to AdamW (None), as a tree (a function: see the next test).
    _compare(muon(1e-2, muon_weight_dimension_numbers=_dims_tree(functrain.contrib),
                  consistent_rms=0.2, weight_decay=0.01),
             optax.contrib.muon(1e-2, muon_weight_dimension_numbers=_dims_tree(optax.contrib),
                                consistent_rms=0.2, weight_decay=0.01),
             params=_dims_params(), name="dimension numbers tree")


def test_scale_by_muon_matches_optax_with_dimension_numbers_function():
    params = {k: v for k, v in _dims_params().items() if v.ndim >= 2}
    ours, theirs = ({k: v for k, v in _dims_tree(lib).items() if v is not None}
                    for lib in (functrain.contrib, optax.contrib))
    _compare(functrain.chain(scale_by_muon(weight_dimension_numbers=lambda t: ours, beta=0.9),
                             functrain.scale(-1e-2)),
             optax.chain(optax.contrib.scale_by_muon(weight_dimension_numbers=lambda t: theirs,
                                                     beta=0.9), optax.scale(-1e-2)),
             params=params, name="scale_by_muon, function")


def test_optax_dimension_numbers_are_taken_as_ours():
    # Code migrating from optax may pass optax.contrib.MuonDimensionNumbers (a tree, one
    # value, a function): the same numbers as optax, not a foreign tree.
    params = _dims_params()
    for spec in (_dims_tree(optax.contrib), lambda p: _dims_tree(optax.contrib)):
        _compare(muon(1e-2, muon_weight_dimension_numbers=spec),
                 optax.contrib.muon(1e-2, muon_weight_dimension_numbers=_dims_tree(optax.contrib)),
                 params=params, name="optax's dimension numbers")
    one = {"w": params["w"], "u": params["stack"][0]}
    dims = optax.contrib.MuonDimensionNumbers(1, 0)  # one value for every leaf (optax: a tree)
    _compare(functrain.chain(scale_by_muon(weight_dimension_numbers=dims), functrain.scale(-0.1)),
             optax.chain(optax.contrib.scale_by_muon(weight_dimension_numbers={"w": dims,
                                                                               "u": dims}),
                         optax.scale(-0.1)), params=one, name="one optax MuonDimensionNumbers")


def test_only_matrices_or_no_matrices_match_optax():
    # Either group of optax's partition may be empty.
    full = _tree()
    for keep in (("w", "u"), ("v", "s")):
        params = {k: full[k] for k in keep}
        _compare(muon(1e-2), optax.contrib.muon(1e-2), params=params, name=str(keep))


@pytest.mark.parametrize("kwargs", [{}, {"adaptive": True, "preconditioning": "aol"}])
def test_complex_params_match_optax(kwargs):
    _compare(muon(1e-2, **kwargs), optax.contrib.muon(1e-2, **kwargs), params=_tree(True),
             name=str(kwargs))


@pytest.mark.parametrize("mu_dtype", [None, jnp.bfloat16])
def test_state_layout_matches_optax(mu_dtype):
    # (bfloat16 moments: functrain computes them in float32, so only the layout is optax's.)
    params = _tree()
    ours = muon(1e-2, mu_dtype=mu_dtype).init(params)
    theirs = optax.contrib.muon(1e-2, mu_dtype=mu_dtype).init(params)

    def text(state):
        s = str(jax.tree_util.tree_structure(state))
        return re.sub(r"CustomNode\((namedtuple\[)?MaskedNode(\[None\])?\]?", "MASKED", s)

    assert text(ours) == text(theirs)
    assert isinstance(ours.inner_states["muon"].inner_state[0], MuonState)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        assert a.shape == b.shape and a.dtype == b.dtype


# --------------------------------------------------------------------------
# Hand-derived: the first step in numpy (float64)
# --------------------------------------------------------------------------

def _numpy_newton_schulz(x, coeffs, steps, eps):
    x = np.asarray(x, np.float64)
    transposed = x.shape[0] > x.shape[1]
    x = x.T if transposed else x
    x = x / (np.linalg.norm(x) + eps)
    a_, b_, c_ = coeffs
    for _ in range(steps):
        a = x @ x.T
        x = a_ * x + (b_ * a + c_ * a @ a) @ x
    return x.T if transposed else x


def test_linalg_newton_schulz_is_the_numpy_iteration_per_matrix():
    """functrain.linalg.newton_schulz on a stack: each matrix as the numpy loop, float64."""
    from functrain import linalg
    x = np.random.default_rng(5).standard_normal((3, 4, 7))
    coeffs = (3.4445, -4.7750, 2.0315)
    with enable_x64(True):
        got = np.asarray(linalg.newton_schulz(jnp.asarray(x), jnp.asarray(coeffs), 5))
    for k in range(3):
        np.testing.assert_allclose(got[k], _numpy_newton_schulz(x[k], coeffs, 5, 1e-8),
                                   rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="preconditioning must be one of"):
        linalg.newton_schulz(jnp.asarray(x), jnp.asarray(coeffs), 5, "nope")


@pytest.mark.parametrize("nesterov", [True, False])
def test_first_step_is_newton_schulz_of_the_gradient(nesterov):
    g = np.random.default_rng(2).standard_normal((6, 4))
    beta, lr = 0.9, 0.1
    opt = muon(lr, beta=beta, nesterov=nesterov)
    p = {"w": jnp.zeros((6, 4))}
    u, _ = opt.update({"w": jnp.asarray(g, jnp.float32)}, opt.init(p), p)
    # mu = (1-beta) g; Nesterov's m = beta mu / (1-beta^2) + (1-beta) g / (1-beta) = g (1 +
    # beta / (1+beta)), else m = mu / (1-beta) = g. fan_out/fan_in = 4/6 < 1: scale 1.
    m = g * (1 + beta / (1 + beta)) if nesterov else g
    want = -lr * _numpy_newton_schulz(m, (3.4445, -4.7750, 2.0315), 5, 1e-8)
    np.testing.assert_allclose(np.asarray(u["w"]), want, rtol=2e-4, atol=2e-6)
    singular = np.linalg.svd(want / lr, compute_uv=False)
    assert np.all((singular > 0.6) & (singular < 1.25)), singular  # roughly orthogonal


# --------------------------------------------------------------------------
# Beyond optax: Polar Express coefficients, Gram Newton-Schulz
# --------------------------------------------------------------------------

def test_polar_express_first_step_is_the_numpy_iteration():
    """ns_coeffs='polar_express': M / (1.02 ||M||_F + eps), then one row per step (rows
    checked against the paper's construction in tests/test_newton_schulz.py)."""
    from functrain import linalg
    g = np.random.default_rng(3).standard_normal((6, 4))  # tall: the iteration runs on M^T
    beta, lr = 0.9, 0.1
    rows, _ = linalg.newton_schulz_coefficients("polar_express", 7)
    with enable_x64(True):
        opt = muon(lr, ns_coeffs="polar_express", ns_steps=7, beta=beta)
        p = {"w": jnp.zeros((6, 4))}
        state = opt.init(p)
        u, _ = opt.update({"w": jnp.asarray(g)}, state, p)
    np.testing.assert_array_equal(state.inner_states["muon"].inner_state[0].ns_coeffs, rows)
    x = (g * (1 + beta / (1 + beta))).T  # Nesterov's first m (see the test above)
    x = x / (1.02 * np.linalg.norm(x) + 1e-8)
    for a, b, c in rows:
        x = a * x + (b * x @ x.T + c * (x @ x.T) @ (x @ x.T)) @ x
    np.testing.assert_allclose(np.asarray(u["w"]), -lr * x.T, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("ns_coeffs", ["standard", "polar_express"])
def test_gram_newton_schulz_gives_the_standard_trajectory(ns_coeffs):
    """ns_method='gram' on wide, tall, stacked and conv leaves: the same 30 steps (float64)."""
    params = _dims_params()
    dims = _dims_tree(functrain.contrib)
    _compare(muon(1e-2, ns_coeffs, muon_weight_dimension_numbers=dims, ns_method="gram"),
             muon(1e-2, ns_coeffs, muon_weight_dimension_numbers=dims), params=params,
             apply_theirs=functrain.apply_updates)


def test_static_ns_steps_under_inject_hyperparams_for_polar_express():
    opt = functrain.inject_hyperparams(muon, static_args=("ns_steps",))(
        1e-2, ns_coeffs="polar_express", ns_method="gram")
    params = _tree()
    _compare(opt, muon(1e-2, ns_coeffs="polar_express"), params=params,
             apply_theirs=functrain.apply_updates)


# --------------------------------------------------------------------------
# Beyond optax: stacked layers and conv kernels, per matrix
# --------------------------------------------------------------------------

def _updates(tx, params, grads_list):
    state, out = tx.init(params), []
    step = jax.jit(tx.update)
    for g in grads_list:
        u, state = step(g, state, params)
        out.append(u)
    return out


@pytest.mark.parametrize("adaptive", [False, True])
def test_stacked_leaf_equals_separate_layers(adaptive):
    rng = np.random.default_rng(3)
    stacked = [jnp.asarray(rng.standard_normal((3, 5, 4)), jnp.float32) for _ in range(4)]
    params = {"stack": jnp.ones((3, 5, 4))}
    separate = {f"layer{i}": jnp.ones((5, 4)) for i in range(3)}
    split = [{f"layer{i}": g[i] for i in range(3)} for g in stacked]
    cases = [  # scale_by_muon's default: the last two axes, leading axes are layers
        (scale_by_muon(adaptive=adaptive), scale_by_muon(adaptive=adaptive)),
        # muon with a leading layer axis, shape scaling and weight decay included
        (muon(0.1, adaptive=adaptive, weight_decay=0.1, consistent_rms=0.2,
              muon_weight_dimension_numbers=MuonDimensionNumbers(-2, -1)),
         muon(0.1, adaptive=adaptive, weight_decay=0.1, consistent_rms=0.2))]
    for tx_stacked, tx_separate in cases:
        got = _updates(tx_stacked, params, [{"stack": g} for g in stacked])
        want = _updates(tx_separate, separate, split)
        for a, b in zip(got, want):  # a batched matmul rounds apart from 3 single ones
            for i in range(3):
                scale = float(np.max(np.abs(b[f"layer{i}"])))
                np.testing.assert_allclose(a["stack"][i], b[f"layer{i}"], rtol=1e-5,
                                           atol=1e-6 * scale)


@pytest.mark.parametrize("dims, perm", [
    (MuonDimensionNumbers((0, 1, 2), 3), (0, 1, 2, 3)),      # (kh, kw, cin) x cout
    (MuonDimensionNumbers((3, 0), (2,)), (1, 3, 0, 2)),       # batch kw, (cout, kh) x cin
])
@enable_x64()  # float64: two programs that sum in another order, compared to 1e-9
def test_conv_kernel_equals_its_reshaped_matrix(dims, perm):
    rng = np.random.default_rng(4)
    shape = (3, 2, 4, 5)
    grads = [jnp.asarray(rng.standard_normal(shape), jnp.float64) for _ in range(3)]
    kernel = {"k": jnp.zeros(shape, jnp.float64)}
    batch = [a for a in range(4) if a not in (3, 0, 2)] if perm[0] == 1 else []

    def as_matrix(x):  # batch axes, then reduction axes, then output axes
        x = jnp.transpose(x, perm)
        return x.reshape((x.shape[0], -1, x.shape[-1])) if batch else x.reshape(-1, shape[3])

    for adaptive in (False, True):
        got = _updates(scale_by_muon(adaptive=adaptive, weight_dimension_numbers=dims),
                       kernel, [{"k": g} for g in grads])
        want = _updates(scale_by_muon(adaptive=adaptive), {"k": as_matrix(kernel["k"])},
                        [{"k": as_matrix(g)} for g in grads])
        for a, b in zip(got, want):
            np.testing.assert_allclose(as_matrix(a["k"]), b["k"], rtol=1e-9, atol=1e-11)


def test_newton_schulz_memory_does_not_grow_with_ns_steps():
    x = jax.ShapeDtypeStruct((512, 512), jnp.float32)

    def temp_bytes(ns_steps):
        tx = scale_by_muon(ns_steps=ns_steps)
        step = jax.jit(lambda g, s: tx.update({"w": g}, s))
        compiled = step.lower(x, jax.eval_shape(tx.init, {"w": x})).compile()
        return compiled.memory_analysis().temp_size_in_bytes, compiled.as_text()

    (five, hlo), (twenty, _) = temp_bytes(5), temp_bytes(20)
    assert twenty <= five * 1.05 + 4096, (five, twenty)
    assert "while" in hlo  # a loop, not 5 unrolled copies


# --------------------------------------------------------------------------
# inject_hyperparams, eval_shape
# --------------------------------------------------------------------------

@enable_x64()  # float64: traced and constant hyperparameters fold differently (1e-9)
def test_inject_hyperparams():
    params = widen(_tree())
    grads = widen(make_grads(_tree(), 5))
    plain = _updates(muon(1e-2, adaptive=True), params, [jax.tree_util.tree_map(
        lambda g, t=t: g[t], grads) for t in range(5)])
    # Static hyperparameters: the same arithmetic, except that the plain muon skips its zero
    # weight decay (a number 0, as optax) while the injected one adds it (an array); the two
    # programs differ by that stage, and XLA may sum the Newton-Schulz matmuls in another
    # order: float64 rounding (2.8e-17 absolute measured), far below 1e-12.
    for static, rtol in ((("beta", "eps", "adam_b1", "adam_b2"), 1e-12), ((), 1e-9)):
        # ns_steps injected too: the Newton-Schulz loop takes a traced step count.
        opt = functrain.inject_hyperparams(muon, static_args=static)(1e-2, adaptive=True)
        got = _updates(opt, params, [jax.tree_util.tree_map(lambda g, t=t: g[t], grads)
                                     for t in range(5)])
        for a, b in zip(got, plain):
            for k in params:
                np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=1e-11)


def test_state_from_shapes_alone():
    params = _dims_params()
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    for opt in (muon(1e-2), muon(1e-2, muon_weight_dimension_numbers=_dims_tree(
            functrain.contrib)), scale_by_muon(weight_dimension_numbers=lambda t: jax.tree_util
                                               .tree_map(lambda _: MuonDimensionNumbers(-2, -1),
                                                         t))):
        shapes = jax.eval_shape(opt.init, abstract)
        real = opt.init(params)
        assert jax.tree_util.tree_structure(shapes) == jax.tree_util.tree_structure(real)
        for a, b in zip(jax.tree_util.tree_leaves(shapes), jax.tree_util.tree_leaves(real)):
            assert (a.shape, a.dtype) == (b.shape, b.dtype)


# --------------------------------------------------------------------------
# Errors name the argument or the leaf
# --------------------------------------------------------------------------

@pytest.mark.parametrize("make, error, match", [
    (lambda: muon(0.1, ns_coeffs="polar"), ValueError, r"preset 'polar' is unknown.*dion"),
    (lambda: muon(0.1, ns_coeffs="polar"), ValueError, r"preset 'polar' is unknown.*polar_express"),
    (lambda: muon(0.1, ns_method="fast"), ValueError,
     r"muon: ns_method must be one of \['standard', 'gram'\], got 'fast'"),
    (lambda: scale_by_muon(ns_method=None), ValueError, r"scale_by_muon: ns_method must be one of"),
    (lambda: muon(0.1, ns_coeffs=(1.0, 2.0)), ValueError, r"ns_coeffs must have shape \(3,\)"),
    (lambda: muon(0.1, ns_coeffs="dion", ns_steps=3), ValueError, r"5 rows .* ns_steps is 3"),
    (lambda: muon(0.1, ns_steps=-1), ValueError, r"muon: ns_steps must be >= 0"),
    (lambda: scale_by_muon(ns_steps=2.5), TypeError, r"scale_by_muon: ns_steps must be an int"),
    # optax's fori_loop fails on a float ns_steps at the first update: refused here at build
    (lambda: muon(0.1, ns_steps=5.0), TypeError, r"muon: ns_steps must be an int .* float 5.0"),
    (lambda: muon(0.1, preconditioning="svd"), ValueError, r"preconditioning must be one of"),
    (lambda: muon(0.1, beta=1.5), ValueError, r"muon: beta must be in \[0.0, 1.0\)"),
    (lambda: muon(0.1, adam_b2=-0.1), ValueError, r"adam_b2 must be in"),
    (lambda: muon(float("nan")), ValueError, r"learning_rate must be finite"),
    (lambda: scale_by_muon(weight_dimension_numbers=MuonDimensionNumbers(0.5, 1)), TypeError,
     r"ints or sequences of ints"),
])
def test_bad_hyperparameters_are_named(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_bad_leaves_are_named_before_any_math():
    params = {"dense": {"w": jnp.ones((4, 3)), "b": jnp.ones(3)}}
    tx = scale_by_muon()
    with pytest.raises(ValueError, match=r"leaf \['dense'\]\['b'\] has shape \(3,\).*rank >= 2"):
        tx.update(params, tx.init(params))
    tx = scale_by_muon(weight_dimension_numbers=MuonDimensionNumbers(0, 2))
    with pytest.raises(ValueError, match=r"names axis 2, but leaf \['w'\] has shape \(4, 3\)"):
        tx.update({"w": jnp.ones((4, 3))}, tx.init({"w": jnp.ones((4, 3))}))
    tx = scale_by_muon(weight_dimension_numbers=MuonDimensionNumbers((0, 1), -1))
    with pytest.raises(ValueError, match=r"repeats an axis .* leaf \['w'\]"):
        tx.update({"w": jnp.ones((4, 3))}, tx.init({"w": jnp.ones((4, 3))}))
    tx = scale_by_muon(weight_dimension_numbers={"w": MuonDimensionNumbers(), "b": None})
    two = {"w": jnp.ones((4, 3)), "b": jnp.ones((2, 2))}
    with pytest.raises(ValueError, match=r"no MuonDimensionNumbers for leaf \['b'\]"):
        tx.update(two, tx.init(two))
    opt = muon(0.1, muon_weight_dimension_numbers={"w": MuonDimensionNumbers()})
    with pytest.raises(ValueError, match=r"muon_weight_dimension_numbers"):
        opt.init(two)


# --------------------------------------------------------------------------
# Same-shape batching: one Newton-Schulz loop per matrix shape
# --------------------------------------------------------------------------

def _grouping_tree():
    rng = np.random.default_rng(3)
    shapes = {"q": (16, 16), "k": (16, 16), "v": (16, 16), "stack": (3, 16, 16),
              "up": (16, 40), "down": (40, 16), "emb": (40, 16), "odd": (16, 24)}
    return {n: jnp.asarray(rng.normal(size=s), jnp.float32) for n, s in shapes.items()}


@pytest.mark.parametrize("preconditioning,adaptive", [("frobenius", False),
                                                      ("aol", True), ("schatten", False)])
@enable_x64()  # float64: a batched matmul sums in another order than one matrix's (JAX 0.12:
# 1e-4 apart in float32 after 5 Newton-Schulz steps); in float64 ~1e-13
def test_grouped_newton_schulz_equals_per_leaf(preconditioning, adaptive):
    from functrain.families.muon.muon import _DEFAULT_DIMS, orthogonalize_tree
    tree = widen(_grouping_tree())
    coeffs = jnp.asarray((3.4445, -4.7750, 2.0315), jnp.float64)

    def run(t):
        return orthogonalize_tree(t, [_DEFAULT_DIMS] * len(t), coeffs, 5, preconditioning,
                                   1e-8, adaptive, "test")

    grouped = jax.jit(run)(tree)
    for name, x in tree.items():
        alone = jax.jit(run)({name: x})[name]
        assert grouped[name].dtype == jnp.float64
        np.testing.assert_allclose(grouped[name], alone, rtol=1e-10, atol=1e-12, err_msg=name)


def test_same_shape_leaves_share_one_loop():
    # 8 leaves, 3 matrix shapes after transposing to rows <= cols: (16, 16) x 6 matrices,
    # (16, 40) x 3 and (16, 24) x 1: three Newton-Schulz loops, not eight.
    tree = _grouping_tree()
    tx = functrain.contrib.scale_by_muon()
    jaxpr = jax.make_jaxpr(lambda g, s: tx.update(g, s))(tree, tx.init(tree))
    # fori_loop with static bounds is a scan
    loops = [e for e in all_equations(jaxpr) if e.primitive.name in ("while", "scan")]
    assert len(loops) == 3
    assert sorted(tuple(e.outvars[-1].aval.shape) for e in loops) == [
        (1, 16, 24), (3, 16, 40), (6, 16, 16)]
