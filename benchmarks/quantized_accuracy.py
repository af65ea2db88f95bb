"""Low-bit optimizer state on real training: float32 vs 8-bit vs 4-bit (and fp8) AdamW.

Two runs, each with the model, data, seed, batch order and schedule of an example:

* **demo** (``examples/demo.py``, ``make demo``): the MLP 64-256-256-10 on scikit-learn's
  digits, 40 epochs of batch 64, gradient clipping at global norm 1 and the demo's Adam
  schedule (warmup-cosine, peak 1e-3), with ``functrain.adamw`` / ``adamw_8bit`` /
  ``adamw_4bit`` / ``adamw_fp8`` in Adam's place. Reported: test accuracy and loss, for
  each of ``--seeds`` (the seed sets the split, the initialization and the batch order).
* **speedrun** (``examples/speedrun.py``, ``make speedrun``): its char-level GPT with its
  AdamW learning rate (3e-3) and warmup/constant/decay multiplier, ``--steps`` steps
  (default: the speedrun's 400), with ``quantized_state(adamw(lr), bits=...)`` in
  ``adamw(lr)``'s place. Reported: the final validation loss.

The presets keep leaves under 4096 values in float32 (``min_size``): in the demo's MLP
that is the last layer (256 x 10), the biases and the LayerNorm parameters.

Writes ``quantized_accuracy.md`` and ``.json`` to ``--out`` (default
``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import demo  # noqa: E402
import functrain  # noqa: E402
import speedrun  # noqa: E402

VARIANTS = ("float32", "8-bit", "4-bit", "4-bit nearest", "fp8")
# quantized_state's arguments per variant. "4-bit nearest" is Li et al.'s first-moment
# rounding (the 4-bit default before stochastic rounding); "4-bit block" (per-block
# second-moment scales, the default before rank-1 normalization) only with --variants.
OPTIONS = {"8-bit": dict(bits=8), "4-bit": dict(bits=4), "fp8": dict(bits="fp8"),
           "4-bit nearest": dict(bits=4, stochastic_rounding=False),
           "4-bit block": dict(bits=4, rank1=False, stochastic_rounding=False)}


def demo_maker(variant: str):
    """The demo's Adam setup (clipping, warmup-cosine peak 1e-3) with AdamW of ``variant``."""
    def make(name, total_steps, warmup_steps):
        schedule = functrain.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=1e-3, warmup_steps=warmup_steps,
            decay_steps=total_steps, end_value=1e-5)
        opt = functrain.adamw(schedule)
        if variant != "float32":
            opt = functrain.quantized_state(opt, **OPTIONS[variant])
        return functrain.chain(functrain.clip_by_global_norm(1.0), opt)
    return make


def speedrun_maker(variant: str):
    """The speedrun's AdamW (``adamw(lr)`` then its multiplier) with state of ``variant``."""
    def make(name, lr, steps, adamw_lr, params):
        opt = functrain.adamw(lr)
        if variant != "float32":
            opt = functrain.quantized_state(opt, **OPTIONS[variant])
        return functrain.chain(opt, functrain.scale_by_schedule(speedrun.lr_multiplier(steps)))
    return make


def run_demo(seeds, variants, epochs: int) -> dict:
    out = {}
    for seed in seeds:
        data = demo.load_digits(seed)
        for v in variants:
            t = time.perf_counter()
            r = demo.train("adamw", data, seed=seed, epochs=epochs, batch_size=64, quiet=True,
                           make=demo_maker(v))
            out.setdefault(v, []).append({"seed": seed, "test_acc": r["test_acc"],
                                          "test_loss": r["test_loss"],
                                          "seconds": time.perf_counter() - t})
            print(f"demo seed {seed} {v:>8}: test accuracy {r['test_acc']:.2%}, "
                  f"test loss {r['test_loss']:.4f}", flush=True)
    return out


def run_speedrun(seeds, variants, steps: int) -> dict:
    data = speedrun.load_data(speedrun.FULL)  # the seed changes the init and batches only
    lr = speedrun.LEARNING_RATES["adamw"]
    out = {}
    for seed in seeds:
        cfg = dataclasses.replace(speedrun.FULL, seed=seed)
        for v in variants:
            r = speedrun.train("adamw", lr, data, cfg, steps, lr, quiet=True,
                               make=speedrun_maker(v))
            out.setdefault(v, []).append({
                "seed": seed, "final_val_loss": r["final_val_loss"], "val_loss": r["val_loss"],
                "steps": r["steps"], "train_seconds": r["train_seconds"][-1]})
            print(f"speedrun seed {seed} {steps} steps {v:>8}: final validation loss "
                  f"{r['final_val_loss']:.4f} ({r['train_seconds'][-1]:.1f} s of training)",
                  flush=True)
    return out


def markdown(res: dict, meta: dict) -> str:
    lines = ["# Low-bit optimizer state: accuracy on real training", "",
             f"Made by `python benchmarks/quantized_accuracy.py` ({meta['machine']}, jax "
             f"{meta['jax']}); {meta['seconds']:.0f} s in all.", ""]
    if "demo" in res:
        d = res["demo"]
        seeds = [r["seed"] for r in d["float32"]]
        lines += ["## Digits MLP (the demo's model, data and schedule; AdamW)", "",
                  f"{meta['epochs']} epochs; test set of 450 images (one image = 0.22 "
                  "points). Seeds " + ", ".join(map(str, seeds)) + ".", "",
                  "| state | " + " | ".join(f"seed {s}" for s in seeds)
                  + " | mean | mean - float32 (points) |",
                  "|---|" + "---:|" * (len(seeds) + 2)]
        base = statistics.mean(r["test_acc"] for r in d["float32"])
        for v, rows in d.items():
            mean = statistics.mean(r["test_acc"] for r in rows)
            lines.append(f"| {v} | " + " | ".join(f"{r['test_acc']:.2%}" for r in rows)
                         + f" | {mean:.2%} | {100 * (mean - base):+.2f} |")
        lines.append("")
    if "speedrun" in res:
        s = res["speedrun"]
        seeds = [r["seed"] for r in s["float32"]]
        base = [r["final_val_loss"] for r in s["float32"]]
        lines += ["## Char-level GPT (the speedrun's model, data and AdamW schedule)", "",
                  f"{meta['steps']} steps (the speedrun's full budget is "
                  f"{speedrun.FULL.steps}); final validation loss in nats per character, "
                  "and its difference to float32 AdamW with the same seed (seed 0 is "
                  "`make speedrun`'s). Seeds change the initialization and the batches.", "",
                  "| state | " + " | ".join(f"seed {k}" for k in seeds)
                  + " | mean | mean of the differences |",
                  "|---|" + "---:|" * (len(seeds) + 2)]
        for v, rows in s.items():
            diffs = [100 * (r["final_val_loss"] / b - 1) for r, b in zip(rows, base)]
            lines.append(f"| {v} | " + " | ".join(
                f"{r['final_val_loss']:.4f} ({d:+.2f}%)" for r, d in zip(rows, diffs))
                + f" | {statistics.mean(r['final_val_loss'] for r in rows):.4f} | "
                f"{statistics.mean(diffs):+.2f}% |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--speedrun-seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=speedrun.FULL.steps)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--only", choices=("demo", "speedrun"), default=None)
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",")]
    start = time.perf_counter()
    res = {}
    if args.only in (None, "demo"):
        res["demo"] = run_demo([int(s) for s in args.seeds.split(",")], variants, args.epochs)
    if args.only in (None, "speedrun"):
        res["speedrun"] = run_speedrun([int(s) for s in args.speedrun_seeds.split(",")],
                                       variants, args.steps)
    meta = {"machine": f"{os.cpu_count()} CPU cores ({jax.devices()[0].platform})",
            "jax": jax.__version__, "seconds": time.perf_counter() - start,
            "epochs": args.epochs, "steps": args.steps}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quantized_accuracy.json").write_text(json.dumps({"meta": meta, **res},
                                                                 indent=1))
    text = markdown(res, meta)
    (args.out / "quantized_accuracy.md").write_text(text)
    print(text)
    return res


if __name__ == "__main__":
    main()
