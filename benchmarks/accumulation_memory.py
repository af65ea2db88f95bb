"""Gradient accumulation's memory: ``MultiSteps(adamw)`` against ``adam_accumulation``.

``MultiSteps`` (optax's and functrain's) keeps a parameter-sized buffer of the running mean
gradient beside Adam's two moments; ``functrain.contrib.adam_accumulation`` (AdamA, Zhang
et al., 2023) adds each micro-batch gradient into the moments and keeps none. On a tree of
dense layers (~4.2M float32 parameters by default), for ``N`` micro-batches per optimizer
step, this compiles one micro-step of each under ``jax.jit`` with the params and the state
donated (as a training step is), in two forms:

* ``grads in``: ``step(params, state, grads) -> (params, state)``, the gradient an argument;
* ``backward inside``: ``step(params, state, batch)``, the gradient of an MLP's mean
  squared error on the batch computed in the step (so it is a temporary, not an argument);

and prints, from ``compiled.memory_analysis()``, the argument, output, alias and temp bytes
and the peak (``argument + output - alias + temp``: the live bytes while the step runs),
the state's bytes (``nbytes`` of every array of ``init``'s state), and the saving against
``MultiSteps(adamw)`` as a ratio. ``adam_accumulation`` selects its update with
``jnp.where``; the row ``adam_accumulation (lax.cond)`` is the same rule with the update
computed in a ``lax.cond`` branch instead (built here from the same stage), to show which
keeps the peak lower. Every row also gets the median wall time of one optimizer step
(``N`` micro-steps, calls interleaved across the rows, ``--reps`` rounds) as a ratio to
``MultiSteps(adamw)``'s in the same run.

Writes ``accumulation_memory.md`` and ``accumulation_memory.json`` to ``--out`` (default
``benchmarks/results``). ``--tiny`` runs a small tree (a smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

import functrain
from functrain.contrib import adam_accumulation, scale_by_adam_accumulation
from functrain.numerics import adam_direction

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from quantized_state import fake_grads, n_params, state_bytes  # noqa: E402  (one copy)
from speedrun import load_average  # noqa: E402  (one copy, the speedrun's)

LR, WD, B1, B2, EPS = 1e-3, 1e-4, 0.9, 0.999, 1e-8
VARIANTS = ("optax.MultiSteps(adamw)", "MultiSteps(adamw)", "adam_accumulation",
            "adam_accumulation (lax.cond)")
BASELINE = "MultiSteps(adamw)"


def dense_tree(width: int = 1024, layers: int = 4, seed: int = 0) -> dict:
    """``layers`` dense layers ``width x width`` with biases (4 x 1024: 4,198,400 params)."""
    keys = jax.random.split(jax.random.PRNGKey(seed), layers)
    return {f"layer{i}": {"w": jax.random.normal(k, (width, width)) / np.sqrt(width),
                          "b": jnp.zeros(width)} for i, k in enumerate(keys)}


def mlp_loss(params: dict, batch: tuple) -> jax.Array:
    """Mean squared error of a tanh MLP on ``batch = (x, y)``."""
    x, y = batch
    for i in range(len(params)):
        layer = params[f"layer{i}"]
        x = x @ layer["w"] + layer["b"]
        x = jnp.tanh(x) if i < len(params) - 1 else x
    return jnp.mean((x - y) ** 2)


def cond_variant(n: int) -> functrain.GradientTransformation:
    """AdamA with the update in a ``lax.cond`` branch: the stage's moments (its own ``where``
    -selected output unused), then ``lax.cond(emit, adamw step from the moments, zeros)``."""
    stage = scale_by_adam_accumulation(n, B1, B2, EPS)

    def update(updates: Any, state: Any, params: Any = None) -> tuple:
        _, new = stage.update(updates, state, params)
        t = new.count

        def emit() -> Any:
            return jax.tree_util.tree_map(
                lambda m, v, p: -LR * (adam_direction(m, v, 1 - B1 ** t, 1 - B2 ** t, EPS)
                                       + WD * p), new.mu, new.nu, params)

        def wait() -> Any:
            return jax.tree_util.tree_map(jnp.zeros_like, updates)

        return jax.lax.cond(new.mini_step == 0, emit, wait), new

    return functrain.GradientTransformation(stage.init, update)


def make(variant: str, n: int) -> Any:
    if variant == "optax.MultiSteps(adamw)":
        return optax.MultiSteps(optax.adamw(LR, B1, B2, EPS, weight_decay=WD), n)
    if variant == "MultiSteps(adamw)":
        return functrain.MultiSteps(functrain.adamw(LR, B1, B2, EPS, weight_decay=WD), n)
    if variant == "adam_accumulation":
        return adam_accumulation(LR, n, B1, B2, EPS, weight_decay=WD)
    if variant == "adam_accumulation (lax.cond)":
        return cond_variant(n)
    raise ValueError(f"unknown variant {variant!r}")


def step_fn(opt: Any, backward: bool) -> Callable:
    def step(params, state, data):
        grads = jax.grad(mlp_loss)(params, data) if backward else data
        updates, state = opt.update(grads, state, params)
        return functrain.apply_updates(params, updates), state
    return step


def memory_row(variant: str, form: str, params: Any, data: Any, n: int) -> dict:
    opt = make(variant, n)
    state = opt.init(params)
    compiled = jax.jit(step_fn(opt, form == "backward inside"), donate_argnums=(0, 1)).lower(
        params, state, data).compile()
    mem = compiled.memory_analysis()
    row = {"variant": variant, "form": form, "num_micro_batches": n,
           "n_params": n_params(params), "state_bytes": state_bytes(state)}
    for field in ("argument", "output", "alias", "temp"):
        row[f"{field}_bytes"] = int(getattr(mem, f"{field}_size_in_bytes", 0) or 0)
    row["peak_bytes"] = (row["argument_bytes"] + row["output_bytes"] - row["alias_bytes"]
                         + row["temp_bytes"])
    row["_compiled"], row["_state"] = compiled, state
    return row


def time_rows(rows: list, params: Any, data: dict, n: int, reps: int) -> None:
    """``step_ms``: median wall time of ``n`` micro-steps (one optimizer step), the rows'
    calls interleaved round by round; ``time_ratio`` to the baseline of the same form."""
    carried = {id(r): (jax.tree_util.tree_map(jnp.copy, params),
                       jax.tree_util.tree_map(jnp.copy, r["_state"])) for r in rows}
    times: dict = {id(r): [] for r in rows}
    for round_ in range(reps + 1):  # round 0 warms up
        for r in rows:
            t0 = time.perf_counter()
            p, s = carried[id(r)]
            for _ in range(n):
                p, s = r["_compiled"](p, s, data[r["form"]])
            jax.block_until_ready(p)
            carried[id(r)] = (p, s)
            if round_:
                times[id(r)].append(time.perf_counter() - t0)
    base = {r["form"]: statistics.median(times[id(r)]) for r in rows if r["variant"] == BASELINE}
    for r in rows:
        r["step_ms"] = 1e3 * statistics.median(times[id(r)])
        r["time_ratio"] = statistics.median(times[id(r)]) / base[r["form"]]


def add_savings(rows: list) -> None:
    base = {r["form"]: r for r in rows if r["variant"] == BASELINE}
    for r in rows:
        b = base[r["form"]]
        r["peak_ratio"] = r["peak_bytes"] / b["peak_bytes"]
        r["state_ratio"] = r["state_bytes"] / b["state_bytes"]
        r["peak_saved_bytes"] = b["peak_bytes"] - r["peak_bytes"]


def mb(x: float) -> str:
    return f"{x / 1e6:.2f}"


def markdown(rows: list, meta: dict) -> str:
    lines = [f"# Gradient accumulation's memory: MultiSteps(adamw) vs adam_accumulation",
             "",
             f"{meta['n_params']:,} float32 parameters ({meta['tree']}), "
             f"num_micro_batches={meta['num_micro_batches']}; one parameter-sized float32 "
             f"array = {mb(4 * meta['n_params'])} MB. {meta['machine']}, {meta['backend']}, "
             f"JAX {meta['jax']}; load average {meta['load']} (before) / "
             f"{meta['load_after']} (after). Bytes from `compiled.memory_analysis()` of one "
             "jitted micro-step with params and state donated; peak = argument + output - "
             "alias + temp. Time: median of one optimizer step (N micro-steps) over "
             f"{meta['reps']} interleaved rounds, as a ratio to MultiSteps(adamw)'s.",
             ""]
    for form in ("grads in", "backward inside"):
        lines += [f"## {form}", "",
                  "| variant | state MB | argument MB | output MB | alias MB | temp MB | "
                  "peak MB | peak / MultiSteps | saved MB | state / MultiSteps | time ratio |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            if r["form"] != form:
                continue
            lines.append(
                f"| {r['variant']} | {mb(r['state_bytes'])} | {mb(r['argument_bytes'])} | "
                f"{mb(r['output_bytes'])} | {mb(r['alias_bytes'])} | {mb(r['temp_bytes'])} | "
                f"{mb(r['peak_bytes'])} | {r['peak_ratio']:.3f} | {mb(r['peak_saved_bytes'])} "
                f"| {r['state_ratio']:.3f} | {r.get('time_ratio', float('nan')):.2f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Any = None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="examples per micro-batch")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--tiny", action="store_true", help="a 64-wide tree, 2 rounds")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if args.tiny:
        args.width, args.reps = 64, 2
    load = load_average()
    params = dense_tree(args.width, args.layers)
    kx, ky = jax.random.split(jax.random.PRNGKey(2))
    data = {"grads in": fake_grads(params),
            "backward inside": (jax.random.normal(kx, (args.batch, args.width)),
                                jax.random.normal(ky, (args.batch, args.width)))}
    n = args.micro_batches
    rows = [memory_row(v, form, params, data[form], n)
            for form in ("grads in", "backward inside") for v in VARIANTS]
    add_savings(rows)
    time_rows(rows, params, data, n, args.reps)
    meta = {"machine": f"{os.cpu_count()} CPU cores ({platform.machine()})",
            "backend": jax.devices()[0].platform, "jax": jax.__version__,
            "optax": optax.__version__, "load": load, "load_after": load_average(),
            "tree": f"{args.layers} dense layers {args.width}x{args.width} with biases",
            "n_params": n_params(params), "num_micro_batches": n, "reps": args.reps}
    text = markdown(rows, meta)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "accumulation_memory.md").write_text(text + "\n")
    clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    (args.out / "accumulation_memory.json").write_text(
        json.dumps({"meta": meta, "rows": clean}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
