"""A benchmark of small hard problems in the spirit of HeavyBall's LightBench (``make lightbench``).

Every optimizer runs every task of ``benchmarks/lightbench_tasks.py`` at each learning rate
of a small grid, held constant or decayed to 0 by a cosine over the task's budget (one compile
per task and optimizer: the rate and the choice of schedule are arguments of the jitted run, a
``lax.scan`` over the steps); a task counts as solved by an optimizer when any rate and
schedule reaches the task's target within its step budget. The decay is searched because
optimizers whose step does not shrink with the gradient (Kron, Lion, sign descent) cannot
reach a tight target at a constant rate (docs/performance.md, "Why Kron solves fewer"). Prints the solved
fraction per optimizer and per task, writes ``lightbench.{md,json}`` and a heatmap PNG, and
puts LightBench's published success rates beside ours for the optimizers both have (the tasks,
budgets and learning-rate search differ: LightBench tunes more and has ~70 tasks).

Usage: ``python benchmarks/lightbench.py [--quick] [--opts adamw,soap] [--tasks rosenbrock]
[--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import functrain  # noqa: E402
from functrain import contrib  # noqa: E402
from lightbench_tasks import TASKS, Task  # noqa: E402

#: name -> builder of the optimizer at a learning-rate schedule. Defaults otherwise.
OPTIMIZERS: dict[str, Callable[[Any], Any]] = {
    "adamw": lambda lr: functrain.adamw(lr, weight_decay=0.0),
    "cautious_adamw": lambda lr: contrib.cautious_adamw(lr, weight_decay=0.0),
    "adamw+mars": lambda lr: functrain.chain(contrib.mars_correction(),
                                             functrain.adamw(lr, weight_decay=0.0)),
    "laprop": lambda lr: contrib.laprop(lr),
    "lion": lambda lr: functrain.lion(lr, weight_decay=0.0),
    "cautious_lion": lambda lr: contrib.cautious_lion(lr, weight_decay=0.0),
    "sgd_momentum": lambda lr: functrain.sgd(lr, momentum=0.9),
    "muon": lambda lr: contrib.muon(lr),
    "soap": lambda lr: contrib.soap(lr),
    "kron": lambda lr: contrib.kron(lr),
}

#: The learning-rate grid (each optimizer's best is taken per task).
LEARNING_RATES = (1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)

#: LightBench's published success rates (HeavyBall's README, all tasks), for the optimizers
#: both benchmarks have.
PUBLISHED = {"kron": 77.0, "cautious_adamw": 75.7, "soap": 72.5, "adamw": 72.3, "muon": 51.0}

QUICK_TASKS = ("quadratic_cond1e4", "rosenbrock", "saddle", "quadratic_sparse_grad")
QUICK_OPTS = ("adamw", "cautious_adamw", "sgd_momentum")
QUICK_LRS = (1e-2, 1e-1)

#: The schedules searched: the rate held constant, or decayed by a cosine to 0 at the budget.
SCHEDULES = ("constant", "cosine")


def make_run(task: Task, build: Callable[[Any], Any]) -> Callable:
    """The jitted run of ``task`` for one optimizer: ``run(lr, decay, key) -> final
    evaluation``, ``decay`` 0.0 (constant rate) or 1.0 (cosine decay over ``task.steps``)."""

    def run(lr: jax.Array, decay: jax.Array, key: jax.Array) -> jax.Array:
        def schedule(count: jax.Array) -> jax.Array:
            cosine = 0.5 * (1 + jnp.cos(jnp.pi * jnp.minimum(count, task.steps) / task.steps))
            return lr * (1 - decay + decay * cosine)

        opt = build(schedule)
        params = task.init()
        history = [params] * (task.delay + 1)   # gradients taken at the oldest

        def step(carry: tuple, k: jax.Array) -> tuple:
            p, s, hist = carry
            g = jax.grad(task.loss)(hist[0], k)
            u, s = opt.update(g, s, p)
            p = functrain.apply_updates(p, u)
            return (p, s, hist[1:] + [p]), None

        keys = jax.random.split(key, task.steps)
        (p, _, _), _ = jax.lax.scan(step, (params, opt.init(params), history), keys)
        return task.evaluate(p)

    return jax.jit(run)


def bench(task_names: list, opt_names: list, lrs: tuple) -> dict:
    """Run every task with every optimizer and learning rate; the results as a dict."""
    tasks = {t.name: t for t in TASKS}
    results: dict = {"tasks": {}, "learning_rates": list(lrs), "schedules": list(SCHEDULES)}
    for tname in task_names:
        task = tasks[tname]
        row = {}
        for oname in opt_names:
            t0 = time.perf_counter()
            run = make_run(task, OPTIMIZERS[oname])
            tried = [(lr, sched) for sched in SCHEDULES for lr in lrs]
            finals = [float(run(jnp.asarray(lr, jnp.float32),
                                jnp.asarray(float(sched == "cosine"), jnp.float32),
                                jax.random.PRNGKey(0))) for lr, sched in tried]
            ok = [np.isfinite(f) and f <= task.target for f in finals]
            best = min((f for f in finals if np.isfinite(f)), default=float("nan"))
            at = int(np.argmin(np.where(np.isfinite(finals), finals, np.inf)))
            solved_by = sorted({sched for (_, sched), o in zip(tried, ok) if o})
            row[oname] = {"solved": any(ok), "best": best, "best_lr": tried[at][0],
                          "best_schedule": tried[at][1], "solved_with": solved_by,
                          "seconds": time.perf_counter() - t0}
            print(f"{tname:24s} {oname:16s} {'solved' if any(ok) else '-':6s} "
                  f"best {best:.3g} (target {task.target:.3g}) "
                  f"{row[oname]['seconds']:.1f}s", flush=True)
        results["tasks"][tname] = {"kind": task.kind, "target": task.target,
                                   "steps": task.steps, "results": row}
    return results


def solved_fraction(results: dict, oname: str, schedule: str | None = None) -> float:
    """The percentage of tasks ``oname`` solved (with ``schedule`` only, when given)."""
    rows = [r["results"][oname]["solved"] if schedule is None
            else schedule in r["results"][oname].get("solved_with", [])
            for r in results["tasks"].values()]
    return 100.0 * sum(rows) / len(rows)


def _cell(r: dict) -> str:
    """``yes`` (solved at a constant rate), ``cosine`` (only with the decay), or ``no``."""
    if "constant" in r.get("solved_with", ["constant"] if r["solved"] else []):
        return "yes"
    return "cosine" if r["solved"] else "no"


def markdown(results: dict, opt_names: list) -> str:
    """The tables: solved fraction per optimizer (with LightBench's), and per task."""
    out = ["| optimizer | solved here | constant rate only | cosine decay only | "
           "LightBench (published) |", "|---|---|---|---|---|"]
    for o in sorted(opt_names, key=lambda o: -solved_fraction(results, o)):
        pub = f"{PUBLISHED[o]:.1f}%" if o in PUBLISHED else "-"
        out.append(f"| {o} | {solved_fraction(results, o):.0f}% | "
                   f"{solved_fraction(results, o, 'constant'):.0f}% | "
                   f"{solved_fraction(results, o, 'cosine'):.0f}% | {pub} |")
    out += ["", "| task | kind | " + " | ".join(opt_names) + " |",
            "|---|---|" + "---|" * len(opt_names)]
    for tname, t in results["tasks"].items():
        cells = [_cell(t["results"][o]) for o in opt_names]
        out.append(f"| {tname} | {t['kind']} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def heatmap(results: dict, opt_names: list, path: str) -> None:
    """Tasks x optimizers: how far below (green) or above (red) its target each one got."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["tasks"])
    grid = np.zeros((len(names), len(opt_names)))
    for i, t in enumerate(names):
        for j, o in enumerate(opt_names):
            r, target = results["tasks"][t]["results"][o], results["tasks"][t]["target"]
            best = r["best"]
            if not np.isfinite(best):
                grid[i, j] = 3.0
            elif target > 0:  # orders of magnitude above the target (<= 0: solved)
                grid[i, j] = np.clip(np.log10(max(best, 1e-30) / target), -3, 3)
            else:
                gap = (best - target) / abs(target)
                grid[i, j] = np.clip(np.sign(gap) * np.log10(1 + abs(gap)), -3, 3)
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * len(opt_names), 1.0 + 0.4 * len(names)))
    ax.imshow(grid, cmap="RdYlGn_r", vmin=-3, vmax=3, aspect="auto")
    ax.set_xticks(range(len(opt_names)), opt_names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), names)
    for i in range(len(names)):
        for j, o in enumerate(opt_names):
            ax.text(j, i, "x" if results["tasks"][names[i]]["results"][o]["solved"] else "",
                    ha="center", va="center", fontsize=8)
    ax.set_title("lightbench: x = solved; colour: log10(best / target), clipped to [-3, 3]")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list | None = None) -> dict:
    """Run the benchmark from the command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 tasks, 3 optimizers, 2 rates")
    ap.add_argument("--opts", default=None)
    ap.add_argument("--tasks", default=None)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--replot", action="store_true", help="redraw the PNG from --out's JSON")
    args = ap.parse_args(argv)
    opts = (args.opts.split(",") if args.opts
            else list(QUICK_OPTS if args.quick else OPTIMIZERS))
    tasks = (args.tasks.split(",") if args.tasks
             else list(QUICK_TASKS if args.quick else [t.name for t in TASKS]))
    unknown = sorted(set(opts) - set(OPTIMIZERS)) + sorted(
        set(tasks) - {t.name for t in TASKS})
    if unknown:
        ap.error(f"unknown optimizer or task names: {unknown}")
    if args.replot:
        with open(os.path.join(args.out, "lightbench.json")) as f:
            results = json.load(f)
        heatmap(results, opts, os.path.join(args.out, "lightbench.png"))
        return results
    t0 = time.perf_counter()
    results = bench(tasks, opts, QUICK_LRS if args.quick else LEARNING_RATES)
    results["seconds"] = time.perf_counter() - t0
    os.makedirs(args.out, exist_ok=True)
    table = markdown(results, opts)
    print("\n" + table + f"\n{results['seconds']:.0f} s in all")
    with open(os.path.join(args.out, "lightbench.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, "lightbench.json"), "w") as f:
        json.dump(results, f, indent=1)
    if not args.no_plot:
        heatmap(results, opts, os.path.join(args.out, "lightbench.png"))
    return results


if __name__ == "__main__":
    main()
