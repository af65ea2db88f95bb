"""Shampoo's refresh divided over two processes (4 CPU devices each, jax.distributed on
127.0.0.1 with gloo collectives): the same numbers as one process, and each device
decomposes its share of the blocks. Both processes run under a timeout (a hang fails)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from helpers import run_two_processes

# Fresh processes or a whole model: a long check (make test-long, not make test).
pytestmark = pytest.mark.long

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multiprocess",
                      "shampoo_worker.py")
KWARGS = dict(block_size=16, start_preconditioning_step=1, precondition_frequency=2)
STEPS = 4


def host_params() -> dict:
    """The same float64 parameters in every process: 16 blocks of (16, 16) per side."""
    rng = np.random.default_rng(0)
    shapes = {f"w{i:02d}": (16, 16) for i in range(13)} | {"emb": (48, 16), "b": (16,)}
    return {k: rng.normal(size=s) for k, s in shapes.items()}


def run_steps(opt, params) -> tuple:
    """``STEPS`` jitted steps of ``opt`` on gradients ``sin(t p)``: ``(params, step's HLO)``."""
    import jax
    import jax.numpy as jnp

    import functrain
    state = opt.init(params)

    @jax.jit
    def step(p, s, t):
        g = jax.tree.map(lambda x: jnp.sin(x * t), p)
        u, s = opt.update(g, s, p)
        return functrain.apply_updates(p, u), s

    for t in range(1, STEPS + 1):
        params, state = step(params, state, float(t))
    return params, step.lower(params, state, 1.0).compile().as_text()


def _one_process() -> dict:
    import jax
    import jax.numpy as jnp

    import functrain
    from functrain.jax_compat import enable_x64
    with enable_x64(True):
        params = {k: jnp.asarray(v) for k, v in host_params().items()}
        params, _ = run_steps(functrain.contrib.shampoo(1e-2, **KWARGS), params)
        return {k: np.asarray(v) for k, v in params.items()}


def test_shampoo_refresh_split_over_two_processes(tmp_path):
    got = run_two_processes(WORKER, str(tmp_path / "result.npz"))
    # 16 blocks per side over 8 devices: each device's program loops twice around eigh
    assert list(got["trips"]) == [2, 2], got["trips"]
    want = _one_process()
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-10, atol=1e-12, err_msg=k)
