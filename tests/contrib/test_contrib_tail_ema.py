"""functrain.contrib.tail_ema and tail_ema_eval_params (no optax counterpart).

Compared with: modded-nanogpt record #46's Tail-EMA readout written out in numpy float64 (after
each optimizer step ``s`` in ``[start, end)``: at ``s = start`` the average is the weights, then
``ema += (w - ema) / tau``; the readout ``(1 - blend) w + blend ema``), run beside functrain's
wrapper on the same gradients; and the wrapper's promise that training is untouched (its
updates are the inner optimizer's, bit for bit).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import TailEmaState, tail_ema, tail_ema_eval_params
from functrain.jax_compat import enable_x64


def _problem(steps=12, seed=0):
    rng = np.random.default_rng(seed)
    params = {"w": rng.standard_normal((3, 2)), "embed": rng.standard_normal(4)}
    grads = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(steps)]
    return params, grads


def ref_readouts(weights, tau, start, end, blend):
    """The record's rule over the weights after each step (weights[s - 1] after step s)."""
    ema, out = None, []
    for s, w in enumerate(weights, start=1):
        if start <= s and (end is None or s < end):
            ema = w.copy() if ema is None or s == start else ema + (w - ema) / tau
        out.append(w if ema is None else (1 - blend) * w + blend * ema)
    return out


@pytest.mark.parametrize("start,end", [(1, None), (4, 9), (20, None)])
def test_matches_the_records_readout_and_leaves_training_alone(start, end):
    with enable_x64(True):
        params, grads = _problem()
        params = jax.tree.map(jnp.asarray, params)
        inner = functrain.adam(3e-2)
        opt = tail_ema(inner, tau=3.0, start_step=start, end_step=end, blend=0.6,
                       mask={"w": True, "embed": False})
        s_opt, s_inner, p = opt.init(params), inner.init(params), params
        step = jax.jit(lambda o, g, s, q: o.update(g, s, q), static_argnums=0)
        weights, readouts = [], []
        for g in grads:
            g = jax.tree.map(jnp.asarray, g)
            u, s_opt = step(opt, g, s_opt, p)
            v, s_inner = step(inner, g, s_inner, p)
            for k in p:  # the updates are the inner optimizer's, bit for bit
                np.testing.assert_array_equal(u[k], v[k])
            p = functrain.apply_updates(p, u)
            weights.append(np.asarray(p["w"]))
            read = tail_ema_eval_params(s_opt, p)
            np.testing.assert_array_equal(read["embed"], p["embed"])  # masked out
            readouts.append(np.asarray(read["w"]))
        want = ref_readouts(weights, 3.0, start, end, 0.6)
        for s, (got, ref) in enumerate(zip(readouts, want), start=1):
            np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14, err_msg=f"step {s}")
        if start <= len(grads):
            assert not np.allclose(readouts[-1], weights[-1])  # the average did something


def test_state_dtype_and_errors():
    params = {"w": jnp.ones((2, 2), jnp.bfloat16)}
    opt = tail_ema(functrain.sgd(0.1), start_step=1)
    state = opt.init(params)
    assert isinstance(state, TailEmaState) and state.ema["w"].dtype == jnp.float32
    u, state = opt.update({"w": jnp.ones((2, 2), jnp.bfloat16)}, state, params)
    assert u["w"].dtype == jnp.bfloat16
    assert tail_ema_eval_params(state, params)["w"].dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="tail_ema: update needs the params|params"):
        opt.update({"w": jnp.ones((2, 2))}, state)
    with pytest.raises(ValueError, match="tail_ema: tau"):
        tail_ema(functrain.sgd(0.1), tau=0.5)
    with pytest.raises(ValueError, match="tail_ema: blend"):
        tail_ema(functrain.sgd(0.1), blend=1.5)
    with pytest.raises(TypeError, match="tail_ema: start_step must be an int"):
        tail_ema(functrain.sgd(0.1), start_step=2.5)
    with pytest.raises(ValueError, match="needs a TailEmaState"):
        tail_ema_eval_params(functrain.sgd(0.1).init(params), params)
    with pytest.raises(ValueError, match="state.ema"):
        tail_ema_eval_params(state, {"v": jnp.ones(2)})
