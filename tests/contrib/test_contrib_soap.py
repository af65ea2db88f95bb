"""functrain.contrib.soap / scale_by_soap against a numpy float64 transcription of the
paper's Algorithm 3 (Vyas et al., 2024), with the authors' reference-code details (the
first call only sets the eigenbases; refreshes sort the columns and the second moment).

optax has no SOAP (its record in tests/registry.py points here). Also checked here: SOAP beats Adam
on an ill-conditioned matrix least-squares problem (each at its best learning rate),
inject_hyperparams, bfloat16, MultiSteps, masked, eval_shape of init, and errors.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import SoapState, palm_beta2_schedule, scale_by_soap, soap
from functrain.jax_compat import enable_x64
from helpers import FAST_COMPILE, all_equations

STEPS = 20


# --------------------------------------------------------------------------
# The reference: the paper's pseudo-code in numpy float64
# --------------------------------------------------------------------------

def _np_merge(shape, max_dim):
    """The reference code's merge: a running product of axes kept while <= max_dim."""
    merged, prod = [], 1
    for d in shape:
        if prod * d > max_dim:
            merged.append(prod if prod > 1 else d)
            prod = d if prod > 1 else 1
        else:
            prod *= d
    if prod > 1 or not merged:
        merged.append(prod)
    return tuple(merged)


def _mode_product(x, q, k):
    """x with its axis k multiplied by q: y[.., j, ..] = sum_i x[.., i, ..] q[i, j]."""
    return np.swapaxes(np.swapaxes(x, k, -1) @ q, k, -1)


class RefSoapLeaf:
    """One leaf of SOAP (Algorithm 3) in numpy float64."""

    def __init__(self, shape, b1, b2, shampoo_beta, eps, freq, max_dim, merge, pre1d,
                 normalize, correct_bias):
        self.shape = shape
        if len(shape) == 0:
            self.mshape, rot = shape, []
        elif len(shape) == 1:
            self.mshape, rot = shape, [pre1d and shape[0] <= max_dim]
        else:
            self.mshape = _np_merge(shape, max_dim) if merge else shape
            rot = [d <= max_dim for d in self.mshape]
        self.rot = rot
        self.hp = (b1, b2, b2 if shampoo_beta is None else shampoo_beta, eps, freq,
                   normalize, correct_bias)
        self.b2_product = 1.0  # prod of b2_1..b2_t, for a decay-rate schedule's correction
        self.m = np.zeros(self.mshape)
        self.v = np.zeros(self.mshape)
        self.L = [np.zeros((d, d)) if r else None for d, r in zip(self.mshape, rot)]
        self.Q = [None] * len(rot)
        self.t = 0
        self.first = True

    def _project(self, x):
        for k, q in enumerate(self.Q):
            if q is not None:
                x = _mode_product(x, q, k)        # Q^T G Q_R in the 2-D case
        return x

    def _project_back(self, x):
        for k, q in enumerate(self.Q):
            if q is not None:
                x = _mode_product(x, q.T, k)      # Q_L N' Q_R^T
        return x

    def _update_stats(self, g):
        s = self.hp[2]
        s = s(self.t + 1) if callable(s) else s  # a schedule at the statistics' own step
        for k, r in enumerate(self.rot):
            if r:
                gk = np.moveaxis(g, k, 0).reshape(g.shape[k], -1)
                self.L[k] = s * self.L[k] + (1 - s) * gk @ gk.T

    def step(self, g):
        b1, b2, _, eps, freq, normalize, correct_bias = self.hp
        g = np.asarray(g, np.float64).reshape(self.mshape)
        if self.first:  # the first call sets the statistics and eigenbases, no update
            self.first = False
            self._update_stats(g)
            for k, r in enumerate(self.rot):
                if r:
                    w, vecs = np.linalg.eigh(self.L[k])
                    self.Q[k] = vecs[:, np.argsort(-w, kind="stable")]
            return np.zeros(self.shape)
        self.t += 1
        if callable(b2):  # a decay-rate schedule b2_t, corrected by 1 - prod(b2_1..b2_t)
            b2 = b2(self.t)
            self.b2_product *= b2
            c2 = 1 - self.b2_product
        else:
            c2 = 1 - b2 ** self.t
        g_rot = self._project(g)
        self.m = b1 * self.m + (1 - b1) * g
        self.v = b2 * self.v + (1 - b2) * g_rot ** 2
        n = self._project_back(self._project(self.m) / (np.sqrt(self.v) + eps))
        if normalize:
            n = n / (1e-30 + np.sqrt(np.mean(n ** 2)))
        if correct_bias:
            n = n * np.sqrt(c2) / (1 - b1 ** self.t)
        self._update_stats(g)
        if self.t % freq == 0:
            for k, q in enumerate(self.Q):
                if q is None:
                    continue
                est = np.diag(q.T @ self.L[k] @ q)
                order = np.argsort(-est, kind="stable")
                self.v = np.take(self.v, order, axis=k)
                self.Q[k], _ = np.linalg.qr(self.L[k] @ q[:, order])
        return n.reshape(self.shape)


def ref_soap(params, grads, lr=None, weight_decay=0.0, **hp):
    """Updates of every step (``lr is None``: scale_by_soap's) from numpy, float64."""
    keys = sorted(params)
    hp = dict(dict(b1=0.95, b2=0.95, shampoo_beta=None, eps=1e-8, freq=10, max_dim=10000,
                   merge=False, pre1d=False, normalize=False, correct_bias=True), **hp)
    leaves = {k: RefSoapLeaf(np.shape(params[k]), **hp) for k in keys}
    p = {k: np.asarray(params[k], np.float64) for k in keys}
    out = []
    for i in range(len(grads[keys[0]])):
        u = {k: leaves[k].step(np.asarray(grads[k][i])) for k in keys}
        if lr is not None:
            u = {k: -lr * (u[k] + weight_decay * p[k]) for k in keys}
            p = {k: p[k] + u[k] for k in keys}
        out.append(u)
    return out


# --------------------------------------------------------------------------
# Trees and runs
# --------------------------------------------------------------------------

def _tree(shapes, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    return {k: jnp.asarray(rng.standard_normal(s), dtype) for k, s in shapes.items()}


def _grads(params, steps=STEPS, seed=1):
    rng = np.random.default_rng(seed)
    out = {}
    for k, p in params.items():
        scale = 10.0 ** rng.uniform(-2, 2, (steps,) + (1,) * p.ndim)
        out[k] = jnp.asarray(rng.standard_normal((steps,) + p.shape) * scale, p.dtype)
    return out


def _run(opt, params, grads):
    """(updates of every step, final params, final state), one jitted scan over the steps."""
    def body(carry, g):
        p, s = carry
        u, s = opt.update(g, s, p)
        return (functrain.apply_updates(p, u), s), u
    run = jax.jit(lambda p, gs: jax.lax.scan(body, (p, opt.init(p)), gs),
                  compiler_options=FAST_COMPILE)
    (p, s), us = run(params, grads)
    steps = len(jax.tree_util.tree_leaves(grads)[0])
    return [{k: np.asarray(us[k][i], np.float64) for k in us} for i in range(steps)], p, s


def _updates(opt, params, grads):
    return _run(opt, params, grads)[0]


# Shapes whose statistics have full rank after one gradient (distinct eigenvalues: the
# eigenbases are unique up to sign, which SOAP's update does not see).
FULL_RANK = {"sq": (5, 5), "t3": (3, 4, 5), "v": (6,), "s": ()}
MERGED = {"m": (2, 2, 6), "r": (3, 12), "q": (4, 4), "v": (6,)}  # with max_precond_dim=4

SETTINGS = {
    "defaults, freq 3": (FULL_RANK, dict(precondition_frequency=3),
                         dict(freq=3)),
    "betas, eps, shampoo_beta, normalize, no bias correction": (
        FULL_RANK, dict(b1=0.9, b2=0.99, shampoo_beta=0.8, eps=1e-3, precondition_frequency=4,
                        normalize_grads=True, correct_bias=False),
        dict(b1=0.9, b2=0.99, shampoo_beta=0.8, eps=1e-3, freq=4, normalize=True,
             correct_bias=False)),
    "merge_dims, max_precond_dim": (
        MERGED, dict(precondition_frequency=2, max_precond_dim=4, merge_dims=True),
        dict(freq=2, max_dim=4, merge=True)),
    "max_precond_dim without merging": (
        MERGED, dict(precondition_frequency=5, max_precond_dim=4), dict(freq=5, max_dim=4)),
    # PaLM's b2_t = 1 - t**-0.8 (Chowdhery et al., 2022): Adam's decay and, with
    # shampoo_beta=None, the statistics' (each at its own step)
    "palm b2 schedule": (
        FULL_RANK, dict(b2=palm_beta2_schedule(), precondition_frequency=3),
        dict(b2=lambda t: 1.0 - t ** -0.8, freq=3)),
    "palm b2 schedule, shampoo_beta 0.9": (
        FULL_RANK, dict(b2=palm_beta2_schedule(), shampoo_beta=0.9, precondition_frequency=2),
        dict(b2=lambda t: 1.0 - t ** -0.8, shampoo_beta=0.9, freq=2)),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_scale_by_soap_matches_numpy_algorithm(name):
    shapes, ours, ref = SETTINGS[name]
    with enable_x64(True):
        params = _tree(shapes, jnp.float64)
        grads = _grads(params)
        got = _updates(scale_by_soap(**ours), params, grads)
    want = ref_soap(params, grads, **ref)
    for i, (a, b) in enumerate(zip(got, want)):
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-10,
                                       err_msg=f"{name}: step {i} leaf {k}")
    assert not np.any(got[0]["sq" if "sq" in got[0] else "q"])  # first call: zero update
    assert np.all(np.isfinite(got[-1]["v"]))


def test_soap_with_weight_decay_matches_numpy_algorithm():
    with enable_x64(True):
        params = _tree(FULL_RANK, jnp.float64)
        grads = _grads(params)
        got = _updates(soap(0.05, weight_decay=0.1, precondition_frequency=3), params, grads)
    want = ref_soap(params, grads, lr=0.05, weight_decay=0.1, freq=3)
    for i, (a, b) in enumerate(zip(got, want)):
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-10,
                                       err_msg=f"step {i} leaf {k}")


def test_precondition_1d_rotates_a_vector_as_a_column():
    """A vector with ``precondition_1d`` gets a (n, n) basis and the same updates as the
    (n, 1) matrix (whose other axis, of size 1, rotates nothing); without it, plain Adam's
    direction with SOAP's step-size bias correction."""
    vec = _tree({"v": (6,)})
    grads = _grads(vec)
    rotated = _updates(scale_by_soap(precondition_1d=True, precondition_frequency=3), vec,
                       grads)
    col = _updates(scale_by_soap(precondition_frequency=3),
                   {"v": vec["v"][:, None]}, {"v": grads["v"][:, :, None]})
    for a, b in zip(rotated, col):
        np.testing.assert_allclose(a["v"], b["v"][:, 0], rtol=2e-5, atol=1e-7)
    assert scale_by_soap(precondition_1d=True).init(vec).bases["v"][0].shape == (6, 6)
    plain = _updates(scale_by_soap(), vec, grads)
    g = np.asarray(grads["v"], np.float64)
    m = v = 0.0
    for t in range(1, STEPS):
        m = 0.95 * m + 0.05 * g[t]
        v = 0.95 * v + 0.05 * g[t] ** 2
        want = np.sqrt(1 - 0.95 ** t) / (1 - 0.95 ** t) * m / (np.sqrt(v) + 1e-8)
        np.testing.assert_allclose(plain[t]["v"], want, rtol=2e-5, atol=1e-7)


# --------------------------------------------------------------------------
# What it is for: an ill-conditioned least-squares problem
# --------------------------------------------------------------------------

def _conditioned(rng, n, cond):
    u, _ = np.linalg.qr(rng.standard_normal((n, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return u @ np.diag(np.logspace(0, -np.log10(cond), n)) @ v.T


def test_soap_beats_adam_on_ill_conditioned_least_squares():
    """min 0.5 ||A W B - C||^2, A (32, 32) and B (16, 16) of condition number 1e3, W (32, 16),
    200 steps from zero; each optimizer at the best of six learning rates. Measured: Adam's
    best (lr 0.2) leaves 1.1e-3 of the initial loss, SOAP's best (lr 0.1) 5.3e-5."""
    rng = np.random.default_rng(0)
    a = jnp.asarray(_conditioned(rng, 32, 1e3), jnp.float32)
    b = jnp.asarray(_conditioned(rng, 16, 1e3), jnp.float32)
    c = a @ jnp.asarray(rng.standard_normal((32, 16)), jnp.float32) @ b

    def loss(w):
        return 0.5 * jnp.sum((a @ w @ b - c) ** 2)

    def final_loss(make):
        @jax.jit
        def run(lrs):
            def one(lr):
                opt = make(lr)
                w = jnp.zeros((32, 16))

                def step(carry, _):
                    w, s = carry
                    u, s = opt.update(jax.grad(loss)(w), s, w)
                    return (functrain.apply_updates(w, u), s), None
                w = jax.lax.scan(step, (w, opt.init(w)), None, length=200)[0][0]
                return loss(w)
            return jax.lax.map(one, lrs)
        return np.asarray(run(jnp.asarray([1e-2, 3e-2, 6e-2, 1e-1, 2e-1, 3e-1])))

    start = float(loss(jnp.zeros((32, 16))))
    adam_best = final_loss(functrain.adam).min() / start
    soap_best = final_loss(lambda lr: soap(lr, weight_decay=0.0)).min() / start
    assert adam_best > 5e-4, adam_best           # Adam stalls on the small directions
    assert soap_best < adam_best / 8, (soap_best, adam_best)
    assert soap_best < 1.5e-4, soap_best


# --------------------------------------------------------------------------
# Wrappers, dtypes, shapes
# --------------------------------------------------------------------------

def test_inject_hyperparams_gives_the_same_numbers():
    """In float64: in float32, eigh and QR amplify the rounding differences that
    hyperparameters held as arrays (rather than folded constants) bring, to ~1e-4."""
    kw = dict(learning_rate=0.02, b1=0.9, b2=0.98, shampoo_beta=0.9, eps=1e-6,
              weight_decay=0.05, precondition_frequency=3)
    injected = functrain.inject_hyperparams(soap)(**kw)
    with enable_x64(True):
        params = _tree({"sq": (5, 5), "v": (6,)}, jnp.float64)
        grads = _grads(params)
        want = _updates(soap(**kw), params, grads)
        got = _updates(injected, params, grads)
        state = injected.init(params)
    for a, b in zip(got, want):
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-12)
    assert set(state.hyperparams) >= {"learning_rate", "b1", "b2", "eps", "weight_decay"}
    assert "max_precond_dim" not in state.hyperparams


def test_bfloat16_params_keep_bfloat16_updates():
    params = _tree({"w": (6, 4), "b": (4,)}, jnp.bfloat16)
    grads = _grads(params, steps=3)
    us, params, state = _run(soap(1e-2, precondition_frequency=1), params, grads)
    u, _ = jax.eval_shape(soap(1e-2).update, {k: g[0] for k, g in grads.items()}, state,
                          params)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves((u, params)))
    assert all(np.any(u[k]) for u in us[1:] for k in u)
    inner = state[0]
    assert inner.mu["w"].dtype == jnp.bfloat16 and inner.nu["w"].dtype == jnp.bfloat16
    assert all(m.dtype == jnp.float32 for m in inner.bases["w"] + inner.stats["w"])
    assert all(np.all(np.isfinite(np.asarray(x, np.float32)))
               for x in jax.tree_util.tree_leaves(params))


def test_multisteps_averages_gradients():
    """MultiSteps(soap, 2) over 2k micro-steps = soap on the pairwise-mean gradients."""
    params = _tree({"w": (4, 4), "b": (4,)})
    grads = _grads(params)
    opt = soap(1e-2, precondition_frequency=2)
    multi = functrain.MultiSteps(opt, every_k_schedule=2)
    got = _updates(multi, params, grads)
    mean = {k: (g[0::2] + g[1::2]) / 2 for k, g in grads.items()}
    want = _updates(opt, params, mean)
    for i, u in enumerate(want):
        for k in u:
            assert not np.any(got[2 * i][k])
            np.testing.assert_allclose(got[2 * i + 1][k], u[k], rtol=2e-5, atol=1e-7)
    assert np.any(want[-1]["w"])


def test_masked_leaves_keep_no_state():
    params = _tree({"w": (4, 3), "b": (3,)})
    opt = functrain.masked(scale_by_soap(), {"w": True, "b": False})
    state = opt.init(params)
    assert isinstance(state.inner_state.stats["b"], functrain.tree.MaskedNode)
    g = _grads(params, steps=2)
    us, _, state = _run(opt, params, g)
    np.testing.assert_array_equal(us[1]["b"], g["b"][1])
    assert isinstance(state.inner_state.nu["b"], functrain.tree.MaskedNode)
    assert np.any(us[1]["w"]) and state.inner_state.bases["w"][0].shape == (4, 4)


def test_eval_shape_of_init_matches_init():
    params = _tree({"w": (6, 5), "t": (2, 3, 4), "b": (5,), "s": ()})
    for opt in (soap(), scale_by_soap(max_precond_dim=4, merge_dims=True, precondition_1d=True)):
        abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                          params)
        shapes = jax.eval_shape(opt.init, abstract)
        real = opt.init(params)
        assert jax.tree_util.tree_structure(shapes) == jax.tree_util.tree_structure(real)
        assert [(x.shape, x.dtype) for x in jax.tree_util.tree_leaves(shapes)] == [
            (x.shape, x.dtype) for x in jax.tree_util.tree_leaves(real)]
    state = scale_by_soap(max_precond_dim=4, merge_dims=True).init(params)
    assert isinstance(state, SoapState)
    assert [q.shape for q in state.bases["t"]] == [(2, 2), (3, 3), (4, 4)]  # nothing merges
    assert [q.shape for q in state.bases["w"]] == [(1, 1), (1, 1)]  # placeholders


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(b1=1.5), r"scale_by_soap: b1 must be in \[0.0, 1.0\), got 1.5"),
    (dict(shampoo_beta=-1), r"shampoo_beta must be in \[0.0, 1.0\), got -1; pass None"),
    (dict(precondition_frequency=0), r"precondition_frequency must be >= 1.0, got 0"),
    (dict(precondition_frequency=2.5), r"precondition_frequency must be an integer"),
    (dict(max_precond_dim=0), r"max_precond_dim must be >= 1.0, got 0"),
    (dict(eps=-1.0), r"eps must be >= 0.0"),
])
def test_bad_hyperparameters_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        scale_by_soap(**kwargs)


def test_bad_arguments_and_leaves_are_named():
    with pytest.raises(TypeError, match="scale_by_soap: merge_dims must be a bool"):
        scale_by_soap(merge_dims="yes")
    with pytest.raises(ValueError, match="soap: weight_decay must be >= 0.0"):
        soap(weight_decay=-1.0)
    with pytest.raises(ValueError, match="soap: learning_rate must be finite"):
        soap(float("nan"))
    opt = scale_by_soap()
    with pytest.raises(TypeError, match=r"params leaf \['step'\] has dtype int32"):
        opt.init({"w": jnp.ones((2, 2)), "step": jnp.zeros((), jnp.int32)})
    with pytest.raises(TypeError, match=r"does not support complex.*\['c'\]"):
        opt.init({"c": jnp.ones((2, 2), jnp.complex64)})
    params = {"w": jnp.ones((3, 2))}
    state = opt.init(params)
    with pytest.raises(ValueError, match=r"updates leaf \['w'\] has shape \(2, 3\) but params"):
        opt.update({"w": jnp.ones((2, 3))}, state, params)
    with pytest.raises(ValueError, match=r"updates leaf \['w'\] has shape \(2, 3\) but "
                                         r"scale_by_soap state .mu"):
        opt.update({"w": jnp.ones((2, 3))}, state)
    other = scale_by_soap(max_precond_dim=2).init(params)
    with pytest.raises(ValueError, match=r"updates leaf \['w'\].*state .stats matrices"):
        opt.update({"w": jnp.ones((3, 2))}, other)
    with pytest.raises(TypeError, match="scale_by_soap expected its state as SoapState"):
        opt.update({"w": jnp.ones((3, 2))}, (), params)


# --------------------------------------------------------------------------
# mesh=: one conditional for the whole tree, same-size decompositions stacked
# (and divided over the mesh's devices: tests/matrix_sharding_checks.py)
# --------------------------------------------------------------------------

# With max_precond_dim=8: three (5, 5) leaves and two (3, 4, 5) ones, whose eight (5, 5)
# statistics are decomposed in one stack; "wide"'s 10-axis is not rotated; vectors and the
# scalar are plain Adam. Every rotated statistic has full rank from the first gradient on.
GROUPED = {"q": (5, 5), "k": (5, 5), "o": (5, 5), "t3": (3, 4, 5), "t3b": (3, 4, 5),
           "wide": (10, 6), "v": (6,), "v2": (6,), "s": ()}
GROUPED_OPTIONS = dict(precondition_frequency=3, max_precond_dim=8)  # refreshes at steps 3, 6


def _one_device_mesh():
    return jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))


def _split_and_per_leaf(dtype):
    """8 steps (the first call's eigh and two refreshes) of scale_by_soap on GROUPED, with
    the refresh stacked over the tree (mesh=) and per leaf (mesh=None)."""
    params = _tree(GROUPED, dtype, seed=3)
    grads = _grads(params, steps=8, seed=4)
    split = _run(scale_by_soap(mesh=_one_device_mesh(), **GROUPED_OPTIONS), params, grads)
    per_leaf = _run(scale_by_soap(**GROUPED_OPTIONS), params, grads)
    return params, grads, split, per_leaf


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_tree_refresh_equals_each_leaf_refresh(dtype):
    """Each leaf's statistics, bases and updates are those of its own refresh (float64:
    to 1e-10, where a wrong pairing of stacked matrices and leaves cannot hide; float32:
    the same LAPACK and GEMM calls, to 1e-6), and the numpy algorithm's."""
    with enable_x64(dtype == "float64"):
        params, grads, (updates, _, state), (want, _, want_state) = _split_and_per_leaf(
            jnp.dtype(dtype))
    rtol, atol = (1e-10, 1e-12) if dtype == "float64" else (1e-6, 1e-7)
    for i, (a, b) in enumerate(zip(updates, want)):
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=atol,
                                       err_msg=f"update of {k} at step {i}")
    for field in ("mu", "nu", "stats", "bases"):
        for k in params:
            for x, y in zip(jax.tree_util.tree_leaves(getattr(state, field)[k]),
                            jax.tree_util.tree_leaves(getattr(want_state, field)[k])):
                np.testing.assert_allclose(x, y, rtol=rtol, atol=atol,
                                           err_msg=f"state .{field} of {k}")
    if dtype == "float64":
        for i, (a, b) in enumerate(zip(updates, ref_soap(params, grads, freq=3, max_dim=8))):
            for k in a:
                np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-10,
                                           err_msg=f"numpy: step {i} leaf {k}")


def test_mesh_refreshes_the_tree_in_one_conditional():
    """With mesh=, one conditional refreshes every basis, and the eight (5, 5) statistics
    (q, k, o's two sides, t3 and t3b's last axis) go through one loop of single-matrix
    eigh calls, and one of QR calls, on CPU; without it, one conditional per leaf."""
    params = _tree(GROUPED)

    def program(**kw):
        opt = scale_by_soap(**GROUPED_OPTIONS, **kw)
        return jax.make_jaxpr(opt.update)(params, opt.init(params))

    jaxpr = program(mesh=_one_device_mesh())
    conds = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "cond"]
    assert len(conds) == 1 and len(conds[0].params["branches"]) == 3
    loops = {}
    for e in all_equations(jaxpr):
        if e.primitive.name == "scan":
            inner = {(f.primitive.name, tuple(f.invars[0].aval.shape))
                     for f in all_equations(e.params["jaxpr"]) if f.invars}
            for name, shape in inner & {("eigh", (5, 5)), ("qr", (5, 5))}:
                loops.setdefault(name, []).append(e.params["length"])
    assert loops == {"eigh": [8], "qr": [8]}, loops
    per_leaf = [e for e in program().jaxpr.eqns if e.primitive.name == "cond"]
    assert len(per_leaf) == 6  # q, k, o, t3, t3b, wide


# --------------------------------------------------------------------------
# block_size: each block of a split leaf preconditioned as a separate leaf
# --------------------------------------------------------------------------

def _cut(x, rows, cols):
    """The blocks of a matrix, keyed in row-major block order; rows, cols: the boundaries."""
    return {f"w{i}{j}": x[r0:r1, c0:c1] for i, (r0, r1) in enumerate(zip(rows, rows[1:]))
            for j, (c0, c1) in enumerate(zip(cols, cols[1:]))}


@pytest.mark.parametrize("shape, block_size, rows, cols, kw", [
    ((6, 9), 3, (0, 3, 6), (0, 3, 6, 9), {}),                        # (2b, 3b): 6 blocks
    ((7, 5), 3, (0, 3, 6, 7), (0, 3, 5), {}),                        # shorter last blocks
    ((6, 9), 3, (0, 3, 6), (0, 3, 6, 9), {"mesh": "one device"}),
    ((2, 3, 9), 4, (0, 3, 6), (0, 3, 6, 9), {"merge_dims": True, "max_precond_dim": 10}),
])
def test_blocks_equal_separate_leaves_float64(shape, block_size, rows, cols, kw):
    """SOAP with block_size on one leaf (a merged (6, 9) leaf in the last case) gives, block
    by block, the updates and state of SOAP without blocks on the blocks as separate leaves
    (12 steps: the first call's eigh and three refreshes), float64, to 1e-12."""
    kw = dict(kw, precondition_frequency=3)
    if kw.get("mesh"):
        kw["mesh"] = _one_device_mesh()
    with enable_x64(True):
        params = _tree({"w": shape}, jnp.float64, seed=5)
        grads = _grads(params, steps=12, seed=6)
        def matrix(x):  # the merged leaf (the last case), or the leaf
            return x.reshape(x.shape[:x.ndim - len(shape)] + (math.prod(shape[:-1]), shape[-1]))
        updates, _, state = _run(scale_by_soap(block_size=block_size, **kw), params, grads)
        sep_params = _cut(matrix(params["w"]), rows, cols)
        sep_grads = {k: jnp.stack([_cut(matrix(g), rows, cols)[k] for g in grads["w"]])
                     for k in sep_params}
        plain = {k: v for k, v in kw.items() if k != "merge_dims"}
        want, _, want_state = _run(scale_by_soap(**plain), sep_params, sep_grads)
    for t, (u, w) in enumerate(zip(updates, want)):
        got = _cut(matrix(u["w"]), rows, cols)
        for k in w:
            np.testing.assert_allclose(got[k], w[k], rtol=1e-12, atol=1e-12,
                                       err_msg=f"block {k} at step {t}")
    assert max(np.abs(u["w"]).max() for u in updates[1:]) > 0.1
    nu = _cut(matrix(np.asarray(state.nu["w"])), rows, cols)
    for j, k in enumerate(sorted(want_state.stats)):
        np.testing.assert_allclose(nu[k], want_state.nu[k], rtol=1e-12, atol=1e-12)
        for field in ("stats", "bases"):
            for axis, want_m in enumerate(getattr(want_state, field)[k]):
                d = want_m.shape[0]
                got_m = np.asarray(getattr(state, field)["w"][axis][j])[:d, :d]
                np.testing.assert_allclose(got_m, want_m, rtol=1e-12, atol=1e-12,
                                           err_msg=f".{field} of block {k}, axis {axis}")


def test_block_size_state_layout_and_eval_shape():
    params = _tree({"w": (7, 5), "small": (3, 3), "wide": (20, 3), "v": (7,)})
    opt = scale_by_soap(block_size=3, max_precond_dim=10, precondition_1d=True)
    state = opt.init(params)
    assert [m.shape for m in state.stats["w"]] == [(6, 3, 3), (6, 3, 3)]  # 3 x 2 blocks
    assert [m.shape for m in state.stats["small"]] == [(3, 3), (3, 3)]    # not split
    assert [m.shape for m in state.stats["wide"]] == [(1, 1), (3, 3)]  # 20 > 10: not split
    assert [m.shape for m in state.stats["v"]] == [(3, 3, 3)]             # 3 + 3 + 1
    shapes = jax.eval_shape(opt.init, params)
    assert [(x.shape, x.dtype) for x in jax.tree_util.tree_leaves(shapes)] == [
        (x.shape, x.dtype) for x in jax.tree_util.tree_leaves(state)]
    assert [m.shape for m in scale_by_soap(block_size=64).init(params).stats["w"]] == [
        (7, 7), (5, 5)]  # no axis longer than block_size: today's layout


def test_block_size_keeps_normalization_per_leaf():
    params = _tree({"w": (6, 9)})
    opt = scale_by_soap(block_size=3, normalize_grads=True, correct_bias=False)
    for u in _updates(opt, params, _grads(params, steps=4))[1:]:
        np.testing.assert_allclose(np.sqrt(np.mean(u["w"] ** 2)), 1.0, rtol=1e-5)


@pytest.mark.parametrize("bad", [0, -2, 2.5])
def test_bad_block_size_is_named(bad):
    for factory in (scale_by_soap, soap):
        with pytest.raises(ValueError, match=r"scale_by_soap: block_size must be None or an "
                                             r"integer >= 1"):
            factory(block_size=bad)
