"""MuonClip: Muon, then QK-Clip on the attention weights (Kimi Team, 2025, "Kimi K2: Open
Agentic Intelligence", arXiv 2507.20534).

Muon trains large attention models fast, but their pre-softmax attention logits can grow
without bound and destabilize training. QK-Clip caps them at the source: after each
optimizer step, for each attention head ``h`` whose largest logit in this step's forward pass,
``S_max^h``, exceeds ``tau``, it rescales that head's query weights by ``gamma_h**alpha`` and
its key weights by ``gamma_h**(1 - alpha)`` with ``gamma_h = tau / S_max^h``, so that every
``q . k`` of the head shrinks by ``gamma_h``: the same batch would now reach ``tau`` at most.
Heads at or below ``tau`` are untouched; nothing else changes (the paper's ``alpha = 0.5``:
both sides by ``sqrt(gamma_h)``; its K2 run used ``tau = 100``).

The model measures ``S_max^h`` in its forward pass (typically returned as an auxiliary output
of the loss) and passes it to ``update(..., attention_logits={layer: logits})``; which leaves
are each layer's query and key weights, and which axis holds the heads, is said once, with
:class:`QKClipLayer`. :func:`qk_clip` is the clip alone, the last stage of any chain;
:func:`muon_clip` is ``chain(muon(...), qk_clip(...))``.

What is covered: standard multi-head attention, each head with its own query and key weights
(per-head or fused ``(d_model, num_heads * head_dim)`` layouts, scanned stacks of layers). Not
covered: MLA's shared rotary key (the paper clips only the head-specific parts there), grouped
keys shared by several query heads (GQA), and query or key biases (not rescaled).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from functrain import tree as ft
from functrain.arg_checks import (check_positive, check_range, missing_argument_error,
                                  needs_params_error)
from functrain.declarations import declare_optimizer, hyperparameters
from functrain.families.muon.muon import NsCoeffs, muon
from functrain.engine.program import chain, leaf_compute_dtype
from functrain.engine.protocol import (EmptyState, GradientTransformation,
                                       GradientTransformationExtraArgs, MaskOrFn, Params,
                                       ScalarOrSchedule, Updates)
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["QKClipLayer", "qk_clip", "muon_clip"]


class QKClipLayer(NamedTuple):
    """Where one attention layer's query and key weights live, and which axis holds the heads.

    ``query`` and ``key`` are paths into the params: a tuple of keys (``('block0', 'wq')``,
    list indices as ints) or one string joining them with ``'/'`` (``'block0/wq'``). The two
    leaves have the same head layout:

    - one axis per head: ``head_axis`` is that axis, e.g. ``(d_model, num_heads, head_dim)``
      with ``head_axis=1``; leave ``num_heads`` ``None``;
    - fused heads, e.g. ``(d_model, num_heads * head_dim)``: ``head_axis`` is the fused axis
      (default ``-1``) and ``num_heads`` splits it into equal, head-major blocks (head ``h``
      is entries ``h * head_dim`` to ``(h + 1) * head_dim - 1``).

    A scanned stack of layers, e.g. ``(num_layers, d_model, num_heads * head_dim)``, sets
    ``layer_axis`` (here ``0``): its logits then have shape ``(num_layers, num_heads)``.

    Attributes:
      query: the path of the query weights.
      key: the path of the key weights.
      head_axis: the axis holding the heads (negative counts from the end); default ``-1``.
      num_heads: ``None`` (``head_axis`` has one entry per head) or the number of heads fused
        in ``head_axis``.
      layer_axis: ``None`` (one layer) or the axis of a stack of layers.

    >>> QKClipLayer('attn/wq', 'attn/wk', num_heads=4)
    QKClipLayer(query='attn/wq', key='attn/wk', head_axis=-1, num_heads=4, layer_axis=None)
    """

    query: Union[str, Sequence[Any]]
    key: Union[str, Sequence[Any]]
    head_axis: int = -1
    num_heads: Optional[int] = None
    layer_axis: Optional[int] = None


# --------------------------------------------------------------------------
# Resolving the spec against the params (every check before any array math)
# --------------------------------------------------------------------------

def _plain(entry: Any) -> Any:
    """The plain key of one jax key-path entry (dict key, sequence index, attribute name)."""
    for attr in ("key", "idx", "name"):
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return entry


def _as_keys(path: Union[str, Sequence[Any]]) -> tuple:
    return tuple(path.split("/")) if isinstance(path, str) else tuple(path)


def _matches(wanted: tuple, keys: tuple) -> bool:
    return len(wanted) == len(keys) and all(
        w == k or (isinstance(w, str) and str(k) == w) for w, k in zip(wanted, keys))


def _check_layer_types(layers: Any, owner: str) -> None:
    if not isinstance(layers, Mapping):
        raise TypeError(f"{owner}: layers must be a dict of layer name -> QKClipLayer (or a "
                        f"function of the params returning one), got {type(layers).__name__}.")
    for name, layer in layers.items():
        if not isinstance(layer, QKClipLayer):
            raise TypeError(f"{owner}: layers[{name!r}] must be a QKClipLayer(query=..., "
                            f"key=..., head_axis=..., num_heads=...), got "
                            f"{type(layer).__name__}.")
        for what, value in (("head_axis", layer.head_axis), ("num_heads", layer.num_heads),
                            ("layer_axis", layer.layer_axis)):
            if value is not None and not isinstance(value, (int, np.integer)):
                raise TypeError(f"{owner}: layers[{name!r}].{what} must be an int"
                                f"{'' if what == 'head_axis' else ' or None'}, got {value!r}.")
        if layer.num_heads is not None and layer.num_heads < 1:
            raise ValueError(f"{owner}: layers[{name!r}].num_heads must be >= 1, got "
                             f"{layer.num_heads}.")


class _Target(NamedTuple):
    """One query or key leaf to clip: its flat index and how its heads broadcast."""

    index: int
    layer: str
    exponent_of_alpha: bool  # True: the query (gamma**alpha); False: the key
    head_axis: int
    head_size: int           # entries per head along head_axis (1 unless fused)
    layer_axis: Optional[int]


def _resolve(layers: Mapping[str, QKClipLayer], paths: list, keys: list, leaves: list,
             logits: Mapping[str, Any], owner: str) -> list:
    """The :class:`_Target` of every query and key leaf, every spec and shape checked."""
    unknown = [n for n in logits if n not in layers]
    if unknown:
        raise ValueError(f"{owner}: attention_logits names layer(s) {unknown} that layers does "
                         f"not; the layers are {list(layers)}.")
    missing = [n for n in layers if n not in logits]
    if missing:
        raise ValueError(f"{owner}: attention_logits has no entry for layer(s) {missing}: pass "
                         f"each layer's per-head max logits, attention_logits={{name: "
                         f"logits}}.")
    targets, claimed = [], {}
    for name, layer in layers.items():
        want = np.shape(logits[name])
        for role, path in (("query", layer.query), ("key", layer.key)):
            wanted = _as_keys(path)
            found = [i for i, k in enumerate(keys) if _matches(wanted, k)]
            if not found:
                raise ValueError(f"{owner}: layer {name!r}'s {role} path {path!r} is not in "
                                 f"the params, whose paths are {ft.format_paths(paths)}.")
            i = found[0]
            where = f"layer {name!r}'s {role} {paths[i]}"
            if i in claimed:
                raise ValueError(f"{owner}: {where} is also {claimed[i]}: each query or key "
                                 f"leaf belongs to one layer.")
            claimed[i] = where
            x = leaves[i]
            if ft.is_placeholder(x):
                raise ValueError(f"{owner}: {where} has no update (a {type(x).__name__}).")
            shape = np.shape(x)
            ndim = len(shape)
            if not -ndim <= layer.head_axis < ndim:
                raise ValueError(f"{owner}: {where} has shape {shape}, which has no head_axis "
                                 f"{layer.head_axis}.")
            head = layer.head_axis % ndim
            stack = None
            if layer.layer_axis is not None:
                if not -ndim <= layer.layer_axis < ndim or layer.layer_axis % ndim == head:
                    raise ValueError(f"{owner}: {where} has shape {shape}: layer_axis "
                                     f"{layer.layer_axis} must be an axis other than "
                                     f"head_axis {layer.head_axis}.")
                stack = layer.layer_axis % ndim
            heads = shape[head] if layer.num_heads is None else layer.num_heads
            if shape[head] % heads:
                raise ValueError(f"{owner}: {where} has shape {shape}: its axis {head} "
                                 f"({shape[head]}) does not split into num_heads={heads} "
                                 f"equal heads.")
            expected = (heads,) if stack is None else (shape[stack], heads)
            if tuple(want) != expected:
                raise ValueError(
                    f"{owner}: attention_logits[{name!r}] has shape {tuple(want)} but {where} "
                    f"of shape {shape} has {heads} heads"
                    f"{'' if stack is None else f' in {shape[stack]} stacked layers'}: pass "
                    f"one max logit per head, shape {expected}.")
            targets.append(_Target(i, name, role == "query", head, shape[head] // heads,
                                   stack))
    return targets


def _head_factor(sm1: Array, target: _Target, ndim: int) -> Array:
    """``sm1`` (``(heads,)`` or ``(layers, heads)``) broadcast against the leaf's axes."""
    if target.head_size > 1:
        sm1 = jnp.repeat(sm1, target.head_size, axis=-1)
    axes = (target.head_axis,) if target.layer_axis is None else (target.layer_axis,
                                                                   target.head_axis)
    if len(axes) == 2 and axes[0] > axes[1]:
        sm1, axes = sm1.T, axes[::-1]
    shape = [1] * ndim
    for a, n in zip(axes, sm1.shape):
        shape[a] = n
    return sm1.reshape(shape)


# --------------------------------------------------------------------------
# The clip, and MuonClip
# --------------------------------------------------------------------------

@hyperparameters(static=("layers",), tau="number", alpha="number")
def qk_clip(tau: float = 100.0, alpha: float = 0.5, *,
            layers: Union[Mapping[str, QKClipLayer], Callable[[Params], Mapping[str, Any]]]
            ) -> GradientTransformationExtraArgs:
    """QK-Clip (Kimi Team, 2025): rescale the query and key weights of heads whose logits
    exceeded ``tau``.

    Rule, for each head ``h`` of each layer, with ``S`` its max pre-softmax logit in this
    step's forward pass (``attention_logits``): if ``S > tau``, ``gamma = tau / S`` and the
    stepped weights ``W = p + u`` become ``W_q gamma**alpha`` and ``W_k gamma**(1 - alpha)``
    on that head's entries, so every ``q . k`` of the head shrinks by ``gamma``; the returned
    update is ``W * scale - p`` there (computed as ``u + (scale - 1) (p + u)``, with ``scale -
    1 = expm1(alpha log gamma)``), and ``u`` itself everywhere else (heads at or below ``tau``
    and every other leaf, bit for bit). So the stage goes LAST in a chain, after the learning
    rate: ``apply_updates(params, updates)`` is the clip of the stepped params. Reference:
    Kimi Team, 2025, "Kimi K2: Open Agentic Intelligence" (arXiv 2507.20534), MuonClip;
    standard multi-head attention only (module docstring: not MLA's shared rotary key).

    ``update(updates, state, params, attention_logits=...)`` needs the params and the keyword
    ``attention_logits``: a dict layer name -> the per-head max logits, shape ``(num_heads,)``
    (``(num_layers, num_heads)`` for a stacked layer), one entry per layer of ``layers``.

    Args:
      tau: the logit cap, a finite number ``> 0`` (the paper's K2 run: 100).
      alpha: the query's share of the rescaling, in ``[0, 1]``; the key gets ``1 - alpha``
        (default 0.5: both ``sqrt(gamma)``).
      layers: a dict layer name (the key of ``attention_logits``) -> :class:`QKClipLayer`,
        or a function of the params returning one.

    Returns:
      A ``GradientTransformationExtraArgs``, stateless (``EmptyState``).

    >>> import jax.numpy as jnp
    >>> tx = qk_clip(10.0, layers={'attn': QKClipLayer('wq', 'wk', num_heads=2)})
    >>> params = {'wq': jnp.ones((1, 4)), 'wk': jnp.ones((1, 4))}
    >>> zero = {'wq': jnp.zeros((1, 4)), 'wk': jnp.zeros((1, 4))}
    >>> u, _ = tx.update(zero, tx.init(params), params,
    ...                  attention_logits={'attn': jnp.array([40.0, 5.0])})
    >>> (params['wq'] + u['wq']).tolist()  # head 0: sqrt(10 / 40); head 1 untouched
    [[0.5, 0.5, 1.0, 1.0]]
    """
    owner = "qk_clip"
    check_positive(owner, tau=tau)
    check_range("alpha", alpha, 0.0, 1.0, high_inclusive=True, owner=owner)
    if not callable(layers):
        _check_layer_types(layers, owner)

    def init_fn(params: Params) -> EmptyState:
        del params
        return EmptyState()

    def update_fn(updates: Updates, state: EmptyState, params: Optional[Params] = None,
                  attention_logits: Optional[Mapping[str, Any]] = None,
                  **extra_args: Any) -> tuple[Updates, EmptyState]:
        del extra_args
        if attention_logits is None:
            raise missing_argument_error(owner, "attention_logits")
        if not isinstance(attention_logits, Mapping):
            raise TypeError(f"{owner}: attention_logits must be a dict layer name -> per-head "
                            f"max logits, got {type(attention_logits).__name__}.")
        if params is None and (callable(layers) or layers):
            raise needs_params_error(owner, "update(updates, state, params, "
                                            "attention_logits=...)")
        spec = layers(params) if callable(layers) else layers
        _check_layer_types(spec, owner)
        if not spec:  # nothing to clip: only the names are checked
            _resolve(spec, [], [], [], attention_logits, owner)
            return updates, state
        ft.check_structure(params, updates, "updates", "params")
        flat, treedef = jax.tree_util.tree_flatten_with_path(updates, is_leaf=ft.is_placeholder)
        paths = [jax.tree_util.keystr(p) for p, _ in flat]
        keys = [tuple(_plain(e) for e in p) for p, _ in flat]
        leaves = [x for _, x in flat]
        targets = _resolve(spec, paths, keys, leaves, attention_logits, owner)
        ps = treedef.flatten_up_to(params)
        out = list(leaves)
        for t in targets:
            u = jnp.asarray(leaves[t.index])
            p = jnp.asarray(ps[t.index])
            dtype = leaf_compute_dtype(u, p)
            s = jnp.asarray(attention_logits[t.layer]).astype(dtype)
            log_gamma = jnp.log(jnp.asarray(tau, dtype)) - jnp.log(
                jnp.where(s > tau, s, jnp.asarray(tau, dtype)))
            share = alpha if t.exponent_of_alpha else 1 - alpha
            sm1 = _head_factor(jnp.expm1(share * log_gamma), t, u.ndim)
            u32, p32 = u.astype(dtype), p.astype(dtype)
            out[t.index] = jnp.where(sm1 != 0, u32 + sm1 * (p32 + u32), u32).astype(u.dtype)
        return treedef.unflatten(out), state

    return GradientTransformationExtraArgs(init_fn, update_fn)


@declare_optimizer("beyond optax", "Kimi Team, 2025", optax=None, stressed=True, summary=(
    "MuonClip (Kimi Team, 2025): Muon, then QK-Clip: heads whose max attention logit passed "
    "`tau` get their query and key weights rescaled by `(tau / S_max)**alpha` and `**(1 - "
    "alpha)`; `update(..., attention_logits=...)`."),
    signature="muon_clip(learning_rate, ..., tau=100.0, alpha=0.5, qk_layers)")
@hyperparameters(static=("mesh", "ns_dtype", "qk_layers"), learning_rate="schedule", ns_steps="int",
                 beta="number", eps="number", weight_decay="schedule", adam_b1="number",
                 adam_b2="decay", adam_eps_root="number", adam_weight_decay="schedule",
                 adam_learning_rate="schedule or None", consistent_rms="number or None",
                 tau="number", alpha="number")
@shared_args()
def muon_clip(learning_rate: ScalarOrSchedule, ns_coeffs: NsCoeffs = "standard",
              ns_steps: int = 5, beta: float = 0.95, eps: float = 1e-8,
              weight_decay: ScalarOrSchedule = 0.0, weight_decay_mask: Optional[MaskOrFn] = None,
              mu_dtype: Optional[Any] = None, *, nesterov: bool = True, adaptive: bool = False,
              preconditioning: str = "frobenius", adam_b1: float = 0.9, adam_b2: float = 0.999,
              adam_eps_root: float = 0.0, adam_weight_decay: ScalarOrSchedule = 0.0,
              adam_learning_rate: Optional[ScalarOrSchedule] = None,
              muon_weight_dimension_numbers: Any = None,
              consistent_rms: Optional[float] = None,
              mesh: Optional[jax.sharding.Mesh] = None,
              ns_method: str = "standard", ns_dtype: Optional[Any] = None,
              cautious_weight_decay: bool = False, tau: float = 100.0, alpha: float = 0.5,
              qk_layers: Union[Mapping[str, QKClipLayer], Callable[[Params], Mapping[str, Any]]]
              ) -> GradientTransformation:
    """MuonClip (Kimi Team, 2025): Muon's step, then QK-Clip on the attention weights.

    Update rule: ``p + u`` with ``u`` :func:`~functrain.contrib.muon`'s update (Muon on the
    matrices, AdamW on the other leaves), then for each head ``h`` of each layer of
    ``qk_layers`` whose max pre-softmax logit ``S`` of this step's forward pass exceeds
    ``tau``: ``gamma = tau / S``, the head's query weights times ``gamma**alpha`` and its key
    weights times ``gamma**(1 - alpha)`` (:func:`qk_clip`), so the head's logits on that
    batch would be at most ``tau``. ``chain(muon(...), qk_clip(tau, alpha,
    layers=qk_layers))``; ``update(grads, state, params, attention_logits={layer: logits})``.
    Reference: Kimi Team, 2025, "Kimi K2: Open Agentic Intelligence" (arXiv 2507.20534);
    standard multi-head attention (not MLA's shared rotary key).

    Args:
      learning_rate: Muon's step size, a number or a schedule.
      ns_coeffs: Newton-Schulz coefficients, as :func:`~functrain.contrib.muon`'s.
      ns_steps: the number of Newton-Schulz steps.
      beta: Muon's momentum decay, in ``[0, 1)``.
      eps: Muon's normalization epsilon, also AdamW's ``eps``.
      weight_decay: decoupled weight decay of the Muon leaves.
      weight_decay_mask: where to apply ``weight_decay`` among the Muon leaves.
      mu_dtype: storage dtype of the first moments.
      nesterov: Nesterov momentum (both sides), default ``True``.
      adaptive: scale the orthogonalized update by ``<M, O>``.
      preconditioning: Newton-Schulz's preconditioning, as :func:`~functrain.contrib.muon`'s.
      <shared: adam_b1>
      adam_b2: AdamW's second-moment decay.
      <shared: adam_eps_root, adam_weight_decay, adam_learning_rate>
      muon_weight_dimension_numbers: which leaves are Muon's and their matrix axes, as
        :func:`~functrain.contrib.muon`'s (``None``: the 2-D leaves).
      consistent_rms: ``None`` or the target RMS of Muon's update.
      mesh: divide Newton-Schulz over this mesh's devices.
      ns_method: ``'standard'`` or ``'gram'``.
      ns_dtype: the dtype Newton-Schulz runs in; ``None``: the updates'.
      cautious_weight_decay: Cautious Weight Decay for both sides' decay.
      tau: the logit cap, a finite number ``> 0`` (default 100, the paper's K2 setting).
      alpha: the query's share of the rescaling, in ``[0, 1]`` (default 0.5).
      qk_layers: each attention layer's query and key leaves: a dict layer name ->
        :class:`QKClipLayer` (or a function of the params returning one), as :func:`qk_clip`'s
        ``layers``; ``{}``: no clip (plain Muon).

    Returns:
      A ``GradientTransformationExtraArgs`` whose state is ``(muon's state, EmptyState())``.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.muon_clip(0.02, tau=30.0, qk_layers={
    ...     'attn': functrain.contrib.QKClipLayer('wq', 'wk', num_heads=2)})
    >>> params = {'wq': jnp.ones((4, 4)), 'wk': jnp.ones((4, 4)), 'b': jnp.zeros(4)}
    >>> grads = {'wq': jnp.eye(4), 'wk': jnp.eye(4), 'b': jnp.ones(4)}
    >>> u, state = opt.update(grads, opt.init(params), params,
    ...                       attention_logits={'attn': jnp.array([120.0, 3.0])})
    >>> plain = functrain.contrib.muon(0.02)  # the same step without the clip
    >>> v, _ = plain.update(grads, plain.init(params), params)
    >>> ratio = (functrain.apply_updates(params, u)['wq']
    ...          / functrain.apply_updates(params, v)['wq'])
    >>> ratio[0].round(4).tolist()  # head 0 (columns 0-1) times sqrt(30 / 120)
    [0.5, 0.5, 1.0, 1.0]
    """
    owner = "muon_clip"
    check_positive(owner, tau=tau)
    check_range("alpha", alpha, 0.0, 1.0, high_inclusive=True, owner=owner)
    base = muon(learning_rate, ns_coeffs, ns_steps, beta, eps, weight_decay, weight_decay_mask,
                mu_dtype, nesterov=nesterov, adaptive=adaptive, preconditioning=preconditioning,
                adam_b1=adam_b1, adam_b2=adam_b2, adam_eps_root=adam_eps_root,
                adam_weight_decay=adam_weight_decay, adam_learning_rate=adam_learning_rate,
                muon_weight_dimension_numbers=muon_weight_dimension_numbers,
                consistent_rms=consistent_rms, mesh=mesh, ns_method=ns_method,
                ns_dtype=ns_dtype, cautious_weight_decay=cautious_weight_decay)
    return chain(base, qk_clip(tau, alpha, layers=qk_layers))
