"""The stress run (``make stress``) covers every optimizer whose step can deadlock.

An optimizer is at risk when its jitted step contains a conditional or loop (on
XLA:CPU their bodies run on the intra-op pool's workers) or a LAPACK-backed
decomposition (docs/matrix_optimizers.md, "The Shampoo hang"). Each such
optimizer, found here by tracing its update, must be declared ``stressed=True``
(``@declare_optimizer`` where it is defined) and every declared one must be on
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
import registry
from functrain.declarations import OPTIMIZERS as DECLARED
from helpers import all_equations, lapack_calls

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "stress"))
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


def _step_jaxpr(record, setting):
    opt = record.make(functrain, **setting.kwargs)
    state = opt.init(PARAMS)
    kwargs = record.update_kwargs(_loss, PARAMS)
    return jax.make_jaxpr(lambda g, s: opt.update(g, s, PARAMS, **kwargs))(PARAMS, state)


SETTINGS = registry.settings()


@pytest.mark.parametrize("label", sorted(SETTINGS))
def test_optimizers_at_risk_are_stressed(label):
    """Every setting of every optimizer in tests/registry.py."""
    record, setting = SETTINGS[label]
    found = risky_primitives(_step_jaxpr(record, setting))
    assert not found or DECLARED[record.name].stressed, (
        f"{label}'s step contains {sorted(found)}: declare {record.name} with "
        f"@declare_optimizer(..., stressed=True) in {DECLARED[record.name].module}")


def test_every_optimizer_declared_stressed_is_on_the_list():
    missing = sorted(n for n, d in DECLARED.items() if d.stressed and n not in STRESSED_BASES)
    assert not missing, (f"declared stressed=True but not in STRESSED "
                         f"(tests/stress/run_stress.py): {missing}")
    stale = sorted(n for n in STRESSED_BASES if n in DECLARED and not DECLARED[n].stressed)
    assert not stale, f"STRESSED lists optimizers not declared stressed=True: {stale}"


@pytest.mark.parametrize("name", ["shampoo", "soap", "kron"])
def test_no_batched_decomposition_on_cpu(name):
    # The jaxpr keeps platform_dependent's branches; the CPU branch is lax.map (a while
    # loop over single matrices), so batched calls may appear only under the non-CPU one.
    # Lowered for CPU, no LAPACK call may carry a batch dimension.
    opt = registry.REGISTRY[name].make(functrain)
    params = {k: v for k, v in transformer_tree(jax).items() if k in ("emb", "b0_q", "b0_ln1")}
    state = opt.init(params)
    step = jax.jit(lambda g, s: opt.update(g, s, params))
    _, batched = lapack_calls(step.lower(params, state).compile().as_text())
    assert not batched, f"{name}: batched LAPACK calls on CPU: {batched}"


def test_risky_primitives_finds_nested_conditionals():
    def f(x):
        return jax.lax.cond(x[0, 0] > 0, lambda y: jnp.linalg.eigh(y)[1], lambda y: y, x)

    assert risky_primitives(jax.make_jaxpr(f)(jnp.eye(3))) == {"cond", "eigh"}
    assert risky_primitives(jax.make_jaxpr(lambda x: x @ x)(jnp.eye(3))) == set()
