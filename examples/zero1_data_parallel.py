"""Data-parallel training on 8 devices with ZeRO-1 optimizer state.

Runs anywhere: without 8 accelerators it simulates 8 CPU devices
(``--xla_force_host_platform_device_count=8``, set before JAX starts).

The batch is split over the mesh axis ``data``; the parameters are replicated;
the AdamW moments are split over ``data`` with
:func:`functrain.sharding.zero_shardings`, so each device keeps 1/8 of them.
The script trains the same model twice -- once with the state replicated
(plain data parallel), once with ZeRO-1 -- checks that both give the same
parameters, and prints each device's optimizer-state memory in both layouts.

    python examples/zero1_data_parallel.py
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import functrain  # noqa: E402
from functrain import sharding as fs  # noqa: E402

N_DEVICES = 8
SIZES = (256, 1024, 1024, 10)  # a 3-layer MLP, ~1.3M parameters
BATCH, STEPS = 256, 60


def init_params(key: jax.Array) -> dict:
    params = {}
    for i, (n_in, n_out) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        key, sub = jax.random.split(key)
        params[f"layer{i}"] = {"w": jax.random.normal(sub, (n_in, n_out)) / np.sqrt(n_in),
                               "b": jnp.zeros(n_out)}
    return params


def forward(params: dict, x: jax.Array) -> jax.Array:
    for i in range(len(SIZES) - 1):
        layer = params[f"layer{i}"]
        x = x @ layer["w"] + layer["b"]
        if i < len(SIZES) - 2:
            x = jax.nn.gelu(x)
    return x


def loss_fn(params: dict, x: jax.Array, labels: jax.Array) -> jax.Array:
    logits = forward(params, x)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))


def make_data(key: jax.Array) -> tuple:
    """A teacher-labelled classification task."""
    kx, kt = jax.random.split(key)
    x = jax.random.normal(kx, (STEPS, BATCH, SIZES[0]))
    teacher = jax.random.normal(kt, (SIZES[0], SIZES[-1]))
    return x, jnp.argmax(x @ teacher, axis=-1)


def mib(n_bytes: float) -> str:
    return f"{n_bytes / 2**20:7.2f} MiB"


def train(opt: functrain.GradientTransformation, mesh: jax.sharding.Mesh, params: dict,
          data: tuple, zero1: bool) -> tuple:
    replicated = NamedSharding(mesh, P())
    batch = NamedSharding(mesh, P("data"))
    params = jax.device_put(params, replicated)
    param_shardings = jax.tree_util.tree_map(lambda x: x.sharding, params)
    if zero1:
        # Split every moment buffer over 'data'; counters stay replicated.
        state_shardings = fs.zero_shardings(fs.abstract_state(opt, params), mesh, "data")
    else:
        # The state follows the (replicated) params.
        state_shardings = fs.state_shardings(opt, params)
    state = jax.jit(opt.init, out_shardings=state_shardings)(params)

    def step(params, state, x, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, labels)
        updates, state = opt.update(grads, state, params)
        return functrain.apply_updates(params, updates), state, loss

    step = jax.jit(step, in_shardings=(param_shardings, state_shardings, batch, batch),
                   out_shardings=(param_shardings, state_shardings, replicated),
                   donate_argnums=(0, 1))
    xs, labels = data
    losses = []
    start = time.perf_counter()
    for i in range(STEPS):
        params, state, loss = step(params, state, jax.device_put(xs[i], batch),
                                   jax.device_put(labels[i], batch))
        losses.append(float(loss))
    return params, state, losses, time.perf_counter() - start


def main() -> None:
    devices = jax.devices()
    assert len(devices) >= N_DEVICES, f"need {N_DEVICES} devices, have {len(devices)}"
    mesh = jax.make_mesh((N_DEVICES,), ("data",))
    print(f"mesh: {dict(mesh.shape)} on {len(devices)} {devices[0].platform} devices")

    # Host copies: each run puts (and donates) its own device buffers.
    params = jax.tree_util.tree_map(np.asarray, init_params(jax.random.key(0)))
    data = make_data(jax.random.key(1))
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
    print(f"model: MLP {SIZES}, {n_params:,} parameters; batch {BATCH} split 8 ways\n")

    opt = functrain.adamw(functrain.warmup_cosine_decay_schedule(0.0, 3e-3, 10, STEPS),
                          weight_decay=1e-4)
    p_rep, s_rep, loss_rep, t_rep = train(opt, mesh, params, data, zero1=False)
    p_zero, s_zero, loss_zero, t_zero = train(opt, mesh, params, data, zero1=True)

    print("step   loss (replicated state)   loss (ZeRO-1 state)")
    for i in list(range(0, STEPS, 10)) + [STEPS - 1]:
        print(f"{i:4d}   {loss_rep[i]:22.4f}   {loss_zero[i]:19.4f}")
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
               zip(jax.tree_util.tree_leaves(p_rep), jax.tree_util.tree_leaves(p_zero)))
    print(f"\nmax |params(replicated) - params(ZeRO-1)| after {STEPS} steps: {diff:.2e}")

    rep_bytes, zero_bytes = fs.per_device_bytes(s_rep), fs.per_device_bytes(s_zero)
    print("\noptimizer state held by each device (AdamW: mu and nu)")
    print("device                 replicated      ZeRO-1")
    for d in sorted(rep_bytes, key=lambda d: d.id):
        print(f"{str(d):20s} {mib(rep_bytes[d])}  {mib(zero_bytes[d])}")
    total_rep, total_zero = max(rep_bytes.values()), max(zero_bytes.values())
    print(f"per device: {mib(total_rep)} -> {mib(total_zero)} "
          f"({total_rep / total_zero:.1f}x less with ZeRO-1 on {N_DEVICES} devices)")
    print(f"time for {STEPS} steps: replicated {t_rep:.1f}s, ZeRO-1 {t_zero:.1f}s "
          f"(simulated devices share this host's cores: not a speed benchmark)")
    assert diff < 1e-4, "ZeRO-1 and replicated training disagree"
    assert loss_zero[-1] < 0.5 * loss_zero[0], "the loss did not fall"


if __name__ == "__main__":
    main()
