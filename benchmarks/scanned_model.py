#!/usr/bin/env python
"""Train-step time of a scanned Flax transformer against its unrolled twin, per optimizer.

The model is tests/scanned_transformer.py's (pre-LN blocks: causal multi-head attention and
a Dense-gelu-Dense MLP), in float32, at ``--layers`` layers of width ``--width`` (4 heads, a
4x MLP), a batch of 8 sequences of 32 vectors. ``scanned``: ``flax.linen.scan`` over the
layers, each weight one stacked ``(L, ...)`` leaf, the matrix optimizers given dimension
numbers (the layer axis a batch axis); ``unrolled``: ``layers_0`` ... ``layers_{L-1}``, a
leaf per layer and weight, the same dimension numbers per layer. Both compute the same
numbers (tests/test_scanned_model.py).

Per optimizer and model: lower + compile seconds of the jitted, donated train step
(gradient, update, apply), and the median and mean step time over ``--steps`` steps (the
scanned and the unrolled step interleaved call by call, alternating which goes first, so
both share the machine's drift; the mean includes SOAP's refresh every 10 steps). The claim
is the ratio scanned / unrolled, measured in one run.

Needs flax (the ``flax`` extra; ``make bench``'s venv has it).
Usage: ``python benchmarks/scanned_model.py [--layers 4] [--width 64] [--steps 30]``
(prints the table); ``benchmarks/stacked_compile.py`` runs it and writes it with its own.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import functrain  # noqa: E402
import scanned_transformer as sm  # noqa: E402

LR = 1e-3
OPTIMIZERS: dict[str, Callable[[Any], functrain.GradientTransformation]] = {
    "adamw": lambda params: functrain.adamw(LR),
    "muon": lambda params: functrain.contrib.muon(
        LR, muon_weight_dimension_numbers=sm.dimension_numbers(params, muon=True)),
    "soap": lambda params: functrain.contrib.soap(
        LR, weight_dimension_numbers=sm.dimension_numbers(params)),
    "shampoo": lambda params: functrain.contrib.shampoo(
        LR, weight_dimension_numbers=sm.dimension_numbers(params)),
    "kron": lambda params: functrain.contrib.kron(
        LR, weight_dimension_numbers=sm.dimension_numbers(params)),
}
BATCH, SEQ, HEADS = 8, 32, 4


def build(model: Any, opt: functrain.GradientTransformation, params: Any, x: jax.Array,
          y: jax.Array) -> dict:
    """The compiled donated train step of ``model`` with ``opt``; its lower and compile s."""
    def step(params, state, x, y):
        grads = jax.grad(lambda p: sm.mse(model, p, x, y))(params)
        updates, state = opt.update(grads, state, params)
        return functrain.apply_updates(params, updates), state

    state = opt.init(params)
    t0 = time.perf_counter()
    lowered = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, x, y)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    return {"compiled": compiled, "carry": (params, state), "lower_s": t1 - t0,
            "compile_s": t2 - t1}


def bench(opts: list[str], layers: int, width: int, steps: int, warmup: int = 5) -> dict:
    """Compile and step times of the scanned and the unrolled model, per optimizer.

    Args:
      opts: names from :data:`OPTIMIZERS`.
      layers: the number of transformer blocks.
      width: the model width (4 heads, MLP ``4 * width``).
      steps: timed steps per model (after ``warmup`` untimed ones).
      warmup: untimed steps first.

    Returns:
      ``{"config": ..., "rows": {opt: {"scanned": {...}, "unrolled": {...},
      "step_ratio": scanned / unrolled, "compile_ratio": ...}}}``, times in seconds.
    """
    scanned, unrolled = sm.models(layers, width, HEADS, 4 * width)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(BATCH, SEQ, width)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(BATCH, SEQ, width)), jnp.float32)
    params = sm.init_params(scanned, x)
    trees = {"scanned": (scanned, params), "unrolled": (unrolled, sm.unstack(params, layers))}
    rows = {}
    for name in opts:
        built = {kind: build(model, OPTIMIZERS[name](p), jax.tree_util.tree_map(jnp.copy, p),
                             x, y) for kind, (model, p) in trees.items()}
        times: dict = {kind: [] for kind in built}
        order = list(built)
        for i in range(warmup + steps):  # call by call, alternating which goes first
            for kind in order[i % 2:] + order[:i % 2]:
                b = built[kind]
                t0 = time.perf_counter()
                b["carry"] = jax.block_until_ready(b["compiled"](*b["carry"], x, y))
                if i >= warmup:
                    times[kind].append(time.perf_counter() - t0)
        row = {kind: {"lower_s": b["lower_s"], "compile_s": b["compile_s"],
                      "step_s": statistics.median(times[kind]),
                      "mean_step_s": statistics.fmean(times[kind]),
                      "state_leaves": len(jax.tree_util.tree_leaves(b["carry"][1]))}
               for kind, b in built.items()}
        s, u = row["scanned"], row["unrolled"]
        row["step_ratio"] = s["step_s"] / u["step_s"]
        row["compile_ratio"] = ((s["lower_s"] + s["compile_s"])
                                / (u["lower_s"] + u["compile_s"]))
        rows[name] = row
        print(f"# scanned model, {name}: step {1e3 * s['step_s']:.2f} ms scanned, "
              f"{1e3 * u['step_s']:.2f} ms unrolled", flush=True)
    n = sum(int(np.size(a)) for a in jax.tree_util.tree_leaves(params))
    return {"config": {"layers": layers, "width": width, "heads": HEADS, "hidden": 4 * width,
                       "batch": BATCH, "seq": SEQ, "params": n, "steps": steps,
                       "lr": LR, "dtype": "float32"}, "rows": rows}


def markdown(results: dict) -> str:
    """The table of :func:`bench`'s results."""
    c = results["config"]
    lines = [f"**Scanned model: train step** ({c['layers']} layers, width {c['width']}, "
             f"{c['params']:,} params, batch {c['batch']} x {c['seq']}, {c['dtype']}; median "
             f"of {c['steps']} steps, scanned and unrolled interleaved call by call; the mean "
             f"counts SOAP's refreshes, every 10 steps)", "",
             "| optimizer | scanned: lower s, compile s, step ms (mean) | unrolled: lower s, "
             "compile s, step ms (mean) | step scanned / unrolled | compile scanned / "
             "unrolled | state arrays scanned, unrolled |",
             "|---|---|---|---|---|---|"]
    for name, r in results["rows"].items():
        s, u = r["scanned"], r["unrolled"]
        lines.append(
            f"| {name} | {s['lower_s']:.2f}, {s['compile_s']:.2f}, {1e3 * s['step_s']:.2f} "
            f"({1e3 * s['mean_step_s']:.2f}) | {u['lower_s']:.2f}, {u['compile_s']:.2f}, "
            f"{1e3 * u['step_s']:.2f} ({1e3 * u['mean_step_s']:.2f}) | "
            f"{r['step_ratio']:.2f} | {r['compile_ratio']:.2f} | "
            f"{s['state_leaves']}, {u['state_leaves']} |")
    return "\n".join(lines)


def add_arguments(ap: argparse.ArgumentParser, prefix: str = "") -> None:
    """This benchmark's flags (``--{prefix}layers`` ...), for its main and stacked_compile's."""
    ap.add_argument(f"--{prefix}opts", default=",".join(OPTIMIZERS))
    ap.add_argument(f"--{prefix}layers", type=int, default=4)
    ap.add_argument(f"--{prefix}width", type=int, default=64)
    ap.add_argument(f"--{prefix}steps", type=int, default=30)


def from_arguments(args: argparse.Namespace, ap: argparse.ArgumentParser,
                   prefix: str = "") -> dict:
    """Run :func:`bench` with the flags of :func:`add_arguments`."""
    get = lambda name: getattr(args, prefix.replace("-", "_") + name)  # noqa: E731
    opts = [o.strip() for o in get("opts").split(",")]
    bad = [o for o in opts if o not in OPTIMIZERS]
    if bad:
        ap.error(f"unknown optimizers {bad}; choose from {','.join(OPTIMIZERS)}")
    return bench(opts, get("layers"), get("width"), get("steps"))


def main(argv: list | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    args = ap.parse_args(argv)
    results = from_arguments(args, ap)
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
