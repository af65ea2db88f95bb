"""A small speedrun: one character-level transformer, six optimizers, same everything else.

Run it with ``make speedrun`` (which sets up ``.venv`` first) or, in an environment
with ``functrain[demo]``, with ``python examples/speedrun.py``.

In the spirit of the NanoGPT speedrun, scaled down to two CPU cores:

* the data ship with every Python: the standard library's own ``.py`` files (those
  directly under ``os.path.dirname(os.__file__)``, in sorted order), the first
  ``chars`` characters of their concatenation, the first 90% for training and the last
  10% for validation; the vocabulary is the sorted set of characters seen;
* the model is a small pre-norm GPT written here in plain JAX: token and position
  embeddings, ``n_layer`` blocks of causal multi-head attention and a GELU MLP, each
  behind an RMSNorm with a learned gain, a final norm and an untied output head;
* every optimizer starts from the same initial parameters and sees the same batches
  in the same order;
* optimizers: ``adamw``, ``muon`` (Muon for the blocks' matrices; AdamW for the
  embeddings, the output head and the gains, as the NanoGPT speedrun does), ``soap``,
  ``shampoo``, ``kron`` (PSGD Kron) and ``schedule_free_adamw`` (its validation loss is
  measured at ``functrain.contrib.schedule_free_eval_params``);
* all but schedule-free AdamW follow one learning-rate multiplier: a linear warmup over
  the first 5% of the steps, constant, then a linear decay to zero over the last 40%
  (the speedrun's "warmdown"); schedule-free AdamW gets the same warmup and no decay.

It reports, per optimizer, the steps and the training wall time (compilation and
evaluation excluded) to reach a validation loss of ``TARGET_LOSS`` nats per character,
the final validation loss, and writes ``speedrun.png`` (validation curves),
``speedrun.md`` (a markdown table) and ``speedrun.json`` to ``--out`` (default
``docs/``). ``--tune`` sweeps a few learning rates per optimizer on a shorter budget
and prints the best; ``--tiny`` is a much smaller configuration for the test suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

import functrain

ROOT = Path(__file__).resolve().parent.parent

# The validation loss (nats per character) whose first crossing is timed. Chosen after a
# full run so that most optimizers reach it within the default budget.
TARGET_LOSS = 1.9

# Peak learning rates, from `python examples/speedrun.py --tune` (sweep of TUNE_GRID,
# TUNE_FRACTION of the default steps, lowest final validation loss wins). The sweep's
# numbers are TUNE_RESULTS below (and docs/speedrun.md, "How the learning rates were
# chosen").
LEARNING_RATES = {
    "adamw": 3e-3,
    "muon": 4e-2,
    "soap": 1e-2,
    "shampoo": 6e-3,
    "kron": 6e-3,
    "schedule_free_adamw": 3e-3,
}
# The grid --tune sweeps, per optimizer (a factor of 2-3 between neighbours).
TUNE_GRID = {
    "adamw": (1e-3, 3e-3, 6e-3, 1e-2),
    "muon": (1e-2, 2e-2, 4e-2, 8e-2),
    "soap": (1e-3, 3e-3, 6e-3, 1e-2, 2e-2, 4e-2),
    "shampoo": (1e-3, 3e-3, 6e-3, 1e-2),
    "kron": (3e-4, 1e-3, 3e-3, 6e-3, 1e-2, 2e-2),
    "schedule_free_adamw": (1e-3, 3e-3, 6e-3, 1e-2),
}
TUNE_FRACTION = 0.5
# The sweep behind LEARNING_RATES: final validation loss after TUNE_FRACTION * 400 = 200
# steps (same data, init and schedule shape), per optimizer and learning rate (Python
# 3.11.7's stdlib, jax 0.10.2 on CPU). SOAP's and Kron's grids were widened after their
# first sweep picked the largest rate (then 1e-2 and 6e-3).
TUNE_RESULTS: dict = {
    "adamw": {1e-3: 2.3884, 3e-3: 2.3880, 6e-3: 2.5624, 1e-2: 2.7572},
    "muon": {1e-2: 2.1053, 2e-2: 1.9593, 4e-2: 1.9379, 8e-2: 2.1834},
    "soap": {1e-3: 3.1497, 3e-3: 2.2842, 6e-3: 2.1334, 1e-2: 2.0055, 2e-2: 2.0226,
             4e-2: 2.3829},
    "shampoo": {1e-3: 2.2888, 3e-3: 2.0721, 6e-3: 2.0503, 1e-2: 2.1249},
    "kron": {3e-4: 3.4697, 1e-3: 2.5779, 3e-3: 2.2790, 6e-3: 2.2517, 1e-2: 2.3021,
             2e-2: 2.4528},
    "schedule_free_adamw": {1e-3: 2.4511, 3e-3: 2.2588, 6e-3: 2.3430, 1e-2: 2.7028},
}
OPTIMIZERS = tuple(LEARNING_RATES)
# Where each optimizer lives in functrain (checked before anything is trained).
LOCATION = {"adamw": "functrain.adamw", "muon": "functrain.contrib.muon",
            "soap": "functrain.contrib.soap", "shampoo": "functrain.contrib.shampoo",
            "kron": "functrain.contrib.kron",
            "schedule_free_adamw": "functrain.contrib.schedule_free_adamw"}
COLORS = {"adamw": "tab:blue", "muon": "tab:red", "soap": "tab:green",
          "shampoo": "tab:purple", "kron": "tab:brown", "schedule_free_adamw": "tab:orange"}


@dataclasses.dataclass(frozen=True)
class Config:
    chars: int          # characters of standard-library source used (train + validation)
    n_layer: int
    d_model: int
    n_head: int
    context: int
    batch: int
    steps: int
    eval_every: int
    val_windows: int    # validation sequences (each `context` characters, fixed)
    seed: int = 0


FULL = Config(chars=1_000_000, n_layer=2, d_model=64, n_head=4, context=64, batch=32,
              steps=400, eval_every=20, val_windows=128)
TINY = Config(chars=60_000, n_layer=1, d_model=32, n_head=2, context=32, batch=8,
              steps=12, eval_every=4, val_windows=16)


# ----------------------------------------------------------------------------- data
def stdlib_text(n_chars: int) -> str:
    """The first ``n_chars`` characters of the standard library's top-level ``.py`` files."""
    lib = os.path.dirname(os.__file__)
    parts, total = [], 0
    for name in sorted(os.listdir(lib)):
        path = os.path.join(lib, name)
        if not name.endswith(".py") or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            parts.append(f.read())
        total += len(parts[-1])
        if total >= n_chars:
            break
    text = "".join(parts)[:n_chars]
    if len(text) < n_chars:
        raise RuntimeError(f"the standard library in {lib} has only {len(text)} characters of "
                           f".py source; {n_chars} are needed.")
    return text


def load_data(cfg: Config) -> dict:
    """Token arrays (train, validation), the vocabulary, and the fixed validation windows."""
    text = stdlib_text(cfg.chars)
    vocab = sorted(set(text))
    lookup = {c: i for i, c in enumerate(vocab)}
    tokens = np.fromiter((lookup[c] for c in text), np.int32, len(text))
    split = int(0.9 * len(tokens))
    train, val = tokens[:split], tokens[split:]
    starts = np.linspace(0, len(val) - cfg.context - 1, cfg.val_windows).astype(np.int64)
    val_x = np.stack([val[s:s + cfg.context + 1] for s in starts])
    return {"train": train, "val": val_x, "vocab": vocab}


def batch_starts(cfg: Config, n_train: int, steps: int) -> np.ndarray:
    """The start of every training window of every step: one fixed order for all runs."""
    rng = np.random.default_rng(cfg.seed)
    return rng.integers(0, n_train - cfg.context - 1, size=(steps, cfg.batch))


# ----------------------------------------------------------------------------- model
def init_params(key: jax.Array, cfg: Config, vocab_size: int) -> dict:
    """GPT-2-style init: N(0, 0.02); residual outputs scaled by 1/sqrt(2 n_layer)."""
    d = cfg.d_model
    keys = iter(jax.random.split(key, 3 + 6 * cfg.n_layer))
    normal = lambda shape, std=0.02: std * jax.random.normal(next(keys), shape)  # noqa: E731
    out_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    blocks = []
    for _ in range(cfg.n_layer):
        blocks.append({
            "attn_gain": jnp.ones(d), "wq": normal((d, d)), "wk": normal((d, d)),
            "wv": normal((d, d)), "wo": normal((d, d), out_std),
            "mlp_gain": jnp.ones(d), "w_in": normal((d, 4 * d)),
            "w_out": normal((4 * d, d), out_std)})
    return {"tok_emb": normal((vocab_size, d)), "pos_emb": normal((cfg.context, d)),
            "blocks": blocks, "final_gain": jnp.ones(d), "head": normal((d, vocab_size))}


def rms_norm(x: jax.Array, gain: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * gain


def attention(block: dict, x: jax.Array, n_head: int) -> jax.Array:
    b, t, d = x.shape
    heads = lambda w: (x @ w).reshape(b, t, n_head, d // n_head)  # noqa: E731
    q, k, v = heads(block["wq"]), heads(block["wk"]), heads(block["wv"])
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d // n_head)
    causal = jnp.tril(jnp.ones((t, t), bool))
    scores = jnp.where(causal, scores, -1e30)
    out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
    return out.reshape(b, t, d) @ block["wo"]


def forward(params: dict, tokens: jax.Array, n_head: int) -> jax.Array:
    """Logits (batch, time, vocab) of the next character at every position."""
    x = params["tok_emb"][tokens] + params["pos_emb"][: tokens.shape[1]]
    for block in params["blocks"]:
        x = x + attention(block, rms_norm(x, block["attn_gain"]), n_head)
        h = jax.nn.gelu(rms_norm(x, block["mlp_gain"]) @ block["w_in"])
        x = x + h @ block["w_out"]
    return rms_norm(x, params["final_gain"]) @ params["head"]


def loss_fn(params: dict, window: jax.Array, n_head: int) -> jax.Array:
    """Mean next-character cross-entropy (nats) over windows of ``context + 1`` tokens."""
    logits = forward(params, window[:, :-1], n_head)
    logp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(logp, window[:, 1:, None], axis=-1).mean()


# ----------------------------------------------------------------------------- optimizers
def muon_dims(params: dict) -> dict:
    """Muon's dimension numbers: the blocks' matrices; None (AdamW) for the rest.

    The embeddings and the output head are 2-D too, but go to AdamW, as in the NanoGPT
    speedrun; so do the (1-D) gains.
    """
    matrix = functrain.contrib.MuonDimensionNumbers(0, 1)
    dims = {k: None for k in params if k != "blocks"}
    dims["blocks"] = [{k: (matrix if np.ndim(v) == 2 else None) for k, v in block.items()}
                      for block in params["blocks"]]
    return dims


def check_available(names) -> None:
    """A clear error, before anything is trained, for unknown or missing optimizers."""
    for name in names:
        if name not in LOCATION:
            raise ValueError(f"unknown optimizer {name!r}; choose from {', '.join(OPTIMIZERS)}.")
        module, attr = LOCATION[name].rsplit(".", 1)
        owner = functrain if module == "functrain" else functrain.contrib
        if not hasattr(owner, attr):
            raise ValueError(f"optimizer {name!r} needs {LOCATION[name]}, which this "
                             f"functrain does not have (yet); leave it out with --opts.")


def lr_multiplier(steps: int) -> Callable:
    """Linear warmup over the first 5% of the steps, constant, linear decay over the last 40%."""
    warmup = max(1, int(0.05 * steps))
    decay_start = int(0.6 * steps)

    def multiplier(count: jax.Array) -> jax.Array:
        t = count.astype(jnp.float32)
        up = jnp.minimum(1.0, (t + 1) / warmup)
        down = jnp.clip((steps - t) / max(1, steps - decay_start), 0.0, 1.0)
        return up * down
    return multiplier


def make_optimizer(name: str, lr: float, steps: int, adamw_lr: float, params: dict):
    """The optimizer ``name`` at peak learning rate ``lr``; its defaults otherwise."""
    if name == "schedule_free_adamw":
        return functrain.schedule_free_adamw(lr, warmup_steps=max(1, int(0.05 * steps)))
    if name == "adamw":
        base = functrain.adamw(lr)
    elif name == "muon":
        # adam_learning_rate: the embeddings, head and gains at AdamW's tuned rate.
        base = functrain.contrib.muon(lr, adam_learning_rate=adamw_lr,
                                      muon_weight_dimension_numbers=muon_dims(params))
    else:
        base = getattr(functrain.contrib, name)(lr)
    # The updates are proportional to the learning rate (weight decay included), so a
    # multiplier after the optimizer is the same as a scheduled learning rate.
    return functrain.chain(base, functrain.scale_by_schedule(lr_multiplier(steps)))


# ----------------------------------------------------------------------------- training
def train(name: str, lr: float, data: dict, cfg: Config, steps: int, adamw_lr: float,
          quiet: bool = False, make: Optional[Callable] = None) -> dict:
    """Train one optimizer; validation loss every ``cfg.eval_every`` steps and at the end.

    ``make`` builds the optimizer from ``(name, lr, steps, adamw_lr, params)`` (default
    ``make_optimizer``; benchmarks/quantized_accuracy.py passes its own).
    """
    n_head = cfg.n_head
    params = init_params(jax.random.PRNGKey(cfg.seed), cfg, len(data["vocab"]))
    opt = (make or make_optimizer)(name, lr, steps, adamw_lr, params)
    state = opt.init(params)  # distinct buffers (tested), so the step can donate it
    val = jnp.asarray(data["val"])
    windows = batch_starts(cfg, len(data["train"]), steps)[:, :, None] + np.arange(cfg.context + 1)

    def step(params, state, window):
        loss, grads = jax.value_and_grad(loss_fn)(params, window, n_head)
        updates, state = opt.update(grads, state, params)
        return functrain.apply_updates(params, updates), state, loss

    def evaluate(params, state):
        if name == "schedule_free_adamw":
            params = functrain.contrib.schedule_free_eval_params(state, params)
        return loss_fn(params, val, n_head)

    t0 = time.perf_counter()
    window_spec = jax.ShapeDtypeStruct((cfg.batch, cfg.context + 1), jnp.int32)
    step_c = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, window_spec).compile()
    eval_c = jax.jit(evaluate).lower(params, state).compile()
    compile_s = time.perf_counter() - t0

    curve_steps, curve_loss, curve_time = [0], [float(eval_c(params, state))], [0.0]
    train_s = 0.0
    for i in range(steps):
        t = time.perf_counter()
        params, state, loss = step_c(params, state, data["train"][windows[i]])
        if (i + 1) % cfg.eval_every == 0 or i + 1 == steps:
            loss = float(loss)  # waits for the step: the time below is the real time
            train_s += time.perf_counter() - t
            curve_steps.append(i + 1)
            curve_time.append(train_s)
            if not math.isfinite(loss):  # diverged: recorded as nan, the run stops here
                curve_loss.append(float("nan"))
                break
            curve_loss.append(float(eval_c(params, state)))
            if not quiet:
                print(f"  {name:<20} lr {lr:<8g} step {i + 1:>5}  train {loss:.3f}  "
                      f"val {curve_loss[-1]:.3f}  {train_s:6.1f} s", flush=True)
        else:
            train_s += time.perf_counter() - t
    return {"lr": lr, "steps": curve_steps, "val_loss": curve_loss, "train_seconds": curve_time,
            "compile_seconds": compile_s, "final_val_loss": curve_loss[-1]}


def time_to_target(res: dict, target: float) -> tuple[Optional[int], Optional[float]]:
    """The first evaluated step whose validation loss is <= target, and its training time."""
    for s, loss, t in zip(res["steps"], res["val_loss"], res["train_seconds"]):
        if loss <= target:
            return s, t
    return None, None


# ----------------------------------------------------------------------------- outputs
def plot(results: dict, target: float, cfg: Config, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name, res in results.items():
        ax.plot(res["steps"], res["val_loss"], lw=2, color=COLORS.get(name),
                label=f"{name} (lr {res['lr']:g}): {res['final_val_loss']:.3f}")
    ax.axhline(target, color="gray", ls="--", lw=1, label=f"target {target}")
    finals = [r["final_val_loss"] for r in results.values() if math.isfinite(r["final_val_loss"])]
    if finals:
        ax.set_ylim(min(finals) - 0.1, max(r["val_loss"][0] for r in results.values()) + 0.1)
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats / character)")
    ax.set_title(f"char-level GPT on Python's stdlib source: {cfg.n_layer} layers, "
                 f"d {cfg.d_model}, context {cfg.context}, batch {cfg.batch}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(results: dict, target: float, cfg: Config, meta: dict) -> str:
    lines = [
        "# Speedrun: a small character-level transformer, six optimizers",
        "",
        "Made by `make speedrun` ([examples/speedrun.py](../examples/speedrun.py)): a "
        f"{cfg.n_layer}-layer pre-norm GPT (d_model {cfg.d_model}, {cfg.n_head} heads, "
        f"context {cfg.context}, {meta['n_params']:,} parameters) trained for {meta['steps']} "
        f"steps of {cfg.batch} windows on the first {cfg.chars:,} characters of the Python "
        f"{meta['python']} standard library's source (90% train / 10% validation, "
        f"{meta['vocab']} characters). Same initialization and batches for every optimizer; "
        "peak learning rates tuned by `--tune`; every optimizer but schedule-free AdamW "
        "follows the same warmup / constant / linear-decay multiplier.",
        "",
        f"Target: validation loss <= {target} nats per character. Time: training steps only "
        "(compilation and evaluations excluded), on "
        f"{meta['machine']}; load average at the start {meta['load']}. The whole run (data, "
        f"compilation, training and evaluation of the {len(results)} optimizers) took "
        f"{meta['total_seconds']:.0f} s of wall time.",
        "",
        "| optimizer | peak lr | steps to target | seconds to target | final val loss "
        "| train s (all steps) | compile s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, res in results.items():
        s, t = time_to_target(res, target)
        lines.append(
            f"| {name} | {res['lr']:g} | {s if s is not None else 'not reached'} | "
            f"{f'{t:.1f}' if t is not None else '-'} | {res['final_val_loss']:.3f} | "
            f"{res['train_seconds'][-1]:.1f} | {res['compile_seconds']:.1f} |")
    lines += ["", "![validation curves](speedrun.png)", ""]
    if TUNE_RESULTS and cfg == FULL:  # the sweep was run at the full size
        grid = sorted({lr for finals in TUNE_RESULTS.values() for lr in finals})
        lines += [
            "## How the learning rates were chosen",
            "",
            "`python examples/speedrun.py --tune`: each optimizer at each learning rate of "
            f"its grid for {int(TUNE_FRACTION * FULL.steps)} steps (the same schedule "
            "shape, data and initialization); the lowest final validation loss wins (bold). "
            "Muon's AdamW part (embeddings, head, gains) uses AdamW's chosen rate.",
            "",
            "| optimizer | " + " | ".join(f"{lr:g}" for lr in grid) + " |",
            "|---|" + "---:|" * len(grid),
        ]
        for name, finals in TUNE_RESULTS.items():
            best = min(finals, key=finals.get)
            cells = [("-" if lr not in finals else f"**{finals[lr]:.3f}**" if lr == best
                      else f"{finals[lr]:.3f}") for lr in grid]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


# ----------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None,
                        help=f"training steps per optimizer (default {FULL.steps}; "
                             f"--tiny: {TINY.steps})")
    parser.add_argument("--opts", default=",".join(OPTIMIZERS),
                        help="comma-separated subset of " + ", ".join(OPTIMIZERS))
    parser.add_argument("--out", type=Path, default=ROOT / "docs",
                        help="where speedrun.png, speedrun.md and speedrun.json go")
    parser.add_argument("--tiny", action="store_true",
                        help="a much smaller model and budget (the test suite's)")
    parser.add_argument("--tune", action="store_true",
                        help="sweep TUNE_GRID's learning rates on a shorter budget; print "
                             "the best per optimizer (writes speedrun_tune.json to --out)")
    parser.add_argument("--target", type=float, default=TARGET_LOSS,
                        help="the validation loss that is timed")
    parser.add_argument("--quiet", action="store_true")
    return parser.parse_args(argv)


def tune(names, data, cfg: Config, steps: int, out: Path, quiet: bool) -> dict:
    """Final validation loss for every learning rate of TUNE_GRID; prints the best."""
    budget = max(2, int(TUNE_FRACTION * steps))
    sweep = {}
    for name in names:
        adamw_lr = sweep.get("adamw", {}).get("best", LEARNING_RATES["adamw"])
        finals = {}
        for lr in TUNE_GRID[name]:
            res = train(name, lr, data, cfg, budget, adamw_lr, quiet=True)
            finals[lr] = res["final_val_loss"]
            if not quiet:
                print(f"tune {name:<20} lr {lr:<8g} val {finals[lr]:.4f} "
                      f"({res['train_seconds'][-1]:.1f} s)", flush=True)
        best = min(finals, key=lambda k: finals[k] if math.isfinite(finals[k]) else math.inf)
        sweep[name] = {"best": best, "final_val_loss": {f"{k:g}": v for k, v in finals.items()},
                       "steps": budget}
        print(f"best {name}: lr {best:g} (val {finals[best]:.4f} after {budget} steps)",
              flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "speedrun_tune.json").write_text(json.dumps(sweep, indent=2))
    return sweep


def main(argv=None) -> dict:
    args = parse_args(argv)
    names = [n.strip() for n in args.opts.split(",") if n.strip()]
    check_available(names)
    cfg = TINY if args.tiny else FULL
    steps = args.steps if args.steps is not None else cfg.steps
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}.")
    start = time.perf_counter()
    load = load_average()
    data = load_data(cfg)
    print(f"stdlib text: {len(data['train']):,} train / {len(data['val']) * cfg.context:,} "
          f"validation characters, vocabulary {len(data['vocab'])}; jax {jax.__version__} "
          f"on {jax.devices()[0].platform}; load average {load}", flush=True)
    if args.tune:
        return tune(names, data, cfg, steps, args.out, args.quiet)

    results = {}
    for name in names:
        results[name] = train(name, LEARNING_RATES[name], data, cfg, steps,
                              LEARNING_RATES["adamw"], quiet=args.quiet)
    elapsed = time.perf_counter() - start

    n_params = sum(x.size for x in jax.tree_util.tree_leaves(
        init_params(jax.random.PRNGKey(0), cfg, len(data["vocab"]))))
    meta = {"n_params": int(n_params), "steps": steps, "vocab": len(data["vocab"]),
            "python": platform.python_version(), "load": load,
            "machine": f"{os.cpu_count()} CPU cores ({jax.devices()[0].platform})",
            "total_seconds": elapsed, "config": dataclasses.asdict(cfg), "target": args.target}
    args.out.mkdir(parents=True, exist_ok=True)
    plot(results, args.target, cfg, args.out / "speedrun.png")
    (args.out / "speedrun.md").write_text(markdown(results, args.target, cfg, meta))
    summary = {"meta": meta, "results": {}}
    print()
    print(f"{'optimizer':<22}{'lr':>8}{'steps to ' + str(args.target):>16}{'seconds':>9}"
          f"{'final val':>11}")
    for name, res in results.items():
        s, t = time_to_target(res, args.target)
        summary["results"][name] = {**res, "steps_to_target": s, "seconds_to_target": t}
        print(f"{name:<22}{res['lr']:>8g}{s if s is not None else 'not reached':>16}"
              f"{f'{t:.1f}' if t is not None else '-':>9}{res['final_val_loss']:>11.4f}")
    (args.out / "speedrun.json").write_text(json.dumps(summary, indent=2))
    print(f"wrote {args.out / 'speedrun.md'}, speedrun.png, speedrun.json; total wall time "
          f"{elapsed:.1f} s")
    return summary


if __name__ == "__main__":
    main()
    sys.exit(0)
