"""functrain's demo: train a small MLP on scikit-learn's bundled 8x8 digits.

Run it with ``make demo`` (which sets up ``.venv`` first) or, inside an
environment that has ``functrain[demo]``, with ``python examples/demo.py``.

What it shows, in about a minute on two CPU cores:

* ``functrain.lamb`` with a warmup-cosine learning-rate schedule, gradient
  clipping by global norm, and weight decay plus layer adaptation switched off
  for biases and LayerNorm scales (``mask=`` / ``trust_ratio_mask=``);
* a jitted, donated train step, a tqdm progress bar with loss and accuracy;
* the same model, seed, data order and schedule trained with ``functrain.adam``
  for comparison;
* a PNG of both loss curves in ``demo_out/`` (copied to ``docs/demo_loss.png``
  for the README).

The data ship inside scikit-learn (1,797 images of 8x8 pixels): nothing is
downloaded. The script exits with status 1 if LAMB's test accuracy is below 95%.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import functrain

ROOT = Path(__file__).resolve().parent.parent
TARGET_ACCURACY = 0.95


# ----------------------------------------------------------------------------- data
def load_digits(seed: int, test_fraction: float = 0.25):
    """Digits as float32 in [0, 1], split into train and test (stratified)."""
    from sklearn.datasets import load_digits as sk_load_digits
    from sklearn.model_selection import train_test_split

    x, y = sk_load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int32)
    return train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)


# ----------------------------------------------------------------------------- model
def init_mlp(key: jax.Array, sizes=(64, 256, 256, 10)) -> dict:
    """An MLP with a LayerNorm after each hidden layer, as a plain dict pytree."""
    params = {}
    keys = jax.random.split(key, len(sizes) - 1)
    for i, (k, n_in, n_out) in enumerate(zip(keys, sizes[:-1], sizes[1:])):
        layer = {"w": jax.random.normal(k, (n_in, n_out)) * jnp.sqrt(2.0 / n_in),
                 "b": jnp.zeros(n_out)}
        if i < len(sizes) - 2:
            layer["ln_scale"] = jnp.ones(n_out)
            layer["ln_bias"] = jnp.zeros(n_out)
        params[f"layer{i}"] = layer
    return params


def mlp(params: dict, x: jax.Array) -> jax.Array:
    names = sorted(params)
    for name in names[:-1]:
        layer = params[name]
        h = x @ layer["w"] + layer["b"]
        mean = h.mean(-1, keepdims=True)
        var = h.var(-1, keepdims=True)
        h = (h - mean) * jax.lax.rsqrt(var + 1e-5) * layer["ln_scale"] + layer["ln_bias"]
        x = jax.nn.gelu(h)
    last = params[names[-1]]
    return x @ last["w"] + last["b"]


def loss_and_accuracy(params: dict, x: jax.Array, y: jax.Array):
    logits = mlp(params, x)
    logp = jax.nn.log_softmax(logits)
    loss = -jnp.take_along_axis(logp, y[:, None], axis=-1).mean()
    return loss, (logits.argmax(-1) == y).mean()


def decay_mask(params: dict) -> dict:
    """True for weight matrices; False for biases and LayerNorm scales/offsets."""
    return jax.tree_util.tree_map(lambda p: p.ndim > 1, params)


# ----------------------------------------------------------------------------- training
def make_optimizer(name: str, total_steps: int, warmup_steps: int):
    if name == "lamb":
        schedule = functrain.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=5e-3, warmup_steps=warmup_steps,
            decay_steps=total_steps, end_value=5e-5)
        return functrain.chain(
            functrain.clip_by_global_norm(1.0),
            functrain.lamb(schedule, weight_decay=0.1, mask=decay_mask,
                           trust_ratio_mask=decay_mask))
    if name == "adam":
        schedule = functrain.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=1e-3, warmup_steps=warmup_steps,
            decay_steps=total_steps, end_value=1e-5)
        return functrain.chain(functrain.clip_by_global_norm(1.0), functrain.adam(schedule))
    raise ValueError(f"unknown optimizer {name!r}")


def train(name: str, data, *, seed: int, epochs: int, batch_size: int, quiet: bool,
          make=None):
    """``make(name, total_steps, warmup_steps)`` builds the optimizer (default
    ``make_optimizer``; benchmarks/quantized_accuracy.py passes its own)."""
    from tqdm.auto import tqdm

    x_train, x_test, y_train, y_test = data
    steps_per_epoch = len(x_train) // batch_size
    total_steps = epochs * steps_per_epoch
    opt = (make or make_optimizer)(name, total_steps, warmup_steps=max(1, total_steps // 10))

    init_key, data_key = jax.random.split(jax.random.PRNGKey(seed))
    params = init_mlp(init_key)
    state = opt.init(params)

    @jax.jit
    def epoch_order(key):
        return jax.random.permutation(key, len(x_train))[: steps_per_epoch * batch_size]

    # Donating params and state lets XLA update the buffers in place.
    def train_step(params, state, xb, yb):
        (loss, acc), grads = jax.value_and_grad(loss_and_accuracy, has_aux=True)(params, xb, yb)
        updates, state = opt.update(grads, state, params)
        return functrain.apply_updates(params, updates), state, loss, acc
    train_step = jax.jit(train_step, donate_argnums=(0, 1))

    evaluate = jax.jit(loss_and_accuracy)
    x_train_d, y_train_d = jnp.asarray(x_train), jnp.asarray(y_train)
    x_test_d, y_test_d = jnp.asarray(x_test), jnp.asarray(y_test)

    losses, epoch_test_acc = [], []
    bar = tqdm(total=total_steps, desc=f"{name:>4}", disable=quiet, unit="step",
               dynamic_ncols=True, file=sys.stdout)
    for epoch in range(epochs):
        data_key, key = jax.random.split(data_key)
        order = epoch_order(key).reshape(steps_per_epoch, batch_size)
        for idx in order:
            params, state, loss, acc = train_step(params, state, x_train_d[idx], y_train_d[idx])
            losses.append(loss)
            bar.update(1)
        _, test_acc = evaluate(params, x_test_d, y_test_d)
        epoch_test_acc.append(float(test_acc))
        bar.set_postfix(loss=f"{float(loss):.4f}", batch_acc=f"{float(acc):.3f}",
                        test_acc=f"{float(test_acc):.3f}")
    bar.close()
    test_loss, test_acc = evaluate(params, x_test_d, y_test_d)
    return {"losses": np.asarray(jnp.stack(losses)), "test_acc": float(test_acc),
            "test_loss": float(test_loss), "epoch_test_acc": epoch_test_acc,
            "steps_per_epoch": steps_per_epoch}


# ----------------------------------------------------------------------------- plot
def smooth(values: np.ndarray, window: int) -> np.ndarray:
    kernel = np.ones(window) / window
    return np.convolve(values, kernel, mode="valid")


def plot(results: dict, path: Path, window: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    colors = {"lamb": "tab:blue", "adam": "tab:orange"}
    for name, res in results.items():
        steps = np.arange(len(res["losses"]))
        ax_loss.plot(steps, res["losses"], color=colors[name], alpha=0.2, lw=0.8)
        ax_loss.plot(steps[window - 1:], smooth(res["losses"], window), color=colors[name],
                     lw=2, label=f"{name} (test acc {res['test_acc']:.1%})")
        epochs = np.arange(1, len(res["epoch_test_acc"]) + 1)
        ax_acc.plot(epochs, res["epoch_test_acc"], color=colors[name], lw=2, label=name)
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("training loss (cross-entropy)")
    ax_loss.set_title("digits 8x8, MLP 64-256-256-10, same seed")
    ax_loss.legend()
    ax_acc.axhline(TARGET_ACCURACY, color="gray", ls="--", lw=1, label="95%")
    ax_acc.set_ylim(0.8, 1.0)
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("test accuracy")
    ax_acc.set_title("held-out accuracy")
    ax_acc.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "demo_out")
    parser.add_argument("--docs-copy", action="store_true",
                        help="also copy the plot to docs/demo_loss.png (the README's picture)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    data = load_digits(args.seed)
    print(f"digits: {len(data[0])} train / {len(data[1])} test images of 8x8 pixels, "
          f"jax {jax.__version__} on {jax.devices()[0].platform}")

    results = {}
    for name in ("lamb", "adam"):
        results[name] = train(name, data, seed=args.seed, epochs=args.epochs,
                              batch_size=args.batch_size, quiet=args.quiet)

    png = args.out / "demo_loss.png"
    plot(results, png, window=max(1, results["lamb"]["steps_per_epoch"]))
    if args.docs_copy:
        (ROOT / "docs").mkdir(exist_ok=True)
        shutil.copyfile(png, ROOT / "docs" / "demo_loss.png")
    elapsed = time.perf_counter() - start
    summary = {name: {"test_accuracy": r["test_acc"], "test_loss": r["test_loss"],
                      "final_train_loss": float(r["losses"][-1])}
               for name, r in results.items()}
    summary["wall_seconds"] = elapsed
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))

    print()
    print(f"{'optimizer':<10}{'test accuracy':>15}{'test loss':>12}")
    for name, r in results.items():
        print(f"{name:<10}{r['test_acc']:>15.2%}{r['test_loss']:>12.4f}")
    print(f"plot: {os.path.relpath(png)}   wall time: {elapsed:.1f} s")
    if results["lamb"]["test_acc"] < TARGET_ACCURACY:
        print(f"FAIL: lamb test accuracy {results['lamb']['test_acc']:.2%} is below "
              f"{TARGET_ACCURACY:.0%}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
