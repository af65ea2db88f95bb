"""functrain.numerics: each shared per-array formula against the formula written out in numpy.

The references are float64 numpy; functrain computes in float32, so they agree
to float32 rounding.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from functrain import numerics

RNG = np.random.default_rng(0)
X = RNG.standard_normal(7)
AVG = RNG.standard_normal(7)
MU = RNG.standard_normal(7) * 0.1
NU = RNG.uniform(1e-4, 1e-2, 7)


def close(ours, reference, rtol=2e-6, atol=0.0):
    np.testing.assert_allclose(np.asarray(ours, np.float64), reference, rtol=rtol, atol=atol)


def f32(x):
    return jnp.asarray(x, jnp.float32)


@pytest.mark.parametrize("decay", [0.0, 0.5, 0.9, 0.999, 1.0])
def test_ema_update(decay):
    close(numerics.ema_update(f32(X), f32(AVG), decay), (1 - decay) * X + decay * AVG,
          rtol=1e-6, atol=1e-7)


def test_ema_update_with_a_traced_decay():
    out = jax.jit(numerics.ema_update)(f32(X), f32(AVG), jnp.float32(0.25))
    close(out, 0.75 * X + 0.25 * AVG, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("decay,count", [(0.9, 1), (0.9, 2), (0.999, 10), (0.5, 30)])
def test_bias_correction_factor(decay, count):
    reference = 1.0 - decay ** count
    plain = numerics.bias_correction_factor(decay, jnp.asarray(count))
    close(plain, reference, rtol=2e-5)
    precise = numerics.bias_correction_factor(decay, jnp.asarray(float(count)), precise=True)
    close(precise, reference, rtol=1e-6)


def test_bias_correction_factor_precise_avoids_cancellation():
    """decay near 1: 1 - decay**t loses digits in float32; -expm1(t log decay) does not."""
    decay, count = 0.99999, 3
    reference = -np.expm1(count * np.log(decay))     # 2.99997e-5, float64
    precise = numerics.bias_correction_factor(decay, jnp.asarray(3.0), precise=True)
    close(precise, reference, rtol=1e-6)
    plain = numerics.bias_correction_factor(jnp.float32(decay), jnp.asarray(3.0))
    assert abs(float(plain) / reference - 1) > 1e-4  # the cancellation the option avoids
    # Not a Python number in (0, 1]: the plain formula, even with precise=True.
    for decay in (jnp.float32(0.9), 1.5):
        close(numerics.bias_correction_factor(decay, jnp.asarray(2.0), precise=True),
              1 - float(decay) ** 2, rtol=1e-6)


@pytest.mark.parametrize("mc,nc,eps,eps_root", [
    (0.1, 0.001, 1e-8, 0.0),
    (0.5, 0.2, 1e-3, 1e-4),
    (None, None, 1e-6, 0.0),
    (0.3, None, 0.0, 1e-3),
])
def test_adam_direction_optax_placement(mc, nc, eps, eps_root):
    mu_hat = MU if mc is None else MU / mc
    nu_hat = NU if nc is None else NU / nc
    reference = mu_hat / (np.sqrt(nu_hat + eps_root) + eps)
    close(numerics.adam_direction(f32(MU), f32(NU), mc, nc, eps, eps_root), reference, rtol=5e-6)


@pytest.mark.parametrize("mc,nc,eps", [(0.1, 0.001, 1e-7), (0.5, 0.2, 1e-3), (0.19, 0.002, 1e-2)])
def test_adam_direction_ivy_placement(mc, nc, eps):
    """Ivy's adam_step: sqrt(1 - b2**t) / (1 - b1**t + eps) * mu / (sqrt(max(nu, 0)) + eps)."""
    nu = NU.copy()
    nu[0] = -1e-3                                   # a negative moment is clamped to 0
    reference = np.sqrt(nc) / (mc + eps) * MU / (np.sqrt(np.maximum(nu, 0.0)) + eps)
    ours = numerics.adam_direction(f32(MU), f32(nu), mc, nc, eps, eps_root=123.0,
                                   eps_placement="ivy")  # eps_root is not used there
    close(ours, reference, rtol=5e-6)
    # The two placements differ where eps matters.
    optax_form = numerics.adam_direction(f32(MU), f32(NU), mc, nc, 1e-3)
    ivy_form = numerics.adam_direction(f32(MU), f32(NU), mc, nc, 1e-3, eps_placement="ivy")
    assert not np.allclose(np.asarray(optax_form), np.asarray(ivy_form), rtol=1e-6)


def test_adam_direction_rejects_unknown_placement():
    with pytest.raises(ValueError, match="eps_placement"):
        numerics.adam_direction(f32(MU), f32(NU), 0.1, 0.1, 1e-8, eps_placement="pytorch")


@pytest.mark.parametrize("b1,t", [(0.9, 1), (0.9, 5), (0.5, 2)])
def test_nesterov_mu_hat(b1, t):
    g = X
    mc, next_mc = 1 - b1 ** t, 1 - b1 ** (t + 1)
    reference = b1 * MU / next_mc + (1 - b1) * g / mc
    close(numerics.nesterov_mu_hat(f32(g), f32(MU), b1, mc, next_mc), reference, rtol=5e-6)


P = np.array([3.0, -4.0, 12.0])          # ||P|| = 13
U = np.array([0.6, 0.0, -0.8])           # ||U|| = 1


@pytest.mark.parametrize("kwargs,reference", [
    (dict(), 13.0),
    (dict(trust_coefficient=0.01), 0.13),
    (dict(eps=0.3), 10.0),
    (dict(max_trust_ratio=2.0), 2.0),
    (dict(min_norm=20.0), 1.0),               # both norms floored at 20
    (dict(min_norm=2.0), 6.5),                # only ||u|| floored: 13 / 2
], ids=["plain", "coefficient", "eps", "cap", "min_norm_both", "min_norm_update"])
def test_trust_ratio_one_at_zero(kwargs, reference):
    close(numerics.trust_ratio(f32(P), f32(U), **kwargs), reference, rtol=1e-6)


def test_trust_ratio_is_one_where_a_norm_is_zero():
    assert float(numerics.trust_ratio(jnp.zeros(3), f32(U))) == 1.0
    assert float(numerics.trust_ratio(f32(P), jnp.zeros(3))) == 1.0
    assert float(numerics.trust_ratio(jnp.zeros(3), jnp.zeros(3), eps=0.1)) == 1.0


@pytest.mark.parametrize("tc,eps,w", [(1.0, 0.0, 0.0), (0.001, 1e-9, 0.0), (0.5, 1e-3, 0.1)])
def test_trust_ratio_plain_quotient(tc, eps, w):
    """one_at_zero=False (Ivy's rule): tc ||p|| / (||u|| + w ||p|| + eps), no special case."""
    pn, un = np.linalg.norm(P), np.linalg.norm(U)
    reference = tc * pn / (un + w * pn + eps)
    ours = numerics.trust_ratio(f32(P), f32(U), trust_coefficient=tc, eps=eps,
                                one_at_zero=False, p_norm_weight=w)
    close(ours, reference, rtol=1e-6)


def test_trust_ratio_plain_quotient_at_zero_and_its_gradient():
    # Zero params: the ratio is 0 (not 1), and its gradient is finite (0), not NaN.
    ratio = numerics.trust_ratio(jnp.zeros(3), f32(U), one_at_zero=False, eps=1e-6)
    assert float(ratio) == 0.0
    grad = jax.grad(lambda p: numerics.trust_ratio(p, f32(U), one_at_zero=False, eps=1e-6))(
        jnp.zeros(3))
    np.testing.assert_array_equal(grad, np.zeros(3))
    # With p_norm_weight the weighted ||p|| enters the denominator: ||u|| = 0 gives 1 / w.
    ratio = numerics.trust_ratio(f32(P), jnp.zeros(3), one_at_zero=False, p_norm_weight=0.25)
    close(ratio, 4.0, rtol=1e-6)
    # max_trust_ratio caps the plain quotient too.
    capped = numerics.trust_ratio(f32(P), f32(U), one_at_zero=False, max_trust_ratio=3.0)
    close(capped, 3.0, rtol=1e-6)


def test_module_exports():
    assert sorted(numerics.__all__) == sorted(["abs_sq", "ema_update", "bias_correction_factor",
                                               "adam_direction", "nesterov_mu_hat",
                                               "trust_ratio", "safe_norm",
                                               "safe_root_mean_squares",
                                               "safe_int32_increment", "sum_of_products",
                                               "mars_corrected_gradient"])


def test_sum_of_products_is_the_inner_product_of_the_lists():
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(3, 4)), rng.normal(size=5), np.float64(2.5)]
    ys = [rng.normal(size=(3, 4)), rng.normal(size=5), np.float64(-1.5)]
    expected = sum(float(np.vdot(np.ravel(x), np.ravel(y))) for x, y in zip(xs, ys))
    got = numerics.sum_of_products([jnp.asarray(x, jnp.float32) for x in xs],
                                   [jnp.asarray(y, jnp.float32) for y in ys])
    assert got.dtype == jnp.float32 and got.shape == ()
    np.testing.assert_allclose(float(got), expected, rtol=1e-5)
    assert float(numerics.sum_of_products([], [])) == 0.0


def test_abs_sq_is_the_squared_modulus():
    """|x|^2, real, for complex x (never x**2, which rotates the phase); x*x for real x."""
    z = np.array([1 + 1j, -2 + 0.5j, 3j], np.complex64)
    out = numerics.abs_sq(jnp.asarray(z))
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, z.real ** 2 + z.imag ** 2, rtol=1e-6)
    x = np.array([-3.0, 0.5], np.float32)
    np.testing.assert_array_equal(numerics.abs_sq(jnp.asarray(x)), x * x)


# --------------------------------------------------------------------------
# optax's top-level numerics helpers: safe_norm, safe_root_mean_squares,
# safe_int32_increment, against optax and a numpy formula
# --------------------------------------------------------------------------

def test_safe_norm_matches_optax_values_and_gradients():
    import optax
    m = jnp.asarray(RNG.standard_normal((3, 4)), jnp.float32)
    cases = [(m, 0.1, None, None, False), (m, 0.1, 1, 1, True), (m, 2.5, 2, 0, False),
             (m, 0.0, "fro", None, False), (jnp.zeros(4), 1e-6, None, None, False),
             (m.at[1].set(0.0), 1e-3, None, 1, False)]
    for x, min_norm, ord_, axis, keepdims in cases:
        ours = numerics.safe_norm(x, min_norm, ord_, axis, keepdims)
        theirs = optax.safe_norm(x, min_norm, ord_, axis, keepdims)
        np.testing.assert_allclose(ours, theirs, rtol=1e-6)
        np.testing.assert_allclose(
            ours, np.maximum(np.linalg.norm(np.asarray(x), ord_, axis, keepdims), min_norm),
            rtol=1e-5)
        g = jax.grad(lambda v: jnp.sum(numerics.safe_norm(v, min_norm, ord_, axis, keepdims)))
        g_ox = jax.grad(lambda v: jnp.sum(optax.safe_norm(v, min_norm, ord_, axis, keepdims)))
        assert np.isfinite(np.asarray(g(x))).all()
        np.testing.assert_allclose(g(x), g_ox(x), rtol=1e-6)


def test_safe_root_mean_squares_matches_optax():
    import optax
    for x, min_rms in ((jnp.asarray(X, jnp.float32), 0.1), (jnp.zeros(3), 1e-6),
                       (jnp.array([3 + 4j, 1j]), 0.5)):
        np.testing.assert_allclose(numerics.safe_root_mean_squares(x, min_rms),
                                   optax.safe_root_mean_squares(x, min_rms), rtol=1e-6)
        np.testing.assert_allclose(numerics.safe_root_mean_squares(x, min_rms),
                                   max(np.sqrt(np.mean(np.abs(np.asarray(x)) ** 2)), min_rms),
                                   rtol=1e-5)
    g = jax.grad(lambda v: numerics.safe_root_mean_squares(v, 1e-6))(jnp.zeros(3))
    np.testing.assert_array_equal(g, np.zeros(3))


def test_safe_int32_increment_matches_optax():
    import optax
    for c in (jnp.asarray(0, jnp.int32), jnp.asarray(2**31 - 1, jnp.int32),
              jnp.asarray(127, jnp.int8), jnp.asarray(1.5, jnp.float32),
              jnp.asarray(jnp.finfo(jnp.float16).max, jnp.float16)):
        ours, theirs = numerics.safe_int32_increment(c), optax.safe_int32_increment(c)
        assert ours.dtype == theirs.dtype
        np.testing.assert_array_equal(ours, theirs)
    for lib in (numerics, optax):
        with pytest.raises(ValueError, match="Cannot safely increment"):
            lib.safe_int32_increment(jnp.asarray(True))
