"""functrain.contrib's modifiers for any optimizer: cautious, cautious_adamw, cautious_lion,
mars_correction, palm_beta2_schedule, trust_region_clip, and Cautious Weight Decay
(``add_decayed_weights(cautious=True)``, the ``cautious_weight_decay=`` option of the
decoupled-decay optimizers); no optax counterpart.

Compared with: the papers' pseudo-code in numpy float64 (C-AdamW and C-Lion: Liang et al.,
2024, Algorithm 2, with the authors' scale ``size / (kept + 1)`` per array; the MARS
correction: Yuan et al., 2024, Algorithm 1, approximate variant, feeding Lion), and, for
``cautious(optimizer)`` on adam, adamw, lion, sgd, soap and muon, the caution written in
numpy applied to the updates of the same optimizer run alone on the same gradients (the
caution does not touch the state, so the two runs see the same inner trajectory).
Cautious Weight Decay: Chen et al., 2025 (arXiv 2510.12402), ``x <- x - lr * (u + wd * I(u * x
>= 0) * x)``, in numpy float64 for AdamW and Lion, and for every optimizer with the option as
that rule applied to the same optimizer's decay-free direction at the same params.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import (MarsCorrectionState, cautious, cautious_adamw, cautious_lion,
                               mars_correction, palm_beta2_schedule)
from functrain.jax_compat import enable_x64

STEPS = 12


def np_caution(u, g, descent_sign):
    agree = (u * g * descent_sign) > 0
    return np.where(agree, u * agree.size / (agree.sum() + 1.0), 0.0)


def _problem(seed=0, shapes=(("w", (6, 4)), ("b", (4,)))):
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(s) for k, s in shapes}
    grads = [{k: rng.standard_normal(s) * 10.0 ** rng.uniform(-1, 1) for k, s in shapes}
             for _ in range(STEPS)]
    return params, grads


def _run(opt, params, grads):
    @jax.jit
    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return functrain.apply_updates(p, u), s, u

    state, p, us = opt.init(params), params, []
    for g in grads:
        p, state, u = step(p, state, g)
        us.append(jax.tree.map(np.asarray, u))
    return p, state, us


def np_decay(wd, u, p, cautious_decay):
    """The paper's decay term: ``wd * p``, or with CWD ``wd * I(u * p >= 0) * p``."""
    return wd * p * (u * p >= 0) if cautious_decay else wd * p


def ref_adamw(params, grads, lr, b1, b2, eps, wd, caution, cautious_decay=False):
    p = {k: np.array(v) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, g in enumerate(grads, start=1):
        for k in p:
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
            d = (m[k] / (1 - b1 ** t)) / (np.sqrt(v[k] / (1 - b2 ** t)) + eps)
            if caution:
                d = np_caution(d, g[k], 1.0)
            p[k] = p[k] - lr * (d + np_decay(wd, d, p[k], cautious_decay))
    return p


def ref_lion(params, grads, lr, b1, b2, wd, caution, mars=None, cautious_decay=False):
    p = {k: np.array(v) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    prev = {k: np.zeros_like(v) for k, v in p.items()}
    for g in grads:
        for k in p:
            c = g[k]
            if mars is not None:
                gamma, mb1, max_norm = mars
                c = g[k] + gamma * mb1 / (1 - mb1) * (g[k] - prev[k])
                norm = np.linalg.norm(c)
                if max_norm is not None and norm > max_norm:
                    c = c * max_norm / norm
                prev[k] = g[k]
            d = np.sign(b1 * m[k] + (1 - b1) * c)
            m[k] = b2 * m[k] + (1 - b2) * c
            if caution:
                d = np_caution(d, c, 1.0)
            p[k] = p[k] - lr * (d + np_decay(wd, d, p[k], cautious_decay))
    return p


def test_cautious_adamw_matches_the_papers_algorithm():
    with enable_x64(True):
        params, grads = _problem()
        p, state, _ = _run(cautious_adamw(1e-2, weight_decay=0.1), params, grads)
        ref = ref_adamw(params, grads, 1e-2, 0.9, 0.999, 1e-8, 0.1, caution=True)
        for k in params:
            np.testing.assert_allclose(p[k], ref[k], rtol=1e-12, atol=1e-14)
        plain = ref_adamw(params, grads, 1e-2, 0.9, 0.999, 1e-8, 0.1, caution=False)
        assert not np.allclose(plain["w"], ref["w"])  # the caution changed something
        # the state is adamw's, field for field
        assert jax.tree.structure(state) == jax.tree.structure(
            functrain.adamw(1e-2, weight_decay=0.1).init(params))


def test_cautious_lion_matches_the_papers_algorithm():
    with enable_x64(True):
        params, grads = _problem(1)
        p, _, _ = _run(cautious_lion(1e-3, weight_decay=0.5), params, grads)
        ref = ref_lion(params, grads, 1e-3, 0.9, 0.99, 0.5, caution=True)
        for k in params:
            np.testing.assert_allclose(p[k], ref[k], rtol=1e-12, atol=1e-14)


def test_mars_correction_in_front_of_lion_matches_the_paper():
    with enable_x64(True):
        params, grads = _problem(2)
        opt = functrain.chain(mars_correction(gamma=0.05, b1=0.9, max_norm=2.0),
                              functrain.lion(1e-3, weight_decay=0.1))
        p, state, _ = _run(opt, params, grads)
        ref = ref_lion(params, grads, 1e-3, 0.9, 0.99, 0.1, caution=False,
                       mars=(0.05, 0.9, 2.0))
        for k in params:
            np.testing.assert_allclose(p[k], ref[k], rtol=1e-12, atol=1e-14)
        assert isinstance(state[0], MarsCorrectionState)
        np.testing.assert_array_equal(state[0].prev_grad["w"], grads[-1]["w"])


def test_mars_correction_off_is_the_gradient():
    params, grads = _problem(3)
    params = {k: v.astype(np.float32) for k, v in params.items()}
    ours = _run(functrain.chain(mars_correction(gamma=0.0, max_norm=None),
                                functrain.adam(1e-2)), params, grads)[2]
    alone = _run(functrain.adam(1e-2), params, grads)[2]
    for a, b in zip(ours, alone):
        np.testing.assert_allclose(a["w"], b["w"], rtol=1e-6, atol=1e-8)


INNER = {
    "adam": lambda: functrain.adam(1e-2),
    "adamw": lambda: functrain.adamw(1e-2, weight_decay=0.1),
    "lion": lambda: functrain.lion(1e-3),
    "sgd": lambda: functrain.sgd(1e-2, momentum=0.9),
    "soap": lambda: functrain.contrib.soap(3e-3, precondition_frequency=2),
    "muon": lambda: functrain.contrib.muon(1e-2),
}


@pytest.mark.parametrize("name", sorted(INNER))
def test_cautious_wraps_any_optimizer(name):
    """cautious(opt)'s updates are the numpy caution of opt's own updates, step by step."""
    with enable_x64(True):
        params, grads = _problem(4, shapes=(("w", (8, 6)), ("b", (6,))))
        _, state, ours = _run(cautious(INNER[name]()), params, grads)
        # the same optimizer alone, jitted, along the *cautioned* trajectory of params
        inner = INNER[name]()
        step = jax.jit(inner.update)
        s, p = inner.init(params), params
        for t, (g, u_ours) in enumerate(zip(grads, ours)):
            u, s = step(g, s, p)
            for k in params:
                np.testing.assert_allclose(u_ours[k], np_caution(np.asarray(u[k]), g[k], -1.0),
                                           rtol=1e-9, atol=1e-12, err_msg=f"{name} {k} {t}")
            p = functrain.apply_updates(p, u_ours)
        assert jax.tree.structure(state) == jax.tree.structure(INNER[name]().init(params))


def np_mars_gradients(grads, gamma, b1, max_norm):
    """Yuan et al. (2024), Algorithm 1's corrected gradient per step and leaf, in numpy."""
    prev, out = {k: np.zeros_like(v) for k, v in grads[0].items()}, []
    for g in grads:
        c = {}
        for k in g:
            c[k] = g[k] + gamma * b1 / (1 - b1) * (g[k] - prev[k])
            norm = np.linalg.norm(c[k])
            if max_norm is not None and norm > max_norm:
                c[k] = c[k] * max_norm / norm
        prev = g
        out.append(c)
    return out


@pytest.mark.parametrize("name", sorted(INNER))
def test_mars_correction_composes(name):
    """chain(mars_correction(), opt) is opt alone fed the corrected gradients.

    The corrected gradients are mars_correction's own (equal to the numpy algorithm to
    1e-12), fed bit for bit: SOAP's eigenbasis of rank-deficient first statistics is
    arbitrary in its null space, so an ulp of difference in its input changes its path.
    """
    with enable_x64(True):
        params, grads = _problem(5, shapes=(("w", (8, 6)), ("b", (6,))))
        p, state, _ = _run(functrain.chain(mars_correction(), INNER[name]()), params, grads)
        _, _, corrected = _run(mars_correction(), params, grads)
        for c, c_np in zip(corrected, np_mars_gradients(grads, 0.025, 0.95, 1.0)):
            for k in params:
                np.testing.assert_allclose(c[k], c_np[k], rtol=1e-12, atol=1e-14)
        want, _, _ = _run(INNER[name](), params, corrected)
        for k in params:
            np.testing.assert_allclose(p[k], want[k], rtol=1e-9, atol=1e-12, err_msg=name)
        assert not np.allclose(p["w"], _run(INNER[name](), params, grads)[0]["w"])


def np_trust_region_clip(u, lerp, scale):
    """HeavyBall's trust_region_clip_, from its description, in numpy."""
    x = u / scale
    soft = lerp * np.tanh(x) + (1 - lerp) * np.sign(x) * np.log1p(np.abs(x))
    return np.clip(scale * soft, -2.0, 2.0)


@pytest.mark.parametrize("lerp,scale", [(0.9, 1.5), (0.0, 0.5), (1.0, 3.0)])
def test_trust_region_clip_matches_numpy(lerp, scale):
    u = np.concatenate([np.linspace(-50, 50, 101), np.geomspace(1e-6, 1e3, 20)])
    with enable_x64(True):
        tx = functrain.contrib.trust_region_clip(lerp, scale)
        got = tx.update({"u": jnp.asarray(u)}, tx.init({"u": jnp.asarray(u)}))[0]["u"]
    np.testing.assert_allclose(got, np_trust_region_clip(u, lerp, scale), rtol=1e-12,
                               atol=1e-15)
    assert np.all(np.abs(got) <= 2.0) and np.all(np.sign(got) == np.sign(u))


@pytest.mark.parametrize("name", sorted(INNER))
def test_trust_region_clip_composes(name):
    """chain(opt, trust_region_clip()) clips opt's own updates (run alone on the same params)."""
    with enable_x64(True):
        params, grads = _problem(6, shapes=(("w", (8, 6)), ("b", (6,))))
        scaled = [{k: 100.0 * v for k, v in g.items()} for g in grads[:4]]
        opt = functrain.chain(INNER[name](), functrain.contrib.trust_region_clip())
        _, _, ours = _run(opt, params, scaled)
        inner = INNER[name]()
        step, s, p = jax.jit(inner.update), inner.init(params), params
        for t, (g, u_ours) in enumerate(zip(scaled, ours)):
            u, s = step(g, s, p)
            for k in params:
                np.testing.assert_allclose(u_ours[k], np_trust_region_clip(
                    np.asarray(u[k]), 0.9, 1.5), rtol=1e-9, atol=1e-12, err_msg=f"{name} {t}")
            p = functrain.apply_updates(p, u_ours)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="mars_correction: max_norm must be > 0"):
        mars_correction(max_norm=0.0)
    with pytest.raises(ValueError, match="mars_correction: b1 must be in"):
        mars_correction(b1=1.0)
    with pytest.raises(TypeError, match="cautious"):
        cautious("adam")
    with pytest.raises(ValueError, match="trust_region_clip: lerp"):
        functrain.contrib.trust_region_clip(lerp=1.5)
    with pytest.raises(ValueError, match="trust_region_clip: scale"):
        functrain.contrib.trust_region_clip(scale=0.0)
    tx = functrain.contrib.trust_region_clip()
    with pytest.raises(TypeError, match="trust_region_clip"):
        tx.update({"z": jnp.ones(2, jnp.complex64)}, tx.init({"z": jnp.ones(2, jnp.complex64)}))


def ref_adam_palm(params, grads, lr, b1, exponent, eps):
    """Adam with PaLM's b2_t = 1 - t**-exponent and no second-moment bias correction."""
    p = {k: np.array(v) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, g in enumerate(grads, start=1):
        b2 = 1.0 - t ** (-exponent)
        for k in p:
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
            p[k] = p[k] - lr * (m[k] / (1 - b1 ** t)) / (np.sqrt(v[k]) + eps)
    return p


@pytest.mark.parametrize("build", [
    lambda b2: functrain.adam(1e-2, b2=b2),
    lambda b2: functrain.adamw(1e-2, b2=b2, weight_decay=0.0),
    lambda b2: functrain.chain(functrain.scale_by_adam(b2=b2), functrain.scale(-1e-2)),
], ids=["adam", "adamw", "scale_by_adam"])
def test_palm_beta2_schedule_in_adam_matches_numpy(build):
    with enable_x64(True):
        params, grads = _problem(6)
        p, _, _ = _run(build(palm_beta2_schedule()), params, grads)
        ref = ref_adam_palm(params, grads, 1e-2, 0.9, 0.8, 1e-8)
        for k in params:
            np.testing.assert_allclose(p[k], ref[k], rtol=1e-10)  # b2_t is float64 too


def test_palm_beta2_schedule_keeps_float64_under_x64():
    # As optax's schedules for a Python or int64 count: float64 numbers under x64, weakly
    # typed like a Python-float b2 so float32 moments stay float32; a float count keeps
    # its dtype. The value is checked against 1 - t**-0.8 in Python floats.
    with enable_x64(True):
        b2 = palm_beta2_schedule()
        for count, weak_type in ((7, True), (np.int64(7), True), (7.0, True),
                                 (jnp.asarray(7, jnp.int32), True),
                                 (jnp.asarray(7, jnp.int64), True),
                                 (jnp.asarray(7.0, jnp.float64), False)):
            rate, correction = b2(count), b2.bias_correction(count)
            assert rate.dtype == correction.dtype == jnp.float64, repr(count)
            assert rate.weak_type == weak_type, repr(count)
            assert float(rate) == pytest.approx(1.0 - 7.0 ** -0.8, rel=1e-15)
            assert float(correction) == 1.0
        assert b2(jnp.asarray(7.0, jnp.float32)).dtype == jnp.float32
        assert b2(jnp.asarray(7.0, jnp.bfloat16)).dtype == jnp.bfloat16
        opt = functrain.adam(1e-2, b2=b2)
        params = {"w": jnp.ones(3, jnp.float32)}
        state = opt.init(params)
        for _ in range(2):
            updates, state = opt.update(params, state, params)
        assert updates["w"].dtype == state[0].nu["w"].dtype == jnp.float32
    assert palm_beta2_schedule()(jnp.asarray(7, jnp.int32)).dtype == jnp.float32  # no x64


def test_palm_beta2_schedule_reaches_the_other_adam_stages():
    params, grads = _problem(7)
    params = {k: v.astype(np.float32) for k, v in params.items()}
    for build in (functrain.amsgrad, functrain.adabelief, functrain.lamb, functrain.nadam,
                  functrain.contrib.laprop):
        ours = _run(build(1e-2, b2=palm_beta2_schedule()), params, grads)[2]
        const = _run(build(1e-2, b2=0.999), params, grads)[2]
        assert np.all(np.isfinite(ours[-1]["w"]))
        assert not np.allclose(ours[1]["w"], const[1]["w"]), build  # the schedule is used


def test_a_plain_schedule_is_refused_as_b2():
    with pytest.raises(TypeError, match="adam: b2 takes a number or a decay-rate schedule"):
        functrain.adam(1e-3, b2=lambda t: 0.99)
    with pytest.raises(ValueError, match="exponent must be > 0"):
        palm_beta2_schedule(0.0)


def test_palm_beta2_schedule_reaches_muons_adamw():
    """muon's adam_b2 takes the schedule: its AdamW leaves (no Nesterov) follow numpy."""
    with enable_x64(True):
        params, grads = _problem(7, shapes=(("b", (6,)), ("c", (3,))))
        b2 = palm_beta2_schedule()
        got, _, _ = _run(functrain.contrib.muon(1e-2, adam_b2=b2, nesterov=False), params,
                         grads)
        ref = ref_adam_palm(params, grads, 1e-2, 0.9, 0.8, 1e-8)
        for k in params:
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-6, err_msg=k)


# --------------------------------------------------------------------------
# Cautious Weight Decay (Chen et al., 2025)
# --------------------------------------------------------------------------

def test_cautious_decay_by_hand_real_complex_masked_and_scheduled():
    """``u + wd * I(u * p >= 0) * p`` entry by entry (a zero update counts as agreeing, as
    the paper's ``>=``); complex leaves use ``Re(u * conj(p))``; the mask and a schedule act
    as on the plain decay."""
    p = {"w": jnp.array([1.0, -1.0, 2.0, -2.0, 3.0]), "b": jnp.array([1.0, 1.0])}
    u = {"w": jnp.array([1.0, 1.0, -1.0, -1.0, 0.0]), "b": jnp.array([-1.0, 1.0])}
    tx = functrain.add_decayed_weights(0.5, cautious=True)
    got = tx.update(u, tx.init(p), p)[0]
    np.testing.assert_array_equal(got["w"], [1.5, 1.0, -1.0, -2.0, 1.5])
    np.testing.assert_array_equal(got["b"], [-1.0, 1.5])
    masked = functrain.add_decayed_weights(0.5, mask={"w": False, "b": True}, cautious=True)
    got = masked.update(u, masked.init(p), p)[0]
    np.testing.assert_array_equal(got["w"], u["w"])
    np.testing.assert_array_equal(got["b"], [-1.0, 1.5])
    sched = functrain.add_decayed_weights(lambda c: 0.25 * (c + 1), cautious=True)
    state = sched.init(p)
    _, state = sched.update(u, state, p)
    np.testing.assert_array_equal(sched.update(u, state, p)[0]["w"], [1.5, 1.0, -1.0, -2.0, 1.5])
    # complex: (1+1j) * conj(1-1j) = 2j: real part 0, kept; (1+0j) * conj(-1+0j) = -1: dropped
    pc = [jnp.array([1 - 1j, -1 + 0j])]
    uc = [jnp.array([1 + 1j, 1 + 0j])]
    got = functrain.add_decayed_weights(1.0, cautious=True).update(uc, None, pc)[0][0]
    np.testing.assert_array_equal(got, [2 + 0j, 1 + 0j])


def test_cautious_weight_decay_adamw_and_lion_match_the_paper():
    with enable_x64(True):
        params, grads = _problem(4)
        for opt, ref in [
                (functrain.adamw(1e-2, weight_decay=0.3, cautious_weight_decay=True),
                 ref_adamw(params, grads, 1e-2, 0.9, 0.999, 1e-8, 0.3, False, True)),
                (functrain.lion(1e-3, weight_decay=2.0, cautious_weight_decay=True),
                 ref_lion(params, grads, 1e-3, 0.9, 0.99, 2.0, False, cautious_decay=True)),
                (cautious_adamw(1e-2, weight_decay=0.3, cautious_weight_decay=True),
                 ref_adamw(params, grads, 1e-2, 0.9, 0.999, 1e-8, 0.3, True, True))]:
            p, _, _ = _run(opt, params, grads)
            for k in params:
                np.testing.assert_allclose(p[k], ref[k], rtol=1e-12, atol=1e-14)
        # the mask did something: the plain decay lands elsewhere
        plain = ref_adamw(params, grads, 1e-2, 0.9, 0.999, 1e-8, 0.3, False, False)
        cwd = ref_adamw(params, grads, 1e-2, 0.9, 0.999, 1e-8, 0.3, False, True)
        assert np.abs(plain["w"] - cwd["w"]).max() > 1e-4


def test_cautious_weight_decay_lamb_decays_before_the_trust_ratio():
    """LAMB's direction is Adam's plus the decay, then the layer's trust ratio ``||p|| /
    ||d||`` (1 where either norm is 0): the caution acts on Adam's direction, before it."""
    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.999, 1e-6, 0.5
    with enable_x64(True):
        params, grads = _problem(5)
        p, _, _ = _run(functrain.lamb(lr, weight_decay=wd, cautious_weight_decay=True),
                       params, grads)
        ref = {k: np.array(v) for k, v in params.items()}
        m = {k: np.zeros_like(v) for k, v in ref.items()}
        v = {k: np.zeros_like(x) for k, x in ref.items()}
        for t, g in enumerate(grads, start=1):
            for k in ref:
                m[k] = b1 * m[k] + (1 - b1) * g[k]
                v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
                r = (m[k] / (1 - b1 ** t)) / (np.sqrt(v[k] / (1 - b2 ** t)) + eps)
                d = r + np_decay(wd, r, ref[k], True)
                pn, dn = np.linalg.norm(ref[k]), np.linalg.norm(d)
                ref[k] = ref[k] - lr * (pn / dn if pn > 0 and dn > 0 else 1.0) * d
        for k in params:
            np.testing.assert_allclose(p[k], ref[k], rtol=1e-12, atol=1e-14)


def _cwd_optimizers() -> list:
    """Every registry optimizer with a ``cautious_weight_decay`` option (less LAMB, whose
    trust ratio comes after the decay: its own test above)."""
    import registry
    return sorted(name for name, record in registry.REGISTRY.items()
                  if record.factory(functrain) is not None and name != "lamb"
                  and "cautious_weight_decay" in inspect.signature(
                      record.factory(functrain)).parameters)


_DECAYS = ("weight_decay", "adam_weight_decay", "scalar_weight_decay")


@pytest.mark.parametrize("name", _cwd_optimizers())
def test_every_decoupled_decay_applies_the_papers_rule(name):
    """At each step, the cautious update is the decay-free update ``B`` plus the plain decay's
    term ``D - B`` (``D``: the same optimizer with the plain decay) kept only where the paper's
    indicator ``I(u * p >= 0)`` holds, ``u = -B`` the step's direction: the three run beside
    each other on the same gradients and are fed the same params (a decoupled decay leaves
    the state alone). The decay term is ``-lr * wd * p`` times any factor the optimizer
    applies after it (SPlus's shape scale), which this form does not need to know."""
    import registry
    record = registry.REGISTRY[name]
    factory = record.factory(functrain)
    accepted = inspect.signature(factory).parameters
    lr, wd = 1e-2, 0.7
    decays = [d for d in _DECAYS if d in accepted]
    kwargs = {k: v for k, v in record.args.items() if k not in decays} | {"learning_rate": lr}
    with enable_x64(True):
        params = {"w": jnp.asarray(np.random.default_rng(6).standard_normal((6, 4))),
                  "b": jnp.asarray(np.random.default_rng(7).standard_normal(4))}
        loss_fn = lambda q: 0.5 * sum(jnp.sum(x * x) for x in jax.tree.leaves(q))
        extra = record.update_kwargs(loss_fn, params)
        opts = [factory(**kwargs, **{d: wd for d in decays}, cautious_weight_decay=True),
                factory(**kwargs, **{d: wd for d in decays}),
                factory(**kwargs, **{d: 0.0 for d in decays})]
        states = [o.init(params) for o in opts]
        step = jax.jit(lambda o, g, s, p: o.update(g, s, p, **extra), static_argnums=0)
        rng = np.random.default_rng(8)
        masked = 0
        for _ in range(6):
            g = {k: jnp.asarray(rng.standard_normal(v.shape)) for k, v in params.items()}
            (got, decayed, base), states = zip(*[step(o, g, s, params)
                                                 for o, s in zip(opts, states)])
            for k in params:
                b, d, p = (np.asarray(t[k]) for t in (base, decayed, params))
                term = d - b
                assert np.any(term) or not np.any(b), f"{name}: the decay did nothing"
                want = b + np.where(-b * p >= 0, term, 0.0)
                scale = np.abs(d).max()
                np.testing.assert_allclose(got[k], want, rtol=1e-9, atol=1e-12 * scale,
                                           err_msg=f"{name}: leaf {k}")
                masked += int(np.sum((-b * p < 0) & (term != 0)))
            params = functrain.apply_updates(params, got)
        assert masked, f"{name}: the caution never masked a decay"


def test_cautious_weight_decay_keeps_the_losss_minimizer():
    """The paper's point: plain decoupled decay settles where the step balances the decay (a
    shrunk solution), cautious decay on a stationary point of the loss itself. Least squares
    with a mixed-sign minimizer ``x*``, AdamW with a cosine learning rate to zero: CWD ends
    100x closer to ``x*`` than the plain decay, which ends shrunk towards 0."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((20, 8))
    x_star = rng.standard_normal(8) * 2
    b = a @ x_star
    loss = lambda x: 0.5 * jnp.sum((a @ x - b) ** 2)
    with enable_x64(True):
        def train(cautious):
            sched = functrain.cosine_decay_schedule(3e-2, 4000)
            opt = functrain.adamw(sched, weight_decay=0.1, cautious_weight_decay=cautious)
            x = jnp.zeros(8)

            def body(_, carry):
                x, s = carry
                u, s = opt.update(jax.grad(loss)(x), s, x)
                return functrain.apply_updates(x, u), s

            return np.asarray(jax.lax.fori_loop(0, 4000, body, (x, opt.init(x)))[0])

        plain, cwd = train(False), train(True)
    assert np.linalg.norm(plain) < np.linalg.norm(x_star)  # shrunk
    assert np.linalg.norm(cwd - x_star) * 100 < np.linalg.norm(plain - x_star), (
        np.linalg.norm(cwd - x_star), np.linalg.norm(plain - x_star))


def test_cautious_weight_decay_under_inject_hyperparams_and_bad_flags():
    params = {"w": jnp.array([1.0, -2.0]), "b": jnp.array([0.5])}
    grads = {"w": jnp.array([0.3, 0.4]), "b": jnp.array([-1.0])}
    plain = functrain.adamw(0.1, weight_decay=0.5, cautious_weight_decay=True)
    injected = functrain.inject_hyperparams(functrain.adamw)(
        learning_rate=0.1, weight_decay=0.5, cautious_weight_decay=True)
    want = plain.update(grads, plain.init(params), params)[0]
    got = injected.update(grads, injected.init(params), params)[0]
    for k in params:  # a traced learning rate rounds Adam's bias corrections otherwise
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5)
    with pytest.raises(TypeError, match="cautious must be a bool, got str"):
        functrain.add_decayed_weights(0.1, cautious="yes")


def test_every_optimizer_with_the_option_rejects_a_flag_that_is_not_a_bool():
    """Also where the decay is zero and its stage is left out (adam_accumulation's)."""
    import functrain.declarations as declarations
    required = {"adam_accumulation": {"num_micro_batches": 2},
                "muon_clip": {"qk_layers": []}}
    having = [name for name, d in declarations.OPTIMIZERS.items()
              if "cautious_weight_decay" in inspect.signature(d.function).parameters]
    assert len(having) == 32
    for name in having:
        fn = declarations.OPTIMIZERS[name].function
        with pytest.raises(TypeError, match="cautious"):
            fn(0.1, cautious_weight_decay="yes", **required.get(name, {}))
        if "weight_decay" in inspect.signature(fn).parameters:
            with pytest.raises(TypeError, match="cautious"):
                fn(0.1, weight_decay=0.0, cautious_weight_decay=1, **required.get(name, {}))


def test_the_docs_count_the_optimizers_with_the_option():
    """docs/optimizers.md and the README say how many optimizers take
    ``cautious_weight_decay``: the counts are the package's."""
    import pathlib
    import functrain.declarations as declarations
    having = [name for name, d in declarations.OPTIMIZERS.items()
              if "cautious_weight_decay" in inspect.signature(d.function).parameters]
    contrib = [name for name in having if declarations.OPTIMIZERS[name].contrib]
    root = pathlib.Path(__file__).resolve().parents[2]
    docs = " ".join((root / "docs" / "optimizers.md").read_text().split())
    assert f"lion and {len(contrib)} in `functrain.contrib`" in docs
    assert f"of the {len(having)} against the rule" in docs
    assert f"on all {len(having)} decoupled-decay optimizers" in (root / "README.md").read_text()
