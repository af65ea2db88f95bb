"""One of two processes (4 CPU devices each) running shampoo(mesh=...) over all 8 devices.

``tests/test_multiprocess.py`` starts two of these with ``jax.distributed`` on
127.0.0.1 and gloo CPU collectives. Usage: ``shampoo_worker.py PROCESS_ID PORT OUT``;
process 0 writes the parameters after 4 steps and each process's per-device loop trip
counts to ``OUT`` (``.npz``).
"""

from __future__ import annotations

import os
import re
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"


def main(process_id: int, port: int, out: str) -> None:
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_enable_x64", True)
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=process_id, initialization_timeout=60)
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    import functrain
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from test_multiprocess import KWARGS, host_params, run_steps

    mesh = jax.make_mesh((8,), ("x",))
    replicated = NamedSharding(mesh, PartitionSpec())
    params = {k: jax.make_array_from_callback(v.shape, replicated, lambda idx, v=v: v[idx])
              for k, v in host_params().items()}
    params, hlo = run_steps(functrain.contrib.shampoo(1e-2, mesh=mesh, **KWARGS), params)
    trips = sorted(int(n) for n in re.findall(r'known_trip_count":\{"n":"(\d+)"', hlo))
    result = {k: np.asarray(v.addressable_data(0)) for k, v in params.items()}
    if process_id == 0:
        np.savez(out, trips=np.asarray(trips), **result)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
