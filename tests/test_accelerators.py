"""make accel's numbers, against hand counts and the programs they come from.

benchmarks/accel_compile.py compiles one optimizer step for an accelerator this machine does
not have and reports what the compiler says of it; benchmarks/accelerators.py tabulates.
Here: the accounting (bytes per parameter, the state's bytes, the floors, the kernels of a
program) on CPU programs whose numbers are known by hand, and (``long``: the accelerators'
venvs, which make accel builds and make test-long depends on) the H100 and TPU programs of
the steps whose floor is known: plain AdamW moves exactly its floor on the H100, and no
more than optax's on the TPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import accel_compile  # noqa: E402
import accelerators  # noqa: E402

SMALL = {"a/kernel": (256, 512), "a/bias": (512,)}


@pytest.fixture
def small_tree(monkeypatch):
    monkeypatch.setitem(accel_compile.TREES, "small", SMALL)
    return "small"


def test_plain_sgd_moves_params_and_grads_once(small_tree):
    # read params, read grads, write params: 12 bytes per float32 parameter, no state
    out = accel_compile.measure("cpu", small_tree, lambda m: m.sgd(1e-3), functrain)
    assert out["params"] == 256 * 512 + 512
    assert out["state_bytes"] == 0
    assert out["bytes_accessed"] == pytest.approx(12 * out["params"], rel=1e-3)
    assert out["temp_bytes"] == 0


@pytest.mark.parametrize("name, per_param", [("adamw", 8), ("lion", 4), ("adamw_8bit", 2)])
def test_state_bytes_per_parameter(small_tree, name, per_param):
    out = accel_compile.measure("cpu", small_tree, lambda m: getattr(m, name)(1e-3), functrain)
    n = out["params"]
    state = jax.eval_shape(getattr(functrain, name)(1e-3).init,
                           {k: jnp.zeros(s) for k, s in SMALL.items()})
    by_hand = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)) / n
    assert out["state_bytes"] == pytest.approx(by_hand)
    # at least the moments' bytes (with a step count, block scales, small leaves unquantized)
    assert per_param <= out["state_bytes"] < per_param + 0.1


def test_floors():
    assert accelerators.floor("adamw", 8.0) == (28.0, "one pass")
    assert accelerators.floor("adamw_8bit", 2.0) == (16.0, "one pass")
    assert accelerators.floor("lamb", 8.0) == (40.0, "two passes")
    assert accelerators.floor("lars", 4.0) == (28.0, "two passes")
    assert accelerators.floor("fromage", 0.0) == (20.0, "two passes")
    assert accelerators.floor("soap", 40.0) == (None, "")


def test_kernels_counted_in_the_entry_computation():
    text = """HloModule m

%fused (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%p)
}

ENTRY %main (a: f32[4], b: f32[4]) -> (f32[4], f32[4]) {
  %a = f32[4]{0} parameter(0)
  %b = f32[4]{0} parameter(1)
  %c = f32[] constant(1)
  %f = f32[4]{0} fusion(%a), kind=kLoop, calls=%fused
  %g = f32[4]{0} custom-call(%b), custom_call_target="x"
  %t = (f32[4]{0}, f32[4]{0}) tuple(%f, %g)
  ROOT %r = (f32[4]{0}, f32[4]{0}) copy(%t)
}
"""
    assert accel_compile.kernel_count(text) == 3  # the fusion, the custom call, the copy


def test_kernels_of_a_compiled_program():
    # two leaves, one fused kernel each: XLA:CPU compiles x * 2 per leaf as one loop
    @jax.jit
    def f(tree):
        return jax.tree.map(lambda x: jnp.sin(x) * 2, tree)

    text = f.lower({"a": jnp.zeros(64), "b": jnp.zeros((8, 8))}).compile().as_text()
    assert accel_compile.kernel_count(text) == 2


def test_table_puts_functrain_beside_optax_with_the_floor():
    rows = [{"target": "h100", "tree": "large", "name": "adamw", "library": lib,
             "params": 100, "state_bytes": 8.0, "bytes_accessed": 2800.0 * k, "flops": 1500.0,
             "temp_bytes": 0, "kernels": 18, "compile_s": 1.0, "ideal": 28.0,
             "floor": "one pass"} for lib, k in (("functrain", 1.0), ("optax", 1.5))]
    rows.append({"target": "tpu_v5e", "tree": "large", "name": "soap",
                 "library": "functrain", "error": "did not compile in 60 s"})
    text = accelerators.table(rows)
    assert "| large | adamw | functrain | 28.00 | 28.00 (one pass) | 1.00 |" in text
    assert "| large | adamw | optax | 42.00 | 28.00 (one pass) | 1.50 |" in text
    assert "| large | soap | functrain | did not compile in 60 s |" in text
    assert text.index("H100") < text.index("TPU v5e")


def _compile_in(target: str, name: str, library: str, tree: str = "large") -> dict:
    python = os.path.join(accelerators.VENVS[target], "bin", "python")
    assert os.path.exists(python), f"{python} is missing: make accel builds it"
    done = subprocess.run([python, os.path.join(ROOT, "benchmarks", "accel_compile.py"),
                           target, tree, name, library], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.long
def test_adamw_moves_its_floor_on_h100():
    # read params, grads, mu, nu; write params, mu, nu: 28 bytes per parameter, no temp,
    # functrain as optax
    mine, theirs = (_compile_in("h100", "adamw", lib) for lib in ("functrain", "optax"))
    for out in (mine, theirs):
        assert out["bytes_accessed"] / out["params"] == pytest.approx(28.0, rel=2e-3), out
        assert out["temp_bytes"] < 2**20, out
    assert mine["kernels"] <= theirs["kernels"]
    assert np.isfinite(mine["flops"]) and mine["flops"] > 0


@pytest.mark.long
def test_adamw_on_the_flat_layout_is_a_few_kernels_at_its_floor_on_h100():
    # 1000 leaves (500 (64, 64) and 500 (64,)): one kernel per leaf on the tree (1,002),
    # the step's scalars and one pass over the buffers on functrain.flat_layout's
    out = _compile_in("h100", "adamw", "functrain", tree="1000 leaves, flat layout")
    assert out["kernels"] <= 20, out
    assert out["bytes_accessed"] / out["params"] <= 1.2 * 28.0, out
    assert out["temp_bytes"] < 2**20, out


@pytest.mark.long
@pytest.mark.parametrize("name, most_bytes",
                         [("muon", 83), ("normuon", 97), ("kron", 530), ("dion", 97)])
def test_matrix_optimizers_temp_on_h100_is_within_twice_their_state(name, most_bytes):
    # 8 (1024, 4096) kernels. Muon's Newton-Schulz runs in chunks of 64 MiB (4 matrices):
    # its iterate, X X^T and B X exist for 4 matrices at a time (288 MiB in one batch of 8).
    # kron's (4096, 4096) factors are 64 MiB each: one per group, each group refreshed in
    # its own conditional (2,208 MiB with all 8 in one); dion's step runs one matrix at a
    # time (544 MiB in one batch); bytes no more than before
    out = _compile_in("h100", name, "functrain")
    state = out["state_bytes"] * out["params"]
    assert out["temp_bytes"] <= 2 * state, out
    assert out["bytes_accessed"] / out["params"] < most_bytes, out


@pytest.mark.long
def test_adamw_on_tpu_moves_no_more_than_optax():
    # The TPU compiler's bytes include its memory-space assignment's copies (copy-start /
    # copy-done of the next leaf's inputs into on-chip memory while one leaf is updated),
    # so its floor is not 28 here; functrain's program is compared with optax's.
    mine, theirs = (_compile_in("tpu_v5e", "adamw", lib) for lib in ("functrain", "optax"))
    assert mine["bytes_accessed"] <= theirs["bytes_accessed"] * 1.001, (mine, theirs)
    assert mine["bytes_accessed"] / mine["params"] >= 28.0
    assert mine["temp_bytes"] <= theirs["temp_bytes"]


@pytest.mark.long
def test_tpu_low_bit_steps_look_nothing_up():
    # On TPU the dynamic codes are computed, not looked up: no gather in the 8-bit step (it
    # had four per leaf), and no temp beyond one leaf's float32 bytes
    out = _compile_in("tpu_v5e", "adamw_8bit", "functrain")
    assert out["gathers"] == 0, out
    assert out["temp_bytes"] <= 1024 * 4096 * 4, out


def test_gathers_are_counted(small_tree):
    out = accel_compile.measure("cpu", small_tree, lambda m: m.adamw_8bit(1e-3), functrain)
    assert out["gathers"] > 0  # CPU looks the codes up
    assert accel_compile.measure("cpu", small_tree, lambda m: m.adamw(1e-3),
                                 functrain)["gathers"] == 0


def test_collectives_are_counted_with_their_output_bytes_and_place():
    import accel_sharded
    text = """HloModule m

%body (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %ar = f32[8]{0} all-reduce(%p), replica_groups={}, to_apply=%add
}

%one (q: f32[2,4]) -> f32[8,4] {
  %q = f32[2,4]{1,0} parameter(0)
  ROOT %g = f32[8,4]{1,0} all-gather(%q), dimensions={0}
}

%two (r: f32[2,4]) -> f32[8,4] {
  %r = f32[2,4]{1,0} parameter(0)
  %g1 = f32[8,4]{1,0} all-gather(%r), dimensions={0}
  %g2 = f32[8,4]{1,0} all-gather(%r), dimensions={0}
  ROOT %s = f32[8,4]{1,0} add(%g1, %g2)
}

ENTRY %main (a: f32[2,4], b: f32[8], i: s32[]) -> (f32[8,4], f32[8], f32[8,4]) {
  %a = f32[2,4]{1,0} parameter(0)
  %b = f32[8]{0} parameter(1)
  %i = s32[] parameter(2)
  %ags = (f32[2,4]{1,0}, f32[8,4]{1,0}) all-gather-start(%a), dimensions={0}
  %agd = f32[8,4]{1,0} all-gather-done(%ags)
  %w = f32[8]{0} while(%b), condition=%cond, body=%body
  %c = f32[8,4]{1,0} conditional(%i, %a, %a), branch_computations={%one, %two}
  ROOT %t = (f32[8,4]{1,0}, f32[8]{0}, f32[8,4]{1,0}) tuple(%agd, %w, %c)
}
"""
    assert accel_sharded.collectives(text) == {
        "top level": {"all-gather": {"count": 1, "bytes": 8 * 4 * 4}},
        "in a loop": {"all-reduce": {"count": 1, "bytes": 8 * 4}},
        "in a conditional branch": {"all-gather": {
            "count": 3, "bytes": 3 * 8 * 4 * 4,
            "per_branch": {"one": 8 * 4 * 4, "two": 2 * 8 * 4 * 4}}}}


def h100_collectives(compile_call: str) -> dict:
    """The collectives (``accel_sharded.collectives``) of the program that ``compile_call``, an
    expression of ``accel_sharded`` as ``a``, compiles for H100s in the CUDA venv."""
    python = os.path.join(accelerators.VENVS["h100"], "bin", "python")
    code = ("import sys, json; sys.path.insert(0, 'benchmarks'); import accel_sharded as a; "
            f"c = {compile_call}; print(json.dumps(a.collectives(c.as_text())))")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.long
def test_zero1_adamw_on_eight_h100s_gathers_the_params_once():
    # the least a ZeRO-1 step communicates: each device receives the new params (its own
    # slice included in the gathered output), nothing else, and nothing inside a loop
    found = h100_collectives("a.compile_zero1_adamw(a.topology_devices('h100'), "
                             "{'k': (1024, 4096), 'b': (4096,)})")
    assert set(found) == {"top level"}, found
    assert set(found["top level"]) == {"all-gather"}, found
    assert found["top level"]["all-gather"]["bytes"] == 4 * (1024 * 4096 + 4096), found


@pytest.mark.long
def test_muon_with_mesh_on_eight_h100s_gathers_the_update_once():
    # replicated params and state in and out, Newton-Schulz split over the devices: the least
    # it communicates is the orthogonalized update (each device receives the stacks it did
    # not compute); the momentum is computed where it is kept, not split and gathered back
    found = h100_collectives("a.compile_matrix_with_mesh('muon', a.topology_devices('h100'), "
                             "8, 256)")
    assert found == {"top level": {"all-gather": {"count": 1, "bytes": 4 * 8 * 256 * 256}}}, found


@pytest.mark.long
def test_matrix_optimizers_with_mesh_gather_only_their_update_and_refreshed_state():
    # replicated params and state in and out, the per-matrix work split over 8 H100s. Every
    # step: kron gathers its update; soap and shampoo apply their preconditioners replicated
    # and gather nothing. In a refresh (a conditional branch): each gathers the state the
    # refresh recomputed, which every device keeps whole (soap's two eigenbases per matrix,
    # in either branch, eigh on the first step or QR after; shampoo's inverse roots per
    # 128-block and side, with a vector per block; kron's two factors). Nothing in a loop.
    n, layers = 256, 8
    matrix = 4 * layers * n * n  # float32 bytes of one (8, 256, 256) stack
    call = "a.compile_matrix_with_mesh('{}', a.topology_devices('h100'), 8, 256)"
    soap = h100_collectives(call.format("soap"))
    assert set(soap) == {"in a conditional branch"}, soap
    branches = soap["in a conditional branch"]["all-gather"]["per_branch"]
    assert len(branches) == 2, soap
    for size in branches.values():  # 2 eigenbases, and the QR branch's s32 (16, 256) order
        assert 2 * matrix <= size <= 2 * matrix + 4 * 2 * layers * n, soap
    shampoo = h100_collectives(call.format("shampoo"))
    blocks = layers * (n // 128) ** 2
    assert set(shampoo) == {"in a conditional branch"}, shampoo
    (size,) = shampoo["in a conditional branch"]["all-gather"]["per_branch"].values()
    assert size == 2 * blocks * (4 * 128 * 128 + 4 * 128), shampoo
    kron = h100_collectives(call.format("kron"))
    assert kron["top level"] == {"all-gather": {"count": 1, "bytes": matrix}}, kron
    (size,) = kron["in a conditional branch"]["all-gather"]["per_branch"].values()
    assert size == 2 * matrix and set(kron) == {"top level", "in a conditional branch"}, kron
