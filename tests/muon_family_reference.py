"""What the Muon family's test files share: Keller Jordan's Newton-Schulz written out in
numpy float64 (the references build on it), the test problem (a matrix, a stacked leaf and a
bias, with gradients over two decades) and the jitted run of an optimizer on it."""

import jax
import jax.numpy as jnp
import numpy as np

import functrain
from functrain.contrib import MuonDimensionNumbers

STEPS = 20
MUON_COEFFS = (3.4445, -4.7750, 2.0315)
SPEC = {"w": MuonDimensionNumbers(0, 1), "stack": MuonDimensionNumbers(-2, -1), "b": None}


def ns_reference(g, coeffs=MUON_COEFFS, steps=5):
    """Keller Jordan's zeropower_via_newtonschulz5, in float64."""
    a, b, c = coeffs
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / (np.linalg.norm(x) + 1e-7)
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if g.shape[0] > g.shape[1] else x


def problem(dtype=np.float64):
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((6, 4)), "stack": rng.standard_normal((3, 4, 5)),
              "b": rng.standard_normal(5)}
    grads = [{k: rng.standard_normal(np.shape(v)) * 10.0 ** rng.uniform(-1, 1)
              for k, v in params.items()} for _ in range(STEPS)]
    cast = lambda t: {k: jnp.asarray(v, dtype) for k, v in t.items()}
    return cast(params), [cast(g) for g in grads]


def run_jitted(opt, params, grads):
    @jax.jit
    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return functrain.apply_updates(p, u), s

    state, p, out = opt.init(params), params, []
    for g in grads:
        p, state = step(p, state, g)
        out.append(p)
    return out, state


def step_jaxpr(opt, params, grads):
    """The jaxpr of one ``opt.update`` step from ``opt.init(params)``, as text: two builders'
    programs compared to see that an argument reaches them."""
    return str(jax.make_jaxpr(opt.update)(grads, opt.init(params), params))


def check_gram_gives_the_reference(make, reference):
    """``make(ns_method)`` with ``"gram"`` against ``reference(params, grads)`` (the official,
    standard Newton-Schulz rule in numpy) over ``STEPS`` float64 steps, at the standard form's
    tolerance; and the gram program differs from the standard one (the method reaches
    Newton-Schulz)."""
    from functrain.jax_compat import enable_x64
    with enable_x64(True):
        params, grads = problem()
        ours, _ = run_jitted(make("gram"), params, grads)
        ref = reference(params, grads)
        for t in range(STEPS):
            for k in params:
                np.testing.assert_allclose(np.asarray(ours[t][k]), ref[t][k], rtol=1e-9,
                                           atol=1e-12, err_msg=f"step {t} {k}")
        assert (step_jaxpr(make("gram"), params, grads[0])
                != step_jaxpr(make("standard"), params, grads[0]))
