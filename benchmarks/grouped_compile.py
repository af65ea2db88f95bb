"""Compile and step time of SOAP, Shampoo and Kron with ``group_same_shapes`` on unstacked trees.

``group_same_shapes=True`` (opt-in) runs the leaves that share a shape, dtype, dimension
numbers and state layout as one stacked leaf (``functrain.matrix.shape_groups``), keeping the
state per leaf. This script measures it against the per-leaf program
(``group_same_shapes=False``, the default) on the transformer tree of
``benchmarks/matrix_optimizers.py``, 100 ``(64, 64)`` layers and ``--layers`` ``(64, 64)``
layers. Per optimizer and tree: lower and compile seconds (medians of ``--repeats``
compiles, per-leaf, grouped and adam's interleaved), the computations of the optimized
program, and the median step time (blocks of 10 donated steps, the two programs
interleaved), as ratios to adam's compile and to the per-leaf step in the same run. Prints a
markdown table (written up by hand in ``results/matrix_optimizers.md``).
Usage: ``python benchmarks/grouped_compile.py [--repeats 2] [--layers 4 16 64]
[--trees transformer 100layers L4]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "stress"))

import functrain  # noqa: E402
from run_stress import small_transformer_shapes  # noqa: E402
from stacked_compile import compile_once  # noqa: E402

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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--trees", nargs="+", default=None,
                    help="transformer, 100layers, L<n> (default: all)")
    args = ap.parse_args()
    compile_once(functrain.adam(1e-3), {"w": jnp.zeros(3)})  # warm up
    trees = {"transformer": small_transformer_shapes(),
             "100layers": {f"layer{i:03d}": (64, 64) for i in range(100)}}
    trees.update({f"L{n}": {f"layer{i:03d}": (64, 64) for i in range(n)} for n in args.layers})
    trees = {k: v for k, v in trees.items() if args.trees is None or k in args.trees}
    print(f"{jax.devices()[0].device_kind} ({jax.default_backend()}), jax "
          f"{jax.__version__}; compile: median of {args.repeats}; load average "
          f"{os.getloadavg()[0]:.1f}")
    print()
    grouped_table(trees, args.repeats)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
