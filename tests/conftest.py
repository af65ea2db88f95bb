"""Shared fixtures: the trees the optimizer tests run on."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest


def make_params():
    """A tree with a zero-valued leaf, a scalar leaf, nested containers and mixed shapes."""
    rng = np.random.default_rng(0)
    return {
        "dense": {"w": jnp.asarray(rng.standard_normal((4, 3)), jnp.float32),
                  "b": jnp.zeros((3,), jnp.float32)},
        "scalar": jnp.asarray(0.7, jnp.float32),
        "layers": [jnp.asarray(rng.standard_normal((5,)), jnp.float32),
                   jnp.asarray(rng.uniform(1, 2, (2, 2, 2)), jnp.float32)],
    }


def make_grads(params, steps=50, seed=1):
    """Gradients whose magnitudes span 1e-3..1e3, stacked over ``steps``."""
    rng = np.random.default_rng(seed)

    def leaf(p):
        shape = (steps,) + p.shape
        mag = 10.0 ** rng.uniform(-3, 3, shape)
        return jnp.asarray(rng.standard_normal(shape) * mag, p.dtype)

    return jax.tree_util.tree_map(leaf, params)


@pytest.fixture
def params():
    return make_params()
