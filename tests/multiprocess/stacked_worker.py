"""One of two processes (4 CPU devices each) running the matrix optimizers with ``mesh=`` on
a stacked ``(layers, m, n)`` weight sharded over the 8 devices of both.

``tests/test_multiprocess_stacked.py`` starts two of these with ``jax.distributed`` on
127.0.0.1 and gloo CPU collectives. Usage: ``stacked_worker.py PROCESS_ID PORT OUT``. For
each optimizer of ``tests/stacked_sharding_checks.py`` (``OPTIMIZERS``) and each sharding of
its weight (``SPECS``: over the layer axis, over ``m``) it runs three jitted steps and reads
the compiled per-process program; process 0 writes to ``OUT`` (``.npz``), under the keys
``"{name} {where} {leaf}"``, the parameters after three steps (gathered from both
processes), under ``"{name} {where} loops"`` / ``"... collectives"`` the number of loops in
the program and of collectives inside them (the instructions, ``"... found"``), and under
``"... trips"`` the loops' trip counts.
"""

from __future__ import annotations

import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(process_id: int, port: int, out: str) -> None:
    # Before JAX starts: 4 devices per process, and XLA's backend optimization level 0 as in
    # the 8-device run of the same checks (it halves XLA:CPU's compile time).
    os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=4 "
                               "--xla_backend_optimization_level=0")
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_enable_x64", True)
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=process_id, initialization_timeout=60)
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec

    sys.path.insert(0, TESTS)
    from stacked_sharding_checks import (OPTIMIZERS, SPECS, check_collective_counter,
                                         collectives_in_loops, host_params,
                                         loop_trip_counts, three_steps)

    assert jax.device_count() == 8 and jax.local_device_count() == 4, jax.devices()
    mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    check_collective_counter(mesh)
    result = {}
    for name, make in OPTIMIZERS.items():
        host = host_params(name)
        for where, spec in SPECS.items():
            specs = {"w": spec, "b": PartitionSpec()}
            params = {k: jax.make_array_from_callback(
                v.shape, NamedSharding(mesh, specs[k]), lambda idx, v=v: v[idx])
                for k, v in host.items()}
            params, hlo = three_steps(make(mesh), params)
            found, loops = collectives_in_loops(hlo)
            key = f"{name} {where}"
            result[f"{key} loops"] = np.asarray(loops)
            result[f"{key} collectives"] = np.asarray(len(found))
            result[f"{key} found"] = np.asarray("\n".join(found))
            result[f"{key} trips"] = np.asarray(loop_trip_counts(hlo), dtype=np.int64)
            for k, x in params.items():
                result[f"{key} {k}"] = np.asarray(multihost_utils.process_allgather(x,
                                                                                    tiled=True))
    if process_id == 0:
        np.savez(out, **result)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
