"""`make demo`'s script, run as a newcomer would: it must reach >= 95% test accuracy."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Fresh processes or a whole model: a long check (make test-long, not make test).
pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parent.parent


def test_demo_trains_digits_to_95_percent(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--quiet", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["lamb"]["test_accuracy"] >= 0.95
    assert summary["adam"]["test_accuracy"] >= 0.9
    assert (tmp_path / "demo_loss.png").stat().st_size > 0
