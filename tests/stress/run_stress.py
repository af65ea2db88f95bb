"""Stress test: every optimizer whose step holds a conditional or a decomposition, in fresh processes.

``make stress`` (and CI) runs ``python tests/stress/run_stress.py``: each
optimizer below trains a transformer-shaped tree (an embedding (512, 128), a
head (128, 512), four blocks of four (128, 128) attention matrices, a
(128, 512) and a (512, 128) MLP matrix, norm and bias vectors: 39 leaves)
with a jitted, donated step through its first preconditioner refreshes, in a
fresh Python process under a timeout, one process at a time (two at a time,
``--parallel 2``, also finds the deadlock, but then SciPy's OpenBLAS threads
spin against XLA's and slow steps with decompositions 10-100 fold:
docs/matrix_optimizers.md). A process that does not finish in time is a hang:
the run fails and names the optimizer. docs/matrix_optimizers.md records the hang this guards
against (a batched LAPACK call inside ``lax.cond`` deadlocking XLA:CPU).

``STRESSED`` is the list; ``tests/test_stress_list.py`` checks that every
optimizer whose compiled step contains a conditional, a loop or a LAPACK
decomposition is declared ``stressed=True`` (``@declare_optimizer``) and that every
one so declared is on it.

Usage: ``python tests/stress/run_stress.py [--runs N] [--only NAME ...]``;
``python tests/stress/run_stress.py --one NAME SEED`` runs one process's work.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, NamedTuple, Optional


class Stressed(NamedTuple):
    """One optimizer of the stress run."""

    make: Callable[[Any], Any]   # functrain -> GradientTransformation
    steps: int                   # enough to pass its first refreshes
    runs: int                    # fresh processes per stress run
    extra: Optional[Callable[[Callable, Any, Any], dict]] = None  # (loss, params, grads) -> kw


def _value(loss: Callable, params: Any, grads: Any) -> dict:
    return {"value": loss(params)}


def _sophia(loss: Callable, params: Any, grads: Any) -> dict:
    return {"obj_fn": loss}


def _linesearch(loss: Callable, params: Any, grads: Any) -> dict:
    return {"value": loss(params), "grad": grads, "value_fn": loss}


def _muon_clip_layers(ft: Any) -> dict:
    return {f"b{b}": ft.contrib.QKClipLayer(f"b{b}_q", f"b{b}_k", num_heads=4)
            for b in range(4)}


def _muon_clip_logits(loss: Callable, params: Any, grads: Any) -> dict:
    """Per-head stand-ins for the max logits, near tau = 100: 60 times the product of each
    head's query and key norms (the leaves start at norm ~1.3 per head)."""
    import jax.numpy as jnp
    norm = lambda w: jnp.linalg.norm(w.reshape(128, 4, 32), axis=(0, 2))  # noqa: E731
    return {"attention_logits": {f"b{b}": 60 * norm(params[f"b{b}_q"]) * norm(params[f"b{b}_k"])
                                 for b in range(4)}}


# name -> setting. The four matrix optimizers get most of the runs (at least 50 in all).
STRESSED: dict[str, Stressed] = {
    "shampoo": Stressed(lambda ft: ft.contrib.shampoo(1e-3), steps=40, runs=12),
    "soap": Stressed(lambda ft: ft.contrib.soap(1e-3, precondition_frequency=5), steps=30,
                     runs=12),
    "kron": Stressed(lambda ft: ft.contrib.kron(1e-3), steps=30, runs=12),
    "splus": Stressed(lambda ft: ft.contrib.splus(1e-3, inverse_every=5), steps=12, runs=3),
    "muon": Stressed(lambda ft: ft.contrib.muon(1e-3), steps=20, runs=6),
    "muon(aol)": Stressed(lambda ft: ft.contrib.muon(1e-3, preconditioning="aol"), steps=10,
                          runs=2),
    "normuon": Stressed(lambda ft: ft.contrib.normuon(1e-3), steps=8, runs=1),
    "soap_muon": Stressed(lambda ft: ft.contrib.soap_muon(1e-3, precondition_frequency=3),
                          steps=8, runs=1),
    "muonh": Stressed(lambda ft: ft.contrib.muonh(1e-2), steps=8, runs=1),
    "scion": Stressed(lambda ft: ft.contrib.scion(1e-3), steps=8, runs=1),
    "adamuon": Stressed(lambda ft: ft.contrib.adamuon(1e-3), steps=8, runs=1),
    "muon_clip": Stressed(lambda ft: ft.contrib.muon_clip(1e-3, qk_layers=_muon_clip_layers(ft)),
                          steps=8, runs=1, extra=_muon_clip_logits),
    "dion": Stressed(lambda ft: ft.contrib.dion(1e-3, rank=0.5), steps=10, runs=2),
    "galore": Stressed(lambda ft: ft.contrib.galore(1e-3, rank=16, update_proj_gap=5),
                       steps=12, runs=3),
    "adam_mini": Stressed(lambda ft: ft.contrib.adam_mini(1e-3), steps=8, runs=1),
    "apollo": Stressed(lambda ft: ft.contrib.apollo(1e-3, rank=16, update_proj_gap=5),
                       steps=12, runs=1),
    "apollo_mini": Stressed(lambda ft: ft.contrib.apollo_mini(1e-3, update_proj_gap=5),
                            steps=12, runs=1),
    "sophia": Stressed(lambda ft: ft.contrib.sophia(1e-3), steps=12, runs=2, extra=_sophia),
    "reduce_on_plateau": Stressed(
        lambda ft: ft.chain(ft.adam(1e-3), ft.contrib.reduce_on_plateau(patience=2)),
        steps=12, runs=2, extra=_value),
    "lbfgs": Stressed(lambda ft: ft.lbfgs(), steps=8, runs=2, extra=_linesearch),
    "apply_if_finite": Stressed(lambda ft: ft.apply_if_finite(ft.adam(1e-3), 3), steps=8,
                                runs=1),
    "multi_steps": Stressed(lambda ft: ft.MultiSteps(ft.adam(1e-3), 3), steps=8, runs=1),
}


def small_transformer_shapes() -> dict:
    """A 39-leaf, 0.9M-parameter transformer tree: name -> shape (also the matrix
    optimizers benchmark's)."""
    shapes = {"emb": (512, 128), "head": (128, 512)}
    for b in range(4):
        for n in ("q", "k", "v", "o"):
            shapes[f"b{b}_{n}"] = (128, 128)
        shapes[f"b{b}_up"], shapes[f"b{b}_down"] = (128, 512), (512, 128)
        shapes[f"b{b}_ln1"], shapes[f"b{b}_ln2"], shapes[f"b{b}_bias"] = (128,), (128,), (512,)
    return shapes


def transformer_tree(jax: Any, seed: int = 0) -> dict:
    """:func:`small_transformer_shapes` filled with scaled normal float32 values."""
    shapes = small_transformer_shapes()
    key = jax.random.PRNGKey(seed)
    return {name: 0.02 * jax.random.normal(jax.random.fold_in(key, i), shape)
            for i, (name, shape) in enumerate(sorted(shapes.items()))}


def run_one(name: str, seed: int) -> None:
    """One process's work: ``STRESSED[name]``'s steps on the tree, printing each step."""
    import jax
    import jax.numpy as jnp

    import functrain

    setting = STRESSED[name]
    opt = setting.make(functrain)
    params = transformer_tree(jax, seed)
    target = jax.tree.map(lambda p: jnp.roll(p, 1, axis=0), params)

    def loss(p: Any) -> jax.Array:
        return sum(jnp.mean(jnp.square(a - b)) + 1e-3 * jnp.mean(jnp.sin(7 * a))
                   for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(target)))

    def step(params: Any, state: Any) -> tuple:
        grads = jax.grad(loss)(params)
        extra = setting.extra(loss, params, grads) if setting.extra else {}
        updates, state = opt.update(grads, state, params, **extra)
        return functrain.apply_updates(params, updates), state

    step = jax.jit(step, donate_argnums=(0, 1))
    state = opt.init(params)
    for i in range(setting.steps):
        params, state = step(params, state)
        jax.block_until_ready(params)
        print(f"step {i + 1}", flush=True)
    if not all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(params)):
        raise SystemExit(f"{name}: non-finite parameters after {setting.steps} steps")
    print(f"ok {name}", flush=True)


def _spawn(name: str, seed: int, timeout: float) -> tuple:
    start = time.perf_counter()
    cmd = [sys.executable, os.path.abspath(__file__), "--one", name, str(seed)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        tail = (e.stdout or b"")
        tail = tail.decode() if isinstance(tail, bytes) else tail
        last = tail.strip().splitlines()[-1:] or ["before the first step"]
        return name, seed, "HANG", time.perf_counter() - start, f"no exit in {timeout:.0f} s, "\
            f"last output: {last[0]}"
    status = "ok" if out.returncode == 0 and f"ok {name}" in out.stdout else "FAIL"
    detail = "" if status == "ok" else (out.stderr.strip().splitlines() or ["?"])[-1]
    return name, seed, status, time.perf_counter() - start, detail


def main(argv: Optional[list] = None) -> int:
    """Run the stress test; return the exit status (1 if any process hung or failed)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", nargs=2, metavar=("NAME", "SEED"))
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--runs", type=int, default=None, help="processes per optimizer")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per process")
    ap.add_argument("--parallel", type=int, default=1)
    args = ap.parse_args(argv)
    if args.one:
        run_one(args.one[0], int(args.one[1]))
        return 0
    names = args.only or list(STRESSED)
    unknown = sorted(set(names) - set(STRESSED))
    if unknown:
        ap.error(f"unknown optimizers {unknown}; known: {sorted(STRESSED)}")
    jobs = [(n, seed) for n in names
            for seed in range(args.runs if args.runs else STRESSED[n].runs)]
    # Interleave the optimizers, so concurrent processes run different programs.
    jobs.sort(key=lambda job: (job[1], names.index(job[0])))
    start = time.perf_counter()
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(lambda job: _spawn(*job, args.timeout), jobs))
    print(f"{'optimizer':<20} {'runs':>5} {'ok':>4} {'hang':>5} {'fail':>5} {'median s':>9}")
    bad = []
    for n in names:
        mine = [r for r in results if r[0] == n]
        secs = sorted(r[3] for r in mine)
        count = {s: sum(r[2] == s for r in mine) for s in ("ok", "HANG", "FAIL")}
        print(f"{n:<20} {len(mine):>5} {count['ok']:>4} {count['HANG']:>5} "
              f"{count['FAIL']:>5} {secs[len(secs) // 2]:>9.1f}")
        bad += [r for r in mine if r[2] != "ok"]
    print(f"{len(results)} processes in {time.perf_counter() - start:.0f} s")
    for n, seed, status, _, detail in bad:
        print(f"{status}: {n} (seed {seed}): {detail}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
