#!/usr/bin/env python
"""functrain vs optax: step time, compile time, peak memory and the bandwidth floor.

For each optimizer (adam, adamw, lamb, lars, sgd-momentum) and each pytree
(one big leaf, 100 leaves, 1000 leaves, a transformer-shaped tree) at a few
total sizes, both libraries run the *same* jitted step::

    updates, state = opt.update(grads, state, params)
    params = apply_updates(params, updates)

with ``donate_argnums`` on params and state, on the same inputs, in one
process. Step calls are interleaved (functrain, optax, optax, functrain, ...)
so both share the machine's drift; the claim is the *ratio* of medians, not
the absolute times. Compile time is ``lower`` (trace + lower to HLO) plus
``compile`` (XLA), measured once per library and case, alternating which
library goes first. Peak memory comes from the compiled step's
``memory_analysis()``.

The floor: in the same run, for every total size, a jitted and donated
elementwise kernel that reads four arrays and writes three (the traffic of an
Adam step, with trivial arithmetic) measures the machine's streaming
bandwidth; each optimizer's step is then reported as ``floor / step``, where
``floor = bytes the optimizer must move / bandwidth`` (1.0 = at the limit).

Usage::

    python benchmarks/run.py                      # the full run (~10 min on 2 cores)
    python benchmarks/run.py --quick              # a minute or so
    python benchmarks/run.py --cases 1@4M,1000@4M --opts adam,lamb --reps 5
    python benchmarks/run.py --sizes 1M,4M --trees 1,100   # every tree at every size

Writes ``results/latest.json``, ``results/latest.md`` and ``results/latest.png``
(``--out`` changes the folder) and prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without installing

import functrain  # noqa: E402
import optax  # noqa: E402

SCHEMA = "functrain-bench/1"
FLOOR = "_bandwidth_probe"

# --------------------------------------------------------------------------
# Optimizers: the same hyperparameters in both libraries
# --------------------------------------------------------------------------

LR, WD = 1e-3, 1e-4

# Bytes per float32 parameter an optimizer must move at the least.
#   adam/adamw: read p, g, mu, nu; write p, mu, nu             -> 7 x 4 = 28
#   lamb: pass 1 reads p, g, mu, nu, writes mu, nu (and the norms need the
#         update); pass 2 reads p, mu, nu, writes p              -> 10 x 4 = 40
#   lars: pass 1 reads p, g (norms); pass 2 reads p, g, t, writes p, t -> 7 x 4 = 28
#   sgd-momentum: read p, g, t; write p, t                       -> 5 x 4 = 20
#   muon (contrib): read p, g, mu; write p, mu (+ Newton-Schulz matmuls: compute, not bytes)
#                                                                -> 5 x 4 = 20
#   schedule_free_adamw (contrib): read p, g, z, nu; write p, z, nu -> 7 x 4 = 28
#   prodigy (contrib): read p, g, mu, nu, s, p0; write p, mu, nu, s -> 10 x 4 = 40
BYTES_PER_PARAM = {"adam": 28, "adamw": 28, "lamb": 40, "lars": 28, "sgd-momentum": 20,
                   "muon": 20, "schedule_free_adamw": 28, "prodigy": 40}


def _make(lib: Any, name: str) -> Any:
    if name == "adam":
        return lib.adam(LR)
    if name == "adamw":
        return lib.adamw(LR, weight_decay=WD)
    if name == "lamb":
        return lib.lamb(LR, weight_decay=WD)
    if name == "lars":
        return lib.lars(LR, weight_decay=WD)
    if name == "sgd-momentum":
        return lib.sgd(LR, momentum=0.9)
    if name == "muon":
        return lib.contrib.muon(LR)
    if name == "schedule_free_adamw":
        return lib.contrib.schedule_free_adamw(LR)
    if name == "prodigy":
        return lib.contrib.prodigy()
    raise ValueError(f"unknown optimizer {name!r}; choose from {sorted(BYTES_PER_PARAM)}")


OPTIMIZERS = tuple(BYTES_PER_PARAM)

# --------------------------------------------------------------------------
# The libraries under test. A "lib" is a label, an optimizer factory, an
# apply_updates, and a context manager entered while tracing.
# --------------------------------------------------------------------------


def _libs(names: list[str]) -> dict[str, dict]:
    libs = {}
    for name in names:
        if name == "functrain":
            libs[name] = dict(make=lambda o: _make(functrain, o),
                              apply=functrain.apply_updates, ctx=contextlib.nullcontext)
        elif name == "optax":
            libs[name] = dict(make=lambda o: _make(optax, o), apply=optax.apply_updates,
                              ctx=contextlib.nullcontext)
        elif name.startswith("module:"):  # another copy of functrain, e.g. an older commit
            module = importlib.import_module(name.split(":", 1)[1])
            libs[name] = dict(make=lambda o, m=module: _make(m, o), apply=module.apply_updates,
                              ctx=contextlib.nullcontext)
        else:
            raise ValueError(f"unknown library {name!r}: functrain, optax or module:<package> "
                             f"(see benchmarks/before_after.sh)")
    return libs


# --------------------------------------------------------------------------
# Trees
# --------------------------------------------------------------------------

def parse_size(text: str) -> int:
    """'16M' -> 16_000_000 parameters; '500k' and plain integers work too."""
    text = text.strip().lower()
    mult = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if text[-1:] in "kmg" else text) * mult)


def fmt_size(n: int) -> str:
    """16_000_000 -> '16M', 998_400 -> '1M', 2_500 -> '2.5k'."""
    if n >= 995_000:
        return f"{n / 1e6:.3g}M"
    if n >= 1_000:
        return f"{n / 1e3:.3g}k"
    return str(n)


def tree_shapes(kind: str, n: int) -> dict[str, tuple]:
    """Leaf shapes (path -> shape) of a tree of ``kind`` with about ``n`` params.

    ``kind`` is ``"1"`` (one big leaf), an integer leaf count (leaves of four
    different sizes, cycling, so shapes repeat as in real models) or
    ``"transformer"``.
    """
    if kind == "transformer":
        return transformer_shapes(n)
    k = int(kind)
    if k == 1:
        cols = 1024 if n >= 4096 else 1
        return {"w": (max(1, n // cols), cols)}
    weights = [0.5, 1.0, 1.5, 1.0]  # four distinct shapes, mean 1
    cols = 64 if n // k >= 256 else 1
    shapes = {}
    for i in range(k):
        rows = max(1, int(round(weights[i % 4] * n / k / cols)))
        shapes[f"block{i // 10:03d}/w{i % 10}"] = (rows, cols)
    return shapes


def transformer_shapes(n: int, layers: int = 12) -> dict[str, tuple]:
    """A GPT-like tree of about ``n`` params: embeddings, then per layer q/k/v/o
    projections with biases, a 4x MLP with biases, two norm scales and biases;
    16 leaves a layer, all layers sharing shapes; the layers hold ~2/3 of n."""
    d = max(8, int(round(math.sqrt(2 * n / 3 / (12 * layers)) / 8)) * 8)
    ctx = 512
    vocab = max(16, (n - layers * (12 * d * d + 13 * d) - 2 * d) // d - ctx)
    shapes = {"embed/tokens": (vocab, d), "embed/positions": (ctx, d)}
    for layer in range(layers):
        pre = f"layer{layer:02d}"
        for nm in ("ln1", "ln2"):
            shapes[f"{pre}/{nm}/scale"] = (d,)
            shapes[f"{pre}/{nm}/bias"] = (d,)
        for nm in ("q", "k", "v", "o"):
            shapes[f"{pre}/attn/{nm}/w"] = (d, d)
            shapes[f"{pre}/attn/{nm}/b"] = (d,)
        shapes[f"{pre}/mlp/up/w"] = (d, 4 * d)
        shapes[f"{pre}/mlp/up/b"] = (4 * d,)
        shapes[f"{pre}/mlp/down/w"] = (4 * d, d)
        shapes[f"{pre}/mlp/down/b"] = (d,)
    shapes["final_ln/scale"] = (d,)
    shapes["final_ln/bias"] = (d,)
    return shapes


def nest(flat: dict[str, Any]) -> dict:
    """{'a/b': x} -> {'a': {'b': x}}: a nested tree like a real model's."""
    out: dict = {}
    for path, value in flat.items():
        node = out
        *heads, last = path.split("/")
        for h in heads:
            node = node.setdefault(h, {})
        node[last] = value
    return out


def make_tree(shapes: dict[str, tuple], seed: int, scale: float) -> dict:
    rng = np.random.default_rng(seed)
    return nest({p: jnp.asarray(rng.standard_normal(s, dtype=np.float32) * scale)
                 for p, s in shapes.items()})


def copy_tree(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), tree)


# --------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------

def floor_kernel(n: int) -> dict:
    """The bandwidth probe: a donated 4-read / 3-write elementwise kernel on n floats.

    It moves 28 bytes per element like an Adam step, with trivial arithmetic;
    it is timed interleaved with the optimizer steps of each case.
    """
    def kernel(a, b, c, d):
        return a + 0.5 * d, 0.9 * b + d, 0.99 * c + d

    rng = np.random.default_rng(0)
    a, b, c, d = (jnp.asarray(rng.standard_normal(n, dtype=np.float32)) for _ in range(4))
    compiled = jax.jit(kernel, donate_argnums=(0, 1, 2)).lower(a, b, c, d).compile()
    return {"call": lambda carry: compiled(*carry, d), "carry": (a, b, c), "bytes": 28 * n}


def build_step(lib: dict, opt_name: str, params: Any, grads: Any) -> dict:
    """Trace, lower and compile one library's donated step; time each phase."""
    with lib["ctx"]():
        opt = lib["make"](opt_name)
        apply = lib["apply"]

        def step(params, state, grads):
            updates, state = opt.update(grads, state, params)
            return apply(params, updates), state

        state = opt.init(params)
        t0 = time.perf_counter()
        lowered = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, grads)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
    mem = compiled.memory_analysis()
    # Live bytes while the step runs: inputs, outputs not aliased to a donated
    # input, and XLA's temporaries (e.g. a materialized update direction).
    peak = (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
            + mem.temp_size_in_bytes)
    try:
        cost = compiled.cost_analysis() or {}
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    except Exception:  # noqa: BLE001 (cost analysis is optional diagnostics)
        cost = {}
    return {"compiled": compiled, "state": state, "lower_s": t1 - t0, "compile_s": t2 - t1,
            "xla_bytes_accessed": float(cost.get("bytes accessed", 0.0)),
            "xla_flops": float(cost.get("flops", 0.0)),
            "temp_bytes": int(mem.temp_size_in_bytes), "peak_bytes": int(peak),
            "xla_peak_bytes": int(getattr(mem, "peak_memory_in_bytes", 0) or 0),
            "hlo_ops": _count_ops(lowered)}


def _count_ops(lowered: Any) -> int:
    """Operations in the lowered (StableHLO) module: what XLA has to compile."""
    return sum(1 for ln in lowered.as_text().splitlines() if " = " in ln)


def bench_case(opt_name: str, kind: str, n: int, libs: dict[str, dict], reps: int,
               min_time: float, order: int) -> dict:
    """Compile every library's step for one optimizer and tree, then time them
    interleaved with each other and with the bandwidth probe of the same size."""
    shapes = tree_shapes(kind, n)
    params0 = make_tree(shapes, 0, 1.0)
    grads = make_tree(shapes, 1, 1e-2)
    n_params = sum(int(np.prod(s)) for s in shapes.values())

    names = list(libs)
    built = {}
    for name in (names[::-1] if order % 2 else names):  # alternate who compiles first
        built[name] = build_step(libs[name], opt_name, params0, grads)

    floor = floor_kernel(n_params)
    calls: dict[str, Callable] = {nm: (lambda c, f=built[nm]["compiled"]: f(c[0], c[1], grads))
                                  for nm in names}
    calls[FLOOR] = floor["call"]
    carry = {nm: (copy_tree(params0), built[nm].pop("state")) for nm in names}
    carry[FLOOR] = floor["carry"]

    # Interleave calls, rotating which one goes first each round.
    keys = list(calls)
    times: dict[str, list[float]] = {k: [] for k in keys}
    warmup, i, t_start = 2, 0, time.perf_counter()
    while True:
        for k in keys[i % len(keys):] + keys[:i % len(keys)]:
            t0 = time.perf_counter()
            out = calls[k](carry[k])
            jax.block_until_ready(out)
            dt = time.perf_counter() - t0
            carry[k] = out
            if i >= warmup:
                times[k].append(dt)
        i += 1
        done = i - warmup
        if done >= reps and (time.perf_counter() - t_start >= min_time or done >= 20 * reps):
            break

    # Every library took the same steps from the same inputs: they must agree.
    ref = jax.tree_util.tree_leaves(carry[names[0]][0])
    agree = {}
    for nm in names[1:]:
        other = jax.tree_util.tree_leaves(carry[nm][0])
        agree[nm] = max(float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(a)) + 1e-30))
                        for a, b in zip(ref, other))

    floor_t = statistics.median(times[FLOOR])
    bw = floor["bytes"] / floor_t
    out = {"opt": opt_name, "tree": kind, "size": n, "params": n_params,
           "leaves": len(shapes), "distinct_shapes": len(set(shapes.values())),
           "timed_steps": i - warmup, "bandwidth_bytes_per_s": bw,
           "probe_step_s": floor_t,
           "floor_s": BYTES_PER_PARAM[opt_name] * n_params / bw,
           "max_rel_diff_vs_first": agree, "libs": {}}
    for nm in names:
        b = built[nm]
        med = statistics.median(times[nm])
        out["libs"][nm] = {
            "step_s": med, "step_iqr_s": _iqr(times[nm]), "params_per_s": n_params / med,
            "bw_fraction": out["floor_s"] / med,
            "lower_s": b["lower_s"], "compile_s": b["compile_s"],
            "total_compile_s": b["lower_s"] + b["compile_s"],
            "temp_bytes": b["temp_bytes"], "peak_bytes": b["peak_bytes"],
            "xla_peak_bytes": b["xla_peak_bytes"], "hlo_ops": b["hlo_ops"],
            "xla_bytes_accessed": b["xla_bytes_accessed"], "xla_flops": b["xla_flops"]}
    return out


def _iqr(xs: list[float]) -> float:
    if len(xs) < 4:
        return 0.0
    q = statistics.quantiles(xs, n=4)
    return q[2] - q[0]


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------

def machine_info() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "jax": jax.__version__, "optax": optax.__version__,
            "functrain": getattr(functrain, "__version__", "?"),
            "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()], "cpu_count": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            models = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        info["cpu"] = models[0] if models else platform.processor()
    except OSError:
        info["cpu"] = platform.processor()
    info["env"] = {k: v for k, v in os.environ.items()
                   if k.startswith(("MALLOC_", "XLA_", "JAX_", "FUNCTRAIN_")) or k == "LD_PRELOAD"}
    try:
        info["loadavg_at_start"] = os.getloadavg()
    except OSError:
        pass
    try:
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
            text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def add_ratios(case: dict, base: str, peer: str) -> None:
    """``case['ratios']``: base / peer for step time, compile time and peak memory."""
    if base in case["libs"] and peer in case["libs"] and base != peer:
        a, b = case["libs"][base], case["libs"][peer]
        case["ratios"] = {"step": a["step_s"] / b["step_s"],
                          "compile": a["total_compile_s"] / b["total_compile_s"],
                          "peak_mem": a["peak_bytes"] / max(1, b["peak_bytes"])}


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g}"


def table_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    libs = results["config"]["libs"]
    base, peer = libs[0], libs[1] if len(libs) > 1 else libs[0]
    head = ["opt", "tree", "params", "leaves"]
    head += [f"{nm} step ms" for nm in libs] + [f"step {base}/{peer}"]
    head += [f"{nm} compile s" for nm in libs] + [f"compile {base}/{peer}"]
    head += [f"{nm} %bw" for nm in libs] + [f"mem {base}/{peer}"]
    rows = []
    for c in results["cases"]:
        L = c["libs"]
        r = c.get("ratios", {})
        row = [c["opt"], c["tree"], fmt_size(c["params"]), str(c["leaves"])]
        row += [_ms(L[nm]["step_s"]) for nm in libs] + [f"{r.get('step', float('nan')):.2f}"]
        row += [f"{L[nm]['total_compile_s']:.2f}" for nm in libs]
        row += [f"{r.get('compile', float('nan')):.2f}"]
        row += [f"{100 * L[nm]['bw_fraction']:.0f}" for nm in libs]
        row += [f"{r.get('peak_mem', float('nan')):.2f}"]
        rows.append(row)
    return head, rows


def text_table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def check_targets(results: dict) -> list[dict]:
    """The project's targets, each checked on this run's ratios (first lib / second lib)."""
    libs = results["config"]["libs"]
    if len(libs) < 2:
        return []
    base, peer = libs[0], libs[1]
    by = {(c["opt"], c["tree"], c["size"]): c for c in results["cases"]}
    out = []

    def add(what: str, case: dict, value: float, limit: float, note: str = "") -> None:
        out.append({"target": what, "tree": case["tree"], "params": case["params"],
                    "value": value, "limit": limit, "met": bool(value <= limit),
                    "note": note})

    def same_program(case: dict) -> bool:
        """XLA reports the same bytes accessed and flops for both steps."""
        a, b = case["libs"][base], case["libs"][peer]
        return (a.get("xla_bytes_accessed", 0) > 0
                and a.get("xla_bytes_accessed") == b.get("xla_bytes_accessed")
                and a.get("xla_flops") == b.get("xla_flops"))

    for (opt, kind, size), c in by.items():
        r = c.get("ratios")
        if not r:
            continue
        step_limit = 0.6 if opt in ("lamb", "lars") else 1.0
        add(f"{opt} step {base}/{peer} <= {step_limit}", c, r["step"], step_limit,
            "same XLA cost (bytes, flops): the ratio is timing noise"
            if same_program(c) else "")
        add(f"{opt} peak memory {base}/{peer} <= 1", c, r["peak_mem"], 1.0)
        if c["leaves"] == 1000:
            lim = 0.25 if opt in ("lamb", "lars") else 0.5 if opt == "adam" else None
            if lim is not None:
                add(f"{opt} compile {base}/{peer} <= {lim} (1000 leaves)", c, r["compile"], lim)
        if opt == "lamb" and ("adam", kind, size) in by:
            a = by[("adam", kind, size)]["libs"][base]
            add(f"lamb step / adam step ({base}) <= 1.6", c,
                c["libs"][base]["step_s"] / a["step_s"], 1.6)
    return out


def targets_text(checks: list[dict]) -> list[str]:
    return [f"{'met ' if t['met'] else 'MISS'}  {t['target']:<44} tree {t['tree']:<11} "
            f"{fmt_size(t['params']):>6}: {t['value']:.2f}"
            + (f"  ({t['note']})" if t.get("note") else "") for t in checks]


def plot(results: dict, path: str) -> None:
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    cases = results["cases"]
    opts = list(dict.fromkeys(c["opt"] for c in cases))
    sizes = sorted({c["size"] for c in cases})
    libs = results["config"]["libs"]
    styles = {"functrain": ("C0", "-"), "optax": ("C3", "--"),
              "functrain-noopt": ("C2", ":")}
    fig, axes = plt.subplots(2, len(opts), figsize=(4.2 * len(opts), 7.5), squeeze=False)
    for j, opt in enumerate(opts):
        for size_i, size in enumerate(sizes):
            mine = [c for c in cases if c["opt"] == opt and c["size"] == size]
            # Lines: the leaf-count sweep (1, 100, 1000 leaves); stars: the transformer.
            for cs, marker, ls_override in (
                    (sorted((c for c in mine if c["tree"] != "transformer"),
                            key=lambda c: c["leaves"]), "os^v"[size_i % 4], None),
                    ([c for c in mine if c["tree"] == "transformer"], "*XP"[size_i % 3], "none")):
                if not cs:
                    continue
                x = [c["leaves"] for c in cs]
                tag = fmt_size(cs[0]["size"]) + (" transformer" if ls_override else "")
                for li, nm in enumerate(libs):
                    color, ls = styles.get(nm, (f"C{4 + li}", "-."))
                    ls = ls_override or ls
                    axes[0, j].plot(x, [c["libs"][nm]["step_s"] * 1e3 for c in cs],
                                    color=color, ls=ls, marker=marker, ms=9 if ls_override
                                    else 6, label=f"{nm} {tag}")
                    axes[1, j].plot(x, [c["libs"][nm]["total_compile_s"] for c in cs],
                                    color=color, ls=ls, marker=marker, ms=9 if ls_override
                                    else 6, label=f"{nm} {tag}")
                axes[0, j].plot(x, [c["floor_s"] * 1e3 for c in cs], color="k", lw=0.8,
                                ls=ls_override or (0, (1, 1)), marker=marker, ms=4,
                                label=f"bandwidth floor {tag}")
        for row, ylabel in ((0, "median step time (ms)"), (1, "lower + compile (s)")):
            ax = axes[row, j]
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("leaves in the tree (stars: transformer-shaped)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        axes[0, j].set_title(opt)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=7,
               frameon=False)
    m = results["machine"]
    fig.suptitle(f"functrain vs optax, jitted donated step - {m.get('cpu', '?')}, "
                 f"{m['cpu_count']} cores, {m['backend']}, jax {m['jax']}, "
                 f"optax {m['optax']} ({results['date']})", fontsize=9)
    fig.tight_layout(rect=(0, 0.03 + 0.018 * math.ceil(len(handles) / 6), 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def write_outputs(results: dict, out_dir: str, name: str, with_plot: bool) -> None:
    """Print the table and target checks; write JSON, markdown and the plot."""
    libs = results["config"]["libs"]
    base, peer = libs[0], libs[1] if len(libs) > 1 else libs[0]
    os.makedirs(out_dir, exist_ok=True)
    head, rows = table_rows(results)
    table = text_table(head, rows)
    results["targets"] = check_targets(results)
    extra = targets_text(results["targets"])
    met = sum(t["met"] for t in results["targets"])
    print("\n" + table + f"\n\n# targets met: {met} of {len(results['targets'])}\n"
          + "\n".join(extra))
    print(f"\n# wall time {results['wall_s']:.0f} s")
    stem = os.path.join(out_dir, name)
    with open(stem + ".json", "w") as f:
        json.dump(results, f, indent=1)
    with open(stem + ".md", "w") as f:
        m = results["machine"]
        f.write(f"Measured {results['date']} on {m.get('cpu', '?')} ({m['cpu_count']} cores, "
                f"{m['backend']}), jax {m['jax']}, optax {m['optax']}, functrain "
                f"{m['functrain']} (git {m.get('git_commit', '?')}); load average at start "
                f"{', '.join(f'{x:.2f}' for x in m.get('loadavg_at_start', ()))}. "
                f"Times are medians of interleaved calls; ratios are {base} / {peer}; "
                f"%bw = bandwidth floor / step time (floor = bytes the optimizer must "
                f"move / bandwidth measured in the same case).\n\n")
        f.write(markdown_table(head, rows) + "\n\n")
        f.write(f"Targets met: {met} of {len(results['targets'])}.\n\n```\n"
                + "\n".join(extra) + "\n```\n")
    if with_plot:
        try:
            plot(results, stem + ".png")
        except ImportError:
            print("# matplotlib is not installed: no plot (pip install -e '.[bench]')")
    print(f"# wrote {stem}.json, {stem}.md" + (f", {stem}.png" if with_plot else ""))



# Compile time depends on the leaf count, not the size, and 1000-leaf steps take
# the longest to compile: the default runs the leaf sweep at 16M, the cheap
# trees at two sizes too, and the transformer at two sizes.
DEFAULT_CASES = "1@2M,100@2M,transformer@2M,1@16M,100@16M,1000@16M,transformer@16M"
QUICK = dict(cases="1@1M,100@1M,transformer@1M", reps=5, min_time=0.2)


def parse_cases(text: str) -> list[tuple[str, int]]:
    """'1@2M,transformer@16M' -> [('1', 2_000_000), ('transformer', 16_000_000)]."""
    out = []
    for item in text.split(","):
        kind, _, size = item.strip().partition("@")
        if not size:
            raise ValueError(f"case {item!r} is not TREE@SIZE (e.g. 100@2M)")
        if kind != "transformer" and not kind.isdigit():
            raise ValueError(f"case {item!r}: the tree is a leaf count or 'transformer'")
        out.append((kind, parse_size(size)))
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"small run: cases {QUICK['cases']}, {QUICK['reps']} reps")
    ap.add_argument("--cases", help=f"TREE@SIZE list; TREE is a leaf count (1 = one big "
                                    f"leaf) or transformer (default {DEFAULT_CASES})")
    ap.add_argument("--sizes", help="total parameter counts, e.g. 2M,16M: with --trees, "
                                    "every tree at every size (instead of --cases)")
    ap.add_argument("--trees", help="leaf counts and/or transformer, e.g. 1,100,transformer "
                                    "(with --sizes; default size 2M)")
    ap.add_argument("--opts", default=",".join(OPTIMIZERS),
                    help=f"optimizers (default {','.join(OPTIMIZERS)})")
    ap.add_argument("--libs", default="functrain,optax",
                    help="libraries; the first two are compared in the ratios "
                         "(also: module:PKG = a copy of functrain importable as PKG, e.g. an older "
                         "commit made by benchmarks/before_after.sh)")
    ap.add_argument("--reps", type=int, help="timed steps per library and case (default 15)")
    ap.add_argument("--min-time", type=float,
                    help="keep timing a case until this many seconds pass (default 1.0)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="output folder")
    ap.add_argument("--name", default="latest", help="output file stem")
    ap.add_argument("--no-plot", action="store_true", help="skip the PNG")
    ap.add_argument("--render", metavar="JSON",
                    help="measure nothing: re-render the table, targets and plot of a "
                         "saved results JSON into --out/--name")
    args = ap.parse_args(argv)
    if args.render:
        with open(args.render) as f:
            results = json.load(f)
        write_outputs(results, args.out, args.name, not args.no_plot)
        return results

    if args.sizes or args.trees:
        if args.cases:
            ap.error("give either --cases or --sizes/--trees")
        cases = [(t.strip(), parse_size(s)) for s in (args.sizes or "2M").split(",")
                 for t in (args.trees or "1,100,1000,transformer").split(",")]
    else:
        try:
            cases = parse_cases(args.cases or (QUICK["cases"] if args.quick else DEFAULT_CASES))
        except ValueError as e:
            ap.error(str(e))
    opts = [o.strip() for o in args.opts.split(",")]
    for o in opts:
        if o not in BYTES_PER_PARAM:
            ap.error(f"unknown optimizer {o!r}; choose from {','.join(OPTIMIZERS)}")
    reps = args.reps or (QUICK["reps"] if args.quick else 15)
    min_time = args.min_time if args.min_time is not None else (
        QUICK["min_time"] if args.quick else 1.0)
    lib_names = [s.strip() for s in args.libs.split(",")]
    libs = _libs(lib_names)

    t_run = time.perf_counter()
    results = {"schema": SCHEMA, "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "machine": machine_info(),
               "config": {"cases": [f"{k}@{fmt_size(n)}" for k, n in cases], "opts": opts,
                          "libs": lib_names,
                          "reps": reps, "min_time_s": min_time, "lr": LR,
                          "weight_decay": WD, "bytes_per_param": BYTES_PER_PARAM},
               "cases": []}
    print(f"# {results['machine']['cpu']} x{results['machine']['cpu_count']}, "
          f"backend {jax.default_backend()}, jax {jax.__version__}, optax {optax.__version__}",
          flush=True)
    base, peer = lib_names[0], lib_names[1] if len(lib_names) > 1 else lib_names[0]
    order = 0
    for kind, size in cases:
        for opt in opts:
            t0 = time.perf_counter()
            case = bench_case(opt, kind, size, libs, reps, min_time, order)
            order += 1
            add_ratios(case, base, peer)
            results["cases"].append(case)
            L = case["libs"]
            print(f"  {opt:>12} tree={kind:<11} {fmt_size(case['params']):>6} "
                  f"leaves={case['leaves']:<5} " + "  ".join(
                      f"{nm}: {_ms(L[nm]['step_s'])} ms / {L[nm]['total_compile_s']:.2f} s"
                      for nm in lib_names)
                  + f"  floor {_ms(case['floor_s'])} ms "
                    f"({case['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s)"
                  + f"  [{time.perf_counter() - t0:.1f} s]", flush=True)
    results["wall_s"] = time.perf_counter() - t_run

    write_outputs(results, args.out, args.name, not args.no_plot)
    return results


if __name__ == "__main__":
    main()
