"""Gradient release for scanned layers: each layer's optimizer step inside the backward pass.

An ordinary training step holds the whole gradient tree at the end of the backward pass, as
large as the params, then runs the optimizer. A model written as a stack of identical layers
(one scan over stacked weights, as Flax's ``nn.scan`` / ``nnx.scan`` and MaxText-style models
are) does not have to: :func:`gradient_release` runs the backward pass layer by layer in
reverse, and as soon as a layer's gradient exists it applies the optimizer to that layer's
slice of the params and of the optimizer state, writes them back in place and drops the
gradient. Only one layer's gradient is alive at a time, besides the (small) gradient of the
leaves outside the stack: the embedding, the head, the final norm.

What it needs of the optimizer: that the update of a layer depends on that layer's gradient,
params and state only. Element-wise optimizers (sgd, adam, adamw, lion, ...), per-matrix
ones (muon, its family, the hyperball and norm-control stages) and the wrappers around them
(``quantized_state``, ``compensated_params``) qualify; each layer keeps its own copy of the
optimizer's state, made by ``jax.vmap(optimizer.init)`` over the layer axis (so a step count
is kept per layer, all equal). What does not qualify: anything that reads the whole gradient
tree before updating a leaf, such as ``clip_by_global_norm``, ``normalize_by_update_norm``
and the Polyak step (refused with an error when they are stages of a ``chain``; not
detectable inside an opaque transformation). In their place the step offers clipping by the
*previous* step's global norm (``clip_norm``): the gradients of step ``t`` are scaled by
``min(1, clip_norm / ||g_{t-1}||)``, with ``||g_{t-1}||`` the global norm of step ``t - 1``'s
(unclipped) gradients, which the step sums up layer by layer as it goes.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain import tree as ft
from functrain.arg_checks import check_range, check_transformation
from functrain.engine.program import fusion_plan
from functrain.engine.protocol import GradientTransformation, OptState, Params
from functrain.engine.stage import LeafStage
from functrain.param_updates import apply_updates

__all__ = ["GradientRelease", "GradientReleaseState", "gradient_release",
           "WHOLE_TREE_STAGES"]

#: Stages whose update of a leaf reads the whole gradient tree (refused by gradient release).
WHOLE_TREE_STAGES = frozenset({"clip_by_global_norm", "normalize_by_update_norm", "normalize",
                               "scale_by_polyak"})


class GradientReleaseState(NamedTuple):
    """The state of a :func:`gradient_release` step.

    Attributes:
      layers: the layer optimizer's state for each layer, stacked on a leading layer axis
        (``jax.vmap(layer_optimizer.init)`` of the stacked params).
      rest: the rest optimizer's state for the leaves outside the stack.
      grad_norm: the global norm of the last step's (unclipped) gradients (float32, or the
        params' dtype if wider); ``0`` before the first step.

    >>> import jax.numpy as jnp, functrain
    >>> release = functrain.gradient_release(functrain.adam(0.1), lambda r, b: b,
    ...                                      lambda p, x: x * p['w'], lambda r, x, b: x.sum())
    >>> state = release.init({'layers': {'w': jnp.ones((3, 2))}})
    >>> state.layers[0].count, state.layers[0].mu['w'].shape  # one count per layer
    (Array([0, 0, 0], dtype=int32), (3, 2))
    """

    layers: OptState
    rest: OptState
    grad_norm: jax.Array


class GradientRelease(NamedTuple):
    """What :func:`gradient_release` returns: ``init`` and the training ``step``.

    Attributes:
      init: ``init(params) -> GradientReleaseState``.
      step: ``step(params, state, batch) -> (params, state, loss)``, one training step;
        jit it (donating ``params`` and ``state``).

    >>> import jax.numpy as jnp, functrain
    >>> release = functrain.gradient_release(functrain.sgd(0.1), lambda r, b: b,
    ...                                      lambda p, x: x * p['w'], lambda r, x, b: x.sum())
    >>> params = {'layers': {'w': jnp.ones((2, 3))}}
    >>> params, _, loss = release.step(params, release.init(params), jnp.ones(3))
    >>> float(loss), params['layers']['w'].round(4).tolist()  # d loss / d w_l = 1: both 0.9
    (3.0, [[0.9, 0.9, 0.9], [0.9, 0.9, 0.9]])
    """

    init: Callable[[Params], GradientReleaseState]
    step: Callable[..., tuple]


def _check_per_leaf(tx: GradientTransformation, owner: str, name: str) -> None:
    for _, item in fusion_plan(tx):
        if isinstance(item, LeafStage) and item.name in WHOLE_TREE_STAGES:
            raise ValueError(
                f"{owner}: {name} has the stage {item.name!r}, which reads the whole "
                f"gradient tree before it updates a leaf; gradient release updates one layer "
                f"before the next layer's gradient exists. Leave it out (clip_norm= clips by "
                f"the previous step's global norm instead).")


def _split(params: Any, key: str, owner: str) -> tuple:
    if not isinstance(params, Mapping) or key not in params:
        raise ValueError(f"{owner}: params must be a mapping with the stacked layers under "
                         f"{key!r} (layers_key), got "
                         f"{type(params).__name__} with keys "
                         f"{list(params) if isinstance(params, Mapping) else '-'}.")
    stack = params[key]
    leaves = jax.tree_util.tree_leaves_with_path(stack)
    if not leaves:
        raise ValueError(f"{owner}: params[{key!r}] has no leaves.")
    sizes = {int(jnp.shape(x)[0]) if jnp.ndim(x) else None for _, x in leaves}
    if len(sizes) != 1 or None in sizes:
        bad = [(jax.tree_util.keystr(p), jnp.shape(x)) for p, x in leaves]
        raise ValueError(f"{owner}: every leaf of params[{key!r}] must have the same leading "
                         f"(layer) axis; got the shapes {bad}.")
    rest = {k: v for k, v in params.items() if k != key}
    return stack, rest, sizes.pop()


def _squared_norm(tree: Any) -> jax.Array:
    """The tree's squared L2 norm, accumulated as ``functrain.tree.norm`` does."""
    return ft.norm(tree, squared=True)


def gradient_release(optimizer: GradientTransformation,
                     embed: Callable[[Params, Any], Any],
                     layer: Callable[[Params, Any], Any],
                     head: Callable[[Params, Any, Any], jax.Array], *,
                     rest_optimizer: Optional[GradientTransformation] = None,
                     layers_key: str = "layers",
                     clip_norm: Optional[float] = None) -> GradientRelease:
    """A training step that updates each layer of a stack inside the backward pass.

    The model is ``loss = head(rest, x_L, batch)`` with ``x_{l+1} = layer(params[layers_key]
    [l], x_l)`` and ``x_0 = embed(rest, batch)``, ``rest`` the params other than the stack.
    ``step`` runs the forward pass as a scan, keeping each layer's input (what remat per
    layer keeps); then ``head``'s backward gives the rest's head gradient and the cotangent
    of ``x_L``; then, for ``l = L-1, ..., 0``, the layer's backward (recomputed from its
    input) gives its gradient, ``optimizer`` updates layer ``l``'s params and state in place,
    and the gradient is dropped; last, ``embed``'s backward completes the rest's gradient and
    ``rest_optimizer`` updates the rest. The numbers are the ordinary step's whenever the
    optimizer's update of a layer depends on that layer alone (module docstring).

    Args:
      optimizer: the layers' optimizer, applied to one layer's slice at a time.
      embed: ``embed(rest, batch) -> x_0``.
      layer: ``layer(layer_params, x) -> x``, one layer (the scan's body).
      head: ``head(rest, x_L, batch) -> loss``, a real scalar.
      rest_optimizer: the optimizer of the leaves outside the stack; ``None``: ``optimizer``.
      layers_key: the key of ``params`` holding the stacked layers.
      clip_norm: if given (``> 0``), scale every gradient of a step by ``min(1, clip_norm /
        n)``, ``n`` the previous step's global gradient norm (none at the first step).

    Returns:
      A :class:`GradientRelease`: ``init(params)`` and ``step(params, state, batch) ->
      (params, state, loss)``.

    >>> import jax, jax.numpy as jnp, functrain
    >>> release = functrain.gradient_release(
    ...     functrain.sgd(0.1), embed=lambda r, b: b * r['scale'],
    ...     layer=lambda p, x: jnp.tanh(x @ p['w']), head=lambda r, x, b: jnp.sum(x ** 2))
    >>> params = {'scale': jnp.ones(()), 'layers': {'w': jnp.stack([jnp.eye(2)] * 3)}}
    >>> state = release.init(params)
    >>> params, state, loss = jax.jit(release.step)(params, state, jnp.array([[1., 2.]]))
    >>> round(float(loss), 4)  # tanh(tanh(tanh(.))) of [1, 2], squared and summed
    0.7211
    """
    owner = "gradient_release"
    rest_opt = optimizer if rest_optimizer is None else rest_optimizer
    check_transformation(optimizer, owner, "optimizer")
    check_transformation(rest_opt, owner, "rest_optimizer")
    _check_per_leaf(optimizer, owner, "optimizer")
    _check_per_leaf(rest_opt, owner, "rest_optimizer")
    for name, fn in (("embed", embed), ("layer", layer), ("head", head)):
        if not callable(fn):
            raise TypeError(f"{owner}: {name} must be a function, got {type(fn).__name__}.")
    if clip_norm is not None:
        check_range("clip_norm", clip_norm, 0.0, owner=owner)
        if not clip_norm > 0:
            raise ValueError(f"{owner}: clip_norm must be > 0 (or None), got {clip_norm}.")

    def init(params: Params) -> GradientReleaseState:
        stack, rest, _ = _split(params, layers_key, owner)
        return GradientReleaseState(layers=jax.vmap(optimizer.init)(stack),
                                    rest=rest_opt.init(rest),
                                    grad_norm=jnp.zeros([], jax.eval_shape(
                                        _squared_norm, params).dtype))

    def step(params: Params, state: GradientReleaseState, batch: Any) -> tuple:
        if not isinstance(state, GradientReleaseState):
            raise ValueError(f"{owner}: state must be the GradientReleaseState of init, got "
                             f"{type(state).__name__}.")
        stack, rest, n_layers = _split(params, layers_key, owner)
        acc = state.grad_norm.dtype
        scale = jnp.ones([], acc)
        if clip_norm is not None:
            scale = jnp.where(state.grad_norm > clip_norm,
                              clip_norm / jnp.maximum(state.grad_norm, 1e-30), 1.0)

        def scaled(grads: Any) -> Any:
            return jax.tree.map(lambda g: (g * scale).astype(g.dtype), grads)

        x0, embed_vjp = jax.vjp(lambda r: embed(r, batch), rest)
        x_last, inputs = jax.lax.scan(lambda x, p: (layer(p, x), x), x0, stack)
        loss, head_vjp = jax.vjp(lambda r, x: head(r, x, batch), rest, x_last)
        g_rest, g_x = head_vjp(jnp.ones_like(loss))

        def backward(i: Any, carry: tuple) -> tuple:
            stack, layer_state, g_x, sq = carry
            idx = n_layers - 1 - i
            take = lambda t: jax.tree.map(  # noqa: E731
                lambda a: jax.lax.dynamic_index_in_dim(a, idx, keepdims=False), t)
            p_l, s_l = take(stack), take(layer_state)
            x_l = jax.lax.dynamic_index_in_dim(inputs, idx, keepdims=False)
            _, layer_vjp = jax.vjp(layer, p_l, x_l)
            g_p, g_x = layer_vjp(g_x)
            sq = sq + _squared_norm(g_p).astype(acc)
            u_l, s_l = optimizer.update(scaled(g_p), s_l, p_l)
            p_l = apply_updates(p_l, u_l)
            put = lambda t, new: jax.tree.map(  # noqa: E731
                lambda a, b: jax.lax.dynamic_update_index_in_dim(a, b.astype(a.dtype), idx, 0),
                t, new)
            return put(stack, p_l), put(layer_state, s_l), g_x, sq

        stack, layer_state, g_x0, sq = jax.lax.fori_loop(
            0, n_layers, backward, (stack, state.layers, g_x, jnp.zeros([], acc)))
        (g_embed,) = embed_vjp(g_x0)
        g_rest = jax.tree.map(lambda a, b: a + b, g_rest, g_embed)
        sq = sq + _squared_norm(g_rest).astype(acc)
        u_rest, rest_state = rest_opt.update(scaled(g_rest), state.rest, rest)
        rest = apply_updates(rest, u_rest)
        merged = {**rest, layers_key: stack}
        merged = {k: merged[k] for k in params}  # the caller's key order and mapping type
        new_params = merged if type(params) is dict else type(params)(merged)
        return new_params, GradientReleaseState(layer_state, rest_state, jnp.sqrt(sq)), loss

    return GradientRelease(init, step)
