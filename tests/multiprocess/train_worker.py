"""One process of a multi-process training run saved and restored with Orbax.

``tests/test_multiprocess_checkpoint.py`` starts these on 127.0.0.1 (``jax.distributed``
with gloo CPU collectives, ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` set
by the caller). Every process builds the same 1-D ``("data",)`` mesh over all devices of
all processes, replicated float32 parameters of a small MLP, and for each optimizer
(``adamw`` and ``contrib.muon``) a ZeRO-1 state: ``zero_shardings`` splits every state
buffer along ``"data"``, so each process holds only its devices' slices.

Modes (``--mode``):

``train``
    ``2K`` steps, an Orbax save (``CheckpointManager``, asynchronous, from every process)
    after step ``K`` and step ``2K``, then ``M`` more steps. With ``--stall-process P``
    every process then saves step ``2K+M``, and process ``P`` stops that save at its
    commit barrier (its data written, the checkpoint not committed), writes
    ``stalled.P`` and sleeps until it is killed.
``restore``
    A fresh ``CheckpointManager`` on the same directory: restore its latest step into the
    ZeRO-1 layout of this process count's mesh, then ``M`` more steps (and with ``--save``
    save that step into the same directory).
``reference``
    ``2K+M`` steps from scratch, no checkpoint (run it in one process).

Process 0 writes the numbers (every buffer gathered to the host) as ``.npz`` files into
``--out``: ``train`` writes ``step{K}``, ``step{2K}`` (and ``step{2K}_shards``, each of
process 0's devices' shard shapes) and ``step{2K+M}``; ``restore``
writes ``restored`` (with ``latest_step`` and each device's shard shape of the ZeRO-1
buffers) and ``continued``; ``reference`` writes ``step{K}``, ``step{2K}``,
``step{2K+M}``. A ``done.P`` file in ``--out`` marks each process's normal end.

Nothing happens on import (pytest collects this file for doctests).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

K, M = 3, 3  # saves after steps K and 2K, then M more steps
BATCH, D_IN, D_HIDDEN, D_OUT = 64, 16, 32, 8
OPTIMIZERS = ("adamw", "muon")


def host_params() -> dict:
    """The same float32 parameters in every process (numpy, seeded)."""
    import numpy as np
    rng = np.random.default_rng(0)
    shapes = {"w1": (D_IN, D_HIDDEN), "b1": (D_HIDDEN,), "w2": (D_HIDDEN, D_HIDDEN),
              "b2": (D_HIDDEN,), "w3": (D_HIDDEN, D_OUT), "b3": (D_OUT,)}
    return {k: (rng.normal(size=s) * (0.3 if k.startswith("w") else 0.1)).astype(np.float32)
            for k, s in shapes.items()}


def host_batch(t: int) -> tuple:
    """Step ``t``'s global batch, the same in every process; each keeps its devices' rows."""
    import numpy as np
    rng = np.random.default_rng(1000 + t)
    x = rng.normal(size=(BATCH, D_IN)).astype(np.float32)
    y = np.sin(x[:, :D_OUT] * 2.0).astype(np.float32)
    return x, y


def make_optimizer(name: str, mesh):
    """adamw, or muon with its Newton-Schulz stacks divided over ``mesh``'s devices."""
    import functrain
    if name == "adamw":
        return functrain.adamw(1e-2, weight_decay=1e-2)
    return functrain.contrib.muon(1e-2, weight_decay=1e-2, adam_learning_rate=1e-2, mesh=mesh)


class Run:
    """Mesh, shardings, jitted steps and host copies for one process count."""

    def __init__(self):
        import jax
        from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

        from functrain import sharding as fs
        self.mesh = jax.make_mesh((jax.device_count(),), ("data",),
                                  axis_types=(AxisType.Auto,))
        self.replicated = NamedSharding(self.mesh, P())
        self.batch_sharding = NamedSharding(self.mesh, P("data"))
        host = host_params()
        self.param_shardings = {k: self.replicated for k in host}
        self.abstract_params = {k: jax.ShapeDtypeStruct(v.shape, v.dtype,
                                                        sharding=self.replicated)
                                for k, v in host.items()}
        self.opts = {name: make_optimizer(name, self.mesh) for name in OPTIMIZERS}
        self.state_shardings = {}
        self.steps = {}
        for name, opt in self.opts.items():
            zero = fs.zero_shardings(fs.abstract_state(opt, self.abstract_params), self.mesh,
                                     "data")
            self.state_shardings[name] = zero
            self.steps[name] = jax.jit(
                self._step_fn(opt),
                in_shardings=(self.param_shardings, zero, self.batch_sharding,
                              self.batch_sharding),
                out_shardings=(self.param_shardings, zero))

    @staticmethod
    def _step_fn(opt):
        import jax
        import jax.numpy as jnp

        import functrain

        def loss(p, x, y):
            h = jnp.tanh(x @ p["w1"] + p["b1"])
            h = jnp.tanh(h @ p["w2"] + p["b2"])
            return jnp.mean((h @ p["w3"] + p["b3"] - y) ** 2)

        def step(params, state, x, y):
            grads = jax.grad(loss)(params, x, y)
            updates, state = opt.update(grads, state, params)
            return functrain.apply_updates(params, updates), state
        return step

    def global_array(self, value, sharding):
        """A global array from a host value every process holds in full."""
        import jax
        return jax.make_array_from_callback(value.shape, sharding, lambda idx: value[idx])

    def init(self) -> dict:
        """``{optimizer: {"params", "opt_state"}}``: replicated params, ZeRO-1 state."""
        import jax
        out = {}
        for name, opt in self.opts.items():
            params = {k: self.global_array(v, self.replicated)
                      for k, v in host_params().items()}
            state = jax.jit(opt.init, out_shardings=self.state_shardings[name])(params)
            out[name] = {"params": params, "opt_state": state}
        return out

    def abstract(self) -> dict:
        """The restore target: every buffer's shape, dtype and sharding on this mesh."""
        from functrain import sharding as fs
        return {name: {"params": self.abstract_params,
                       "opt_state": fs.abstract_state(opt, self.abstract_params,
                                                      self.state_shardings[name])}
                for name, opt in self.opts.items()}

    def train(self, tree: dict, first: int, last: int) -> dict:
        """Steps ``first..last`` (batches ``host_batch(t)``) for every optimizer."""
        for t in range(first, last + 1):
            x, y = host_batch(t)
            x = self.global_array(x, self.batch_sharding)
            y = self.global_array(y, self.batch_sharding)
            tree = {name: dict(zip(("params", "opt_state"),
                                   self.steps[name](sub["params"], sub["opt_state"], x, y)))
                    for name, sub in tree.items()}
        return tree


def to_host(tree: dict) -> dict:
    """Every buffer of ``tree`` gathered to the host: ``{keystr path: numpy array}``."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    leaves = [x for _, x in flat]
    gathered = multihost_utils.process_allgather(leaves, tiled=True)
    return {jax.tree_util.keystr(path): np.asarray(g) for (path, _), g in zip(flat, gathered)}


def shard_shapes(tree: dict) -> dict:
    """``{path: (shape of each addressable shard, ...)}`` for this process's devices."""
    import jax
    import numpy as np
    out = {}
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shapes = sorted({tuple(s.data.shape) for s in x.addressable_shards})
        out["shards:" + jax.tree_util.keystr(path)] = np.asarray(shapes, dtype=np.int64)
    return out


def checkpoint_manager(directory: str, stall: "Stall | None" = None):
    """An asynchronous Orbax ``CheckpointManager`` that keeps every step."""
    import orbax.checkpoint as ocp
    async_options = ocp.options.AsyncOptions(
        timeout_secs=120, barrier_sync_fn=stall.barrier if stall else None)
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True,
                                           async_options=async_options)
    return ocp.CheckpointManager(directory, options=options)


class Stall:
    """A barrier function for Orbax's asynchronous saves that stops one save mid-flight.

    Orbax's background save thread, once this process's data is written, waits at an
    ``async_write_complete`` barrier for every process before process 0 commits (renames
    the temporary directory to the step's). For the save of step ``step`` this barrier
    writes ``marker`` and sleeps until the process is killed; every other barrier is
    Orbax's own (``ocp.multihost.get_barrier_sync_fn()``).
    """

    def __init__(self, step: int, marker: str):
        import orbax.checkpoint as ocp
        self.step, self.marker, self.saving = step, marker, None
        self._barrier = ocp.multihost.get_barrier_sync_fn()

    def barrier(self, *, key: str, timeout_ms: int) -> None:
        if self.saving == self.step and "async_write_complete" in key:
            with open(self.marker + ".tmp", "w") as f:
                f.write(key)
            os.replace(self.marker + ".tmp", self.marker)
            time.sleep(600)  # the test kills it at once; this only bounds an orphan's life
        self._barrier(key=key, timeout_ms=timeout_ms)


def save(manager, step: int, tree: dict, stall: "Stall | None" = None) -> None:
    import orbax.checkpoint as ocp
    if stall is not None:
        stall.saving = step
    manager.save(step, args=ocp.args.StandardSave(tree))


def write(out: str, name: str, arrays: dict) -> None:
    import jax
    import numpy as np
    if jax.process_index() == 0:
        np.savez(os.path.join(out, name + ".npz"), **arrays)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("train", "restore", "reference"), required=True)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ckpt", default="")
    parser.add_argument("--out", required=True)
    parser.add_argument("--stall-process", type=int, default=-1)
    parser.add_argument("--save", action="store_true", help="restore: save the last step")
    args = parser.parse_args(argv)

    import jax
    if args.num_processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}",
                                   num_processes=args.num_processes,
                                   process_id=args.process_id, initialization_timeout=60)
    assert not jax.config.jax_enable_x64
    run = Run()
    log = lambda msg: print(f"[process {jax.process_index()}/{jax.process_count()}, "  # noqa: E731
                            f"{jax.local_device_count()} devices] {msg}", flush=True)

    if args.mode == "reference":
        tree = run.train(run.init(), 1, K)
        write(args.out, f"step{K}", to_host(tree))
        tree = run.train(tree, K + 1, 2 * K)
        write(args.out, f"step{2 * K}", to_host(tree))
        tree = run.train(tree, 2 * K + 1, 2 * K + M)
        write(args.out, f"step{2 * K + M}", to_host(tree))

    elif args.mode == "train":
        stall = None
        if args.stall_process == args.process_id:
            stall = Stall(2 * K + M, os.path.join(args.out, f"stalled.{args.process_id}"))
        manager = checkpoint_manager(args.ckpt, stall)
        tree = run.train(run.init(), 1, K)
        save(manager, K, tree, stall)
        write(args.out, f"step{K}", to_host(tree))
        tree = run.train(tree, K + 1, 2 * K)
        save(manager, 2 * K, tree, stall)
        write(args.out, f"step{2 * K}", to_host(tree))
        write(args.out, f"step{2 * K}_shards", shard_shapes(tree))
        manager.wait_until_finished()
        log(f"saved steps {manager.all_steps()}")
        tree = run.train(tree, 2 * K + 1, 2 * K + M)
        write(args.out, f"step{2 * K + M}", to_host(tree))
        if args.stall_process >= 0:
            save(manager, 2 * K + M, tree, stall)
            log(f"save of step {2 * K + M} started")
            manager.wait_until_finished()  # the stalled process sleeps, the others wait
        manager.close()

    else:  # restore
        manager = checkpoint_manager(args.ckpt)
        latest = manager.latest_step()
        log(f"restoring step {latest} of {manager.all_steps()}")
        import orbax.checkpoint as ocp
        tree = manager.restore(latest, args=ocp.args.StandardRestore(run.abstract()))
        write(args.out, "restored", to_host(tree) | shard_shapes(tree)
              | {"latest_step": latest})
        tree = run.train(tree, latest + 1, latest + M)
        write(args.out, "continued", to_host(tree))
        if args.save:
            save(manager, latest + M, tree)
            manager.wait_until_finished()
            log(f"saved steps {manager.all_steps()}")
        manager.close()

    with open(os.path.join(args.out, f"done.{args.process_id}"), "w") as f:
        f.write("ok")
    log("done")
    if args.num_processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    sys.exit(main())
