"""functrain's ``contrib.kron`` against psgd-jax's ``kron`` (the reference) on lightbench's tasks.

Why does Kron solve fewer lightbench tasks than LightBench's table suggests? Three
checks, printed as markdown tables (their numbers and the explanation: docs/performance.md,
"Why Kron solves fewer of these tasks"):

1. Step by step, in float64, with the preconditioner updated every step (probability 1) and
   the whitening noise of psgd-jax fed to functrain's update (functrain draws its own from
   ``state.key``; here its draw is replaced by psgd-jax's, derived from psgd-jax's fixed key
   and the step count): the largest relative difference of the two updates over the first
   steps. Machine precision means the same algorithm.
2. The tasks at lightbench's settings (``benchmarks/lightbench.py``'s harness, key and
   learning-rate grid, both optimizers at their defaults: update probability 1 for 500 steps,
   then annealed; preconditioner init scale 1; RMS clip 1.1), then with the learning rate
   decayed to 0 by a cosine over the task's budget (same grid): the best final evaluation, the
   learning rate that gave it, and whether it reached the target.
3. Why: ``quadratic_cond1e4`` for 16 times its budget at constant learning rates, the loss
   and ``rms(update) / lr`` along the way (median of 100 steps), both Krons and AdamW.

The two implementations differ by design only in randomness: functrain flips a coin per step
for the preconditioner update and draws the noise from ``state.key``; psgd-jax updates
deterministically every ``1/p`` steps and derives its noise from a fixed key. Those change
the numbers of a run, not what happens on average.

Usage: ``python benchmarks/kron_vs_psgd.py [--tasks a,b] [--fine] [--skip-steps]
[--skip-trace]`` (``--fine``: 25 learning rates from 1e-4 to 0.1 instead of lightbench's 7;
default tasks: the six Kron missed). A few minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import functrain  # noqa: E402
from functrain.jax_compat import enable_x64
from lightbench import LEARNING_RATES, make_run  # noqa: E402
from lightbench_tasks import TASKS  # noqa: E402

#: lightbench's tasks that functrain's kron missed in benchmarks/results/lightbench.md.
MISSED = ("quadratic_cond1e4", "quadratic_tiny_scale", "quadratic_sparse_grad",
          "quadratic_delayed_grad", "matrix_factorization", "rosenbrock")
#: The tasks of the step-by-step check: 1-D (diagonal factors), 2-D leaves (triangular).
STEP_TASKS = ("quadratic_cond1e4", "rosenbrock", "matrix_factorization")


def import_psgd_kron():
    """psgd-jax's kron module. psgd-jax 0.2.9 imports ``optax._src.clipping``, which newer
    optax moved to ``optax.transforms._clipping`` (it uses nothing from it): alias it."""
    try:
        return importlib.import_module("psgd_jax.kron")
    except ImportError:
        import optax._src
        from optax.transforms import _clipping
        sys.modules.setdefault("optax._src.clipping", _clipping)
        optax._src.clipping = _clipping
        return importlib.import_module("psgd_jax.kron")


def psgd_noise(count: int, leaves: list) -> list:
    """The standard normal draws psgd-jax 0.2.9 whitens against at step ``count`` (its keys:
    the step folded into a fixed key, then split for the update branch, the balancing coin
    and the per-leaf draws)."""
    key = jax.random.fold_in(jax.random.PRNGKey(5318008), count)
    branch = jax.random.split(key)[1]
    after_coin = jax.random.split(branch)[0]
    draws = jax.random.split(jax.random.split(after_coin)[1], len(leaves))
    return [jax.random.normal(k, x.shape, x.dtype) for k, x in zip(draws, leaves)]


def step_by_step(pk, tasks: dict, names: tuple, steps: int = 30, lr: float = 0.01) -> list:
    """Rows (task, leaf shapes, max relative update difference, final losses) of the float64
    comparison with psgd-jax's noise; functrain's module-level noise draw is swapped in and
    restored."""
    fk = importlib.import_module("functrain.families.preconditioned.kron")
    count = {"n": 0}

    def noise(key, like, groups):  # noqa: ARG001 - functrain's signature
        vs = psgd_noise(count["n"], like)
        return [jnp.stack([vs[i] for i in members]) for members in groups]

    rows, original = [], fk._noise
    with enable_x64(True), contextlib.redirect_stdout(io.StringIO()):
        fk._noise = noise
        try:
            for name in names:
                task = tasks[name]
                p0 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), task.init())
                ours = functrain.contrib.kron(lr, preconditioner_update_probability=1.0)
                ref = pk.kron(lr, preconditioner_update_probability=1.0)
                pa, pb, sa, sb = p0, p0, ours.init(p0), ref.init(p0)
                worst = 0.0
                for i in range(steps):
                    count["n"] = i
                    k = jax.random.PRNGKey(i)
                    ua, sa = ours.update(jax.grad(task.loss)(pa, k), sa, pa)
                    ub, sb = ref.update(jax.grad(task.loss)(pb, k), sb, pb)
                    for a, b in zip(jax.tree.leaves(ua), jax.tree.leaves(ub)):
                        worst = max(worst, float(jnp.max(jnp.abs(a - b))
                                                 / (jnp.max(jnp.abs(b)) + 1e-300)))
                    pa = functrain.apply_updates(pa, ua)
                    pb = jax.tree.map(lambda p, u: p + u, pb, ub)
                shapes = " ".join(str(tuple(x.shape)) for x in jax.tree.leaves(p0))
                rows.append((name, shapes, worst, float(task.evaluate(pa)),
                             float(task.evaluate(pb))))
        finally:
            fk._noise = original
    return rows


def grid(task, build, lrs: np.ndarray) -> tuple:
    """lightbench's run of ``task`` at every learning rate (one vmapped program, the same
    key): (best final evaluation, its learning rate, solved at any rate)."""
    with contextlib.redirect_stdout(io.StringIO()):  # psgd-jax prints its state's size
        finals = np.asarray(jax.jit(jax.vmap(make_run(task, build), in_axes=(0, None)))(
            jnp.asarray(lrs, jnp.float32), jax.random.PRNGKey(0)))
    finite = np.where(np.isfinite(finals), finals, np.inf)
    best = int(np.argmin(finite))
    return float(finite[best]), float(lrs[best]), bool(np.any(finite <= task.target))


def trace(task, opt, steps: int) -> tuple:
    """The evaluation and ``rms(update)`` after every step of ``opt`` on ``task`` (no delay)."""
    def step(carry, k):
        p, s = carry
        u, s = opt.update(jax.grad(task.loss)(p, k), s, p)
        flat = jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(u)])
        p = functrain.apply_updates(p, u)
        return (p, s), (task.evaluate(p), jnp.sqrt(jnp.mean(flat ** 2)))

    p0 = task.init()
    run = jax.jit(lambda key: jax.lax.scan(step, (p0, opt.init(p0)),
                                           jax.random.split(key, steps))[1])
    losses, rms = run(jax.random.PRNGKey(0))
    return np.asarray(losses), np.asarray(rms)


def main(argv: list | None = None) -> None:
    """Print the step-by-step table and the task table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default=",".join(MISSED))
    ap.add_argument("--fine", action="store_true", help="25 learning rates, 1e-4 to 0.1")
    ap.add_argument("--skip-steps", action="store_true", help="no step-by-step check")
    ap.add_argument("--skip-trace", action="store_true", help="no long constant-lr trace")
    args = ap.parse_args(argv)
    pk = import_psgd_kron()
    tasks = {t.name: t for t in TASKS}
    names = args.tasks.split(",")
    unknown = sorted(set(names) - set(tasks))
    if unknown:
        ap.error(f"unknown tasks: {unknown}")
    lrs = (10 ** np.linspace(-4, -1, 25) if args.fine else np.asarray(LEARNING_RATES))
    t0 = time.perf_counter()

    if not args.skip_steps:
        print("Step by step, float64, update probability 1, psgd-jax's noise in both, lr 0.01, "
              "30 steps:\n")
        print("| task | leaves | max relative update difference | loss functrain | "
              "loss psgd-jax |\n|---|---|---|---|---|")
        for name, shapes, worst, la, lb in step_by_step(pk, tasks, STEP_TASKS):
            print(f"| {name} | {shapes} | {worst:.1e} | {la:.7g} | {lb:.7g} |")
        print()

    builders = {
        "functrain": lambda lr: functrain.contrib.kron(lr),
        "psgd-jax": lambda lr: pk.kron(lr, precond_update_precision=None),
    }
    print(f"lightbench's harness, {len(lrs)} learning rates "
          f"({lrs[0]:.0e} to {lrs[-1]:.1g}); cell: best final evaluation at lr (solved?):\n")
    print("| task | steps | target | functrain kron | psgd-jax kron | functrain, cosine lr | "
          "psgd-jax, cosine lr |\n|---|---|---|---|---|---|---|")
    for name in names:
        task, cells = tasks[name], []
        for schedule in (False, True):
            for build in builders.values():
                def b(lr, build=build, schedule=schedule, n=task.steps):
                    return build(functrain.cosine_decay_schedule(lr, n) if schedule else lr)
                best, lr, ok = grid(task, b, lrs)
                cells.append(f"{best:.2g} at {lr:.2g} ({'yes' if ok else 'no'})")
        print(f"| {name} | {task.steps} | {task.target:.3g} | " + " | ".join(cells) + " |",
              flush=True)

    if not args.skip_trace:
        task, marks = tasks["quadratic_cond1e4"], (250, 1000, 4000, 16000)
        print(f"\nquadratic_cond1e4 at a constant learning rate for {marks[-1]} steps "
              f"(target {task.target:.3g}): evaluation after n steps, and rms(update) / lr "
              f"(median over steps n-99..n):\n")
        print("| optimizer | lr | " + " | ".join(f"loss at {m}" for m in marks) + " | "
              + " | ".join(f"rms/lr at {m}" for m in marks) + " |\n|---|---|"
              + "---|" * (2 * len(marks)))
        runs = [(f"{name} kron", lr, lambda lr=lr, b=b: b(lr))
                for lr in (1e-3, 3e-3, 1e-2) for name, b in builders.items()]
        runs.append(("functrain adamw", 1e-2, lambda: functrain.adamw(1e-2, weight_decay=0.0)))
        for name, lr, make in runs:
            with contextlib.redirect_stdout(io.StringIO()):
                losses, rms = trace(task, make(), marks[-1])
            print(f"| {name} | {lr:g} | " + " | ".join(f"{losses[m - 1]:.2g}" for m in marks)
                  + " | " + " | ".join(f"{np.median(rms[m - 100:m]) / lr:.2g}" for m in marks)
                  + " |",
                  flush=True)
    print(f"\n{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
