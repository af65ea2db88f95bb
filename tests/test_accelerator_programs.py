"""Nothing CPU-only in the programs lowered for GPU and TPU, and each its own path there.

functrain has three rewrites for XLA:CPU: the trust-ratio recompute (a copy of LAMB's
direction with its constants behind an optimization barrier, engine/recompute.py), one
LAPACK call per matrix (``linalg.map_matrices``: a ``lax.map`` loop), and the dynamic codes'
table lookups (kept on GPU too; computed on TPU, functrain/code_arithmetic.py); and one for
the TPU: the 4-bit codes' pairs packed by strided slices, not a bitcast through a trailing
axis of 2. Each is
picked when the program is lowered (``lax.platform_dependent``), so a program lowered for
another platform holds none of it even when it is traced on a CPU machine. ``jax.export``
lowers for a platform this machine does not have; the checks read its StableHLO.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from jax import export

import functrain
from functrain import jax_compat
from functrain.engine import recompute

PLATFORMS = ("cpu", "cuda", "tpu")

# Older JAX lowers every branch of lax.platform_dependent (a conditional on the platform
# index, resolved when XLA compiles), so their lowered text holds the CPU branch too; JAX
# 0.10.2 lowers the chosen branch only (the versions between were not checked).
pytestmark = pytest.mark.skipif(
    not jax_compat.jax_at_least("0.10.2"),
    reason=f"needs JAX >= 0.10.2 (this is {jax.__version__}): older JAX lowers every "
           "branch of lax.platform_dependent and leaves the choice to the compiler")


def lowered_for(opt, params) -> dict:
    """platform -> the StableHLO text of ``opt``'s update lowered for it."""
    state = opt.init(params)
    step = jax.jit(lambda g, s, p: opt.update(g, s, p))
    return {platform: export.export(step, platforms=(platform,))(
        params, state, params).mlir_module() for platform in PLATFORMS}


def test_trust_ratio_recompute_is_lowered_for_cpu_only(monkeypatch):
    monkeypatch.setattr(recompute, "MIN_BYTES", 0)
    text = lowered_for(functrain.lamb(1e-3), {"w": jnp.ones((64, 64)), "b": jnp.ones(64)})
    if jax_compat.jax_at_least(recompute.MIN_JAX):
        assert "optimization_barrier" in text["cpu"]
    for platform in ("cuda", "tpu"):
        assert "optimization_barrier" not in text[platform], platform


def test_one_lapack_call_per_matrix_is_lowered_for_cpu_only():
    # CPU: a lax.map loop around single-matrix LAPACK calls; GPU and TPU: one batched
    # decomposition, no loop
    text = lowered_for(functrain.contrib.shampoo(1e-3, block_size=32),
                       {"w": jnp.ones((64, 64)), "b": jnp.ones(64)})
    lapack = re.compile(r"custom_call @lapack_")
    assert "stablehlo.while" in text["cpu"] and lapack.search(text["cpu"])
    for platform in ("cuda", "tpu"):
        assert "stablehlo.while" not in text[platform], platform
        assert not lapack.search(text[platform]), platform


@pytest.mark.parametrize("name", ["adamw_8bit", "adamw_4bit"])
def test_codes_are_looked_up_on_cpu_and_gpu_and_computed_on_tpu(name):
    text = lowered_for(getattr(functrain, name)(1e-3), {"w": jnp.ones((512, 512))})
    assert "gather" in text["cpu"] and "gather" in text["cuda"]
    assert "gather" not in text["tpu"]


def test_nibble_pairs_are_bitcast_on_cpu_and_gpu_and_sliced_on_tpu():
    # CPU and GPU: bytes paired into uint16 words through a trailing axis of 2; TPU, which
    # pads that axis to 128 lanes: strided slices and interior padding
    text = lowered_for(functrain.adamw_4bit(1e-3), {"w": jnp.ones((512, 512))})
    pairs = re.compile(r"stablehlo.bitcast_convert .*tensor<\d+x\d+x2xui8>")
    for platform in ("cpu", "cuda"):
        assert pairs.search(text[platform]), platform
    assert not pairs.search(text["tpu"]) and "stablehlo.pad" in text["tpu"]
