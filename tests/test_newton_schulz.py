"""functrain.linalg.newton_schulz's coefficient presets and its Gram method.

* Polar Express (Amsel, Persson, Musco & Gower, 2025, arXiv 2505.16932): the rows are
  recomputed here from the paper's construction (each step the minimax odd quintic for
  the current interval of singular values, found by the Remez exchange, with the cushion,
  the recentring and the safety factor), and the iteration is written out in numpy
  (float64) from the update ``X <- a X + b (X X^T) X + c (X X^T)^2 X``.
* Gram Newton-Schulz (Zhang, Amsel, Chen & Dao, 2026): equal to the standard iteration in
  float64 to rounding, and in float32 within a bound derived from the spectrum (how much
  each step's rounding can be amplified by the steps after it).
* The exact polar factor ``U V^T`` from numpy's SVD: Polar Express gets closer than the
  standard coefficients in as many steps.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain import linalg
from helpers import enable_x64

PRESETS = ("standard", "dion", "polar_express")


# --------------------------------------------------------------------------
# References written from the papers (float64 numpy)
# --------------------------------------------------------------------------

def minimax_odd_quintic(lo, hi):
    """The odd quintic ``a t + b t^3 + c t^5`` closest to 1 on ``[lo, hi]`` in max norm.

    The error equioscillates at ``lo``, the two interior extrema ``q < r`` and ``hi``:
    solve ``p(t_i) + (-1)^i E = 1`` for ``(a, b, c, E)``, move ``q, r`` to the roots of
    ``p'(t) = a + 3 b t^2 + 5 c t^4``, repeat until ``E`` settles (Remez exchange).
    """
    if lo / hi > 1 - 5e-6:  # an interval of width ~0: the quintic with p(1)=1, p'(1)=p''(1)=0
        return 15 / 8 / hi, -10 / 8 / hi ** 3, 3 / 8 / hi ** 5
    q, r, last = (3 * lo + hi) / 4, (lo + 3 * hi) / 4, np.inf
    for _ in range(200):
        t = np.array([lo, q, r, hi])
        a, b, c, e = np.linalg.solve(np.stack([t, t ** 3, t ** 5, [1, -1, 1, -1]], 1),
                                     np.ones(4))
        root = np.sqrt(9 * b * b - 20 * a * c)
        q, r = np.sqrt((-3 * b - root) / (10 * c)), np.sqrt((-3 * b + root) / (10 * c))
        if abs(e - last) < 1e-15:
            break
        last = e
    return a, b, c


def polar_express_rows(lo, steps, safety_eps, cushion):
    """The paper's composition: singular values in [lo, 1] after the normalization."""
    hi, rows, s = 1.0, [], 1 + safety_eps
    for i in range(steps):
        a, b, c = minimax_odd_quintic(max(lo, cushion * hi), hi)
        if cushion * hi > lo:  # recentre about 1 on the true interval [lo, hi]
            k = 2 / sum(a * t + b * t ** 3 + c * t ** 5 for t in (lo, hi))
            a, b, c = a * k, b * k, c * k
        if i < steps - 1:  # the safety factor, on all but the last polynomial
            a, b, c = a / s, b / s ** 3, c / s ** 5
        rows.append((a, b, c))
        lo = a * lo + b * lo ** 3 + c * lo ** 5
        hi = 2 - lo
    return np.array(rows)


def numpy_iteration(x, rows, safety, eps):
    """``X / (safety ||X||_F + eps)``, then one quintic step per row, on each matrix."""
    out = []
    for m in np.asarray(x, np.float64):
        m = m / (safety * np.linalg.norm(m) + eps)
        for a, b, c in rows:
            g = m @ m.T
            m = a * m + b * g @ m + c * g @ g @ m
        out.append(m)
    return np.stack(out)


def polar_factor(x):
    u, _, vt = np.linalg.svd(x, full_matrices=False)
    return u @ vt


# --------------------------------------------------------------------------
# Polar Express
# --------------------------------------------------------------------------

def test_polar_express_rows_are_the_papers_construction():
    """modded-nanogpt's rows: l = 1e-3, 5 iterations, safety 2e-2, cushion 0.02."""
    want = polar_express_rows(1e-3, 5, 2e-2, 0.02)
    rows, safety = linalg.newton_schulz_coefficients("polar_express", 5)
    np.testing.assert_allclose(rows, want, rtol=1e-12)
    assert safety == 1 + 2e-2
    # fewer steps: the first rows; more: the quintic the construction tends to (hi -> lo)
    np.testing.assert_array_equal(linalg.newton_schulz_coefficients("polar_express", 3)[0],
                                  rows[:3])
    seven = linalg.newton_schulz_coefficients("polar_express", 7)[0]
    np.testing.assert_array_equal(seven[:5], rows)
    steady = np.linalg.solve([[1, 1, 1], [1, 3, 5], [0, 6, 20]], [1, 0, 0])  # p(1)=1, p'=p''=0
    np.testing.assert_allclose(seven[5:], [steady, steady], rtol=1e-15)
    np.testing.assert_allclose(minimax_odd_quintic(1.0, 1.0), steady, rtol=1e-15)
    assert linalg.newton_schulz_coefficients("polar_express", 0)[0].shape == (0, 3)


@pytest.mark.parametrize("method", linalg.NS_METHODS)
@pytest.mark.parametrize("steps", [3, 5, 7])
def test_polar_express_is_the_numpy_iteration(method, steps):
    x = np.random.default_rng(steps).standard_normal((3, 6, 11))
    rows = polar_express_rows(1e-3, 5, 2e-2, 0.02)
    rows = np.concatenate([rows[:steps], np.tile([15 / 8, -10 / 8, 3 / 8], (max(steps - 5, 0), 1))])
    with enable_x64(True):
        got = np.asarray(linalg.newton_schulz(jnp.asarray(x), "polar_express", steps,
                                              method=method))
    np.testing.assert_allclose(got, numpy_iteration(x, rows, 1.02, 1e-8), rtol=1e-10,
                               atol=1e-12)


def test_polar_express_is_closer_to_the_polar_factor_than_the_standard_coefficients():
    rng = np.random.default_rng(0)
    for shape in [(4, 16, 16), (4, 32, 64), (2, 64, 64)]:
        x = rng.standard_normal(shape)
        exact = np.stack([polar_factor(m) for m in x])
        with enable_x64(True):
            for steps in (5, 6, 8):
                dist = {c: np.linalg.norm(np.asarray(linalg.newton_schulz(
                    jnp.asarray(x), c, steps)) - exact, axis=(-2, -1)).max() / np.sqrt(shape[1])
                    for c in ("standard", "polar_express")}
                assert dist["polar_express"] < 0.7 * dist["standard"], (shape, steps, dist)
            # rectangular Gaussian matrices (singular values away from 0): converged by 8 steps
            if shape[1] < shape[2]:
                assert dist["polar_express"] < 1e-6, (shape, dist)


# --------------------------------------------------------------------------
# Gram Newton-Schulz: the standard iteration's numbers
# --------------------------------------------------------------------------

@enable_x64()
@pytest.mark.parametrize("preconditioning", linalg.PRECONDITIONINGS)
@pytest.mark.long
def test_gram_equals_standard_in_float64(preconditioning):
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((3, 8, 24)))
    cases = [(c, s) for c in PRESETS for s in (0, 1, 2, 5)] + [
        ("polar_express", 8), (jnp.array([3.0, -3.2, 1.2]), 3),
        (jnp.array([[3.0, -3.2, 1.2], [2.0, -1.5, 0.5], [1.875, -1.25, 0.375]]), 3)]
    for coeffs, steps in cases:
        want = linalg.newton_schulz(x, coeffs, steps, preconditioning)
        got = linalg.newton_schulz(x, coeffs, steps, preconditioning, method="gram")
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12,
                                   err_msg=f"{coeffs}, {steps} steps")
    z = x + 1j * jnp.asarray(rng.standard_normal(x.shape))  # complex: X X^H
    np.testing.assert_allclose(linalg.newton_schulz(z, "polar_express", method="gram"),
                               linalg.newton_schulz(z, "polar_express"), rtol=1e-11, atol=1e-12)


def float32_bound(x, rows, safety):
    """How far a float32 run may be from the float64 iteration, from the spectrum of ``x``.

    On the interval ``s_t`` of singular values before step ``t``: a step sums terms of size
    ``f_t s_t`` with ``f_t = |a| + |b| s_t^2 + |c| s_t^4`` (they cancel to ``p_t(s_t)``), so
    its rounding is up to ``eps32 sqrt(n) f_t s_t`` in spectral norm (``n`` the inner
    dimension of the products); Gram's ``Q`` multiplies two steps' factors before touching
    ``X``, hence ``f_(t-1) f_t s_(t-1)`` (which bounds the standard step's too). Each such
    perturbation reaches the output scaled by at most the slope of the remaining steps'
    composed polynomial (for the off-diagonal part, its divided differences: the same
    maximum over the interval). The bound sums these, the normalization's rounding included.
    """
    s = np.linalg.svd(x, compute_uv=False) / (safety * np.linalg.norm(x))
    spectra = [np.linspace(s.min(), s.max(), 4001)]
    for a, b, c in rows:
        t = spectra[-1]
        spectra.append(a * t + b * t ** 3 + c * t ** 5)
    factor = [abs(a) + abs(b) * spectra[k] ** 2 + abs(c) * spectra[k] ** 4
              for k, (a, b, c) in enumerate(rows)]

    def slope_after(start):
        slope = np.ones_like(spectra[0])
        for k in range(start, len(rows)):
            a, b, c = rows[k]
            slope = slope * (a + 3 * b * spectra[k] ** 2 + 5 * c * spectra[k] ** 4)
        return np.abs(slope)

    total = slope_after(0).max()
    for t in range(len(rows)):
        size = factor[t] * spectra[t] * (factor[t - 1] if t else 1.0)
        total += (size * slope_after(t + 1)).max()
    return np.finfo(np.float32).eps * np.sqrt(x.shape[-1]) * total


@pytest.mark.parametrize("cond", [None, 1e2, 1e4])
def test_gram_equals_standard_in_float32_within_the_conditioning_bound(cond):
    rng = np.random.default_rng(2)
    m, n = 32, 96
    if cond is None:
        x = rng.standard_normal((m, n))
    else:  # singular values from 1 down to 1 / cond
        u, _ = np.linalg.qr(rng.standard_normal((m, m)))
        v, _ = np.linalg.qr(rng.standard_normal((n, m)))
        x = (u * np.geomspace(1, 1 / cond, m)) @ v.T
    for coeffs, steps in (("standard", 5), ("polar_express", 5), ("polar_express", 8),
                          ("dion", 5)):
        rows, safety = linalg.newton_schulz_coefficients(coeffs, steps)
        rows = np.broadcast_to(rows, (steps, 3)) if rows.ndim == 1 else rows
        with enable_x64(True):
            exact = np.asarray(linalg.newton_schulz(jnp.asarray(x[None]), coeffs, steps))
        bound = float32_bound(x, rows, safety)
        runs = {method: np.asarray(linalg.newton_schulz(jnp.asarray(x[None], jnp.float32),
                                                        coeffs, steps, method=method))
                for method in linalg.NS_METHODS}
        for method, got in runs.items():
            assert np.abs(got - exact).max() <= bound, (coeffs, steps, method, bound)
        assert np.abs(runs["gram"] - runs["standard"]).max() <= 2 * bound


def test_gram_in_a_jitted_program_is_a_loop():
    """The pairs of steps are a scan: the program does not grow with ns_steps."""
    x = jax.ShapeDtypeStruct((2, 8, 32), jnp.float32)

    def hlo(steps):
        return jax.jit(lambda x: linalg.newton_schulz(x, "polar_express", steps,
                                                      method="gram")).lower(x).as_text()

    assert "while" in hlo(8)
    assert hlo(20).count("dot_general") == hlo(8).count("dot_general")


# --------------------------------------------------------------------------
# Errors name the argument and what was expected, before any array math
# --------------------------------------------------------------------------

@pytest.mark.parametrize("call, error, match", [
    (lambda x: linalg.newton_schulz(x, "polar"), ValueError,
     r"newton_schulz: coeffs preset 'polar' is unknown; the presets are \['standard', 'dion', "
     r"'polar_express'\]"),
    (lambda x: linalg.newton_schulz(x, method="fast"), ValueError,
     r"method must be one of \('standard', 'gram'\), got 'fast'"),
    (lambda x: linalg.newton_schulz(x, (1.0, 2.0)), ValueError,
     r"coeffs must have shape \(3,\) or \(n, 3\)"),
    (lambda x: linalg.newton_schulz(x[0, 0]), ValueError,
     r"x must be a matrix or a stack of them \(\.\.\., m, n\), got shape \(3,\)"),
    (lambda x: linalg.newton_schulz(x, safety_factor=0.0), ValueError,
     r"safety_factor must be a number > 0 or None, got 0.0"),
    (lambda x: linalg.newton_schulz(x, "polar_express", 2.5), ValueError,
     r"'polar_express' sizes its per-step rows by ns_steps, which must be a Python int"),
    (lambda x: linalg.newton_schulz_coefficients("nope", owner="muon", arg="ns_coeffs"),
     ValueError, r"muon: ns_coeffs preset 'nope' is unknown"),
])
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call(jnp.ones((1, 2, 3)))


def test_traced_step_counts_are_refused_where_the_rows_need_them():
    x = jnp.ones((1, 2, 3))
    with pytest.raises(ValueError, match="method='gram' with a coefficient triple needs "
                                         "ns_steps as a Python int"):
        jax.jit(lambda k: linalg.newton_schulz(x, ns_steps=k, method="gram"))(5)
    with pytest.raises(ValueError, match="'polar_express' sizes its per-step rows"):
        jax.jit(lambda k: linalg.newton_schulz(x, "polar_express", k))(5)
    # the standard method takes a traced count (inject_hyperparams), as before
    got = jax.jit(lambda k: linalg.newton_schulz(x, ns_steps=k))(5)
    np.testing.assert_allclose(got, linalg.newton_schulz(x), rtol=1e-6)


def test_benchmark_script_runs(tmp_path):
    """benchmarks/newton_schulz.py end to end on a tiny size (never timed: make bench)."""
    import json
    import pathlib
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
    import newton_schulz as bench
    table = bench.main(["--sizes", "8x24", "--reps", "1", "--out", str(tmp_path)])
    assert table.count("| 8 x 24 |") == len(bench.VARIANTS)
    with open(tmp_path / "newton_schulz.json") as f:
        rows = json.load(f)["results"]["8 x 24"]
    assert set(rows) == set(bench.VARIANTS)
    # five steps as flops: 20 m^2 n + 10 m^3 (standard), 12 m^2 n + 22 m^3 (gram)
    assert rows["gram"]["model"] == (12 * 8 * 8 * 24 + 22 * 8 ** 3) / (20 * 8 * 8 * 24 + 10 * 8 ** 3)
    assert rows["polar_express"]["distance"] < rows["standard"]["distance"]
    assert abs(rows["polar_express + gram"]["distance"] - rows["polar_express"]["distance"]) < 1e-4


# --------------------------------------------------------------------------
# Steps in bfloat16 (dtype=, the Muon family's ns_dtype=)
# --------------------------------------------------------------------------

@pytest.mark.parametrize("coeffs, band", [("standard", (0.6, 1.2)),
                                          ("polar_express", (0.75, 1.2))])
def test_bfloat16_steps_stay_in_float32s_band(coeffs, band):
    # Float32's singular values after 5 steps: [0.68, 1.14] (standard), [0.86, 1.14] (Polar
    # Express). In bfloat16 (8 significant bits, relative rounding 2^-9 per operation) they
    # land in the same band, and the result differs from float32's by a few percent
    # (measured 3-9% over 64 x 256 to 1024 x 4096): bounded here by 15%.
    x = jnp.asarray(np.random.default_rng(3).normal(size=(256, 1024)), jnp.float32)
    run = jax.jit(lambda x, d: linalg.newton_schulz(x, coeffs, dtype=d), static_argnums=1)
    ours, reference = np.asarray(run(x, jnp.bfloat16), np.float64), np.asarray(run(x, None),
                                                                              np.float64)
    assert run(x, jnp.bfloat16).dtype == jnp.float32
    singular = np.linalg.svd(ours, compute_uv=False)
    assert band[0] < singular.min() and singular.max() < band[1], singular[[0, -1]]
    assert np.linalg.norm(ours - reference) / np.linalg.norm(reference) < 0.15
    jaxpr = str(jax.make_jaxpr(lambda x: linalg.newton_schulz(x, coeffs, dtype=jnp.bfloat16))(x))
    assert "bf16[256,256]" in jaxpr and "dot_general" in jaxpr  # X X^H in bfloat16


@pytest.mark.parametrize("name", ["muon", "normuon", "adamuon"])
def test_muon_family_runs_newton_schulz_in_ns_dtype(name):
    build = getattr(functrain.contrib, name)
    params = {"w": jnp.ones((8, 16)), "b": jnp.ones(16)}
    for ns_dtype, expected in ((None, False), (jnp.bfloat16, True)):
        opt = build(1e-2, ns_dtype=ns_dtype)
        jaxpr = str(jax.make_jaxpr(opt.update)(params, opt.init(params), params))
        assert ("bf16[1,8,8]" in jaxpr) == expected, (name, ns_dtype)
        updates, _ = opt.update(params, opt.init(params), params)
        assert updates["w"].dtype == jnp.float32


@pytest.mark.parametrize("kwargs, match", [
    (dict(ns_dtype="int8"), r"ns_dtype must be a floating dtype \(jnp.bfloat16, say\) or None, "
                            r"got 'int8'"),
    (dict(ns_dtype=jnp.bfloat16, ns_method="gram"), r"ns_method='gram' runs in the updates' "
                                                    r"dtype only"),
])
def test_ns_dtype_errors(kwargs, match):
    for build in (functrain.contrib.muon, functrain.contrib.normuon, functrain.contrib.adamuon):
        with pytest.raises(ValueError, match=match):
            build(1e-2, **kwargs)
    with pytest.raises(ValueError, match="newton_schulz: method='gram' runs in x's dtype only"):
        linalg.newton_schulz(jnp.ones((2, 3)), method="gram", ns_steps=4, dtype=jnp.bfloat16)
