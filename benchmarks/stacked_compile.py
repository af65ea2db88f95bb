"""Compile time of the matrix optimizers against depth: one stacked ``(L, 64, 64)`` leaf
(``weight_dimension_numbers=MuonDimensionNumbers(-2, -1)``, a scanned model's weight)
against the same ``L`` layers as separate ``(64, 64)`` leaves, for L = 4, 16, 64.

Times ``lower`` (tracing: Python work per leaf) and ``compile`` (XLA) of one jitted
``update`` + ``apply_updates`` step, each the best of ``--repeats`` fresh compiles, and
counts the computations of the optimized program (fused kernels, loop bodies, branches).
Adam's unstacked step is the baseline. Prints a markdown table.
Usage: ``python benchmarks/stacked_compile.py [--repeats 2] [--layers 4 16 64]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import functrain  # noqa: E402
from functrain.contrib import MuonDimensionNumbers  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 16, 64])
    args = ap.parse_args()
    compile_once(functrain.adam(1e-3), {"w": jnp.zeros(3)})  # warm up
    print(f"{jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}; "
          f"best of {args.repeats}")
    print()
    print("| optimizer | L | unstacked: lower s, compile s, computations | stacked: lower s, "
          "compile s, computations | compile unstacked / stacked | stacked compile / "
          "adam's (unstacked) |")
    print("|---|---|---|---|---|---|")
    adam = {n: measure("adam", n, False, args.repeats) for n in args.layers}
    for name in OPTIMIZERS:
        for n in args.layers:
            un = adam[n] if name == "adam" else measure(name, n, False, args.repeats)
            st = measure(name, n, True, args.repeats)
            print(f"| {name} | {n} | {un[0]:.2f}, {un[1]:.2f}, {un[2]} | {st[0]:.2f}, "
                  f"{st[1]:.2f}, {st[2]} | {un[1] / st[1]:.1f} | {st[1] / adam[n][1]:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
