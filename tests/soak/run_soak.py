"""The soak (``make soak``): 10,000 steps of adamw, lamb, muon and soap on a small MLP, side
by side with optax (optax.contrib for muon; soap has no optax counterpart), and a run
interrupted halfway, saved with Orbax and resumed in a fresh process.

Reports, every ``--chunk`` steps, the largest relative difference between functrain's and
optax's parameters (``max |p_ft - p_optax| / max |p_optax|`` over leaves), and fails if it
passes ``--bound`` or if a resumed run does not end bit-identical to the uninterrupted one.

Usage: ``python tests/soak/run_soak.py [--steps 10000] [--chunk 1000] [--out DIR]``;
``--quick`` is the reduced version the test suite runs (1,000 steps).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

import functrain  # noqa: E402

NAMES = ("adamw", "lamb", "muon", "soap")


def builders(name: str) -> tuple:
    """(functrain's optimizer, optax's or None)."""
    import optax
    import optax.contrib  # noqa: F401
    if name == "adamw":
        return functrain.adamw(1e-3, weight_decay=1e-4), optax.adamw(1e-3, weight_decay=1e-4)
    if name == "lamb":
        return functrain.lamb(1e-3, weight_decay=1e-4), optax.lamb(1e-3, weight_decay=1e-4)
    if name == "muon":
        return functrain.contrib.muon(1e-3), optax.contrib.muon(1e-3)
    if name == "soap":
        return functrain.contrib.soap(1e-3), None
    raise ValueError(f"unknown optimizer {name!r}; use one of {NAMES}")


DTYPE = jnp.float32


def problem() -> tuple:
    """A 16-64-64-1 MLP regressing a fixed random teacher, minibatches of 32 of 512."""
    rng = np.random.default_rng(0)
    xs = jnp.asarray(rng.standard_normal((512, 16)), DTYPE)
    ys = jnp.sin(xs @ jnp.asarray(rng.standard_normal((16, 1)), DTYPE))
    sizes = [(16, 64), (64, 64), (64, 1)]
    params = {f"w{i}": jnp.asarray(rng.standard_normal(s) / np.sqrt(s[0]), DTYPE)
              for i, s in enumerate(sizes)}
    params.update({f"b{i}": jnp.zeros(s[1], DTYPE) for i, s in enumerate(sizes)})

    def loss(p: dict, t: jax.Array) -> jax.Array:
        start = (t * 32) % 512
        x = jax.lax.dynamic_slice_in_dim(xs, start, 32)
        y = jax.lax.dynamic_slice_in_dim(ys, start, 32)
        h = jnp.tanh(x @ p["w0"] + p["b0"])
        h = jnp.tanh(h @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    return params, loss


def chunk_runner(opt, loss, chunk: int):
    """``run(params, state, t0) -> (params, state)``: ``chunk`` steps from step ``t0``."""
    def run(params, state, t0):
        def step(carry, t):
            p, s = carry
            g = jax.grad(loss)(p, t)
            u, s = opt.update(g, s, p)
            return (functrain.apply_updates(p, u), s), None
        (params, state), _ = jax.lax.scan(step, (params, state), t0 + jnp.arange(chunk))
        return params, state
    return jax.jit(run)


def train(opt, steps: int, chunk: int, start=None, on_chunk=None, nudge=False):
    params, loss = problem()
    if nudge:  # one ulp up on every parameter: how fast the training amplifies rounding
        params = jax.tree.map(lambda x: jnp.nextafter(x, jnp.asarray(np.inf, x.dtype)),
                              params)
    run = chunk_runner(opt, loss, chunk)
    params, state, t = (params, opt.init(params), 0) if start is None else start
    while t < steps:
        params, state = run(params, state, jnp.asarray(t, jnp.int32))
        t += chunk
        if on_chunk is not None:
            on_chunk(t, params)
    return params, state


def rel_diff(a: dict, b: dict) -> float:
    return max(float(jnp.max(jnp.abs(a[k] - b[k])) / (jnp.max(jnp.abs(b[k])) + 1e-30))
               for k in a)


def save(path: str, params, state) -> None:
    import orbax.checkpoint as ocp
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(path, {"params": params, "opt_state": state})
    ckpt.wait_until_finished()


def resume(name: str, path: str, steps: int, chunk: int, out: str) -> None:
    """In a fresh process: restore the halfway checkpoint, finish, write the params."""
    import orbax.checkpoint as ocp
    opt, _ = builders(name)
    params, _ = problem()
    target = jax.eval_shape(lambda: {"params": params, "opt_state": opt.init(params)})
    restored = ocp.StandardCheckpointer().restore(path, target)
    p, _ = train(opt, steps, chunk, start=(restored["params"], restored["opt_state"],
                                           steps // 2))
    np.savez(out, **{k: np.asarray(v) for k, v in p.items()})


def soak(name: str, steps: int, chunk: int, workdir: str) -> dict:
    ours, theirs = builders(name)
    curve: dict = {}
    floor: dict = {}
    ref_params: dict = {}
    if theirs is not None:
        train(theirs, steps, chunk, on_chunk=lambda t, p: ref_params.__setitem__(t, p))
        train(theirs, steps, chunk, nudge=True,
              on_chunk=lambda t, p: floor.__setitem__(t, rel_diff(p, ref_params[t])))

    def record(t, p):
        if t in ref_params:
            curve[t] = rel_diff(p, ref_params[t])

    full, _ = train(ours, steps, chunk, on_chunk=record)
    half_p, half_s = train(ours, steps // 2, chunk)
    path = os.path.join(workdir, f"{name}_half")
    save(path, half_p, half_s)
    out = os.path.join(workdir, f"{name}_resumed.npz")
    cmd = [sys.executable, os.path.abspath(__file__), "--resume", name, path, str(steps),
           str(chunk), out] + (["--float64"] if DTYPE == jnp.float64 else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: the resumed process failed:\n{proc.stderr[-2000:]}")
    resumed = np.load(out)
    identical = all(np.array_equal(resumed[k], np.asarray(full[k])) for k in full)
    return {"curve": curve, "floor": floor, "resumed_bit_identical": identical}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--chunk", type=int, default=1000)
    ap.add_argument("--bound", type=float, default=1e-3,
                    help="allowed relative difference to optax, or 10x optax's own difference "
                         "after a one-ulp nudge of the initial parameters if that is larger")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--opts", default=",".join(NAMES))
    ap.add_argument("--out", default=None)
    ap.add_argument("--float64", action="store_true",
                    help="run in float64 (shows whether a float32 drift is rounding)")
    ap.add_argument("--resume", nargs=5, metavar=("NAME", "PATH", "STEPS", "CHUNK", "OUT"))
    args = ap.parse_args(argv)
    if args.float64:
        global DTYPE
        jax.config.update("jax_enable_x64", True)
        DTYPE = jnp.float64
    if args.resume:
        name, path, steps, chunk, out = args.resume
        resume(name, path, int(steps), int(chunk), out)
        return 0
    steps, chunk = (1000, 250) if args.quick else (args.steps, args.chunk)
    results, failures = {}, []
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as workdir:
        for name in args.opts.split(","):
            t0 = time.perf_counter()
            r = soak(name, steps, chunk, workdir)
            results[name] = r
            worst = max(r["curve"].values(), default=0.0)
            noise = max(r["floor"].values(), default=0.0)
            curve = " ".join(f"{t}:{d:.1e}" for t, d in sorted(r["curve"].items()))
            fl = " ".join(f"{t}:{d:.1e}" for t, d in sorted(r["floor"].items()))
            print(f"{name:6s} resumed bit-identical: {r['resumed_bit_identical']}; "
                  f"max rel diff to optax {worst:.2e} [{curve or 'no optax counterpart'}]"
                  + (f"; optax vs optax nudged by one ulp {noise:.2e} [{fl}]" if fl else "")
                  + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
            if not r["resumed_bit_identical"]:
                failures.append(f"{name}: resumed run not bit-identical")
            allowed = max(args.bound, 10 * noise)
            if worst > allowed:
                failures.append(f"{name}: relative difference {worst:.2e} > {allowed:.1e}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "soak.json"), "w") as f:
            json.dump({"steps": steps, "chunk": chunk, "bound": args.bound,
                       "results": {k: {"curve": {str(t): d for t, d in v["curve"].items()},
                                       "optax_nudged": {str(t): d
                                                        for t, d in v["floor"].items()},
                                       "resumed_bit_identical": v["resumed_bit_identical"]}
                                   for k, v in results.items()}}, f, indent=1)
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
