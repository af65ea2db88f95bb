"""The matrix optimizers with ``mesh=`` on a stacked ``(layers, m, n)`` weight sharded over two
processes (4 CPU devices each, jax.distributed on 127.0.0.1 with gloo collectives): the
checks of ``tests/stacked_sharding_checks.py`` (8 simulated devices in one process) across
processes. For muon, normuon, adamuon, dion, soap, shampoo and kron, the weight split over its
layers and over its rows: no collective inside any loop (Newton-Schulz, eigh, QR, triangular
solves) of the compiled per-process program, each device's loops over the stack run over its
eighth of the matrices, and the parameters after three steps equal this process's
single-device run (float64). One launch of both processes covers every case; each
runs under a timeout (a hang fails). The work is in ``tests/multiprocess/stacked_worker.py``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from helpers import run_two_processes
from stacked_sharding_checks import (OPTIMIZERS, SHAPES, SPECS, host_params, loop_trip_counts,
                                     three_steps)

# Fresh processes or a whole model: a long check (make test-long, not make test).
pytestmark = pytest.mark.long

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multiprocess",
                      "stacked_worker.py")
CASES = [(name, where) for name in OPTIMIZERS for where in SPECS]


@pytest.fixture(scope="module")
def two_process_results(tmp_path_factory: pytest.TempPathFactory, run_once) -> dict:
    def run() -> dict:
        out = tmp_path_factory.mktemp("stacked") / "result.npz"
        with run_two_processes(WORKER, str(out), timeout=400) as got:
            return {k: got[k] for k in got.files}

    return run_once("multiprocess_stacked", run)


@pytest.fixture(scope="module")
def one_device_results(run_once) -> dict:
    """Each optimizer's parameters after three steps on one device, without ``mesh=``, and
    its compiled step's loop trip counts (under ``"trips"``)."""
    import jax.numpy as jnp

    from functrain.jax_compat import enable_x64

    def run() -> dict:
        results = {}
        with enable_x64(True):
            for name, make in OPTIMIZERS.items():
                params = {k: jnp.asarray(v) for k, v in host_params(name).items()}
                params, hlo = three_steps(make(None), params)
                results[name] = {k: np.asarray(v) for k, v in params.items()}
                results[name]["trips"] = loop_trip_counts(hlo)
        return results

    return run_once("multiprocess_stacked_one_device", run)


@pytest.mark.parametrize("name, where", CASES)
def test_no_collective_inside_loops(two_process_results: dict, name: str, where: str) -> None:
    got = two_process_results
    assert got[f"{name} {where} collectives"] == 0, (
        f"{name}, weight split over its {where}: collectives inside its loops:\n"
        f"{got[f'{name} {where} found']}")


@pytest.mark.parametrize("name, where", CASES)
def test_numbers_equal_one_devices(two_process_results: dict, one_device_results: dict,
                                   name: str, where: str) -> None:
    for k, want in one_device_results[name].items():
        if k == "trips":
            continue
        np.testing.assert_allclose(two_process_results[f"{name} {where} {k}"], want,
                                   rtol=1e-10, atol=1e-12, err_msg=f"{name} {k}, {where}")


@pytest.mark.parametrize("name, where", CASES)
def test_each_device_works_on_its_share(two_process_results: dict, one_device_results: dict,
                                        name: str, where: str) -> None:
    """One device's program loops over the stack's matrices (a trip count that is a multiple
    of the layers: shampoo's eigh, dion's QR, SOAP's and Kron's per-matrix loops); each of the
    8 devices' runs that loop over its eighth (XLA drops a loop of one trip). The other loops
    (Newton-Schulz steps, Kron's iterations, all fewer than the layers) keep their counts."""
    layers = SHAPES[name][0]
    one = one_device_results[name]["trips"]
    want = sorted(t // layers if t % layers == 0 else t for t in one)
    want = [t for t in want if t != 1]
    got = list(two_process_results[f"{name} {where} trips"])
    assert got == want, (f"{name}, weight split over its {where}: loop trip counts {got}, "
                         f"want {want} (one device's: {one})")
