"""benchmarks/quantized_state.py: its bytes per parameter against a hand count.

The memory part of the benchmark runs on a tiny tree (no compilation, no timing); the
state bytes it reports must equal what the block layout says: per quantized moment one
byte per value (half a byte for 4 bits) over whole blocks plus a float32 absmax per block
(4-bit second moments of matrices: one per row and one per column instead), small leaves
float32, and the int32 step count.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import quantized_state as bench  # noqa: E402

# 300 values: 2 blocks of 256 (512 codes), 3 blocks of 128; 4100: 17 blocks of 256, 33 of 128.
TREE = {"big": jnp.ones((41, 100)), "mid": jnp.ones((3, 100)), "small": jnp.ones(7)}
MIN_SIZE = 300
N = 4100 + 300 + 7


def blocks(n, size):
    return -(-n // size)


def quantized_bytes(n, bits, rank1_shape=None):
    """Codes over whole blocks, and a float32 absmax per block, or with ``rank1_shape``
    one per row and one per column (4-bit second moments of matrices)."""
    size = {8: 256, 4: 128, "fp8": 256}[bits]
    per_value = 0.5 if bits == 4 else 1
    scales = sum(rank1_shape) if rank1_shape else blocks(n, size)
    return int(blocks(n, size) * size * per_value) + 4 * scales


@pytest.mark.parametrize("variant,bits", [("8-bit", 8), ("4-bit", 4), ("fp8", "fp8")])
def test_adamw_bytes_per_param(variant, bits):
    row = bench.memory_row("adamw", variant, TREE, compile_it=False, min_size=MIN_SIZE)
    moment = quantized_bytes(4100, bits) + quantized_bytes(300, bits) + 4 * 7
    if bits == 4:  # nu of the two matrices: rank-1 scales (41 + 100, 3 + 100 maxima)
        nu = (quantized_bytes(4100, bits, (41, 100)) + quantized_bytes(300, bits, (3, 100))
              + 4 * 7)
    else:
        nu = moment
    want = moment + nu + 4  # mu and nu, and the count
    assert row["n_params"] == N
    assert row["state_bytes"] == want
    assert row["state_bytes_per_param"] == pytest.approx(want / N)


def test_hand_count_of_the_8bit_layout():
    # written out once: the counts above, not a formula shared with the code under test
    mu = (17 * 256 + 17 * 4) + (2 * 256 + 2 * 4) + 7 * 4
    assert bench.memory_row("adamw", "8-bit", TREE, compile_it=False,
                            min_size=MIN_SIZE)["state_bytes"] == 2 * mu + 4


@pytest.mark.parametrize("name,moments", [("adamw", 2), ("lion", 1)])
def test_float32_and_bf16(name, moments):
    f32 = bench.memory_row(name, "float32", TREE, compile_it=False, min_size=MIN_SIZE)
    bf16 = bench.memory_row(name, "bf16", TREE, compile_it=False, min_size=MIN_SIZE)
    count = 4  # the int32 step count (Lion keeps one too)
    assert f32["state_bytes"] - count == moments * 4 * N
    assert bf16["state_bytes"] - count == moments * 2 * N


def test_lion_8bit_keeps_small_leaves():
    row = bench.memory_row("lion", "8-bit", TREE, compile_it=False, min_size=MIN_SIZE)
    assert row["state_bytes"] == quantized_bytes(4100, 8) + quantized_bytes(300, 8) + 4 * 7 + 4


def test_compiled_row_has_memory_fields():
    tree = {"w": jnp.ones((64, 64)), "b": jnp.ones(64)}
    row = bench.memory_row("adamw", "8-bit", tree, min_size=1024)
    for field in ("temp_bytes", "output_bytes", "argument_bytes", "peak_bytes"):
        assert row[field] >= 0
    # arguments: params + grads (float32) and the state
    assert row["argument_bytes"] >= 2 * 4 * (64 * 64 + 64) + row["state_bytes"]
