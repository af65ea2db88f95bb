"""What the matrix optimizers' own kernels can reach on this machine (part of ``make bench``).

``benchmarks/matrix_optimizers.py`` reports each optimizer's achieved GFLOP/s as a fraction of
one 512x512 GEMM's throughput. The optimizers never run that kernel: their work is batched
GEMMs of the trees' own sizes (128x128 for the transformer tree, 64x64 for 100 layers) and
LAPACK calls (``eigh``, QR, triangular solves) one matrix at a time on CPU
(:func:`functrain.linalg.map_matrices`: a batched LAPACK call can deadlock XLA:CPU). This
script measures those kernels alone, in the same units, so the distance between an optimizer
and "peak" splits into what its kernels allow and what the optimizer loses on top.

Usage: ``python benchmarks/matrix_ceilings.py [--out DIR]``; writes ``matrix_ceilings.md``.
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from functrain.linalg import map_matrices, set_lapack_threads  # noqa: E402


def throughput(fn: Callable[..., Any], args: tuple, flops: float, calls: int = 20) -> float:
    """Median GFLOP/s of the jitted ``fn(*args)`` doing ``flops`` per call (5 timed blocks)."""
    f = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = f(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / calls)
    return flops / statistics.median(times) / 1e9


def _spd(batch: int, n: int) -> jax.Array:
    a = jax.random.normal(jax.random.PRNGKey(1), (batch, n, n))
    return a @ jnp.swapaxes(a, -1, -2) / n + jnp.eye(n)


def kernel_rates(batch: int, n: int) -> dict:
    """GFLOP/s of each kind of the matrix optimizers' work on ``batch`` ``(n, n)`` matrices:
    one batched GEMM, and ``eigh``, QR and a triangular solve (``n`` columns) one matrix per
    LAPACK call, as :func:`functrain.linalg.map_matrices` runs them on CPU (keys: the kinds
    of ``matrix_optimizers.flops_by_kind``)."""
    a = jax.random.normal(jax.random.PRNGKey(0), (batch, n, n))
    s = _spd(batch, n)
    tri = jnp.triu(s) + n * jnp.eye(n)

    def solve(t: jax.Array, b: jax.Array) -> jax.Array:
        return map_matrices(lambda t, b: jax.lax.linalg.triangular_solve(
            t, b, left_side=True, lower=False), t, b)

    return {"matmul": throughput(lambda a: a @ a, (a,), 2.0 * batch * n ** 3),
            "eigh": throughput(lambda s: map_matrices(jnp.linalg.eigh, s), (s,),
                               9.0 * batch * n ** 3, calls=3),
            "qr": throughput(lambda s: map_matrices(jnp.linalg.qr, s), (s,),
                             8.0 / 3.0 * batch * n ** 3, calls=5),
            "triangular_solve": throughput(solve, (tri, s), 1.0 * batch * n ** 3)}


def ceilings() -> list[tuple[str, float]]:
    """(kernel, GFLOP/s) for the kernels the matrix optimizers are made of, the LAPACK ones
    with OpenBLAS's default threads and with ``set_lapack_threads(1)``."""
    a = jax.random.normal(jax.random.PRNGKey(0), (512, 512))
    out = [("GEMM 512x512", throughput(lambda a: a @ a, (a,), 2.0 * 512 ** 3))]
    default = set_lapack_threads(1)  # None: no OpenBLAS found, nothing to vary
    for threads in ([None, 1] if default is not None else [None]):
        set_lapack_threads(default if threads is None and default is not None else 1)
        tag = "default OpenBLAS threads" if threads is None else "set_lapack_threads(1)"
        for batch, n in ((16, 128), (100, 64)):
            rates = kernel_rates(batch, n)
            if threads is None:
                out.append((f"GEMM {batch} x {n}x{n}", rates["matmul"]))
            out += [(f"eigh {batch} x {n}x{n}, one per call (9 n^3), {tag}", rates["eigh"]),
                    (f"QR {batch} x {n}x{n}, one per call (8/3 n^3), {tag}", rates["qr"]),
                    (f"triangular solve {batch} x {n}x{n}, {n} columns, one per call (n^3), "
                     f"{tag}", rates["triangular_solve"])]
    if default is not None:
        set_lapack_threads(default)
    return out


def markdown(rows: list[tuple[str, float]]) -> str:
    """The table: each kernel's GFLOP/s and its fraction of the 512x512 GEMM's."""
    peak = rows[0][1]
    lines = [f"Measured {time.strftime('%Y-%m-%dT%H:%M:%S')} on "
             f"{jax.devices()[0].device_kind} ({jax.default_backend()}), float32, medians.", "",
             "| kernel | GFLOP/s | of the 512x512 GEMM |", "|---|---|---|"]
    lines += [f"| {name} | {g:.3g} | {100 * g / peak:.2g}% |" for name, g in rows]
    return "\n".join(lines) + "\n"


def main(argv: list | None = None) -> str:
    """Measure, print and write ``matrix_ceilings.md``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    table = markdown(ceilings())
    print(table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "matrix_ceilings.md"), "w") as f:
        f.write(table)
    return table


if __name__ == "__main__":
    main()
