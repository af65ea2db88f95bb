"""`make speedrun`'s script (examples/speedrun.py), at its --tiny size.

Every one of the six optimizers must lower the validation loss of the small character
model within a few steps (nothing is asserted about which is fastest), and the script
must write its table, plot and JSON. Asking for an optimizer functrain does not have
fails before anything is trained, with an error that names it.
"""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import functrain

ROOT = Path(__file__).resolve().parent.parent
ALL_SIX = ("adamw", "muon", "soap", "shampoo", "kron", "schedule_free_adamw")


def load_script():
    spec = importlib.util.spec_from_file_location("examples_speedrun", ROOT / "examples" / "speedrun.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["examples_speedrun"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_tiny_speedrun_lowers_validation_loss_for_every_optimizer(tmp_path):
    # A subprocess, run as `make speedrun` runs it; XLA's backend optimizations are
    # switched off there: compilation is most of this test's time (same numbers).
    env = {**os.environ, "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "")
                                       + " --xla_backend_optimization_level=0").strip()}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "speedrun.py"), "--tiny", "--quiet",
         "--out", str(tmp_path), "--opts", ",".join(ALL_SIX)],
        capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "speedrun.json").read_text())
    tiny_steps = load_script().TINY.steps
    results = summary["results"]
    assert tuple(results) == ALL_SIX
    first = {name: res["val_loss"][0] for name, res in results.items()}
    # Same initialization for every optimizer: the same starting validation loss, about
    # ln(vocabulary) for a near-uniform prediction.
    assert max(first.values()) - min(first.values()) < 1e-6
    assert abs(first["adamw"] - math.log(summary["meta"]["vocab"])) < 0.1
    for name, res in results.items():
        assert res["steps"][-1] == tiny_steps, name
        assert all(math.isfinite(x) for x in res["val_loss"]), (name, res["val_loss"])
        assert res["final_val_loss"] < res["val_loss"][0] - 0.005, (name, res["val_loss"])
    table = (tmp_path / "speedrun.md").read_text()
    assert all(f"| {name} |" in table for name in ALL_SIX)
    assert (tmp_path / "speedrun.png").stat().st_size > 0


def test_missing_or_unknown_optimizer_is_named_before_training(tmp_path, monkeypatch):
    speedrun = load_script()  # in-process: the error comes before any training
    monkeypatch.delattr(functrain.contrib, "kron")
    with pytest.raises(ValueError, match=r"'kron' needs functrain\.contrib\.kron"):
        speedrun.main(["--tiny", "--out", str(tmp_path), "--opts", "adamw,kron"])
    with pytest.raises(ValueError, match=r"unknown optimizer 'lion2'"):
        speedrun.main(["--tiny", "--out", str(tmp_path), "--opts", "lion2"])
    assert not list(tmp_path.iterdir())  # nothing was trained or written
