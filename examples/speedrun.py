"""Steps to a target, with error bars: sixteen rows on a small GPT, three on a larger one.

Run it with ``make speedrun`` (which sets up ``.venv`` first) or, in an environment
with ``functrain[demo]``, with ``python examples/speedrun.py [--model medium]``. The rules
(docs/speedrun.md states them in full) are the NanoGPT speedrun's optimization track, scaled to
two CPU cores: fixed data (the standard library's own source), model (a pre-norm GPT in plain
JAX, examples/speedrun_model.py: ``FULL``, the small model, or ``MEDIUM``), batch, step budget
and learning-rate multiplier (``lr_multiplier``); each optimizer's learning rate tuned on its
grid by ``--tune``, a separate, longer mode, on seeds that are not the measured ones
(``TUNE_GRID``, ``TUNE_SEEDS``; the chosen rates are ``LEARNING_RATES``, the sweep
``TUNE_RESULTS`` of ``TUNED_ON``; ``MEDIUM_*`` for the second model); every other argument the
optimizer's default, the Muon family's AdamW part at AdamW's rate; the record recipe is
examples/speedrun_recipe.py's. The score of a run is the first step whose validation loss is at
or below the target (``TARGET_LOSS``, ``MEDIUM_TARGET_LOSS``), exact to the step; a run that
never gets there in the budget is censored. Runs go on to the budget either way, for the
optimization track's statistics (examples/speedrun_track.py). Each of ``--seeds`` seeds
(default 10: 0 to 9) draws the initialization and the batch order; every optimizer sees the
same ones.

It prints and writes (``--out``, default ``benchmarks/results/``) the table of, per
optimizer, the tuned rate, the mean steps to target with a 95% t-interval, the censored runs
and Welch's p-values against AdamW and Muon (examples/speedrun_results.py), the track's
validity and pairwise tests, with ``speedrun.json`` and ``speedrun.png`` (``speedrun_medium.*``
for the second model); a full default run also rewrites its tables in docs/speedrun.md (and,
for the small model, the README's). ``--tiny`` is the test suite's size. The runs are
deterministic given the seeds (on one machine and set of versions).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import functrain

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speedrun_recipe as recipe_lib  # noqa: E402
import speedrun_results as results_lib  # noqa: E402
import speedrun_track as track_lib  # noqa: E402
from speedrun_model import (FULL, MEDIUM, TINY, Config, batch_starts,  # noqa: E402,F401
                            init_params, load_data, loss_fn)

ROOT = Path(__file__).resolve().parent.parent

# The validation loss (nats per character) whose first crossing is counted, set after the
# sweep and before any measured run: tuned AdamW ended its tuning runs at 2.18, and the
# target leaves it a margin (docs/speedrun.md, "Learning rates and the target").
TARGET_LOSS = 2.25

# Peak learning rates from `python examples/speedrun.py --tune` on TUNED_ON: for each
# optimizer, the rate of its TUNE_GRID (extended by the sweep where the best was at an
# edge) with the lowest mean final validation loss over TUNE_SEEDS at the full budget.
LEARNING_RATES = {
    "adamw": 0.002,
    "muon": 0.032,
    "muon_polar_express": 0.016,
    "muon_gram": 0.032,
    "normuon": 0.032,
    "adamuon": 0.008,
    "dion": 0.016,
    "splus": 0.2,
    "soap": 0.016,
    "kron": 0.004,
    "adam_mini": 0.002,
    "apollo": 0.016,
    "apollo_mini": 0.002,
    "adamw_8bit": 0.002,
    "adamw_4bit": 0.002,
    "record_recipe": 0.04,
}
# The grid --tune starts from (a factor 2 between neighbours); where the best rate is at
# an edge, the sweep adds the next rate beyond it (twice at most).
TUNE_GRID = {
    "adamw": (2e-3, 4e-3, 8e-3, 1.6e-2),
    "muon": (0.016, 0.032, 0.064, 0.128),
    "muon_polar_express": (0.016, 0.032, 0.064, 0.128),
    "muon_gram": (0.016, 0.032, 0.064, 0.128),
    "normuon": (0.016, 0.032, 0.064, 0.128),
    "adamuon": (2e-3, 4e-3, 8e-3, 1.6e-2),
    "dion": (0.016, 0.032, 0.064, 0.128),
    "splus": (0.05, 0.1, 0.2, 0.4),
    "soap": (4e-3, 8e-3, 1.6e-2, 3.2e-2),
    "kron": (2e-3, 4e-3, 8e-3, 1.6e-2),
    "adam_mini": (1e-3, 2e-3, 4e-3, 8e-3),
    "apollo": (2e-3, 4e-3, 8e-3, 1.6e-2),
    "apollo_mini": (2e-3, 4e-3, 8e-3, 1.6e-2),
    "adamw_8bit": (1e-3, 2e-3, 4e-3, 8e-3),
    "adamw_4bit": (1e-3, 2e-3, 4e-3, 8e-3),
    "record_recipe": (0.01, 0.02, 0.04, 0.08),
}
TUNE_SEEDS = (1000, 1001)
# 16 minutes on the shared 2-core machine (load average 5-7); the last five (adam_mini to
# adamw_4bit) the same day, 16 minutes on their own (load average 8-14).
TUNED_ON = "2026-11-26 (the record recipe: 2026-11-29, 2 minutes)"
# The sweep behind LEARNING_RATES: mean final validation loss over TUNE_SEEDS, per rate
# (Python 3.11.7's stdlib, jax 0.10.2 on CPU; also benchmarks/results/speedrun_tune.json).
TUNE_RESULTS: dict = {
    "adamw": {0.001: 2.2378, 0.002: 2.1812, 0.004: 2.2608, 0.008: 2.432, 0.016: 2.4776},
    "muon": {0.016: 1.8987, 0.032: 1.8969, 0.064: 2.1366, 0.128: 2.3056},
    "muon_polar_express": {0.008: 1.9696, 0.016: 1.8957, 0.032: 1.9165, 0.064: 2.1916,
                           0.128: 2.3419},
    "muon_gram": {0.016: 1.8987, 0.032: 1.8969, 0.064: 2.1247, 0.128: 2.2933},
    "normuon": {0.016: 1.9074, 0.032: 1.8853, 0.064: 2.1074, 0.128: 2.2868},
    "adamuon": {0.002: 2.237, 0.004: 2.1746, 0.008: 2.1396, 0.016: 2.1667},
    "dion": {0.008: 2.0185, 0.016: 1.9585, 0.032: 1.9743, 0.064: 2.2059, 0.128: 2.3434},
    "splus": {0.05: 2.3539, 0.1: 2.2158, 0.2: 2.1749, 0.4: 2.3244},
    "soap": {0.004: 2.0156, 0.008: 1.897, 0.016: 1.8241, 0.032: 1.8749},
    "kron": {0.002: 2.1018, 0.004: 2.0528, 0.008: 2.1825, 0.016: 2.34},
    "adam_mini": {0.001: 2.2595, 0.002: 2.2262, 0.004: 2.4169, 0.008: 2.5633},
    "apollo": {0.002: 2.4296, 0.004: 2.3062, 0.008: 2.2372, 0.016: 2.1662, 0.032: 2.1716},
    "apollo_mini": {0.001: 2.3752, 0.002: 2.306, 0.004: 2.3098, 0.008: 2.3466, 0.016: 2.3653},
    "adamw_8bit": {0.001: 2.2272, 0.002: 2.1442, 0.004: 2.5336, 0.008: 2.367},
    "adamw_4bit": {0.001: 2.2253, 0.002: 2.147, 0.004: 2.1692, 0.008: 2.3153},
    "record_recipe": {0.01: 2.0288, 0.02: 1.9191, 0.04: 1.8469, 0.08: 1.9182},
}
OPTIMIZERS = tuple(LEARNING_RATES)

# The second model (speedrun_model.MEDIUM, about 0.8M parameters) and its main rows: the
# reference optimizers and the record recipe, tuned and targeted the same way.
MEDIUM_LEARNING_RATES = {"adamw": 0.001, "muon": 0.032, "record_recipe": 0.04}
MEDIUM_TUNE_GRID = {"adamw": (1e-3, 2e-3, 4e-3, 8e-3), "muon": (0.008, 0.016, 0.032, 0.064),
                    "record_recipe": (0.01, 0.02, 0.04, 0.08)}
# `--model medium --tune`: 37 minutes beside other runs (load average 3-5), 2026-11-29.
MEDIUM_TUNE_RESULTS = {
    "adamw": {0.0005: 2.2972, 0.001: 2.245, 0.002: 2.3085, 0.004: 2.5784, 0.008: 2.6918},
    "muon": {0.008: 2.0361, 0.016: 1.9132, 0.032: 1.8936, 0.064: 2.1423},
    "record_recipe": {0.01: 2.0407, 0.02: 1.9029, 0.04: 1.8289, 0.08: 1.9168},
}
# Set by target_from_sweep from tuned AdamW's 2.245, after the sweep, before any measured run.
MEDIUM_TARGET_LOSS = 2.3
MEDIUM_TUNED_ON = "2026-11-29"


def target_from_sweep(adamw_final: float) -> float:
    """The target rule: the first multiple of 0.05 at least 0.05 above ``adamw_final``.

    ``adamw_final`` is tuned AdamW's mean final validation loss on the tuning seeds; the
    first model's 2.1812 gives its 2.25.

    >>> target_from_sweep(2.1812)
    2.25
    """
    return round(math.ceil(round((adamw_final + 0.05) / 0.05, 9)) * 0.05, 2)


# APOLLO's rank: the largest whose state is at most 0.1x AdamW's on the FULL model
# (tests/test_speedrun.py checks it from the shapes). Every 2-D leaf is projected (APOLLO's
# default): its 15 matrices keep 2 r max(m, n) float32 numbers each, 14,336 r bytes in all;
# the five gains (320 numbers) AdamW's 8 bytes each; the counts and the limiter's norms 84
# bytes. Rank 6: 88,660 bytes, 0.096x AdamW's 920,068 (rank 7: 0.112x; the optimizers
# alone: the learning-rate multiplier adds a 4-byte count to both). The default rank,
# 256, is capped at each matrix's smaller side (64): a full-rank projection, as large as
# AdamW's state.
APOLLO_RANK = 6
# Where each optimizer lives in functrain (checked before anything is trained).
LOCATION = {"adamw": "functrain.adamw", "muon": "functrain.contrib.muon",
            "muon_polar_express": "functrain.contrib.muon",
            "muon_gram": "functrain.contrib.muon", "normuon": "functrain.contrib.normuon",
            "adamuon": "functrain.contrib.adamuon", "dion": "functrain.contrib.dion",
            "splus": "functrain.contrib.splus", "soap": "functrain.contrib.soap",
            "kron": "functrain.contrib.kron", "adam_mini": "functrain.contrib.adam_mini",
            "apollo": "functrain.contrib.apollo", "apollo_mini": "functrain.contrib.apollo_mini",
            "adamw_8bit": "functrain.adamw_8bit", "adamw_4bit": "functrain.adamw_4bit",
            "record_recipe": "functrain.contrib.scale_by_radius_pin"}
# Muon's arguments for its Newton-Schulz variants.
MUON_VARIANTS = {"muon": {}, "muon_polar_express": {"ns_coeffs": "polar_express"},
                 "muon_gram": {"ns_method": "gram"}}
COLORS = {"adamw": "tab:blue", "muon": "tab:red", "muon_polar_express": "salmon",
          "muon_gram": "darkred", "normuon": "tab:orange", "adamuon": "gold",
          "dion": "tab:pink", "splus": "tab:cyan", "soap": "tab:green", "kron": "tab:brown",
          "adam_mini": "tab:purple", "apollo": "tab:olive", "apollo_mini": "yellowgreen",
          "adamw_8bit": "steelblue", "adamw_4bit": "lightsteelblue",
          "record_recipe": "darkgreen"}


@dataclasses.dataclass(frozen=True)
class Setup:
    """One speedrun: a model with its target, tuned rates, grid and sweep (``--model``)."""

    model: Config
    target: float
    rates: dict
    grid: dict
    sweep: dict
    tuned_on: str
    stem: str  # the results' file names: ``stem``.json, .md, .png


SETUPS = {
    "small": Setup(FULL, TARGET_LOSS, LEARNING_RATES, TUNE_GRID, TUNE_RESULTS, TUNED_ON,
                   "speedrun"),
    "medium": Setup(MEDIUM, MEDIUM_TARGET_LOSS, MEDIUM_LEARNING_RATES, MEDIUM_TUNE_GRID,
                    MEDIUM_TUNE_RESULTS, MEDIUM_TUNED_ON, "speedrun_medium"),
}


SEEDS = 10


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


def check_available(names: Sequence[str]) -> None:
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


def adam_mini_blocks(params: dict, n_head: int) -> dict:
    """Adam-mini's partition of the model: the official rule, read through this model's names.

    ``functrain.contrib.adam_mini_blocks`` matches the official code's names; here the MLP
    weights are ``w_in`` / ``w_out`` and the output layer ``head``, which it does not know,
    so they get the official rule for MLP and output weights by hand: one block per output
    neuron (per token for the head). The rest is the default: one block per head of
    ``wq`` / ``wk``, per output neuron of ``wv`` / ``wo``, per token (row) of the two
    embeddings, one per gain.
    """
    grids = functrain.contrib.adam_mini_blocks(params, n_heads=n_head)
    per_column = lambda w: (1, np.shape(w)[-1])  # noqa: E731
    grids["head"] = per_column(params["head"])
    for block, grid in zip(params["blocks"], grids["blocks"]):
        grid["w_in"], grid["w_out"] = per_column(block["w_in"]), per_column(block["w_out"])
    return grids


def make_optimizer(name: str, lr: float, steps: int, adamw_lr: float, params: dict,
                   n_head: int = FULL.n_head, with_eval: bool = False):
    """The optimizer ``name`` at peak learning rate ``lr``; its defaults otherwise.

    The Muon family's AdamW part (embeddings, head, gains) runs at ``adamw_lr``. APOLLO
    runs at rank ``APOLLO_RANK``; Adam-mini's partition is :func:`adam_mini_blocks` with
    ``n_head`` heads; ``record_recipe`` is examples/speedrun_recipe.py's. With
    ``with_eval``, ``(optimizer, eval_params)``: ``eval_params(state, params)`` gives the
    weights to evaluate (the params themselves but for the recipe's read-out).
    """
    contrib, dims = functrain.contrib, muon_dims(params)
    if name == "record_recipe":
        opt, read_out = recipe_lib.record_recipe(lr, adamw_lr, lr_multiplier(steps), steps, dims)
        return (opt, read_out) if with_eval else opt
    if name in ("adamw", "adamw_8bit", "adamw_4bit"):
        base = getattr(functrain, name)(lr)
    elif name in MUON_VARIANTS:
        base = contrib.muon(lr, adam_learning_rate=adamw_lr, muon_weight_dimension_numbers=dims,
                            **MUON_VARIANTS[name])
    elif name in ("normuon", "adamuon"):
        base = getattr(contrib, name)(lr, adam_learning_rate=adamw_lr,
                                      muon_weight_dimension_numbers=dims)
    elif name == "dion":
        mask = jax.tree.map(lambda d: d is not None, dims, is_leaf=lambda d: d is None or
                            isinstance(d, contrib.MuonDimensionNumbers))
        base = contrib.dion(lr, scalar_learning_rate=adamw_lr, dion_mask=mask)
    elif name == "adam_mini":
        base = contrib.adam_mini(lr, blocks=lambda p: adam_mini_blocks(p, n_head))
    elif name == "apollo":
        base = contrib.apollo(lr, rank=APOLLO_RANK)
    else:
        base = getattr(contrib, name)(lr)
    # The updates are proportional to the learning rate (weight decay included), so a
    # multiplier after the optimizer is the same as a scheduled learning rate.
    opt = functrain.chain(base, functrain.scale_by_schedule(lr_multiplier(steps)))
    return (opt, lambda state, params: params) if with_eval else opt


def state_bytes(opt, params: dict) -> int:
    """Bytes of every array of ``opt``'s state for ``params``, from shapes (``jax.eval_shape``).

    Codes, scales, counts and the small leaves that stay float32 all count.
    """
    state = jax.eval_shape(opt.init, params)
    return int(sum(x.size * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(state)))


# ----------------------------------------------------------------------------- training
def train_seeds(name: str, lr: float, data: dict, cfg: Config, steps: int, adamw_lr: float,
                seeds: Sequence[int], target: Optional[float] = None, quiet: bool = False,
                make: Optional[Callable] = None, stop_at_target: bool = True) -> list:
    """Train ``name`` once per seed (one compilation for all); one dict per run.

    The validation loss is evaluated at step 0, every ``cfg.eval_every`` steps and at the
    end. With a ``target``, the first evaluation at or below it has the steps since the
    previous evaluation evaluated one by one (their parameters were kept), so
    ``steps_to_target`` is exact to the step; with ``stop_at_target`` the run stops there,
    otherwise it goes on to the budget (the optimization track's way: no decision depends on
    a run's own validation loss). A non-finite training loss stops the run with a NaN
    validation loss (diverged: never reaches the target).

    ``make`` builds the optimizer from ``(name, lr, steps, adamw_lr, params)`` (default
    ``make_optimizer``; benchmarks/quantized_accuracy.py passes its own).
    """
    n_head, vocab = cfg.n_head, len(data["vocab"])
    shapes = init_params(jax.random.PRNGKey(0), cfg, vocab)
    if make:
        opt, read_out = make(name, lr, steps, adamw_lr, shapes), (lambda state, params: params)
    else:
        opt, read_out = make_optimizer(name, lr, steps, adamw_lr, shapes, n_head, with_eval=True)
    val = jnp.asarray(data["val"])

    def step(params, state, window):
        loss, grads = jax.value_and_grad(loss_fn)(params, window, n_head)
        updates, state = opt.update(grads, state, params)
        return functrain.apply_updates(params, updates), state, loss

    def evaluate(params, state):  # at the iterate, SPlus's too (docs/speedrun.md says why)
        return loss_fn(read_out(state, params), val, n_head)

    t0 = time.perf_counter()
    state0 = opt.init(shapes)
    window_spec = jax.ShapeDtypeStruct((cfg.batch, cfg.context + 1), jnp.int32)
    step_c = jax.jit(step).lower(shapes, state0, window_spec).compile()
    eval_c = jax.jit(evaluate).lower(shapes, state0).compile()
    compile_s = time.perf_counter() - t0

    runs = []
    for seed in seeds:
        params = init_params(jax.random.PRNGKey(seed), cfg, vocab)
        state = opt.init(params)
        windows = (batch_starts(cfg, len(data["train"]), steps, seed)[:, :, None]
                   + np.arange(cfg.context + 1))
        curve_steps, curve_loss = [0], [float(eval_c(params, state))]
        kept, train_s, start = [], 0.0, time.perf_counter()
        t, reached_at = time.perf_counter(), None
        for i in range(steps):
            params, state, loss = step_c(params, state, data["train"][windows[i]])
            if target is not None and reached_at is None:
                kept.append((i + 1, params, state))
            if (i + 1) % cfg.eval_every and i + 1 != steps:
                continue
            loss = float(loss)  # waits for the step: the time below is the real time
            train_s += time.perf_counter() - t
            if not math.isfinite(loss):
                curve_steps.append(i + 1)
                curve_loss.append(float("nan"))
                break
            val_loss = float(eval_c(params, state))
            if reached_at is None and target is not None and val_loss <= target:
                reached_at = i + 1  # which of the steps since the last evaluation was first?
                for s, p, st in kept[:-1]:
                    curve_steps.append(s)
                    curve_loss.append(float(eval_c(p, st)))
                    if curve_loss[-1] <= target:
                        break
            curve_steps.append(i + 1)
            curve_loss.append(val_loss)
            if not quiet:
                print(f"  {name:<19} lr {lr:<7g} seed {seed:<4} step {i + 1:>5}  "
                      f"train {loss:.3f}  val {val_loss:.3f}  {train_s:6.1f} s", flush=True)
            if reached_at is not None and stop_at_target:
                break
            kept, t = [], time.perf_counter()
        reached = (results_lib.steps_to_target(curve_steps, curve_loss, target)
                   if target is not None else None)
        runs.append({"seed": int(seed), "steps": curve_steps, "val_loss": curve_loss,
                     "steps_to_target": reached, "final_val_loss": curve_loss[-1],
                     "train_seconds": train_s, "seconds": time.perf_counter() - start})
    for run in runs:
        run["compile_seconds"] = compile_s
    return runs


def train(name: str, lr: float, data: dict, cfg: Config, steps: int, adamw_lr: float,
          quiet: bool = False, make: Optional[Callable] = None) -> dict:
    """One run of ``name`` to the full budget at seed ``cfg.seed`` (see ``train_seeds``)."""
    run = train_seeds(name, lr, data, cfg, steps, adamw_lr, [cfg.seed], None, quiet, make)[0]
    return {"lr": lr, "steps": run["steps"], "val_loss": run["val_loss"],
            "train_seconds": [run["train_seconds"]], "compile_seconds": run["compile_seconds"],
            "final_val_loss": run["final_val_loss"]}


def tune(names: Sequence[str], data: dict, cfg: Config, steps: int, seeds: Sequence[int],
         quiet: bool, setup: Setup = SETUPS["small"]) -> dict:
    """Mean final validation loss over ``seeds`` for each rate of ``setup.grid``; the best per
    optimizer. A best rate at the grid's edge adds the next rate beyond it (twice at most).
    The others' AdamW part runs at AdamW's rate: this sweep's when it tunes AdamW first.
    """
    sweep, adamw_lr = {}, setup.rates.get("adamw")
    for name in names:
        grid, finals = list(setup.grid[name]), {}
        for _ in range(3):
            for lr in grid:
                if lr in finals:
                    continue
                if adamw_lr is None and name != "adamw":
                    raise ValueError("tune: AdamW's rate is not known yet; tune adamw first.")
                runs = train_seeds(name, lr, data, cfg, steps, adamw_lr, seeds, quiet=True)
                losses = [r["final_val_loss"] for r in runs]
                finals[lr] = float(np.mean(losses)) if all(map(math.isfinite, losses)) \
                    else float("nan")
                print(f"tune {name:<19} lr {lr:<8g} mean final val {finals[lr]:.4f} "
                      f"({sum(r['seconds'] for r in runs):.0f} s)", flush=True)
            best = min(finals, key=lambda k: finals[k] if math.isfinite(finals[k]) else math.inf)
            edge = {grid[0]: grid[0] / 2, grid[-1]: grid[-1] * 2}.get(best)
            if edge is None:
                break
            grid = sorted(grid + [float(f"{edge:.3g}")])
        sweep[name] = {"best": best, "grid": {lr: finals[lr] for lr in sorted(finals)}}
        if name == "adamw":
            adamw_lr = best
        print(f"best {name}: lr {best:g} (mean final val {finals[best]:.4f})", flush=True)
    return sweep


# ----------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None,
                        help=f"the step budget (default {FULL.steps}, medium {MEDIUM.steps}; "
                             f"--tiny: {TINY.steps})")
    parser.add_argument("--seeds", type=int, default=SEEDS,
                        help=f"measured seeds 0, 1, ..., N-1 (default {SEEDS})")
    parser.add_argument("--model", choices=sorted(SETUPS), default="small",
                        help="the small model (FULL, fifteen optimizers and the recipe) or the "
                             "medium one (MEDIUM, the main rows)")
    parser.add_argument("--opts", default=None,
                        help="comma-separated subset of the model's optimizers (default: all "
                             "of them; the small model's: " + ", ".join(OPTIMIZERS) + ")")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results",
                        help="where speedrun.md, speedrun.png and speedrun.json go")
    parser.add_argument("--tiny", action="store_true",
                        help="a much smaller model and budget (the test suite's)")
    parser.add_argument("--tune", action="store_true",
                        help="sweep the model's grid on TUNE_SEEDS at the full budget; print the "
                             "best rates (writes speedrun_tune.json to --out)")
    parser.add_argument("--target", type=float, default=None,
                        help="the validation loss to reach (default: the model's)")
    parser.add_argument("--rewrite", action="store_true",
                        help="train nothing: recompute the statistics of the model's recorded "
                             "run (--out's speedrun[_medium].json) and rewrite its pages")
    parser.add_argument("--quiet", action="store_true")
    return parser.parse_args(argv)


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def measure(names, data, cfg, steps, seeds, target, quiet, rates=LEARNING_RATES) -> dict:
    """Every optimizer over every seed, to the budget: the runs, their summaries, the tests.

    Each result holds the steps-to-target summary with Welch's p-values against AdamW and
    Muon, the optimization track's statistics (``track``: examples/speedrun_track.py), and
    the optimizer's state bytes on the model (:func:`state_bytes`, the learning-rate
    multiplier's count included), per parameter and over AdamW's.
    """
    results = {}
    shapes = jax.eval_shape(lambda: init_params(jax.random.PRNGKey(0), cfg, len(data["vocab"])))
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(shapes))
    memory = lambda n, lr: state_bytes(  # noqa: E731
        make_optimizer(n, lr, steps, rates["adamw"], shapes, cfg.n_head), shapes)
    adamw_bytes = memory("adamw", rates["adamw"])
    for name in names:
        runs = train_seeds(name, rates[name], data, cfg, steps, rates["adamw"], seeds, target,
                           quiet, stop_at_target=False)
        nbytes = memory(name, rates[name])
        results[name] = {"lr": rates[name], "runs": runs,
                         "summary": results_lib.summarize([r["steps_to_target"] for r in runs],
                                                          steps),
                         "state_bytes": nbytes, "state_bytes_per_param": nbytes / n_params,
                         "state_vs_adamw": nbytes / adamw_bytes}
        s = results[name]["summary"]
        print(f"{name}: steps to {target} {results_lib.format_steps(s, steps)} "
              f"({s['censored']} of {s['n']} censored)", flush=True)
    for res in results.values():
        for ref in ("adamw", "muon"):
            res[f"p_vs_{ref}"] = (results_lib.compare(res["summary"], results[ref]["summary"])
                                  if ref in results and res is not results[ref] else None)
    track_lib.add_track_statistics(results, cfg.eval_every, steps, target)
    return results


def track_blocks(summary: dict) -> list:
    """The track's table and the recipe's verdict, for the pages (markdown blocks)."""
    verdict = track_lib.speedup_verdict(summary)
    return ["The optimization track's statistics (every run trained to the budget; "
            "examples/speedrun_track.py):", track_lib.track_table(summary),
            *([verdict] if verdict else [])]


def main(argv=None) -> dict:
    args = parse_args(argv)
    setup = SETUPS[args.model]
    names = [n.strip() for n in (args.opts or ",".join(setup.rates or setup.grid)).split(",")
             if n.strip()]
    check_available(names)
    cfg = TINY if args.tiny else setup.model
    steps = args.steps if args.steps is not None else cfg.steps
    target = args.target if args.target is not None else setup.target
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}.")
    if args.seeds < 2:
        raise ValueError(f"--seeds must be >= 2 (an interval needs two), got {args.seeds}.")
    missing = [n for n in names if n not in (setup.grid if args.tune else setup.rates)]
    if missing:
        raise ValueError(f"--model {args.model} has no {'grid' if args.tune else 'tuned rate'} "
                         f"for {', '.join(missing)}" + ("" if args.tune else
                                                        "; run --tune first") + ".")
    if args.rewrite:  # the recorded runs, their statistics recomputed; nothing is trained
        summary = json.loads((args.out / f"{setup.stem}.json").read_text())
        meta = summary["meta"]
        track_lib.add_track_statistics(summary["results"], meta["config"]["eval_every"],
                                       meta["steps"], meta["target"])
        return write_results(summary, args, setup)
    # One OpenBLAS thread for the CPU eigh/qr calls of SOAP, SPlus, Kron and Dion: its
    # busy-waiting pool otherwise competes with XLA's threads (functrain.linalg).
    functrain.linalg.set_lapack_threads(1)
    start, cpu_start, load = time.perf_counter(), time.process_time(), load_average()
    data = load_data(cfg)
    print(f"stdlib text: {len(data['train']):,} train / {len(data['val']) * cfg.context:,} "
          f"validation characters, vocabulary {len(data['vocab'])}; jax {jax.__version__} "
          f"on {jax.devices()[0].platform}; load average {load}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.tune:
        sweep = tune(names, data, cfg, steps, TUNE_SEEDS, args.quiet, setup)
        out = {"date": datetime.date.today().isoformat(), "seeds": list(TUNE_SEEDS),
               "steps": steps, "model": args.model, "sweep": {n: {"best": t["best"], "grid": {
                   f"{lr:g}": v for lr, v in t["grid"].items()}} for n, t in sweep.items()}}
        (args.out / f"{setup.stem}_tune.json").write_text(json.dumps(out, indent=2))
        print("LEARNING_RATES =", {n: t["best"] for n, t in sweep.items()})
        print("TUNE_RESULTS =", {n: {lr: round(v, 4) for lr, v in t["grid"].items()}
                                 for n, t in sweep.items()})
        return out
    if not math.isfinite(target):
        raise ValueError(f"--model {args.model} has no target yet; give --target.")

    seeds = list(range(args.seeds))
    results = measure(names, data, cfg, steps, seeds, target, args.quiet, setup.rates)
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(
        init_params(jax.random.PRNGKey(0), cfg, len(data["vocab"]))))
    meta = {"n_params": int(n_params), "steps": steps, "target": target, "seeds": seeds,
            "vocab": len(data["vocab"]), "python": platform.python_version(),
            "jax": jax.__version__, "load": load, "date": datetime.date.today().isoformat(),
            "machine": f"{os.cpu_count()} CPU cores", "config": dataclasses.asdict(cfg),
            "model": args.model, "tuned_on": setup.tuned_on, "tune_seeds": list(TUNE_SEEDS),
            "total_seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu_start}
    return write_results({"meta": meta, "results": results}, args, setup)


def write_results(summary: dict, args: argparse.Namespace, setup: Setup) -> dict:
    """Write a run's JSON, page and plot to ``args.out``; a full default run's tables into
    docs/speedrun.md (and, for the small model, the README). Returns ``summary``."""
    meta = summary["meta"]
    names, target = list(summary["results"]), meta["target"]
    blocks = track_blocks(summary)
    (args.out / f"{setup.stem}.json").write_text(json.dumps(summary, indent=1))
    (args.out / f"{setup.stem}.md").write_text(results_lib.results_page(summary, blocks,
                                                                        setup.stem))
    results_lib.plot(summary, args.out / f"{setup.stem}.png", COLORS)
    full_default = (not args.tiny and args.steps is None and names == list(setup.rates)
                    and args.seeds == SEEDS and target == setup.target
                    and args.out == ROOT / "benchmarks" / "results")
    if full_default:
        results_lib.write_docs(summary, ROOT, {
            n: {"grid": setup.sweep[n], "best": setup.rates[n]} for n in setup.rates},
            blocks, args.model, setup.stem)
    print("\n" + results_lib.results_table(summary) + "\n\n" + "\n\n".join(blocks))
    print(f"\nwrote {args.out / (setup.stem + '.json')}, .md, .png"
          f"{', docs/speedrun.md' if full_default else ''}"
          f"{' and the README' if full_default and args.model == 'small' else ''}; "
          f"{meta['total_seconds']:.0f} s of wall time, {meta['cpu_seconds']:.0f} s of CPU time")
    return summary


if __name__ == "__main__":
    main()
    sys.exit(0)
