"""The speedrun's fixed parts: its data, its models and their sizes (``Config``).

The data is the Python standard library's own source, read as characters; the model a small
pre-norm GPT in plain JAX (RMSNorm with a learned gain, GELU MLP, untied head, GPT-2's
initialization). ``FULL`` is the speedrun's first model (115k parameters), ``MEDIUM`` its
second (about 0.8M), ``TINY`` the test suite's. examples/speedrun.py trains them;
docs/speedrun.md states the rules.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

@dataclasses.dataclass(frozen=True)
class Config:
    chars: int          # characters of standard-library source used (train + validation)
    n_layer: int
    d_model: int
    n_head: int
    context: int
    batch: int
    steps: int          # the step budget
    eval_every: int
    val_windows: int    # validation sequences (each `context` characters, fixed)
    seed: int = 0       # the seed of `train`'s single run


FULL = Config(chars=1_000_000, n_layer=2, d_model=64, n_head=4, context=64, batch=16,
              steps=300, eval_every=10, val_windows=64)
MEDIUM = Config(chars=1_000_000, n_layer=4, d_model=128, n_head=4, context=64, batch=16,
                steps=200, eval_every=10, val_windows=64)
TINY = Config(chars=60_000, n_layer=1, d_model=32, n_head=2, context=32, batch=8,
              steps=12, eval_every=4, val_windows=16)


# ----------------------------------------------------------------------------- data
def stdlib_text(n_chars: int) -> str:
    """The first ``n_chars`` characters of the standard library's top-level ``.py`` files."""
    lib = os.path.dirname(os.__file__)
    parts, total = [], 0
    for name in sorted(os.listdir(lib)):
        path = os.path.join(lib, name)
        if not name.endswith(".py") or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            parts.append(f.read())
        total += len(parts[-1])
        if total >= n_chars:
            break
    text = "".join(parts)[:n_chars]
    if len(text) < n_chars:
        raise RuntimeError(f"the standard library in {lib} has only {len(text)} characters of "
                           f".py source; {n_chars} are needed.")
    return text


def load_data(cfg: Config) -> dict:
    """Token arrays (train, validation), the vocabulary, and the fixed validation windows."""
    text = stdlib_text(cfg.chars)
    vocab = sorted(set(text))
    lookup = {c: i for i, c in enumerate(vocab)}
    tokens = np.fromiter((lookup[c] for c in text), np.int32, len(text))
    split = int(0.9 * len(tokens))
    train, val = tokens[:split], tokens[split:]
    starts = np.linspace(0, len(val) - cfg.context - 1, cfg.val_windows).astype(np.int64)
    val_x = np.stack([val[s:s + cfg.context + 1] for s in starts])
    return {"train": train, "val": val_x, "vocab": vocab}


def batch_starts(cfg: Config, n_train: int, steps: int, seed: Optional[int] = None
                 ) -> np.ndarray:
    """The start of every training window of every step: one order per seed, for all runs.

    ``seed``: ``None`` is ``cfg.seed``.
    """
    rng = np.random.default_rng(cfg.seed if seed is None else seed)
    return rng.integers(0, n_train - cfg.context - 1, size=(steps, cfg.batch))


# ----------------------------------------------------------------------------- model
def init_params(key: jax.Array, cfg: Config, vocab_size: int) -> dict:
    """GPT-2-style init: N(0, 0.02); residual outputs scaled by 1/sqrt(2 n_layer)."""
    d = cfg.d_model
    keys = iter(jax.random.split(key, 3 + 6 * cfg.n_layer))
    normal = lambda shape, std=0.02: std * jax.random.normal(next(keys), shape)  # noqa: E731
    out_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    blocks = []
    for _ in range(cfg.n_layer):
        blocks.append({
            "attn_gain": jnp.ones(d), "wq": normal((d, d)), "wk": normal((d, d)),
            "wv": normal((d, d)), "wo": normal((d, d), out_std),
            "mlp_gain": jnp.ones(d), "w_in": normal((d, 4 * d)),
            "w_out": normal((4 * d, d), out_std)})
    return {"tok_embed": normal((vocab_size, d)), "pos_embed": normal((cfg.context, d)),
            "blocks": blocks, "final_gain": jnp.ones(d), "head": normal((d, vocab_size))}


def rms_norm(x: jax.Array, gain: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * gain


def attention(block: dict, x: jax.Array, n_head: int) -> jax.Array:
    b, t, d = x.shape
    heads = lambda w: (x @ w).reshape(b, t, n_head, d // n_head)  # noqa: E731
    q, k, v = heads(block["wq"]), heads(block["wk"]), heads(block["wv"])
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d // n_head)
    causal = jnp.tril(jnp.ones((t, t), bool))
    scores = jnp.where(causal, scores, -1e30)
    out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
    return out.reshape(b, t, d) @ block["wo"]


def embed(params: dict, tokens: jax.Array) -> jax.Array:
    """The first block's input: token plus position embeddings."""
    return params["tok_embed"][tokens] + params["pos_embed"][: tokens.shape[1]]


def block_forward(block: dict, x: jax.Array, n_head: int) -> jax.Array:
    """One pre-norm block: attention, then the GELU MLP, each with a residual."""
    x = x + attention(block, rms_norm(x, block["attn_gain"]), n_head)
    h = jax.nn.gelu(rms_norm(x, block["mlp_gain"]) @ block["w_in"])
    return x + h @ block["w_out"]


def logits(params: dict, x: jax.Array) -> jax.Array:
    """The output layer: the last block's output, normalized, times the (untied) head."""
    return rms_norm(x, params["final_gain"]) @ params["head"]


def forward(params: dict, tokens: jax.Array, n_head: int) -> jax.Array:
    """Logits (batch, time, vocab) of the next character at every position."""
    x = embed(params, tokens)
    for block in params["blocks"]:
        x = block_forward(block, x, n_head)
    return logits(params, x)


def cross_entropy(logits: jax.Array, window: jax.Array) -> jax.Array:
    """Mean cross-entropy (nats, float32) of ``logits`` against the window's next characters."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.take_along_axis(logp, window[:, 1:, None], axis=-1).mean()


def loss_fn(params: dict, window: jax.Array, n_head: int) -> jax.Array:
    """Mean next-character cross-entropy (nats) over windows of ``context + 1`` tokens."""
    return cross_entropy(forward(params, window[:, :-1], n_head), window)
