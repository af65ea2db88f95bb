"""The reduced soak (``make soak`` runs the full 10,000 steps): 1,000 steps of adamw, lamb and
muon beside optax (and soap, which optax lacks), and a run saved with Orbax halfway and resumed in a fresh process, which
must end bit-identical to the uninterrupted one. Runs in a fresh process under a timeout.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

# Fresh processes or a whole model: a long check (make test-long, not make test).
pytestmark = pytest.mark.long

SCRIPT = pathlib.Path(__file__).resolve().parent / "soak" / "run_soak.py"


def test_reduced_soak_matches_optax_and_resumes_bit_identically():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick"],
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    for name in ("adamw", "lamb", "muon", "soap"):
        line = next(l for l in out.splitlines() if l.startswith(name))
        assert "resumed bit-identical: True" in line, line
