#!/usr/bin/env python
"""Training quality of the capacity configurations on the speedrun's model: does the memory cost?

The configurations of ``benchmarks/capacity.py`` (float32 AdamW; bfloat16 params with a
bfloat16 or int8 compensation; 8-bit or 4-bit moments; gradient release) and bfloat16 params
without compensation, each trained on the speedrun's first model (examples/speedrun_model.py
``FULL``: 2 layers, 115k parameters) with its data, batch, budget, learning-rate multiplier,
AdamW's tuned rate (0.002) and seeds 0-9, its blocks stacked on a layer axis and run by a
scan (so that gradient release applies; the float32 row is that same model). The bfloat16
rows compute in bfloat16 (the cross-entropy in float32) and are evaluated at their stored
bfloat16 weights. Per configuration: steps to the speedrun's target (2.25; evaluated every 10
steps, so to 10 steps) and the final validation loss, mean with a 95% t-interval, and Welch's
two-sided test against float32 AdamW (examples/speedrun_results.py).

Usage: ``python benchmarks/bf16_quality.py [--seeds 10] [--out benchmarks/results]``; writes
``bf16_quality.{json,md}``. ``--tiny``: the speedrun's tiny model and 2 seeds (the tests').

``--long STEPS`` (10,000 for the record): the long run. The same model, rate and schedule
(warmup, constant, linear decay to zero over the last 40%) stretched to ``STEPS``, evaluated
every ``STEPS / 40`` steps, for :data:`LONG_CONFIGS` and ``--seeds`` seeds (2 for the
record). There Adam's steps shrink below half of a bfloat16 weight's spacing (``2**-9``
relative) long before the end, and round-to-nearest drops them: the uncompensated run
stalls, the compensated ones keep the float32 run's progress. Writes ``bf16_long.{json,md}``
and ``bf16_long.png`` (the validation curves).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

import functrain  # noqa: E402
import speedrun  # noqa: E402
import speedrun_model as model  # noqa: E402
import speedrun_results as stats  # noqa: E402

LR = speedrun.LEARNING_RATES["adamw"]
# label -> (params dtype, compensation dtype or None, moment bits or None, gradient release)
CONFIGS = {
    "float32 adamw": (jnp.float32, None, None, False),
    "bf16, no compensation": (jnp.bfloat16, None, None, False),
    "bf16 + bf16 compensation": (jnp.bfloat16, jnp.bfloat16, None, False),
    "bf16 + int8 compensation + 8-bit moments": (jnp.bfloat16, jnp.int8, 8, False),
    "bf16 + int8 compensation + 4-bit moments": (jnp.bfloat16, jnp.int8, 4, False),
    "bf16 + int8 compensation + 8-bit moments + gradient release":
        (jnp.bfloat16, jnp.int8, 8, True),
}
REFERENCE = "float32 adamw"
#: The long run's configurations.
LONG_CONFIGS = ("float32 adamw", "bf16, no compensation", "bf16 + bf16 compensation",
                "bf16 + int8 compensation + 8-bit moments + gradient release")


def stacked(params: dict) -> dict:
    """The speedrun model's params with its list of blocks stacked into ``layers``."""
    rest = {k: v for k, v in params.items() if k != "blocks"}
    return {**rest, "layers": jax.tree.map(lambda *xs: jnp.stack(xs), *params["blocks"])}


def parts(n_head: int) -> tuple:
    """``(embed, layer, head, loss)`` of the stacked model (``loss`` runs the scan)."""
    def embed(rest, window):
        return model.embed(rest, window[:, :-1])

    def layer(block, x):
        return model.block_forward(block, x, n_head)

    def head(rest, x, window):
        return model.cross_entropy(model.logits(rest, x), window)

    def loss(params, window):
        x, _ = jax.lax.scan(lambda x, b: (layer(b, x), None), embed(params, window),
                            params["layers"])
        return head(params, x, window)
    return embed, layer, head, loss


def optimizer(label: str, steps: int, lr: float = LR) -> functrain.GradientTransformation:
    """AdamW at ``lr`` (the speedrun's tuned rate) and the speedrun's multiplier, with the
    configuration's state."""
    _, compensation, bits, _ = CONFIGS[label]
    inner = functrain.adamw(lr)
    if bits:
        inner = functrain.quantized_state(inner, bits=bits)
    opt = functrain.chain(inner, functrain.scale_by_schedule(speedrun.lr_multiplier(steps)))
    if compensation is not None:
        opt = functrain.compensated_params(opt, compensation_dtype=compensation)
    return opt


def run(label: str, cfg, data: dict, seeds: list, target: float, lr: float = LR) -> list:
    """Train ``label`` once per seed; per run the validation curve (every ``eval_every``)."""
    dtype, _, _, release = CONFIGS[label]
    vocab, steps = len(data["vocab"]), cfg.steps
    embed, layer, head, loss = parts(cfg.n_head)
    opt = optimizer(label, steps, lr)
    val = jnp.asarray(data["val"])
    if release:
        rel = functrain.gradient_release(opt, embed, layer, head)
        init, step = rel.init, jax.jit(rel.step)
    else:
        def ordinary(params, state, window):
            value, grads = jax.value_and_grad(loss)(params, window)
            updates, state = opt.update(grads, state, params)
            return functrain.apply_updates(params, updates), state, value
        init, step = opt.init, jax.jit(ordinary)
    evaluate = jax.jit(lambda p: loss(jax.tree.map(lambda x: x.astype(jnp.float32), p), val))
    runs = []
    for seed in seeds:
        params = stacked(model.init_params(jax.random.PRNGKey(seed), cfg, vocab))
        params = jax.tree.map(lambda x: x.astype(dtype), params)
        state = init(params)
        windows = (model.batch_starts(cfg, len(data["train"]), steps, seed)[:, :, None]
                   + np.arange(cfg.context + 1))
        curve_steps, curve = [0], [float(evaluate(params))]
        for i in range(steps):
            params, state, _ = step(params, state, data["train"][windows[i]])
            if (i + 1) % cfg.eval_every == 0 or i + 1 == steps:
                curve_steps.append(i + 1)
                curve.append(float(evaluate(params)))
        runs.append({"seed": seed, "steps": curve_steps, "val_loss": curve,
                     "steps_to_target": stats.steps_to_target(curve_steps, curve, target),
                     "final_val_loss": curve[-1]})
    return runs


def summarize(results: dict, budget: int, reference: str = REFERENCE) -> list:
    """Per configuration: steps to target and final loss, with Welch's p against the
    reference (float32 AdamW)."""
    ref = results[reference]
    ref_steps = stats.summarize([r["steps_to_target"] for r in ref], budget)
    ref_final = [r["final_val_loss"] for r in ref]
    rows = []
    for label, runs in results.items():
        s = stats.summarize([r["steps_to_target"] for r in runs], budget)
        final = [r["final_val_loss"] for r in runs]
        finite = all(map(math.isfinite, final))
        rows.append({
            "config": label, "steps": s, "final": stats.mean_interval(final) if finite else None,
            "p_steps": None if label == reference else stats.compare(s, ref_steps),
            "p_final": (None if label == reference or not finite
                        else stats.welch_test(final, ref_final)[2])})
    return rows


def markdown(rows: list, budget: int, target: float) -> str:
    """The table: steps to target and final loss per configuration, p against float32."""
    lines = [f"| configuration | steps to {target} (mean ± 95% CI) | censored | p vs float32 | "
             f"final loss at {budget} (mean ± 95% CI) | p vs float32 |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        final = "diverged" if r["final"] is None else f"{r['final'][0]:.3f} ± {r['final'][1]:.3f}"
        lines.append(f"| {r['config']} | {stats.format_steps(r['steps'], budget)} | "
                     f"{r['steps']['censored']}/{r['steps']['n']} | {stats.format_p(r['p_steps'])} "
                     f"| {final} | {stats.format_p(r['p_final'])} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--long", type=int, default=0, metavar="STEPS",
                        help="the long run: STEPS steps, LONG_CONFIGS only")
    parser.add_argument("--lr", type=float, default=LR,
                        help="AdamW's peak rate (default: the speedrun's tuned one); another "
                             "rate's results get the suffix _lr<rate>")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=None,
                        help="only these configurations (the first is the reference)")
    args = parser.parse_args(argv)
    cfg = model.TINY if args.tiny else model.FULL
    seeds = list(range(2 if args.tiny else args.seeds))
    target = speedrun.TARGET_LOSS if not args.tiny else 3.9
    labels = list(CONFIGS)
    name = "bf16_quality"
    if args.long:
        cfg = dataclasses.replace(cfg, steps=args.long, eval_every=max(1, args.long // 40))
        labels, name = list(LONG_CONFIGS), "bf16_long"
    labels = args.configs or labels
    if args.lr != LR:
        name += f"_lr{args.lr:g}"
    functrain.linalg.set_lapack_threads(1)
    start = time.perf_counter()
    data = model.load_data(cfg)
    results = {}
    for label in labels:
        t = time.perf_counter()
        results[label] = run(label, cfg, data, seeds, target, args.lr)
        print(f"{label}: {time.perf_counter() - t:.0f} s", flush=True)
    rows = summarize(results, cfg.steps, labels[0])
    table = markdown(rows, cfg.steps, target)
    meta = {"date": datetime.date.today().isoformat(), "jax": jax.__version__,
            "seeds": seeds, "steps": cfg.steps, "target": target, "lr": args.lr,
            "seconds": round(time.perf_counter() - start)}
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(
        {"meta": meta, "rows": rows, "runs": results}, indent=1))
    heading = ("Training quality of the capacity configurations" if not args.long else
               f"bfloat16 params over {cfg.steps:,} steps: stall and compensation")
    (args.out / f"{name}.md").write_text(
        f"# {heading} ({meta['date']})\n\n"
        f"`benchmarks/bf16_quality.py{f' --long {args.long}' if args.long else ''}`, jax "
        f"{meta['jax']}, {meta['seconds']} s; the speedrun's first model, AdamW at {args.lr}, "
        f"seeds {seeds}.\n\n{table}\n")
    if args.long:
        (args.out / f"{name}.png").write_bytes(plot(results, cfg.steps))
    return {"meta": meta, "rows": rows, "runs": results}


def plot(results: dict, steps: int) -> bytes:
    """PNG of the validation curves (the mean over seeds per configuration)."""
    import io

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, runs in results.items():
        curve = np.mean([r["val_loss"] for r in runs], axis=0)
        ax.plot(runs[0]["steps"], curve, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(f"validation loss (mean of {len(runs)} seeds)")
    ax.set_ylim(top=min(3.0, ax.get_ylim()[1]))
    ax.axvspan(0.6 * steps, steps, color="0.92", zorder=0, label="learning-rate decay")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


if __name__ == "__main__":
    main()
