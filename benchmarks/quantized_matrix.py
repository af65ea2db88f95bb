"""Low-bit eigenbases (``quantized_state(..., bases=True)``): state bytes and final loss.

SOAP and Shampoo on min 0.5 ||A W B - C||^2, W 64 x 64 from zero, A and B of condition
number 1e3 in random bases (tests/test_quantized_bases.py's problem), 300 steps, seeds
0..N-1 (each seed its own A, B, C), in variants: float32; bases in 8 bits; in 4 bits (with
Björck's re-orthogonalization, 4 iterations); in 4 bits without it (``bjorck_iterations=0``);
and 4-bit bases with the moments in 4 bits too (the moments' own codes). SOAP at lr 3e-2
(weight decay 0); Shampoo at lr 0.1, b2 0.9, ``precondition_frequency=10`` (so each stored
root is read for 10 steps; at the default 1 it is recomputed before every use).

Reported: the bytes of the bases (SOAP's ``bases``, Shampoo's ``precond_l/r``), of the whole
matrix state (with the float32 statistics) and of the optimizer state; the final loss per
seed, its median and spread (min..max). Writes ``quantized_matrix.md`` and ``.json`` to
``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import functrain  # noqa: E402
from functrain.contrib import shampoo, soap  # noqa: E402

D = 64
VARIANTS = {"float32": None,
            "8-bit bases": dict(bits=8, bases=True, moments=False),
            "4-bit bases": dict(bits=4, bases=True, moments=False),
            "4-bit bases, no Björck": dict(bits=4, bases=True, moments=False,
                                           bjorck_iterations=0),
            "4-bit bases + 4-bit moments": dict(bits=4, bases=True)}
MAKERS = {"soap": lambda: soap(3e-2, weight_decay=0.0),
          "shampoo": lambda: shampoo(0.1, b2=0.9, precondition_frequency=10)}
BASES = {"soap": ("bases",), "shampoo": ("precond_l", "precond_r")}
MATRICES = {"soap": ("bases", "stats"),
            "shampoo": ("precond_l", "precond_r", "stats_l", "stats_r")}


def problems(seeds: int) -> tuple:
    out = []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        a, b = (np.linalg.qr(rng.standard_normal((D, D)))[0] @ np.diag(np.logspace(0, -3, D))
                @ np.linalg.qr(rng.standard_normal((D, D)))[0].T for _ in range(2))
        out.append((a, b, a @ rng.standard_normal((D, D)) @ b))
    return tuple(jnp.asarray(np.stack(x), jnp.float32) for x in zip(*out))


def final_losses(opt, arrays: tuple, steps: int) -> np.ndarray:
    def loss(w, a, b, c):
        return 0.5 * jnp.sum((a @ w @ b - c) ** 2)

    def run(a, b, c, w0):  # w0 an argument: see tests/test_quantized_bases.py
        def step(carry, _):
            w, s = carry
            u, s = opt.update(jax.grad(loss)(w, a, b, c), s, w)
            return (functrain.apply_updates(w, u), s), None
        w = jax.lax.scan(step, (w0, opt.init(w0)), None, length=steps)[0][0]
        return loss(w, a, b, c)

    w0 = jnp.zeros((arrays[0].shape[0], D, D))
    return np.asarray(jax.jit(jax.vmap(run))(*arrays, w0))


def nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    arrays = problems(args.seeds)
    start = 0.5 * np.sum(np.asarray(arrays[2], np.float64) ** 2, axis=(1, 2))
    rows, lines = [], []
    for name, make in MAKERS.items():
        for variant, options in VARIANTS.items():
            opt = make() if options is None else functrain.quantized_state(make(), **options)
            state = opt.init({"w": jnp.zeros((D, D))})[0]
            t = time.perf_counter()
            losses = final_losses(opt, arrays, args.steps)
            rows.append(dict(
                optimizer=name, variant=variant, losses=losses.tolist(),
                median=float(np.median(losses)), seconds=time.perf_counter() - t,
                bases_bytes=sum(nbytes(getattr(state, f)) for f in BASES[name]),
                matrix_bytes=sum(nbytes(getattr(state, f)) for f in MATRICES[name]),
                state_bytes=nbytes(state)))
            print(rows[-1], flush=True)
    base = {r["optimizer"]: r for r in rows if r["variant"] == "float32"}
    lines += [f"# Low-bit eigenbases: SOAP and Shampoo, {D} x {D} least squares", "",
              f"`python benchmarks/quantized_matrix.py` ({args.steps} steps, seeds "
              f"0..{args.seeds - 1}, initial losses {', '.join(f'{s:.1f}' for s in start)}; "
              f"load average {os.getloadavg()[0]:.1f}). Bytes are one 64 x 64 weight's.", "",
              "| optimizer | variant | bases bytes (vs float32) | matrix state bytes | "
              "state bytes | final loss, median | min..max |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        b = base[r["optimizer"]]
        lines.append(
            f"| {r['optimizer']} | {r['variant']} | {r['bases_bytes']} "
            f"({1 - r['bases_bytes'] / b['bases_bytes']:+.1%} less) | {r['matrix_bytes']} | "
            f"{r['state_bytes']} | {r['median']:.3g} | {min(r['losses']):.3g}.."
            f"{max(r['losses']):.3g} |".replace("(+", "(").replace("(-0.0% less)", "(same)"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quantized_matrix.md").write_text("\n".join(lines) + "\n")
    (out / "quantized_matrix.json").write_text(json.dumps(dict(
        start=start.tolist(), steps=args.steps, rows=rows), indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
