"""Bit-identical to optax under ``jax.jit``: every optimizer optax also has, 20 jitted steps.

The parity tests (tests/parity/test_optax_parity.py, tests/contrib/test_common.py) compare
trajectories at rtol 2e-5; this one asks for optax's exact bits at every one of 20 jitted
steps on the float32 parity tree, with each record's own arguments. An optimizer that cannot
give them is listed in ``NOT_BIT_IDENTICAL`` with the reason (the operation whose order
differs, and why it is kept); a listed optimizer that becomes bit-identical fails too, so the
list stays true. Twice: compiled with XLA's backend optimizations off (``helpers.fast_jit``,
in make test), where the programs are the operations as written, and with XLA's default
optimizations (``long``), where XLA:CPU may also order a program's sums its own way
(``NOT_BIT_IDENTICAL_OPTIMIZED``).
"""

import os
import subprocess
import sys
from typing import Callable

import jax
import numpy as np
import optax
import optax.contrib  # noqa: F401  (the references)
import pytest

import functrain as ft
from functrain import jax_compat
import registry
from helpers import fast_jit, make_grads, make_params, trajectory

STEPS = 20

# Optimizers whose update needs more than the gradients and a loss value: their own files
# compare them with optax (the grad_fn / obj_fn they need is not a function of the params
# the generic trajectory can pass).
OWN_FILES = {
    "sam": "update needs grad_fn (its opaque mode): tests/contrib/test_contrib_sam.py",
    "sophia": "update needs obj_fn: tests/contrib/test_contrib_sophia.py",
}

# name -> why functrain's jitted steps are not optax's bits (still within the parity
# tests' rtol 2e-5 at every step). The first run of this test (2026-11-28) listed five more,
# each from an arithmetic association that differed from optax's and now follows it:
# simplified_ademamix's second moment as optax's lerp, g2 + b2 (n - g2) (104 ulps);
# dadapt_adamw's and prodigy's (1 - b2) g g and their learning-rate factor, d lr (sqrt(1 -
# b2^t) / (1 - b1^t)) (5 and 2 ulps); momo_adam's (1 - b2) g g and tau m / D (2 ulps); and
# scale_by_rms's 1 / (sqrt(nu) + eps) times g, which schedule_free_adamw runs on (3 ulps).
# Fused multiply-adds: with FMA instructions available (x86's AVX2), LLVM contracts a product
# and a sum that XLA put in one kernel into one FMA, rounded once; where the two programs split
# the step into kernels otherwise (optax's lax.cond branches, functrain's one select-fused
# block), the same a * b + c is rounded once in one and twice in the other. Capping XLA:CPU
# at AVX (same vector width, no FMA) gives optax's bits for each of these
# (test_fused_multiply_adds_are_the_cause, long); matching them would mean matching optax's
# kernel boundaries, i.e. losing the fusion.
_FMA = "LLVM's fused multiply-adds fall on other kernels' products than in optax's program; "
NOT_BIT_IDENTICAL: dict[str, str] = {}

# More under XLA's default optimizations (JAX 0.10.2): all four reduce over whole leaves or
# the whole tree (norms, inner products) before the update, in kernels fused otherwise than
# optax's.
NOT_BIT_IDENTICAL_OPTIMIZED: dict[str, str] = {
    name: _FMA + f"with XLA's default optimizations, from step {step}"
    for name, step in (("momo", 3), ("momo_adam", 2), ("novograd", 3), ("prodigy", 4))}

# More on JAX 0.5.x (measured on 0.5.3, the declared floor, with optax 0.2.8): that XLA
# fuses these steps' programs otherwise (on JAX 0.10.2 they are optax's bits).
if jax_compat.JAX_VERSION[:2] == (0, 5):
    NOT_BIT_IDENTICAL.update({
        "mechanize": "not attributed (not fused multiply-adds: capped at AVX it still differs): "
                     "on JAX 0.5.3 from step 3, at most 2 ulps (1.7e-7)",
        "muon": _FMA + "on JAX 0.5.3 from step 1, at most 33 ulps (2.6e-6)",
        "novograd": _FMA + "on JAX 0.5.3 from step 5, at most 1 ulp (6.5e-8)",
    })

NAMES = sorted(n for n, r in registry.REGISTRY.items()
               if r.reference.startswith("optax.") and n not in OWN_FILES)


def bits_differ(name: str, jit: Callable = fast_jit) -> list:
    """The steps (from 1) at which functrain's params are not optax's bits."""
    record = registry.REGISTRY[name]
    params = make_params(scalar="scalar_leaf" not in record.skip)
    grads = make_grads(params, steps=STEPS)
    with_value = record.extra is not None
    ours = trajectory(record.make(ft), ft.apply_updates, params, grads, with_value=with_value,
                      jit=jit)
    theirs = trajectory(record.make(optax), optax.apply_updates, params, grads,
                        with_value=with_value, jit=jit)
    differ = set()
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, b.dtype)
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        differ |= {t + 1 for t in range(STEPS) if not same[t].all()}
    return sorted(differ)


@pytest.mark.parametrize("name", NAMES)
def test_jitted_steps_are_optax_bits(name):
    differ = bits_differ(name)
    if name in NOT_BIT_IDENTICAL:
        assert differ, f"{name} now gives optax's bits: take it off NOT_BIT_IDENTICAL"
    else:
        assert not differ, f"{name}: not optax's bits at steps {differ}"


@pytest.mark.long
@pytest.mark.skipif(jax_compat.JAX_VERSION[:2] == (0, 5),
                    reason="the optimized programs' list is measured on JAX 0.10.2")
@pytest.mark.parametrize("name", NAMES)
def test_optimized_jitted_steps_are_optax_bits(name):
    differ = bits_differ(name, jit=jax.jit)
    if name in NOT_BIT_IDENTICAL or name in NOT_BIT_IDENTICAL_OPTIMIZED:
        assert differ, f"{name} now gives optax's bits: take it off the lists"
    else:
        assert not differ, f"{name}: not optax's bits at steps {differ} (XLA's default jit)"


def test_the_lists_name_optimizers_optax_has():
    lists = {**OWN_FILES, **NOT_BIT_IDENTICAL, **NOT_BIT_IDENTICAL_OPTIMIZED}
    for name in lists:
        assert registry.REGISTRY[name].reference.startswith("optax."), name
        assert len(lists[name]) > 20, name


FMA_CHECK = """
import sys
import jax
sys.path[:0] = {paths!r}
from test_bit_identity import bits_differ
from helpers import fast_jit
print([name for name in {names!r} if bits_differ(name, jit={jit})])
"""


@pytest.mark.long
def test_fused_multiply_adds_are_the_cause():
    # Each difference listed as _FMA's vanishes when XLA:CPU may not emit FMA instructions.
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs = [("jax.jit", [n for n, why in NOT_BIT_IDENTICAL_OPTIMIZED.items() if _FMA in why]),
            ("fast_jit", [n for n, why in NOT_BIT_IDENTICAL.items() if _FMA in why])]
    for jit, names in runs:
        if not names:
            continue
        code = FMA_CHECK.format(paths=[os.path.join(tests, "parity"), tests], names=names,
                                jit=jit)
        env = dict(os.environ, XLA_FLAGS="--xla_cpu_max_isa=AVX")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip().splitlines()[-1] == "[]", (jit, out.stdout)
