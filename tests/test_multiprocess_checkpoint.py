"""Several processes: ZeRO-1 training over 2 processes, saved with Orbax from both,
restored into 1 process and into 4; a process killed during a save leaves the previous
checkpoint restorable.

Every process runs ``tests/multiprocess/train_worker.py`` (``jax.distributed`` on
127.0.0.1, gloo CPU collectives, ``--xla_force_host_platform_device_count`` devices each;
always 8 devices in all, one ``("data",)`` mesh over them). The model is a float32 MLP;
``adamw`` and ``contrib.muon`` train side by side, each with the ZeRO-1 state of
``functrain.sharding.zero_shardings``. Saves are Orbax ``CheckpointManager`` saves
(asynchronous) after steps ``K`` and ``2K``; ``M`` more steps follow.

* ``test_two_processes_train_save_and_restore_into_one_and_four_processes``: the run over
  2 processes x 4 devices matches one process x 8 devices (the reference); its step-``2K``
  checkpoint restored into 1 x 8 and into 4 x 2 is bit-identical to what was saved, is laid
  out ZeRO-1 on the new mesh (each device holds 1/8 of every moment), and continued ``M``
  steps matches the reference.
* ``test_sigkill_during_a_save_leaves_the_previous_checkpoint_restorable``: process 1 stops
  its save of step ``2K+M`` at Orbax's commit barrier (data written, nothing committed)
  and is SIGKILLed there, then process 0 (still waiting in the same save). The save was in
  flight: at the kill both processes are alive and the step's temporary directory exists,
  holds files, and is not committed. A fresh process finds step ``2K`` as the latest,
  restores it bit-identically, continues ``M`` steps (matching the killed run's numbers
  within ``TOL``) and saves step ``2K+M`` into the same directory.

Tolerance against the reference: the runs are deterministic but not bit-identical to one
process, for adamw and muon alike. The gradient all-reduce adds the 8 devices' partial
gradients in another order when gloo carries it between processes (step 1's gradients
already differ by up to ~500 float32 ulps in entries near zero). Measured over 9 steps:
``max|a - b| <= 4.6e-7 * max|b|`` per buffer; asserted: ``TOL`` = 2e-6 of each buffer's
largest entry (about 17 float32 epsilons). Restored state is compared exactly.

Every process runs under a timeout; a hang fails the test naming the run and process
that hung, with the tail of its log.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from functrain import jax_compat

pytest.importorskip("orbax.checkpoint")  # the [orbax] extra

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multiprocess",
                      "train_worker.py")
sys.path.insert(0, os.path.dirname(WORKER))
from train_worker import K, M, OPTIMIZERS  # noqa: E402

# Fresh processes or a whole model: a long check (make test-long, not make test).
pytestmark = pytest.mark.long

TIMEOUT = 240  # seconds for one run of processes (about 10 s each on a quiet machine)
TOL = 2e-6  # max|a - b| / max|b| per buffer, against one process (see the docstring)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Processes:
    """``n`` worker processes of one run (``devices`` CPU devices each), logs in ``out``."""

    def __init__(self, name: str, n: int, devices: int, out, *args: str):
        self.name, self.out = f"{name} ({n} process(es) x {devices} devices)", out
        out.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
        port = str(free_port())
        self.logs = [out / f"log.{i}" for i in range(n)]
        self.procs = []
        for i in range(n):
            with open(self.logs[i], "w") as log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, WORKER, "--process-id", str(i), "--num-processes",
                     str(n), "--port", port, "--out", str(out), *args],
                    env=env, stdout=log, stderr=subprocess.STDOUT))
        self.deadline = time.monotonic() + TIMEOUT

    def tail(self, i: int, n: int = 2500) -> str:
        return f"--- {self.name}, process {i} ---\n" + self.logs[i].read_text()[-n:]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def wait(self) -> None:
        """Every process ends with status 0 before the deadline, or the test fails."""
        try:
            for i, p in enumerate(self.procs):
                try:
                    p.wait(timeout=max(self.deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    pytest.fail(f"{self.name}: process {i} hung (still running after "
                                f"{TIMEOUT} s)\n" + self.tail(i))
        finally:
            self.kill()
        for i, p in enumerate(self.procs):
            assert p.returncode == 0, (f"{self.name}: process {i} exited with status "
                                       f"{p.returncode}\n" + self.tail(i))

    def numbers(self, name: str) -> dict:
        with np.load(self.out / f"{name}.npz") as f:
            return dict(f)


def buffers(numbers: dict) -> dict:
    """The params and state buffers of a worker's ``.npz`` (not its shard-shape records)."""
    return {k: v for k, v in numbers.items() if k.startswith("[")}


def assert_identical(got: dict, want: dict, what: str) -> None:
    got, want = buffers(got), buffers(want)
    assert got.keys() == want.keys(), f"{what}: {sorted(got.keys() ^ want.keys())}"
    assert len(got) == 37, (what, len(got))  # 2 x 6 params, 13 adamw + 12 muon buffers
    for k, v in want.items():
        assert got[k].dtype == v.dtype == np.float32 or v.dtype.kind in "iu", (what, k)
        np.testing.assert_array_equal(got[k], v, err_msg=f"{what}: {k}")


def assert_close(got: dict, want: dict, what: str) -> None:
    """Per buffer: ``max|got - want| <= TOL * max|want|``; integers (step counts) equal."""
    got, want = buffers(got), buffers(want)
    assert got.keys() == want.keys(), f"{what}: {sorted(got.keys() ^ want.keys())}"
    worst = 0.0
    for k, v in want.items():
        if v.dtype.kind in "iu":
            np.testing.assert_array_equal(got[k], v, err_msg=f"{what}: {k}")
        else:
            err, scale = np.max(np.abs(got[k] - v)), np.max(np.abs(v))
            assert err <= TOL * scale, f"{what}: {k}: max|diff| {err:.3g}, max|want| {scale:.3g}"
            worst = max(worst, err / scale)
    print(f"{what}: max|diff| / max|want| = {worst:.3g}")


def assert_zero1_layout(shards: dict, numbers: dict, what: str) -> None:
    """Each device holds 1/8 of the first axis of every moment; params stay whole."""
    shards = {k[len("shards:"):]: v for k, v in shards.items() if k.startswith("shards:")}
    shapes = {k: v.shape for k, v in buffers(numbers).items()}
    moments = [k for k in shapes if ".mu[" in k or ".nu[" in k]
    assert len(moments) == 2 * 6 + 3 + 2 * 3, (what, moments)  # adamw; muon's and adam's
    for k in moments:
        want = (shapes[k][0] // 8,) + shapes[k][1:]
        assert [tuple(s) for s in shards[k]] == [want], (what, k, shards[k])
    for k in shapes:
        if "['params']" in k:
            assert [tuple(s) for s in shards[k]] == [shapes[k]], (what, k, shards[k])


# JAX 0.5.3's CPU collectives across processes (gloo) are unreliable under this run's
# ZeRO-1 all-gathers: 2 runs in 3 aborted ("gloo::EnforceNotMet ... op.preamble.length <=
# op.nbytes") or gave a 2-process AdamW moment 0.0089 off one process's 0.0106; 3 of 3 ran
# clean on JAX 0.6.2. A jaxlib transport defect, not an optimizer's: multi-process Shampoo
# (test_multiprocess.py) runs on 0.5.3.
needs_reliable_gloo = pytest.mark.skipif(
    not jax_compat.jax_at_least("0.6.2"),
    reason="needs JAX >= 0.6.2: jaxlib 0.5.x's multi-process CPU (gloo) collectives abort or "
           "corrupt data in this run")


@needs_reliable_gloo
def test_two_processes_train_save_and_restore_into_one_and_four_processes(tmp_path):
    ckpt = tmp_path / "ckpt"
    reference = Processes("reference", 1, 8, tmp_path / "reference", "--mode", "reference")
    train = Processes("train", 2, 4, tmp_path / "train", "--mode", "train",
                      "--ckpt", str(ckpt))
    try:
        train.wait()
        reference.wait()
    finally:
        train.kill()
        reference.kill()
    assert sorted(os.listdir(ckpt)) == [str(K), str(2 * K)]
    for step in (K, 2 * K, 2 * K + M):
        assert_close(train.numbers(f"step{step}"), reference.numbers(f"step{step}"),
                     f"2 processes vs 1 after step {step}")
    # ZeRO-1 over two processes: each of process 0's 4 devices holds 1/8 of every moment.
    assert_zero1_layout(train.numbers(f"step{2 * K}_shards"), train.numbers(f"step{2 * K}"),
                        "2 x 4, in training")

    runs = [Processes("restore", 1, 8, tmp_path / "restore1", "--mode", "restore",
                      "--ckpt", str(ckpt)),
            Processes("restore", 4, 2, tmp_path / "restore4", "--mode", "restore",
                      "--ckpt", str(ckpt))]
    try:
        for run in runs:
            run.wait()
    finally:
        for run in runs:
            run.kill()
    for run in runs:
        restored = run.numbers("restored")
        assert int(restored["latest_step"]) == 2 * K, run.name
        assert_identical(restored, train.numbers(f"step{2 * K}"), f"{run.name}: restored")
        assert_zero1_layout(restored, restored, run.name)
        assert_close(run.numbers("continued"), reference.numbers(f"step{2 * K + M}"),
                     f"{run.name}: continued {M} steps vs one process")


@needs_reliable_gloo
def test_sigkill_during_a_save_leaves_the_previous_checkpoint_restorable(tmp_path):
    ckpt = tmp_path / "ckpt"
    train = Processes("train, killed in its last save", 2, 4, tmp_path / "train",
                      "--mode", "train", "--ckpt", str(ckpt), "--stall-process", "1")
    stalled = tmp_path / "train" / "stalled.1"
    try:
        while not stalled.exists():
            for i, p in enumerate(train.procs):
                assert p.poll() is None, (f"{train.name}: process {i} ended (status "
                                          f"{p.returncode}) before the save of step "
                                          f"{2 * K + M} reached its commit\n" + train.tail(i))
            if time.monotonic() > train.deadline:
                pytest.fail(f"{train.name}: process 1 never reached the commit barrier of "
                            f"step {2 * K + M} within {TIMEOUT} s\n" + train.tail(1))
            time.sleep(0.05)
        # The save is in flight: its temporary directory exists, the step is not committed,
        # and both processes are still inside it (process 0 waits for process 1).
        in_flight = sorted(os.listdir(ckpt))
        assert str(2 * K + M) not in in_flight, in_flight
        assert [d for d in in_flight if d.startswith(f"{2 * K + M}.")], in_flight
        tmp = [d for d in in_flight if d.startswith(f"{2 * K + M}.")][0]
        written = [f for _, _, files in os.walk(ckpt / tmp) for f in files]
        assert written, f"{tmp} is empty: the save had not started writing"
        assert all(p.poll() is None for p in train.procs)
        for p in reversed(train.procs):  # process 1 first, then the rest of the job
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
    finally:
        train.kill()
    assert [p.returncode for p in train.procs] == [-signal.SIGKILL] * 2
    assert str(2 * K + M) not in os.listdir(ckpt), os.listdir(ckpt)

    restore = Processes("restore after the kill", 1, 8, tmp_path / "restore", "--mode",
                        "restore", "--ckpt", str(ckpt), "--save")
    restore.wait()
    restored = restore.numbers("restored")
    assert int(restored["latest_step"]) == 2 * K, "the previous checkpoint is the latest"
    assert_identical(restored, train.numbers(f"step{2 * K}"), "restored after the kill")
    assert_close(restore.numbers("continued"), train.numbers(f"step{2 * K + M}"),
                 f"restored after the kill, continued {M} steps")
    # The resumed run saves step 2K+M again, over the killed save's leftovers.
    assert sorted(d for d in os.listdir(ckpt) if d.isdigit()) == [str(K), str(2 * K),
                                                                  str(2 * K + M)]
