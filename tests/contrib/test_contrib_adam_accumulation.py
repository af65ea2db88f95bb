"""functrain.contrib.adam_accumulation / scale_by_adam_accumulation (AdamA; no optax counterpart).

Compared with:

* the rule of Zhang et al. (2023, arXiv:2305.19982) written out in numpy float64 (the
  moments decayed at a step's first micro-batch, each micro-batch gradient added with
  weight ``1/N``, Adam's bias-corrected step after the ``N``-th), over 5 optimizer steps of
  ``N = 4`` micro-batches, with a learning-rate schedule, masked weight decay (also a
  schedule) and a complex leaf; params compared after every call;
* ``optax.adamw`` with ``N = 1`` (the same operations in the same order: equal bits);
* ``optax.MultiSteps(optax.adamw)``: the same first moment after every optimizer step, and
  a second moment larger by exactly ``(1 - b2)`` times the variance of the micro-batch
  gradients after the first (hand-derived: ``mean(g_i**2) - mean(g_i)**2``);
* the state's structure: two parameter-sized trees where ``MultiSteps(adamw)`` holds three,
  and the compiled step's arguments smaller by the gradient buffer's bytes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain
from functrain.contrib import (ScaleByAdamAccumulationState, adam_accumulation,
                               scale_by_adam_accumulation)
from functrain.jax_compat import enable_x64

N, STEPS = 4, 5
MASK = {"w": True, "b": False, "z": True}


def lr_schedule(count):
    return 1e-2 / (1.0 + 0.5 * count)


def wd_schedule(count):
    return 0.1 * (1.0 + count)


def ref_adama(params, grads, n, lr, b1, b2, eps, wd, mask):
    """The paper's rule in numpy (float64/complex128): params after every call.

    ``grads[t][i]`` is micro-batch ``i`` of optimizer step ``t``; ``lr`` and ``wd`` are
    numbers or functions of the optimizer step (from 0).
    """
    value = lambda x, t: x(t) if callable(x) else x  # noqa: E731
    p = {k: np.array(v) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros(np.shape(x)) for k, x in p.items()}
    out = []
    for t, micro in enumerate(grads):
        for i, g in enumerate(micro):
            for k in p:
                if i == 0:
                    m[k], v[k] = b1 * m[k], b2 * v[k]
                m[k] = m[k] + (1 - b1) * g[k] / n
                v[k] = v[k] + (1 - b2) * np.abs(g[k]) ** 2 / n
                if i == n - 1:
                    m_hat, v_hat = m[k] / (1 - b1 ** (t + 1)), v[k] / (1 - b2 ** (t + 1))
                    decay = value(wd, t) * p[k] if mask[k] else 0.0
                    p[k] = p[k] - value(lr, t) * (m_hat / (np.sqrt(v_hat) + eps) + decay)
            out.append({k: x.copy() for k, x in p.items()})
    return out


def _problem(dtype, n=N, steps=STEPS, seed=0):
    rng = np.random.default_rng(seed)
    complex_dtype = np.result_type(dtype, np.complex64)
    params = {"w": rng.standard_normal((5, 3)).astype(dtype),
              "b": rng.standard_normal(3).astype(dtype),
              "z": (rng.standard_normal(4) + 1j * rng.standard_normal(4)).astype(complex_dtype)}

    def draw(x):
        scale = 10.0 ** rng.uniform(-2, 1)
        if np.iscomplexobj(x):
            return (scale * (rng.standard_normal(x.shape) + 1j * rng.standard_normal(x.shape))
                    ).astype(x.dtype)
        return (scale * rng.standard_normal(x.shape)).astype(x.dtype)
    grads = [[{k: draw(x) for k, x in params.items()} for _ in range(n)] for _ in range(steps)]
    return params, grads


def _per_call(opt, params, grads):
    """Params, updates and has_updated after every call, one jitted micro-step per call."""
    @jax.jit
    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return functrain.apply_updates(p, u), s, u, opt.has_updated(s)

    p, state, out = params, opt.init(params), []
    for micro in grads:
        for g in micro:
            p, state, u, applied = step(p, state, g)
            out.append((p, u, bool(applied)))
    return out, state


@pytest.mark.parametrize("dtype,rtol,lr,wd", [
    (np.float64, 1e-12, lr_schedule, 0.1),
    (np.float32, 2e-5, 3e-2, wd_schedule)])
def test_matches_the_papers_rule(dtype, rtol, lr, wd):
    b1, b2, eps = 0.8, 0.95, 1e-8
    with enable_x64(dtype == np.float64):
        params, grads = _problem(dtype)
        opt = adam_accumulation(lr, N, b1=b1, b2=b2, eps=eps, weight_decay=wd, mask=MASK)
        ours, state = _per_call(opt, params, grads)
        ref = ref_adama(params, grads, N, lr, b1, b2, eps, wd, MASK)
        for call, ((p, u, applied), want) in enumerate(zip(ours, ref)):
            emits = call % N == N - 1
            assert applied == emits, call
            for k in params:
                np.testing.assert_allclose(np.asarray(p[k]), want[k], rtol=rtol,
                                           atol=rtol * 1e-2, err_msg=f"call {call} leaf {k}")
                assert p[k].dtype == dtype if k != "z" else True
                if not emits:  # exact zeros between optimizer steps
                    assert not np.any(np.asarray(u[k])), (call, k)
        assert isinstance(state[0], ScaleByAdamAccumulationState)
        assert (int(state[0].mini_step), int(state[0].count)) == (0, STEPS)
        # The params really moved (the comparison is not vacuous).
        assert np.all(np.asarray(ours[-1][0]["w"]) != params["w"])


def test_a_scan_over_micro_batches_gives_the_same_params():
    params, grads = _problem(np.float32)
    opt = adam_accumulation(lr_schedule, N, weight_decay=0.1, mask=MASK)
    stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *[g for s in grads for g in s])

    @jax.jit
    def train(p, s, gs):
        def body(carry, g):
            p, s = carry
            u, s = opt.update(g, s, p)
            return (functrain.apply_updates(p, u), s), opt.has_updated(s)
        return jax.lax.scan(body, (p, s), gs)

    (p, _), applied = train(params, opt.init(params), stacked)
    looped, _ = _per_call(opt, params, grads)
    assert np.asarray(applied).tolist() == [c % N == N - 1 for c in range(N * STEPS)]
    for k in params:
        np.testing.assert_allclose(p[k], looped[-1][0][k], rtol=1e-6, atol=1e-7, err_msg=k)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_micro_batch_is_adamw(dtype):
    """``N = 1`` runs adamw's operations in adamw's order: optax's numbers, bit for bit."""
    with enable_x64(dtype == np.float64):
        params, grads = _problem(dtype, n=1, steps=8)
        params.pop("z")
        mask = {"w": True, "b": False}
        ours = adam_accumulation(lr_schedule, 1, b1=0.8, weight_decay=0.05, mask=mask)
        theirs = optax.adamw(lr_schedule, b1=0.8, weight_decay=0.05, mask=mask)
        step = lambda opt: jax.jit(lambda p, s, g: (  # noqa: E731
            lambda u, s2: (optax.apply_updates(p, u), s2))(*opt.update(g, s, p)))
        run_ours, run_theirs = step(ours), step(theirs)
        po, so, pt, st = params, ours.init(params), params, theirs.init(params)
        for (g,) in grads:
            g = {k: g[k] for k in params}
            (po, so), (pt, st) = run_ours(po, so, g), run_theirs(pt, st, g)
            for k in params:
                np.testing.assert_array_equal(po[k], pt[k], err_msg=k)
        assert np.any(np.asarray(po["w"]) != params["w"])


def test_first_moment_is_multisteps_adamw_and_second_larger_by_the_variance():
    b1, b2 = 0.8, 0.95
    with enable_x64(True):
        # optax's accumulator (float64 here) keeps real parts only: real leaves.
        params, grads = _problem(np.float64)
        params.pop("z")
        grads = [[{k: g[k] for k in params} for g in micro] for micro in grads]
        mask = {"w": True, "b": False}
        ours = adam_accumulation(1e-2, N, b1=b1, b2=b2, weight_decay=0.1, mask=mask)
        theirs = optax.MultiSteps(optax.adamw(1e-2, b1=b1, b2=b2, weight_decay=0.1,
                                              mask=mask), every_k_schedule=N,
                                  accumulator_dtype=jnp.float64)
        upd_ours = jax.jit(lambda g, s, p: ours.update(g, s, p))
        upd_theirs = jax.jit(lambda g, s, p: theirs.update(g, s, p))
        # Both fed the same params (the steps differ through nu): the moments see the same
        # gradients.
        so, st = ours.init(params), theirs.init(params)
        for t, micro in enumerate(grads):
            for g in micro:
                _, so = upd_ours(g, so, params)
                _, st = upd_theirs(g, st, params)
            mu_theirs = st.inner_opt_state[0].mu
            for k in params:
                np.testing.assert_allclose(so[0].mu[k], mu_theirs[k], rtol=1e-12, atol=1e-14,
                                           err_msg=f"step {t} leaf {k}")
            if t == 0:  # from zero moments: nu - nu_multisteps = (1 - b2) var_i(g_i)
                for k in params:
                    gs = np.stack([g[k] for g in micro])
                    var = np.var(gs, axis=0)  # mean(g_i**2) - mean(g_i)**2
                    np.testing.assert_allclose(
                        so[0].nu[k] - st.inner_opt_state[0].nu[k], (1 - b2) * var,
                        rtol=1e-9, atol=1e-14, err_msg=k)
                    assert np.all(var > 0)


def _parameter_sized(state, params):
    sizes = [np.size(p) for p in jax.tree_util.tree_leaves(params)]
    return sum(np.size(x) in sizes and np.ndim(x) > 0 for x in jax.tree_util.tree_leaves(state))


@pytest.mark.parametrize("kwargs", [{}, dict(weight_decay=0.1, mask=MASK),
                                    dict(learning_rate=lr_schedule, weight_decay=wd_schedule)])
def test_state_holds_two_parameter_sized_trees_where_multisteps_holds_three(kwargs):
    params, _ = _problem(np.float32)
    kwargs = {"learning_rate": 1e-2, **kwargs}
    ours = adam_accumulation(num_micro_batches=N, **kwargs).init(params)
    theirs = functrain.MultiSteps(functrain.adamw(**kwargs), N).init(params)
    assert _parameter_sized(ours, params) == 2 * len(params)
    assert _parameter_sized(theirs, params) == 3 * len(params)


def test_the_compiled_micro_step_takes_no_gradient_buffer():
    """Memory analysis of the donated, jitted micro-step (deterministic for a program): the
    arguments differ by exactly the buffer's bytes, and the peak is lower by at least it."""
    params = {"w": jnp.ones((64, 64)), "b": jnp.ones(64)}
    grads = jax.tree_util.tree_map(lambda p: 0.1 * p, params)
    buffer = sum(x.nbytes for x in jax.tree_util.tree_leaves(params))

    def analysis(opt):
        def step(p, s, g):
            u, s = opt.update(g, s, p)
            return functrain.apply_updates(p, u), s
        mem = jax.jit(step, donate_argnums=(0, 1)).lower(
            params, opt.init(params), grads).compile().memory_analysis()
        return mem.argument_size_in_bytes, (mem.argument_size_in_bytes
                                            + mem.output_size_in_bytes
                                            - mem.alias_size_in_bytes + mem.temp_size_in_bytes)

    ours = analysis(adam_accumulation(1e-2, N, weight_decay=0.1))
    theirs = analysis(functrain.MultiSteps(functrain.adamw(1e-2, weight_decay=0.1), N))
    assert theirs[0] - ours[0] == buffer, (ours, theirs, buffer)
    assert theirs[1] - ours[1] >= buffer, (ours, theirs, buffer)


def test_stage_alone_emits_adams_direction_every_nth_call():
    """``scale_by_adam_accumulation`` fed ``N`` equal micro-batch gradients is Adam on them
    (float64: in float32, ``1 - b2**t`` cancels to ~1e-5 relative, differently per program)."""
    with enable_x64(True):
        g = jnp.array([0.5, -2.0, 3.0], jnp.float64)
        ours, adam = scale_by_adam_accumulation(3), optax.scale_by_adam()
        so, sa = ours.init(g), adam.init(g)
        for t in range(4):
            for _ in range(3):
                u, so = ours.update(g * (t + 1), so)
            ua, sa = adam.update(g * (t + 1), sa)
            np.testing.assert_allclose(u, ua, rtol=1e-12)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="adam_accumulation: num_micro_batches must be >= 1"):
        adam_accumulation(1e-2, 0)
    with pytest.raises(TypeError, match="adam_accumulation: num_micro_batches must be an int"):
        adam_accumulation(1e-2, 2.0)
    with pytest.raises(TypeError, match="num_micro_batches must be an int"):
        adam_accumulation(1e-2, True)
    with pytest.raises(TypeError, match="num_micro_batches must be an int"):
        scale_by_adam_accumulation("4")
    with pytest.raises(ValueError, match="b1 must be in"):
        adam_accumulation(1e-2, 2, b1=1.0)
    with pytest.raises(ValueError, match="adam_accumulation: weight_decay must be >= 0"):
        adam_accumulation(1e-2, 2, weight_decay=-0.1)
    opt = adam_accumulation(1e-2, 2)
    with pytest.raises(ValueError, match="has_updated needs the state of an adam_accumulation"):
        opt.has_updated(functrain.adam(1e-2).init({"w": jnp.ones(2)}))
    with pytest.raises(ValueError, match="was the state made by this chain's init"):
        opt.update({"w": jnp.ones(2)}, functrain.adam(1e-2).init({"w": jnp.ones(2)}))
