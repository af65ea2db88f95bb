"""Compile time of the matrix optimizers against depth: one stacked ``(L, 64, 64)`` leaf
(``weight_dimension_numbers=MuonDimensionNumbers(-2, -1)``, a scanned model's weight)
against the same ``L`` layers as separate ``(64, 64)`` leaves, for L = 4 and 32 (``--layers 4 16
64`` for more).

Times ``lower`` (tracing: Python work per leaf) and ``compile`` (XLA) of one jitted
``update`` + ``apply_updates`` step, each the best of ``--repeats`` fresh compiles, and
counts the computations of the optimized program (fused kernels, loop bodies, branches).
Adam's unstacked step is the baseline. Then the train-step time of a scanned Flax
transformer against its unrolled twin, per optimizer (benchmarks/scanned_model.py).

Prints the tables and writes them with the machine, the load average and every number to
``results/stacked_compile.{md,json}`` (``--out``, ``--name``); ``make bench`` runs it (about
3 minutes on 2 quiet cores).
Usage: ``python benchmarks/stacked_compile.py [--repeats 1] [--layers 4 32] [--opts adam,soap]
[--scanned-layers 4] [--scanned-width 64] [--scanned-steps 30] [--no-scanned]``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import functrain  # noqa: E402
import scanned_model  # noqa: E402
from beyond_optax import save_table  # noqa: E402
from functrain.contrib import MuonDimensionNumbers  # noqa: E402
from run import machine_info  # noqa: E402

DIMS = {"w": MuonDimensionNumbers(-2, -1)}
OPTIMIZERS = {
    "adam": lambda dims: functrain.adam(1e-3),
    "soap": lambda dims: functrain.contrib.soap(1e-3, weight_dimension_numbers=dims),
    "shampoo": lambda dims: functrain.contrib.shampoo(1e-3, weight_dimension_numbers=dims),
    "kron": lambda dims: functrain.contrib.kron(1e-3, weight_dimension_numbers=dims),
}


def compile_once(opt: Any, params: Any) -> tuple[float, float, int]:
    """(seconds to lower, seconds to compile, computations in the optimized program)."""
    state = jax.eval_shape(opt.init, params)

    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return functrain.apply_updates(p, u), s

    t0 = time.perf_counter()
    lowered = jax.jit(step).lower(params, state, params)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    text = compiled.as_text()
    return (t1 - t0, t2 - t1, sum(1 for ln in text.splitlines()
                                  if ln.startswith("%") or ln.startswith("ENTRY")))


def measure(name: str, layers: int, stacked: bool, repeats: int) -> tuple[float, float, int]:
    leaf = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    if stacked:
        params = {"w": jax.ShapeDtypeStruct((layers, 64, 64), jnp.float32)}
    else:
        params = {"w": [leaf] * layers}
    runs = [compile_once(OPTIMIZERS[name](DIMS if stacked and name != "adam" else None),
                         params) for _ in range(repeats)]
    return min(r[0] for r in runs), min(r[1] for r in runs), runs[0][2]


def markdown(results: dict) -> str:
    """The compile-vs-depth table and, if run, the scanned model's."""
    m = results["machine"]
    load = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    lines = [f"Measured {results['date']} on {m['cpu']} x{m['cpu_count']} ({m['backend']}, "
             f"{results['device_kind']}), jax {m['jax']}, git {m.get('git_commit', '?')}; "
             f"load average at start {load(m.get('loadavg_at_start', ()))}, at end "
             f"{load(results.get('loadavg_at_end', ()))}.",
             "",
             f"**Compile time against depth** (best of {results['repeats']} compiles)", "",
             "| optimizer | L | unstacked: lower s, compile s, computations | stacked: lower s, "
             "compile s, computations | compile unstacked / stacked | stacked compile / "
             "adam's (unstacked) |",
             "|---|---|---|---|---|---|"]
    for r in results["depth"]:
        un, st = r["unstacked"], r["stacked"]
        lines.append(f"| {r['optimizer']} | {r['layers']} | {un[0]:.2f}, {un[1]:.2f}, {un[2]} | "
                     f"{st[0]:.2f}, {st[1]:.2f}, {st[2]} | {r['compile_ratio']:.1f} | "
                     f"{r['stacked_vs_adam']:.1f} |")
    if results.get("scanned_model"):
        lines += ["", scanned_model.markdown(results["scanned_model"])]
    return "\n".join(lines)


def main(argv: list | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 32])
    ap.add_argument("--opts", default=",".join(OPTIMIZERS))
    ap.add_argument("--no-scanned", action="store_true",
                    help="skip the scanned model's train-step times")
    scanned_model.add_arguments(ap, prefix="scanned-")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--name", default="stacked_compile")
    args = ap.parse_args(argv)
    opts = [o.strip() for o in args.opts.split(",")]
    if [o for o in opts if o not in OPTIMIZERS]:
        ap.error(f"--opts: choose from {','.join(OPTIMIZERS)}, got {args.opts!r}")
    results = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
               "machine": machine_info(), "device_kind": jax.devices()[0].device_kind,
               "repeats": args.repeats, "depth": []}
    compile_once(functrain.adam(1e-3), {"w": jnp.zeros(3)})  # warm up
    adam = {n: measure("adam", n, False, args.repeats) for n in args.layers}
    for name in opts:
        for n in args.layers:
            un = adam[n] if name == "adam" else measure(name, n, False, args.repeats)
            st = measure(name, n, True, args.repeats)
            results["depth"].append({"optimizer": name, "layers": n, "unstacked": un,
                                     "stacked": st, "compile_ratio": un[1] / st[1],
                                     "stacked_vs_adam": st[1] / adam[n][1]})
            print(f"# {name} L={n}: compile {un[1]:.2f} s unstacked, {st[1]:.2f} s stacked",
                  flush=True)
    if not args.no_scanned:
        results["scanned_model"] = scanned_model.from_arguments(args, ap, prefix="scanned-")
    results["loadavg_at_end"] = os.getloadavg()
    save_table(results, markdown(results), args.out, args.name)
    return results


if __name__ == "__main__":
    main()
