"""Multi-device checks of the matrix optimizers' preconditioner refresh divided over devices.

Part of ``tests/sharding_checks.py``'s run (8 simulated CPU devices, one subprocess started by
``tests/test_sharding.py``), which merges this module's ``CHECKS``. Each check compares the
compiled per-device program's loop trip counts around its LAPACK calls with one device's
(the refresh is split, not repeated) and the numbers with one device's. Importing this module
runs nothing.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import functrain as ft
from functrain.jax_compat import enable_x64
from helpers import AXIS_TYPES

CHECKS: dict[str, Callable[[], None]] = {}


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS[fn.__name__] = fn
    return fn


def loop_trip_counts(hlo: str) -> list:
    """The known trip counts of the compiled program's loops, sorted."""
    return sorted(int(n) for n in re.findall(r'known_trip_count":\{"n":"(\d+)"', hlo))


def four_steps_and_program(opt: Any, params: Any) -> tuple:
    """Four jitted steps of ``opt`` on gradients ``sin(t p)``: the params, and the compiled
    step's HLO text."""
    state = opt.init(params)

    @jax.jit
    def step(p: Any, s: Any, t: Any) -> tuple:
        g = jax.tree.map(lambda x: jnp.sin(x * t), p)
        u, s = opt.update(g, s, p)
        return ft.apply_updates(p, u), s

    for t in range(1, 5):
        params, state = step(params, state, float(t))
    return params, step.lower(params, state, 1.0).compile().as_text()


@check
def check_shampoo_refresh_split_over_devices() -> None:
    """shampoo(mesh=...) on 8 devices: each device decomposes 2 of the 16 blocks per side (the
    compiled per-device program loops 2 times around its LAPACK call, against 16 on one
    device), and the numbers are one device's (float64, where a batched GEMM's order of sums
    cannot hide a wrong pairing; explicit and auto meshes)."""
    rng = np.random.default_rng(0)
    shapes = {f"w{i:02d}": (16, 16) for i in range(13)} | {"emb": (48, 16), "b": (16,)}
    kw = dict(block_size=16, start_preconditioning_step=1, precondition_frequency=2)

    with enable_x64(True):
        params = {k: jnp.asarray(rng.normal(size=s), jnp.float64) for k, s in shapes.items()}
        one, hlo_one = four_steps_and_program(ft.contrib.shampoo(1e-2, **kw), params)
        assert loop_trip_counts(hlo_one) == [16, 16], loop_trip_counts(hlo_one)
        for kind in AXIS_TYPES:
            mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind, kind))
            split, hlo = four_steps_and_program(ft.contrib.shampoo(1e-2, mesh=mesh, **kw), params)
            assert loop_trip_counts(hlo) == [2, 2], (kind, loop_trip_counts(hlo))
            for k in one:
                np.testing.assert_allclose(split[k], one[k], rtol=1e-10, atol=1e-12,
                                           err_msg=f"{k}, {kind}")


@check
def check_soap_refresh_split_over_devices() -> None:
    """soap(mesh=...) on 8 devices: the 32 (16, 16) statistics (two per square leaf, one of
    emb and one of head, whose 48-axes exceed max_precond_dim) are decomposed 4 per device
    (the compiled per-device program loops 4 times around its eigh call and its QR call,
    against 32 with a one-device mesh), and the numbers are one device's without a mesh
    (float64; explicit and auto meshes; four steps: the first call's eigh, a QR refresh at
    step 2)."""
    rng = np.random.default_rng(1)
    shapes = {f"w{i:02d}": (16, 16) for i in range(15)} | {"emb": (48, 16), "head": (16, 48),
                                                            "b": (16,)}
    kw = dict(precondition_frequency=2, max_precond_dim=16)

    with enable_x64(True):
        params = {k: jnp.asarray(rng.normal(size=s), jnp.float64) for k, s in shapes.items()}
        one, _ = four_steps_and_program(ft.contrib.soap(1e-2, **kw), params)
        single = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
        _, hlo_one = four_steps_and_program(ft.contrib.soap(1e-2, mesh=single, **kw), params)
        assert loop_trip_counts(hlo_one) == [32, 32], loop_trip_counts(hlo_one)
        for kind in AXIS_TYPES:
            mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind, kind))
            split, hlo = four_steps_and_program(ft.contrib.soap(1e-2, mesh=mesh, **kw), params)
            assert loop_trip_counts(hlo) == [4, 4], (kind, loop_trip_counts(hlo))
            for k in one:
                np.testing.assert_allclose(split[k], one[k], rtol=1e-10, atol=1e-12,
                                           err_msg=f"{k}, {kind}")


@check
def check_muon_newton_schulz_split_over_devices() -> None:
    """muon(mesh=...) on 8 devices: the 13 (16, 16) momenta (padded to 16) are orthogonalized
    2 per device (the compiled per-device program's Newton-Schulz matmuls are on a (2, 16, 16)
    stack, against (13, 16, 16) on one device), and the numbers are one device's (float64;
    explicit and auto meshes)."""
    rng = np.random.default_rng(2)
    shapes = {f"w{i:02d}": (16, 16) for i in range(13)} | {"emb": (48, 16), "b": (16,)}

    def stack_sizes(hlo: str) -> list:
        return sorted({int(n) for n in re.findall(r"f64\[(\d+),16,16\]\{[^}]*\} dot", hlo)})

    with enable_x64(True):
        params = {k: jnp.asarray(rng.normal(size=s), jnp.float64) for k, s in shapes.items()}
        one, hlo_one = four_steps_and_program(ft.contrib.muon(1e-2), params)
        assert stack_sizes(hlo_one) == [13], stack_sizes(hlo_one)
        for kind in AXIS_TYPES:
            mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind, kind))
            split, hlo = four_steps_and_program(ft.contrib.muon(1e-2, mesh=mesh), params)
            assert stack_sizes(hlo) == [2], (kind, stack_sizes(hlo))
            for k in one:
                np.testing.assert_allclose(split[k], one[k], rtol=1e-10, atol=1e-12,
                                           err_msg=f"{k}, {kind}")


@check
def check_kron_factor_work_split_over_devices() -> None:
    """kron(mesh=...) on 8 devices: the 13 (16, 16) leaves' factor updates, triangular solves
    and ``P m`` run 2 leaves per device (the per-device program's factor products are on
    (2, 16, 16) stacks, against (13, 16, 16) on one device), and the numbers are one
    device's (float64; preconditioner updated every step; explicit and auto meshes)."""
    rng = np.random.default_rng(3)
    shapes = {f"w{i:02d}": (16, 16) for i in range(13)} | {"emb": (48, 16), "b": (16,)}
    kw = dict(preconditioner_update_probability=1.0)

    def stack_sizes(hlo: str) -> list:
        return sorted({int(n) for n in re.findall(r"f64\[(\d+),16,16\]\{[^}]*\} dot", hlo)})

    with enable_x64(True):
        params = {k: jnp.asarray(rng.normal(size=s), jnp.float64) for k, s in shapes.items()}
        one, hlo_one = four_steps_and_program(ft.contrib.kron(1e-2, **kw), params)
        assert 13 in stack_sizes(hlo_one) and 2 not in stack_sizes(hlo_one), \
            stack_sizes(hlo_one)
        for kind in AXIS_TYPES:
            mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind, kind))
            split, hlo = four_steps_and_program(ft.contrib.kron(1e-2, mesh=mesh, **kw), params)
            assert stack_sizes(hlo) == [2], (kind, stack_sizes(hlo))
            for k in one:
                np.testing.assert_allclose(split[k], one[k], rtol=1e-10, atol=1e-12,
                                           err_msg=f"{k}, {kind}")


@check
def check_muon_variants_newton_schulz_split_over_devices() -> None:
    """normuon(mesh=...) and adamuon(mesh=...) on 8 devices: Muon's split of the
    Newton-Schulz stacks reaches them (the per-device program's matmuls are on a (2, 16, 16)
    stack of the 13 momenta, against (13, 16, 16) on one device; each variant's second
    moment and rescaling run after the gather), and the numbers are one device's (float64;
    explicit and auto meshes)."""
    rng = np.random.default_rng(4)
    shapes = {f"w{i:02d}": (16, 16) for i in range(13)} | {"b": (16,)}

    def stack_sizes(hlo: str) -> list:
        return sorted({int(n) for n in re.findall(r"f64\[(\d+),16,16\]\{[^}]*\} dot", hlo)})

    with enable_x64(True):
        params = {k: jnp.asarray(rng.normal(size=s), jnp.float64) for k, s in shapes.items()}
        for make in (ft.contrib.normuon, ft.contrib.adamuon):
            one, hlo_one = four_steps_and_program(make(1e-2), params)
            assert stack_sizes(hlo_one) == [13], (make.__name__, stack_sizes(hlo_one))
            for kind in AXIS_TYPES:
                mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind, kind))
                split, hlo = four_steps_and_program(make(1e-2, mesh=mesh), params)
                assert stack_sizes(hlo) == [2], (make.__name__, kind, stack_sizes(hlo))
                for k in one:
                    np.testing.assert_allclose(split[k], one[k], rtol=1e-10, atol=1e-12,
                                               err_msg=f"{make.__name__} {k}, {kind}")


@check
def check_splus_refresh_split_over_devices() -> None:
    """splus(mesh=...) on 8 devices: the 32 (16, 16) statistics (two per square leaf, one of
    emb and one of head, whose 48-axes reach max_dim) are decomposed 4 per device (the
    compiled per-device program loops 4 times around its eigh call, against 32 with a
    one-device mesh), and the numbers are one device's without a mesh (float64; explicit and
    auto meshes; refreshes at steps 1, 2 and 4)."""
    rng = np.random.default_rng(4)
    shapes = {f"w{i:02d}": (16, 16) for i in range(15)} | {"emb": (48, 16), "head": (16, 48),
                                                            "b": (16,)}
    kw = dict(inverse_every=2, max_dim=17)

    with enable_x64(True):
        params = {k: jnp.asarray(rng.normal(size=s), jnp.float64) for k, s in shapes.items()}
        one, _ = four_steps_and_program(ft.contrib.splus(1e-2, **kw), params)
        single = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
        _, hlo_one = four_steps_and_program(ft.contrib.splus(1e-2, mesh=single, **kw), params)
        assert loop_trip_counts(hlo_one) == [32], loop_trip_counts(hlo_one)
        for kind in AXIS_TYPES:
            mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind, kind))
            split, hlo = four_steps_and_program(ft.contrib.splus(1e-2, mesh=mesh, **kw), params)
            assert loop_trip_counts(hlo) == [4], (kind, loop_trip_counts(hlo))
            for k in one:
                np.testing.assert_allclose(split[k], one[k], rtol=1e-10, atol=1e-12,
                                           err_msg=f"{k}, {kind}")


@check
def check_splus_state_follows_params() -> None:
    """splus on params split over a 4x2 mesh (plain jit, no mesh argument): jit(init) and four
    steps keep the momentum and the EMA on their params' shardings, and the params equal one
    device's (float64). The generic contrib check's model cannot show this: the first
    statistics of its non-square weights are rank-deficient, so eigh's basis of their null
    space is rounding's choice (tests/registry.py)."""
    rng = np.random.default_rng(5)
    specs = {"a": P("data", "model"), "c": P("model", "data"), "emb": P(None, "model"),
             "b": P("model")}
    shapes = {"a": (16, 16), "c": (16, 16), "emb": (48, 16), "b": (16,)}
    opt = ft.contrib.splus(1e-2, inverse_every=2, max_dim=17)
    with enable_x64(True):
        params = {k: jnp.asarray(rng.normal(size=s), jnp.float64) for k, s in shapes.items()}
        one, _ = four_steps_and_program(opt, params)
        mesh = jax.make_mesh((4, 2), ("data", "model"),
                             axis_types=(jax.sharding.AxisType.Auto,) * 2)
        shardings = {k: jax.sharding.NamedSharding(mesh, s) for k, s in specs.items()}
        sharded = jax.device_put(params, shardings)
        state = jax.jit(opt.init)(sharded)

        @jax.jit
        def step(p: Any, s: Any, t: Any) -> tuple:
            u, s = opt.update(jax.tree.map(lambda x: jnp.sin(x * t), p), s, p)
            return ft.apply_updates(p, u), s

        for t in range(1, 5):
            sharded, state = step(sharded, state, float(t))
            for field in ("mu", "ema"):
                for k, x in getattr(state[0], field).items():
                    assert x.sharding.is_equivalent_to(shardings[k], x.ndim), (
                        f"splus .{field}['{k}'] is {x.sharding}, want {specs[k]}")
        for k in one:
            np.testing.assert_allclose(sharded[k], one[k], rtol=1e-10, atol=1e-12, err_msg=k)
