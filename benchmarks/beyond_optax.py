#!/usr/bin/env python
"""The optimizers optax does not have (shampoo, soap, kron, mars, came) and muon, against adam.

There is no optax version to compare with, so each is measured against functrain's
``adam`` on the same models, in one process: trace+lower and XLA compile time of the
jitted, donated step, the median step time (calls interleaved with adam's, so both share
the machine's drift), the optimizer state's bytes per parameter, and the compiled step's
peak memory. Two models:

* ``100 layers``: 100 leaves of (64, 64) (a deep stack of square layers: what made an
  external JAX Shampoo take 284 s to trace);
* ``transformer``: the GPT-like tree of benchmarks/run.py at about 2M parameters (12
  layers, embeddings, biases and norm scales).

Usage::

    python benchmarks/beyond_optax.py            # both models, ~5 min on 2 cores
    python benchmarks/beyond_optax.py --quick    # fewer timed steps
    python benchmarks/beyond_optax.py --opts adam,shampoo --models 100layers

Writes ``results/beyond_optax.json`` and ``results/beyond_optax.md`` and prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import time
from typing import Any

import jax
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import functrain  # noqa: E402
from run import build_step, copy_tree, machine_info, make_tree, transformer_shapes  # noqa: E402

LR = 1e-3
OPTIMIZERS = {
    "adam": lambda: functrain.adam(LR),
    "muon": lambda: functrain.contrib.muon(LR),
    "shampoo": lambda: functrain.contrib.shampoo(LR),
    "soap": lambda: functrain.contrib.soap(LR),
    "kron": lambda: functrain.contrib.kron(LR),
    "mars": lambda: functrain.contrib.mars(LR),
    "came": lambda: functrain.contrib.came(LR),
}
MODELS = {
    "100layers": lambda: {f"layer{i:03d}/w": (64, 64) for i in range(100)},
    "transformer": lambda: transformer_shapes(2_000_000),
}


def build(opt: Any, params: Any, grads: Any) -> dict:
    """run.py's ``build_step`` for one functrain optimizer, plus the state's bytes."""
    lib = {"make": lambda _: opt, "apply": functrain.apply_updates,
           "ctx": contextlib.nullcontext}
    built = build_step(lib, "", params, grads)
    built["state_bytes"] = int(sum(x.size * x.dtype.itemsize
                                   for x in jax.tree_util.tree_leaves(built["state"])))
    return built


def bench_model(model: str, opts: list[str], reps: int) -> dict:
    shapes = MODELS[model]()
    params0, grads = make_tree(shapes, 0, 1.0), make_tree(shapes, 1, 1e-2)
    n = sum(int(np.prod(s)) for s in shapes.values())
    built = {name: build(OPTIMIZERS[name](), params0, grads) for name in opts}
    carry = {name: (copy_tree(params0), built[name].pop("state"))
             for name in opts}
    times = {name: [] for name in opts}
    for i in range(reps + 2):
        for name in opts[i % len(opts):] + opts[:i % len(opts)]:
            t0 = time.perf_counter()
            out = built[name]["compiled"](carry[name][0], carry[name][1], grads)
            jax.block_until_ready(out)
            if i >= 2:
                times[name].append(time.perf_counter() - t0)
            carry[name] = out
    rows = {}
    for name in opts:
        b = built[name]
        rows[name] = {"lower_s": b["lower_s"], "compile_s": b["compile_s"],
                      "step_s": statistics.median(times[name]),
                      "state_bytes_per_param": b["state_bytes"] / n,
                      "peak_bytes": b["peak_bytes"]}
    base = rows.get("adam")
    if base:
        for r in rows.values():
            r["step_vs_adam"] = r["step_s"] / base["step_s"]
            r["compile_vs_adam"] = (r["lower_s"] + r["compile_s"]) / (
                base["lower_s"] + base["compile_s"])
            r["peak_vs_adam"] = r["peak_bytes"] / base["peak_bytes"]
    return {"model": model, "params": n, "leaves": len(shapes), "rows": rows}


def markdown(results: dict) -> str:
    lines = [f"Measured {results['date']} on {results['machine']['cpu']} "
             f"x{results['machine']['cpu_count']} ({results['machine']['backend']}), "
             f"{results['reps']} timed steps each, medians.", ""]
    for m in results["models"]:
        lines += [f"**{m['model']}** ({m['params']:,} params, {m['leaves']} leaves)", "",
                  "| optimizer | trace+lower s | compile s | step ms | step / adam | "
                  "state bytes/param | peak MB | peak / adam |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, r in m["rows"].items():
            lines.append(
                f"| {name} | {r['lower_s']:.2f} | {r['compile_s']:.2f} | "
                f"{1e3 * r['step_s']:.2f} | {r.get('step_vs_adam', float('nan')):.2f} | "
                f"{r['state_bytes_per_param']:.1f} | {r['peak_bytes'] / 1e6:.1f} | "
                f"{r.get('peak_vs_adam', float('nan')):.2f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--opts", default=",".join(OPTIMIZERS))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--name", default="beyond_optax")
    args = ap.parse_args(argv)
    opts = [o.strip() for o in args.opts.split(",")]
    for o in opts:
        if o not in OPTIMIZERS:
            ap.error(f"unknown optimizer {o!r}; choose from {','.join(OPTIMIZERS)}")
    models = [m.strip() for m in args.models.split(",")]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}; choose from {','.join(MODELS)}")
    reps = args.reps or (3 if args.quick else 11)
    results = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
               "machine": machine_info(),
               "reps": reps, "lr": LR, "models": []}
    for model in models:
        t0 = time.perf_counter()
        results["models"].append(bench_model(model, opts, reps))
        print(f"# {model}: {time.perf_counter() - t0:.1f} s", flush=True)
    save_table(results, markdown(results), args.out, args.name)
    return results


def save_table(results: dict, text: str, out_dir: str, name: str) -> None:
    """Print ``text`` and write ``results`` and ``text`` to ``out_dir/name.{json,md}``."""
    print(text)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out_dir, name + ".md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
