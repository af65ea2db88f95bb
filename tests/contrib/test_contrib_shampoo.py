"""functrain.contrib.shampoo / scale_by_shampoo: optax has no Shampoo, so the numbers are
checked against a float64 numpy version of the papers' pseudo-code written here (Gupta et
al., 2018; Anil et al., 2020: blocks, grafting, momentum, decoupled weight decay), run side
by side for 20 steps; then what Shampoo is for (an ill-conditioned matrix least-squares
problem, against Adam's best learning rate), abstract init, errors, and the wrappers.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import ShampooState, scale_by_shampoo, shampoo
from functrain.jax_compat import enable_x64

STEPS = 20


# --------------------------------------------------------------------------
# The pseudo-code in numpy (float64), written from the papers
# --------------------------------------------------------------------------

def _np_splits(size, block_size, preconditioned):
    """Row (or column) ranges of the blocks: k = ceil(d / bs) blocks of ceil(d / k), the
    last one shorter (functrain pads it with zeros, which must change no number)."""
    if not preconditioned or not block_size or size <= block_size:
        return [(0, size)]
    k = math.ceil(size / block_size)
    b = math.ceil(size / k)
    return [(i * b, min((i + 1) * b, size)) for i in range(k)]


def _np_inverse_root(s, exponent, matrix_eps):
    w, v = np.linalg.eigh(s)
    w = np.maximum(w, 0.0)
    if w.max() <= 0:
        return np.eye(len(s))
    return (v * (w + matrix_eps * w.max()) ** (-1.0 / exponent)) @ v.conj().T


def numpy_shampoo(params, grads, lr, b1=0.9, b2=0.999, eps=1e-10, matrix_eps=1e-6,
                  weight_decay=0.0, block_size=128, max_precond_dim=4096,
                  precondition_frequency=1, start_preconditioning_step=5, graft_type="adam",
                  nesterov=True):
    """Params after each step; ``params`` a dict of arrays, ``grads`` a list of such dicts."""
    p = {k: np.array(v) for k, v in params.items()}
    mu = {k: np.zeros_like(v) for k, v in p.items()}
    nu = {k: np.zeros(v.shape) for k, v in p.items()}
    blocks = {}  # leaf -> {(i, j): [L, R, PL, PR]}
    out = []
    w = 1.0 if b2 == 1 else 1.0 - b2
    for t, gs in enumerate(grads, 1):
        refresh = t >= start_preconditioning_step and (
            (t - start_preconditioning_step) % precondition_frequency == 0)
        for k, g in gs.items():
            g = np.asarray(g)
            if graft_type == "adam":
                nu[k] = b2 * nu[k] + (1 - b2) * np.abs(g) ** 2
                diag = g / (np.sqrt(nu[k] / (1 - b2 ** t)) + eps)
            elif graft_type == "sgd":
                diag = g
            else:  # adagrad, and the fallback without grafting
                nu[k] = nu[k] + np.abs(g) ** 2
                diag = g / (np.sqrt(nu[k]) + eps)
            u = diag
            rows, cols = (math.prod(g.shape[:-1]), g.shape[-1]) if g.ndim >= 2 else (0, 0)
            left, right = rows <= max_precond_dim, cols <= max_precond_dim
            if g.ndim >= 2 and (left or right):
                m = g.reshape(rows, cols)
                d = np.zeros_like(m)
                exponent = 2 * (left + right)
                for i, (r0, r1) in enumerate(_np_splits(rows, block_size, left)):
                    for j, (c0, c1) in enumerate(_np_splits(cols, block_size, right)):
                        gb = m[r0:r1, c0:c1]
                        st = blocks.setdefault(k, {}).setdefault(
                            (i, j), [np.zeros((r1 - r0,) * 2), np.zeros((c1 - c0,) * 2),
                                     np.eye(r1 - r0), np.eye(c1 - c0)])
                        st[0] = b2 * st[0] + w * gb @ gb.conj().T
                        st[1] = b2 * st[1] + w * gb.conj().T @ gb
                        if refresh:
                            st[2] = _np_inverse_root(st[0], exponent, matrix_eps)
                            st[3] = _np_inverse_root(st[1], exponent, matrix_eps)
                        d[r0:r1, c0:c1] = ((st[2] if left else np.eye(r1 - r0)) @ gb
                                           @ (st[3] if right else np.eye(c1 - c0)))
                d = d.reshape(g.shape)
                if graft_type is not None:
                    d = d * np.linalg.norm(diag) / max(np.linalg.norm(d), 1e-16)
                if t >= start_preconditioning_step:
                    u = d
            mu[k] = b1 * mu[k] + (1 - b1) * u
            if nesterov:
                step = b1 * mu[k] / (1 - b1 ** (t + 1)) + (1 - b1) * u / (1 - b1 ** t)
            else:
                step = mu[k] / (1 - b1 ** t)
            p[k] = p[k] - lr * (step + weight_decay * p[k])
        out.append({k: v.copy() for k, v in p.items()})
    return out


def _tree(dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)

    def draw(*shape):
        x = rng.standard_normal(shape)
        if np.issubdtype(dtype, np.complexfloating):
            x = x + 1j * rng.standard_normal(shape)
        return x.astype(dtype)

    # (10, 7) with blocks of 4: rows 4+4+2, columns 4+3 (padded in functrain); a
    # rank-3 leaf seen as (6, 4); a vector and a scalar (diagonal fallback).
    return {"w": draw(10, 7), "c": draw(2, 3, 4), "v": draw(5), "s": draw()}


def _grads(params, steps=STEPS, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        g = {}
        for k, v in params.items():
            x = rng.standard_normal(v.shape) * 10.0 ** rng.uniform(-1, 1)
            if np.iscomplexobj(v):
                x = x + 1j * rng.standard_normal(v.shape)
            g[k] = x.astype(v.dtype)
        out.append(g)
    return out


def _run_functrain(opt, params, grads):
    params = {k: jnp.asarray(v) for k, v in params.items()}
    step = jax.jit(lambda p, s, g: (lambda u, s: (functrain.apply_updates(p, u), s))(
        *opt.update(g, s, p)))
    state = jax.jit(opt.init)(params)
    out = []
    for g in grads:
        params, state = step(params, state, {k: jnp.asarray(v) for k, v in g.items()})
        out.append({k: np.asarray(v) for k, v in params.items()})
    return out


SETTINGS = {
    "adam graft, blocks, refresh every 2": dict(
        lr=0.05, block_size=4, precondition_frequency=2, start_preconditioning_step=3),
    "adagrad graft, b2=1, one-sided, weight decay": dict(
        lr=0.05, b2=1.0, graft_type="adagrad", max_precond_dim=6, nesterov=False,
        weight_decay=0.1, block_size=None, start_preconditioning_step=1),
    "no grafting, b2=0.9, blocks": dict(
        lr=0.01, b1=0.5, b2=0.9, graft_type=None, block_size=3, matrix_eps=1e-4,
        start_preconditioning_step=2, precondition_frequency=3),
    "sgd graft, defaults otherwise": dict(lr=0.05, graft_type="sgd"),
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_matches_numpy_pseudo_code_float64(name):
    kw = dict(SETTINGS[name])
    lr = kw.pop("lr")
    with enable_x64(True):
        params = _tree()
        grads = _grads(params)
        ours = _run_functrain(shampoo(lr, **kw), params, grads)
        want = numpy_shampoo(params, grads, lr, **kw)
        for t, (a, b) in enumerate(zip(ours, want), 1):
            for k in b:
                assert a[k].dtype == np.float64
                np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-9,
                                           err_msg=f"{name}: step {t}, leaf {k}")
    assert not jax.config.jax_enable_x64


def test_complex_params_match_numpy_pseudo_code():
    # L = G G^H, R = G^H G (Hermitian), norms of |x|^2: the complex form of the same math.
    with enable_x64(True):
        params = _tree(np.complex128, seed=3)
        grads = _grads(params, steps=10)
        kw = dict(block_size=4, start_preconditioning_step=2, graft_type="adagrad")
        ours = _run_functrain(shampoo(0.05, **kw), params, grads)
        want = numpy_shampoo(params, grads, 0.05, **kw)
        for a, b in zip(ours, want):
            for k in b:
                np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-9, err_msg=k)


def test_real_and_complex_leaves_of_one_shape_are_each_their_own():
    """A real and a complex leaf with the same blocks are not stacked into one group (the
    real one came back through a complex-to-real cast, with JAX's warning): each equals
    its run alone, and nothing warns."""
    import warnings
    with enable_x64(True), warnings.catch_warnings():
        warnings.simplefilter("error")
        real, cplx = _tree(np.float64, seed=4), _tree(np.complex128, seed=5)
        params = {"r": real["w"], "c": cplx["w"]}
        grads = [{"r": a["w"], "c": b["w"]} for a, b in zip(_grads(real), _grads(cplx))]
        kw = dict(block_size=4, start_preconditioning_step=2)
        both = _run_functrain(shampoo(0.05, **kw), params, grads)
        for k in params:
            alone = _run_functrain(shampoo(0.05, **kw), {k: params[k]},
                                   [{k: g[k]} for g in grads])
            for a, b in zip(both, alone):
                assert a[k].dtype == params[k].dtype
                np.testing.assert_allclose(a[k], b[k], rtol=1e-12, atol=1e-14, err_msg=k)


def test_single_step_is_the_orthogonal_factor():
    # b2=0, no grafting, no momentum: (G G^T)^(-1/4) G (G^T G)^(-1/4) = U V^T.
    rng = np.random.default_rng(5)
    g = rng.standard_normal((6, 4))
    tx = scale_by_shampoo(b1=0.0, b2=0.0, matrix_eps=0.0, graft_type=None,
                          start_preconditioning_step=1)
    u, _ = tx.update({"w": jnp.asarray(g, jnp.float32)}, tx.init({"w": jnp.zeros((6, 4))}))
    left, _, right = np.linalg.svd(g, full_matrices=False)
    np.testing.assert_allclose(np.asarray(u["w"]), left @ right, atol=2e-4)


# --------------------------------------------------------------------------
# What Shampoo is for: an ill-conditioned matrix least-squares problem
# --------------------------------------------------------------------------

def _conditioned(rng, m, n, cond):
    u, _ = np.linalg.qr(rng.standard_normal((m, m)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    s = np.zeros((m, n))
    np.fill_diagonal(s, np.logspace(0, -np.log10(cond), min(m, n)))
    return u @ s @ v.T


def _least_squares_losses(make, lrs, steps=200):
    """min ||A W B - C||^2, W (32, 16), A and B of condition number 1e3 in random bases:
    the final loss for each learning rate (vmapped: one compile for the whole sweep)."""
    rng = np.random.default_rng(0)
    a = jnp.asarray(_conditioned(rng, 48, 32, 1e3), jnp.float32)
    b = jnp.asarray(_conditioned(rng, 16, 24, 1e3), jnp.float32)
    c = a @ jnp.asarray(rng.standard_normal((32, 16)), jnp.float32) @ b

    def loss(w):
        return jnp.sum((a @ w @ b - c) ** 2)

    def run(lr):
        opt = make(lr)

        def body(carry, _):
            w, s = carry
            u, s = opt.update(jax.grad(loss)(w), s, w)
            return (functrain.apply_updates(w, u), s), None

        w0 = jnp.zeros((32, 16))
        (w, _), _ = jax.lax.scan(body, (w0, opt.init(w0)), None, steps)
        return loss(w)

    return np.asarray(jax.jit(jax.vmap(run))(jnp.asarray(lrs, jnp.float32)))


LRS = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0]


def test_beats_adam_on_ill_conditioned_least_squares():
    # Each at its best learning rate and b2 in {0.9, 0.999}, 200 steps, from a loss of 4.27.
    # Measured: Shampoo 1.09e-4 (lr 0.1, b2 0.9), Adam 1.43e-3 (lr 0.03, b2 0.9): 13x.
    # (With the default b2=0.999 alone Shampoo reaches 6.4e-4: only ~3x below Adam.)
    adam = min(_least_squares_losses(lambda lr, b2=b2: functrain.adam(lr, b2=b2), LRS).min()
               for b2 in (0.9, 0.999))
    ours = min(_least_squares_losses(lambda lr, b2=b2: shampoo(lr, b2=b2), LRS).min()
               for b2 in (0.9, 0.999))
    print(f"least squares after 200 steps: shampoo {ours:.3g}, adam {adam:.3g}")
    assert ours * 10 < adam, (ours, adam)


# --------------------------------------------------------------------------
# Abstract init, errors
# --------------------------------------------------------------------------

def test_eval_shape_init_matches_init():
    params = {k: jnp.asarray(v, jnp.float32) for k, v in _tree().items()}
    params["h"] = jnp.ones((3, 5), jnp.bfloat16)
    for opt in (shampoo(1e-2, block_size=4), shampoo(1e-2, graft_type="sgd")):
        abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                          params)
        shapes = jax.eval_shape(opt.init, abstract)
        real = opt.init(params)
        assert (jax.tree_util.tree_structure(shapes) == jax.tree_util.tree_structure(real))
        for a, b in zip(jax.tree_util.tree_leaves(shapes), jax.tree_util.tree_leaves(real)):
            assert a.shape == b.shape and a.dtype == b.dtype
    state = shampoo(1e-2, block_size=4).init(params)[0]
    assert isinstance(state, ShampooState)
    assert state.stats_l["w"].shape == (6, 4, 4) and state.stats_r["w"].shape == (6, 4, 4)
    assert state.stats_l["h"].dtype == jnp.float32  # statistics of bf16 leaves: float32


@pytest.mark.parametrize("kwargs, message", [
    ({"graft_type": "rmsprop"}, "graft_type must be one of"),
    ({"b2": 1.0}, "graft_type='adam' needs b2 < 1"),
    ({"b2": 1.5}, "b2 must be in [0.0, 1.0]"),
    ({"b1": 1.0}, "b1 must be in [0.0, 1.0)"),
    ({"block_size": -1}, "block_size must be None or an integer >= 1"),
    ({"block_size": 0}, "block_size must be None or an integer >= 1"),
    ({"block_size": 2.5}, "block_size must be None or an integer >= 1"),
    ({"max_precond_dim": 0}, "max_precond_dim must be an integer >= 1"),
    ({"precondition_frequency": 0}, "precondition_frequency must be >= 1.0"),
    ({"start_preconditioning_step": 0}, "start_preconditioning_step must be >= 1.0"),
    ({"matrix_eps": -1e-3}, "matrix_eps must be >= 0.0"),
    ({"eps": float("nan")}, "eps must be finite"),
])
def test_bad_hyperparameters_are_named(kwargs, message):
    with pytest.raises(ValueError, match=r"(scale_by_)?shampoo: " + re.escape(message)):
        shampoo(1e-2, **kwargs)


def test_bad_learning_rate_and_weight_decay_are_named():
    with pytest.raises(TypeError, match="shampoo: learning_rate must be a real number"):
        shampoo("0.1")
    with pytest.raises(ValueError, match="shampoo: weight_decay must be >= 0.0"):
        shampoo(1e-2, weight_decay=-1.0)


def test_bad_leaves_and_states_are_named():
    opt = shampoo(1e-2, block_size=4)
    params = {"w": jnp.ones((10, 7)), "i": jnp.ones((2, 2), jnp.int32)}
    with pytest.raises(TypeError, match=r"\['i'\]"):
        opt.update(params, opt.init(params), params)
    params = {"w": jnp.ones((10, 7))}
    with pytest.raises(ValueError, match=r"\['w'\] has shape \(10, 7\) but scale_by_shampoo "
                                         r"state \.mu has shape \(7, 10\)"):
        opt.update(params, opt.init({"w": jnp.ones((7, 10))}), params)
    other = shampoo(1e-2, block_size=8).init(params)
    with pytest.raises(ValueError, match=r"state \.stats_l has shape \(2, 5, 5\) for a leaf "
                                         r"of shape \(10, 7\), expected \(6, 4, 4\): was the "
                                         r"state made with another block_size"):
        opt.update(params, other, params)


# --------------------------------------------------------------------------
# Wrappers and dtypes
# --------------------------------------------------------------------------

def _small():
    params = {k: jnp.asarray(v, jnp.float32) for k, v in _tree().items()}
    grads = [{k: jnp.asarray(v, jnp.float32) for k, v in g.items()}
             for g in _grads(_tree(), steps=4)]
    return params, grads


def test_inject_hyperparams_gives_the_same_numbers():
    params, grads = _small()
    kw = dict(b1=0.8, b2=0.99, weight_decay=0.01, block_size=4, precondition_frequency=2,
              start_preconditioning_step=2)
    plain = _run_functrain(shampoo(0.03, **kw), params, grads)
    injected_opt = functrain.inject_hyperparams(shampoo)(learning_rate=0.03, **kw)
    injected = _run_functrain(injected_opt, params, grads)
    state = injected_opt.init(params)
    assert "block_size" not in state.hyperparams  # shapes: static
    assert "precondition_frequency" in state.hyperparams
    for a, b in zip(injected, plain):
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-7, err_msg=k)


def test_bfloat16_params_keep_bfloat16_updates():
    params = {"w": jnp.ones((6, 4), jnp.bfloat16), "b": jnp.zeros(4, jnp.bfloat16)}
    opt = shampoo(1e-2, start_preconditioning_step=1)
    state = opt.init(params)
    g = {"w": jnp.asarray(np.random.default_rng(0).standard_normal((6, 4)), jnp.bfloat16),
         "b": jnp.ones(4, jnp.bfloat16)}
    u, state = jax.jit(opt.update)(g, state, params)
    assert u["w"].dtype == jnp.bfloat16 and u["b"].dtype == jnp.bfloat16
    assert state[0].mu["w"].dtype == jnp.bfloat16
    assert state[0].precond_l["w"].dtype == jnp.float32  # roots computed in float32
    g32, p32 = (jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), t) for t in (g, params))
    f32 = opt.update(g32, opt.init(p32), p32)[0]
    np.testing.assert_allclose(np.asarray(u["w"], np.float32), np.asarray(f32["w"]),
                               rtol=2e-2, atol=1e-4)


def test_multisteps_equals_the_mean_gradient():
    params, grads = _small()
    multi = _run_functrain(functrain.MultiSteps(shampoo(0.03, block_size=4,
                                                        start_preconditioning_step=2), 2),
                           params, grads)
    means = [{k: (a[k] + b[k]) / 2 for k in a} for a, b in zip(grads[::2], grads[1::2])]
    plain = _run_functrain(shampoo(0.03, block_size=4, start_preconditioning_step=2),
                           params, means)
    for a, b in zip(multi[1::2], plain):
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_refresh_step_does_not_recompile():
    params, grads = _small()
    opt = shampoo(0.03, block_size=4, precondition_frequency=3, start_preconditioning_step=1)
    step = jax.jit(opt.update)
    state = opt.init(params)
    roots = []
    for g in grads[:5]:
        _, state = step(g, state, params)
        roots.append(np.asarray(state[0].precond_l["w"]))
    assert step._cache_size() == 1
    # refreshed at steps 1 and 4 only
    np.testing.assert_array_equal(roots[0], roots[2])
    assert not np.allclose(roots[2], roots[3])


def _lowered_size(n_leaves: int) -> tuple[int, int]:
    """(operations, eigh calls) of the lowered update of ``n_leaves`` (64, 64) leaves."""
    params = {f"layer{i:03d}": jnp.zeros((64, 64)) for i in range(n_leaves)}
    opt = shampoo(1e-3)
    state = jax.eval_shape(opt.init, params)
    text = jax.jit(opt.update).lower(params, state, params).as_text()
    ops = sum(1 for line in text.splitlines() if " = " in line)
    return ops, text.count("call @eigh") + text.count("syevd")


def test_program_grows_linearly_with_the_leaves_and_keeps_one_eigh_per_group():
    # Compile time is a benchmark's business (benchmarks/grouped_compile.py times 100 (64, 64)
    # layers against adam); here the program the compiler gets is checked instead, which does
    # not depend on the machine: the same-size blocks of every leaf go through the same eigh
    # calls, and each extra leaf adds no more operations than the tenth-to-twentieth did.
    (ops10, eigh10), (ops20, eigh20), (ops100, eigh100) = map(_lowered_size, (10, 20, 100))
    assert eigh10 == eigh20 == eigh100 > 0, (eigh10, eigh20, eigh100)
    per_leaf = (ops20 - ops10) / 10
    assert ops100 - ops10 <= 90 * per_leaf, (ops10, ops20, ops100)


# --------------------------------------------------------------------------
# Same-size blocks of all leaves batched: same numbers as each leaf alone
# --------------------------------------------------------------------------

def _grouping_tree(dtype=jnp.float32):
    rng = np.random.default_rng(5)
    shapes = {"q": (8, 8), "k": (8, 8), "emb": (24, 8), "head": (8, 24), "conv": (2, 4, 8),
              "wide": (8, 40), "b": (8,), "s": ()}
    return {n: jnp.asarray(rng.normal(size=s), dtype) for n, s in shapes.items()}


@pytest.mark.parametrize("kwargs", [
    dict(block_size=8, start_preconditioning_step=2, precondition_frequency=2),
    dict(block_size=8, max_precond_dim=30, graft_type="adagrad", b2=1.0, nesterov=False),
])
def test_grouped_blocks_equal_each_leaf_alone(kwargs):
    # In float64, where the order of a batched GEMM's sums cannot hide a wrong pairing of
    # blocks and statistics (in float32 the two agree to about 3e-5 relative).
    with enable_x64(True):
        _check_grouped_equals_alone(kwargs)


def _check_grouped_equals_alone(kwargs):
    tree = _grouping_tree(jnp.float64)
    tx = scale_by_shampoo(**kwargs)
    rng = np.random.default_rng(6)
    grads = [jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), tree)
             for _ in range(5)]

    def run(names):
        sub = lambda t: {n: t[n] for n in names}
        state, outs = tx.init(sub(tree)), []
        step = jax.jit(tx.update)
        for g in grads:
            u, state = step(sub(g), state)
            outs.append(u)
        return outs, state

    together, state = run(list(tree))
    for name in tree:
        alone, alone_state = run([name])
        for t, (a, b) in enumerate(zip(together, alone)):
            np.testing.assert_allclose(a[name], b[name], rtol=1e-10, atol=1e-12,
                                       err_msg=f"{name}, step {t + 1}")
        for field in ("stats_l", "stats_r", "precond_l", "precond_r"):
            np.testing.assert_allclose(getattr(state, field)[name],
                                       getattr(alone_state, field)[name], rtol=1e-10,
                                       atol=1e-12)


def test_one_refresh_conditional_for_the_whole_tree():
    tree = _grouping_tree()
    tx = scale_by_shampoo(block_size=8)
    jaxpr = jax.make_jaxpr(tx.update)(tree, tx.init(tree))
    conds = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "cond"]
    assert len(conds) == 1
    # the blocks: q, k, 3 of emb, 3 of head, conv's one (8, 8), 5 of wide: 14 of (8, 8)
    shapes = {tuple(v.aval.shape) for v in conds[0].invars[1:]}
    assert (14, 8, 8) in shapes
