"""The matrix optimizers' H100 programs against hand counts of their matmuls and decompositions.

For muon, normuon, adamuon, dion, splus, soap, shampoo and kron (the registry's arguments,
otherwise every default; and optax.contrib.muon) on ``accel_compile.TREES["large"]`` (8 kernels
of (1024, 4096), 8 biases of (4096,)): (a) a hand count of one step, every term named, split
into the every-step matmuls, one iteration of a loop (Newton-Schulz) times its trip count, and
the refresh conditional's largest branch, with the decompositions apart; (b) the compiled H100
program's flops from XLA's cost analysis (``accel_compile._cost``) and the dots of its
optimized HLO with their loops' trip counts (:func:`dot_census`).

How XLA's cost analysis counts (measured by :func:`probe`, in ``results/matrix_flops.md``):

* The deviceless H100 executable has no cost analysis (``cost_analysis()`` is ``None``):
  ``accel_compile._cost`` runs XLA's generic ``HloCostAnalysis`` on the optimized module. A
  dot is ``2 m k n``, plus ``(splits - 1) m n`` where the H100 compiler splits it along K.
* A ``while`` loop counts its body ONCE, whatever its trip count: a ``fori_loop`` of 5 dots
  of 256 x 256 matrices is 1.006 dots, the same loop unrolled 5.03.
* A ``conditional`` counts its LARGEST branch: ``cond(p, 1 dot, 3 dots)`` and ``cond(p, 3
  dots, 1 dot)`` are both 3.02 dots (not the sum, not the true branch).
* A custom call counts ``-1`` (unknown): ``eigh`` (``cusolver_syevd_ffi``), ``qr``
  (``cusolver_geqrf_ffi`` and ``cusolver_orgqr_ffi``: ``-2``), a triangular solve
  (``__cublas$triangularSolve``): decompositions and solves are invisible to it.

So like is compared with like twice: the hand count "as XLA counts" (every-step matmuls, ONE
loop iteration, the refresh branch, no decompositions) against the cost analysis (whose
remainder is the element-wise work), and all the hand count's matmuls (every iteration)
against the HLO's dots times their trip counts.

Run ``python benchmarks/matrix_flops.py [--names muon soap] [--quick] [--probe]``: each compile
in a fresh process of ``.venv-accel-cuda`` under ``--timeout``. Without ``--quick`` (a small
tree, nothing written) writes ``benchmarks/results/matrix_flops.{md,json}``.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import os
import re
import subprocess
import sys
from typing import Callable, NamedTuple, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import accel_compile  # noqa: E402  (imports jax; no backend starts in this process)

PYTHON = os.path.join(ROOT, ".venv-accel-cuda", "bin", "python")
NAMES = ("muon", "normuon", "adamuon", "dion", "splus", "soap", "shampoo", "kron")
#: ``--quick``'s tree (and the test's): two small kernels and a bias.
QUICK = {"a/kernel": (256, 1024), "b/kernel": (256, 1024), "a/bias": (1024,)}
LIMIT = 1.2  # the bar: compiled flops within 1.2x of the hand count
#: What the cost analysis' remainder is, where it is more than a few flops per parameter.
NOTES = {"kron": "most of the remainder is the whitening noise, a normal draw per parameter in "
                 "the refresh branch (threefry and erf_inv: about 160 flops a draw, probe below)"}


# ---- Hand counts

class Count(NamedTuple):
    """One step's flops by hand, term name -> flops for the whole tree: ``every_step`` (matmuls
    outside loops and conditionals), ``loop`` (ONE iteration of a loop run ``iterations``
    times; 0: none), ``refresh`` (the refresh conditional's largest branch), ``decompositions``
    (eigh, QR, triangular solves: custom calls, uncounted by XLA's cost analysis; textbook
    counts), and ``when`` the refresh and the decompositions run."""

    every_step: dict
    loop: dict
    iterations: int
    refresh: dict
    decompositions: dict
    when: str


def _mm(m: int, k: int, n: int) -> int:
    """An ``(m, k) @ (k, n)`` product: ``2 m k n`` flops (a multiply and an add each)."""
    return 2 * m * k * n


def _eigh(d: int) -> float:
    """A symmetric ``d x d`` eigendecomposition with eigenvectors: about ``9 d^3`` (Golub & Van
    Loan, "Matrix Computations", 8.3, the symmetric QR algorithm; cuSOLVER's divide and
    conquer ``syevd`` is of the same order)."""
    return 9.0 * d ** 3


def _qr(m: int, n: int) -> float:
    """Householder QR of an ``(m, n)`` matrix, ``m >= n``, and its thin ``Q`` formed: ``2 n^2 (m
    - n / 3)`` each (LAPACK's ``geqrf`` and ``orgqr`` operation counts)."""
    return 4.0 * n * n * (m - n / 3)


def newton_schulz_iteration(m: int, n: int) -> dict:
    """One Newton-Schulz step ``X <- a X + (b A + c A A) X``, ``A = X X^T``, on an ``(m, n)``
    matrix (``m <= n``: Muon transposes the taller ones first).

    Args:
      m: the shorter side.
      n: the longer side.

    Returns:
      ``{"X X^T": 2 m^2 n, "A A": 2 m^3, "B X": 2 m^2 n}``.
    """
    return {"X X^T": _mm(m, n, m), "A A": _mm(m, m, m), "B X": _mm(m, m, n)}


def _matrices(tree: dict) -> list:
    return [tuple(s) for s in tree.values() if len(s) == 2]


def _add(total: dict, terms: dict, times: int = 1) -> dict:
    for key, value in terms.items():
        total[key] = total.get(key, 0) + times * value
    return total


def _muon(tree: dict, ns_steps: int = 5) -> Count:
    """Muon, NorMuon and AdaMuon: ``ns_steps`` Newton-Schulz iterations per 2-D leaf (a
    ``fori_loop`` / ``scan``: one loop for the stacked leaves); the 1-D leaves' AdamW and the
    momentum, normalizations and per-neuron scaling are element-wise."""
    loop: dict = {}
    for m, n in _matrices(tree):
        _add(loop, newton_schulz_iteration(min(m, n), max(m, n)))
    return Count({}, loop, ns_steps, {}, {}, "no refresh")


def _muon_unrolled(tree: dict, ns_steps: int = 5) -> Count:
    """optax.contrib.muon: the same Newton-Schulz iterations, unrolled (a Python loop), so all
    of them are outside any loop."""
    loop = _muon(tree, ns_steps).loop
    return Count({f"{k} (x{ns_steps}, unrolled)": ns_steps * v for k, v in loop.items()}, {}, 0,
                 {}, {}, "no refresh; Newton-Schulz unrolled: every iteration counted")


def _dion(tree: dict, rank_fraction: float = 1.0) -> Count:
    """Dion: per 2-D leaf, seen as ``B`` ``(rows, cols)`` with rows >= cols and rank ``r``
    (full by default), one power-iteration step: ``B Q``, QR, ``B^T P``, ``P R^T`` (error
    feedback) and ``P Q^T`` (the update), every step."""
    step: dict = {}
    decomp: dict = {}
    for m, n in _matrices(tree):
        rows, cols = max(m, n), min(m, n)
        r = min(cols, math.ceil(rank_fraction * cols))
        _add(step, {"B Q": _mm(rows, cols, r), "B^T P": _mm(cols, rows, r),
                    "P R^T": _mm(rows, r, cols), "P Q^T": _mm(rows, r, cols)})
        _add(decomp, {"QR of B Q": _qr(rows, r)})
    return Count(step, {}, 0, {}, decomp, "QR every step")


def _splus(tree: dict) -> Count:
    """SPlus: per 2-D leaf ``(m, n)`` (both sides rotated below ``max_dim = 10000``), the
    momentum rotated into the eigenbases and back (four products), and the two statistics
    ``G G^T``, ``G^T G``; the refresh (step 1, then every 100) is ``eigh`` of both."""
    step: dict = {}
    decomp: dict = {}
    for m, n in _matrices(tree):
        _add(step, {"Q_L^T M": _mm(m, m, n), "(.) Q_R": _mm(m, n, n),
                    "Q_L sign(.)": _mm(m, m, n), "(.) Q_R^T": _mm(m, n, n),
                    "G G^T": _mm(m, n, m), "G^T G": _mm(n, m, n)})
        _add(decomp, {"eigh L": _eigh(m), "eigh R": _eigh(n)})
    return Count(step, {}, 0, {}, decomp, "step 1, then every 100 steps")


def _soap(tree: dict) -> Count:
    """SOAP: per 2-D leaf ``(m, n)`` (both sides rotated below ``max_precond_dim = 10000``), three
    rotations (the gradient and the momentum in, the direction back: two products each) and
    the statistics ``G G^T``, ``G^T G``. One ``lax.switch`` per leaf: ``eigh`` on the first
    call, a power step ``L Q``, ``R Q`` and QR every 10 calls (the largest branch)."""
    step: dict = {}
    refresh: dict = {}
    decomp: dict = {}
    for m, n in _matrices(tree):
        for what in ("G", "M", "direction (back)"):
            _add(step, {f"rotate {what}, left": _mm(m, m, n),
                        f"rotate {what}, right": _mm(m, n, n)})
        _add(step, {"G G^T": _mm(m, n, m), "G^T G": _mm(n, m, n)})
        _add(refresh, {"L Q_L": _mm(m, m, m), "R Q_R": _mm(n, n, n)})
        _add(decomp, {"QR of L Q_L": _qr(m, m), "QR of R Q_R": _qr(n, n)})
    return Count(step, {}, 0, refresh, decomp, "QR every 10 calls (eigh on the first)")


def _shampoo(tree: dict, block_size: int = 128, max_precond_dim: int = 4096) -> Count:
    """Shampoo: per 2-D leaf cut into ``b x b`` blocks (``block_size = 128``), per block the
    statistics ``G G^T``, ``G^T G`` and the preconditioned ``P_L G P_R``; the refresh (every step
    from step 5: ``precondition_frequency = 1``) forms each root ``V diag V^T`` from ``eigh``."""
    step: dict = {}
    refresh: dict = {}
    decomp: dict = {}
    for m, n in _matrices(tree):
        left, right = m <= max_precond_dim, n <= max_precond_dim
        (kr, br), (kc, bc) = [(k, -(-d // k)) for d, on in ((m, left), (n, right)) for k in
                              [1 if d <= block_size or not on else -(-d // block_size)]]
        blocks = kr * kc
        if left:
            _add(step, {"G G^T": _mm(br, bc, br), "P_L G": _mm(br, br, bc)}, blocks)
            _add(refresh, {"root L = V s V^T": _mm(br, br, br)}, blocks)
            _add(decomp, {"eigh L": _eigh(br)}, blocks)
        if right:
            _add(step, {"G^T G": _mm(bc, br, bc), "(.) P_R": _mm(br, bc, bc)}, blocks)
            _add(refresh, {"root R = V s V^T": _mm(bc, bc, bc)}, blocks)
            _add(decomp, {"eigh R": _eigh(bc)}, blocks)
    return Count(step, {}, 0, refresh, decomp, "every step from step 5")


def _kron(tree: dict, max_size: int = 8192) -> Count:
    """PSGD Kron: per 2-D leaf ``(d_0, d_1)`` with triangular factors (both at most
    ``max_size_triangular = 8192``), ``P m`` axis by axis (``Q_i^T Q_i`` formed where ``d_i^2``
    is at most the leaf's size, else ``Q_i`` then ``Q_i^T``); the preconditioner update (a coin
    flip: probability 1 for 500 steps, then down to 0.03) takes ``A = Q h``, ``B = Q^{-T} v``
    (triangular solves), the Gram matrices of both, two norm-bound matvecs and ``triu(.) Q``."""
    step: dict = {}
    refresh: dict = {}
    decomp: dict = {}
    for shape in _matrices(tree):
        size = math.prod(shape)
        for i, d in enumerate(shape):
            if d <= 1 or d > max_size:
                continue
            r = size // d
            if d * d <= size:
                _add(step, {f"Q_{i}^T Q_{i}": _mm(d, d, d), f"P_{i} m": _mm(d, d, r)})
            else:
                _add(step, {f"Q_{i} m": _mm(d, d, r), f"Q_{i}^T (.)": _mm(d, d, r)})
            _add(refresh, {f"A = Q_{i} h": _mm(d, d, r), f"A A^T (axis {i})": _mm(d, r, d),
                           f"B B^T (axis {i})": _mm(d, r, d),
                           f"norm bound (axis {i})": 2 * _mm(d, d, 1),
                           f"triu(.) Q_{i}": _mm(d, d, d)})
            _add(decomp, {f"B = Q_{i}^-T v (solve)": float(d * d * r)})
    return Count(step, {}, 0, refresh, decomp, "coin flip: p = 1 for 500 steps, then to 0.03")


HAND: dict[str, Callable[[dict], Count]] = {
    "muon": _muon, "normuon": _muon, "adamuon": _muon, "optax:muon": _muon_unrolled,
    "dion": _dion, "splus": _splus, "soap": _soap, "shampoo": _shampoo, "kron": _kron}


def hand_count(name: str, tree: dict) -> Count:
    """One step of optimizer ``name`` (its defaults) on ``tree``, by hand.

    Args:
      name: a key of ``HAND`` (``optax:muon``: optax's Muon, the same matmuls, unrolled).
      tree: leaf name -> shape (float32); the 2-D leaves are the matrices.

    Returns:
      The :class:`Count`, flops for the whole tree.
    """
    return HAND[name](tree)


def totals(count: Count) -> tuple[float, float]:
    """The hand count as XLA's cost analysis counts (the loop's body once), and all of it.

    Args:
      count: a :class:`Count`.

    Returns:
      ``(every-step + ONE loop iteration + refresh branch, every-step + every loop iteration +
      refresh branch)`` matmul flops; no decompositions in either.
    """
    step, loop, refresh = (sum(getattr(count, k).values())
                           for k in ("every_step", "loop", "refresh"))
    return step + loop + refresh, step + count.iterations * loop + refresh


# ---- The dots of an optimized HLO module, with their loops' trip counts

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"^[a-z][a-z0-9]*\[([\d,]*)\]")
_CALLEES = re.compile(r"(?:calls|to_apply|condition|body|true_computation|false_computation)"
                      r"=%?([\w.\-]+)")


def _computations(hlo: str) -> tuple[dict, str]:
    """Computation name -> its instruction lines, and the entry's name."""
    comps, entry, name = {}, None, None
    for line in hlo.splitlines():
        head = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$", line)
        if head and not line.startswith(" "):
            name = head.group(2)
            comps[name] = []
            entry = name if head.group(1) else entry
        elif line.startswith("}"):
            name = None
        elif name is not None:
            comps[name].append(line)
    return comps, entry


def dot_census(hlo: str) -> dict:
    """The dots of an optimized HLO module (``compiled.as_text()``), each ``2 * prod(out) *
    prod(contracted)`` flops times the trip counts (``known_trip_count``) of the loops around it.

    Args:
      hlo: the module's text.

    Returns:
      ``{"largest": flops with each conditional's largest branch, "smallest": with its smallest
      (a step that does not refresh), "dots": [{"op", "shape", "flops", "times", "where"}],
      "custom_calls": {target: count}, "unknown_trip_counts": loops without one}``.
    """
    comps, entry = _computations(hlo)
    dots, unknown = [], []

    def walk(comp: str, times: int, where: str, pick: Callable, record: bool) -> float:
        shapes, total = {}, 0.0
        for line in comps.get(comp, []):
            found = _INSTR.match(line)
            if not found:
                continue
            name, typ, op, rest = found.groups()
            array = _ARRAY.match(typ)
            if array:
                shapes[name] = [int(x) for x in array.group(1).split(",") if x]
            if op == "dot":
                lhs = re.match(r"\s*%?([\w.\-]+)", rest).group(1)
                contract = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest).group(1)
                k = math.prod(shapes[lhs][int(i)] for i in contract.split(",") if i)
                flops = 2.0 * math.prod(shapes[name]) * k
                total += flops
                if record:
                    meta = re.search(r'op_name="([^"]*)"', rest)
                    dots.append({"op": meta.group(1) if meta else name, "flops": flops,
                                 "shape": f"{shapes[lhs]} -> {shapes[name]}", "times": times,
                                 "where": where})
            elif op == "while":
                body = re.search(r"body=%?([\w.\-]+)", rest).group(1)
                trip = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', rest)
                if trip is None and record:
                    unknown.append(name)
                n = int(trip.group(1)) if trip else 1
                total += n * walk(body, times * n, f"{where}loop x{n} > ", pick, record)
            elif op == "conditional":
                branches = re.search(r"branch_computations=\{([^}]*)\}", rest)
                names = ([b.strip().lstrip("%") for b in branches.group(1).split(",")]
                         if branches else re.findall(
                             r"(?:true|false)_computation=%?([\w.\-]+)", rest))
                costs = [walk(b, times, f"{where}{name} branch {i} > ", pick, record)
                         for i, b in enumerate(names)]
                total += pick(costs) if costs else 0.0
            else:
                total += sum(walk(c, times, where, pick, record)
                             for c in _CALLEES.findall(rest))
        return total

    largest = walk(entry, 1, "", max, True)
    smallest = walk(entry, 1, "", min, False)
    calls = dict(collections.Counter(re.findall(r'custom_call_target="([^"]+)"', hlo)))
    return {"largest": largest, "smallest": smallest, "dots": dots, "custom_calls": calls,
            "unknown_trip_counts": unknown}


# ---- Compiling (in a worker process of the CUDA venv)

def measure(target: str, tree: str, name: str) -> dict:
    """Compile the donated ``(params, state, grads) -> (params, state)`` step of registry
    optimizer ``name`` for ``target`` on ``accel_compile.TREES[tree]``
    (``accel_compile.compile_registry_step``) and count it.

    Args:
      target: ``"h100"``, ``"tpu_v5e"`` or ``"cpu"``.
      tree: a key of ``accel_compile.TREES``.
      name: a registry name, or ``optax:`` and one (optax's optimizer).

    Returns:
      ``{"name", "tree", "params", "flops" (the cost analysis'), "census"`` (:func:`dot_census`)
      ``, "kernels", "jax"}``.
    """
    import jax
    library = "optax" if name.startswith("optax:") else "functrain"
    compiled, _, _ = accel_compile.compile_registry_step(target, tree, name.split(":")[-1],
                                                         library)
    text = compiled.as_text()
    return {"name": name, "tree": tree, "jax": jax.__version__,
            "params": sum(math.prod(s) for s in accel_compile.TREES[tree].values()),
            "flops": float(accel_compile._cost(compiled).get("flops", float("nan"))),
            "kernels": accel_compile.kernel_count(text), "census": dot_census(text)}


def probe(target: str = "h100", n: int = 256) -> list:
    """How the cost analysis counts loops, conditionals and custom calls: tiny programs of
    ``(n, n)`` float32 matrices compiled for ``target``, their flops in units of one dot.

    Args:
      target: as :func:`measure`.
      n: the matrices' size.

    Returns:
      Per program ``{"program", "flops", "dots", "custom_calls"}`` (``dots``: flops / 2 n^3).
    """
    import jax
    import jax.numpy as jnp
    placed = accel_compile.placed_on(target)
    a = jax.ShapeDtypeStruct((n, n), jnp.float32, sharding=placed)
    p = jax.ShapeDtypeStruct((), jnp.float32, sharding=placed)
    three = lambda x, y: ((x @ y) @ y) @ y  # noqa: E731
    programs = {
        "one dot": (lambda x, y: x @ y, (a, a)),
        "fori_loop of 5 dots": (lambda x, y: jax.lax.fori_loop(0, 5, lambda i, z: z @ y, x),
                                (a, a)),
        "the same, unrolled": (lambda x, y: jax.lax.fori_loop(
            0, 5, lambda i, z: z @ y, x, unroll=True), (a, a)),
        "cond(1 dot, 3 dots)": (lambda x, y, q: jax.lax.cond(
            q > 0, lambda: x @ y, lambda: three(x, y)), (a, a, p)),
        "cond(3 dots, 1 dot)": (lambda x, y, q: jax.lax.cond(
            q > 0, lambda: three(x, y), lambda: x @ y), (a, a, p)),
        "eigh": (lambda x: jnp.linalg.eigh(x)[1], (a,)),
        "qr": (lambda x: jnp.linalg.qr(x)[0], (a,)),
        "triangular solve": (lambda x, y: jax.lax.linalg.triangular_solve(x, y), (a, a)),
        "normal draws (n x n)": (lambda x: x + jax.random.normal(jax.random.PRNGKey(0), (n, n)),
                                 (a,)),
    }
    out = []
    for label, (fn, args) in programs.items():
        compiled = jax.jit(fn).lower(*args).compile()
        flops = float(accel_compile._cost(compiled).get("flops", float("nan")))
        calls = sorted(set(re.findall(r'custom_call_target="([^"]+)"', compiled.as_text())))
        out.append({"program": label, "flops": flops, "dots": flops / (2.0 * n ** 3),
                    "per_entry": flops / n ** 2, "custom_calls": calls})
    return out


def run_worker(args: list, timeout: float) -> dict:
    """This file's ``--worker`` in a fresh process of the CUDA venv: its JSON, or why not.

    Args:
      args: the worker's arguments (``["probe"]`` or ``[tree, name]``).
      timeout: seconds before the compile is given up.

    Returns:
      The worker's JSON object, or ``{"error": ...}``.
    """
    try:
        done = subprocess.run([PYTHON, os.path.abspath(__file__), "--worker", *args],
                              capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env={**os.environ, "JAX_PLATFORMS": "cpu"})
    except subprocess.TimeoutExpired:
        return {"error": f"did not compile in {timeout:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail[:300]}"}
    return json.loads(lines[-1])


# ---- The table

def row(name: str, tree: dict, compiled: dict) -> dict:
    """The hand count beside the compiled numbers, per parameter.

    Args:
      name: the optimizer (a key of ``HAND``).
      tree: leaf name -> shape.
      compiled: :func:`measure`'s dict (or ``{"error": ...}``).

    Returns:
      The row: per-parameter counts, the two ratios, and the hand count's terms.
    """
    count = hand_count(name, tree)
    counted, matmuls = totals(count)
    n = sum(math.prod(s) for s in tree.values())
    out = {"name": name, "params": n, "when": count.when, "iterations": count.iterations,
           "terms": {k: {t: v / n for t, v in getattr(count, k).items()}
                     for k in ("every_step", "loop", "refresh", "decompositions")},
           "hand_as_xla_counts": counted / n, "hand_matmuls": matmuls / n,
           "hand_decompositions": sum(count.decompositions.values()) / n}
    if "error" in compiled:
        return {**out, "error": compiled["error"]}
    census = compiled["census"]
    out.update(cost_analysis=compiled["flops"] / n, hlo_dots=census["largest"] / n,
               hlo_dots_no_refresh=census["smallest"] / n,
               custom_calls=census["custom_calls"], kernels=compiled["kernels"],
               unknown_trip_counts=census["unknown_trip_counts"], jax=compiled.get("jax"),
               ratio_cost=compiled["flops"] / counted,
               ratio_dots=census["largest"] / matmuls,
               top_dots=sorted(census["dots"], key=lambda d: -d["flops"] * d["times"])[:6])
    out["difference"] = _explain(out)
    return out


def _explain(r: dict) -> str:
    """One line on what separates the compiled counts from the hand count."""
    parts = []
    rest = r["cost_analysis"] - r["hand_as_xla_counts"]
    if r["iterations"]:
        parts.append(f"the cost analysis counts the Newton-Schulz loop once (x{r['iterations']} "
                     f"in the HLO dots)")
    if r["hand_decompositions"]:
        parts.append(f"decompositions not counted ({r['hand_decompositions']:,.0f} / param, "
                     f"{r['when']})")
    elif r["when"] != "no refresh":
        parts.append(r["when"])
    if r["hlo_dots"] < r["hand_matmuls"] * 0.9995:
        parts.append(f"HLO dots {r['hand_matmuls'] - r['hlo_dots']:,.0f} / param short of the "
                     f"hand count: matrix-vector products compiled as element-wise reductions")
    parts.append(f"the cost analysis' remainder (element-wise, split-K sums): {rest:,.0f} / param")
    if r["name"] in NOTES:
        parts.append(NOTES[r["name"]])
    if not 1 / LIMIT <= r["ratio_dots"] <= LIMIT:  # which dots: the largest three
        parts.append(f"BEYOND {LIMIT}x, the largest dots: " + ", ".join(
            f"{d['op']} {d['shape']} x{d['times']} ({d['where'] or 'every step'}): "
            f"{d['flops'] * d['times'] / r['params']:,.0f} / param" for d in r["top_dots"][:3]))
    elif not 1 / LIMIT <= r["ratio_cost"] <= LIMIT:
        parts.append(f"BEYOND {LIMIT}x outside the dots: element-wise work")
    return "; ".join(parts)


def table(rows: list, probes: Optional[list] = None) -> str:
    """The Markdown text: the comparison, then how the cost analysis counts.

    Args:
      rows: :func:`row`'s dicts.
      probes: :func:`probe`'s list, or ``None``.

    Returns:
      The text.
    """
    out = ["| optimizer | hand: every step + loop iteration x trips + refresh branch | "
           "hand, as XLA counts | XLA cost analysis | ratio | hand, all matmuls | "
           "HLO dots x trip counts | ratio | decompositions (uncounted) | cost analysis / "
           "(all matmuls + decompositions) | difference |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        parts = {k: sum(v.values()) for k, v in r["terms"].items()}
        cells = [r["name"], f"{parts['every_step']:,.0f} + {parts['loop']:,.0f} x "
                 f"{r['iterations']} + {parts['refresh']:,.0f}", f"{r['hand_as_xla_counts']:,.0f}"]
        if "error" in r:
            cells += [r["error"], "", f"{r['hand_matmuls']:,.0f}", "", "", "", "", ""]
        else:
            whole = r["hand_matmuls"] + r["hand_decompositions"]
            cells += [f"{r['cost_analysis']:,.0f}", f"{r['ratio_cost']:.3f}",
                      f"{r['hand_matmuls']:,.0f}", f"{r['hlo_dots']:,.0f}",
                      f"{r['ratio_dots']:.3f}", f"{r['hand_decompositions']:,.0f}",
                      f"{r['cost_analysis'] / whole:.2f}", r["difference"]]
        out.append("| " + " | ".join(cells) + " |")
    done = [r for r in rows if "error" not in r]
    far = [max(r["ratio_cost"], 1 / r["ratio_cost"], r["ratio_dots"], 1 / r["ratio_dots"])
           for r in done]
    if done:
        worst = done[far.index(max(far))]
        out += ["", f"Both ratios within {LIMIT}x: {sum(f <= LIMIT for f in far)} of {len(done)}"
                f" optimizers; farthest from 1: {worst['name']} ({worst['ratio_cost']:.3f}, "
                f"{worst['ratio_dots']:.3f}). The next-to-last column: the cost analysis over a "
                f"refresh step's work (every Newton-Schulz iteration, every decomposition)."]
    if probes:
        out += ["", "How XLA's cost analysis counts (256 x 256 float32 programs compiled for the "
                "H100; one dot = 2 * 256^3 flops):", "",
                "| program | flops | in dots | per output entry | custom calls |",
                "|---|---:|---:|---:|---|"]
        out += [f"| {p['program']} | {p['flops']:,.0f} | {p['dots']:.3f} | {p['per_entry']:.1f} | "
                f"{', '.join(p['custom_calls']) or '–'} |" for p in probes]
    return "\n".join(out)


def main() -> None:
    """The command line (the module's docstring).

    Returns:
      Nothing: prints the rows and the table, and writes them unless ``--quick``.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--names", nargs="+", default=[*NAMES, "optax:muon"])
    parser.add_argument("--quick", action="store_true", help="a small tree; nothing written")
    parser.add_argument("--probe", action="store_true", help="only the counting probes")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    accel_compile.TREES.setdefault("quick", QUICK)
    if args.worker:  # in the CUDA venv: one compile (or the probes), one JSON line
        if args.worker == ["probe"]:
            return print(json.dumps({"probes": probe()}))
        return print(json.dumps(measure("h100", *args.worker)))
    if not os.path.exists(PYTHON):
        sys.exit(f"no {PYTHON}: make accel builds it")
    probes = run_worker(["probe"], args.timeout)
    if args.probe:
        return print(json.dumps(probes, indent=1))
    tree = "quick" if args.quick else "large"
    rows = []
    for name in args.names:
        rows.append(row(name, accel_compile.TREES[tree], run_worker([tree, name], args.timeout)))
        print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("terms", "top_dots")}),
              flush=True)
    text = (f"Compiled on {datetime.date.today()} for one H100 (deviceless, JAX "
            f"{next((r['jax'] for r in rows if r.get('jax')), '?')}), tree {tree!r}: flops per "
            f"parameter. Hand counts: matmuls only (benchmarks/matrix_flops.py names each "
            f"term); 'as XLA counts': one Newton-Schulz iteration, the refresh branch, no "
            f"decompositions.\n\n" + table(rows, probes.get("probes")))
    if args.quick:
        return print(text)
    from beyond_optax import save_table
    save_table({"tree": tree, "rows": rows, "probes": probes.get("probes")}, text, args.out,
               "matrix_flops")


if __name__ == "__main__":
    main()
