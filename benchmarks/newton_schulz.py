"""Newton-Schulz variants: time per call and distance to the exact polar factor (``make bench``).

For each matrix size, :func:`functrain.linalg.newton_schulz` (5 steps, float32, jitted) runs
with the standard coefficients and with Polar Express's (``coeffs='polar_express'``), each by
the standard iteration and by Gram Newton-Schulz (``method='gram'``). The variants are timed
call by call in rotating order, so they share the machine's drift: medians of ``--reps``
calls. The distance to the polar factor ``U V^T`` (numpy's SVD in float64 of the same
Gaussian input) is ``max ||O - U V^T||_F / sqrt(m)`` over the stack; ``model`` is the flop
count's ratio to the standard iteration's (``20 m^2 n + 10 m^3`` for five steps; Gram
``12 m^2 n + 22 m^3``, two steps per restart).

Usage: ``python benchmarks/newton_schulz.py [--quick] [--sizes 128x512,512x2048]
[--reps 7] [--batch 1] [--out DIR]``; writes ``newton_schulz.md`` and ``.json`` there.
"""

from __future__ import annotations

import argparse
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

from functrain.linalg import newton_schulz  # noqa: E402

SIZES = ((128, 512), (512, 2048), (1024, 4096))
QUICK = ((128, 512), (512, 2048))
VARIANTS = {"standard": dict(coeffs="standard"),
            "polar_express": dict(coeffs="polar_express"),
            "gram": dict(coeffs="standard", method="gram"),
            "polar_express + gram": dict(coeffs="polar_express", method="gram")}
STEPS = 5


def flops(m: int, n: int, method: str, steps: int = STEPS) -> float:
    """Matmul flops of ``steps`` steps on one ``(m, n)`` matrix (``m <= n``)."""
    if method == "gram":  # per pair: X X^T and Q X (2 m^2 n each), five m x m products
        pairs, odd = divmod(steps, 2)
        return pairs * (4.0 * m * m * n + 10.0 * m ** 3) + odd * (4.0 * m * m * n + 2.0 * m ** 3)
    return steps * (4.0 * m * m * n + 2.0 * m ** 3)


def measure(m: int, n: int, batch: int, reps: int) -> dict:
    """Median seconds per call and distance to the polar factor of every variant."""
    x64 = np.random.default_rng(0).standard_normal((batch, m, n))
    u, _, vt = np.linalg.svd(x64, full_matrices=False)
    exact = u @ vt
    x = jnp.asarray(x64, jnp.float32)
    fns = {name: jax.jit(lambda x, kw=kw: newton_schulz(x, ns_steps=STEPS, **kw))
           .lower(x).compile() for name, kw in VARIANTS.items()}
    out = {name: {"distance": float(np.max(np.linalg.norm(
        np.asarray(f(x), np.float64) - exact, axis=(-2, -1))) / np.sqrt(m))}
        for name, f in fns.items()}
    times = {name: [] for name in fns}
    names = list(fns)
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name](x))
            times[name].append(time.perf_counter() - t0)
    for name, kw in VARIANTS.items():
        out[name]["seconds"] = statistics.median(times[name])
        out[name]["model"] = flops(m, n, kw.get("method", "standard")) / flops(m, n, "standard")
    return out


def markdown(results: dict, batch: int, reps: int) -> str:
    lines = [f"Measured {time.strftime('%Y-%m-%dT%H:%M:%S')} on {jax.devices()[0].device_kind} "
             f"({jax.default_backend()}, {os.cpu_count()} cores shared with other work: load "
             f"average {os.getloadavg()[0]:.1f}), "
             f"float32, {STEPS} steps, a stack of {batch} Gaussian matrices, median of {reps} "
             f"interleaved calls. `speed` = the standard iteration's time / this one's; "
             f"`model` = this one's flops / the standard's. The two coefficient sets cost the "
             f"same matmuls: their difference in time is the noise.", "",
             "| size (m x n) | variant | ms per call | speed | model flops | "
             "distance to U V^T |", "|---|---|---|---|---|---|"]
    for size, rows in results.items():
        base = rows["standard"]["seconds"]
        for name, r in rows.items():
            lines.append(f"| {size} | {name} | {1e3 * r['seconds']:.3g} | "
                         f"{base / r['seconds']:.2f}x | {r['model']:.2f} | "
                         f"{r['distance']:.3g} |")
    return "\n".join(lines) + "\n"


def main(argv: list | None = None) -> str:
    """Measure, print and write ``newton_schulz.md`` / ``newton_schulz.json``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"sizes {QUICK}")
    ap.add_argument("--sizes", default=None, help="e.g. 128x512,512x2048")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    sizes = (QUICK if args.quick else SIZES) if args.sizes is None else tuple(
        tuple(int(d) for d in s.split("x")) for s in args.sizes.split(","))
    results = {}
    for m, n in sizes:
        results[f"{m} x {n}"] = measure(m, n, args.batch, args.reps)
        print(f"{m} x {n}:", {k: f"{1e3 * v['seconds']:.3g} ms, {v['distance']:.3g}"
                              for k, v in results[f"{m} x {n}"].items()}, flush=True)
    table = markdown(results, args.batch, args.reps)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "newton_schulz.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, "newton_schulz.json"), "w") as f:
        json.dump({"device": jax.devices()[0].device_kind, "backend": jax.default_backend(),
                   "steps": STEPS, "batch": args.batch, "reps": args.reps,
                   "results": results}, f, indent=1)
    return table


if __name__ == "__main__":
    main()
