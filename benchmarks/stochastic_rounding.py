#!/usr/bin/env python
"""bfloat16 parameters: round-to-nearest against stochastic rounding and compensated updates.

A linear regression ``y = X w*`` (512 examples, 64 features, ``w* ~ N(0, 1)``, the start
``w0 = w* + N(0, 0.5^2)``) trained by full-batch SGD and Adam with small learning rates, in
three ways on the same data:

* ``float32``: float32 parameters (the reference);
* ``bf16 nearest``: bfloat16 parameters, ``functrain.apply_updates`` (round to nearest);
* ``bf16 stochastic``: bfloat16 parameters, ``functrain.apply_updates_stochastic`` with a
  fresh key each step;
* ``bf16 compensated``: bfloat16 parameters, the optimizer wrapped in
  ``functrain.compensated_params`` (a bfloat16 compensation per weight), ``apply_updates``.

The gradient is computed from the parameters' own values (bfloat16 for the bf16 runs);
the optimizer runs as usual. Near ``|w| ~ 1`` a bfloat16 weight moves in steps of
``2**-7``; an update below half that (``0.0039``) rounds away under round-to-nearest, so
those runs stall once the updates get small, while stochastic rounding keeps moving in
expectation. Prints, for each optimizer and learning rate, the mean squared error
``mean((X w - y)**2)`` after some steps and how many of the 64 weights changed at all.

Then the cost: milliseconds per jitted call on one bf16 leaf of 4M values.

Usage: ``python benchmarks/stochastic_rounding.py [--steps 4000]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import functrain  # noqa: E402

MODES = ("float32", "bf16 nearest", "bf16 stochastic", "bf16 compensated")


def problem(seed: int = 0, n: int = 512, d: int = 64) -> tuple:
    """(X, y, w0, w*): the data, the starting and the true weights, float32."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    w_star = rng.standard_normal(d).astype(np.float32)
    w0 = (w_star + 0.5 * rng.standard_normal(d)).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(x @ w_star), jnp.asarray(w0), jnp.asarray(w_star)


def mse(w: jax.Array, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((x @ w.astype(jnp.float32) - y) ** 2)


def train(opt: Any, mode: str, steps: int, record: tuple, seed: int = 0) -> tuple:
    """(the loss after each of ``record`` steps, how many weights differ from the start)."""
    x, y, w0, _ = problem(seed)
    w = w0 if mode == "float32" else w0.astype(jnp.bfloat16)
    if mode == "bf16 compensated":
        opt = functrain.compensated_params(opt)
    state = opt.init(w)

    def step(carry: tuple, key: jax.Array) -> tuple:
        w, state = carry
        g = jax.grad(lambda w: mse(w, x, y))(w)
        updates, state = opt.update(g, state, w)
        if mode == "bf16 stochastic":
            w = functrain.apply_updates_stochastic(w, updates, key)
        else:
            w = functrain.apply_updates(w, updates)
        return (w, state), mse(w, x, y)

    keys = jax.random.split(jax.random.key(seed + 1), steps)
    (w_end, _), losses = jax.jit(lambda c, k: jax.lax.scan(step, c, k))((w, state), keys)
    losses = np.asarray(losses)
    moved = int(np.sum(np.asarray(w_end) != np.asarray(w)))
    return [float(mse(w, x, y)) if r == 0 else float(losses[r - 1]) for r in record], moved


OPTIMIZERS: dict[str, Callable[[float], Any]] = {
    "sgd": lambda lr: functrain.sgd(lr),
    "adam": lambda lr: functrain.adam(lr),
}
SETTINGS = (("sgd", 1e-3), ("sgd", 1e-4), ("adam", 1e-3), ("adam", 1e-4))


def run(steps: int = 4000, settings: tuple = SETTINGS) -> list[dict]:
    """One row per (optimizer, learning rate, mode): the losses at 0, steps/4 and steps,
    and how many of the 64 weights ended different from where they started."""
    record = (0, steps // 4, steps)
    rows = []
    for name, lr in settings:
        for mode in MODES:
            losses, moved = train(OPTIMIZERS[name](lr), mode, steps, record)
            rows.append({"optimizer": name, "lr": lr, "mode": mode,
                         **{f"loss@{r}": v for r, v in zip(record, losses)},
                         "weights changed": moved})
    return rows


def bf16_floor(seed: int = 0) -> float:
    """The loss of ``w*`` rounded to the nearest bfloat16: the best a bf16 run can do."""
    x, y, _, w_star = problem(seed)
    return float(mse(w_star.astype(jnp.bfloat16), x, y))


def timing(n: int = 4 * 1024 * 1024, repeats: int = 20) -> dict:
    """Milliseconds per jitted call on one bf16 leaf of ``n`` values: ``apply_updates``,
    ``apply_updates_stochastic`` and, for scale, an Adam update of the same leaf."""
    params = jnp.ones(n, jnp.bfloat16)
    updates = jnp.full(n, 1e-3, jnp.bfloat16)
    adam = functrain.adam(1e-3)
    calls = {"apply_updates": (jax.jit(functrain.apply_updates), (params, updates)),
             "apply_updates_stochastic": (jax.jit(functrain.apply_updates_stochastic),
                                          (params, updates, jax.random.key(0))),
             "adam update": (jax.jit(lambda u, s, p: adam.update(u, s, p)),
                             (updates, adam.init(params), params))}
    out = {}
    for name, (fn, args) in calls.items():
        jax.block_until_ready(fn(*args))
        start = time.perf_counter()
        for _ in range(repeats):
            result = fn(*args)
        jax.block_until_ready(result)
        out[name] = (time.perf_counter() - start) / repeats * 1e3
    return out


def table(rows: list[dict]) -> str:
    cols = [c for c in rows[0] if c.startswith("loss@")]
    lines = ["| optimizer | lr | params | " + " | ".join(cols) + " | weights changed |",
             "|---|---|---|" + "---|" * (len(cols) + 1)]
    for r in rows:
        lines.append(f"| {r['optimizer']} | {r['lr']:g} | {r['mode']} | "
                     + " | ".join(f"{r[c]:.3g}" for c in cols)
                     + f" | {r['weights changed']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000)
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; linear regression 512x64, "
          f"mean squared error after each number of steps")
    print(table(run(args.steps)))
    print(f"\nbf16 floor (w* rounded to nearest bf16): loss {bf16_floor():.3g}")
    print("\nms per call on one bf16 leaf of 4M values: " + ", ".join(
        f"{k} {v:.1f}" for k, v in timing().items()))


if __name__ == "__main__":
    main()
