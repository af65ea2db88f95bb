"""Compile time of the matrix optimizers against depth: one stacked ``(L, 64, 64)`` leaf
(``weight_dimension_numbers=MuonDimensionNumbers(-2, -1)``, a scanned model's weight)
against the same ``L`` layers as separate ``(64, 64)`` leaves, for L = 4, 16, 64.

Times ``lower`` (tracing: Python work per leaf) and ``compile`` (XLA) of one jitted
``update`` + ``apply_updates`` step, each the best of ``--repeats`` fresh compiles, and
counts the computations of the optimized program (fused kernels, loop bodies, branches).
Adam's unstacked step is the baseline. Prints a markdown table.
Usage: ``python benchmarks/stacked_compile.py [--repeats 2] [--layers 4 16 64]``.

``--grouped``: instead, ``group_same_shapes`` (the default) against the per-leaf program
(``group_same_shapes=False``) on unstacked trees: the transformer tree of
``benchmarks/matrix_optimizers.py``, 100 ``(64, 64)`` layers and ``--layers`` ``(64, 64)``
layers. Per optimizer and tree: lower and compile seconds (medians of ``--repeats``
compiles, per-leaf, grouped and adam's interleaved), the computations of the optimized
program, and the median step time (blocks of 10 donated steps, the two programs
interleaved), as ratios to adam's compile and to the per-leaf step in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "stress"))

import functrain  # noqa: E402
from functrain.contrib import MuonDimensionNumbers  # noqa: E402
from run_stress import small_transformer_shapes  # noqa: E402

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


GROUPED = {
    "soap": lambda grouped: functrain.contrib.soap(1e-3, group_same_shapes=grouped),
    "shampoo": lambda grouped: functrain.contrib.shampoo(1e-3, group_same_shapes=grouped),
    "kron": lambda grouped: functrain.contrib.kron(1e-3, group_same_shapes=grouped),
}


def step_ms(opts: list, shapes: dict, blocks: int = 5, steps: int = 10) -> list:
    """Median ms per step of each optimizer's donated jitted step, blocks interleaved."""
    rng = np.random.default_rng(0)
    runs = []
    for opt in opts:
        params = {k: jnp.asarray(0.02 * rng.standard_normal(v), jnp.float32)
                  for k, v in shapes.items()}
        grads = jax.tree_util.tree_map(lambda x: x + 0.01, params)

        def step(p, s, g, opt=opt):
            u, s = opt.update(g, s, p)
            return functrain.apply_updates(p, u), s
        run = jax.jit(step, donate_argnums=(0, 1))
        params, state = run(params, opt.init(params), grads)  # compile, first step
        runs.append([run, params, state, grads, []])
    for _ in range(blocks):
        for r in runs:
            t0 = time.perf_counter()
            for _ in range(steps):
                r[1], r[2] = r[0](r[1], r[2], r[3])
            jax.block_until_ready(r[1])
            r[4].append((time.perf_counter() - t0) / steps * 1e3)
    return [statistics.median(r[4]) for r in runs]


def grouped_table(trees: dict, repeats: int) -> None:
    """The ``--grouped`` table: per-leaf against grouped, on unstacked trees."""
    print("| tree | optimizer | per-leaf: lower s, compile s, computations | grouped: lower s, "
          "compile s, computations | compile / adam's: per-leaf, grouped | step ms: per-leaf, "
          "grouped (grouped / per-leaf) |")
    print("|---|---|---|---|---|---|")
    for tree, shapes in trees.items():
        params = {k: jax.ShapeDtypeStruct(v, jnp.float32) for k, v in shapes.items()}
        for name, make in GROUPED.items():
            runs = [[compile_once(opt, params) for opt in (functrain.adam(1e-3), make(False),
                                                              make(True))]
                    for _ in range(repeats)]
            med = [[statistics.median(r[k][j] for r in runs) for j in range(2)] + [runs[0][k][2]]
                   for k in range(3)]
            adam, per, grp = med
            ms = step_ms([make(False), make(True)], shapes)
            print(f"| {tree} | {name} | {per[0]:.2f}, {per[1]:.2f}, {per[2]} | {grp[0]:.2f}, "
                  f"{grp[1]:.2f}, {grp[2]} | {per[1] / adam[1]:.1f}, {grp[1] / adam[1]:.1f} | "
                  f"{ms[0]:.2f}, {ms[1]:.2f} ({ms[1] / ms[0]:.2f}) |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--grouped", action="store_true")
    ap.add_argument("--trees", nargs="+", default=None,
                    help="with --grouped: transformer, 100layers, L<n> (default: all)")
    args = ap.parse_args()
    compile_once(functrain.adam(1e-3), {"w": jnp.zeros(3)})  # warm up
    if args.grouped:
        trees = {"transformer": small_transformer_shapes(),
                 "100layers": {f"layer{i:03d}": (64, 64) for i in range(100)}}
        trees.update({f"L{n}": {f"layer{i:03d}": (64, 64) for i in range(n)}
                      for n in args.layers})
        trees = {k: v for k, v in trees.items() if args.trees is None or k in args.trees}
        print(f"{jax.devices()[0].device_kind} ({jax.default_backend()}), jax "
              f"{jax.__version__}; compile: median of {args.repeats}; load average "
              f"{os.getloadavg()[0]:.1f}")
        print()
        grouped_table(trees, args.repeats)
        print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
        return
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
