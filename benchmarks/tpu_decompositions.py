"""Where the TPU compiler's time goes on the matrix optimizers: their decompositions.

The TPU has no LAPACK or cuSOLVER to call: ``eigh``, ``qr`` and ``triangular_solve`` are
expanded by its compiler into HLO loops. Two measurements, each compile in a fresh process
of the TPU venv (``make accel`` builds it) under a timeout, for one v5e chip:

* ``parts``: each decomposition compiled alone at the sizes the large tree of
  ``benchmarks/accel_compile.py`` gives (a (4096, 4096) matmul for scale);
* ``steps``: an optimizer's whole step on that tree (``accel_compile.compile_registry_step``),
  as it is and with ``jnp.linalg.eigh``, ``jnp.linalg.qr`` and
  ``jax.lax.linalg.triangular_solve`` replaced by same-shape stand-ins (a multiply): what the
  step costs without its decompositions.

Prints one JSON line per compile; with ``--out``, writes them to ``OUT.json``.
Usage: ``python benchmarks/tpu_decompositions.py [parts] [steps] [--names soap kron]
[--timeout 1800]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYTHON = os.path.join(ROOT, ".venv-accel-tpu", "bin", "python")

#: name -> (the decomposition, the operand's shape)
PARTS = {
    "matmul (4096, 4096)": ("lambda a: a @ a", (4096, 4096)),
    "eigh (1024, 1024)": ("lambda a: jnp.linalg.eigh(a)[1]", (1024, 1024)),
    "eigh 8 x (1024, 1024)": ("lambda a: jnp.linalg.eigh(a)[1]", (8, 1024, 1024)),
    "qr 8 x (1024, 1024)": ("lambda a: jnp.linalg.qr(a)[0]", (8, 1024, 1024)),
    "triangular solve (4096, 4096)": (
        "lambda a: jax.scipy.linalg.solve_triangular(a, a, lower=True)", (4096, 4096)),
    "qr 8 x (4096, 4096)": ("lambda a: jnp.linalg.qr(a)[0]", (8, 4096, 4096)),
    "eigh 8 x (4096, 4096)": ("lambda a: jnp.linalg.eigh(a)[1]", (8, 4096, 4096)),
}

_PART = """
import sys, time, json
sys.path.insert(0, {here!r})
import accel_compile as ac
import jax, jax.numpy as jnp
placed = ac.placed_on("tpu_v5e")
start = time.perf_counter()
c = jax.jit({fn}).lower(jax.ShapeDtypeStruct({shape!r}, jnp.float32, sharding=placed)).compile()
print(json.dumps({{"part": {name!r}, "compile_s": time.perf_counter() - start,
                  "lines": c.as_text().count("\\n")}}))
"""

_STEP = """
import sys, json
import jax, jax.numpy as jnp
if {stub!r}:
    jnp.linalg.eigh = lambda a, *args, **kw: (jnp.diagonal(a, axis1=-2, axis2=-1), a * 0.5)
    jnp.linalg.qr = lambda a, *args, **kw: (a * 0.5, a * 0.25)
    jax.lax.linalg.triangular_solve = lambda a, b, *args, **kw: b * 0.5
sys.path.insert(0, {here!r})
sys.path.insert(0, {root!r})
import accel_compile as ac
compiled, state, seconds = ac.compile_registry_step("tpu_v5e", "large", {name!r}, "functrain")
text = compiled.as_text()
print(json.dumps({{"step": {name!r}, "decompositions": not {stub!r}, "compile_s": seconds,
                  "lines": text.count("\\n")}}))
"""


def run(code: str, timeout: float, label: dict) -> dict:
    """One compile in a fresh process of the TPU venv: its JSON line, or why not."""
    try:
        done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**label, "error": f"did not compile in {timeout:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        return {**label, "error": (done.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="*", default=["parts", "steps"])
    ap.add_argument("--names", nargs="+", default=["soap", "shampoo", "kron", "splus"])
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rows = []
    if "parts" in args.what:
        for name, (fn, shape) in PARTS.items():
            rows.append(run(_PART.format(here=HERE, fn=fn, shape=shape, name=name),
                            args.timeout, {"part": name}))
            print(json.dumps(rows[-1]), flush=True)
    if "steps" in args.what:
        for name in args.names:
            for stub in (True, False):
                rows.append(run(_STEP.format(here=HERE, root=ROOT, name=name, stub=stub),
                                args.timeout, {"step": name, "decompositions": not stub}))
                print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
