"""Every way to shrink the optimizer state, side by side: bytes, step time and loss.

One row per option (``OPTIONS``), all on the speedrun's model (examples/speedrun.py: the
2-layer character-level GPT, 115,008 parameters) with the speedrun's learning-rate
multiplier and tuned rates:

* AdamW with float32, bfloat16 (``mu_dtype``, ``nu_dtype``), 8-bit, 4-bit and fp8 state
  (``adamw_8bit``, ``adamw_4bit``, ``adamw_fp8``);
* Adam-mini (``contrib.adam_mini``: one second moment per block);
* APOLLO at rank ``speedrun.APOLLO_RANK`` (the largest whose state is at most 0.1x
  AdamW's here) and APOLLO-Mini (``contrib.apollo``, ``contrib.apollo_mini``);
* Muon (its AdamW part on the embeddings, head and gains) with float32 and 8-bit state.

Measured per row:

* **state bytes per parameter** and **x AdamW**: ``speedrun.state_bytes``, the bytes of
  every array of the state built from the params' shapes (codes, scales, counts, the small
  leaves that stay float32);
* **step time**, two ways: the optimizer step alone ``(params, state, grads) -> (params,
  state)`` (donated) and the training step (loss, gradients and the optimizer step);
  medians of ``--reps`` interleaved rounds (every option once per round), as a ratio to
  AdamW float32's median in the same process, then the median of that ratio over
  ``--processes`` fresh processes (their range is kept: the machine is shared);
* **final validation loss** after the speedrun's full budget on ``--seeds`` (mean and
  sample standard deviation), each option at its optimizer's tuned rate (the bf16 and fp8
  rows at AdamW's, Muon 8-bit at Muon's; the speedrun tuned the 8-bit and 4-bit presets
  on their own);
* **steps to target** (mean ± 95% interval) copied from ``benchmarks/results/speedrun.json``
  where the speedrun has the option.

Writes ``memory_options.md``, ``.json`` and ``.png`` (loss and step time against bytes per
parameter) to ``--out`` (default ``benchmarks/results``). ``--tiny`` is the speedrun's tiny
model, budget and 2 seeds (the test suite's smoke run).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

import functrain

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import speedrun  # noqa: E402
import speedrun_results  # noqa: E402

# label -> (the speedrun optimizer whose tuned rate it runs at, how its state is stored)
OPTIONS = {
    "adamw float32": ("adamw", None),
    "adamw bf16": ("adamw", "bf16"),
    "adamw 8-bit": ("adamw_8bit", None),
    "adamw 4-bit": ("adamw_4bit", None),
    "adamw fp8": ("adamw", "fp8"),
    "adam_mini": ("adam_mini", None),
    "apollo": ("apollo", None),
    "apollo_mini": ("apollo_mini", None),
    "muon float32": ("muon", None),
    "muon 8-bit": ("muon", 8),
}
BASELINE = "adamw float32"


def maker(label: str) -> Callable:
    """The optimizer of ``label``, with the speedrun's ``make`` signature.

    Args:
      label: a key of ``OPTIONS``.

    Returns:
      ``make(name, lr, steps, adamw_lr, params, n_head)`` building the option's optimizer
      with the speedrun's learning-rate multiplier.
    """
    name, storage = OPTIONS[label]

    def make(_, lr, steps, adamw_lr, params, n_head=speedrun.FULL.n_head):
        if storage == "bf16":
            return functrain.chain(
                functrain.adamw(lr, mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16),
                functrain.scale_by_schedule(speedrun.lr_multiplier(steps)))
        if storage == "fp8":
            return functrain.chain(functrain.adamw_fp8(lr),
                                   functrain.scale_by_schedule(speedrun.lr_multiplier(steps)))
        opt = speedrun.make_optimizer(name, lr, steps, adamw_lr, params, n_head)
        return opt if storage is None else functrain.quantized_state(opt, bits=storage)
    return make


def build(label: str, cfg: speedrun.Config, params: dict):
    """The option's optimizer at its rate, for the speedrun's budget ``cfg.steps``."""
    name = OPTIONS[label][0]
    return maker(label)(name, speedrun.LEARNING_RATES[name], cfg.steps,
                        speedrun.LEARNING_RATES["adamw"], params, cfg.n_head)


def time_steps(labels: list, cfg: speedrun.Config, vocab: int, reps: int) -> dict:
    """Per label, the median ms of the optimizer step and of the training step.

    Every function is compiled first; then ``reps`` rounds call each once, in turn, so the
    machine's drift falls on all alike.
    """
    params = speedrun.init_params(jax.random.PRNGKey(0), cfg, vocab)
    window = jnp.asarray(np.random.default_rng(0).integers(0, vocab, (cfg.batch,
                                                                      cfg.context + 1)),
                         jnp.int32)
    grads = jax.grad(speedrun.loss_fn)(params, window, cfg.n_head)
    calls = {}
    for label in labels:
        opt = build(label, cfg, params)

        def opt_step(p, s, g, opt=opt):
            u, s = opt.update(g, s, p)
            return functrain.apply_updates(p, u), s

        def train_step(p, s, w, opt=opt):
            g = jax.grad(speedrun.loss_fn)(p, w, cfg.n_head)
            u, s = opt.update(g, s, p)
            return functrain.apply_updates(p, u), s

        state = opt.init(params)
        for kind, fn, extra in (("opt", opt_step, grads), ("train", train_step, window)):
            compiled = jax.jit(fn, donate_argnums=(0, 1)).lower(params, state, extra).compile()
            carry = (jax.tree.map(jnp.copy, params), jax.tree.map(jnp.copy, state))
            for _ in range(3):  # warm-up
                carry = jax.block_until_ready(compiled(*carry, extra))
            calls[(label, kind)] = [compiled, carry, extra, []]
    for _ in range(reps):
        for call in calls.values():
            t = time.perf_counter()
            call[1] = jax.block_until_ready(call[0](*call[1], call[2]))
            call[3].append(time.perf_counter() - t)
    return {f"{label}|{kind}": 1e3 * statistics.median(call[3])
            for (label, kind), call in calls.items()}


def ratios_of(times: dict, labels: list) -> dict:
    """Each label's step times over the baseline's, per kind (``opt``, ``train``)."""
    return {label: {kind: times[f"{label}|{kind}"] / times[f"{BASELINE}|{kind}"]
                    for kind in ("opt", "train")} for label in labels}


def final_losses(labels: list, cfg: speedrun.Config, data: dict, seeds: list) -> dict:
    """Per label, the final validation loss of each seed after the full budget."""
    out = {}
    for label in labels:
        name = OPTIONS[label][0]
        runs = speedrun.train_seeds(name, speedrun.LEARNING_RATES[name], data, cfg, cfg.steps,
                                    speedrun.LEARNING_RATES["adamw"], seeds, None, True,
                                    make=maker(label))
        out[label] = [r["final_val_loss"] for r in runs]
        print(f"{label:<14} final validation loss {np.mean(out[label]):.4f} "
              f"(seeds {seeds})", flush=True)
    return out


def speedrun_steps(path: Path, labels: list) -> dict:
    """Steps to target from the speedrun's JSON, per label whose optimizer it measured."""
    if not path.exists():
        return {}
    summary = json.loads(path.read_text())
    results, budget = summary["results"], summary["meta"]["steps"]
    plain = {OPTIONS[label][0]: label for label in labels if OPTIONS[label][1] is None}
    return {label: speedrun_results.format_steps(results[name]["summary"], budget)
            for name, label in plain.items() if name in results}


def markdown(rows: list, meta: dict) -> str:
    """The results page: how it was measured, then one table row per option."""
    lines = [
        "# Memory options: state bytes, step time and loss side by side", "",
        f"Made by `python benchmarks/memory_options.py` on {meta['date']}, {meta['machine']} "
        f"(jax {meta['jax']}); load average {meta['load']} at the start, {meta['load_end']} "
        f"at the end; {meta['seconds']:.0f} s. Model: the speedrun's ({meta['n_params']:,} "
        f"parameters, `examples/speedrun.py`), its learning-rate multiplier and tuned rates "
        f"(APOLLO at rank {meta['apollo_rank']}).", "",
        "State: bytes of every array of the state over the parameters. Step time: median of "
        f"{meta['reps']} interleaved rounds, over AdamW float32's in the same process; the "
        f"median of {meta['processes']} fresh processes (range in brackets; ms from the "
        "first). *opt*: the optimizer step alone; *train*: loss, gradients and optimizer "
        "step. Final loss: validation loss after the full budget of "
        f"{meta['steps']} steps, mean ± sample standard deviation over seeds "
        f"{meta['seeds']}. Steps to target: from the speedrun's table (10 seeds, mean ± 95% "
        "interval), where the speedrun has the option.", "",
        "| option | lr | state bytes / param | x AdamW | opt step ms | opt x AdamW | "
        "train x AdamW | final val loss | steps to target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rng = lambda k: f"{r[k]:.2f} [{min(r[k + 's']):.2f}-{max(r[k + 's']):.2f}]"  # noqa
        lines.append(
            f"| {r['option']} | {r['lr']:g} | {r['state_bytes_per_param']:.3f} | "
            f"{r['state_vs_adamw']:.3f} | {r['opt_step_ms']:.2f} | {rng('opt_ratio')} | "
            f"{rng('train_ratio')} | {r['final_mean']:.4f} ± {r['final_sd']:.4f} | "
            f"{r.get('steps_to_target', '-')} |")
    return "\n".join(lines + ["", "![memory options](memory_options.png)", ""])


def plot(rows: list, path: Path) -> None:
    """Left: final loss against bytes per parameter; right: step time against bytes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (matplotlib.ticker below)

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    colors = plt.get_cmap("tab10")
    for i, r in enumerate(rows):
        x = r["state_bytes_per_param"]
        left.errorbar(x, r["final_mean"], yerr=r["final_sd"], fmt="o", capsize=3,
                      color=colors(i), label=r["option"])
        right.plot(x, r["opt_ratio"], "o", color=colors(i))
        right.plot(x, r["train_ratio"], "s", mfc="none", color=colors(i))
        for ax, y in ((left, r["final_mean"]), (right, r["opt_ratio"])):
            ax.annotate(r["option"], (x, y), textcoords="offset points", xytext=(4, 3),
                        fontsize=7)
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xticks([0.1, 0.2, 0.5, 1, 2, 4, 8])
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("optimizer state, bytes per parameter (log)")
    left.set_ylabel("final validation loss (mean ± sd over seeds)")
    left.set_title("speedrun model: loss after the full budget", fontsize=10)
    right.axhline(1.0, color="gray", ls=":", lw=1)
    right.set_ylabel("step time / AdamW float32's")
    right.set_title("step time (filled: optimizer step; open: training step)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--options", default=",".join(OPTIONS),
                        help="comma-separated subset of: " + ", ".join(OPTIONS))
    parser.add_argument("--seeds", default="0,1,2", help="the final-loss runs' seeds")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--processes", type=int, default=3,
                        help="fresh processes timing the steps (the ratios' median)")
    parser.add_argument("--tiny", action="store_true",
                        help="the speedrun's tiny model and budget, 3 rounds")
    parser.add_argument("--times-only", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> Optional[list]:
    args = parse_args(argv)
    labels = [x.strip() for x in args.options.split(",") if x.strip()]
    unknown = [x for x in labels if x not in OPTIONS]
    if unknown:
        raise ValueError(f"--options: unknown {unknown}; choose from {', '.join(OPTIONS)}.")
    if BASELINE not in labels:
        raise ValueError(f"--options must include {BASELINE!r}: the ratios are to it.")
    seeds = [int(s) for s in args.seeds.split(",")]
    cfg, reps = (speedrun.TINY, 3) if args.tiny else (speedrun.FULL, args.reps)
    functrain.linalg.set_lapack_threads(1)
    start, load = time.perf_counter(), speedrun.load_average()
    data = speedrun.load_data(cfg)
    vocab = len(data["vocab"])
    times = time_steps(labels, cfg, vocab, reps)
    if args.times_only:  # one of the fresh processes of --processes
        args.times_only.write_text(json.dumps(times))
        return None
    runs = [times]
    for _ in range(max(args.processes, 1) - 1):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "times.json"
            cmd = [sys.executable, __file__, "--times-only", str(path), "--options",
                   ",".join(labels), "--reps", str(args.reps)] + (["--tiny"] * args.tiny)
            subprocess.run(cmd, check=True, capture_output=True, timeout=900)
            runs.append(json.loads(path.read_text()))
    ratios = [ratios_of(t, labels) for t in runs]
    losses = final_losses(labels, cfg, data, seeds)
    shapes = jax.eval_shape(lambda: speedrun.init_params(jax.random.PRNGKey(0), cfg, vocab))
    n = sum(x.size for x in jax.tree_util.tree_leaves(shapes))
    steps = speedrun_steps(args.out / "speedrun.json", labels) if not args.tiny else {}
    base_bytes = speedrun.state_bytes(build(BASELINE, cfg, shapes), shapes)
    rows = []
    for label in labels:
        nbytes = speedrun.state_bytes(build(label, cfg, shapes), shapes)
        row = {"option": label, "optimizer": OPTIONS[label][0],
               "lr": speedrun.LEARNING_RATES[OPTIONS[label][0]], "state_bytes": nbytes,
               "state_bytes_per_param": nbytes / n, "state_vs_adamw": nbytes / base_bytes,
               "opt_step_ms": times[f"{label}|opt"], "train_step_ms": times[f"{label}|train"],
               "final_val_loss": losses[label], "final_mean": float(np.mean(losses[label])),
               "final_sd": float(np.std(losses[label], ddof=1)) if len(seeds) > 1 else 0.0}
        for kind in ("opt", "train"):
            row[f"{kind}_ratios"] = [r[label][kind] for r in ratios]
            row[f"{kind}_ratio"] = statistics.median(row[f"{kind}_ratios"])
        if label in steps:
            row["steps_to_target"] = steps[label]
        rows.append(row)
    meta = {"date": datetime.date.today().isoformat(), "jax": jax.__version__,
            "machine": f"{os.cpu_count()} CPU cores ({jax.devices()[0].platform})",
            "load": load, "load_end": speedrun.load_average(), "n_params": int(n),
            "steps": cfg.steps, "seeds": seeds, "reps": reps, "processes": len(runs),
            "apollo_rank": speedrun.APOLLO_RANK, "config": dataclasses.asdict(cfg),
            "seconds": time.perf_counter() - start}
    args.out.mkdir(parents=True, exist_ok=True)
    text = markdown(rows, meta)
    (args.out / "memory_options.md").write_text(text)
    (args.out / "memory_options.json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                             indent=1))
    plot(rows, args.out / "memory_options.png")
    print(text)
    return rows


if __name__ == "__main__":
    main()
    sys.exit(0)
