"""The benchmark script still runs: a tiny run of benchmarks/run.py (never timed).

Timings are the benchmark's business (``make bench``); this test only checks that
the script runs end to end on tiny trees and writes its JSON with the keys the
README and the plot read.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.long
def test_bench_script_runs_and_writes_json(tmp_path):
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "run.py"),
           "--sizes", "4k", "--trees", "1,10", "--opts", "adam,lamb",
           "--reps", "2", "--min-time", "0", "--out", str(tmp_path), "--name", "smoke",
           "--no-plot"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "step functrain/optax" in proc.stdout  # the table was printed

    with open(tmp_path / "smoke.json") as f:
        results = json.load(f)
    assert results["schema"] == "functrain-bench/1"
    assert {"machine", "config", "cases", "date", "wall_s"} <= set(results)
    assert results["config"]["libs"] == ["functrain", "optax"]
    cases = results["cases"]
    assert [(c["opt"], c["tree"]) for c in cases] == [
        ("adam", "1"), ("lamb", "1"), ("adam", "10"), ("lamb", "10")]
    for c in cases:
        assert {"params", "leaves", "floor_s", "bandwidth_bytes_per_s", "ratios",
                "max_rel_diff_vs_first", "libs"} <= set(c)
        assert c["leaves"] == int(c["tree"])
        assert set(c["libs"]) == {"functrain", "optax"}
        for r in c["libs"].values():
            assert {"step_s", "params_per_s", "bw_fraction", "lower_s", "compile_s",
                    "total_compile_s", "peak_bytes", "temp_bytes"} <= set(r)
            assert r["step_s"] > 0 and r["peak_bytes"] > 0
        assert {"step", "compile", "peak_mem"} <= set(c["ratios"])
        # Same steps from the same inputs: functrain and optax agree to float32 rounding.
        assert c["max_rel_diff_vs_first"]["optax"] < 1e-4
    assert (tmp_path / "smoke.md").read_text().count("|") > 10


def test_matrix_benchmark_counts_loops_conditionals_and_lapack():
    # benchmarks/matrix_optimizers.py's flop count, against hand-counted programs: a
    # Newton-Schulz-like loop of 5 (8, 8) matmuls, a conditional, an eigh.
    import jax
    import jax.numpy as jnp
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from matrix_optimizers import counted_flops

    x = jnp.ones((8, 8))
    loop = jax.make_jaxpr(lambda x: jax.lax.fori_loop(0, 5, lambda i, y: y @ y, x))(x)
    assert counted_flops(loop) == 5 * 2 * 8 ** 3
    cond = jax.make_jaxpr(lambda x, p: jax.lax.cond(p, lambda y: y @ y @ y, lambda y: y @ y,
                                                    x))(x, True)
    assert counted_flops(cond) == 2 * 2 * 8 ** 3                      # the costliest branch
    assert counted_flops(cond, {2: (0.5, 0.5)}) == 1.5 * 2 * 8 ** 3  # weighted
    eigh = jax.make_jaxpr(lambda x: jnp.linalg.eigh(x)[0])(jnp.ones((3, 8, 8)))
    assert counted_flops(eigh) == 3 * 9 * 8 ** 3
    from matrix_optimizers import flops_by_kind
    both = jax.make_jaxpr(lambda x: jnp.linalg.eigh(x @ x)[0])(jnp.ones((3, 8, 8)))
    assert flops_by_kind(both) == {"matmul": 3 * 2 * 8 ** 3, "eigh": 3 * 9 * 8 ** 3,
                                   "qr": 0.0, "triangular_solve": 0.0}


@pytest.mark.long
def test_memory_options_benchmark_runs_and_writes_its_table(tmp_path):
    # benchmarks/memory_options.py end to end on the speedrun's tiny model (never timed:
    # make bench). XLA's backend optimizations are off: compiling is most of the time.
    options = ("adamw float32", "adamw bf16", "adamw 8-bit", "apollo_mini")
    env = {**os.environ, "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "")
                                       + " --xla_backend_optimization_level=0").strip()}
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "memory_options.py"), "--tiny",
           "--options", ",".join(options), "--seeds", "0,1", "--processes", "1",
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "memory_options.json").read_text())
    rows = {r["option"]: r for r in result["rows"]}
    assert tuple(rows) == options
    n = result["meta"]["n_params"]
    # By hand: two moments per parameter (4 or 2 bytes each) and two int32 counts (AdamW's
    # and the learning-rate multiplier's).
    assert rows["adamw float32"]["state_bytes"] == 8 * n + 8
    assert rows["adamw bf16"]["state_bytes"] == 4 * n + 8
    for r in rows.values():
        assert r["state_bytes_per_param"] == r["state_bytes"] / n
        assert r["state_vs_adamw"] == r["state_bytes"] / (8 * n + 8)
        assert len(r["final_val_loss"]) == 2 and r["final_mean"] == sum(r["final_val_loss"]) / 2
        assert all(0 < x < 5 for x in r["final_val_loss"])  # trained: below ln(96) + margin
        assert r["opt_ratios"] and r["opt_step_ms"] > 0
    assert rows["adamw float32"]["opt_ratio"] == 1.0 == rows["adamw float32"]["train_ratio"]
    assert rows["adamw 8-bit"]["state_vs_adamw"] < 1
    assert rows["apollo_mini"]["state_vs_adamw"] < 0.1
    table = (tmp_path / "memory_options.md").read_text()
    assert all(f"| {o} |" in table for o in options) and table in proc.stdout
    assert (tmp_path / "memory_options.png").stat().st_size > 0


@pytest.mark.long
def test_stacked_compile_benchmark_writes_depth_and_scanned_model_tables(tmp_path):
    # benchmarks/stacked_compile.py at tiny sizes: its tables and JSON (never timed here).
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "stacked_compile.py"),
           "--layers", "2", "--opts", "adam,soap", "--scanned-layers", "2",
           "--scanned-width", "8", "--scanned-steps", "2", "--scanned-opts", "adamw,muon",
           "--out", str(tmp_path), "--name", "smoke"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    with open(tmp_path / "smoke.json") as f:
        results = json.load(f)
    assert {"date", "machine", "repeats", "depth", "scanned_model", "loadavg_at_end"} <= set(
        results)
    assert "loadavg_at_start" in results["machine"]
    assert [(r["optimizer"], r["layers"]) for r in results["depth"]] == [("adam", 2),
                                                                         ("soap", 2)]
    for r in results["depth"]:
        assert len(r["unstacked"]) == len(r["stacked"]) == 3  # lower s, compile s, computations
    rows = results["scanned_model"]["rows"]
    assert list(rows) == ["adamw", "muon"]
    for r in rows.values():
        assert r["scanned"]["step_s"] > 0 and r["unrolled"]["step_s"] > 0
        # 2 layers: each per-layer weight's state is one stacked array instead of two
        assert r["scanned"]["state_leaves"] < r["unrolled"]["state_leaves"]
    text = (tmp_path / "smoke.md").read_text()
    assert "Compile time against depth" in text and "Scanned model: train step" in text


@pytest.mark.long
def test_bf16_long_run_writes_its_rate_s_results_and_curves(tmp_path):
    # --long on the tiny model: the chosen configurations at the chosen rate, evaluated every
    # STEPS / 40 steps, the first configuration the reference, the curves' plot written
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "bf16_quality.py"), "--tiny",
           "--long", "40", "--lr", "2e-4", "--configs", "float32 adamw",
           "bf16, no compensation", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "bf16_long_lr0.0002.json").read_text())
    assert result["meta"]["lr"] == 2e-4 and result["meta"]["steps"] == 40
    assert list(result["runs"]) == ["float32 adamw", "bf16, no compensation"]
    assert result["runs"]["float32 adamw"][0]["steps"] == list(range(0, 41))
    assert result["rows"][0]["p_final"] is None and result["rows"][1]["p_final"] is not None
    assert (tmp_path / "bf16_long_lr0.0002.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.long
def test_bf16_quality_benchmark_runs_and_its_table_follows_from_its_runs(tmp_path):
    # benchmarks/bf16_quality.py on the speedrun's tiny model: every configuration trains
    # (from the same initialization), and the table's statistics are the runs'.
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "bf16_quality.py"), "--tiny",
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import speedrun_results as stats
    result = json.loads((tmp_path / "bf16_quality.json").read_text())
    runs, rows = result["runs"], {r["config"]: r for r in result["rows"]}
    starts = {label: [r["val_loss"][0] for r in rs] for label, rs in runs.items()}
    f32 = starts["float32 adamw"]
    for label, rs in runs.items():
        # the bfloat16 rows start from the float32 init rounded to bfloat16: close to it
        assert np.allclose(starts[label], f32, atol=2e-2), label
        assert all(r["final_val_loss"] < r["val_loss"][0] for r in rs), label  # trained
        final = [r["final_val_loss"] for r in rs]
        assert tuple(rows[label]["final"]) == stats.mean_interval(final), label
    assert rows["float32 adamw"]["p_final"] is None
    table = (tmp_path / "bf16_quality.md").read_text()
    assert all(f"| {label} |" in table for label in runs)
