"""Where Kron's compile time goes, on the transformer tree of ``benchmarks/matrix_optimizers.py``.

Compiles, each once and alone, the preconditioner update (``kron_factors.whitening_step`` over
every same-shape group), ``P m`` (``kron_factors.precondition``) and the whole Kron and Adam
steps, and prints each one's compile seconds and the number of computations in its optimized
program (fused kernels, loop bodies, branches). Usage: ``python benchmarks/kron_compile_parts.py``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "stress"))

import functrain  # noqa: E402
from functrain.contrib.kron_factors import precondition, whitening_step  # noqa: E402
from run_stress import small_transformer_shapes  # noqa: E402


def first_compile(fn: Callable[..., Any], *args: Any) -> tuple[float, int]:
    """(seconds to compile ``jax.jit(fn)`` for ``args``, computations in the program)."""
    lowered = jax.jit(fn).lower(*args)
    t0 = time.perf_counter()
    compiled = lowered.compile()
    seconds = time.perf_counter() - t0
    text = compiled.as_text().splitlines()
    return seconds, sum(1 for ln in text if ln.startswith("%") or ln.startswith("ENTRY"))


def main() -> None:
    shapes = small_transformer_shapes()
    groups: dict = {}
    for name, shape in shapes.items():
        groups.setdefault(tuple(shape), []).append(name)
    qs, hs = [], []
    for shape, names in groups.items():  # Kron's factors at its defaults: triangular for 2-D
        n = len(names)
        qs.append([jnp.stack([jnp.eye(d)] * n) for d in shape] if len(shape) >= 2
                  else [jnp.ones((n,) + shape)])
        hs.append(jnp.ones((n,) + shape))
    params = {k: jnp.ones(s) for k, s in shapes.items()}
    rows = [("whitening_step, every group", first_compile(
        lambda qs, hs: [whitening_step(q, h, h, 0.1) for q, h in zip(qs, hs)], qs, hs)),
            ("precondition, every group", first_compile(
                lambda qs, hs: [precondition(q, h) for q, h in zip(qs, hs)], qs, hs))]
    for name, opt in (("kron step", functrain.contrib.kron(1e-3)),
                      ("adam step", functrain.adam(1e-3))):
        state = opt.init(params)
        rows.append((name, first_compile(lambda p, s, g, opt=opt: functrain.apply_updates(
            p, opt.update(g, s, p)[0]), params, state, params)))
    print(f"transformer tree: {len(shapes)} leaves in {len(groups)} same-shape groups")
    for name, (seconds, computations) in rows:
        print(f"{name:30s} compile {seconds:6.2f} s   {computations:4d} computations")


if __name__ == "__main__":
    main()
