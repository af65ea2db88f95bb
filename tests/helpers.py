"""Helpers shared by the test files: one copy of each.

Test files anywhere under ``tests/`` import them as ``from helpers import ...``
(``tests/conftest.py`` puts ``tests/`` on ``sys.path``). Fixtures live in
``tests/conftest.py``.

* Trees: :func:`make_params`, :func:`make_grads`, :func:`matrices_only`, :func:`loss_value`.
* Against optax: :func:`trajectory` and :func:`assert_same_trajectory`, every step compared.
* Against a formula by hand: :func:`check_against_formula` on ``FORMULA_P0``/``FORMULA_GRADS``.
* Wrappers and combinators: :func:`assert_empty_params_step`, :func:`assert_state_donatable`.
* Multi-device checks: :func:`run_on_eight_devices`, a script's JSON results from a subprocess
  with 8 simulated CPU devices.
* Losses against optax: :func:`loss_case`, :func:`assert_losses_like_optax` (many cases, one
  compilation) and :func:`assert_loss_like_optax` (one), values and gradients to a bound
  derived from the arithmetic (:func:`rounding_bound`).

Elsewhere: every optimizer is declared once in ``tests/registry.py``; the checks each
``tests/families/`` family file runs on its optimizers are in ``tests/optimizer_checks.py``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

import functrain as ft
from functrain import jax_compat
from functrain.jax_compat import enable_x64

# functrain's type aliases (``typing.Any`` or a ``Callable[...]`` at run time): no
# docstring of their own; the reference documents them by path (docs/api/building_blocks).
TYPE_ALIASES = frozenset({"Schedule", "MaskOrFn", "OptState", "Params", "ScalarOrSchedule",
                          "Updates", "TransformInitFn", "TransformUpdateFn",
                          "TransformUpdateExtraArgsFn"})

# --------------------------------------------------------------------------
# Trees
# --------------------------------------------------------------------------


def all_equations(jaxpr: Any) -> list:
    """Every equation of ``jaxpr`` (closed or not), those of nested jaxprs included
    (conditional branches, loop bodies, inner ``jit``s), outer ones first."""
    found = []

    def visit(jp: Any) -> None:
        for eqn in jp.eqns:
            found.append(eqn)
            for value in eqn.params.values():
                for sub in value if isinstance(value, (list, tuple)) else (value,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        visit(inner)

    visit(getattr(jaxpr, "jaxpr", jaxpr))
    return found

def make_params(scalar: bool = True, vector: bool = True) -> dict:
    """A tree with a zero-valued leaf, a scalar leaf, nested containers and mixed shapes.

    ``scalar=False`` leaves out the scalar leaf (optax's sm3 fails on scalars);
    ``vector=False`` leaves out the (5,) leaf (and so draws the later leaves
    from an earlier point of the same random stream).
    """
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((4, 3)), jnp.float32)
    layers = [jnp.asarray(rng.standard_normal((5,)), jnp.float32)] if vector else []
    layers.append(jnp.asarray(rng.uniform(1, 2, (2, 2, 2)), jnp.float32))
    params = {"dense": {"w": w, "b": jnp.zeros((3,), jnp.float32)}, "layers": layers}
    if scalar:
        params["scalar"] = jnp.asarray(0.7, jnp.float32)
    return params


def make_grads(params: Any, steps: int = 50, seed: int = 1) -> Any:
    """Gradients whose magnitudes span 1e-3..1e3, stacked over ``steps``."""
    rng = np.random.default_rng(seed)

    def leaf(p):
        shape = (steps,) + p.shape
        mag = 10.0 ** rng.uniform(-3, 3, shape)
        return jnp.asarray(rng.standard_normal(shape) * mag, p.dtype)

    return jax.tree_util.tree_map(leaf, params)


def matrices_only(params: Any) -> Any:
    """A mask (or weight-decay mask) selecting the leaves with more than one dimension."""
    return jax.tree_util.tree_map(lambda p: p.ndim > 1, params)


def loss_value(params: Any) -> jax.Array:
    """A loss value for the optimizers that take one (Polyak)."""
    return 0.5 * sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(params))


# --------------------------------------------------------------------------
# Trajectories against optax
# --------------------------------------------------------------------------

STEPS = 50
# Test-only: XLA's cheapest CPU codegen halves compile time; numerics are unchanged.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def lapack_calls(compiled_text: str) -> tuple[list, list]:
    """The LAPACK custom calls of a compiled CPU program (``jitted.lower(...).compile()
    .as_text()``), split into ``(unbatched, batched)`` by their ``num_batch_dims``.

    The compiled program, not the lowered one: JAX before 0.6 lowers
    ``lax.platform_dependent`` to a conditional holding every platform's branch, which XLA
    then removes for the platform compiled for.
    """
    import re
    calls = [line.strip() for line in compiled_text.splitlines()
             if "custom-call(" in line and "lapack_" in line]
    split: tuple[list, list] = ([], [])
    for call in calls:
        split[not re.search(r'num_batch_dims\s*=\s*"0"', call)].append(call[:200])
    return split


# Multi-device checks. Explicit mesh axes need JAX >= 0.7.0 (functrain.jax_compat): they
# are checked where JAX has them, automatic axes everywhere.
EXPLICIT_AXES = jax_compat.jax_at_least(jax_compat.EXPLICIT_AXES_JAX)
AXIS_TYPES = ((jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit) if EXPLICIT_AXES
              else (jax.sharding.AxisType.Auto,))
PREFERRED_AXIS_TYPE = AXIS_TYPES[-1]
# Under jax.jit(opt.init), a state buffer takes its param's sharding by XLA's propagation
# through zeros_like: JAX 0.5.3 and 0.6.2 placed some elsewhere (a replicated param's moment
# split over 'data'; versions between 0.6.2 and 0.10.2 were not checked). The numbers are
# the same; the checks that assert these layouts need this JAX (docs/scaling.md).
LAYOUTS_JAX = "0.10.2"
LAYOUTS_WHY = "jax.jit(opt.init) placing state buffers like their params"
# jax.set_mesh from JAX 0.7.1; before, jax.sharding.use_mesh.
set_mesh = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh


class SkipCheck(Exception):
    """Raised by a multi-device check that does not apply to this JAX: its test is skipped
    with the message as the reason."""


def fast_jit(fn: Callable) -> Callable:
    """``jax.jit(fn, compiler_options=FAST_COMPILE)``, usable as a plain decorator (JAX before
    0.6 has no ``jax.jit(**options)`` decorator factory)."""
    return jax.jit(fn, compiler_options=FAST_COMPILE)


def trajectory(opt: Any, apply_updates: Callable, params: Any, grads: Any,
               steps: Optional[int] = None, with_value: bool = False,
               jit: Callable = fast_jit) -> Any:
    """Params after each step of one jitted step function, stacked over the steps.

    Args:
      opt: the transformation.
      apply_updates: ``functrain.apply_updates`` or ``optax.apply_updates``.
      params: the initial parameters.
      grads: a tree of arrays stacked over the steps (step ``t`` reads ``x[t]``),
        or a function ``params -> grads`` called inside the step.
      steps: how many steps (default: the stacked length, or ``STEPS``).
      with_value: pass ``value=loss_value(params)`` to ``update`` (Polyak).
      jit: how the step is compiled: :func:`fast_jit` (default: XLA's backend optimizations
        off, quick to compile) or ``jax.jit`` (XLA's default program).
    """
    if steps is None:
        steps = STEPS if callable(grads) else jax.tree_util.tree_leaves(grads)[0].shape[0]

    @jit
    def step(p, s, g):
        if callable(grads):
            g = grads(p)
        extra = {"value": loss_value(p)} if with_value else {}
        u, s = opt.update(g, s, p, **extra)
        return apply_updates(p, u), s

    state, out = opt.init(params), []
    for t in range(steps):
        g = None if callable(grads) else jax.tree_util.tree_map(lambda x: x[t], grads)
        params, state = step(params, state, g)
        out.append(params)
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *out)


def assert_same_trajectory(ours: Any, theirs: Any, *, params: Any = None, grads: Any = None,
                           steps: Optional[int] = None, with_value: bool = False,
                           name: str = "", rtol: Optional[float] = None,
                           atol: Optional[float] = None,
                           apply_ours: Callable = ft.apply_updates,
                           apply_theirs: Callable = optax.apply_updates,
                           float64: bool = False) -> None:
    """``ours`` and ``theirs`` give the same params at every step, and the params really moved.

    Args:
      ours, theirs: the two transformations (usually functrain's and optax's).
      params: the initial parameters (default :func:`make_params`).
      grads: stacked gradients or a function of the params (default
        :func:`make_grads` over ``steps`` or ``STEPS`` steps).
      steps: the number of steps.
      with_value: pass a loss ``value`` to ``update``.
      name: named in failure messages.
      rtol, atol: the tolerance at every step (optax parity in float32: 2e-5, 1e-6; with
        ``float64``: 1e-9, 1e-11).
      apply_ours, apply_theirs: how each side applies its updates.
      float64: run both in float64 (complex128): float32 (complex64) leaves of ``params``
        and ``grads`` are widened under ``enable_x64``. For optimizers that amplify
        rounding (Newton-Schulz iterations over many steps), where float32 results of two
        correct programs that sum in another order drift apart by more than float32
        parity's tolerance (seen with another XLA version: 4e-6 after 20 Muon steps); in
        float64 that drift is ~1e-13, so 1e-9 keeps a margin of thousands either way.
    """
    params = make_params() if params is None else params
    grads = make_grads(params, steps or STEPS) if grads is None else grads
    if float64:
        with enable_x64():
            return assert_same_trajectory(
                ours, theirs, params=widen(params), grads=grads if callable(grads) else
                widen(grads), steps=steps, with_value=with_value, name=name,
                rtol=1e-9 if rtol is None else rtol, atol=1e-11 if atol is None else atol,
                apply_ours=apply_ours, apply_theirs=apply_theirs)
    rtol, atol = 2e-5 if rtol is None else rtol, 1e-6 if atol is None else atol
    a = trajectory(ours, apply_ours, params, grads, steps, with_value)
    b = trajectory(theirs, apply_theirs, params, grads, steps, with_value)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b), name
    moved = False
    for (path, x), y, p0 in zip(jax.tree_util.tree_flatten_with_path(a)[0],
                                jax.tree_util.tree_leaves(b), jax.tree_util.tree_leaves(params)):
        where = f"{name} {jax.tree_util.keystr(path)}".strip()
        assert x.dtype == y.dtype, (where, x.dtype, y.dtype)
        x, y = np.asarray(x), np.asarray(y)
        bad = ~np.isclose(x, y, rtol=rtol, atol=atol, equal_nan=True)
        first = int(np.argmax(bad.reshape(len(bad), -1).any(axis=1))) if bad.any() else None
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol,
                                   err_msg=f"{where}: first differs at step {first}")
        moved |= bool(np.any(x[-1] != np.asarray(p0)))
    assert moved, f"{name} never moved the params: the comparison would be vacuous"


def widen(tree: Any) -> Any:
    """float32 leaves as float64 and complex64 as complex128 (call under ``enable_x64``)."""
    wider = {np.dtype(np.float32): np.float64, np.dtype(np.complex64): np.complex128}
    return jax.tree_util.tree_map(
        lambda x: jnp.asarray(np.asarray(x), wider.get(np.dtype(x.dtype), x.dtype)), tree)


_STEP_FNS: dict = {}  # id(opt) -> (opt, its jitted step): one compile per optimizer object


def run_jitted(opt: Any, params: Any, grads: list) -> tuple:
    """``([params after step 1, 2, ...], final state)``: one jitted step per gradient.

    The jitted step is kept per optimizer object (with the object, so its id stays
    unique), so calling this again with the same ``opt`` does not recompile.
    """
    if id(opt) not in _STEP_FNS:
        def step(p, s, g):
            u, s = opt.update(g, s, p)
            return ft.apply_updates(p, u), s
        _STEP_FNS[id(opt)] = (opt, jax.jit(step))
    step = _STEP_FNS[id(opt)][1]
    state, out = opt.init(params), []
    for g in grads:
        params, state = step(params, state, g)
        out.append(params)
    return out, state


def jitted_steps(opt: Any, params: Any, grads: Any, steps: int = 4) -> tuple:
    """``(params, state)`` after ``steps`` steps with the same gradients, all in one jit."""
    @jax.jit
    def run(params):
        state = opt.init(params)
        for _ in range(steps):
            updates, state = opt.update(grads, state, params)
            params = ft.apply_updates(params, updates)
        return params, state
    return run(params)


# --------------------------------------------------------------------------
# Hand-derived formulas (numpy, float64)
# --------------------------------------------------------------------------

FORMULA_P0 = np.array([0.5, -1.5, 2.0, 0.0], np.float64)
FORMULA_GRADS = [np.array([0.1, -2.0, 0.3, 1.0]), np.array([-0.4, 0.5, 0.0, 2.0]),
                 np.array([1.0, 1.0, -1.0, -0.5])]


def run_on_formula_inputs(opt: Any, steps: int = len(FORMULA_GRADS)) -> list:
    """Params (float64 copies) after each step from ``FORMULA_P0`` with ``FORMULA_GRADS``."""
    p = jnp.asarray(FORMULA_P0, jnp.float32)
    state = opt.init(p)
    out = []
    for g in FORMULA_GRADS[:steps]:
        u, state = opt.update(jnp.asarray(g, jnp.float32), state, p)
        p = ft.apply_updates(p, u)
        out.append(np.asarray(p, np.float64))
    return out


def check_against_formula(opt: Any, reference: list) -> None:
    """Every step of ``opt`` equals the hand-written ``reference`` trajectory (float32 rounding)."""
    ours = run_on_formula_inputs(opt)
    assert len(ours) == len(reference)
    for ours_p, theirs_p in zip(ours, reference):
        np.testing.assert_allclose(ours_p, theirs_p, rtol=1e-5, atol=1e-7)


def updates_of(tx: Any, grads: list = None, params: Any = FORMULA_P0, **extra: Any) -> list:
    """The updates (float64 copies) of each step of ``tx`` on fixed ``params``.

    ``grads`` defaults to ``FORMULA_GRADS``; ``params=None`` passes no params.
    """
    grads = FORMULA_GRADS if grads is None else grads
    p = None if params is None else jnp.asarray(params, jnp.float32)
    state = tx.init(jnp.zeros(np.shape(grads[0]), jnp.float32) if p is None else p)
    out = []
    for g in grads:
        u, state = tx.update(jnp.asarray(g, jnp.float32), state, p, **extra)
        out.append(np.asarray(u, np.float64))
    return out


def assert_updates(ours: list, reference: list, rtol: float = 1e-5, atol: float = 1e-7) -> None:
    """Step by step, ``ours`` equals the hand-derived ``reference`` (float32 rounding)."""
    assert len(ours) == len(reference)
    for t, (a, b) in enumerate(zip(ours, reference)):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"step {t}")


def tight(got: Any, expected: Any) -> None:
    """Documents printed ~8 significant digits: agree to float32 rounding."""
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=3e-7, atol=1e-10)


def loose(got: Any, expected: Any) -> None:
    """Documents printed ~3 significant digits: agree to that rounding."""
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=6e-3, atol=1e-7)


# --------------------------------------------------------------------------
# Properties every wrapper and combinator keeps
# --------------------------------------------------------------------------

def assert_empty_params_step(opt: Any) -> None:
    """init and a jitted update on ``{}`` give ``{}``."""
    state = opt.init({})
    updates, state = jax.jit(lambda s: opt.update({}, s, {}))(state)
    assert updates == {}


def assert_state_donatable(opt: Any) -> None:
    """The state initialises abstractly (same structure), has distinct buffers, and donates."""
    params = {"w": jnp.ones((2, 2)), "b": jnp.ones(2)}
    abstract = jax.eval_shape(opt.init, params)
    state = opt.init(params)
    assert jax.tree_util.tree_structure(abstract) == jax.tree_util.tree_structure(state)
    buffers = [id(x) for x in jax.tree_util.tree_leaves(state)]
    assert len(buffers) == len(set(buffers))
    step = jax.jit(lambda p, s, g: opt.update(g, s, p), donate_argnums=1)
    for _ in range(2):
        _, state = step(params, state, {"w": jnp.ones((2, 2)), "b": jnp.ones(2)})
    jax.block_until_ready(state)


def run_two_processes(worker: str, out: str, timeout: int = 240) -> Any:
    """Run ``worker`` as 2 processes (``worker RANK PORT OUT``, a free loopback port, JAX
    distributed between them) under ``timeout`` seconds each; the ``.npz`` they write to
    ``out``. A process that fails, or does not exit in time, fails with their output.
    """
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [subprocess.Popen([sys.executable, worker, str(i), str(port), out], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-3000:]
    return np.load(out)


def run_on_eight_devices(script: Any, timeout: int = 900) -> dict:
    """Run ``script`` (a path) in a subprocess with 8 simulated CPU devices; its last stdout
    line starting with ``{``, as JSON (``--xla_force_host_platform_device_count`` only works
    before JAX starts, and the pytest process already has one device).

    The repository root is the working directory and on ``PYTHONPATH``; XLA's backend
    optimization level 0 halves XLA:CPU's compile time for these checks. A non-zero exit or
    no JSON line fails with the subprocess's output.
    """
    import json
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "",
                   os.environ.get("XLA_FLAGS", ""))
    env = dict(os.environ,
               XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count=8 "
                         f"--xla_backend_optimization_level=0".strip(),
               JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(script)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, (
        f"{Path(script).name} exited with {proc.returncode}\n"
        f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-6000:]}")
    return json.loads(lines[-1])


def api_pages() -> dict[str, str]:
    """docs/api/*.rst: file name -> its text, each ``.. declared-modules::`` expanded into the
    entries it generates (docs/_ext/declared_modules.py), as Sphinx reads it."""
    import pathlib
    import sys
    docs = pathlib.Path(__file__).resolve().parent.parent / "docs"
    if str(docs / "_ext") not in sys.path:
        sys.path.insert(0, str(docs / "_ext"))
    import declared_modules
    return {page.name: declared_modules.expand(page.read_text())
            for page in sorted((docs / "api").glob("*.rst"))}


# --------------------------------------------------------------------------
# Losses against optax
# --------------------------------------------------------------------------

def rounding_bound(dtype: Any, steps: float, magnitude: Any) -> float:
    """How far two correct computations of the same quantity may differ: ``steps`` roundings,
    each at most one unit of ``dtype``'s epsilon relative to the largest intermediate value
    ``magnitude`` (a sum of ``n`` terms counts ``n`` steps, an ``exp`` or ``log`` one, ...)."""
    return float(steps) * float(jnp.finfo(dtype).eps) * float(magnitude)


class LossCase(NamedTuple):
    """One comparison of a functrain loss with optax's: see :func:`loss_case`."""

    ours: Callable
    theirs: Callable
    args: tuple
    kwargs: dict
    steps: float
    magnitude: Optional[float]
    grad_argnums: tuple
    grad_magnitude: Optional[float]


def loss_case(ours: Callable, theirs: Callable, *args: Any, steps: float,
              magnitude: Optional[float] = None, grad_argnums: tuple = (),
              grad_magnitude: Optional[float] = None, **kwargs: Any) -> LossCase:
    """``ours(*args, **kwargs)`` against ``theirs(*args, **kwargs)`` (``args`` arrays,
    ``kwargs`` anything): values within ``steps`` roundings (:func:`rounding_bound`) of
    ``magnitude`` (default: the largest finite value of optax's, at least 1); the gradient of
    the sum of the (first) output with respect to ``args[i]``, ``i`` in ``grad_argnums``,
    within ``2 * steps`` roundings (the backward pass rounds as often again) of
    ``grad_magnitude`` (default: the largest finite entry of optax's gradient, at least 1)."""
    return LossCase(ours, theirs, args, kwargs, steps, magnitude, tuple(grad_argnums),
                    grad_magnitude)


def _evaluate(fn: Callable, case: LossCase, args: tuple) -> tuple:
    def value(*a: Any) -> Any:
        return fn(*a, **case.kwargs)

    out = value(*args)
    if not case.grad_argnums:
        return out, ()
    grads = jax.grad(lambda *b: jnp.sum(jax.tree_util.tree_leaves(value(*b))[0]),
                     argnums=case.grad_argnums)(*args)
    return out, grads


def assert_losses_like_optax(*cases: LossCase, jit: bool = True) -> list:
    """Every case's values and gradients are optax's (shape, dtype, NaNs, infinities, and the
    numbers to the case's rounding bound). All cases run in one function, jitted unless
    ``jit=False`` (then eager, op by op): one compilation for the lot. Returns functrain's
    outputs, case by case."""
    def run(all_args: list) -> list:
        return [(_evaluate(c.ours, c, a), _evaluate(c.theirs, c, a))
                for c, a in zip(cases, all_args)]

    results = (jax.jit(run) if jit else run)([c.args for c in cases])
    for n, (c, ((got, got_grads), (want, want_grads))) in enumerate(zip(cases, results)):
        name = f"case {n} ({getattr(c.ours, '__name__', c.ours)}, {c.kwargs or ''})"
        got_leaves, want_leaves = (jax.tree_util.tree_leaves(got),
                                   jax.tree_util.tree_leaves(want))
        assert len(got_leaves) == len(want_leaves), name
        for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
            assert g.dtype == w.dtype, f"{name} output {i}: dtype {g.dtype}, optax's {w.dtype}"
            _same_numbers(g, w, w.dtype, c.steps, c.magnitude, f"{name} output {i}")
        for i, g, w in zip(c.grad_argnums, got_grads, want_grads):
            assert g.dtype == w.dtype, f"{name} gradient {i}: dtype {g.dtype}, optax's {w.dtype}"
            _same_numbers(g, w, w.dtype, 2 * c.steps, c.grad_magnitude,
                          f"{name} gradient in argument {i}")
    return [got for (got, _), _ in results]


def assert_loss_like_optax(ours: Callable, theirs: Callable, *args: Any, jit: bool = True,
                           **options: Any) -> None:
    """One :func:`loss_case` (same arguments), checked by :func:`assert_losses_like_optax`."""
    assert_losses_like_optax(loss_case(ours, theirs, *args, **options), jit=jit)


def _same_numbers(got: Any, want: Any, dtype: Any, steps: float, magnitude: Optional[float],
                  what: str) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, optax's {want.shape}"
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{what}: NaNs")
    infinite = np.isinf(want)
    np.testing.assert_array_equal(got[infinite], want[infinite], err_msg=f"{what}: infinities")
    finite = np.isfinite(want)
    if not jnp.issubdtype(dtype, jnp.inexact):      # integers: no rounding at all
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    if magnitude is None:
        magnitude = max(1.0, float(np.abs(want[finite]).max(initial=0.0)))
    bound = rounding_bound(dtype, steps, magnitude)
    np.testing.assert_allclose(got[finite], want[finite], rtol=0, atol=bound,
                               err_msg=f"{what}: beyond {steps} roundings of {magnitude:.3g}")
