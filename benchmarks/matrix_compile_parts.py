"""Where Kron's and Shampoo's compile time goes, on the transformer tree of
``benchmarks/matrix_optimizers.py``.

Compiles, each once and alone: Kron's preconditioner update (``kron_factors.whitening_step``
over every same-shape group) and ``P m`` (``kron_factors.precondition``); Shampoo's inverse
root of one stack of (128, 128) blocks (``eigh`` one block per LAPACK call, then the root);
and the whole Kron, Shampoo and Adam steps. Prints each one's compile seconds and the number
of computations in its optimized program (fused kernels, loop bodies, branches), and how many
LAPACK calls (custom calls) each whole step holds.
Usage: ``python benchmarks/matrix_compile_parts.py``.
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
from functrain.matrix.kron_factors import precondition, whitening_step  # noqa: E402
from functrain.families.preconditioned.shampoo_blocks import (inverse_root as _inverse_root)  # noqa: E402
from run_stress import small_transformer_shapes  # noqa: E402


def first_compile(fn: Callable[..., Any], *args: Any) -> tuple[float, int, int]:
    """(seconds to compile ``jax.jit(fn)`` for ``args``, computations in the program, its
    custom calls: the LAPACK kernels)."""
    lowered = jax.jit(fn).lower(*args)
    t0 = time.perf_counter()
    compiled = lowered.compile()
    seconds = time.perf_counter() - t0
    text = compiled.as_text()
    return (seconds, sum(1 for ln in text.splitlines()
                         if ln.startswith("%") or ln.startswith("ENTRY")),
            text.count(" custom-call("))


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
                lambda qs, hs: [precondition(q, h) for q, h in zip(qs, hs)], qs, hs)),
            ("shampoo inverse root, 16 x 128", first_compile(
                lambda s: _inverse_root(s, 4, 1e-6), jnp.stack([jnp.eye(128)] * 16)))]
    for name, opt in (("kron step", functrain.contrib.kron(1e-3)),
                      ("shampoo step", functrain.contrib.shampoo(1e-3)),
                      ("adam step", functrain.adam(1e-3))):
        state = opt.init(params)
        rows.append((name, first_compile(lambda p, s, g, opt=opt: functrain.apply_updates(
            p, opt.update(g, s, p)[0]), params, state, params)))
    print(f"transformer tree: {len(shapes)} leaves in {len(groups)} same-shape groups")
    for name, (seconds, computations, calls) in rows:
        print(f"{name:32s} compile {seconds:6.2f} s   {computations:4d} computations   "
              f"{calls:3d} custom calls")


if __name__ == "__main__":
    main()
