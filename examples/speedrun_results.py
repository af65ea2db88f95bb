"""What the speedrun's runs mean: steps to target, intervals, Welch's test, tables and plot.

The statistics of ``make speedrun`` (examples/speedrun.py), kept apart from the training
so that they can be read and tested on their own:

* :func:`steps_to_target`: the first evaluated step whose validation loss is at or below
  the target, or ``None`` (the run is *censored*: it never reached the target);
* :func:`summarize`: per optimizer, the mean over seeds with a 95% interval from the
  t-distribution, censored runs counted at the step budget (so the mean and the interval
  are then lower bounds, reported as such);
* :func:`welch_test`: Welch's unequal-variance t-test of two optimizers' steps, its
  statistic and Welch-Satterthwaite degrees of freedom written out here, the t
  distribution's tail and quantiles from SciPy (``scipy.stats.t``);
* :func:`results_table`, :func:`readme_block`, :func:`plot`: the tables of
  ``benchmarks/results/speedrun.md``, docs/speedrun.md and the README, and the figure.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

LEVEL = 0.95  # the confidence level of every interval


def _t_dist():
    """``scipy.stats.t``, with a clear error where SciPy is missing."""
    try:
        from scipy import stats
    except ImportError as err:  # pragma: no cover - scipy comes with functrain[demo]
        raise ImportError("the speedrun's statistics need SciPy's t distribution: "
                          "pip install scipy (it comes with functrain[demo]).") from err
    return stats.t


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t distribution with ``df`` degrees of freedom.

    Args:
      p: a probability in ``(0, 1)``.
      df: degrees of freedom, ``> 0`` (need not be an integer).

    Returns:
      ``q`` with ``P(T <= q) = p``.

    >>> round(t_quantile(0.975, 4), 4)  # the tables' 2.776
    2.7764
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must be in (0, 1), got {p!r}.")
    if not df > 0:
        raise ValueError(f"t_quantile: df must be > 0, got {df!r}.")
    return float(_t_dist().ppf(p, df))


def t_two_sided_p(t: float, df: float) -> float:
    """The two-sided p-value ``P(|T| >= |t|)`` of Student's t with ``df`` degrees of freedom.

    Args:
      t: the statistic (``+-inf`` gives 0).
      df: degrees of freedom, ``> 0``.

    Returns:
      The p-value, in ``[0, 1]``.

    >>> round(t_two_sided_p(2.776445, 4), 4)
    0.05
    """
    if not df > 0:
        raise ValueError(f"t_two_sided_p: df must be > 0, got {df!r}.")
    return float(min(1.0, 2.0 * _t_dist().sf(abs(t), df)))


def steps_to_target(steps: Sequence[int], losses: Sequence[float], target: float
                    ) -> Optional[int]:
    """The first step whose loss is at or below ``target``; ``None`` if none is.

    Args:
      steps: the evaluated steps, increasing.
      losses: the validation loss at each of them (NaN, a diverged run, never counts).
      target: the validation loss to reach.

    Returns:
      The step, or ``None`` (the run is censored: it did not reach the target).

    >>> steps_to_target([0, 10, 20, 30], [4.0, 2.5, 1.9, 1.7], 2.0)
    20
    >>> steps_to_target([0, 10], [4.0, float('nan')], 2.0) is None
    True
    """
    if len(steps) != len(losses):
        raise ValueError(f"steps_to_target: {len(steps)} steps but {len(losses)} losses.")
    for step, loss in zip(steps, losses):
        if loss <= target:  # False for NaN
            return int(step)
    return None


def mean_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """The mean of ``values`` and the half-width of its t interval.

    ``mean +- t_{(1 + level) / 2, n - 1} * s / sqrt(n)``, ``s`` the sample standard
    deviation (``n - 1`` in its denominator).

    Args:
      values: at least one number.
      level: the confidence level, in ``(0, 1)``.

    Returns:
      ``(mean, half_width)``; the half-width is NaN for a single value.

    >>> mean_interval([1.0, 2.0, 3.0, 4.0, 5.0])  # 3 +- 2.776 * sqrt(2.5 / 5)
    (3.0, 1.963...)
    """
    x = np.asarray(values, np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"mean_interval: values must be a non-empty list, got {values!r}.")
    if x.size == 1:
        return float(x[0]), math.nan
    half = t_quantile((1.0 + level) / 2.0, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean()), float(half)


def welch_test(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float]:
    """Welch's two-sided t-test of equal means, without assuming equal variances.

    ``t = (mean(x) - mean(y)) / sqrt(s_x^2 / n_x + s_y^2 / n_y)`` with the
    Welch-Satterthwaite degrees of freedom ``(a + b)^2 / (a^2 / (n_x - 1) + b^2 / (n_y -
    1))``, ``a = s_x^2 / n_x``, ``b = s_y^2 / n_y``. Where both samples are constant the
    test has no variance to work with: equal means give ``p = 1``, different ones
    ``p = 0`` (``t = +-inf``).

    Args:
      x: the first sample, at least two numbers.
      y: the second sample, at least two numbers.

    Returns:
      ``(t, df, p)``.

    >>> t, df, p = welch_test([1, 2, 3, 4, 5], [2, 4, 6, 8, 10])
    >>> round(t, 4), round(df, 4)  # -3 / sqrt(2.5), 6.25 / (0.0625 + 1)
    (-1.8974, 5.8824)
    """
    a_x, a_y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    for name, arr in (("x", a_x), ("y", a_y)):
        if arr.ndim != 1 or arr.size < 2:
            raise ValueError(f"welch_test: {name} must hold at least two numbers, got {arr!r}.")
    a, b = a_x.var(ddof=1) / a_x.size, a_y.var(ddof=1) / a_y.size
    diff = a_x.mean() - a_y.mean()
    if a + b == 0.0:
        return (0.0, math.nan, 1.0) if diff == 0 else (math.copysign(math.inf, diff),
                                                        math.nan, 0.0)
    t = diff / math.sqrt(a + b)
    df = (a + b) ** 2 / (a * a / (a_x.size - 1) + b * b / (a_y.size - 1))
    return float(t), float(df), t_two_sided_p(t, df)


def summarize(reached: Sequence[Optional[int]], budget: int, level: float = LEVEL) -> dict:
    """One optimizer's steps to target over its seeds, censored runs counted at ``budget``.

    A run that never reached the target took more than ``budget`` steps; counting it at
    ``budget`` makes the mean and both ends of the interval lower bounds (``lower_bound``
    is then True and the tables print ``>=``).

    Args:
      reached: per seed, the steps to target or ``None`` (censored).
      budget: the step budget.
      level: the interval's confidence level.

    Returns:
      A dict: ``values`` (censored at ``budget``), ``censored`` (how many), ``n``,
      ``mean``, ``half_width``, ``lower_bound``.

    >>> s = summarize([100, 120, None], budget=200)
    >>> s['values'], s['censored'], s['lower_bound']
    ([100, 120, 200], 1, True)
    """
    if not reached:
        raise ValueError("summarize: reached must hold one entry per seed, got none.")
    values = [budget if r is None else int(r) for r in reached]
    mean, half = mean_interval(values, level)
    censored = sum(r is None for r in reached)
    return {"values": values, "censored": censored, "n": len(values), "mean": mean,
            "half_width": half, "lower_bound": censored > 0}


def compare(a: dict, b: dict) -> Optional[float]:
    """Welch's p-value for two :func:`summarize` results, ``None`` if it means nothing.

    ``None`` when either has fewer than two seeds, or when every run of both is censored
    (both sit at the budget: nothing was measured).

    Args:
      a: one optimizer's summary.
      b: the other's.

    Returns:
      The two-sided p-value, or ``None``.

    >>> compare(summarize([1, 2, 3], 9), summarize([4, 5, 7], 9)) < 0.1
    True
    """
    if a["n"] < 2 or b["n"] < 2 or (a["censored"] == a["n"] and b["censored"] == b["n"]):
        return None
    return welch_test(a["values"], b["values"])[2]


# ----------------------------------------------------------------------------- tables
def format_steps(s: dict, budget: int) -> str:
    """``mean ± half`` (``≥`` before it when runs were censored; ``> budget`` if all were).

    Args:
      s: a :func:`summarize` result.
      budget: the step budget.

    Returns:
      The table cell.

    >>> format_steps(summarize([100, 120, 110], 300), 300)
    '110 ± 25'
    """
    if s["censored"] == s["n"]:
        return f"> {budget}"
    half = "" if math.isnan(s["half_width"]) else f" ± {s['half_width']:.0f}"
    return ("≥ " if s["lower_bound"] else "") + f"{s['mean']:.0f}{half}"


def format_p(p: Optional[float]) -> str:
    """A p-value for a table: three significant digits, ``< 0.001`` below that, ``-`` if none.

    Args:
      p: the p-value or ``None``.

    Returns:
      The table cell.

    >>> format_p(0.04321), format_p(2e-5), format_p(None)
    ('0.043', '< 0.001', '-')
    """
    if p is None:
        return "-"
    return "< 0.001" if p < 0.001 else f"{p:.2g}" if p < 0.1 else f"{p:.2f}"


def results_table(summary: dict) -> str:
    """The markdown table of a speedrun's JSON: one row per optimizer.

    Its columns: the tuned rate, steps to target, censored runs, the p-values, and the
    optimizer's state on the model in bytes per parameter and as a multiple of AdamW's.

    Args:
      summary: the speedrun's JSON (``meta`` and ``results``).

    Returns:
      The table (no trailing newline).
    """
    budget = summary["meta"]["steps"]
    lines = ["| optimizer | tuned lr | steps to target (mean ± 95% CI) | censored "
             "| p vs adamw | p vs muon | state bytes / param | state x adamw |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, res in summary["results"].items():
        s = res["summary"]
        lines.append(f"| {name} | {res['lr']:g} | {format_steps(s, budget)} | "
                     f"{s['censored']}/{s['n']} | {format_p(res['p_vs_adamw'])} | "
                     f"{format_p(res['p_vs_muon'])} | {res['state_bytes_per_param']:.2f} | "
                     f"{res['state_vs_adamw']:.3f} |")
    return "\n".join(lines)


def readme_block(summary: dict) -> str:
    """The README's speedrun section: one paragraph and a table with one column per optimizer.

    Args:
      summary: the speedrun's JSON.

    Returns:
      Seven lines of markdown (no trailing newline).
    """
    meta, results = summary["meta"], summary["results"]
    budget, target = meta["steps"], meta["target"]
    cfg = meta["config"]
    names, minutes = list(results), meta["total_seconds"] / 60
    cells = lambda f: " | ".join(f(results[n]) for n in names)  # noqa: E731
    return "\n".join([
        f"**Steps to a target, with error bars** (`make speedrun`, {minutes:.0f} minutes "
        f"on {meta['machine']}): a {cfg['n_layer']}-layer character-level GPT "
        f"({meta['n_params'] // 1000}k parameters) on Python's own source, batch {cfg['batch']}, "
        f"{budget} steps, each optimizer at its tuned learning rate; steps to validation loss "
        f"{target} over {len(meta['seeds'])} seeds, mean ± 95% t-interval (≥: runs that never "
        "reached it counted at the budget), Welch's t-test against AdamW and Muon. Method, "
        "grid and plot: [docs/speedrun.md](docs/speedrun.md).",
        "",
        "| `make speedrun` | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
        "| tuned lr | " + cells(lambda r: f"{r['lr']:g}") + " |",
        f"| steps to {target} | " + cells(lambda r: format_steps(r["summary"], budget)) + " |",
        "| p vs adamw / muon | " + cells(
            lambda r: f"{format_p(r['p_vs_adamw'])} / {format_p(r['p_vs_muon'])}") + " |",
    ])


def tuning_table(tuning: dict) -> str:
    """The learning-rate sweep as a markdown table: mean final validation loss per rate.

    Args:
      tuning: ``{optimizer: {"grid": {lr: loss, ...}, "best": lr}}``.

    Returns:
      The table; the chosen rate in bold (no trailing newline).
    """
    grid = sorted({lr for t in tuning.values() for lr in t["grid"]})
    lines = ["| optimizer | " + " | ".join(f"{lr:g}" for lr in grid) + " |",
             "|---|" + "---:|" * len(grid)]
    for name, t in tuning.items():
        cells = []
        for lr in grid:
            loss = t["grid"].get(lr)
            text = "-" if loss is None else "diverged" if not math.isfinite(loss) \
                else f"{loss:.3f}"
            cells.append(f"**{text}**" if lr == t["best"] else text)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def replace_between(text: str, begin: str, end: str, new: str) -> str:
    """``text`` with what lies between the lines ``begin`` and ``end`` replaced by ``new``.

    Args:
      text: the document.
      begin: the marker line before the generated part.
      end: the marker line after it.
      new: the generated part (without the markers).

    Returns:
      The new document.

    >>> replace_between("a\\n<b>\\nold\\n<e>\\nz", "<b>", "<e>", "new")
    'a\\n<b>\\nnew\\n<e>\\nz'
    """
    lines = text.split("\n")
    if begin not in lines or end not in lines:
        raise ValueError(f"replace_between: the markers {begin!r} and {end!r} must each be a "
                         "line of the document.")
    i, j = lines.index(begin), lines.index(end)
    if j < i:
        raise ValueError(f"replace_between: {end!r} comes before {begin!r}.")
    return "\n".join(lines[:i + 1] + new.split("\n") + lines[j:])


def results_page(summary: dict, extra: Sequence[str] = (), stem: str = "speedrun") -> str:
    """``benchmarks/results/speedrun.md``: when, where and how long, and the tables.

    Args:
      summary: the speedrun's JSON.
      extra: more markdown blocks after the table.
      stem: the results' file name (the plot is ``stem``.png).

    Returns:
      The page.
    """
    meta = summary["meta"]
    return (f"# Speedrun results ({meta['date']})\n\n`make speedrun` on {meta['machine']} "
            f"(load average at the start {meta['load']}), Python {meta['python']}, jax "
            f"{meta['jax']}: {meta['total_seconds']:.0f} s of wall time, "
            f"{meta['cpu_seconds']:.0f} s of CPU time. Target {meta['target']}, budget "
            f"{meta['steps']} steps, seeds {meta['seeds']}, learning rates tuned on "
            f"{meta['tuned_on']}. Method: [docs/speedrun.md](../../docs/speedrun.md).\n\n"
            + "\n\n".join([results_table(summary), *extra, f"![speedrun]({stem}.png)"])
            + "\n")


DOCS_BEGIN = "<!-- results: written by examples/speedrun.py -->"
DOCS_END = "<!-- end of results -->"
DOCS_PLOT = ("![each seed's steps to target, and seed 0's validation curves]"
             "(../benchmarks/results/{stem}.png)")
README_FIRST = "**Steps to a target, with error bars**"


def docs_markers(model: str) -> tuple[str, str]:
    """The lines that enclose ``model``'s generated part of docs/speedrun.md.

    >>> docs_markers("medium")[0]
    '<!-- results (medium): written by examples/speedrun.py -->'
    """
    if model == "small":
        return DOCS_BEGIN, DOCS_END
    return (f"<!-- results ({model}): written by examples/speedrun.py -->",
            f"<!-- end of results ({model}) -->")


def docs_block(summary: dict, tuning: dict, extra: Sequence[str] = (),
               stem: str = "speedrun") -> str:
    """What docs/speedrun.md shows between its markers: the tables, the sweep, the plot.

    Args:
      summary: the speedrun's JSON.
      tuning: ``{optimizer: {"grid": {lr: loss}, "best": lr}}``.
      extra: more markdown blocks, after the results table (the track's statistics).
      stem: the results' file name (the plot is ``stem``.png).

    Returns:
      The markdown.
    """
    return "\n\n".join([
        results_table(summary), *extra,
        f"The sweep (mean final validation loss on the tuning seeds after "
        f"{summary['meta']['steps']} steps; bold: chosen, on {summary['meta']['tuned_on']}):",
        tuning_table(tuning), DOCS_PLOT.format(stem=stem)])


def write_docs(summary: dict, root: Path, tuning: dict, extra: Sequence[str] = (),
               model: str = "small", stem: str = "speedrun") -> None:
    """Rewrite ``model``'s tables in ``root``/docs/speedrun.md; the small model's in the README.

    Args:
      summary: the speedrun's JSON, from a full default run.
      root: the repository.
      tuning: as :func:`docs_block` takes it.
      extra: as :func:`docs_block` takes it.
      model: which model's part of the page (:func:`docs_markers`).
      stem: the results' file name.
    """
    page = root / "docs" / "speedrun.md"
    page.write_text(replace_between(page.read_text(), *docs_markers(model),
                                    docs_block(summary, tuning, extra, stem)))
    if model != "small":
        return
    readme = root / "README.md"
    lines = readme.read_text().split("\n")
    first = next(i for i, x in enumerate(lines) if x.startswith(README_FIRST))
    end = first + 2  # the paragraph, a blank line, then the table: its rows start with "|"
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    lines[first:end] = readme_block(summary).split("\n")
    readme.write_text("\n".join(lines))


# ----------------------------------------------------------------------------- plot
def plot(summary: dict, path: Path, colors: dict) -> None:
    """Left: seed 0's validation curves; right: each seed's steps to target, mean ± 95% CI.

    Args:
      summary: the speedrun's JSON.
      path: the PNG to write.
      colors: a matplotlib color per optimizer.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta, results = summary["meta"], summary["results"]
    budget, target = meta["steps"], meta["target"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8),
                                      gridspec_kw={"width_ratios": [1.1, 1]})
    for name, res in results.items():
        run = res["runs"][0]
        left.plot(run["steps"], run["val_loss"], lw=1.5, color=colors.get(name), label=name)
    left.axhline(target, color="gray", ls="--", lw=1)
    left.set_ylim(target - 0.3, target + 1.2)
    left.set_xlabel("step")
    left.set_ylabel("validation loss (nats / character)")
    left.set_title(f"seed {results[next(iter(results))]['runs'][0]['seed']}: validation loss "
                   f"until the target {target}", fontsize=10)
    left.legend(fontsize=7, ncol=2)

    for i, (name, res) in enumerate(results.items()):
        s = res["summary"]
        for r, v in zip(res["runs"], s["values"]):
            censored = r["steps_to_target"] is None
            right.plot(v, i, marker=">" if censored else "o", ls="", ms=5, alpha=0.6,
                       color=colors.get(name), mfc="none" if censored else colors.get(name))
        if s["censored"] < s["n"] and not math.isnan(s["half_width"]):
            right.errorbar(s["mean"], i - 0.25, xerr=s["half_width"], fmt="s", ms=4, capsize=3,
                           color="black")
    right.axvline(budget, color="gray", ls=":", lw=1)
    right.set_xlim(right=budget * 1.05)
    right.set_yticks(range(len(results)), list(results), fontsize=8)
    right.invert_yaxis()
    right.set_xlabel(f"steps to validation loss {target} (open triangle: not reached in "
                     f"{budget}, counted at {budget})")
    right.set_title(f"{len(meta['seeds'])} seeds each; black: mean ± 95% t-interval",
                    fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
