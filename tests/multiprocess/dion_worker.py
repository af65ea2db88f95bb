"""dion(mesh=...) over 8 devices: 8 simulated CPU devices in one process, or one of two
processes with 4 each.

``tests/contrib/test_contrib_dion_devices.py`` runs it in fresh processes under timeouts:

* ``dion_worker.py`` (no arguments; started by ``helpers.run_on_eight_devices`` with 8
  simulated devices): runs :data:`CHECKS` and prints one JSON line ``{name: {"ok": bool,
  "error": str}}``.
* ``dion_worker.py PROCESS_ID PORT OUT``: one of two processes (``jax.distributed`` on
  127.0.0.1, gloo collectives) stepping ``dion(mesh=...)`` over all 8 devices; process 0
  writes the parameters after the steps and the per-device stack sizes to ``OUT`` (``.npz``).
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback

STEPS = 4
# 13 (16, 16) matrices (padded to 16: 2 per device on 8), a wide and a tall one, a bias.
SHAPES = {**{f"w{i:02d}": (16, 16) for i in range(13)}, "emb": (48, 16), "head": (16, 40),
          "b": (16,)}
KWARGS = dict(rank=0.5, weight_decay=1e-2)


def host_params() -> dict:
    import numpy as np
    rng = np.random.default_rng(0)
    return {k: rng.normal(size=s) for k, s in SHAPES.items()}


def run_steps(opt, params) -> tuple:
    """``STEPS`` jitted steps on gradients ``sin(t p)``: ``(params, the step's HLO text)``."""
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


def stack_sizes(hlo: str) -> list:
    """The stack lengths of the (16, 16) matrices' ``P Q^H`` / ``P R^H`` products."""
    return sorted({int(n) for n in re.findall(r"f64\[(\d+),16,16\]\{[^}]*\} dot", hlo)})


def qr_trip_counts(hlo: str) -> list:
    """The known trip counts of the compiled program's loops (one QR per iteration)."""
    return sorted(int(n) for n in re.findall(r'known_trip_count":\{"n":"(\d+)"', hlo))


# --------------------------------------------------------------------------
# 8 simulated devices, one process
# --------------------------------------------------------------------------

def check_work_divided_over_eight_devices() -> None:
    """dion(mesh=...) on a 4x2 mesh (auto and explicit axes): each device runs the step of 2
    of the 13 (16, 16) matrices (its program's products are on (2, 16, 16) stacks and its QR
    loops run 2 times, against 13 on one device), and the numbers are one device's without a
    mesh (float64)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import functrain
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from helpers import AXIS_TYPES

    params = {k: jnp.asarray(v) for k, v in host_params().items()}
    one, hlo_one = run_steps(functrain.contrib.dion(1e-2, **KWARGS), params)
    assert stack_sizes(hlo_one) == [13], stack_sizes(hlo_one)
    assert 13 in qr_trip_counts(hlo_one), qr_trip_counts(hlo_one)
    for kind in AXIS_TYPES:
        mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind, kind))
        split, hlo = run_steps(functrain.contrib.dion(1e-2, mesh=mesh, **KWARGS), params)
        assert stack_sizes(hlo) == [2], (kind, stack_sizes(hlo))
        assert 13 not in qr_trip_counts(hlo) and 2 in qr_trip_counts(hlo), (
            kind, qr_trip_counts(hlo))
        for k in one:
            np.testing.assert_allclose(split[k], one[k], rtol=1e-10, atol=1e-12,
                                       err_msg=f"{k}, {kind}")


def check_sharded_params_give_one_devices_numbers() -> None:
    """Params split over a 4x2 mesh (rows over 'data', columns over 'model'; auto and
    explicit axes), with and without ``mesh=``: the momentum keeps each param's sharding
    under ``jit(init)``, the weights keep theirs, and the numbers are one device's
    (float64)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import functrain
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from helpers import AXIS_TYPES, set_mesh

    params = {k: jnp.asarray(v) for k, v in host_params().items()}
    one, _ = run_steps(functrain.contrib.dion(1e-2, **KWARGS), params)
    specs = {k: P("data", "model") if len(s) == 2 else P("model") for k, s in SHAPES.items()}
    for kind in AXIS_TYPES:
        mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind, kind))
        shardings = {k: NamedSharding(mesh, s) for k, s in specs.items()}
        for use_mesh in (None, mesh):
            where = f"{kind}, mesh={use_mesh is not None}"
            opt = functrain.contrib.dion(1e-2, mesh=use_mesh, **KWARGS)
            with set_mesh(mesh):
                sharded = jax.device_put(params, shardings)
                mu = jax.jit(opt.init)(sharded).inner_states["dion"].inner_state[0].mu
                got, _ = run_steps(opt, sharded)
            for k, x in mu.items():
                if not isinstance(x, tuple):  # MaskedNode: the bias is AdamW's
                    assert x.sharding.is_equivalent_to(shardings[k], x.ndim), (
                        k, where, x.sharding)
            for k in one:
                assert got[k].sharding.is_equivalent_to(shardings[k], got[k].ndim), (
                    k, where, got[k].sharding)
                np.testing.assert_allclose(got[k], one[k], rtol=1e-10, atol=1e-12,
                                           err_msg=f"{k}, {where}")


CHECKS = {f.__name__: f for f in (check_work_divided_over_eight_devices,
                                  check_sharded_params_give_one_devices_numbers)}


def eight_devices() -> None:
    import jax
    jax.config.update("jax_enable_x64", True)
    assert jax.device_count() == 8, jax.device_count()
    results = {}
    for name, fn in CHECKS.items():
        try:
            fn()
            results[name] = {"ok": True, "error": ""}
        except Exception:  # noqa: BLE001 -- reported per check
            results[name] = {"ok": False, "error": traceback.format_exc()[-3000:]}
    print(json.dumps(results))


# --------------------------------------------------------------------------
# Two processes, 4 devices each
# --------------------------------------------------------------------------

def two_processes(process_id: int, port: int, out: str) -> None:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_enable_x64", True)
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=process_id, initialization_timeout=60)
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    import functrain
    mesh = jax.make_mesh((8,), ("x",))
    replicated = NamedSharding(mesh, PartitionSpec())
    params = {k: jax.make_array_from_callback(v.shape, replicated, lambda idx, v=v: v[idx])
              for k, v in host_params().items()}
    params, hlo = run_steps(functrain.contrib.dion(1e-2, mesh=mesh, **KWARGS), params)
    result = {k: np.asarray(v.addressable_data(0)) for k, v in params.items()}
    if process_id == 0:
        np.savez(out, stacks=np.asarray(stack_sizes(hlo)), **result)
    jax.distributed.shutdown()


if __name__ == "__main__":
    if len(sys.argv) == 1:
        eight_devices()
    else:
        two_processes(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
