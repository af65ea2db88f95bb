"""benchmarks/capacity.py: the model's parameter count, the ladder's bisection, and (``long``:
the CUDA venv) the H100 compiler's argument bytes against a hand count of params, optimizer
state and batch."""

from __future__ import annotations

import json
import shutil
import math
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import capacity  # noqa: E402
import capacity_report  # noqa: E402

CUDA_PYTHON = os.path.join(ROOT, ".venv-accel-cuda", "bin", "python")


def _leaves(shapes: dict) -> list:
    out = []
    for value in shapes.values():
        out.extend(_leaves(value) if isinstance(value, dict) else [value])
    return out


@pytest.mark.parametrize("d_model,n_layers,vocab",
                         [(128, 1, 50), (256, 2, 1024), (2304, 13, 32768), (6912, 52, 32768)])
def test_param_count_is_the_sum_of_the_shapes(d_model, n_layers, vocab):
    shapes = _leaves(capacity.param_shapes(d_model, n_layers, vocab))
    assert len(shapes) == 11
    assert capacity.param_count(d_model, n_layers, vocab) == sum(
        int(np.prod(s, dtype=np.int64)) for s in shapes)


def test_width_must_be_whole_heads():
    with pytest.raises(ValueError, match="multiple of 128"):
        capacity.param_shapes(200, 2)


def test_ladder_grows_by_about_the_ratio_within_the_widths():
    sizes = capacity.ladder()
    counts = [capacity.param_count(d, n) for d, n in sizes]
    assert all(b > a for a, b in zip(counts, counts[1:]))
    assert 0.9e9 <= counts[0] <= 1.1e9
    assert all(1.15 < b / a < 1.45 for a, b in zip(counts, counts[1:])), counts
    assert all(2048 <= d <= 8192 and d % 256 == 0 for d, _ in sizes)


@pytest.mark.parametrize("threshold", [0, 5, 13, 99])
def test_bisection_finds_the_largest_fitting_rung_in_few_compiles(threshold):
    # a fake compile: the rung fits while its index is below the threshold
    sizes = [(128 * (i + 1), 1) for i in range(14)]
    compiled = []

    def compile_one(config, d, n):
        compiled.append(d)
        return {"config": config, "d_model": d, "n_layers": n, "params": d,
                "fits": d // 128 - 1 < threshold, "peak_bytes": 0, "argument_bytes": 0,
                "temp_bytes": 0, "compile_s": 0.0}

    best, rows = capacity.largest_fitting("x", sizes, compile_one, log=lambda line: None)
    assert best == min(threshold, len(sizes)) - 1
    assert len(compiled) <= math.ceil(math.log2(len(sizes) + 1))
    if 0 <= best < len(sizes) - 1:  # both sides of the edge were compiled
        assert {r["rung"] for r in rows} >= {best, best + 1}


def test_a_failed_compile_counts_as_not_fitting():
    def compile_one(config, d, n):
        if d > 256:
            raise RuntimeError("out of something")
        return {"config": config, "d_model": d, "n_layers": n, "params": d, "fits": True,
                "peak_bytes": 0, "argument_bytes": 0, "temp_bytes": 0, "compile_s": 0.0}

    best, rows = capacity.largest_fitting("x", [(128, 1), (256, 1), (384, 1), (512, 1)],
                                          compile_one, log=lambda line: None)
    assert best == 1
    assert any("RuntimeError: out of something" in r.get("error", "") for r in rows)


# --------------------------------------------------------------------------
# The H100 compiler's bytes against a hand count
# --------------------------------------------------------------------------

SMALL = dict(d_model=256, n_layers=2, batch=2, seq=128, vocab=1024)
MIN_SIZE = 4096  # quantized_state's default: smaller leaves keep float32 moments


def _hand_state_bytes(config: str, shapes: list) -> int:
    """Optimizer state bytes by hand: adam's int32 count, the moments, the compensation."""
    n = sum(int(np.prod(s)) for s in shapes)
    if config.endswith("float32 params"):
        return 4 + 2 * 4 * n  # count, mu and nu in float32
    if config == "bf16 params + bf16 compensation":
        return 4 + 2 * 4 * n + 2 * n  # count, float32 moments, bf16 compensation
    bits = 8 if config.endswith("8-bit moments") else 4
    total = 4 + 1 * n  # count, int8 compensation
    for shape in shapes:
        size = int(np.prod(shape))
        if size < MIN_SIZE:
            total += 2 * 4 * size  # both moments kept in float32
            continue
        block = 256 if bits == 8 else 128  # quantized_state's default blocks
        blocks = -(-size // block)  # the flattened leaf zero-padded to whole blocks
        codes = blocks * block * bits // 8
        mu = codes + 4 * blocks  # one float32 absmax per block
        # 4-bit second moments are rank-1 scaled: one float32 maximum per index of each axis
        nu = codes + 4 * (blocks if bits == 8 else sum(shape))
        total += mu + nu
    return total


def _measure_on_h100(configs: list, size: dict) -> list:
    """``capacity.measure`` of each configuration at ``size``, in the CUDA venv (deviceless)."""
    code = ("import sys, json; sys.path.insert(0, 'benchmarks'); import capacity as c; "
            f"print(json.dumps([c.measure(name, **{size!r}) for name in {configs!r}]))")
    done = subprocess.run([CUDA_PYTHON, "-c", code], capture_output=True, text=True,
                          timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.long
def test_h100_argument_bytes_are_params_state_and_batch_by_hand():
    if not os.path.exists(CUDA_PYTHON):
        pytest.skip(f"{CUDA_PYTHON} is missing (make accel builds the CUDA venv): the H100 "
                    f"compiler runs only there")
    configs = ["functrain adamw, float32 params", "bf16 params + bf16 compensation",
               "bf16 params + int8 compensation + 8-bit moments",
               "bf16 params + int8 compensation + 4-bit moments"]
    rows = _measure_on_h100(configs, SMALL)
    shapes = _leaves(capacity.param_shapes(SMALL["d_model"], SMALL["n_layers"],
                                           SMALL["vocab"]))
    n = capacity.param_count(SMALL["d_model"], SMALL["n_layers"], SMALL["vocab"])
    batch_bytes = 2 * SMALL["batch"] * SMALL["seq"] * 4  # int32 inputs and targets
    for config, row in zip(configs, rows):
        assert row["config"] == config and row["params"] == n
        param_bytes = n * (4 if config.endswith("float32 params") else 2)
        state_bytes = _hand_state_bytes(config, shapes)
        assert row["argument_bytes"] == param_bytes + state_bytes + batch_bytes, (config, row)
        # donation: every param and state buffer is reused for the output; besides them the
        # output holds the float32 loss and the output tuple's table of 8-byte pointers
        assert row["alias_bytes"] == param_bytes + state_bytes, (config, row)
        fresh = 4 + 8 * row["output_leaves"]
        assert row["output_bytes"] - row["alias_bytes"] == fresh, (config, row)
        assert row["peak_bytes"] == row["argument_bytes"] + fresh + row["temp_bytes"]
        assert row["temp_bytes"] > 0 and row["fits"]
    per_param = {c: r["persistent_bytes_per_param"] for c, r in zip(configs, rows)}
    assert (per_param["bf16 params + int8 compensation + 4-bit moments"]
            < per_param["bf16 params + int8 compensation + 8-bit moments"]
            < per_param["bf16 params + bf16 compensation"])


def _row(config, params, fits, peak=0, temp=0, rung=0):
    return {"config": config, "d_model": 2048, "n_layers": 8, "params": params, "fits": fits,
            "peak_bytes": peak, "argument_bytes": 12 * params, "temp_bytes": temp,
            "persistent_bytes_per_param": 12.0, "compile_s": 0.0, "rung": rung}


def test_table_gives_the_largest_fit_its_next_rung_and_its_ratio_to_optax():
    base = _row(capacity.BASELINE, 2 * 10**9, True, peak=60 * 2**30, temp=20 * 2**30)
    low = _row("low", 3 * 10**9, True, peak=70 * 2**30, temp=30 * 2**30, rung=1)
    results = {
        capacity.BASELINE: {"rows": [base, _row(capacity.BASELINE, 3 * 10**9, False,
                                                peak=90 * 2**30, rung=1)],
                            "best_row": base, "reference_row": {"temp_bytes": 21 * 2**30},
                            "update_row": {"temp_bytes": 0}},
        "low": {"rows": [low], "best_row": low,
                "reference_row": {"temp_bytes": 22 * 2**30},
                "update_row": {"temp_bytes": 9 * 2**30}},
        "none": {"rows": [_row("none", 10**9, False, peak=99 * 2**30)], "best_row": None,
                 "reference_row": None, "update_row": None}}
    text = capacity_report.table(results, capacity.BASELINE)
    assert ("| optax adamw, float32 params | 2048 x 8 | 2.00 | 60.0 | 12.00 | 20.0 | -1.0 | "
            "0.0 | 3.00, 90.0 | 1.00 |") in text
    assert ("| low | 2048 x 8 | 3.00 | 70.0 | 12.00 | 30.0 | 8.0 | 9.0 | (ladder top fits) | "
            "1.50 |") in text
    assert "| none | none on the ladder | | | | | | | 1.00, 99.0 | |" in text


@pytest.mark.long
def test_quick_run_writes_the_table_and_the_ladder_rows(tmp_path):
    if not os.path.exists(CUDA_PYTHON):
        pytest.skip(f"{CUDA_PYTHON} is missing (make accel builds the CUDA venv): the H100 "
                    f"compiler runs only there")
    config = "functrain adamw, float32 params"
    done = subprocess.run([CUDA_PYTHON, os.path.join(ROOT, "benchmarks", "capacity.py"),
                           "--quick", "--configs", config, "--out", str(tmp_path / "cap")],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads((tmp_path / "cap.json").read_text())
    result = found["results"][config]
    assert result["ladder"] == [list(s) for s in capacity.QUICK_LADDER]
    assert result["best"] == len(capacity.QUICK_LADDER) - 1  # kilobytes fit an H100
    assert result["best_row"]["persistent_bytes_per_param"] == pytest.approx(12.0, rel=0.05)
    assert result["update_row"]["update_only"] and result["reference_row"]["config"] == \
        "sgd, float32 params"
    assert f"| {config} | 384 x 2 |" in (tmp_path / "cap.md").read_text()


def _hand_release_state_bytes(config: str, shapes: dict) -> int:
    """A gradient-release configuration's state by hand: each layer its own count, moments and
    compensation (the quantization blocks and 4-bit scales of one layer's slice), the rest's
    state as an ordinary step's, and the float32 norm of the last gradients."""
    bits = 8 if "8-bit" in config else 4
    plain = f"bf16 params + int8 compensation + {bits}-bit moments"
    layers = list(shapes["layers"].values())
    n_layers = layers[0][0]
    per_layer = _hand_state_bytes(plain, [s[1:] for s in layers])
    rest = [s for k, s in shapes.items() if k != "layers"]
    return n_layers * per_layer + _hand_state_bytes(plain, rest) + 4


@pytest.mark.long
def test_h100_gradient_release_state_by_hand_and_its_smaller_temp():
    if not os.path.exists(CUDA_PYTHON):
        pytest.skip(f"{CUDA_PYTHON} is missing (make accel builds the CUDA venv): the H100 "
                    f"compiler runs only there")
    configs = ["bf16 + int8 compensation + 8-bit moments + gradient release",
               "bf16 + int8 compensation + 4-bit moments + gradient release",
               "bf16 params + int8 compensation + 4-bit moments"]
    size = dict(SMALL, n_layers=4)
    rows = _measure_on_h100(configs, size)
    shapes = capacity.param_shapes(size["d_model"], size["n_layers"], size["vocab"])
    n = capacity.param_count(size["d_model"], size["n_layers"], size["vocab"])
    batch_bytes = 2 * size["batch"] * size["seq"] * 4
    for config, row in zip(configs[:2], rows):
        # without clip_norm the step never reads the last norm, and jit drops an unused
        # argument: its 4 bytes are written (a fresh output) but not passed in
        state_bytes = _hand_release_state_bytes(config, shapes) - 4
        assert row["argument_bytes"] == 2 * n + state_bytes + batch_bytes, (config, row)
        assert row["alias_bytes"] == 2 * n + state_bytes, (config, row)
    # the same optimizer without release holds the whole gradient tree: more temp
    assert rows[1]["temp_bytes"] < rows[2]["temp_bytes"], rows


def test_the_plot_is_drawn_from_the_results_present(tmp_path):
    """capacity_report.write_plot: nothing without results; a PNG from the H100's alone."""
    pytest.importorskip("matplotlib")
    assert capacity_report.write_plot(str(tmp_path)) is None
    shutil.copy(os.path.join(ROOT, "benchmarks", "results", "capacity.json"), tmp_path)
    path = capacity_report.write_plot(str(tmp_path))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
