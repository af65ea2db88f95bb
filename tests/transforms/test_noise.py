"""functrain.transforms.noise: add_noise's variance, determinism, state, and optax's keys."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft


def test_add_noise_variance_decays_as_eta_over_t_to_the_gamma():
    eta, gamma = 4.0, 1.0
    params = {"w": jnp.zeros(200_000), "v": jnp.zeros(3)}
    tx = ft.add_noise(eta, gamma, key=jax.random.key(1))
    state = tx.init(params)
    stds = []
    for _ in range(3):
        u, state = tx.update(jax.tree_util.tree_map(jnp.ones_like, params), state)
        stds.append(float(jnp.std(u["w"] - 1.0)))
        assert abs(float(jnp.mean(u["w"])) - 1.0) < 0.05
    # t = 1, 2, 3: variance eta / t**gamma.
    np.testing.assert_allclose(stds, [np.sqrt(eta / t ** gamma) for t in (1, 2, 3)], rtol=0.02)
    assert int(state.count) == 3


def test_add_noise_is_deterministic_per_key_and_fresh_per_step():
    params = [jnp.zeros(8), jnp.zeros(8)]
    zeros = [jnp.zeros(8), jnp.zeros(8)]

    def draws(key):
        tx = ft.add_noise(1.0, 0.55, key=key)
        state, out = tx.init(params), []
        for _ in range(2):
            u, state = tx.update(zeros, state)
            out.append([np.asarray(x) for x in u])
        return out

    a, b, c = draws(3), draws(jax.random.key(3)), draws(4)
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)             # an int seed is that key
    assert not np.array_equal(a[0][0], a[1][0])             # a fresh draw each step
    assert not np.array_equal(a[0][0], a[0][1])             # and for each leaf
    assert not np.array_equal(a[0][0], c[0][0])             # another key, other noise


def test_add_noise_with_zero_eta_changes_nothing():
    tx = ft.add_noise(0.0, 0.55, key=0)
    g = [jnp.array([1.0, -2.0])]
    u, _ = tx.update(g, tx.init(g))
    np.testing.assert_array_equal(u[0], [1.0, -2.0])


def _noise(tx, steps=2):
    params = {"a": jnp.zeros(5), "b": jnp.zeros((2, 2))}
    state, out = tx.init(params), []
    for _ in range(steps):
        u, state = tx.update(params, state)
        out.extend(np.asarray(x) for x in jax.tree_util.tree_leaves(u))
    return out


def test_add_noise_seed_key_and_default_match_optax():
    """optax's arguments: key=None means seed 0; seed= is the older name of key."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # optax warns for seed= and for no key
        cases = [(ft.add_noise(0.5, 0.55), optax.add_noise(0.5, 0.55)),
                 (ft.add_noise(0.5, 0.55, seed=7), optax.add_noise(0.5, 0.55, seed=7)),
                 (ft.add_noise(0.5, 0.55, key=7), optax.add_noise(0.5, 0.55, key=7))]
    for ours, theirs in cases:
        for a, b in zip(_noise(ours), _noise(theirs)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    for a, b in zip(_noise(ft.add_noise(0.5, 0.55)), _noise(ft.add_noise(0.5, 0.55, key=0))):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(_noise(cases[1][0])[0], _noise(cases[0][0])[0])


def test_add_noise_key_and_seed_together_is_an_error():
    with pytest.raises(ValueError, match="add_noise: give key or seed, not both"):
        ft.add_noise(0.1, 0.5, key=1, seed=1)
    # A float seed is no PRNG seed (optax fails under jit): refused at build, as a string.
    for seed in ("1", 1.0):
        with pytest.raises(TypeError, match="add_noise: seed must be an int"):
            ft.add_noise(0.1, 0.5, seed=seed)
    with pytest.raises(TypeError, match="noisy_sgd: seed must be an int .* 1.0"):
        ft.noisy_sgd(0.1, seed=1.0)
