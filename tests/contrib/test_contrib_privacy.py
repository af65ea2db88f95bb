"""functrain.contrib.differentially_private_aggregate and dpsgd against optax.contrib.

The noise follows optax's key handling, so it is compared exactly (same key, same
noise), not only in distribution; the clipping is also checked against numpy.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest

import functrain
from functrain.contrib import differentially_private_aggregate, dpsgd


def per_example_grads(batch=6, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    shapes = {"w": (4, 3), "b": (3,), "s": (), "z": (2,)}
    tree = {k: rng.standard_normal((batch,) + s) * 3.0 for k, s in shapes.items()}
    tree["z"] = np.zeros((batch, 2))
    if jnp.issubdtype(dtype, jnp.complexfloating):
        tree = {k: v + 1j * rng.standard_normal(v.shape) for k, v in tree.items()}
    return {k: jnp.asarray(v, dtype) for k, v in tree.items()}


def one_example(grads):
    return jax.tree_util.tree_map(lambda g: g[0], grads)


def run(tx, grads_seq, params, apply):
    step = jax.jit(lambda p, s, g: tx.update(g, s, p))
    state, out = tx.init(params), []
    for g in grads_seq:
        u, state = step(params, state, g)
        params = apply(params, u)
        out.append(params)
    return out


def optax_dpsgd(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # optax passes seed= itself
        return optax.contrib.dpsgd(*args, **kwargs)


def assert_same(ours, theirs, rtol=1e-6, atol=1e-7):
    moved = False
    for a, b in zip(ours, theirs):
        for key in a:
            np.testing.assert_allclose(a[key], b[key], rtol=rtol, atol=atol, err_msg=key)
            assert np.all(np.isfinite(np.asarray(a[key])))
            assert a[key].dtype == b[key].dtype
    for key in ours[-1]:
        moved |= bool(np.any(np.asarray(ours[-1][key]) != np.asarray(ours[0][key])))
    assert moved


SEQ = [per_example_grads(seed=s) for s in range(30)]


@pytest.mark.parametrize("kwargs", [
    dict(l2_norm_clip=1.0, noise_multiplier=0.5, key=3),
    dict(l2_norm_clip=0.3, noise_multiplier=2.0, key=jax.random.key(7)),
    dict(l2_norm_clip=100.0, noise_multiplier=0.01, seed=11),
])
def test_aggregate_matches_optax_noise_included(kwargs):
    params = one_example(SEQ[0])
    ours = functrain.chain(differentially_private_aggregate(**kwargs), functrain.sgd(0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        theirs = optax.chain(optax.contrib.differentially_private_aggregate(**kwargs),
                             optax.sgd(0.1))
    assert_same(run(ours, SEQ, params, functrain.apply_updates),
                run(theirs, SEQ, params, optax.apply_updates))


@pytest.mark.parametrize("kwargs", [
    dict(learning_rate=0.1, l2_norm_clip=1.0, noise_multiplier=0.7, seed=0),
    dict(learning_rate=0.05, l2_norm_clip=2.0, noise_multiplier=0.3, seed=4, momentum=0.9,
         nesterov=True),
    dict(learning_rate=optax.linear_schedule(0.1, 0.01, 20), l2_norm_clip=0.5,
         noise_multiplier=1.0, seed=2, momentum=0.5),
])
def test_dpsgd_matches_optax(kwargs):
    params = one_example(SEQ[0])
    assert_same(run(dpsgd(**kwargs), SEQ, params, functrain.apply_updates),
                run(optax_dpsgd(**kwargs), SEQ, params, optax.apply_updates))


def test_complex_gradients_match_optax():
    seq = [per_example_grads(dtype=jnp.complex64, seed=s) for s in range(5)]
    params = one_example(seq[0])
    kwargs = dict(l2_norm_clip=1.5, noise_multiplier=0.4, key=1)
    ours = functrain.chain(differentially_private_aggregate(**kwargs), functrain.sgd(0.1))
    theirs = optax.chain(optax.contrib.differentially_private_aggregate(**kwargs),
                         optax.sgd(0.1))
    assert_same(run(ours, seq, params, functrain.apply_updates),
                run(theirs, seq, params, optax.apply_updates))


def test_clipping_by_hand():
    grads = per_example_grads(batch=5)
    clip = 2.0
    tx = differentially_private_aggregate(clip, 0.0, key=0)
    out, _ = tx.update(grads, tx.init(one_example(grads)))
    flat = np.concatenate([np.asarray(g, np.float64).reshape(5, -1) for g in grads.values()],
                          axis=1)
    factors = np.minimum(1.0, clip / np.linalg.norm(flat, axis=1))
    for key, g in grads.items():
        want = np.tensordot(factors, np.asarray(g, np.float64), axes=1) / 5
        np.testing.assert_allclose(out[key], want, rtol=1e-5, atol=1e-7)


def test_noise_statistics_and_key_advance():
    grads = {"w": jnp.zeros((4, 200, 50))}
    tx = differentially_private_aggregate(l2_norm_clip=2.0, noise_multiplier=1.5, key=0)
    state = tx.init(one_example(grads))
    u1, state1 = tx.update(grads, state)
    u2, _ = tx.update(grads, state1)
    std = 2.0 * 1.5 / 4  # l2_norm_clip * noise_multiplier / batch
    for u in (u1, u2):
        assert abs(float(jnp.std(u["w"])) / std - 1) < 0.03
        assert abs(float(jnp.mean(u["w"]))) < 0.03 * std
    assert not np.allclose(u1["w"], u2["w"])  # a fresh draw each step


def test_state_from_shapes_alone_and_bfloat16():
    params = one_example(per_example_grads())
    abstract = jax.tree_util.tree_map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
    opt = dpsgd(0.1, 1.0, 0.5, seed=0, momentum=0.9)
    shapes = jax.eval_shape(opt.init, abstract)
    assert jax.tree_util.tree_structure(shapes) == jax.tree_util.tree_structure(
        opt.init(params))
    g16 = per_example_grads(dtype=jnp.bfloat16)
    p16 = one_example(g16)
    u, _ = opt.update(g16, opt.init(p16), p16)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(u))


def test_errors_name_the_argument_or_leaf():
    tx = differentially_private_aggregate(1.0, 0.5, key=0)
    grads = per_example_grads(batch=4)
    bad = dict(grads, b=jnp.ones((3, 3)))
    with pytest.raises(ValueError, match=r"\['b'\]"):
        tx.update(bad, tx.init(one_example(grads)))
    with pytest.raises(ValueError, match=r"\['s'\]"):
        tx.update(dict(grads, s=jnp.ones(())), tx.init(one_example(grads)))
    with pytest.raises(ValueError, match="l2_norm_clip"):
        differentially_private_aggregate(-1.0, 0.5, key=0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        dpsgd(0.1, 1.0, -0.5, seed=0)
    with pytest.raises(ValueError, match="key or seed"):
        differentially_private_aggregate(1.0, 0.5, key=1, seed=2)
    with pytest.raises(TypeError, match="key"):
        differentially_private_aggregate(1.0, 0.5, key="seed")
    # A float seed is no PRNG seed (optax fails under jit): refused at build.
    with pytest.raises(TypeError, match="differentially_private_aggregate: seed must be an int"):
        differentially_private_aggregate(1.0, 0.5, seed=1.0)
    with pytest.raises(TypeError, match="dpsgd: seed must be an int .* 1.0"):
        dpsgd(0.1, 1.0, 0.5, seed=1.0)
    with pytest.raises(TypeError, match=r"\['i'\]"):
        tx.init({"i": jnp.zeros(2, jnp.int32)})
