"""Multi-device checks of the matrix optimizers on a stacked (scanned) weight that is sharded.

Part of ``tests/sharding_checks.py``'s run (8 simulated CPU devices, one subprocess started by
``tests/test_sharding.py``), which merges this module's ``CHECKS``. A model run with
``jax.lax.scan`` keeps each kind of weight as one ``(layers, m, n)`` leaf, sharded over the
layer axis (each device its layers) or over ``m`` (tensor parallel). With ``mesh=``, every
matrix optimizer must run its loops (Newton-Schulz, eigh, QR, Kron's triangular solves) on
whole matrices each device holds: the compiled per-device program has no collective inside
any loop (GSPMD's alternative on a row-sharded weight is an all-reduce in every Newton-Schulz
iteration), and the numbers are one device's. Importing this module runs nothing.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import functrain as ft
from functrain.contrib import MuonDimensionNumbers
from functrain.jax_compat import enable_x64

CHECKS: dict[str, Callable[[], None]] = {}

_COLLECTIVE = re.compile(
    r"= [^=]*\b(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
    r"(-start)?\(")
_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$")
_CALLED = re.compile(r"\b(?:calls|to_apply|body|condition)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_LOOP_BODY = re.compile(r"\bwhile\(.*\bbody=%?([\w.\-]+)")


def computations(hlo: str) -> dict[str, list[str]]:
    """The compiled module's computations: name -> its instruction lines."""
    found: dict[str, list[str]] = {}
    name = None
    for line in hlo.splitlines():
        header = _HEADER.match(line)
        if header and not line.startswith(" "):
            name, found[header.group(1)] = header.group(1), []
        elif line.startswith("}"):
            name = None
        elif name is not None:
            found[name].append(line)
    return found


def collectives_in_loops(hlo: str) -> tuple[list[str], int]:
    """The collective instructions inside any loop (a while body, or what it calls), and the
    number of loops: ``([instruction, ...], loops)``."""
    comps = computations(hlo)
    bodies = [m.group(1) for lines in comps.values() for line in lines
              for m in [_LOOP_BODY.search(line)] if m]
    inside, todo = set(), list(bodies)
    while todo:
        name = todo.pop()
        if name in inside or name not in comps:
            continue
        inside.add(name)
        for line in comps[name]:
            todo += _CALLED.findall(line)
            for group in _BRANCHES.findall(line):
                todo += [b.strip().lstrip("%") for b in group.split(",")]
    found = [line.strip()[:120] for name in sorted(inside) for line in comps[name]
             if _COLLECTIVE.search(line)]
    return found, len(bodies)


def loop_trip_counts(hlo: str) -> list[int]:
    """The known trip counts of the compiled program's loops, sorted."""
    return sorted(int(n) for n in re.findall(r'known_trip_count":\{"n":"(\d+)"', hlo))


def check_collective_counter(mesh: Any) -> None:
    """The counter finds a collective inside a loop (so the checks below can fail): GSPMD's
    program for a Newton-Schulz-like loop on a matrix whose rows are split over ``mesh``'s
    axis ``"x"`` has one. Lowered from shapes only, so it runs in one process or in several."""
    x = jax.ShapeDtypeStruct((8 * mesh.devices.size, 32), jnp.float32,
                             sharding=NamedSharding(mesh, P("x", None)))

    def loop(x: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, 3, lambda i, y: y @ (y.T @ y) * 0.1, x)

    found, loops = collectives_in_loops(jax.jit(loop).lower(x).compile().as_text())
    assert loops >= 1 and found, (loops, found)


DIMS = MuonDimensionNumbers(-2, -1)  # (layers, rows, cols): axis 0 is the layer axis
OPTIMIZERS: dict[str, Callable[[Any], Any]] = {
    "muon": lambda mesh: ft.contrib.muon(
        1e-2, muon_weight_dimension_numbers={"w": DIMS, "b": None}, mesh=mesh),
    "normuon": lambda mesh: ft.contrib.normuon(
        1e-2, muon_weight_dimension_numbers={"w": DIMS, "b": None}, mesh=mesh),
    "adamuon": lambda mesh: ft.contrib.adamuon(
        1e-2, muon_weight_dimension_numbers={"w": DIMS, "b": None}, mesh=mesh),
    "dion": lambda mesh: ft.contrib.dion(1e-2, rank=0.5, dion_mask={"w": True, "b": False},
                                         mesh=mesh),
    "soap": lambda mesh: ft.contrib.soap(1e-2, precondition_frequency=2,
                                         weight_dimension_numbers={"w": DIMS, "b": None},
                                         mesh=mesh),
    "shampoo": lambda mesh: ft.contrib.shampoo(
        1e-2, start_preconditioning_step=1, precondition_frequency=2,
        weight_dimension_numbers={"w": DIMS, "b": None}, mesh=mesh),
    "kron": lambda mesh: ft.contrib.kron(1e-2, weight_dimension_numbers={"w": DIMS, "b": None},
                                         mesh=mesh),
}
# The stacked weight's shape per optimizer: SOAP's layers are square, because a rectangular
# layer's first statistic on its longer side is rank-deficient and eigh's basis of its null
# space is then rounding's choice (one device and eight round differently).
SHAPES = {name: (8, 16, 16) if name == "soap" else (8, 16, 24) for name in OPTIMIZERS}
# The stacked weight's shardings: each device its layers; each device a slice of every
# layer's rows (tensor parallel).
SPECS = {"layers": P("x", None, None), "rows": P(None, "x", None)}


def host_params(name: str) -> dict[str, np.ndarray]:
    """The float64 parameters for optimizer ``name``, the same in every process: a stacked
    weight ``"w"`` of shape ``SHAPES[name]`` and a bias ``"b"`` (the AdamW leaf)."""
    rng = np.random.default_rng(sorted(OPTIMIZERS).index(name))
    return {"w": rng.normal(size=SHAPES[name]), "b": rng.normal(size=SHAPES[name][-1:])}


def three_steps(opt: Any, params: Any) -> tuple:
    """Three jitted steps on gradients ``sin(t p)``: the params and the compiled step's HLO."""
    state = jax.jit(opt.init)(params)

    @jax.jit
    def step(p: Any, s: Any, t: Any) -> tuple:
        u, s = opt.update(jax.tree.map(lambda x: jnp.sin(x * t), p), s, p)
        return ft.apply_updates(p, u), s

    hlo = step.lower(params, state, 1.0).compile().as_text()
    for t in range(1, 4):
        params, state = step(params, state, float(t))
    return params, hlo


def check_stacked_weight_has_no_collective_in_loops() -> None:
    """For each matrix optimizer with ``mesh=`` on an (8, 16, 24) stacked weight (SOAP's
    (8, 16, 16): ``SHAPES``) sharded over
    its layers and over its rows (8 devices, auto axes): no collective inside any loop of the
    compiled program, and the numbers of three steps equal one device's (float64)."""
    mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    check_collective_counter(mesh)
    problems = []
    with enable_x64(True):
        for name, make in OPTIMIZERS.items():
            params = {k: jnp.asarray(v, jnp.float64) for k, v in host_params(name).items()}
            one, _ = three_steps(make(None), params)
            for where, spec in SPECS.items():
                sharded = {"w": jax.device_put(params["w"], NamedSharding(mesh, spec)),
                           "b": jax.device_put(params["b"], NamedSharding(mesh, P()))}
                split, hlo = three_steps(make(mesh), sharded)
                found, loops = collectives_in_loops(hlo)
                if found:
                    problems.append(f"{name}, weight split over its {where}: {len(found)} "
                                    f"collectives inside its {loops} loops, e.g. {found[0]}")
                for k in one:
                    np.testing.assert_allclose(split[k], one[k], rtol=1e-10, atol=1e-12,
                                               err_msg=f"{name} {k}, split over {where}")
    assert not problems, "\n".join(problems)


CHECKS["check_stacked_weight_has_no_collective_in_loops"] = (
    check_stacked_weight_has_no_collective_in_loops)
