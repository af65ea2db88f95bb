"""Every optimizer's step compiled for one H100 and one TPU v5e chip, from this CPU machine.

For each target, tree and optimizer (functrain's, and optax's wherever optax has it), one
donated jitted ``(params, state, grads) -> (params, state)`` step is compiled by the
accelerator's own compiler without the hardware (``benchmarks/accel_compile.py``, in a
fresh process of the target's venv under a timeout), and the compiler's numbers are
reported per parameter: bytes accessed (XLA's cost analysis of the optimized module),
the floor an element-wise step cannot go below, flops, temp memory, kernels launched by the
entry computation, and compile seconds.

The floors, in bytes per float32 parameter, with ``s`` the state's bytes per parameter:

* one pass (element-wise rules): read params, grads and state, write params and state:
  ``12 + 2 s``;
* two passes (a per-leaf norm first): the one-pass floor plus what the norm's pass reads
  besides: lamb's second pass re-reads params and its new state (``16 + 3 s``); lars' and
  fromage's first pass reads grads and params for their norms (``20 + 2 s``).

Other steps (factored, matrix, parameter-free and global-norm rules, and those with a state
field they only read, as madgrad's initial params) get no floor.

``make accel`` builds the two venvs (``jax``, ``jax-cuda12-plugin``, ``nvidia-cuda-nvcc-cu12``
and ``nvidia-nvjitlink-cu12``; ``jax[tpu]``) and runs the short form (the optimizers of
``SHORT``); ``--full`` runs every registry optimizer. Writes
``benchmarks/results/accelerators.{md,json}``.
Usage: ``python benchmarks/accelerators.py [--full] [--targets h100 tpu_v5e]
[--names adamw lamb] [--trees large "1000 leaves"] [--timeout 600] [--jobs 2]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from accel_compile import FLAT, TREES  # noqa: E402  (no JAX in this process before the workers)

VENVS = {"h100": os.path.join(ROOT, ".venv-accel-cuda"),
         "tpu_v5e": os.path.join(ROOT, ".venv-accel-tpu")}
TARGET_TITLES = {"h100": "H100 SXM (one GPU)", "tpu_v5e": "TPU v5e (one chip)"}

LOW_BIT = ("adamw_8bit", "adamw_4bit", "adamw_fp8")
ONE_PASS = {"acprop", "adabelief", "adadelta", "adagrad", "adam", "adamax", "adamaxw",
            "adamw", "adan", "ademamix", "adopt", "amsgrad", "laprop", "lion",
            "nadam", "nadamw", "noisy_sgd", "optimistic_adam", "optimistic_adam_v2",
            "optimistic_gradient_descent", "radam", "rmsprop", "rprop", "schedule_free_adamw",
            "schedule_free_sgd", "sgd", "sign_sgd", "signum", "simplified_ademamix", "yogi",
            *LOW_BIT}
#: name -> extra bytes per parameter of the norm's pass, as (constant, times the state's)
TWO_PASS = {"lamb": (4, 1), "lars": (8, 0), "fromage": (8, 0)}

#: The short form (``make accel``, CI): (tree, name) pairs.
SHORT = [("large", n) for n in ("adamw", "lion", "lamb", *LOW_BIT)] + [
    ("1000 leaves", "adamw"), (FLAT, "adamw")]


def floor(name: str, state_bytes: float) -> tuple:
    """(bytes per parameter an ideal step moves, the formula's name), or (None, "")."""
    if name in ONE_PASS:
        return 12 + 2 * state_bytes, "one pass"
    if name in TWO_PASS:
        constant, times_state = TWO_PASS[name]
        return 12 + 2 * state_bytes + constant + times_state * state_bytes, "two passes"
    return None, ""


def jobs(full: bool, names: list, trees: list) -> list:
    """(tree, name, library) triples: functrain's, and optax's where optax has the name."""
    import registry
    pairs = SHORT
    if full:
        everything = sorted(registry.REGISTRY) + list(LOW_BIT)
        pairs = [(tree, n) for tree in TREES for n in everything]
    if names:
        pairs = [(tree, n) for tree, n in pairs if n in names] or [
            (tree, n) for tree in TREES for n in names]
    # the flat layout only for per-element steps (on_flat_layout refuses the others)
    pairs = [(tree, n) for tree, n in pairs if tree in trees and (
        tree != FLAT or (n in ONE_PASS and n not in (*LOW_BIT, "noisy_sgd")))]
    out = []
    for tree, name in pairs:
        out.append((tree, name, "functrain"))
        record = registry.REGISTRY.get(name)
        if tree != FLAT and record is not None and record.reference.startswith("optax."):
            out.append((tree, name, "optax"))
    return out


def run_one(target: str, tree: str, name: str, library: str, timeout: float) -> dict:
    """One compile in a fresh process of ``target``'s venv: its JSON line, or why not."""
    python = os.path.join(VENVS[target], "bin", "python")
    start = time.perf_counter()
    row = {"target": target, "tree": tree, "name": name, "library": library}
    try:
        done = subprocess.run([python, os.path.join(HERE, "accel_compile.py"), target, tree,
                               name, library], capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**row, "error": f"did not compile in {timeout:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {**row, "error": f"exit {done.returncode}: {tail[:200]}",
                "seconds": time.perf_counter() - start}
    out = json.loads(lines[-1])
    ideal, formula = floor(name, out["state_bytes"])
    return {**out, "ideal": ideal, "floor": formula}


def _fmt(x: object, digits: int = 2) -> str:
    return "–" if x is None else f"{x:,.{digits}f}" if isinstance(x, float) else str(x)


def table(rows: list) -> str:
    """The markdown table: one section per target, functrain beside optax."""
    out = []
    for target in TARGET_TITLES:
        mine = [r for r in rows if r["target"] == target]
        if not mine:
            continue
        out += [f"### {TARGET_TITLES[target]}", "",
                "| tree | optimizer | library | bytes / param | floor | x floor | "
                "flops / param | temp MiB | kernels | compile s |",
                "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in mine:
            if "error" in r:
                out.append(f"| {r['tree']} | {r['name']} | {r['library']} | "
                           f"{r['error']} | | | | | | |")
                continue
            per = r["bytes_accessed"] / r["params"]
            ratio = per / r["ideal"] if r["ideal"] else None
            floor_text = f"{r['ideal']:.2f} ({r['floor']})" if r["ideal"] else "–"
            out.append(f"| {r['tree']} | {r['name']} | {r['library']} | {per:.2f} | "
                       f"{floor_text} | {_fmt(ratio)} | {r['flops'] / r['params']:.1f} | "
                       f"{r['temp_bytes'] / 2**20:.1f} | {r['kernels']} | "
                       f"{r['compile_s']:.1f} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--targets", nargs="+", default=list(VENVS))
    parser.add_argument("--names", nargs="+", default=[])
    parser.add_argument("--trees", nargs="+", default=list(TREES), choices=list(TREES))
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--name", default="accelerators")
    parser.add_argument("--from-json", help="tabulate the rows of an earlier run again")
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            rows = [{**r, **dict(zip(("ideal", "floor"), floor(r["name"], r["state_bytes"])))}
                    if "state_bytes" in r else r for r in json.load(f)["rows"]]
        return save(rows, args.out, args.name)
    todo = [(t, *j) for t in args.targets for j in jobs(args.full, args.names, args.trees)]
    print(f"{len(todo)} compiles on {args.jobs} processes", flush=True)
    rows = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_one, *job, args.timeout) for job in todo]
        for future in futures:
            rows.append(future.result())
            r = rows[-1]
            print(json.dumps(r), flush=True)
    save(rows, args.out, args.name)


def save(rows: list, out: str, name: str) -> None:
    """The table printed and written, with every row, to ``out/name.{md,json}``."""
    text = (f"Compiled on {datetime.date.today()} by the accelerators' own compilers on a CPU "
            f"machine (deviceless), JAX {rows[0].get('jax', '?') if rows else '?'}; "
            f"bytes and flops from XLA's cost analysis of the optimized program.\n\n"
            + table(rows))
    from beyond_optax import save_table
    save_table({"rows": rows}, text, out, name)


if __name__ == "__main__":
    main()
