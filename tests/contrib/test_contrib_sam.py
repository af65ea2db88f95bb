"""functrain.contrib.sam against optax.contrib.sam, in both modes, and one SAM step by hand.

Transparent mode runs the loop of optax's docs: every call takes the gradient at the
current params (adversarial or outer) and applies the update. Opaque mode passes
``grad_fn(params, i)`` and runs the adversarial steps inside ``update``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest

import functrain
from functrain.contrib import SAMState, sam
from helpers import make_params

BATCHES = [1.0, 0.5, 2.0]  # grad_fn's i picks a "batch": here a weight of the loss


def loss(p, w=1.0):
    return w * sum(jnp.sum(jnp.sin(x) * x ** 2 + 0.1 * x ** 4)
                   for x in jax.tree_util.tree_leaves(p))


def build(lib, outer, rho=0.05, normalized=True, **kwargs):
    adv = lib.chain(lib.contrib.normalize(), lib.sgd(rho)) if normalized else lib.sgd(rho)
    outer_opt = {"sgd": lambda: lib.sgd(0.05), "adam": lambda: lib.adam(1e-2),
                 "momentum": lambda: lib.sgd(0.005, momentum=0.9)}[outer]()
    return lib.contrib.sam(outer_opt, adv, **kwargs)


def trajectory(opt, apply, params, steps=30):
    @jax.jit
    def step(p, s):
        grad_fn = lambda q, i: jax.grad(loss)(q, jnp.asarray(BATCHES)[i])  # noqa: E731
        u, s = opt.update(jax.grad(loss)(p), s, p, grad_fn=grad_fn)
        return apply(p, u), s

    state, out = opt.init(params), []
    for _ in range(steps):
        params, state = step(params, state)
        out.append(params)
    return out, state


def assert_same(a, b, rtol=2e-5, atol=1e-6):
    for pa, pb in zip(a, b):
        for x, y in zip(jax.tree_util.tree_leaves(pa), jax.tree_util.tree_leaves(pb)):
            np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)
            assert np.all(np.isfinite(np.asarray(x)))
            assert x.dtype == y.dtype
    assert any(np.any(np.asarray(x) != np.asarray(y)) for x, y in
               zip(jax.tree_util.tree_leaves(a[0]), jax.tree_util.tree_leaves(a[-1])))


SETTINGS = [
    dict(outer="sgd"),
    dict(outer="adam", sync_period=3, reset_state=False),
    dict(outer="momentum", sync_period=4, rho=0.02, normalized=False),
]


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("opaque_mode", [False, True])
def test_matches_optax_contrib(settings, opaque_mode):
    params = make_params()
    a, state = trajectory(build(functrain, opaque_mode=opaque_mode, **settings),
                          functrain.apply_updates, params)
    b, _ = trajectory(build(optax, opaque_mode=opaque_mode, **settings), optax.apply_updates,
                      params)
    assert_same(a, b)
    assert isinstance(state, SAMState) and (state.cache is None) == opaque_mode


def test_whole_float_sync_period_matches_optax():
    """optax takes sync_period=3.0 in transparent mode (it compares and takes a modulo);
    functrain gives the same trajectory as with 3 (and refuses 2.5, above)."""
    params = make_params()
    a, _ = trajectory(build(functrain, "adam", sync_period=3.0), functrain.apply_updates, params)
    b, _ = trajectory(build(optax, "adam", sync_period=3.0), optax.apply_updates, params)
    c, _ = trajectory(build(functrain, "adam", sync_period=3), functrain.apply_updates, params)
    assert_same(a, b)
    assert_same(a, c, rtol=0, atol=0)


def test_integer_params_are_refused_naming_the_leaf():
    """The adversarial point p + rho g/|g| does not fit an integer param (optax's
    apply_updates truncates it there, silently); functrain says so before any math."""
    params = {"w": jnp.ones(3), "n": jnp.asarray([1, 2], jnp.int32)}
    for opaque in (False, True):
        opt = sam(functrain.sgd(0.1), functrain.sgd(0.1), opaque_mode=opaque)
        with pytest.raises(TypeError, match=r"sam: params leaf \['n'\] has dtype int32"):
            opt.init(params)
        state = opt.init({"w": jnp.ones(3), "n": jnp.ones(2)})
        with pytest.raises(TypeError, match=r"sam: params leaf \['n'\] has dtype int32"):
            opt.update(params, state, params, grad_fn=lambda q, i: q)


def test_complex_params_match_optax():
    params = {"c": jnp.array([1.0 + 2.0j, -0.5 + 0.1j, 0.3 - 1.0j], jnp.complex64)}

    def grad(p):  # the conjugate gradient of |p - t|^2, as jax.grad gives for real losses
        return {"c": 2 * (p["c"] - (0.5 + 0.5j))}

    outs = []
    for lib in (functrain, optax):
        opt = lib.contrib.sam(lib.sgd(0.1), lib.chain(lib.contrib.normalize(), lib.sgd(0.05)))
        p, s = params, opt.init(params)
        for _ in range(10):
            u, s = opt.update(grad(p), s, p)
            p = lib.apply_updates(p, u)
        outs.append(p["c"])
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6, atol=1e-7)


def test_one_sam_step_by_hand():
    # x_adv = x + rho g / ||g||; then x <- x - lr * grad(x_adv), from x (not x_adv).
    x = jnp.array([1.0, -2.0, 0.5])
    f = lambda p: jnp.sum(p ** 4)  # noqa: E731
    rho, lr = 0.1, 0.01
    g = np.asarray(jax.grad(f)(x), np.float64)
    x_adv = np.asarray(x, np.float64) + rho * g / np.linalg.norm(g)
    want = np.asarray(x, np.float64) - lr * 4 * x_adv ** 3
    adv = functrain.chain(functrain.contrib.normalize(), functrain.sgd(rho))
    for opaque in (False, True):
        opt = sam(functrain.sgd(lr), adv, opaque_mode=opaque)
        p, s = x, opt.init(x)
        for _ in range(1 if opaque else 2):
            u, s = opt.update(jax.grad(f)(p), s, p, grad_fn=lambda q, i: jax.grad(f)(q))
            p = functrain.apply_updates(p, u)
        np.testing.assert_allclose(p, want, rtol=1e-5)
        assert int(s.steps_since_sync) == 0


def test_state_from_shapes_alone():
    params = make_params()
    abstract = jax.tree_util.tree_map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
    for opaque in (False, True):
        opt = build(functrain, "adam", opaque_mode=opaque)
        assert (jax.tree_util.tree_structure(jax.eval_shape(opt.init, abstract))
                == jax.tree_util.tree_structure(opt.init(params)))


def test_errors():
    params = {"w": jnp.ones(3)}
    with pytest.raises(ValueError, match="sync_period"):
        sam(functrain.sgd(0.1), functrain.sgd(0.1), sync_period=0)
    with pytest.raises(TypeError, match="sync_period"):
        sam(functrain.sgd(0.1), functrain.sgd(0.1), sync_period=2.5)
    with pytest.raises(ValueError, match="sync_period must be finite"):
        sam(functrain.sgd(0.1), functrain.sgd(0.1), sync_period=float("inf"))
    with pytest.raises(TypeError, match="adv_optimizer"):
        sam(functrain.sgd(0.1), "sgd")
    opaque = sam(functrain.sgd(0.1), functrain.sgd(0.1), opaque_mode=True)
    with pytest.raises(ValueError, match="grad_fn"):
        opaque.update(params, opaque.init(params), params)
    transparent = sam(functrain.sgd(0.1), functrain.sgd(0.1))
    with pytest.raises(ValueError, match="parameters"):
        transparent.update(params, transparent.init(params))
    with pytest.raises(ValueError, match=r"\['w'\]"):
        transparent.update({"w": jnp.ones(4)}, transparent.init(params), {"w": jnp.ones(4)})
    with pytest.raises(ValueError, match="cache"):
        transparent.update(params, opaque.init(params), params)
