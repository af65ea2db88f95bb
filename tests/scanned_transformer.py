"""A small pre-LayerNorm transformer run with ``flax.linen.scan`` over its layers, its unrolled
twin, and the dimension numbers that make the matrix optimizers see the same matrices in both.

Shared by tests/test_scanned_model.py (float64, the two models step for step) and
benchmarks/scanned_model.py (float32, step time).

* :class:`Scanned`: ``embed`` (Dense), ``layers`` (``nn.scan`` of :class:`Block` with
  ``variable_axes={'params': 0}``: every per-layer weight is one leaf with a leading layer
  axis ``(L, ...)``), ``final_ln``. A block: LayerNorm, causal multi-head self-attention
  (``nn.MultiHeadDotProductAttention`` without biases: a key bias adds the same number to
  every logit of a query, so its gradient is zero but for rounding; its query/key/value
  kernels are ``(d, heads, head_dim)`` per layer and its output kernel ``(heads, head_dim,
  d)``), a residual, then
  LayerNorm, a Dense-gelu-Dense MLP and a residual.
* :class:`Unrolled`: the same blocks as ``layers_0`` ... ``layers_{L-1}``, each weight a
  separate leaf; :func:`unstack` gives its params from the scanned ones (slices).
* :func:`dimension_numbers`: per leaf, which axes are one layer's rows (reduction, the
  input side) and columns (output); the layer axis of a stacked leaf is neither, so it is a
  batch axis. The 3-D attention kernels need no reshape: several output axes
  (``MuonDimensionNumbers(1, (2, 3))`` for ``(L, d, heads, head_dim)``) or several reduction
  axes (``MuonDimensionNumbers((1, 2), 3)`` for ``(L, heads, head_dim, d)``) make them the
  ``(d, heads * head_dim)`` and ``(heads * head_dim, d)`` matrices they are.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from functrain.contrib import MuonDimensionNumbers as Dims


class Block(nn.Module):
    """One pre-LN transformer block, in ``nn.scan``'s ``(carry, x) -> (carry, y)`` form."""

    heads: int
    hidden: int

    @nn.compact
    def __call__(self, x: jax.Array, _: Any = None) -> tuple[jax.Array, None]:
        h = nn.LayerNorm(name="ln_attn")(x)
        causal = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        attn = nn.MultiHeadDotProductAttention(self.heads, use_bias=False, name="attn")
        x = x + attn(h, h, mask=causal)
        h = nn.LayerNorm(name="ln_mlp")(x)
        h = nn.Dense(x.shape[-1], name="mlp_out")(nn.gelu(nn.Dense(self.hidden, name="mlp_in")(h)))
        return x + h, None


class Scanned(nn.Module):
    """``L`` blocks run by ``nn.scan``: their weights stacked ``(L, ...)``."""

    layers: int
    width: int
    heads: int
    hidden: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Dense(self.width, name="embed")(x)
        blocks = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True},
                         length=self.layers)
        x, _ = blocks(self.heads, self.hidden, name="layers")(x, None)
        return nn.LayerNorm(name="final_ln")(x)


class Unrolled(nn.Module):
    """The same model with its blocks unrolled: ``layers_0`` ... ``layers_{L-1}``."""

    layers: int
    width: int
    heads: int
    hidden: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Dense(self.width, name="embed")(x)
        for i in range(self.layers):
            x, _ = Block(self.heads, self.hidden, name=f"layers_{i}")(x)
        return nn.LayerNorm(name="final_ln")(x)


def models(layers: int = 3, width: int = 16, heads: int = 2, hidden: int = 32) -> tuple:
    """``(Scanned(...), Unrolled(...))`` of the same sizes."""
    return (Scanned(layers, width, heads, hidden), Unrolled(layers, width, heads, hidden))


def init_params(model: Scanned, x: jax.Array, seed: int = 0) -> Any:
    """The scanned model's params (float dtype of ``x``): Flax's init, then every leaf moved by
    ``0.1 * N(0, 1)`` so that no LayerNorm output is exactly mean-free (a mean-free input
    would make each attention kernel's gradient, and SOAP's statistics, rank-deficient)."""
    params = model.init(jax.random.PRNGKey(seed), x)["params"]
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda p: jnp.asarray(np.asarray(p, np.float64) + 0.1 * rng.normal(size=p.shape),
                              x.dtype), params)


def unstack(params: Any, layers: int) -> Any:
    """The scanned params as the unrolled model's: layer ``i`` of every stacked leaf."""
    out = {k: v for k, v in params.items() if k != "layers"}
    for i in range(layers):
        out[f"layers_{i}"] = jax.tree_util.tree_map(lambda a: a[i], params["layers"])
    return out


def by_weight(tree: dict, layers: int) -> dict:
    """An unrolled-model-shaped tree (params, or a params-shaped part of a state) in the
    scanned model's leaf order: ``layers`` holds, per weight, the list of its ``L`` layers."""
    out = {k: v for k, v in tree.items() if not k.startswith("layers_")}
    out["layers"] = jax.tree_util.tree_map(lambda *xs: list(xs),
                                           *[tree[f"layers_{i}"] for i in range(layers)])
    return out


def from_by_weight(tree: dict, layers: int) -> dict:
    """The inverse of :func:`by_weight`."""
    out = {k: v for k, v in tree.items() if k != "layers"}
    for i in range(layers):
        out[f"layers_{i}"] = jax.tree_util.tree_map(lambda xs: xs[i], tree["layers"],
                                                    is_leaf=lambda n: isinstance(n, list))
    return out


def stack_lists(tree: Any) -> Any:
    """Each list of per-layer arrays (or of per-layer trees of arrays, such as a state's
    tuple of factors) in ``tree`` stacked into ``(L, ...)`` arrays."""
    return jax.tree_util.tree_map(
        lambda xs: jax.tree_util.tree_map(lambda *layers: jnp.stack(layers), *xs), tree,
        is_leaf=lambda n: isinstance(n, list))


def _kernel_axes(path: tuple, ndim: int) -> tuple:
    """(reduction axes, output axes) of one layer's kernel."""
    if ndim == 2:                               # Dense: (in, out)
        return 0, 1
    if path[-2] == "out":                       # attention output: (heads, head_dim, d)
        return (0, 1), 2
    return 0, (1, 2)                            # query/key/value: (d, heads, head_dim)


def dimension_numbers(params: Any, *, muon: bool = False) -> Any:
    """Per leaf of the scanned (or the unrolled) params: its ``MuonDimensionNumbers``.

    Kernels: one layer's reduction and output axes, shifted by one for a stacked leaf (under
    ``layers``; its axis 0 is the layer axis, a batch axis), not for one layer of a
    :func:`by_weight` list. Biases and LayerNorm
    parameters: ``None`` for muon (AdamW's), else no reduction axis and every axis but the
    layer axis an output axis: one vector per layer.
    """
    def dims(path: Any, leaf: Any) -> Any:
        keys = tuple(k.key for k in path if isinstance(k, jax.tree_util.DictKey))
        # a stacked leaf: under "layers", not one layer of a by_weight list
        stacked = keys[0] == "layers" and isinstance(path[-1], jax.tree_util.DictKey)
        ndim = np.ndim(leaf) - stacked
        if keys[-1] == "kernel":
            red, out = _kernel_axes(keys, ndim)
        elif muon:
            return None
        else:
            red, out = (), tuple(range(ndim))
        def shift(axes: Any) -> Any:
            return tuple(a + stacked for a in axes) if isinstance(axes, tuple) else axes + stacked
        return Dims(shift(red), shift(out))
    return jax.tree_util.tree_map_with_path(dims, params)


def mse(model: nn.Module, params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    """The mean squared error of ``model`` with ``params`` on ``(x, y)``."""
    return jnp.mean((model.apply({"params": params}, x) - y) ** 2)
