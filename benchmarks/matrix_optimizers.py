#!/usr/bin/env python
"""Muon, SOAP, Shampoo and Kron against adam, their peers, and the machine's matmul speed.

In one process: the machine's float32 matmul throughput
(a 512x512 GEMM, and a batch of 16 128x128 ones), then for each optimizer on
each model the trace+lower+compile time of the jitted, donated step, the
median step time (blocks of 10 steps, so SOAP's refresh every 10 steps and
Kron's random preconditioner updates are inside; optimizers interleaved, so
all share the machine's drift), the step's flops by its own count
(:func:`counted_flops`: matmuls and LAPACK calls, loops times their trips, a
refresh weighted by how often it runs) next
to XLA's (``compiled.cost_analysis()``, which counts a loop body once and no
LAPACK call), and the achieved GFLOP/s on the counted flops as a fraction of
the measured matmul throughput. Peers: ``optax.contrib.muon`` for muon and
psgd-jax's ``kron`` (``pip install psgd-jax``, a bench-only dependency) for
kron.

Models: ``transformer`` (39 leaves, 0.9M parameters: an embedding
(512, 128), a head (128, 512), four blocks of four (128, 128) attention
matrices, a (128, 512) and a (512, 128) MLP matrix, norm and bias vectors)
and ``100layers`` (100 leaves of (64, 64)).

Usage: ``python benchmarks/matrix_optimizers.py [--quick] [--opts adam,muon]``.
Writes ``results/matrix_optimizers.{json,md}``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import statistics
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "stress"))

import functrain  # noqa: E402
from run_stress import small_transformer_shapes  # noqa: E402
from beyond_optax import save_table  # noqa: E402
from run import build_step, copy_tree, machine_info, make_tree  # noqa: E402
from matrix_ceilings import kernel_rates, throughput  # noqa: E402

LR = 1e-3


def _optax() -> Any:
    import optax
    import optax.contrib  # noqa: F401
    return optax


def _psgd_kron() -> Any:
    """psgd-jax's kron. Its 0.2.9 imports ``optax._src.clipping``, which optax 0.2.8 moved
    to ``optax.transforms._clipping`` (the module is imported but not used): alias it."""
    optax = _optax()
    import optax.transforms._clipping as clipping
    sys.modules.setdefault("optax._src.clipping", clipping)
    from psgd_jax.kron import kron
    return kron(LR)


# How often each branch of a conditional runs, by number of branches, where the costliest
# branch is not what a step does: SOAP's switch is (keep, first-step eigh, refresh every 10
# steps); Shampoo's refresh (every step by default), Kron's preconditioner update (with
# probability 1 for the first 500 steps) and Muon's first-step rescaling run as counted.
BRANCH_WEIGHTS = {"soap": {3: (0.9, 0.0, 0.1)}}

# name -> (library, builder). The library decides which apply_updates the step uses.
OPTIMIZERS: dict[str, tuple[str, Callable[[], Any]]] = {
    "adam": ("functrain", lambda: functrain.adam(LR)),
    "muon": ("functrain", lambda: functrain.contrib.muon(LR)),
    "optax muon": ("optax", lambda: _optax().contrib.muon(LR)),
    "soap": ("functrain", lambda: functrain.contrib.soap(LR)),
    "shampoo": ("functrain", lambda: functrain.contrib.shampoo(LR)),
    "kron": ("functrain", lambda: functrain.contrib.kron(LR)),
    "psgd-jax kron": ("optax", _psgd_kron),
}
MODELS = {
    "transformer": small_transformer_shapes,
    "100layers": lambda: {f"layer{i:03d}": (64, 64) for i in range(100)},
}


def matmul_gflops(n: int, batch: int = 0, calls: int = 40) -> float:
    """Median GFLOP/s of a jitted float32 (n, n) @ (n, n), or a batch of them."""
    a = jax.random.normal(jax.random.PRNGKey(0), (batch, n, n) if batch else (n, n))
    return throughput(lambda a: a @ a, (a,), 2.0 * n ** 3 * max(batch, 1), calls=calls)


#: The matrices each tree's optimizers mostly work on, for its kernel ceilings
#: (``matrix_ceilings.kernel_rates``): (how many, size).
KERNEL_SIZES = {"transformer": (16, 128), "100layers": (100, 64)}


# Flops of the LAPACK-backed primitives XLA does not count, per matrix (Golub & Van Loan,
# "Matrix Computations", 4th ed.: symmetric QR with eigenvectors about 9 n^3; Householder
# QR of an n x n matrix 4/3 n^3 plus forming Q 4/3 n^3; a triangular solve n^2 per column).
def _lapack_flops(name: str, shapes: list) -> float:
    *batch, n, m = shapes[0]
    count = 1
    for b in batch:
        count *= b
    if name == "eigh":
        return count * 9.0 * n ** 3
    if name in ("qr", "geqrf", "householder_product"):
        return count * (8.0 / 3.0) * n ** 3
    if name == "triangular_solve":
        rhs = shapes[1][-1] if len(shapes) > 1 else m
        return count * float(n) * n * rhs
    return 0.0


def counted_flops(jaxpr: Any, branch_weights: Any = None) -> float:
    """The step's flops by its own count: every matmul (``dot_general``) and LAPACK call,
    loops times their trip count (XLA's cost analysis counts a loop body once and no
    LAPACK call), elementwise work left out. A conditional counts as its branches weighted
    by how often each runs (``branch_weights``, one weight per branch, for every
    conditional with that many branches), else as its costliest branch."""
    return sum(flops_by_kind(jaxpr, branch_weights).values())


#: The kinds :func:`flops_by_kind` counts: matmuls and the LAPACK calls XLA does not count.
KINDS = ("matmul", "eigh", "qr", "triangular_solve")


def flops_by_kind(jaxpr: Any, branch_weights: Any = None) -> dict:
    """:func:`counted_flops` split by kind (``KINDS``; QR's two LAPACK calls as ``qr``)."""
    import numpy as np

    def walk(jp: Any) -> np.ndarray:
        total = np.zeros(len(KINDS))
        for e in jp.eqns:
            name = e.primitive.name
            if name == "dot_general":
                (lc, rc), (lb, _) = e.params["dimension_numbers"]
                lhs = e.invars[0].aval.shape
                contract = np.prod([lhs[a] for a in lc]) if lc else 1
                out = np.prod(e.outvars[0].aval.shape)
                total[0] += 2.0 * out * contract
            elif name in ("eigh", "qr", "geqrf", "householder_product", "triangular_solve"):
                kind = "qr" if name in ("geqrf", "householder_product") else name
                total[KINDS.index(kind)] += _lapack_flops(
                    name, [tuple(v.aval.shape) for v in e.invars])
            elif name == "scan":
                total += e.params["length"] * walk(e.params["jaxpr"].jaxpr)
            elif name == "while":
                total += walk(e.params["body_jaxpr"].jaxpr)  # trip count unknown: once
            elif name == "cond":
                costs = [walk(b.jaxpr) for b in e.params["branches"]]
                weights = (branch_weights or {}).get(len(costs))
                total += (sum(w * c for w, c in zip(weights, costs)) if weights
                          else max(costs, key=lambda c: c.sum()))
            else:
                for v in e.params.values():
                    inner = getattr(v, "jaxpr", v)
                    if hasattr(inner, "eqns"):
                        total += walk(inner)
        return total

    return dict(zip(KINDS, (float(x) for x in walk(jaxpr.jaxpr))))


def build(name: str, params: Any, grads: Any) -> dict:
    lib_name, make = OPTIMIZERS[name]
    apply = functrain.apply_updates if lib_name == "functrain" else _optax().apply_updates
    opt = make()
    lib = {"make": lambda _: opt, "apply": apply, "ctx": contextlib.nullcontext}
    built = build_step(lib, "", params, grads)
    built["flops_by_kind"] = flops_by_kind(jax.make_jaxpr(
        lambda p, s, g: apply(p, opt.update(g, s, p)[0]))(params, built["state"], grads),
        BRANCH_WEIGHTS.get(name))
    built["counted_flops"] = sum(built["flops_by_kind"].values())
    return built


def _computations(compiled: Any) -> int:
    """The computations of an optimized XLA program (its text's top-level ``%name`` lines)."""
    return sum(1 for ln in compiled.as_text().splitlines()
               if ln.startswith("%") or ln.startswith("ENTRY"))


def bench_model(model: str, names: list, blocks: int, peak: float) -> dict:
    shapes = MODELS[model]()
    rates = kernel_rates(*KERNEL_SIZES[model])
    params0, grads = make_tree(shapes, 0, 1.0), make_tree(shapes, 1, 1e-2)
    built, carry, times = {}, {}, {}
    for name in names:
        try:
            built[name] = build(name, params0, grads)
        except ImportError as e:
            print(f"# {name}: skipped ({e})", flush=True)
            continue
        carry[name] = (copy_tree(params0), built[name].pop("state"))
        times[name] = []
    order = list(built)
    for i in range(blocks + 1):  # the first block warms up
        for name in order[i % len(order):] + order[:i % len(order)]:
            t0 = time.perf_counter()
            for _ in range(10):
                carry[name] = built[name]["compiled"](carry[name][0], carry[name][1], grads)
            jax.block_until_ready(carry[name])
            if i:
                times[name].append((time.perf_counter() - t0) / 10)
    rows = {}
    for name in order:
        b = built[name]
        step = statistics.median(times[name])
        rows[name] = {"compile_s": b["lower_s"] + b["compile_s"], "step_s": step,
                      "xla_gflop": b["xla_flops"] / 1e9,
                      "counted_gflop": b["counted_flops"] / 1e9,
                      "gflops": b["counted_flops"] / step / 1e9,
                      "of_peak": b["counted_flops"] / step / 1e9 / peak,
                      # the time its matmuls and LAPACK calls would take at their kernels'
                      # own measured speed, over the step's time
                      "of_ceiling": sum(f / 1e9 / rates[k] for k, f in
                                        b["flops_by_kind"].items()) / step,
                      "flops_by_kind": b["flops_by_kind"], "hlo_ops": b["hlo_ops"],
                      # computations of the optimized program (fused kernels, loop bodies,
                      # branches): what XLA:CPU compiles one by one
                      "computations": _computations(b["compiled"]),
                      "xla_mb_accessed": b["xla_bytes_accessed"] / 1e6}
    base = rows.get("adam")
    for r in rows.values():
        if base:
            r["step_vs_adam"] = r["step_s"] / base["step_s"]
            r["compile_vs_adam"] = r["compile_s"] / base["compile_s"]
            r["ops_vs_adam"] = r["hlo_ops"] / base["hlo_ops"]
            r["computations_vs_adam"] = r["computations"] / base["computations"]
    for mine, peer in (("muon", "optax muon"), ("kron", "psgd-jax kron")):
        if mine in rows and peer in rows:
            rows[mine]["step_vs_peer"] = rows[mine]["step_s"] / rows[peer]["step_s"]
            rows[mine]["compile_vs_peer"] = rows[mine]["compile_s"] / rows[peer]["compile_s"]
    n = sum(int(jnp.prod(jnp.asarray(s))) for s in shapes.values())
    return {"model": model, "params": n, "leaves": len(shapes), "rows": rows,
            "kernel_rates": rates, "kernel_size": KERNEL_SIZES[model]}


def markdown(results: dict) -> str:
    m = results["machine"]
    lines = [f"Measured {results['date']} on {m['cpu']} x{m['cpu_count']} ({m['backend']}); "
             f"float32 matmul: {results['matmul_gflops']:.0f} GFLOP/s (512x512), "
             f"{results['batched_matmul_gflops']:.0f} GFLOP/s (16 x 128x128). Medians of "
             f"{results['blocks']} blocks of 10 steps.", ""]
    for mod in results["models"]:
        k, n = mod["kernel_size"]
        r8 = mod["kernel_rates"]
        lines += [f"**{mod['model']}** ({mod['params']:,} params, {mod['leaves']} leaves; its "
                  f"kernels on {k} x {n}x{n}, GFLOP/s: GEMM {r8['matmul']:.0f}, eigh "
                  f"{r8['eigh']:.1f}, QR {r8['qr']:.1f}, triangular solve "
                  f"{r8['triangular_solve']:.1f})", "",
                  "| optimizer | compile s | compile / adam | program ops (/ adam) | "
                  "compiled computations (/ adam) | step ms | "
                  "step / adam | GFLOP/step (counted; XLA's) | GFLOP/s | of matmul peak | "
                  "of its kernels' ceiling | vs peer (step, compile) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, r in mod["rows"].items():
            peer = (f"{r['step_vs_peer']:.2f}x, {r['compile_vs_peer']:.2f}x"
                    if "step_vs_peer" in r else "")
            lines.append(
                f"| {name} | {r['compile_s']:.2f} | {r.get('compile_vs_adam', 0):.1f} | "
                f"{r['hlo_ops']} ({r.get('ops_vs_adam', 0):.1f}) | "
                f"{r['computations']} ({r.get('computations_vs_adam', 0):.1f}) | "
                f"{1e3 * r['step_s']:.2f} | {r.get('step_vs_adam', 0):.1f} | "
                f"{r['counted_gflop']:.2f}; {r['xla_gflop']:.2f} | {r['gflops']:.0f} | "
                f"{100 * r['of_peak']:.0f}% | {100 * r['of_ceiling']:.0f}% | "
                f"{peer} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--opts", default=",".join(OPTIMIZERS))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--name", default="matrix_optimizers")
    args = ap.parse_args(argv)
    names = [o.strip() for o in args.opts.split(",")]
    bad = [o for o in names if o not in OPTIMIZERS]
    if bad:
        ap.error(f"unknown optimizers {bad}; choose from {','.join(OPTIMIZERS)}")
    blocks = 2 if args.quick else 5
    peak = matmul_gflops(512)
    results = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
               "machine": machine_info(), "blocks": blocks, "matmul_gflops": peak,
               "batched_matmul_gflops": matmul_gflops(128, batch=16), "models": []}
    for model in args.models.split(","):
        t0 = time.perf_counter()
        results["models"].append(bench_model(model.strip(), names, blocks, peak))
        print(f"# {model}: {time.perf_counter() - t0:.0f} s", flush=True)
    save_table(results, markdown(results), args.out, args.name)
    return results


if __name__ == "__main__":
    main()
