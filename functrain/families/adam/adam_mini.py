"""Adam-mini (Zhang et al., 2024): Adam with one second moment per block of parameters.

Adam keeps a second moment for every parameter. Adam-mini cuts each weight into blocks
(for a transformer: one per attention head of the query and key weights, one per output
neuron of the value, attention-output and MLP weights, one per token of the embeddings
and the output layer, one per whole tensor elsewhere) and keeps one second moment per
block, the mean of the squared gradients over it: the momentum stays per parameter, so
the state is about half of AdamW's. optax does not have it.

The partition is given by the shape of each leaf's second moment, its *block grid*: one
int per axis, each dividing the axis' size; the axis is cut into that many equal
contiguous pieces, and a block is one piece along every axis. ``(1, n_out)`` for a
``(n_in, n_out)`` kernel is one block per output neuron; ``(1, n_heads)`` one per head;
``(vocab, 1)`` for an embedding one per token; all ones one per tensor; the leaf's own
shape one per entry (Adam). The state holds exactly these shapes, so the update needs
nothing but the state; :func:`adam_mini_blocks` is the default rule (the official code's,
read from the key paths), and ``blocks=`` takes a function of the params (or a tree) for
any other.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from functrain import tree as ft
from functrain.arg_checks import check_betas, check_nonnegative, check_positive
from functrain.declarations import declare_optimizer, hyperparameters, state_value_kinds
from functrain.engine.program import chain, stage_transform
from functrain.engine.protocol import GradientTransformation, MaskOrFn, Params, ScalarOrSchedule
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.counts import BiasCorrections, corrections, zero_count
from functrain.numerics import abs_sq, adam_direction, ema_update
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.docstrings import shared_args

Array = jax.Array
PyTree = Any
BlocksSpec = Union[None, PyTree, Callable[[PyTree], PyTree]]

__all__ = ["ScaleByAdamMiniState", "adam_mini_blocks", "adam_mini_decay_mask",
           "scale_by_adam_mini", "adam_mini"]

# The official code's name lists (Adam-mini v1.1.1), matched as substrings of the
# lower-cased key path joined with dots ("blocks.0.attn.wq").
EMBED_NAMES = ("embed", "embd", "wte")
OUTPUT_NAMES = ("lm_head", "output", "final_layer")
QUERY_KEY_NAMES = ("k_proj", "q_proj", "wq", "wk", "query", "key")
VALUE_NAMES = ("v_proj", "wv", "value")
ATTN_PROJ_NAMES = ("o_proj", "wo", "attn.proj")
MLP_NAMES = ("feed_forward", "linear", "mlp")
ADAM_NAMES = ("bias",)
NO_DECAY_NAMES = ("norm", "ln", "bias")


@state_value_kinds(mu="signed", nu="unsigned")
class ScaleByAdamMiniState(NamedTuple):
    """State of :func:`scale_by_adam_mini`.

    Attributes:
      count: the number of steps taken (int32).
      mu: the momentum, a tree like the params.
      nu: per leaf, one second moment per block: an array whose shape is the leaf's
        block grid (see the module's docstring), in the parameter's dtype (as Adam's).

    >>> import jax.numpy as jnp
    >>> scale_by_adam_mini().init({'mlp': jnp.zeros((2, 3))}).nu
    {'mlp': Array([[0., 0., 0.]], dtype=float32)}
    """

    count: Array
    mu: Any
    nu: Any


def _path_name(path: tuple) -> str:
    """A key path as the official code's names read: lower-case keys joined by dots."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return ".".join(parts).lower()


def _has(name: str, names: tuple) -> bool:
    return any(n in name for n in names)


def _default_grid(name: str, shape: tuple, n_heads: int, where: str) -> tuple:
    """The official code's block grid for one leaf (JAX layouts: kernels ``(in, out)``)."""
    ndim = len(shape)
    whole = (1,) * ndim
    if _has(name, ADAM_NAMES):
        return tuple(shape)
    if ndim < 2:
        return whole
    if _has(name, QUERY_KEY_NAMES):
        if ndim > 2:  # (embed, heads, head_dim): the heads axis is the second to last
            return whole[:-2] + (shape[-2], 1)
        # (dim, heads * head_dim): heads of dim / n_heads columns, as the official code's
        # head_numel = dim * dim / n_heads (a key with fewer heads gets fewer blocks).
        d_in, d_out = shape
        if d_in % n_heads or (d_out * n_heads) % d_in or d_out == 0:
            raise ValueError(
                f"adam_mini_blocks: leaf {where} of shape {shape} is a query or key weight "
                f"(by its name), but its input size {d_in} and output size {d_out} do not "
                f"split into heads of {d_in} / n_heads = {d_in / n_heads:g} columns with "
                f"n_heads={n_heads}: pass the model's n_heads, or blocks=.")
        return (1, d_out * n_heads // d_in)
    if _has(name, EMBED_NAMES):
        return (shape[0],) + whole[1:]  # one block per token (row)
    if _has(name, OUTPUT_NAMES + VALUE_NAMES + ATTN_PROJ_NAMES + MLP_NAMES):
        return whole[:-1] + (shape[-1],)  # one block per output neuron (column)
    return whole


def adam_mini_blocks(params: PyTree, n_heads: int = 32) -> PyTree:
    """The official code's partition of ``params`` into Adam-mini blocks, as block grids.

    Each leaf is matched by its key path (lower-cased, keys joined by dots) against the
    official code's names, in its order: ``bias`` → one block per entry (Adam);
    query/key names (``q_proj``, ``wq``, ``query``, ...) → one per head; embedding names
    (``embed``, ``embd``, ``wte``) → one per token (row); output, value, attention-output
    and MLP names (``lm_head``, ``v_proj``, ``o_proj``, ``mlp``, ...) → one per output
    neuron (last axis); anything else, and any leaf of fewer than 2 axes → one block.
    Layouts are JAX's: kernels ``(in, out)``, embeddings ``(vocab, dim)``, a 3-D query or
    key kernel ``(embed, heads, head_dim)``; a 2-D one ``(dim, heads * head_dim)`` is cut
    into heads of ``dim / n_heads`` columns. Stacked layers (a leading layer axis) need
    their own grid through ``blocks=``.

    Args:
      params: the parameter tree (arrays or ``jax.ShapeDtypeStruct`` s; ``None`` and
        ``MaskedNode`` placeholders are kept).
      n_heads: the number of attention heads (the official code's default, 32).

    Returns:
      A tree like ``params`` with a tuple (the block grid) at each leaf.

    >>> import jax.numpy as jnp
    >>> params = {'attn': {'wq': jnp.zeros((8, 8)), 'wv': jnp.zeros((8, 8))},
    ...           'ln': {'scale': jnp.zeros(8), 'bias': jnp.zeros(8)}}
    >>> adam_mini_blocks(params, n_heads=2)
    {'attn': {'wq': (1, 2), 'wv': (1, 8)}, 'ln': {'bias': (8,), 'scale': (1,)}}
    """
    check_positive("adam_mini_blocks", n_heads=n_heads)
    flat, treedef = jax.tree_util.tree_flatten_with_path(params, is_leaf=ft.is_placeholder)
    grids = [x if ft.is_placeholder(x) else
             _default_grid(_path_name(path), tuple(np.shape(x)), n_heads,
                           jax.tree_util.keystr(path)) for path, x in flat]
    return treedef.unflatten(grids)


def adam_mini_decay_mask(params: PyTree) -> PyTree:
    """The official code's weight-decay mask: no decay where the key path names a norm or bias.

    Args:
      params: the parameter tree.

    Returns:
      A tree of bools like ``params``: ``False`` where the lower-cased key path contains
      ``norm``, ``ln`` or ``bias``.

    >>> import jax.numpy as jnp
    >>> adam_mini_decay_mask({'ln_f': jnp.ones(2), 'w': jnp.ones(2)})
    {'ln_f': False, 'w': True}
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(params, is_leaf=ft.is_placeholder)
    return treedef.unflatten([x if ft.is_placeholder(x) else
                              not _has(_path_name(path), NO_DECAY_NAMES) for path, x in flat])


def _check_grid(grid: Any, shape: tuple, where: str, owner: str) -> tuple:
    """``grid`` as a tuple of ints dividing ``shape`` (an error names the leaf otherwise)."""
    ok = isinstance(grid, (tuple, list)) and all(
        isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in grid)
    if not ok or len(grid) != len(shape):
        raise ValueError(f"{owner}: the block grid of leaf {where} (shape {shape}) must be a "
                         f"tuple of {len(shape)} ints, one per axis, got {grid!r}.")
    for n, size in zip(grid, shape):
        if not (n == size or (n > 0 and size % n == 0) or (size == 0 and n == 1)):
            raise ValueError(f"{owner}: the block grid {tuple(grid)} of leaf {where} does not "
                             f"divide its shape {shape}: each entry must be a positive divisor "
                             f"of its axis' size (1: one block along it; the size: one per "
                             f"index).")
    return tuple(int(n) for n in grid)


def _grids(blocks: BlocksSpec, tree: PyTree, *, n_heads: int, owner: str) -> list:
    """Per leaf slot of ``tree`` (placeholders included): its checked grid, or ``None``."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=ft.is_placeholder)
    if blocks is None:
        spec = adam_mini_blocks(tree, n_heads)
    else:
        spec = blocks(tree) if callable(blocks) else blocks
    try:
        grids = treedef.flatten_up_to(spec)
    except (ValueError, TypeError):
        raise ValueError(f"{owner}: blocks must be a tree like the params with a block grid "
                         f"(a tuple of ints) at each leaf, or a function of the params "
                         f"returning one; its structure {jax.tree_util.tree_structure(spec)} "
                         f"does not fit the params' {treedef}.") from None
    return [None if ft.is_placeholder(x) else
            _check_grid(grid, tuple(np.shape(x)), jax.tree_util.keystr(path), owner)
            for (path, x), grid in zip(flat, grids)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class _BlockStage(LeafStage):
    """Adam-mini's stage: its ``nu`` of each leaf takes the leaf's block grid, which
    ``grids(params)`` reads from the key paths (the engine's ``init_leaf`` sees one leaf, not
    its path). Everything else is the engine's, so wrappers that rebuild the stage
    (``masked``) keep the grids."""

    grids: Callable[[PyTree], list]

    def init_state(self, params: Params) -> ScaleByAdamMiniState:
        """The state for ``params``: the engine's, with each ``nu`` of its grid's shape."""
        grids = self.grids(params)  # every leaf checked, the error naming its key path
        state = super().init_state(params)
        slots, treedef = jax.tree_util.tree_flatten(state.nu, is_leaf=ft.is_placeholder)
        return ft.distinct_buffers(state._replace(nu=treedef.unflatten([
            n if ft.is_placeholder(n) or grid is None else jnp.zeros(grid, n.dtype)
            for n, grid in zip(slots, grids)])))


def _split(shape: tuple, grid: tuple) -> tuple:
    """``shape`` with each axis cut into ``(blocks along it, entries per block)``."""
    return tuple(d for size, n in zip(shape, grid) for d in (n, size // n if n else 1))


@hyperparameters(b1="number", b2="decay", eps="number", n_heads="number")
@shared_args()
def scale_by_adam_mini(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, *,
                       blocks: BlocksSpec = None, n_heads: int = 32,
                       mu_dtype: Optional[Any] = None) -> GradientTransformation:
    """Rescale updates by Adam-mini's rule (Zhang et al., 2024, Algorithm 1).

    Per leaf, with ``B`` its blocks: ``mu = b1 mu + (1 - b1) g``; for each block ``b``,
    ``nu_b = b2 nu_b + (1 - b2) mean_{i in b} |g_i|**2``; the update of entry ``i`` of
    block ``b`` is ``(mu_i / (1 - b1**t)) / (sqrt(nu_b / (1 - b2**t)) + eps)``. A block of
    one entry is Adam. Reference: Zhang et al., 2024, "Adam-mini: Use Fewer Learning
    Rates To Gain More" (arXiv:2406.16793); official code github.com/zyushun/Adam-mini
    (v1.1.1), whose defaults these are (its docstring says ``eps=1e-6``, its signature and
    this ``1e-8``). Where the paper and the code differ, this follows the code: its
    partition (:func:`adam_mini_blocks`) and ``eps`` added outside the root.

    Args:
      b1: decay rate of the momentum, in ``[0, 1)``.
      b2: decay rate of the block second moments, in ``[0, 1)`` (or a decay schedule).
      eps: added to the root of the bias-corrected second moment; ``>= 0``.
      blocks: the partition: ``None`` (:func:`adam_mini_blocks` of the params with
        ``n_heads``), a tree like the params with a block grid (a tuple of ints, one per
        axis, each dividing the axis' size; see the module's docstring) at each leaf, or
        a function of the params returning one.
      n_heads: the number of attention heads, for the default partition of query and key
        weights (the official code's default, 32).
      <shared: mu_dtype>

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByAdamMiniState`; its
      ``init`` builds the state from the params' shapes and key paths alone.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_adam_mini(blocks=lambda p: {'w': (1, 2)})  # one block per column
    >>> g = {'w': jnp.array([[3., 1.], [4., 1.]])}
    >>> u, state = tx.update(g, tx.init(g))
    >>> state.nu['w'].shape, [round(float(x), 4) for x in u['w'][:, 0]]
    ((1, 2), [0.8485, 1.1314])
    """
    owner = "scale_by_adam_mini"
    check_betas(owner, b1=b1, b2=b2)
    check_nonnegative(owner, eps=eps)
    check_positive(owner, n_heads=n_heads)

    def leaf(g: Array, s: Any, p: Any, ctx: BiasCorrections) -> tuple:
        grid = tuple(s.nu.shape)
        if len(grid) != g.ndim or any(
                not (n == size or (n > 0 and size % n == 0) or (size == 0 and n == 1))
                for n, size in zip(grid, g.shape)):
            raise ValueError(f"{owner}: an update leaf of shape {g.shape} has a second moment "
                             f"of shape {grid}, which is not a block grid of it: was the "
                             f"state made by this transformation's init for these params?")
        split = _split(g.shape, grid)
        inner = tuple(range(1, 2 * g.ndim, 2))
        per_block = max(1, math.prod(split[1::2]))  # no 0/0 on zero-size leaves
        mean_sq = jnp.sum(abs_sq(g).reshape(split), axis=inner) / per_block
        nu = ema_update(mean_sq, s.nu, ctx.b2)
        mu = ema_update(g, s.mu, b1)
        u = adam_direction(mu.reshape(split), nu.reshape(_split(grid, grid)), ctx.mu, ctx.nu,
                           eps)
        return u.reshape(g.shape), s._replace(mu=mu, nu=nu)

    return stage_transform(_BlockStage(
        name=owner, update_leaf=leaf, state_cls=ScaleByAdamMiniState,
        leaf_fields=("mu", "nu"),
        init_leaf=lambda p: (ft.zeros_like(p, mu_dtype),
                             jnp.zeros((1,) * np.ndim(p), p.dtype)),
        init_global=zero_count, prepare=corrections(b1, b2),
        grids=jax.tree_util.Partial(_grids, blocks, n_heads=n_heads, owner=owner),
        checks=LeafChecks(shaped_fields=("mu",))))


@declare_optimizer("beyond optax", "Zhang et al., 2024", optax=None, stressed=True, summary=(
    "Adam-mini (Zhang et al., 2024): Adam's momentum with one second moment per block (head, "
    "neuron, token or tensor), about half of AdamW's state."),
    signature="adam_mini(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-8, ...)")
@hyperparameters(learning_rate="schedule", b1="number", b2="decay", eps="number",
                 weight_decay="schedule", n_heads="number")
@shared_args()
def adam_mini(learning_rate: ScalarOrSchedule = 1e-3, b1: float = 0.9, b2: float = 0.999,
              eps: float = 1e-8, weight_decay: ScalarOrSchedule = 0.0,
              mask: Optional[MaskOrFn] = adam_mini_decay_mask, *, blocks: BlocksSpec = None,
              n_heads: int = 32, mu_dtype: Optional[Any] = None,
              cautious_weight_decay: bool = False) -> GradientTransformation:
    """Adam-mini (Zhang et al., 2024): Adam with one second moment per block.

    Update rule: ``p -= learning_rate * (mu_hat_i / (sqrt(nu_hat_b) + eps) +
    weight_decay * p)``, with ``mu`` Adam's momentum per entry and ``nu_b`` the moving
    average of the mean ``|g|**2`` over the entry's block ``b`` (:func:`scale_by_adam_mini`),
    both bias-corrected. The official code's partition (:func:`adam_mini_blocks`): one
    block per head of the query and key weights, per output neuron of the value,
    attention-output, MLP and output weights, per token of the embeddings, per entry of
    the biases, one per tensor elsewhere; its weight decay skips norms and biases
    (:func:`adam_mini_decay_mask`). The second moments take about as many numbers as the
    blocks, so the state is about half of AdamW's.

    Reference: Zhang, Chen, Li, Ding, Chen, Ye, Luo & Sun, 2024, "Adam-mini: Use Fewer
    Learning Rates To Gain More" (arXiv:2406.16793); official code
    github.com/zyushun/Adam-mini, whose defaults these are.

    Args:
      <shared: learning_rate>
      b1: decay rate of the momentum, in ``[0, 1)``.
      b2: decay rate of the block second moments, in ``[0, 1)``.
      eps: added to the root of the second moment; ``>= 0``.
      <shared: weight_decay>
      mask: which leaves get weight decay: a tree of bools or a function of the params;
        the official code's rule by default, ``None`` for every leaf.
      blocks: the partition, as :func:`scale_by_adam_mini` takes it.
      n_heads: the number of attention heads, for the default partition.
      mu_dtype: storage dtype of the momentum.
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation``: ``chain(scale_by_adam_mini, add_decayed_weights,
      scale_by_learning_rate)``.

    >>> import jax.numpy as jnp
    >>> from functrain.contrib import adam_mini
    >>> opt = adam_mini(0.1)
    >>> params = {'mlp': jnp.zeros((3, 2))}
    >>> state = opt.init(params)
    >>> state[0].nu['mlp'].shape  # one second moment per output neuron
    (1, 2)
    >>> u, state = opt.update({'mlp': jnp.ones((3, 2))}, state, params)
    >>> print(round(float(u['mlp'][0, 0]), 4))
    -0.1
    """
    return chain(scale_by_adam_mini(b1, b2, eps, blocks=blocks, n_heads=n_heads,
                                    mu_dtype=mu_dtype),
                 add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate))
