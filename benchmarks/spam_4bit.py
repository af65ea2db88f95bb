"""SPAM and Stable-SPAM with 4-bit state against AdamW on a regression with gradient spikes.

A student MLP 32-128-128-1 (tanh) fits a fixed random teacher MLP of the same shape on
fresh batches of 64 Gaussian inputs (targets with noise 0.01); every 50th step's gradient
is multiplied by 1000 (a spike, as a corrupted batch gives). 2000 steps at a constant
learning rate of 1e-3, no weight decay, 3 seeds (the seed sets the initialization, the
teacher and the batches). Optimizers: ``adamw`` with float32 state, ``adamw`` with 4-bit
state (``quantized_state(..., bits=4)``: the two hidden weight matrices, 4096 and 16384
values, are quantized; the rest stays float32), and ``spam`` / ``stable_spam`` (their
defaults) with the same 4-bit state. Reported: the final loss on 4096 held-out inputs,
per seed and its median.

Writes ``spam_4bit.md`` and ``.json`` to ``--out`` (default ``benchmarks/results``).
Runs in about a minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp

import functrain
from functrain.contrib import spam, stable_spam

ROOT = Path(__file__).resolve().parent.parent
SIZES = (32, 128, 128, 1)
LR = 1e-3


def four_bit(opt):
    return functrain.quantized_state(opt, bits=4)


# name -> (the optimizer, whether its run has the spikes); the first row is the reference
# without spikes.
OPTIMIZERS = {
    "adamw float32, no spikes": (lambda: functrain.adamw(LR, weight_decay=0.0), False),
    "adamw float32": (lambda: functrain.adamw(LR, weight_decay=0.0), True),
    "adamw 4-bit": (lambda: four_bit(functrain.adamw(LR, weight_decay=0.0)), True),
    "spam 4-bit": (lambda: four_bit(spam(LR)), True),
    "stable_spam 4-bit": (lambda: four_bit(stable_spam(LR)), True),
}


def init_mlp(key):
    keys = jax.random.split(key, len(SIZES) - 1)
    return [{"w": jax.random.normal(k, (a, b)) / jnp.sqrt(a), "b": jnp.zeros(b)}
            for k, a, b in zip(keys, SIZES[:-1], SIZES[1:])]


def mlp(params, x):
    for layer in params[:-1]:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def run(opt, seed: int, steps: int, spike_every: int, spike: float) -> tuple:
    """The held-out loss at the initialization and after ``steps`` steps."""
    k_teacher, k_student, k_data, k_test = jax.random.split(jax.random.PRNGKey(seed), 4)
    teacher, params = init_mlp(k_teacher), init_mlp(k_student)

    def loss(p, x, y):
        return jnp.mean((mlp(p, x) - y) ** 2)

    def batch(key, n):
        kx, kn = jax.random.split(key)
        x = jax.random.normal(kx, (n, SIZES[0]))
        return x, mlp(teacher, x) + 0.01 * jax.random.normal(kn, (n, 1))

    def step(carry, k):
        p, s = carry
        x, y = batch(jax.random.fold_in(k_data, k), 64)
        g = jax.grad(loss)(p, x, y)
        factor = jnp.where((k + 1) % spike_every == 0, spike, 1.0)
        g = jax.tree_util.tree_map(lambda a: a * factor, g)
        u, s = opt.update(g, s, p)
        return (functrain.apply_updates(p, u), s), None

    @jax.jit
    def train(p):
        test = batch(k_test, 4096)
        (trained, _), _ = jax.lax.scan(step, (p, opt.init(p)), jnp.arange(steps))
        return loss(p, *test), loss(trained, *test)

    return tuple(float(v) for v in train(params))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--spike-every", type=int, default=50)
    parser.add_argument("--spike", type=float, default=1000.0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    start = time.time()
    seeds = list(range(args.seeds))
    results, initial = {}, []
    for name, (make, spiked) in OPTIMIZERS.items():
        runs = [run(make(), seed, args.steps, args.spike_every, args.spike if spiked else 1.0)
                for seed in seeds]
        initial, losses = [r[0] for r in runs], [r[1] for r in runs]
        results[name] = {"losses": losses, "median": statistics.median(losses)}
        print(f"{name:18s} median {results[name]['median']:.4g}  "
              + "  ".join(f"{v:.4g}" for v in losses), flush=True)
    wall = time.time() - start
    device = jax.devices()[0]
    machine = f"{jax.device_count()} {device.platform} device(s), jax {jax.__version__}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = {k: getattr(args, k) for k in ("steps", "seeds", "spike_every", "spike")}
    config.update(lr=LR, sizes=SIZES, batch=64)
    (out / "spam_4bit.json").write_text(json.dumps(
        {"machine": machine, "config": config, "initial_losses": initial, "results": results,
         "wall_s": wall}, indent=1))
    lines = ["# SPAM and Stable-SPAM with 4-bit state, gradient spikes", "",
             f"Made by `python benchmarks/spam_4bit.py` ({machine}); {wall:.0f} s in all.", "",
             f"MLP {'-'.join(map(str, SIZES))} regression on a random teacher, batch 64, "
             f"{args.steps} steps at lr {LR}, every {args.spike_every}th gradient x"
             f"{args.spike:g}. Final held-out loss (lower is better); at the initialization "
             f"it is {statistics.median(initial):.3g} (median). Each optimizer at its defaults "
             f"but the learning rate; nothing tuned.", "",
             "| optimizer | " + " | ".join(f"seed {s}" for s in seeds) + " | median |",
             "|---|" + "---:|" * (len(seeds) + 1)]
    for name, r in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.4g}" for v in r["losses"])
                     + f" | {r['median']:.4g} |")
    (out / "spam_4bit.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
