"""The stress run (``make stress``) covers every optimizer whose step can deadlock.

An optimizer is at risk when its jitted step contains a conditional or loop (on
XLA:CPU their bodies run on the intra-op pool's workers) or a LAPACK-backed
decomposition (docs/matrix_optimizers.md, "The Shampoo hang"). Each such
optimizer, found here by tracing its update, must be on
``tests/stress/run_stress.py``'s ``STRESSED`` list; and every
decomposition over a stack of matrices must go through
``functrain.linalg.map_matrices`` (one LAPACK call per matrix on CPU).
"""

import os
import sys

import jax
import jax.numpy as jnp
import pytest

import functrain
from helpers import OPTIMIZER_ARGS, all_equations, optimizer_functions

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "stress"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "contrib"))
from cases import CASES  # noqa: E402
from run_stress import STRESSED, transformer_tree  # noqa: E402

PARAMS = {"w": jnp.linspace(-1.0, 1.0, 24).reshape(6, 4), "b": jnp.linspace(0.1, 0.4, 4)}
LINALG = frozenset({"eigh", "qr", "geqrf", "householder_product", "svd", "triangular_solve",
                    "cholesky", "lu", "schur", "eig"})
# Control flow (its branches run on XLA:CPU's pool workers) and the LAPACK decompositions.
RISKY = LINALG | {"cond", "while"}
STRESSED_BASES = {name.split("(")[0] for name in STRESSED}


def risky_primitives(jaxpr):
    """The names in ``RISKY`` among ``jaxpr``'s equations, nested ones included."""
    return {e.primitive.name for e in all_equations(jaxpr)} & RISKY


def _loss(p):
    return sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(p))


def _step_jaxpr(opt, extra=None):
    state = opt.init(PARAMS)
    kwargs = extra(_loss, PARAMS) if extra else {}
    return jax.make_jaxpr(lambda g, s: opt.update(g, s, PARAMS, **kwargs))(PARAMS, state)


BEYOND_OPTAX = {"shampoo": lambda: functrain.contrib.shampoo(1e-3),
                "soap": lambda: functrain.contrib.soap(1e-3),
                "kron": lambda: functrain.contrib.kron(1e-3),
                "mars": lambda: functrain.contrib.mars(1e-3),
                "came": lambda: functrain.contrib.came(1e-3)}


@pytest.mark.parametrize("name", sorted(BEYOND_OPTAX))
def test_beyond_optax_optimizers_at_risk_are_stressed(name):
    found = risky_primitives(_step_jaxpr(BEYOND_OPTAX[name]()))
    assert not found or name in STRESSED_BASES, (
        f"{name}'s step contains {sorted(found)}: add it to STRESSED in "
        f"tests/stress/run_stress.py")


@pytest.mark.parametrize("case", sorted(CASES))
def test_contrib_optimizers_at_risk_are_stressed(case):
    c = CASES[case]
    found = risky_primitives(_step_jaxpr(c.make(functrain), c.extra))
    assert not found or c.covers in STRESSED_BASES, (
        f"{case}'s step contains {sorted(found)}: add {c.covers} to STRESSED in "
        f"tests/stress/run_stress.py")


@pytest.mark.parametrize("name", sorted(OPTIMIZER_ARGS))
def test_core_optimizers_at_risk_are_stressed(name):
    opt = optimizer_functions()[name](**OPTIMIZER_ARGS[name])
    extra = (lambda loss, p: {"value": loss(p)}) if name == "polyak_sgd" else None
    found = risky_primitives(_step_jaxpr(opt, extra))
    assert not found or name in STRESSED_BASES, (
        f"{name}'s step contains {sorted(found)}: add it to STRESSED in "
        f"tests/stress/run_stress.py")


@pytest.mark.parametrize("name", ["shampoo", "soap", "kron"])
def test_no_batched_decomposition_on_cpu(name):
    # The jaxpr keeps platform_dependent's branches; the CPU branch is lax.map (a while
    # loop over single matrices), so batched calls may appear only under the non-CPU one.
    # Lowered for CPU, no LAPACK call may carry a batch dimension.
    opt = BEYOND_OPTAX[name]()
    params = {k: v for k, v in transformer_tree(jax).items() if k in ("emb", "b0_q", "b0_ln1")}
    state = opt.init(params)
    text = jax.jit(lambda g, s: opt.update(g, s, params)).lower(params, state).as_text()
    batched = [line.strip()[:160] for line in text.splitlines()
               if "lapack_" in line and 'num_batch_dims = "0"' not in line]
    assert not batched, f"{name}: batched LAPACK calls on CPU: {batched}"


def test_risky_primitives_finds_nested_conditionals():
    def f(x):
        return jax.lax.cond(x[0, 0] > 0, lambda y: jnp.linalg.eigh(y)[1], lambda y: y, x)

    assert risky_primitives(jax.make_jaxpr(f)(jnp.eye(3))) == {"cond", "eigh"}
    assert risky_primitives(jax.make_jaxpr(lambda x: x @ x)(jnp.eye(3))) == set()
