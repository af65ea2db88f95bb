"""What the flat layout (``functrain.flat_layout`` / ``on_flat_layout``) costs and saves on CPU.

On a tree of many small leaves (default: 500 ``(64, 64)`` kernels and 500 biases, the
accelerator table's 1000-leaf tree), three programs of each optimizer, in one run on this
machine:

* ``optax``: optax's optimizer on the tree;
* ``tree``: functrain's on the tree;
* ``flat``: functrain's through ``on_flat_layout`` on the layout's buffers.

Two steps are timed: the optimizer's step alone (a donated jitted ``(params, state, grads) ->
(params, state)``), and a whole training step of a toy model that reads every leaf
(``sum_i mean(tanh(x W_i + b_i)^2)`` over a shared batch ``x``: gradient, then update), where
the flat program reads its leaves through ``FlatLayout.unflatten`` and differentiates with
respect to the buffers. Reported: compile seconds (lower and compile, medians of
``--repeats``), and median milliseconds per step over blocks of 10 steps, the programs
interleaved, with the ratios to optax. ``on_flat_layout``'s own check (two CPU compiles when
it is built) is timed separately.
Writes ``benchmarks/results/flat_layout.{md,json}``.
Usage: ``python benchmarks/flat_layout.py [--leaves 500] [--repeats 3] [--blocks 7]
[--names adamw lion]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import functrain  # noqa: E402
import optax  # noqa: E402

BUILD = {"adamw": lambda lib: lib.adamw(1e-3),
         "lion": lambda lib: lib.lion(1e-4),
         "clip+adam": lambda lib: lib.chain(lib.clip_by_global_norm(1.0), lib.adam(1e-3))}


def shapes_of(layers: int) -> dict:
    """The tree: ``layers`` (64, 64) kernels and their (64,) biases."""
    return {f"layer{i:03d}": {"b": (64,), "w": (64, 64)} for i in range(layers)}


def model_loss(params: dict, x: jax.Array) -> jax.Array:
    """A loss that reads every leaf once: each layer applied to the shared batch."""
    return sum(jnp.mean(jnp.tanh(x @ layer["w"] + layer["b"]) ** 2)
               for layer in params.values())


def programs(name: str, shapes: dict) -> dict:
    """kind -> (optimizer step, training step, params, grads, optimizer) for the three
    programs, and the seconds on_flat_layout's check took."""
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: jnp.asarray(0.1 * rng.standard_normal(s), jnp.float32),
                          shapes, is_leaf=lambda s: isinstance(s, tuple))
    grads = jax.tree.map(lambda p: 0.01 * p + 0.001, params)
    layout = functrain.flat_layout(params)
    start = time.perf_counter()
    flat_opt = functrain.on_flat_layout(BUILD[name](functrain), layout)
    check_s = time.perf_counter() - start
    out = {}
    for kind, lib, opt, to_tree in (("optax", optax, BUILD[name](optax), None),
                                    ("tree", functrain, BUILD[name](functrain), None),
                                    ("flat", functrain, flat_opt, layout.unflatten)):

        def opt_step(p, s, g, opt=opt, lib=lib):
            u, s = opt.update(g, s, p)
            return lib.apply_updates(p, u), s

        def train_step(p, s, x, opt=opt, lib=lib, to_tree=to_tree):
            g = jax.grad(lambda q: model_loss(to_tree(q) if to_tree else q, x))(p)
            u, s = opt.update(g, s, p)
            return lib.apply_updates(p, u), s

        p = layout.flatten(params) if to_tree else params
        g = layout.flatten(grads) if to_tree else grads
        out[kind] = (opt_step, train_step, p, g, opt)
    return out, check_s


def compile_s(fn, *args, repeats: int) -> float:
    """Median seconds to lower and compile ``fn`` on ``args`` (fresh jit each time)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.jit(fn, donate_argnums=(0, 1)).lower(*args).compile()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def step_ms(runs: dict, blocks: int, steps: int = 10) -> dict:
    """Median ms per step of each (compiled, args) in ``runs``, blocks interleaved."""
    times = {kind: [] for kind in runs}
    for _ in range(blocks):
        for kind, (run, args) in runs.items():
            p, s, third = args
            start = time.perf_counter()
            for _ in range(steps):
                p, s = run(p, s, third)
            jax.block_until_ready(p)
            times[kind].append((time.perf_counter() - start) / steps * 1e3)
            runs[kind] = (run, (p, s, third))
    return {kind: statistics.median(v) for kind, v in times.items()}


def measure(name: str, layers: int, repeats: int, blocks: int) -> dict:
    """One optimizer's row: compile seconds and step ms of the three programs."""
    progs, check_s = programs(name, shapes_of(layers))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((8, 64)), jnp.float32)
    row = {"name": name, "leaves": 2 * layers, "check_s": check_s}
    for which, third_of in (("optimizer step", lambda g: g), ("training step", lambda g: x)):
        runs, compiles = {}, {}
        for kind, (opt_step, train_step, p, g, opt) in progs.items():
            fn = opt_step if which == "optimizer step" else train_step
            args = (p, opt.init(p), third_of(g))
            compiles[kind] = compile_s(fn, *args, repeats=repeats)
            run = jax.jit(fn, donate_argnums=(0, 1))
            copied = jax.tree.map(jnp.copy, (args[0], args[1]))
            p1, s1 = run(*copied, args[2])
            runs[kind] = (run, (p1, s1, args[2]))
        ms = step_ms(runs, blocks)
        row[which] = {"compile_s": compiles, "ms": ms}
    return row


def table(rows: list) -> str:
    """Markdown: per optimizer and step, compile s and ms, and ratios to optax."""
    lines = ["| optimizer | step | compile s: optax / tree / flat | flat x optax | "
             "ms: optax / tree / flat | flat x optax | check s |",
             "|---|---|---|---:|---|---:|---:|"]
    for r in rows:
        for which in ("optimizer step", "training step"):
            c, m = r[which]["compile_s"], r[which]["ms"]
            lines.append(
                f"| {r['name']} | {which} | {c['optax']:.2f} / {c['tree']:.2f} / "
                f"{c['flat']:.2f} | {c['flat'] / c['optax']:.3f} | {m['optax']:.2f} / "
                f"{m['tree']:.2f} / {m['flat']:.2f} | {m['flat'] / m['optax']:.3f} | "
                f"{r['check_s']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leaves", type=int, default=500, help="layers (two leaves each)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=7)
    ap.add_argument("--names", nargs="*", default=list(BUILD))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "flat_layout"))
    args = ap.parse_args()
    rows = []
    for name in args.names:
        rows.append(measure(name, args.leaves, args.repeats, args.blocks))
        print(table(rows[-1:]).splitlines()[-2:], flush=True)
    head = (f"CPU ({os.cpu_count()} cores), JAX {jax.__version__}, optax {optax.__version__}, "
            f"{datetime.date.today()}: {2 * args.leaves} leaves ({args.leaves} (64, 64) "
            f"kernels and biases); medians of {args.repeats} compiles and {args.blocks} "
            f"blocks of 10 steps.\n\n")
    text = head + table(rows) + "\n"
    print(text)
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write(text)
        with open(args.out + ".json", "w") as f:
            json.dump({"jax": jax.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
