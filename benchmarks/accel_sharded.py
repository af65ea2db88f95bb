"""Sharded steps compiled for 8 H100s and for a 4-chip TPU v5e, and their collectives.

Two programs per target, compiled deviceless as in ``benchmarks/accel_compile.py``:

* **ZeRO-1 AdamW**: params and (all-reduced) grads replicated over the data axis, the state
  split by ``functrain.sharding.zero_shardings``; each device updates its slice and the new
  params are gathered. The least a step can communicate is that gather: each device receives
  the ``(N - 1) / N`` of the params it did not update.
* **A matrix optimizer with ``mesh=``** (muon, soap, shampoo, kron) on a stacked weight
  ``(L, n, n)`` (``weight_dimension_numbers`` for a scanned model's layers): the per-matrix
  work is split over the devices and the results gathered.

For each: the collectives of the optimized program (all-gather, all-reduce, reduce-scatter,
collective-permute, all-to-all; their per-device output bytes), whether any sits inside a
loop or a conditional, and compile seconds. Writes ``results/accelerators_sharded.{md,json}``.
Run in the target's venv (``make accel`` builds them): ``python benchmarks/accel_sharded.py
h100`` or ``tpu_v5e``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import functrain  # noqa: E402
from functrain.contrib import MuonDimensionNumbers  # noqa: E402

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute",
               "all-to-all")
_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "u8": 1, "s8": 1, "pred": 1,
          "f64": 8}


def topology_devices(target: str) -> list:
    """All devices of the multi-chip topology: 8 H100s, or the 4 chips of a v5e 2x2."""
    from jax.experimental import topologies
    if target == "h100":
        with open(os.path.join(HERE, "h100_sxm.txtpb")) as f:
            spec = f.read()
        return list(topologies.get_topology_desc(platform="cuda", topology="1x1x8",
                                                 target_config=spec).devices)
    return list(topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices)


def _shape_bytes(text: str) -> int:
    """Bytes of an HLO result shape (a tuple's elements summed)."""
    total = 0
    for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", text):
        if dtype in _BYTES:
            total += _BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
    return total


def _computations(hlo_text: str) -> tuple:
    """``(entry name, {computation name: its lines})`` of an HLO module's text."""
    bodies: dict = {}
    entry, name = None, None
    for line in hlo_text.splitlines():
        header = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{$", line)
        if header:
            name = header.group(2)
            bodies[name] = []
            entry = name if header.group(1) else entry
        elif name is not None:
            bodies[name].append(line)
    return entry, bodies


def _places(hlo_text: str) -> dict:
    """Computation name -> ``(place, branch)``: where it runs, reached from the entry. A
    while's body or condition runs ``"in a loop"``; a conditional's branches ``"in a
    conditional branch"`` (``branch``: the branch computation's name); a computation a
    fusion or an async op calls runs where its caller does."""
    entry, bodies = _computations(hlo_text)
    places = {entry: ("top level", None)}
    todo = [entry]
    while todo:
        caller = todo.pop()
        place, branch = places[caller]
        looped = place == "in a loop"
        for line in bodies.get(caller, ()):
            found = [(n, ("in a loop", None))
                     for n in re.findall(r"\b(?:body|condition)=%?([\w.\-]+)", line)]
            branches = [n for names in re.findall(r"branch_computations=\{([^}]*)\}", line)
                        for n in re.findall(r"%?([\w.\-]+)", names)]
            branches += re.findall(r"\b(?:true|false)_computation=%?([\w.\-]+)", line)
            found += [(n, ("in a loop", None) if looped else ("in a conditional branch", n))
                      for n in branches]
            found += [(n, (place, branch))
                      for n in re.findall(r"\bcalls=%?([\w.\-]+)", line)]
            for callee, where in found:
                if callee not in places and callee in bodies:
                    places[callee] = where
                    todo.append(callee)
    return places


def collectives(hlo_text: str) -> dict:
    """The collectives of an optimized program by where they run.

    One collective is counted once: the TPU compiler writes an asynchronous one as several
    instructions sharing a ``channel_id`` (a start, a fusion, a done), and an asynchronous
    pair's output is its ``-done``.

    Args:
      hlo_text: the optimized HLO (``compiled.as_text()``).

    Returns:
      ``{place: {opcode: {"count", "bytes"}}}`` with ``place`` one of ``"top level"`` (every
      step), ``"in a loop"`` (every iteration) and ``"in a conditional branch"`` (only when
      that branch runs; there each opcode also has ``"per_branch"``: branch computation ->
      bytes, since the branches of one conditional exclude each other). Bytes are each
      device's output bytes.
    """
    out: dict = {}
    places = _places(hlo_text)
    _, bodies = _computations(hlo_text)
    seen = set()
    for computation, lines in bodies.items():
        place, branch = places.get(computation, ("top level", None))
        for line in lines:
            m = re.match(r"^\s*(?:ROOT )?%?[\w.\-]+ = (.+?) (" + "|".join(COLLECTIVES)
                         + r")(?:-done)?\(", line)
            if not m:
                continue
            channel = re.search(r"channel_id=(\d+)", line)
            if channel:
                if channel.group(1) in seen:
                    continue
                seen.add(channel.group(1))
            entry = out.setdefault(place, {}).setdefault(m.group(2), {"count": 0, "bytes": 0})
            size = _shape_bytes(m.group(1))
            entry["count"] += 1
            entry["bytes"] += size
            if branch is not None:
                per = entry.setdefault("per_branch", {})
                per[branch] = per.get(branch, 0) + size
    return out


def compile_zero1_adamw(devices: list, shapes: dict) -> Any:
    mesh = Mesh(np.array(devices), ("data",))
    replicated = NamedSharding(mesh, P())
    params = {k: jax.ShapeDtypeStruct(s, jnp.float32, sharding=replicated)
              for k, s in shapes.items()}
    opt = functrain.adamw(1e-3)
    state = jax.eval_shape(opt.init, params)
    state_sh = functrain.sharding.zero_shardings(state, mesh)
    state = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                         state, state_sh)

    def step(p, s, g):
        updates, s = opt.update(g, s, p)
        return functrain.apply_updates(p, updates), s

    jitted = jax.jit(step, donate_argnums=(0, 1),
                     out_shardings=(jax.tree.map(lambda _: replicated, params), state_sh))
    return jitted.lower(params, state, params).compile()


def compile_matrix_with_mesh(name: str, devices: list, layers: int, n: int) -> Any:
    mesh = Mesh(np.array(devices), ("data",))
    replicated = NamedSharding(mesh, P())
    params = {"w": jax.ShapeDtypeStruct((layers, n, n), jnp.float32, sharding=replicated)}
    dims = {"w": MuonDimensionNumbers(-2, -1)}
    key = "muon_weight_dimension_numbers" if name == "muon" else "weight_dimension_numbers"
    opt = getattr(functrain.contrib, name)(1e-3, mesh=mesh, **{key: dims})
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                         jax.eval_shape(opt.init, params))

    def step(p, s, g):
        updates, s = opt.update(g, s, p)
        return functrain.apply_updates(p, updates), s

    # Outputs pinned to the inputs' (replicated) shardings, on every target: left free, the
    # TPU compiler kept the new params and state split over the devices (no collective at
    # all), the GPU compiler gathered them; pinned, both programs do the same work.
    out = (jax.tree.map(lambda x: x.sharding, params), jax.tree.map(lambda x: x.sharding, state))
    return jax.jit(step, donate_argnums=(0, 1), out_shardings=out).lower(
        params, state, params).compile()


def main(argv: list) -> None:
    target = argv[0] if argv else "h100"
    names = argv[1:] or ["muon", "soap", "shampoo", "kron"]
    devices = topology_devices(target)
    rows = []
    shapes = {**{f"layer{i}/kernel": (1024, 4096) for i in range(8)},
              **{f"layer{i}/bias": (4096,) for i in range(8)}}
    n_params = sum(int(np.prod(s)) for s in shapes.values())
    jobs = [("zero1 adamw", lambda: compile_zero1_adamw(devices, shapes))]
    jobs += [(f"{name} mesh=, (8, 1024, 1024)",
              lambda name=name: compile_matrix_with_mesh(name, devices, 8, 1024))
             for name in names]
    for label, build in jobs:
        start = time.perf_counter()
        try:
            compiled = build()
        except Exception as e:  # noqa: BLE001 -- reported in the table
            rows.append({"target": target, "step": label,
                         "error": f"{type(e).__name__}: {str(e)[:200]}"})
            print(json.dumps(rows[-1]), flush=True)
            continue
        seconds = time.perf_counter() - start
        found = collectives(compiled.as_text())
        rows.append({"target": target, "devices": len(devices), "step": label,
                     "compile_s": seconds, "collectives": found,
                     "param_bytes": 4 * n_params if label.startswith("zero1") else None})
        print(json.dumps(rows[-1]), flush=True)
    out_dir = os.environ.get("FUNCTRAIN_RECORDS") or os.path.join(HERE, "results")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"accelerators_sharded_{target}.json"), "w") as f:
        json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
