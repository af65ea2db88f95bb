"""benchmarks/lightbench.py (``make lightbench``), reduced: every task is hard at its start and
solvable at its known optimum, and the quick run (4 tasks, 3 optimizers, 2 learning rates)
produces the tables, the JSON and the heatmap, with AdamW solving the ill-conditioned
quadratic and Rosenbrock (which a correct Adam does in the budget) and no optimizer
reported as solving a task it did not.
"""

from __future__ import annotations

import json
import pathlib
import sys

import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

import lightbench  # noqa: E402
from lightbench_tasks import TASKS  # noqa: E402

KNOWN_OPTIMA = {
    "rosenbrock": {"xy": jnp.array([1.0, 1.0])},
    "beale": {"xy": jnp.array([3.0, 0.5])},
    "rastrigin": {"x": jnp.zeros(4)},
    "saddle": {"xy": jnp.array([0.0, np.sqrt(2.0)])},
}


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
@pytest.mark.long
def test_tasks_start_unsolved(task):
    assert float(task.evaluate(task.init())) > task.target, task.name


@pytest.mark.parametrize("name", sorted(KNOWN_OPTIMA))
def test_analytic_tasks_are_solved_at_their_optimum(name):
    task = {t.name: t for t in TASKS}[name]
    assert float(task.evaluate(KNOWN_OPTIMA[name])) <= task.target


def test_quick_run_writes_tables_and_heatmap(tmp_path):
    results = lightbench.main(["--quick", "--out", str(tmp_path)])
    for name in lightbench.QUICK_TASKS:
        row = results["tasks"][name]["results"]
        for opt, r in row.items():
            if r["solved"]:
                assert r["best"] <= results["tasks"][name]["target"], (name, opt)
    assert results["tasks"]["quadratic_cond1e4"]["results"]["adamw"]["solved"]
    assert results["schedules"] == ["constant", "cosine"]
    for t in results["tasks"].values():  # solved exactly when some schedule solved it
        for r in t["results"].values():
            assert r["solved"] == bool(r["solved_with"]) and r["best_schedule"] in (
                "constant", "cosine")
    assert results["tasks"]["rosenbrock"]["results"]["adamw"]["solved"]
    table = (tmp_path / "lightbench.md").read_text()
    assert "| adamw |" in table and "72.3%" in table  # LightBench's published row beside ours
    assert json.loads((tmp_path / "lightbench.json").read_text())["tasks"].keys() == set(
        lightbench.QUICK_TASKS)
    assert (tmp_path / "lightbench.png").stat().st_size > 1000


def test_unknown_names_are_refused(capsys):
    with pytest.raises(SystemExit):
        lightbench.main(["--opts", "adamw,nosuch", "--no-plot"])
    assert "nosuch" in capsys.readouterr().err


def test_cosine_schedule_decays_to_zero_at_the_budget():
    """The run's schedule: the grid's rate at step 0, half of it halfway, 0 at the end (and
    the rate itself throughout with decay 0), read through sgd's update of a linear loss."""
    task = lightbench.Task(name="linear", kind="test", init=lambda: {"x": jnp.zeros(())},
                           loss=lambda p, k: p["x"], evaluate=lambda p: p["x"], target=0.0,
                           steps=100)
    run = lightbench.make_run(task, lambda lr: lightbench.functrain.sgd(lr))
    constant = float(run(jnp.asarray(0.1), jnp.asarray(0.0), lightbench.jax.random.PRNGKey(0)))
    cosine = float(run(jnp.asarray(0.1), jnp.asarray(1.0), lightbench.jax.random.PRNGKey(0)))
    want = -sum(0.1 * 0.5 * (1 + np.cos(np.pi * t / 100)) for t in range(100))
    np.testing.assert_allclose(constant, -0.1 * 100, rtol=1e-5)
    np.testing.assert_allclose(cosine, want, rtol=1e-5)
