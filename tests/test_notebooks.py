"""The colabs: every notebook runs top to bottom, and is stored without outputs.

Each notebook in ``colabs/`` is executed in a fresh Jupyter kernel with
nbclient, the way a user runs it from the top. A cell that raises fails the
test, with the cell and its traceback in the message; the notebooks carry
their own checks (``assert`` against optax, hand-derived formulas, the seed
documents' printed numbers), so a wrong number fails here too.

Notebook 5 plots ``benchmarks/results/latest.json``; it is run three ways: as
found in the checkout, with no results file (it must say so and finish), and
with a small results file of known numbers (its target report must match them).

nbclient, nbformat and ipykernel are the ``notebooks`` extra, scikit-learn (for
the digits in notebooks 3 and 6) the ``demo`` extra; ``make test`` installs both. They
are imported at module level: if one is missing this module fails, it is never
skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
import sklearn  # noqa: F401  (notebooks 3 and 6 need it: fail here, clearly, if it is missing)
from nbclient import NotebookClient

import jax
from functrain import jax_compat
from helpers import LAYOUTS_JAX, LAYOUTS_WHY

ROOT = Path(__file__).resolve().parent.parent
COLABS = ROOT / "colabs"
NOTEBOOKS = [
    "01_quickstart.ipynb",
    "02_from_ivy_mlx_mxnet.ipynb",
    "03_lamb_lars_large_batch.ipynb",
    "04_scaling_out.ipynb",
    "05_performance.ipynb",
    "06_muon_schedule_free.ipynb",
    "07_low_bit_state.ipynb",
    "08_gradient_release.ipynb",
]
# Notebooks that must draw at least this many figures.
FIGURES = {"01_quickstart.ipynb": 3, "03_lamb_lars_large_batch.ipynb": 2,
           "04_scaling_out.ipynb": 1, "06_muon_schedule_free.ipynb": 3,
           "07_low_bit_state.ipynb": 2, "08_gradient_release.ipynb": 2}


def execute(name: str) -> nbformat.NotebookNode:
    """Run a notebook top to bottom in a fresh kernel, working directory colabs/."""
    nb = nbformat.read(COLABS / name, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(COLABS)}})
    client.execute()  # raises CellExecutionError (cell source + traceback) on failure
    return nb


def text_of(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(out.text)
            elif "data" in out and "text/plain" in out.data:
                parts.append(out.data["text/plain"])
    return "\n".join(parts)


def figures_in(nb: nbformat.NotebookNode) -> int:
    return sum("image/png" in out.get("data", {})
               for cell in nb.cells for out in cell.get("outputs", []))


def test_every_colab_is_listed():
    assert sorted(p.name for p in COLABS.glob("*.ipynb")) == NOTEBOOKS


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_stored_clean(name):
    nb = nbformat.read(COLABS / name, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{name}: cell {i} is stored with outputs"
            assert cell.execution_count is None, f"{name}: cell {i} has an execution count"


@pytest.mark.parametrize("name", NOTEBOOKS)
@pytest.mark.long
def test_notebook_runs_top_to_bottom(name, monkeypatch):
    if name == "04_scaling_out.ipynb" and not jax_compat.jax_at_least(LAYOUTS_JAX):
        pytest.skip(f"needs JAX >= {LAYOUTS_JAX} (this is {jax.__version__}): its cells assert "
                    f"{LAYOUTS_WHY}")
    monkeypatch.delenv("FUNCTRAIN_BENCH_JSON", raising=False)
    nb = execute(name)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count is not None for c in code)
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    assert figures_in(nb) >= FIGURES.get(name, 0)
    if name == "05_performance.ipynb":
        latest = ROOT / "benchmarks" / "results" / "latest.json"
        if latest.exists():
            cases = len(json.loads(latest.read_text())["cases"])
            assert f"{cases} cases" in text_of(nb)
        else:
            assert "No benchmark results found" in text_of(nb)


def test_performance_notebook_says_when_results_are_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("FUNCTRAIN_BENCH_JSON", str(tmp_path / "missing.json"))
    nb = execute("05_performance.ipynb")
    text = text_of(nb)
    assert f"No benchmark results found at {tmp_path / 'missing.json'}" in text
    assert "make bench" in text
    assert figures_in(nb) == 0


def bench_case(opt, tree, leaves, size, step_ratio, compile_ratio, ft_step, bw):
    """One case in the schema ``benchmarks/run.py`` writes (``functrain-bench/1``)."""
    optax_step = ft_step / step_ratio
    lib = lambda step, compile_s, frac: {  # noqa: E731
        "step_s": step, "step_iqr_s": 0.0, "params_per_s": size / step, "bw_fraction": frac,
        "lower_s": compile_s / 2, "compile_s": compile_s / 2, "total_compile_s": compile_s,
        "temp_bytes": 1000, "peak_bytes": 4000, "hlo_chars": 100}
    return {"opt": opt, "tree": tree, "size": size, "params": size, "leaves": leaves,
            "distinct_shapes": 1, "timed_steps": 5, "bandwidth_bytes_per_s": 1e10,
            "probe_step_s": 1e-3, "floor_s": bw * ft_step, "max_rel_diff_vs_first": {"optax": 0.0},
            "libs": {"functrain": lib(ft_step, 1.0, bw), "optax": lib(optax_step, 1.0 / compile_ratio,
                                                                      bw * step_ratio)},
            "ratios": {"step": step_ratio, "compile": compile_ratio, "peak_mem": 1.0}}


def test_performance_notebook_reports_the_numbers_it_reads(monkeypatch, tmp_path):
    cases = [bench_case("adam", "1", 1, 10**6, 0.90, 0.40, 1e-3, 0.8),
             bench_case("lamb", "1", 1, 10**6, 0.50, 0.20, 1.5e-3, 0.7),
             bench_case("adam", "1000", 1000, 10**6, 0.95, 0.45, 2e-3, 0.5),
             bench_case("lamb", "1000", 1000, 10**6, 0.70, 0.30, 2.4e-3, 0.5),
             bench_case("lamb", "transformer", 170, 10**6, 0.55, 0.20, 2e-3, 0.6)]
    results = {"schema": "functrain-bench/1", "date": "2026-01-01T00:00:00", "wall_s": 1.0,
               "machine": {"cpu": "Test CPU", "cpu_count": 2, "backend": "cpu", "jax": "x",
                           "optax": "y", "functrain": "z", "platform": "p", "python": "3",
                           "devices": ["cpu:0"]},
               "config": {"sizes": [10**6], "trees": ["1", "1000", "transformer"],
                          "opts": ["adam", "lamb"], "libs": ["functrain", "optax"]},
               "cases": cases}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(results))
    monkeypatch.setenv("FUNCTRAIN_BENCH_JSON", str(path))
    nb = execute("05_performance.ipynb")
    text = text_of(nb)
    assert "measured 2026-01-01T00:00:00 on Test CPU (2 cores" in text
    assert "5 cases" in text
    assert figures_in(nb) == 2
    # The target report: worst lamb step ratio 0.70 > 0.6; adam 0.95 <= 1.0; compile at 1000
    # leaves: lamb 0.30 > 0.25, adam 0.45 <= 0.5; worst lamb/adam step 1.5/1.0 = 1.5 <= 1.6.
    assert "MISSED  lamb step time vs optax: worst 0.70 (target <= 0.6)" in text
    assert "met     adam step time vs optax: worst 0.95 (target <= 1.0)" in text
    assert "MISSED  lamb compile time vs optax, 1000 leaves: worst 0.30 (target <= 0.25)" in text
    assert "met     adam compile time vs optax, 1000 leaves: worst 0.45 (target <= 0.5)" in text
    assert "met     functrain lamb step / functrain adam step: worst 1.50 (target <= 1.6)" in text
