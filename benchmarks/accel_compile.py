"""One optimizer step compiled for an accelerator this machine does not have, and what the
compiler says of it: bytes accessed, flops, temp memory, kernels, compile seconds.

The H100 and TPU compilers run on a CPU machine ("deviceless" ahead-of-time compilation):
``jax.experimental.topologies.get_topology_desc`` gives the accelerator's devices, and a jitted
step lowered on ``ShapeDtypeStruct`` s placed on them compiles with that accelerator's
compiler (``../shared/accel/README.md``; the H100 needs XLA's device description,
``benchmarks/h100_sxm.txtpb`` here). ``benchmarks/accelerators.py`` runs this file once per
(target, tree, optimizer) in a fresh process under a timeout and makes the table.

Run as ``python benchmarks/accel_compile.py TARGET TREE NAME LIBRARY`` in a venv with the
target's plugin (``make accel`` builds them): prints one JSON object.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any, Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

H100_SPEC = os.path.join(HERE, "h100_sxm.txtpb")

# The trees: a transformer-sized one (8 kernels of (1024, 4096) and their biases: 33.6M
# parameters), and one of 1000 small leaves (500 (64, 64) kernels and 500 biases), where a
# per-leaf program launches a kernel per leaf.
TREES: dict[str, dict[str, tuple]] = {
    "large": {**{f"layer{i}/kernel": (1024, 4096) for i in range(8)},
              **{f"layer{i}/bias": (4096,) for i in range(8)}},
    "1000 leaves": {**{f"layer{i:03d}/kernel": (64, 64) for i in range(500)},
                    **{f"layer{i:03d}/bias": (64,) for i in range(500)}},
}
# The same 1000 leaves held in functrain.flat_layout's buffers between steps (functrain only).
FLAT = "1000 leaves, flat layout"
TREES[FLAT] = TREES["1000 leaves"]

# Instructions of an optimized program's entry computation that launch no kernel.
_NO_KERNEL = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast",
              "after-all", "opt-barrier", "partition-id", "replica-id"}


def devices(target: str) -> list:
    """One chip of ``target`` ("h100" or "tpu_v5e": a deviceless topology's device; "cpu":
    this machine's first CPU device)."""
    from jax.experimental import topologies
    if target == "cpu":
        return jax.devices("cpu")[:1]
    if target == "h100":
        with open(H100_SPEC) as f:
            spec = f.read()
        topo = topologies.get_topology_desc(platform="cuda", topology="1x1x1",
                                            target_config=spec)
    elif target == "tpu_v5e":
        topo = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu")
    else:
        raise ValueError(f"unknown target {target!r}: 'h100', 'tpu_v5e' or 'cpu'")
    return list(topo.devices)[:1]


def kernel_count(hlo_text: str) -> int:
    """Kernel-launching instructions of the optimized program's entry computation (fusions,
    custom calls, copies, collectives, loops and conditionals each count once)."""
    entry = hlo_text[hlo_text.index("\nENTRY "):]
    entry = entry[:entry.index("\n}")]
    ops = re.findall(r"^\s*(?:ROOT )?%?[\w.\-]+ = [^ ]+(?: [^ ]+)*? ([a-z][\w\-]*)\(",
                     entry, flags=re.M)
    return sum(1 for op in ops if op not in _NO_KERNEL)


def _cost(compiled: Any) -> dict:
    """XLA's cost analysis of the optimized module (the generic one where the plugin's is
    absent, as on the deviceless H100 path)."""
    cost = compiled.cost_analysis()
    if isinstance(cost, list):
        cost = cost[0] if cost else None
    if not cost:
        from jax._src.lib import _jax
        module = compiled.runtime_executable().hlo_modules()[0]
        cost = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
    return dict(cost)


def placed_on(target: str) -> NamedSharding:
    """A sharding that places an array whole on ``target``'s one chip (:func:`devices`).

    Args:
      target: ``"h100"``, ``"tpu_v5e"`` or ``"cpu"``.

    Returns:
      The ``NamedSharding`` (a one-device mesh, replicated).
    """
    return NamedSharding(Mesh(np.array(devices(target)), ("d",)), PartitionSpec())


def compile_step(target: str, tree: str, build: Callable[[Any], Any], library: Any,
                 extra: Callable[[Any], dict] = lambda p: {}) -> tuple:
    """Compile one donated ``(params, state, grads) -> (params, state)`` step for ``target``.

    Args:
      target: ``"h100"``, ``"tpu_v5e"`` or ``"cpu"``.
      tree: a key of ``TREES`` (float32 leaves).
      build: ``build(library) -> GradientTransformation``.
      library: the module to build from (functrain or optax).
      extra: ``extra(params) -> dict`` of ``update``'s keyword arguments besides the
        gradients (computed inside the step).

    Returns:
      ``(compiled, state, seconds)``: the compiled executable, the state's abstract tree and
      the compile's seconds.
    """
    placed = placed_on(target)

    def abstract(x: Any) -> Any:
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placed)

    params = {k: jax.ShapeDtypeStruct(s, jnp.float32, sharding=placed)
              for k, s in TREES[tree].items()}
    opt = build(library)
    if tree == FLAT:  # the step sees the layout's buffers (the check is tests/test_flat_layout's)
        layout = library.flat_layout(params)
        opt = library.on_flat_layout(opt, layout, check=False)
        params = jax.tree.map(abstract, layout.buffers)
    state = jax.tree.map(abstract, jax.eval_shape(opt.init, params))

    def step(p: Any, s: Any, g: Any) -> tuple:
        updates, s = opt.update(g, s, p, **extra(p))
        return library.apply_updates(p, updates), s

    start = time.perf_counter()
    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params).compile()
    return compiled, state, time.perf_counter() - start


def compile_registry_step(target: str, tree: str, name: str, library_name: str) -> tuple:
    """:func:`compile_step` of the tests' registry optimizer ``name`` (``tests/registry.py``,
    with the arguments the tests use; the low-bit presets at ``learning_rate=1e-3``), built
    from functrain or optax.

    Args:
      target: as :func:`compile_step`.
      tree: as :func:`compile_step`.
      name: a registry name.
      library_name: ``"functrain"`` or ``"optax"``.

    Returns:
      :func:`compile_step`'s ``(compiled, state, seconds)``.
    """
    import registry  # tests/registry.py: every optimizer with the arguments the tests use
    import functrain
    record = registry.REGISTRY.get(name) or registry.Optimizer(
        name, dict(learning_rate=1e-3), reference="")  # the low-bit presets: functrain only
    if library_name == "optax":
        import optax as library
    else:
        library = functrain

    def loss(p: Any) -> Any:
        return sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(p))

    return compile_step(target, tree, record.make, library,
                        lambda p: record.update_kwargs(loss, p))


def measure(target: str, tree: str, build: Callable[[Any], Any], library: Any,
            extra: Callable[[Any], dict] = lambda p: {}) -> dict:
    """Compile one step (:func:`compile_step`, the same arguments) and :func:`report` it.

    Args:
      target: as :func:`compile_step`.
      tree: as :func:`compile_step`.
      build: as :func:`compile_step`.
      library: as :func:`compile_step`.
      extra: as :func:`compile_step`.

    Returns:
      :func:`report`'s dict.
    """
    compiled, state, seconds = compile_step(target, tree, build, library, extra)
    return report(compiled, state, tree, seconds)


def report(compiled: Any, state: Any, tree: str, seconds: float) -> dict:
    """What the compiler says of a step :func:`compile_step` compiled.

    Args:
      compiled: the executable.
      state: the state's abstract tree.
      tree: the key of ``TREES`` it was compiled on.
      seconds: the compile's seconds.

    Returns:
      ``params``, ``state_bytes`` (the state's bytes per parameter), ``bytes_accessed``,
      ``flops``, ``temp_bytes``, ``kernels``, ``gathers`` (gather instructions anywhere in the
      optimized program) and ``compile_s``.
    """
    n = sum(int(np.prod(s)) for s in TREES[tree].values())
    state_bytes = sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize
                      for x in jax.tree.leaves(state)
                      if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key))
    cost = _cost(compiled)
    memory = compiled.memory_analysis()
    return {"params": n, "state_bytes": state_bytes / n,
            "bytes_accessed": float(cost.get("bytes accessed", float("nan"))),
            "flops": float(cost.get("flops", float("nan"))),
            "temp_bytes": int(memory.temp_size_in_bytes) if memory is not None else None,
            "kernels": kernel_count(compiled.as_text()),
            "gathers": len(re.findall(r" gather\(", compiled.as_text())), "compile_s": seconds}


def main(argv: list) -> None:
    target, tree, name, library_name = argv
    compiled, state, seconds = compile_registry_step(target, tree, name, library_name)
    out = report(compiled, state, tree, seconds)
    print(json.dumps({"target": target, "tree": tree, "name": name, "library": library_name,
                      "jax": jax.__version__, **out}))


if __name__ == "__main__":
    main(sys.argv[1:])
