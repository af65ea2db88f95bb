#!/usr/bin/env python
"""The largest decoder-only transformer whose whole training step fits in one H100 (or one
TPU v5e chip), per optimizer configuration, as the device's compiler says (deviceless, on
this CPU machine).

The step is ``loss, grads = value_and_grad(loss_fn)(params, batch)``, ``opt.update``,
``apply_updates``, jitted with the params and optimizer state donated, lowered on
``ShapeDtypeStruct`` s placed on one H100 of a deviceless topology
(``benchmarks/accel_compile.py``'s ``devices("h100")``, XLA's device description
``benchmarks/h100_sxm.txtpb``) and compiled by the CUDA plugin's compiler. Its
``memory_analysis()`` gives the bytes of the arguments, outputs, the outputs aliasing
donated arguments, and temporaries; the step's peak is ``argument + output - alias + temp``.
Nothing is counted by hand.

The model (written here, plain JAX): token embedding (vocabulary ``VOCAB``), ``n_layers``
pre-RMSNorm blocks of causal multi-head attention (head dimension 128,
``d_model = 128 * heads``; separate q, k, v, o projections without biases) and a GELU MLP of
width ``4 * d_model`` (``jax.nn.gelu``'s tanh form, no biases), a final RMSNorm and an
untied output projection. The blocks' weights are stacked on a leading layer axis and run by
``jax.lax.scan`` over a ``jax.checkpoint`` ed block (remat per layer: the backward pass keeps
each block's input and recomputes the rest). Activations are bfloat16 (float32 params are
cast to bfloat16 where each matmul reads them); the norms, the attention softmax and the
cross-entropy are float32. Attention is the plain ``softmax(q k^T) v`` (its (B, H, S, S)
scores are materialized: no flash attention). A batch is ``BATCH`` sequences of ``SEQ``
int32 tokens and their next-token targets.

Parameters: ``2 * VOCAB * d + d + n_layers * (12 d^2 + 2 d)`` (:func:`param_count`).

The configurations (:data:`CONFIGS`): optax's and functrain's ``adamw(1e-4)`` on float32
params; and on bfloat16 params functrain's ``compensated_params`` (float32 master values
kept as the bf16 weight plus a bf16 or int8 rounding error) around ``adamw`` with float32
moments, or around ``quantized_state(adamw, bits=8 or 4)`` with an int8 compensation.

Per configuration the sizes of a ladder (:func:`ladder`: ``d_model`` 2048..8192, growing by
about 1.3x from about 1B parameters) are bisected for the largest whose peak is at most the
H100's memory (``LIMIT``: the ``device_memory_size`` of ``h100_sxm.txtpb``,
84,942,979,072 bytes = 79.1 GiB; 80 GiB = 85.9e9 bytes is more than the device has). The
bisection assumes the peak grows along the ladder. At the largest fitting size two more
compiles: the same step with stateless SGD (the model's own temp) and the optimizer's step
alone (its own temp).

With ``--target tpu_v5e`` (run in the TPU venv) the step is compiled for one chip of a
deviceless v5e 2x2 by libtpu, whose compiler itself refuses a step beyond the chip's memory
(``TPU_V5E_LIMIT``, 15.75 GiB); the ladder starts at 0.1B parameters (widths 512..4096) and
the results go to ``benchmarks/results/capacity_tpu_v5e.{json,md}``.

Run in the CUDA venv (``make accel`` builds it):
``python benchmarks/capacity.py [--configs NAME ...] [--target T] [--quick]``; prints the
Markdown table and writes ``benchmarks/results/capacity.{json,md}`` (``--quick``: a tiny ladder and batch, for
tests; it writes nothing unless ``--out`` is given).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import time
from typing import Any, Callable, NamedTuple, Optional

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import capacity_model as model_lib  # noqa: E402
from capacity_report import markdown, table, write_plot  # noqa: E402
from capacity_model import (HEAD_DIM, MLP_RATIO, VOCAB, loss_fn,  # noqa: E402,F401
                            param_count, param_shapes)

BATCH, SEQ = 8, 2048
LEARNING_RATE = 1e-4


def _device_memory() -> int:
    """The H100's memory in bytes, from XLA's device description (``device_memory_size``)."""
    with open(os.path.join(HERE, "h100_sxm.txtpb")) as f:
        return int(re.search(r"device_memory_size:\s*(\d+)", f.read()).group(1))


#: The fit threshold in bytes: the device description's memory (79.1 GiB).
LIMIT = _device_memory()

#: One TPU v5e chip's memory as its compiler counts it: a step that does not fit fails to
#: compile with "RESOURCE_EXHAUSTED: Ran out of memory on HBM, ... exceeds available HBM
#: (15.75G)" (libtpu with JAX 0.10.2), i.e. 16 GiB less 256 MiB the runtime keeps.
TPU_V5E_LIMIT = int(15.75 * 2**30)


class Target(NamedTuple):
    """Where the step is compiled: the device name, its fit threshold and its ladder."""

    device: str  # accel_compile.devices' name
    title: str  # in the results' heading
    limit: int  # bytes
    ladder: dict  # ladder()'s arguments
    out: str  # the results' prefix under benchmarks/results


#: The targets: one H100 (the ladder from 1B params) and one TPU v5e chip (from 0.1B, widths
#: 512..4096). "cpu" compiles for this machine with the H100's threshold (tests).
TARGETS: dict[str, Target] = {
    "h100": Target("h100", "one H100", LIMIT, {}, "capacity"),
    "tpu_v5e": Target("tpu_v5e", "one TPU v5e chip", TPU_V5E_LIMIT,
                      dict(start=1e8, min_width=512, max_width=4096), "capacity_tpu_v5e"),
    "cpu": Target("cpu", "this CPU (tests)", LIMIT, {}, "capacity_cpu"),
}


# --------------------------------------------------------------------------
# The configurations
# --------------------------------------------------------------------------

class Config(NamedTuple):
    """One optimizer configuration: the params' dtype, the optimizer and its library.

    With ``release``, the step is ``functrain.gradient_release``'s: each layer's optimizer
    step inside the backward pass (the model's parts: ``capacity_model.embed``, ``block``,
    ``head``), so the whole gradient tree is never held.
    """

    param_dtype: Any
    optimizer: Any  # GradientTransformation
    library: Any  # the module whose apply_updates the step uses
    release: bool = False


def _optax_f32() -> Config:
    import optax
    return Config(jnp.float32, optax.adamw(LEARNING_RATE), optax)


def _functrain_f32() -> Config:
    import functrain
    return Config(jnp.float32, functrain.adamw(LEARNING_RATE), functrain)


def _bf16_compensated() -> Config:
    import functrain
    return Config(jnp.bfloat16, functrain.compensated_params(functrain.adamw(LEARNING_RATE)),
                  functrain)


def _int8_quantized(bits: int, release: bool = False) -> Callable[[], Config]:
    def make() -> Config:
        import functrain
        inner = functrain.quantized_state(functrain.adamw(LEARNING_RATE), bits=bits)
        return Config(jnp.bfloat16, functrain.compensated_params(
            inner, compensation_dtype=jnp.int8), functrain, release)
    return make


#: name -> a function building the configuration.
CONFIGS: dict[str, Callable[[], Config]] = {
    "optax adamw, float32 params": _optax_f32,
    "functrain adamw, float32 params": _functrain_f32,
    "bf16 params + bf16 compensation": _bf16_compensated,
    "bf16 params + int8 compensation + 8-bit moments": _int8_quantized(8),
    "bf16 params + int8 compensation + 4-bit moments": _int8_quantized(4),
    "bf16 + int8 compensation + 8-bit moments + gradient release": _int8_quantized(8, True),
    "bf16 + int8 compensation + 4-bit moments + gradient release": _int8_quantized(4, True),
}
BASELINE = "optax adamw, float32 params"


def _sgd(dtype: Any) -> Callable[[], Config]:
    def make() -> Config:
        import functrain
        return Config(dtype, functrain.sgd(LEARNING_RATE), functrain)
    return make


#: Stateless references: the same step with plain SGD (no state, an element-wise update),
#: whose temp is the model's own (activations, the recomputed block, gradients). A
#: configuration's temp beyond its reference's, at the same size, is its optimizer's.
REFERENCES: dict[str, Callable[[], Config]] = {
    "sgd, float32 params": _sgd(jnp.float32),
    "sgd, bf16 params": _sgd(jnp.bfloat16),
}


def reference_of(config: str) -> str:
    """The SGD reference with ``config``'s params dtype.

    Args:
      config: a key of :data:`CONFIGS`.

    Returns:
      A key of :data:`REFERENCES`.
    """
    return "sgd, float32 params" if "float32" in config else "sgd, bf16 params"


# --------------------------------------------------------------------------
# One compile
# --------------------------------------------------------------------------

def _nbytes(tree: Any) -> int:
    return sum(int(np.prod(x.shape, dtype=np.int64)) * jnp.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(tree))


def measure(config: str, d_model: int, n_layers: int, *, batch: int = BATCH,
            seq: int = SEQ, vocab: int = VOCAB, target: str = "h100",
            update_only: bool = False) -> dict:
    """Compile one donated training step and read its memory from the compiler.

    Args:
      config: a key of :data:`CONFIGS` or :data:`REFERENCES`.
      d_model: the width (a multiple of 128).
      n_layers: the number of blocks.
      batch: sequences per batch.
      seq: tokens per sequence.
      vocab: the vocabulary size.
      target: a key of :data:`TARGETS`: ``"h100"`` or ``"tpu_v5e"`` (deviceless), or
        ``"cpu"`` (this machine).
      update_only: compile the optimizer's step alone instead, ``(params, state, grads) ->
        (params, state)`` with gradients in the params' dtype (no model, no batch): its temp
        is the optimizer's own.

    Returns:
      ``config``, ``d_model``, ``n_layers``, ``params``, ``argument_bytes``,
      ``output_bytes``, ``alias_bytes``, ``temp_bytes``, ``code_bytes`` (the compiler's),
      ``peak_bytes`` (``argument + output - alias + temp``), ``params_bytes``,
      ``state_bytes`` and ``batch_bytes`` (the abstract inputs' own sizes; with
      ``update_only`` the batch is the gradients), ``output_leaves`` (the step's output
      arrays: params, state and the loss),
      ``persistent_bytes_per_param`` (``argument_bytes / params``), ``fits``
      (``peak_bytes`` at most the target's limit) and ``compile_s``.
    """
    from accel_compile import placed_on
    placed = placed_on(TARGETS[target].device)
    made = {**CONFIGS, **REFERENCES}[config]()

    def abstract(x: Any) -> Any:
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placed)

    shapes = param_shapes(d_model, n_layers, vocab)
    params = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, made.param_dtype, sharding=placed),
                          shapes, is_leaf=lambda s: isinstance(s, tuple))
    release = None
    if made.release:
        if update_only:
            raise ValueError(f"{config}: the update runs inside the backward pass; there is "
                             f"no update-only step.")
        release = made.library.gradient_release(made.optimizer, model_lib.embed,
                                                model_lib.block, model_lib.head)
    init = release.init if release else made.optimizer.init
    state = jax.tree.map(abstract, jax.eval_shape(init, params))
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=placed)
    data: Any = params if update_only else {"inputs": tokens, "targets": tokens}

    def step(p: Any, s: Any, b: Any) -> tuple:
        if release is not None:
            return release.step(p, s, b)
        if update_only:
            updates, s = made.optimizer.update(b, s, p)
            return made.library.apply_updates(p, updates), s
        loss, grads = jax.value_and_grad(loss_fn)(p, b)
        updates, s = made.optimizer.update(grads, s, p)
        return made.library.apply_updates(p, updates), s, loss

    start = time.perf_counter()
    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, data).compile()
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    n = param_count(d_model, n_layers, vocab)
    out = {"config": config, "d_model": d_model, "n_layers": n_layers, "params": n,
           "argument_bytes": int(memory.argument_size_in_bytes),
           "output_bytes": int(memory.output_size_in_bytes),
           "alias_bytes": int(memory.alias_size_in_bytes),
           "temp_bytes": int(memory.temp_size_in_bytes),
           "code_bytes": int(memory.generated_code_size_in_bytes),
           "params_bytes": _nbytes(params), "state_bytes": _nbytes(state),
           "batch_bytes": _nbytes(data),
           "output_leaves": len(jax.tree.leaves((params, state))) + (not update_only),
           "compile_s": round(seconds, 1)}
    out["peak_bytes"] = (out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"]
                         + out["temp_bytes"])
    out["persistent_bytes_per_param"] = out["argument_bytes"] / n
    out["fits"] = out["peak_bytes"] <= TARGETS[target].limit
    return out


# --------------------------------------------------------------------------
# The ladder and the search
# --------------------------------------------------------------------------

def ladder(start: float = 1e9, growth: float = 1.3, rungs: int = 14,
           min_width: int = 2048, max_width: int = 8192) -> list:
    """Sizes ``(d_model, n_layers)`` growing by about ``growth`` from about ``start`` params.

    Each rung's target ``start * growth**k`` gets the width ``d_model`` (a multiple of 256,
    within ``min_width..max_width``) nearest the aspect ``n_layers ~ d_model / 128``, then
    the layer count whose parameter count is nearest the target.

    Args:
      start: the first rung's parameter target.
      growth: the ratio between consecutive targets.
      rungs: the number of sizes.
      min_width: the smallest ``d_model``.
      max_width: the largest ``d_model``.

    Returns:
      A list of ``(d_model, n_layers)``, strictly increasing in :func:`param_count`.
    """
    sizes: list = []
    for k in range(rungs):
        target = start * growth ** k
        d = (target * 128 / (4 + 2 * MLP_RATIO)) ** (1 / 3)
        d = int(min(max_width, max(min_width, 256 * round(d / 256))))
        per_layer = (4 + 2 * MLP_RATIO) * d * d + 2 * d
        layers = max(1, round((target - 2 * VOCAB * d - d) / per_layer))
        if not sizes or param_count(d, layers) > param_count(*sizes[-1]):
            sizes.append((d, layers))
    return sizes


QUICK_LADDER = [(256, 1), (256, 2), (384, 2)]
QUICK = dict(batch=2, seq=128, vocab=1024)


def largest_fitting(config: str, sizes: list, compile_one: Callable[[str, int, int], dict],
                    log: Callable[[str], None] = print, vocab: int = VOCAB) -> tuple:
    """Bisect ``sizes`` (increasing) for the largest whose step fits.

    Args:
      config: a key of :data:`CONFIGS`.
      sizes: ``(d_model, n_layers)`` in increasing parameter count.
      compile_one: ``(config, d_model, n_layers) -> measure(...)``'s dict.
      log: where each compile's line goes.
      vocab: the vocabulary (for the parameter count of a size whose compile failed).

    Returns:
      ``(index, rows)``: the index in ``sizes`` of the largest fitting size (``-1``: none
      fits) and the measured rows, in the order they were compiled. A row whose compile
      failed has ``error`` and counts as not fitting.
    """
    rows: list = []
    lo, hi = -1, len(sizes)  # sizes[lo] fits (or lo = -1), sizes[hi] does not (or hi = len)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        d, layers = sizes[mid]
        try:
            row = compile_one(config, d, layers)
        except Exception as e:  # a compile that fails counts as not fitting, and is kept
            row = {"config": config, "d_model": d, "n_layers": layers,
                   "params": param_count(d, layers, vocab), "fits": False,
                   "error": f"{type(e).__name__}: {str(e)[:300]}"}
        row["rung"] = mid
        rows.append(row)
        log(_line(row))
        if row["fits"]:
            lo = mid
        else:
            hi = mid
    return lo, rows


def _line(row: dict) -> str:
    if "error" in row:
        return (f"  {row['config']}: d={row['d_model']} L={row['n_layers']} "
                f"{row['params'] / 1e9:.2f}B  ERROR {row['error'][:120]}")
    return (f"  {row['config']}: d={row['d_model']} L={row['n_layers']} "
            f"{row['params'] / 1e9:.2f}B  peak {row['peak_bytes'] / 2**30:.1f} GiB "
            f"(args {row['argument_bytes'] / 2**30:.1f}, temp {row['temp_bytes'] / 2**30:.1f})"
            f"  {'fits' if row['fits'] else 'does not fit'}  [{row['compile_s']} s]")


def main(argv: Optional[list] = None) -> dict:
    """Run the search and write the results.

    Args:
      argv: command-line arguments (``sys.argv[1:]`` when ``None``).

    Returns:
      The results written (config name -> search result).
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--quick", action="store_true",
                        help="a tiny ladder, batch and vocabulary (a smoke run)")
    parser.add_argument("--target", default="h100", choices=list(TARGETS))
    parser.add_argument("--out", default=None,
                        help="results prefix (default benchmarks/results/capacity; with "
                             "--quick nothing is written unless this is given)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other configurations' rows of the results already "
                             "written (their commit is noted), rerunning only --configs")
    args = parser.parse_args(argv)
    target = TARGETS[args.target]
    sizes = QUICK_LADDER if args.quick else ladder(**target.ladder)
    shape_kwargs = QUICK if args.quick else {}
    vocab = shape_kwargs.get("vocab", VOCAB)
    print("ladder: " + ", ".join(f"{d}x{n} ({param_count(d, n, vocab) / 1e9:.2f}B)"
                                 for d, n in sizes), flush=True)
    commit = _commit()  # read before the compiles: the code they compile
    started = time.perf_counter()
    results: dict = {}
    references: dict = {}  # (reference, d_model, n_layers) -> row, shared by configurations
    for name in args.configs:
        print(f"{name}:", flush=True)
        best, rows = largest_fitting(
            name, sizes, lambda c, d, n: measure(c, d, n, target=args.target, **shape_kwargs),
            log=lambda line: print(line, flush=True), vocab=vocab)
        best_row = next((r for r in rows if r.get("rung") == best), None)
        reference = None
        if best_row is not None:  # the model's own temp at that size: a stateless SGD step
            key = (reference_of(name), best_row["d_model"], best_row["n_layers"])
            if key not in references:
                try:
                    references[key] = measure(*key, target=args.target, **shape_kwargs)
                except Exception as e:  # kept, as a failed compile on the ladder is
                    references[key] = {
                        "config": key[0], "d_model": key[1], "n_layers": key[2],
                        "params": param_count(key[1], key[2], vocab), "fits": False,
                        "error": f"{type(e).__name__}: {str(e)[:300]}"}
                print(_line(references[key]), flush=True)
            reference = references[key]
        update = None
        if best_row is not None and not CONFIGS[name]().release:  # the optimizer's step alone
            try:
                update = measure(name, best_row["d_model"], best_row["n_layers"],
                                 target=args.target, update_only=True, **shape_kwargs)
                update["update_only"] = True
                print(f"  update only: temp {update['temp_bytes'] / 2**30:.1f} GiB "
                      f"[{update['compile_s']} s]", flush=True)
            except Exception as e:  # kept, as a failed compile on the ladder is
                update = {"config": name, "update_only": True,
                          "error": f"{type(e).__name__}: {str(e)[:300]}"}
                print(f"  update only: ERROR {update['error'][:120]}", flush=True)
        results[name] = {"best": best, "ladder": [list(s) for s in sizes], "rows": rows,
                         "best_row": best_row, "reference_row": reference,
                         "update_row": update}
    elapsed = time.perf_counter() - started
    prefix = args.out or (None if args.quick else os.path.join(HERE, "results", target.out))
    earlier = None
    if args.merge and prefix and os.path.exists(prefix + ".json"):
        with open(prefix + ".json") as f:
            old = json.load(f)
        kept = [n for n in old["results"] if n not in results]
        earlier = {"commit": old["meta"]["commit"], "date": old["meta"]["date"],
                   "configs": kept}
        results = {n: results.get(n) or old["results"][n] for n in CONFIGS
                   if n in results or n in kept}
    text = table(results, BASELINE)
    print(text)
    compiles = (sum(len(r["rows"]) + (r["update_row"] is not None) for r in results.values())
                + len(references))
    print(f"\n{compiles} compiles in {elapsed:.0f} s")
    if prefix:
        shape = QUICK if args.quick else dict(batch=BATCH, seq=SEQ, vocab=VOCAB)
        meta = {"date": datetime.date.today().isoformat(), "jax": jax.__version__,
                "commit": commit,
                "target": args.target, "title": target.title, "limit_bytes": target.limit,
                **shape,
                "head_dim": HEAD_DIM, "mlp": f"GELU (tanh), {MLP_RATIO}x",
                "elapsed_s": round(elapsed), "peak": "argument + output - alias + temp",
                **({"earlier": earlier} if earlier else {})}
        with open(prefix + ".json", "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
        with open(prefix + ".md", "w") as f:
            f.write(markdown(meta, text))
        if not args.quick:
            write_plot(os.path.dirname(prefix))
    return results


def _commit() -> str:
    """The repository's HEAD commit, with ``+changes`` when functrain/ has uncommitted edits
    (the numbers depend on functrain's code)."""
    import subprocess
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "functrain"], cwd=ROOT,
                               text=True, capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


if __name__ == "__main__":
    main()
