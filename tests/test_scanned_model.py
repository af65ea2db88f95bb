"""A scanned Flax model, end to end: muon, soap, shampoo and kron with dimension numbers.

The model (tests/scanned_transformer.py): a 3-layer pre-LN transformer (width 16, 2 heads, a
32-wide MLP) run with ``flax.linen.scan`` over its layers, so each per-layer weight is one
stacked ``(3, ...)`` leaf, the attention kernels 4-D ``(3, 16, 2, 8)`` / ``(3, 2, 8, 16)``.
Each optimizer gets dimension numbers (``scanned_transformer.dimension_numbers``) that make
the layer axis a batch axis and the attention kernels' head axes part of one matrix.

Compared with: the unrolled twin (``layers_0`` ... ``layers_2``, each weight a separate
leaf, sliced from the stacked params), trained with the same optimizer given the per-layer
dimension numbers, in float64, for 4 steps (SOAP refreshes its eigenbases on step 2 and 4,
Shampoo computes inverse roots from step 2, Kron updates its preconditioner every step
(the default probability is 1 for the first steps)). After the steps the scanned params
equal the unrolled ones stacked back, and the scanned state is the unrolled state stacked
back: one entry per stacked leaf, stacked over the layer axis, with the same numbers.

Kron's noise is one flat normal draw per step, cut in leaf order, a stacked leaf's in layer
order; so Kron's unrolled run hands it the per-layer leaves in the scanned tree's order
(``scanned_transformer.by_weight``: per weight, the list of its layers). The others' numbers
do not depend on the order of the leaves: their unrolled runs use the model's own tree.

Tolerance: 1e-8 of each leaf's largest entry. The two programs compute the same gradients in
different orders (a scan's backward pass against an unrolled one: ~1e-16 apart), which the
eigendecompositions, inverse roots and Newton-Schulz iterations pass on amplified by their
conditioning: after 4 steps up to ~1e-11 of the largest entry with JAX 0.10, ~3e-9 with JAX
0.5.3 (SOAP's attention-output kernel); a wrong layer or axis is off by O(1).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
import scanned_transformer as sm
from functrain.jax_compat import enable_x64

# Fresh processes or a whole model: a long check (make test-long, not make test).
pytestmark = pytest.mark.long

LAYERS, STEPS = 3, 4
OPTIMIZERS = {
    "muon": lambda dims: functrain.contrib.muon(0.02, adam_learning_rate=0.01,
                                                muon_weight_dimension_numbers=dims),
    # block_size=16: the MLP's (16, 32) and (32, 16) matrices as 16 x 16 blocks, whose first
    # statistics have full rank (a rank-deficient one leaves the eigenbasis of its null
    # space to rounding: soap.py's docstring).
    "soap": lambda dims: functrain.contrib.soap(0.01, precondition_frequency=2, block_size=16,
                                                weight_dimension_numbers=dims),
    "shampoo": lambda dims: functrain.contrib.shampoo(
        0.01, start_preconditioning_step=2, precondition_frequency=2,
        weight_dimension_numbers=dims),
    "kron": lambda dims: functrain.contrib.kron(0.01, weight_dimension_numbers=dims),
}


@functools.lru_cache(maxsize=None)
def _problem():
    """(scanned loss, unrolled loss, scanned params, unrolled params), float64; built once,
    so the jitted gradients below compile once per model for all optimizers."""
    scanned, unrolled = sm.models(LAYERS)
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(4, 8, 16)))
    y = jnp.asarray(rng.normal(size=(4, 8, 16)))
    params = sm.init_params(scanned, x)
    return (functools.partial(sm.mse, scanned, x=x, y=y),
            functools.partial(sm.mse, unrolled, x=x, y=y), params, sm.unstack(params, LAYERS))


@functools.lru_cache(maxsize=None)
def _grad(loss):
    return jax.jit(jax.grad(loss))


def _train(loss, opt, params, to_opt=lambda t: t, from_opt=lambda t: t):
    grad = _grad(loss)

    @jax.jit
    def update(grads, state, params):
        updates, state = opt.update(to_opt(grads), state, to_opt(params))
        return functrain.apply_updates(params, from_opt(updates)), state

    state = opt.init(to_opt(params))
    for _ in range(STEPS):
        params, state = update(grad(params), state, params)
    return params, state


def _restack(state):
    """An unrolled run's state in the scanned layout: every params-shaped dict (keys
    ``layers_i`` or, for Kron's run, ``layers`` holding lists) with its layers stacked."""
    if isinstance(state, dict) and "layers_0" in state:
        return sm.stack_lists(sm.by_weight(state, LAYERS))
    if isinstance(state, dict):
        return {k: sm.stack_lists(v) if k == "layers" else _restack(v) for k, v in state.items()}
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return type(state)(*(_restack(s) for s in state))
    if isinstance(state, (tuple, list)):
        return type(state)(_restack(s) for s in state)
    return state


def _assert_close(got, want, what):
    paths = jax.tree_util.tree_flatten_with_path(got)[0]
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want), what
    for (path, a), b in zip(paths, jax.tree_util.tree_leaves(want)):
        where = f"{what} {jax.tree_util.keystr(path)}"
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape and b.shape == (LAYERS,) + a.shape and a.size <= 1:
            # a placeholder (a size-1 statistic of an axis with none, kept per leaf
            # unstacked), restacked from the unrolled layers: each layer's must be it
            a = np.broadcast_to(a, b.shape)
        assert a.shape == b.shape, (where, a.shape, b.shape)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-8 * np.max(np.abs(b), initial=1e-3),
                                   err_msg=where)


def test_the_two_models_are_twins():
    with enable_x64(True):
        loss_scanned, loss_unrolled, params, layer_params = _problem()
        assert set(layer_params) == {"embed", "final_ln"} | {f"layers_{i}" for i in
                                                              range(LAYERS)}
        assert params["layers"]["attn"]["query"]["kernel"].shape == (LAYERS, 16, 2, 8)
        assert params["layers"]["attn"]["out"]["kernel"].shape == (LAYERS, 2, 8, 16)
        np.testing.assert_allclose(loss_scanned(params), loss_unrolled(layer_params),
                                   rtol=1e-13)
        grads = _grad(loss_scanned)(params)
        layer_grads = _grad(loss_unrolled)(layer_params)
        # restacked inside the context: JAX before 0.6 makes float64 float32 outside it
        _assert_close(grads, sm.stack_lists(sm.by_weight(layer_grads, LAYERS)), "grads")


def test_dimension_numbers_of_the_stacked_leaves():
    with enable_x64(True):
        params = _problem()[2]
    dims = sm.dimension_numbers(params)["layers"]
    assert tuple(dims["attn"]["query"]["kernel"]) == (1, (2, 3))   # (L, d, heads, head_dim)
    assert tuple(dims["attn"]["out"]["kernel"]) == ((1, 2), 3)     # (L, heads, head_dim, d)
    assert tuple(dims["mlp_in"]["kernel"]) == (1, 2)
    assert tuple(dims["ln_mlp"]["scale"]) == ((), (1,))             # one vector per layer
    assert sm.dimension_numbers(params, muon=True)["layers"]["ln_mlp"]["scale"] is None
    layer_dims = sm.dimension_numbers(sm.unstack(params, LAYERS))["layers_1"]
    assert tuple(layer_dims["attn"]["query"]["kernel"]) == (0, (1, 2))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_scanned_model_trains_as_its_unrolled_twin_float64(name):
    make = OPTIMIZERS[name]
    muon = name == "muon"
    with enable_x64(True):
        loss_scanned, loss_unrolled, params, layer_params = _problem()
        ours, state = _train(loss_scanned, make(sm.dimension_numbers(params, muon=muon)),
                             params)
        if name == "kron":  # the per-layer leaves in the scanned tree's order
            to_opt = lambda t: sm.by_weight(t, LAYERS)  # noqa: E731
            from_opt = lambda t: sm.from_by_weight(t, LAYERS)  # noqa: E731
        else:
            to_opt = from_opt = lambda t: t  # noqa: E731
        dims = sm.dimension_numbers(to_opt(layer_params), muon=muon)
        theirs, layer_state = _train(loss_unrolled, make(dims), layer_params, to_opt,
                                     from_opt)
        assert float(loss_scanned(ours)) < float(loss_scanned(params))
        _assert_close(ours, sm.stack_lists(sm.by_weight(theirs, LAYERS)), f"{name} params")
        # The state: one entry per stacked leaf, stacked over the layer axis, the same
        # numbers.
        _assert_close(state, _restack(layer_state), f"{name} state")
    moved = [not np.allclose(a, b) for a, b in zip(jax.tree_util.tree_leaves(params),
                                                   jax.tree_util.tree_leaves(ours))]
    assert all(moved), moved
    stacked = [x for x in jax.tree_util.tree_leaves(state)
               if np.ndim(x) >= 3 and np.shape(x)[0] == LAYERS]
    assert stacked, "no state stacked over the layers"
