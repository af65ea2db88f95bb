"""benchmarks/matrix_flops.py: hand counts of the matrix optimizers' flops against programs.

The hand counts against independent counts on tiny cases (formulas by hand, the dots of a
compiled CPU program and XLA's cost analysis of it: the loop counted once, a conditional at its
largest branch), and Muon's H100 program (deviceless, in ``.venv-accel-cuda``, which ``make
accel`` builds) within 1.2x of its hand count.
"""

from __future__ import annotations

import math
import os
import sys

import jax
import jax.numpy as jnp
import pytest

from functrain.linalg import newton_schulz

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import matrix_flops  # noqa: E402

pytestmark = pytest.mark.long


def test_hand_count_terms_by_formula():
    # one Newton-Schulz step on (2, 3): X X^T 2*2*3*2, A A 2*2*2*2, B X 2*2*2*3
    assert matrix_flops.newton_schulz_iteration(2, 3) == {"X X^T": 24, "A A": 16, "B X": 24}
    tree = {"w": (8, 32), "b": (32,)}
    muon = matrix_flops.hand_count("muon", tree)
    assert muon.iterations == 5
    assert matrix_flops.totals(muon) == (4 * 8 * 8 * 32 + 2 * 8 ** 3,
                                         5 * (4 * 8 * 8 * 32 + 2 * 8 ** 3))
    # Muon transposes a tall matrix: (32, 8) costs what (8, 32) does
    assert matrix_flops.hand_count("muon", {"w": (32, 8)}) == muon
    # SOAP: three rotations and two Gram matrices, 2 m n (m + n) each; a power step 2 (m^3 + n^3)
    soap = matrix_flops.hand_count("soap", tree)
    assert sum(soap.every_step.values()) == 4 * 2 * 8 * 32 * 40
    assert sum(soap.refresh.values()) == 2 * (8 ** 3 + 32 ** 3)
    # Shampoo with 128-blocks: 8 b^3 per block every step, 4 b^3 in the refresh
    shampoo = matrix_flops.hand_count("shampoo", {"w": (256, 384)})
    assert sum(shampoo.every_step.values()) == 6 * 8 * 128 ** 3
    assert sum(shampoo.refresh.values()) == 6 * 4 * 128 ** 3
    # Dion at full rank: four (rows, cols, cols) products, every step; one QR
    dion = matrix_flops.hand_count("dion", tree)
    assert sum(dion.every_step.values()) == 4 * 2 * 32 * 8 * 8
    assert sum(dion.decompositions.values()) == pytest.approx(4 * 8 * 8 * (32 - 8 / 3))


def test_newton_schulz_hand_count_matches_the_compiled_dots_on_cpu():
    # functrain's own Newton-Schulz, 3 steps on a (2, 64, 256) stack, compiled for this CPU
    x = jax.ShapeDtypeStruct((2, 64, 256), jnp.float32)
    compiled = jax.jit(lambda x: newton_schulz(x, ns_steps=3)).lower(x).compile()
    census = matrix_flops.dot_census(compiled.as_text())
    one = 2 * sum(matrix_flops.newton_schulz_iteration(64, 256).values())
    assert census["unknown_trip_counts"] == []
    assert census["largest"] == 3 * one  # every dot of the loop, times its trip count
    # the cost analysis: the loop's body once, plus the element-wise work (a few percent)
    assert one < matrix_flops.accel_compile._cost(compiled)["flops"] < 1.05 * one


def test_cost_analysis_counts_a_loop_once_and_a_conditional_at_its_largest_branch():
    a = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    p = jax.ShapeDtypeStruct((), jnp.float32)

    def f(x, y, q):
        z = jax.lax.fori_loop(0, 4, lambda i, z: z @ y, x)
        return jax.lax.cond(q > 0, lambda: z @ y, lambda: ((z @ y) @ y) @ y)

    compiled = jax.jit(f).lower(a, a, p).compile()
    dot = 2 * 64 ** 3
    census = matrix_flops.dot_census(compiled.as_text())
    assert (census["largest"], census["smallest"]) == (7 * dot, 5 * dot)  # 4 + (3 or 1)
    flops = matrix_flops.accel_compile._cost(compiled)["flops"]
    assert flops == pytest.approx(4 * dot, rel=1e-4)  # 1 + 3: the loop once, the larger branch


@pytest.mark.skipif(not os.path.exists(matrix_flops.PYTHON),
                    reason=f"{matrix_flops.PYTHON} is missing (make accel builds the CUDA venv "
                           f"that compiles for a deviceless H100)")
def test_muon_h100_program_within_1_2x_of_the_hand_count():
    out = matrix_flops.run_worker(["quick", "muon"], timeout=300)
    assert "error" not in out, out["error"]
    row = matrix_flops.row("muon", matrix_flops.QUICK, out)
    assert row["params"] == sum(math.prod(s) for s in matrix_flops.QUICK.values())
    # the cost analysis against the hand count as it counts (one Newton-Schulz iteration)
    assert 1 <= row["ratio_cost"] <= matrix_flops.LIMIT
    # the program's dots with the loop's trip count against every iteration's matmuls
    assert row["ratio_dots"] == pytest.approx(1, rel=1e-3)
    assert out["census"]["unknown_trip_counts"] == []
