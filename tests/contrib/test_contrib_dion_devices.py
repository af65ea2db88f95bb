"""dion(mesh=...) on 8 devices: 8 simulated CPU devices in one fresh process, and two
processes of 4 devices each (jax.distributed on 127.0.0.1, gloo collectives), each under a
timeout (a hang fails). Both compare with one device's numbers (float64) and read the
compiled per-device program to see the work divided: each device runs Dion's step on 2 of
the 13 same-shape matrices, against 13 on one device. The work is in
``tests/multiprocess/dion_worker.py``."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from helpers import run_on_eight_devices, run_two_processes

WORKER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "multiprocess", "dion_worker.py")
sys.path.insert(0, os.path.dirname(WORKER))
import dion_worker  # noqa: E402  (defines functions only; runs nothing)

# Fresh processes or a whole model: a long check (make test-long, not make test).
pytestmark = pytest.mark.long


@pytest.fixture(scope="module")
def eight_device_results(run_once) -> dict:
    return run_once("dion_devices", lambda: run_on_eight_devices(WORKER, timeout=600))


@pytest.mark.parametrize("name", sorted(dion_worker.CHECKS))
def test_on_eight_simulated_devices(eight_device_results: dict, name: str) -> None:
    result = eight_device_results.get(name)
    assert result is not None, f"{name} did not run"
    assert result["ok"], result["error"]


def _one_process() -> dict:
    import jax.numpy as jnp

    import functrain
    from functrain.jax_compat import enable_x64
    with enable_x64(True):
        params = {k: jnp.asarray(v) for k, v in dion_worker.host_params().items()}
        params, _ = dion_worker.run_steps(functrain.contrib.dion(1e-2, **dion_worker.KWARGS),
                                          params)
        return {k: np.asarray(v) for k, v in params.items()}


def test_split_over_two_processes(tmp_path):
    got = run_two_processes(WORKER, str(tmp_path / "result.npz"))
    assert list(got["stacks"]) == [2], got["stacks"]  # 13 matrices (16 padded) over 8 devices
    for k, v in _one_process().items():
        np.testing.assert_allclose(got[k], v, rtol=1e-10, atol=1e-12, err_msg=k)
