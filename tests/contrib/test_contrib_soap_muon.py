"""functrain.contrib.soap_muon / scale_by_soap_muon (no optax counterpart).

Compared with: the rule of modded-nanogpt's record #46 (``Muon.step`` on its default path:
``soap_precondition_momentum``, ``soap_update_preconditioner``, ``muon_update``) written out
in numpy float64 with numpy's ``eigh`` and ``qr``, for weights in torch's ``(out, in)``
layout (the test transposes functrain's ``(in, out)`` weights, so the statistics' sides and
the width factor are checked, not assumed), Keller Jordan's Newton-Schulz, decoupled
(cautious) weight decay, and AdamW on the leaves SOAP-Muon does not take; 15 steps on a
tree with a 2-D weight, a stacked ``(layers, in, out)`` leaf and a bias. Eigenvectors'
signs are arbitrary, and the preconditioned momentum ``Q_L (X / sqrt(V)) Q_R^T`` does not
depend on them, so the params are compared; the matrices' sides differ by at most one, so
every eigenvalue (zero included) is simple and the bases are unique up to those signs.
Plus: the first step is Muon's, inject_hyperparams, jit against eager, bfloat16, init
from shapes, training on least squares, and the argument errors.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import (MuonDimensionNumbers, SoapMuonState, scale_by_muon,
                               scale_by_soap_muon, soap_muon)
from functrain.jax_compat import enable_x64
from muon_family_reference import MUON_COEFFS, run_jitted

STEPS = 15
SPEC = {"w": MuonDimensionNumbers(0, 1), "stack": MuonDimensionNumbers(-2, -1), "b": None}


def problem(dtype=np.float64, steps=STEPS):
    """muon_family_reference's problem with a (5, 4) matrix: sides differing by one."""
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((5, 4)), "stack": rng.standard_normal((3, 4, 5)),
              "b": rng.standard_normal(5)}
    grads = [{k: rng.standard_normal(np.shape(v)) * 10.0 ** rng.uniform(-1, 1)
              for k, v in params.items()} for _ in range(steps)]
    cast = lambda t: {k: jnp.asarray(v, dtype) for k, v in t.items()}
    return cast(params), [cast(g) for g in grads]


# --------------------------------------------------------------------------
# The reference: the record's rule in numpy float64
# --------------------------------------------------------------------------

def np_newton_schulz(m, eps, coeffs=MUON_COEFFS, steps=5):
    a, b, c = coeffs
    x = m.T if m.shape[0] > m.shape[1] else m
    x = x / (np.linalg.norm(x) + eps)
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if m.shape[0] > m.shape[1] else x


class RefSoapMuonMatrix:
    """One hidden matrix of the record's Muon with SOAP, in torch's (out, in) layout."""

    def __init__(self, shape, beta, b2, eps, freq, nesterov):
        rows, cols = shape
        self.mom, self.v = np.zeros(shape), np.zeros(shape)
        self.row_gg, self.col_gg = np.zeros((rows, rows)), np.zeros((cols, cols))
        self.q_row = self.q_col = None
        self.soap_step = 0
        self.beta, self.b2, self.eps, self.freq, self.nesterov = beta, b2, eps, freq, nesterov

    def _precondition(self, m):  # soap_precondition_momentum (SOAP_KL, SHAMPOO_MODE off)
        if self.q_row is None:
            return m
        x = self.q_row.T @ m @ self.q_col
        self.v = self.b2 * self.v + (1 - self.b2) * x ** 2
        p = self.q_row @ (x / np.sqrt(np.maximum(self.v, self.eps ** 2))) @ self.q_col.T
        return p * np.linalg.norm(m) / np.linalg.norm(p)

    def _update_preconditioner(self, g):  # soap_update_preconditioner
        self.row_gg = self.b2 * self.row_gg + (1 - self.b2) * g @ g.T
        self.col_gg = self.b2 * self.col_gg + (1 - self.b2) * g.T @ g
        if self.q_row is None:
            self.q_row = np.linalg.eigh(self.row_gg)[1][:, ::-1]
            self.q_col = np.linalg.eigh(self.col_gg)[1][:, ::-1]
        elif self.soap_step > 0 and self.soap_step % self.freq == 0:  # soap_basis_qr
            order = np.argsort(-np.diag(self.q_row.T @ self.row_gg @ self.q_row))
            self.v = self.v[order]
            self.q_row = np.linalg.qr(self.row_gg @ self.q_row[:, order])[0]
            order = np.argsort(-np.diag(self.q_col.T @ self.col_gg @ self.q_col))
            self.v = self.v[:, order]
            self.q_col = np.linalg.qr(self.col_gg @ self.q_col[:, order])[0]
        self.soap_step += 1

    def direction(self, g):
        self.mom = self.mom + (1 - self.beta) * (g - self.mom)  # momentum.lerp_(g, 1 - mu)
        m = g + self.beta * (self.mom - g) if self.nesterov else self.mom  # g.lerp(mom, mu)
        o = np_newton_schulz(self._precondition(m), self.eps)
        self._update_preconditioner(g)
        return o * max(1.0, g.shape[-2] / g.shape[-1]) ** 0.5  # muon_update's aspect scale


def np_adamw(p, g, m, v, t, lr, b1, b2, eps, wd, nesterov, cautious):
    m[...] = b1 * m + (1 - b1) * g
    v[...] = b2 * v + (1 - b2) * g * g
    mh = (b1 * m / (1 - b1 ** (t + 1)) + (1 - b1) * g / (1 - b1 ** t) if nesterov
          else m / (1 - b1 ** t))
    u = mh / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return p - lr * (u + wd * _decay_mask(u, p, cautious) * p)


def _decay_mask(u, p, cautious):
    return (u * p >= 0) if cautious else np.ones_like(p)


def ref_soap_muon(params, grads, lr, beta=0.95, b2=0.9, eps=1e-8, freq=1, wd=0.0,
                  adam_lr=None, adam_b1=0.9, adam_b2=0.999, adam_wd=0.0, nesterov=True,
                  cautious=False):
    """SOAP-Muon on 'w' and each layer of 'stack' (functrain's (in, out) weights, transposed
    to torch's (out, in)), AdamW on 'b'; the params after every step."""
    p = {k: np.array(v, np.float64) for k, v in params.items()}
    layers = {"w": [p["w"]], "stack": list(p["stack"])}
    mats = {(k, i): RefSoapMuonMatrix(x.T.shape, beta, b2, eps, freq, nesterov)
            for k, xs in layers.items() for i, x in enumerate(xs)}
    m1, m2 = np.zeros_like(p["b"]), np.zeros_like(p["b"])
    out = []
    for t, g in enumerate(grads, start=1):
        gn = {k: np.asarray(v, np.float64) for k, v in g.items()}
        for (k, i), ref in mats.items():
            w = p[k] if k == "w" else p[k][i]
            u = ref.direction((gn[k] if k == "w" else gn[k][i]).T).T  # back to (in, out)
            new = w - lr * (u + wd * _decay_mask(u, w, cautious) * w)
            if k == "w":
                p[k] = new
            else:
                p[k][i] = new
        p["b"] = np_adamw(p["b"], gn["b"], m1, m2, t, adam_lr or lr, adam_b1, adam_b2, eps,
                          adam_wd, nesterov, cautious)
        out.append({k: v.copy() for k, v in p.items()})
    return out


@pytest.mark.parametrize("kw", [
    dict(),
    dict(nesterov=False, freq=3, cautious=True, beta=0.9, b2=0.95),
], ids=["defaults", "plain-momentum-freq3-cautious"])
def test_matches_the_records_rule(kw):
    kw = dict(kw)
    freq, cautious = kw.pop("freq", 1), kw.pop("cautious", False)
    with enable_x64(True):
        params, grads = problem()
        opt = soap_muon(2e-2, weight_decay=0.1, adam_learning_rate=1e-2, adam_weight_decay=0.05,
                        precondition_frequency=freq, cautious_weight_decay=cautious,
                        muon_weight_dimension_numbers=SPEC, **kw)
        ours, state = run_jitted(opt, params, grads)
        ref = ref_soap_muon(params, grads, 2e-2, wd=0.1, adam_lr=1e-2, adam_wd=0.05, freq=freq,
                            cautious=cautious, **kw)
    # Rounding (1e-16) is amplified by the eigenbases' sensitivity (1 / eigengap) and the
    # element-wise division by sqrt(V): measured 7e-16 of each leaf's largest entry over the
    # 15 steps of both settings; checked entry-wise at 1e-9 (the margin for other BLAS).
    for t in range(STEPS):
        for k in params:
            np.testing.assert_allclose(np.asarray(ours[t][k]), ref[t][k], rtol=1e-9,
                                       atol=1e-12, err_msg=f"step {t} {k}")
    inner = state.inner_states["muon"].inner_state[0]
    assert isinstance(inner, SoapMuonState) and int(inner.count) == STEPS
    # Per matrix: L (in, in) and R (out, out), stacked over the layers.
    assert [s.shape for s in inner.stats["w"]] == [(5, 5), (4, 4)]
    assert [q.shape for q in inner.bases["stack"]] == [(3, 4, 4), (3, 5, 5)]
    assert inner.nu["stack"].shape == (3, 4, 5)


def test_first_step_is_muons():
    # Before any basis P = M; the record's momentum (no bias correction) and Muon's (bias-
    # corrected) are then both multiples of g, and Newton-Schulz normalizes (eps = 0).
    params, grads = problem(np.float32, steps=1)
    matrices = {k: params[k] for k in ("w", "stack")}
    for nesterov in (True, False):
        ours, theirs = (tx.update({k: grads[0][k] for k in matrices}, tx.init(matrices))[0]
                        for tx in (scale_by_soap_muon(eps=0.0, nesterov=nesterov),
                                   scale_by_muon(eps=0.0, nesterov=nesterov)))
        for k in matrices:
            np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-5, atol=1e-6)


def test_second_step_whitens_a_diagonal_gradient():
    # Hand-derived: a diagonal G with distinct entries has the coordinate axes as
    # eigenbases, and at step 2 nu = (1 - b2) X^2 (it was zero), so P = sign(M) / sqrt(1 -
    # b2) on the diagonal: all singular values equal, which Newton-Schulz keeps equal.
    g = {"w": jnp.diag(jnp.array([4.0, 1.0, 0.25]))}
    tx = scale_by_soap_muon()
    state = tx.init(g)
    _, state = tx.update(g, state)
    u, state = tx.update(g, state)
    d = np.diag(np.asarray(u["w"]))
    np.testing.assert_allclose(d, d[0], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(u["w"]) - np.diag(d), 0.0, atol=1e-6)
    np.testing.assert_allclose(np.abs(np.asarray(state.bases["w"][0])), np.eye(3), atol=1e-6)


def test_inject_hyperparams_and_jit_give_the_same_numbers():
    kw = dict(learning_rate=0.02, beta=0.9, b2=0.95, eps=1e-7, weight_decay=0.05,
              precondition_frequency=2, muon_weight_dimension_numbers=SPEC)
    with enable_x64(True):
        params, grads = problem(steps=6)
        want, _ = run_jitted(soap_muon(**kw), params, grads)
        got, state = run_jitted(functrain.inject_hyperparams(soap_muon)(**kw), params, grads)
        opt = soap_muon(**kw)  # eager
        s, p = opt.init(params), params
        for g in grads:
            u, s = opt.update(g, s, p)
            p = functrain.apply_updates(p, u)
    for k in params:
        np.testing.assert_allclose(got[-1][k], want[-1][k], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(p[k], want[-1][k], rtol=1e-9, atol=1e-12)
    assert set(state.hyperparams) >= {"learning_rate", "beta", "b2", "eps", "weight_decay"}
    assert "precondition_frequency" not in state.hyperparams  # static: a branch's period


def test_a_stacked_leaf_is_its_layers():
    # Layers on a middle axis (MuonDimensionNumbers(0, 2) on (4, 3, 5)): each keeps its own
    # statistics, bases and nu, the numbers of the three (4, 5) slices given as leaves.
    with enable_x64(True):
        rng = np.random.default_rng(3)
        grads = [jnp.asarray(rng.standard_normal((4, 3, 5))) for _ in range(5)]
        stacked = scale_by_soap_muon(precondition_frequency=2,
                                     weight_dimension_numbers=MuonDimensionNumbers(0, 2))
        apart = scale_by_soap_muon(precondition_frequency=2)
        slices = lambda g: {str(i): g[:, i, :] for i in range(3)}
        s1, s2 = stacked.init({"x": grads[0]}), apart.init(slices(grads[0]))
        for g in grads:
            u1, s1 = stacked.update({"x": g}, s1)
            u2, s2 = apart.update(slices(g), s2)
            for i in range(3):
                np.testing.assert_allclose(u1["x"][:, i, :], u2[str(i)], rtol=1e-12, atol=1e-14)
    assert [m.shape for m in s1.stats["x"]] == [(3, 4, 4), (3, 5, 5)]


def test_two_d_rule_bfloat16_and_init_from_shapes():
    # The default split (muon's): the 2-D leaf to SOAP-Muon, the 3-D one and the bias to AdamW.
    params, grads = problem(np.float32, steps=3)
    params = {k: v.astype(jnp.bfloat16) for k, v in params.items()}
    grads = [{k: v.astype(jnp.bfloat16) for k, v in g.items()} for g in grads]
    ours, state = run_jitted(soap_muon(1e-2), params, grads)
    assert all(ours[-1][k].dtype == jnp.bfloat16 for k in params)
    inner = state.inner_states["muon"].inner_state[0]
    assert isinstance(inner.nu["stack"], functrain.MaskedNode)
    assert inner.stats["w"][0].dtype == jnp.float32  # 16-bit leaves computed in float32
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    abstract = jax.eval_shape(soap_muon(1e-2, muon_weight_dimension_numbers=SPEC).init, shapes)
    assert abstract.inner_states["muon"].inner_state[0].stats["stack"][1].shape == (3, 5, 5)


def test_trains_a_least_squares_problem():
    # A descent check, not a race: on this deterministic problem Muon is faster (the
    # whitening lifts the rotated momentum's small entries to the size of the large ones);
    # measured 0.026 of the initial loss after 200 steps (Muon at its best rate: 0.0014).
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((64, 8)) * np.logspace(0, 1, 8), jnp.float32)
    y = x @ jnp.asarray(rng.standard_normal((8, 4)), jnp.float32)
    loss = lambda p: jnp.mean((x @ p["w"] + p["b"] - y) ** 2)
    params = {"w": jnp.zeros((8, 4)), "b": jnp.zeros(4)}
    opt = soap_muon(0.1, adam_learning_rate=1e-2)
    state = opt.init(params)

    @jax.jit
    def step(p, s):
        u, s = opt.update(jax.grad(loss)(p), s, p)
        return functrain.apply_updates(p, u), s

    first = float(loss(params))
    for _ in range(200):
        params, state = step(params, state)
    assert float(loss(params)) < 0.1 * first


def test_defaults_are_the_records():
    sig = inspect.signature(soap_muon).parameters
    assert (sig["beta"].default, sig["b2"].default, sig["eps"].default,
            sig["precondition_frequency"].default, sig["nesterov"].default,
            sig["weight_decay"].default, sig["cautious_weight_decay"].default) == (
        0.95, 0.9, 1e-8, 1, True, 0.0, False)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="soap_muon: b2 must be in"):
        soap_muon(1e-2, b2=1.0)
    with pytest.raises(ValueError, match="scale_by_soap_muon: beta must be in"):
        scale_by_soap_muon(beta=-0.1)
    with pytest.raises(ValueError, match="soap_muon: precondition_frequency must be >= 1"):
        soap_muon(1e-2, precondition_frequency=0)
    with pytest.raises(TypeError, match="soap_muon: precondition_frequency must be an int"):
        soap_muon(1e-2, precondition_frequency=2.5)
    with pytest.raises(TypeError, match="scale_by_soap_muon: ns_steps must be an int"):
        scale_by_soap_muon(ns_steps=5.0)
    with pytest.raises(ValueError, match="soap_muon: ns_coeffs preset 'nope' is unknown"):
        soap_muon(1e-2, ns_coeffs="nope")
    with pytest.raises(ValueError, match="scale_by_soap_muon: eps must be"):
        scale_by_soap_muon(eps=-1.0)
    with pytest.raises(TypeError, match="scale_by_soap_muon: nesterov must be a bool"):
        scale_by_soap_muon(nesterov="yes")
    with pytest.raises(TypeError, match="scale_by_soap_muon: weight_dimension_numbers"):
        scale_by_soap_muon(weight_dimension_numbers=(0, 1))
    with pytest.raises(ValueError, match=r"scale_by_soap_muon: leaf \['v'\] has shape \(3,\)"):
        scale_by_soap_muon().init({"v": jnp.ones(3)})
    with pytest.raises(TypeError, match=r"scale_by_soap_muon.*\['w'\]"):
        scale_by_soap_muon().init({"w": jnp.ones((2, 2), jnp.complex64)})
    tx = scale_by_soap_muon(weight_dimension_numbers={"w": MuonDimensionNumbers(0, 1),
                                                      "b": None})
    params = {"w": jnp.ones((3, 2)), "b": jnp.ones((2, 2))}
    with pytest.raises(ValueError, match=r"no MuonDimensionNumbers for leaf \['b'\]"):
        tx.update(params, tx.init(params))
    with pytest.raises(TypeError, match="scale_by_soap_muon"):
        scale_by_soap_muon().update(params, ())
    other = scale_by_soap_muon().init({"w": jnp.ones((2, 3)), "b": jnp.ones((2, 2))})
    with pytest.raises(ValueError, match=r"\['w'\] .* scale_by_soap_muon state .mu"):
        scale_by_soap_muon().update(params, other)
    state = scale_by_soap_muon().init(params)._replace(stats=other.stats)
    with pytest.raises(ValueError, match=r"scale_by_soap_muon: updates leaf \['w'\] needs "
                                         r"state .stats matrices of shapes \[\(3, 3\), \(2, 2\)\]"):
        scale_by_soap_muon().update(params, state)
