"""benchmarks/capacity.py's model: a decoder-only transformer in plain JAX, scanned over layers.

Token embedding (vocabulary ``VOCAB``), ``n_layers`` pre-RMSNorm blocks of causal multi-head
attention (head dimension 128, ``d_model = 128 * heads``; q, k, v, o projections without
biases) and a GELU MLP of width ``4 * d_model`` (tanh form, no biases), a final RMSNorm and an
untied output projection; the blocks' weights stacked on a leading layer axis. bfloat16
activations, float32 norms, softmax and cross-entropy. :func:`loss_fn` is the whole model (a
scan over a ``jax.checkpoint`` ed block); :func:`embed`, :func:`block` and :func:`head` are
its three parts, as ``functrain.gradient_release`` takes them.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

VOCAB = 32768
HEAD_DIM = 128
MLP_RATIO = 4


def param_shapes(d_model: int, n_layers: int, vocab: int = VOCAB) -> dict:
    """The model's parameter shapes.

    Args:
      d_model: the width, a multiple of ``HEAD_DIM``.
      n_layers: the number of blocks.
      vocab: the vocabulary size.

    Returns:
      ``{"embed", "layers": {...}, "final_norm", "unembed"}`` of shape tuples; every leaf of
      ``"layers"`` has the leading layer axis ``n_layers``.
    """
    if d_model % HEAD_DIM:
        raise ValueError(f"d_model must be a multiple of {HEAD_DIM}, got {d_model}.")
    d, f, n = d_model, MLP_RATIO * d_model, n_layers
    return {"embed": (vocab, d),
            "layers": {"norm1": (n, d), "wq": (n, d, d), "wk": (n, d, d), "wv": (n, d, d),
                       "wo": (n, d, d), "norm2": (n, d), "w_in": (n, d, f),
                       "w_out": (n, f, d)},
            "final_norm": (d,), "unembed": (d, vocab)}


def param_count(d_model: int, n_layers: int, vocab: int = VOCAB) -> int:
    """The model's parameter count, by formula: ``2 V d + d + L (12 d^2 + 2 d)``.

    Args:
      d_model: the width.
      n_layers: the number of blocks.
      vocab: the vocabulary size.

    Returns:
      The number of parameters (embedding, blocks, final norm, output projection).
    """
    d = d_model
    return 2 * vocab * d + d + n_layers * ((4 + 2 * MLP_RATIO) * d * d + 2 * d)


def _rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    """RMSNorm in float32, returned in bfloat16."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + 1e-6)
    return (x32 * scale.astype(jnp.float32)).astype(jnp.bfloat16)


def _block(x: jax.Array, p: dict) -> jax.Array:
    """One pre-norm block on bfloat16 activations ``x`` of shape (B, S, d)."""
    bf = jnp.bfloat16
    b, s, d = x.shape
    heads = d // HEAD_DIM
    h = _rms_norm(x, p["norm1"])
    q, k, v = (jnp.einsum("bsd,de->bse", h, p[w].astype(bf)).reshape(b, s, heads, HEAD_DIM)
               for w in ("wq", "wk", "wv"))
    scores = jnp.einsum("bqhk,bthk->bhqt", q, k,
                        preferred_element_type=jnp.float32) / math.sqrt(HEAD_DIM)
    causal = jnp.tril(jnp.ones((s, s), bool))
    scores = jnp.where(causal, scores, -1e30)
    probs = jax.nn.softmax(scores, axis=-1).astype(bf)
    attended = jnp.einsum("bhqt,bthk->bqhk", probs, v).reshape(b, s, d)
    x = x + jnp.einsum("bsd,de->bse", attended, p["wo"].astype(bf))
    h = _rms_norm(x, p["norm2"])
    h = jax.nn.gelu(jnp.einsum("bsd,df->bsf", h, p["w_in"].astype(bf)))
    return x + jnp.einsum("bsf,fd->bsd", h, p["w_out"].astype(bf))


def embed(rest: dict, batch: dict) -> jax.Array:
    """The embedded inputs, bfloat16 (B, S, d): the model's first part.

    Args:
      rest: the params other than ``"layers"``.
      batch: ``{"inputs": (B, S) int32 tokens, ...}``.

    Returns:
      The first block's input.
    """
    return jnp.take(rest["embed"], batch["inputs"], axis=0).astype(jnp.bfloat16)


def block(p: dict, x: jax.Array) -> jax.Array:
    """One block (one layer's slice of ``params["layers"]``) on bfloat16 activations."""
    return _block(x, p)


def head(rest: dict, x: jax.Array, batch: dict) -> jax.Array:
    """Mean next-token cross-entropy (float32) from the last block's output.

    Args:
      rest: the params other than ``"layers"``.
      x: the last block's output.
      batch: ``{..., "targets": (B, S) int32 next tokens}``.

    Returns:
      The scalar float32 loss.
    """
    x = _rms_norm(x, rest["final_norm"])
    logits = jnp.einsum("bsd,dv->bsv", x, rest["unembed"].astype(jnp.bfloat16),
                        preferred_element_type=jnp.float32)
    picked = jnp.take_along_axis(logits, batch["targets"][..., None], axis=-1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def loss_fn(params: dict, batch: dict) -> jax.Array:
    """Mean next-token cross-entropy (float32) of the model on ``batch``.

    Args:
      params: a tree of :func:`param_shapes` (float32 or bfloat16 leaves).
      batch: ``{"inputs": (B, S) int32 tokens, "targets": (B, S) int32 next tokens}``.

    Returns:
      The scalar float32 loss.
    """
    body = jax.checkpoint(lambda carry, p: (_block(carry, p), None), prevent_cse=False)
    x, _ = jax.lax.scan(body, embed(params, batch), params["layers"])
    return head(params, x, batch)
