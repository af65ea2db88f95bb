"""The optimization track's statistics for the speedrun: validity and pairwise comparison.

modded-nanogpt's optimization track (records/track_3_optimization/README.md, "Rules") judges a
group of ``n`` runs, each trained the same fixed number of steps ``K``, by their mean final
validation loss:

* **Validity**: the group reaches the target at ``K`` if a one-sided test rejects "mean loss
  >= target" at p < 0.001. The track knows its run-to-run spread (sigma = 0.0013 on its
  model), so its test is a z-test, ``(target - mean) sqrt(n) >= 3.09 sigma``. The speedrun's
  model is another one, with no spread known in advance, so :func:`track_valid` uses each
  group's own sample standard deviation ``s`` and Student's t quantile in place of 3.09:
  ``(target - mean) sqrt(n) >= t_{0.999, n-1} s`` (4.30 s for ten seeds: stricter than a
  z-test would be). Runs are never stopped on their own validation loss (the track's rule
  5); the step reported is the earliest evaluation step at which the group passes, as the
  track allows.
* **Pairwise comparison**: is A better than B at the same step budget? The track's rule is
  ``(mean_B - mean_A) / sqrt(1/n_A + 1/n_B) >= 3.09 sigma`` at equal steps; here
  :func:`lower_p`, Welch's one-sided t-test of "A's mean loss is below B's", at the step
  where A first passes validity (the question the track asks of a new record: could B have
  reached the same loss in the same number of steps?).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

import speedrun_results as results_lib

ALPHA = 0.001  # the track's significance level for validity and pairwise claims


def losses_at_grid(runs: Sequence[dict], every: int, budget: int) -> tuple[list, np.ndarray]:
    """Every run's validation loss at the evaluation steps they all share.

    Args:
      runs: the runs (``steps`` and ``val_loss`` curves, trained to the budget).
      every: the evaluation period.
      budget: the last step.

    Returns:
      ``(steps, losses)``: the steps ``every, 2 every, ...`` and ``budget``, and an array
      ``(runs, steps)``; a run that diverged (or stopped) has ``inf`` where it has no loss.

    >>> steps, x = losses_at_grid([{'steps': [0, 5, 10], 'val_loss': [3., 2., 1.]}], 5, 10)
    >>> steps, x.tolist()
    ([5, 10], [[2.0, 1.0]])
    """
    grid = sorted(set(range(every, budget + 1, every)) | {budget})
    out = np.full((len(runs), len(grid)), np.inf)
    for i, run in enumerate(runs):
        at = dict(zip(run["steps"], run["val_loss"]))
        for j, step in enumerate(grid):
            loss = at.get(step, math.inf)
            out[i, j] = loss if math.isfinite(loss) else math.inf
    return grid, out


def track_valid(steps: Sequence[int], losses: np.ndarray, target: float,
                alpha: float = ALPHA) -> dict:
    """The earliest step at which the group's mean loss is significantly below ``target``.

    Args:
      steps: the evaluation steps (increasing).
      losses: ``(runs, steps)`` validation losses (``inf``: no loss, never valid).
      target: the validation loss to beat.
      alpha: the one-sided test's level.

    Returns:
      A dict: ``step`` (or ``None`` if no step passes), ``mean`` and ``sd`` of the losses
      there (at the last step if none passes), ``n``.

    >>> x = np.array([[2.5, 2.0], [2.6, 2.01], [2.4, 1.99]])
    >>> track_valid([10, 20], x, 2.25)['step']
    20
    """
    n = losses.shape[0]
    if n < 2:
        raise ValueError(f"track_valid: a test needs at least two runs, got {n}.")
    threshold = results_lib.t_quantile(1.0 - alpha, n - 1)
    for j, step in enumerate(steps):
        col = losses[:, j]
        if not np.all(np.isfinite(col)):
            continue
        mean, sd = float(col.mean()), float(col.std(ddof=1))
        if (target - mean) * math.sqrt(n) >= threshold * sd and mean < target:
            return {"step": int(step), "mean": mean, "sd": sd, "n": n}
    col = losses[:, -1]
    return {"step": None, "mean": float(col.mean()), "sd": float(col.std(ddof=1)), "n": n}


def lower_p(x: Sequence[float], y: Sequence[float]) -> float:
    """Welch's one-sided p-value for "the mean of ``x`` is below the mean of ``y``".

    Args:
      x: one group's losses (at least two).
      y: the other's, at the same step.

    Returns:
      The p-value; ``0`` or ``1`` where both groups are constant; ``1`` where ``x`` has a
      non-finite loss, ``0`` where only ``y`` has.

    >>> lower_p([1.0, 1.1, 0.9], [2.0, 2.1, 1.9]) < 0.001
    True
    """
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if not np.all(np.isfinite(x)):
        return 1.0
    if not np.all(np.isfinite(y)):
        return 0.0
    t, _, p_two = results_lib.welch_test(x, y)
    return p_two / 2.0 if t < 0 else 1.0 - p_two / 2.0


def add_track_statistics(results: dict, every: int, budget: int, target: float,
                         refs: Sequence[str] = ("adamw", "muon")) -> None:
    """Add ``track`` to each optimizer's result: validity, final loss, pairwise p-values.

    The pairwise p-values are taken twice: at the step where the row first passes validity
    (``p_lower_than``; its last step if never) and at the budget (``p_lower_at_budget``),
    the one step every row shares.

    Args:
      results: per optimizer, its result with ``runs`` trained to the budget.
      every: the evaluation period.
      budget: the step budget.
      target: the validation loss to beat.
      refs: the optimizers each one is compared with (those present).
    """
    grids = {name: losses_at_grid(res["runs"], every, budget) for name, res in results.items()}
    for name, res in results.items():
        steps, losses = grids[name]
        valid = track_valid(steps, losses, target)
        at = steps.index(valid["step"]) if valid["step"] is not None else len(steps) - 1
        final = losses[:, -1]
        others = [ref for ref in refs if ref in results and ref != name]
        res["track"] = {
            **valid,
            "final": (results_lib.mean_interval(final.tolist()) if np.all(np.isfinite(final))
                      else (math.inf, math.nan)),
            "p_lower_than": {ref: lower_p(losses[:, at], grids[ref][1][:, at])
                             for ref in others},
            "p_lower_at_budget": {ref: lower_p(final, grids[ref][1][:, -1]) for ref in others}}


def format_valid(track: dict) -> str:
    """The validity cell: the step and the mean loss there, or ``-`` (never valid)."""
    if track["step"] is None:
        return "-"
    return f"{track['step']} ({track['mean']:.3f})"


def track_table(summary: dict) -> str:
    """The markdown table of the track's statistics, one row per optimizer.

    Args:
      summary: the speedrun's JSON, each result with ``track`` (:func:`add_track_statistics`).

    Returns:
      The table (no trailing newline).
    """
    budget = summary["meta"]["steps"]
    lines = [f"| optimizer | final loss at {budget} (mean ± 95% CI) | p lower than adamw / muon "
             f"at {budget} | valid at step (mean loss) | p lower than adamw / muon there |",
             "|---|---:|---:|---:|---:|"]
    for name, res in summary["results"].items():
        tr = res["track"]
        mean, half = tr["final"]
        final = "diverged" if not math.isfinite(mean) else f"{mean:.3f} ± {half:.3f}"
        cells = [" / ".join(results_lib.format_p(tr[key].get(ref)) for ref in ("adamw", "muon"))
                 for key in ("p_lower_at_budget", "p_lower_than")]
        lines.append(f"| {name} | {final} | {cells[0]} | {format_valid(tr)} | {cells[1]} |")
    return "\n".join(lines)


def speedup_verdict(summary: dict, name: str = "record_recipe", ref: str = "muon",
                    goal: float = 0.15) -> Optional[str]:
    """One sentence: ``name``'s steps to target against ``ref``'s, and the goal's verdict.

    Args:
      summary: the speedrun's JSON.
      name: the challenger.
      ref: the reference.
      goal: the fraction of the reference's steps to save, with Welch's p < ``ALPHA``.

    Returns:
      The sentence, or ``None`` when either is missing from the run.
    """
    res = summary["results"]
    if name not in res or ref not in res:
        return None
    a, b = res[name]["summary"], res[ref]["summary"]
    saved = 1.0 - a["mean"] / b["mean"]
    p = results_lib.welch_test(a["values"], b["values"])[2]
    met = saved >= goal and p < ALPHA
    ta, tb = res[name]["track"], res[ref]["track"]
    va, vb = ta["step"], tb["step"]
    gap = tb["final"][0] - ta["final"][0]
    return (f"{name} against {ref}: {saved:+.1%} of {ref}'s mean steps to target saved "
            f"(Welch p {results_lib.format_p(p)}); the goal, at least {goal:.0%} with p < "
            f"{ALPHA}, is {'met' if met else 'not met'}. By the track's test the groups are "
            f"valid at steps {va if va is not None else '-'} and "
            f"{vb if vb is not None else '-'}. At the budget, {name}'s mean loss is "
            f"{abs(gap):.3f} {'below' if gap >= 0 else 'above'} {ref}'s (one-sided p "
            f"{results_lib.format_p(ta['p_lower_at_budget'].get(ref))} that it is lower).")
