"""The capacity benchmark's report: the table, its page and the plot.

``benchmarks/capacity.py`` compiles and searches; this module turns its results (config name
-> search result, as written to ``benchmarks/results/capacity*.json``) into the Markdown
table and page, and draws ``benchmarks/results/capacity.png`` (the largest model per
configuration on one H100 and one TPU v5e chip) from the two JSON files:
``python benchmarks/capacity_report.py``.
"""

from __future__ import annotations

import io
import json
import os
import sys
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

# --------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------

COLUMNS = """Columns: **largest fitting** is the largest ladder size whose compiled step's
peak is at most {limit}; **params** its parameter count; **peak** XLA's
`argument + output - alias + temp` bytes of that step; **persistent B/param** the
compiler's argument bytes (params + optimizer state + the batch, all donated or read, alive
before and after the step) per parameter; **temp** XLA's temporary bytes (activations kept
for the backward pass, the recomputed block, gradients, the optimizer's intermediates);
**temp beyond SGD** that temp less the temp of the same step with plain SGD
(`functrain.sgd`, no state) on the same size and params dtype, i.e. about what the
optimizer's own intermediates add at the step's peak (temp is a peak of live buffers, so the
difference is indicative, not additive); **update-only temp** (– with gradient release,
whose update runs inside the backward pass, one layer at a time) the temp of the optimizer's
step alone (`update` and `apply_updates` on params, state and gradients in the params'
dtype, no model) at that size: what the optimizer needs while the gradients are alive;
**next rung** the smallest ladder size that did not fit and its peak; **x optax** the
parameter count relative to optax adamw's largest. GiB = 2^30 bytes.

{caveats}"""

#: Per target: what the threshold is, and the caveats of reading it.
LIMIT_TEXT = {
    "h100": "the H100's memory (the device description's `device_memory_size`, "
            "84,942,979,072 bytes = 79.1 GiB)",
    "tpu_v5e": "what the TPU compiler says a v5e chip has (15.75 GiB: a larger step fails "
               "to compile with \"Ran out of memory on HBM ... exceeds available HBM "
               "(15.75G)\"; such a rung is listed as \"out of memory\")",
}
CAVEATS = {
    "h100": """Caveats: the threshold is the whole device memory. JAX on a real GPU preallocates 75% of
it unless `XLA_PYTHON_CLIENT_MEM_FRACTION` (or `XLA_PYTHON_CLIENT_PREALLOCATE=false`) says
otherwise, and the CUDA context and library workspaces take some of the rest; a peak near
the threshold needs that set, and may still not fit. XLA's rematerialization and scheduling
passes aim below about 80% of the device memory (its log says "Can't reduce memory use
below ..." for the larger programs): the temps here are after those passes, so a step's
temp can depend on how large its arguments are.""",
    "tpu_v5e": """Caveats: the TPU compiler checks the fit itself (its own memory
assignment, after its rematerialization passes), so a rung either compiles within 15.75 GiB
or fails; the peak shown is `memory_analysis()`'s, as on the H100. Until commit 01176d5 the
4-bit codes were paired through a trailing axis of 2, which the TPU pads to its 128 lanes;
they are now paired by strided slices there (the heading names any row compiled before).
The low-bit codes' block layout still costs a relayout on TPU (docs/performance.md, "On
accelerators").""",
}


def summary(results: dict, baseline: str) -> list:
    """One row per configuration: its largest fitting size and the next rung.

    Args:
      results: config name -> ``{"best": index, "rows": [...], "ladder": [...]}``.
      baseline: the configuration the ratios are to (optax's float32 AdamW).

    Returns:
      Dicts with ``config``, ``best`` (the fitting row or ``None``), ``next`` (the smallest
      non-fitting compiled row or ``None``), ``ratio`` (params over the baseline's best) and
      ``temp_beyond_sgd`` (the best row's temp bytes less its SGD reference's, or ``None``)
      and ``update_temp`` (the temp bytes of the optimizer's step alone at that size).
    """
    base = results.get(baseline, {}).get("best_row")
    out = []
    for name, res in results.items():
        best = res.get("best_row")
        failing = [r for r in res["rows"] if not r["fits"]]
        nxt = min(failing, key=lambda r: r["params"]) if failing else None
        ratio = best["params"] / base["params"] if best and base else None
        ref = res.get("reference_row")
        beyond = (best["temp_bytes"] - ref["temp_bytes"]
                  if best and ref and "temp_bytes" in ref else None)
        upd = res.get("update_row")
        out.append({"config": name, "best": best, "next": nxt, "ratio": ratio,
                    "temp_beyond_sgd": beyond,
                    "update_temp": upd["temp_bytes"] if upd and "temp_bytes" in upd else None})
    return out


def _failure(row: dict) -> str:
    """How a compile failed: the TPU compiler refuses a step that does not fit its memory."""
    return ("out of memory" if "Ran out of memory" in row.get("error", "")
            else "compile failed")


def table(results: dict, baseline: str) -> str:
    """The Markdown table of :func:`summary`.

    Args:
      results: as for :func:`summary`.
      baseline: as for :func:`summary`.

    Returns:
      The table's text.
    """
    lines = ["| configuration | largest fitting (d_model x layers) | params (B) | peak GiB | "
             "persistent B/param | temp GiB | temp beyond SGD GiB | update-only temp GiB | "
             "next rung: params (B), peak GiB | x optax |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for s in summary(results, baseline):
        b, n = s["best"], s["next"]
        if n is None:
            nxt = "(ladder top fits)"
        elif "error" in n:
            nxt = f"{n['params'] / 1e9:.2f}: {_failure(n)}"
        else:
            nxt = f"{n['params'] / 1e9:.2f}, {n['peak_bytes'] / 2**30:.1f}"
        if b is None:
            lines.append(f"| {s['config']} | none on the ladder | | | | | | | {nxt} | |")
            continue
        ratio = f"{s['ratio']:.2f}" if s["ratio"] is not None else "–"
        beyond, update = (f"{s[k] / 2**30:.1f}" if s[k] is not None else "–"
                          for k in ("temp_beyond_sgd", "update_temp"))
        upd = results[s["config"]].get("update_row")
        if upd and "error" in upd:
            update = _failure(upd)
        lines.append(f"| {s['config']} | {b['d_model']} x {b['n_layers']} | "
                     f"{b['params'] / 1e9:.2f} | {b['peak_bytes'] / 2**30:.1f} | "
                     f"{b['persistent_bytes_per_param']:.2f} | {b['temp_bytes'] / 2**30:.1f} | "
                     f"{beyond} | {update} | {nxt} | {ratio} |")
    return "\n".join(lines)


def markdown(meta: dict, text: str) -> str:
    """The results page: how it was compiled, the table, its columns and caveats.

    Args:
      meta: the run's ``meta`` (date, jax, commit, target, title, limit_bytes, shapes, ...).
      text: :func:`table`'s output.

    Returns:
      The page's Markdown.
    """
    target = meta.get("target", "h100")
    compiler = {"h100": "XLA's H100 compiler", "tpu_v5e": "the TPU v5e compiler (libtpu)"}.get(
        target, "XLA:CPU")
    columns = COLUMNS.format(limit=LIMIT_TEXT.get(target, f"{meta['limit_bytes']:,} bytes"),
                             caveats=CAVEATS.get(target, ""))
    return (f"# Capacity: the largest transformer whose training step fits "
            f"{meta.get('title', 'one H100')}\n\n"
            f"Compiled on {meta['date']} by {compiler} on a CPU machine (deviceless, "
            f"JAX {meta['jax']}), `benchmarks/capacity.py` at commit {meta['commit']}; "
            f"{meta['elapsed_s']} s in all"
            + (f" (the rows of {', '.join(meta['earlier']['configs'])}: commit "
               f"{meta['earlier']['commit']}, {meta['earlier']['date']})"
               if meta.get("earlier") else "") + ". "
            f"Model: decoder-only, vocabulary {meta['vocab']}, head dimension "
            f"{meta['head_dim']}, {meta['mlp']} MLP, pre-RMSNorm, untied output; layers "
            f"scanned with remat per layer; bfloat16 activations; plain (non-flash) "
            f"attention; batch {meta['batch']} x {meta['seq']} tokens. Step: forward, "
            f"backward, optimizer update and apply, params and state donated.\n\n"
            f"{text}\n\n{columns}\n")


#: The plot's short names of the configurations.
SHORT = {
    "optax adamw, float32 params": "optax adamw\nfloat32",
    "functrain adamw, float32 params": "functrain adamw\nfloat32",
    "bf16 params + bf16 compensation": "bf16 params\n+ bf16 comp.",
    "bf16 params + int8 compensation + 8-bit moments": "bf16 + int8 comp.\n+ 8-bit",
    "bf16 params + int8 compensation + 4-bit moments": "bf16 + int8 comp.\n+ 4-bit",
    "bf16 + int8 compensation + 8-bit moments + gradient release":
        "bf16 + 8-bit\n+ release",
    "bf16 + int8 compensation + 4-bit moments + gradient release":
        "bf16 + 4-bit\n+ release",
}


def plot(runs: dict) -> bytes:
    """PNG: the largest fitting model's parameters per configuration, one panel per target.

    Args:
      runs: title (e.g. ``"one H100 (79.1 GiB)"``) -> that target's results.

    Returns:
      The PNG's bytes.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4.2), squeeze=False)
    for ax, (title, results) in zip(axes[0], runs.items()):
        names = list(results)
        params = [(results[n].get("best_row") or {}).get("params", 0) / 1e9 for n in names]
        colors = ["0.6" if "float32" in n else "tab:blue" if "release" not in n
                  else "tab:green" for n in names]
        bars = ax.bar(range(len(names)), params, color=colors)
        for bar, p in zip(bars, params):
            ax.text(bar.get_x() + bar.get_width() / 2, p, f"{p:.2f}B", ha="center",
                    va="bottom", fontsize=8)
        ax.set_xticks(range(len(names)), [SHORT.get(n, n) for n in names], fontsize=7,
                      rotation=30, ha="right")
        ax.set_ylabel("largest model that trains (B params)")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Capacity: the whole training step (batch 8 x 2048), compiled deviceless",
                 fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def write_plot(results_dir: str = RESULTS) -> Optional[str]:
    """Draw ``capacity.png`` from the H100 and TPU v5e results present in ``results_dir``.

    Args:
      results_dir: where ``capacity.json`` and ``capacity_tpu_v5e.json`` are.

    Returns:
      The PNG's path, or ``None`` when neither result exists.
    """
    runs = {}
    for name, title in (("capacity", "one H100 (79.1 GiB)"),
                        ("capacity_tpu_v5e", "one TPU v5e chip (15.75 GiB)")):
        path = os.path.join(results_dir, name + ".json")
        if os.path.exists(path):
            with open(path) as f:
                found = json.load(f)
            note = found["meta"].get("note")  # e.g. rows compiled before a change
            runs[title + (f"\n{note}" if note else "")] = found["results"]
    if not runs:
        return None
    out = os.path.join(results_dir, "capacity.png")
    with open(out, "wb") as f:
        f.write(plot(runs))
    return out


if __name__ == "__main__":
    print(write_plot(sys.argv[1] if len(sys.argv) > 1 else RESULTS))
