"""functrain.microbatching against optax.microbatching and against the full-batch computation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from functrain import microbatching as fm

OM = optax.microbatching
RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.standard_normal((8, 3)), jnp.float32)
Y = jnp.asarray(RNG.standard_normal(8), jnp.float32)
W = jnp.asarray(RNG.standard_normal(3), jnp.float32)


def same(ours, theirs, rtol=1e-5):
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(theirs)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        assert jnp.asarray(a).dtype == jnp.asarray(b).dtype
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-6)


def per_row(x, y, scale=1.0):
    r = (x @ W - y) * scale
    return {"loss": jnp.sum(r ** 2), "resid": r, "count": jnp.asarray(x.shape[0])}


def test_reshape_batch_axis_matches_optax():
    t = {"a": jnp.arange(24).reshape(2, 12), "b": jnp.arange(12.0)}
    same(fm.reshape_batch_axis(t["a"], 3, axis=1), OM.reshape_batch_axis(t["a"], 3, axis=1))
    same(fm.reshape_batch_axis(t["b"], 4), OM.reshape_batch_axis(t["b"], 4))


@pytest.mark.parametrize("size", [2, 4])
def test_microbatch_matches_optax_and_the_full_batch(size):
    acc = {"loss": fm.AccumulationType.SUM, "resid": fm.AccumulationType.CONCAT,
           "count": fm.AccumulationType.SUM}
    acc_ox = {"loss": OM.AccumulationType.SUM, "resid": OM.AccumulationType.CONCAT,
              "count": OM.AccumulationType.SUM}
    ours = jax.jit(fm.microbatch(per_row, (0, 1), size, acc))(X, Y, scale=2.0)
    theirs = OM.microbatch(per_row, (0, 1), size, acc_ox)(X, Y, scale=2.0)
    same(ours, theirs)
    full = per_row(X, Y, 2.0)
    same(ours, full)  # summed loss and count, residuals back in batch order
    for kind in ("MEAN", "RUNNING_MEAN"):
        ours = fm.microbatch(lambda x, y: jnp.sum((x @ W - y) ** 2), (0, 1), size,
                             getattr(fm.AccumulationType, kind))(X, Y)
        theirs = OM.microbatch(lambda x, y: jnp.sum((x @ W - y) ** 2), (0, 1), size,
                               getattr(OM.AccumulationType, kind))(X, Y)
        same(ours, theirs)
        np.testing.assert_allclose(ours, jnp.sum((X @ W - Y) ** 2) * size / 8, rtol=1e-5)


def test_microbatch_other_axis_early_stop_and_none():
    f = lambda x: jnp.sum(x, axis=1)  # noqa: E731
    xt = X.T  # batch on axis 1
    for n_real in (None, 2, jnp.asarray(3)):
        for kind in ("SUM", "RUNNING_MEAN"):
            ours = fm.microbatch(f, 0, 2, getattr(fm.AccumulationType, kind), in_axes=1,
                                 num_real_microbatches=n_real)(xt)
            theirs = OM.microbatch(f, 0, 2, getattr(OM.AccumulationType, kind), in_axes=1,
                                   num_real_microbatches=n_real)(xt)
            same(ours, theirs)
    assert fm.microbatch(f, 0, None) is f


def test_custom_accumulator():
    biggest = fm.Accumulator(init=lambda s: jnp.full(s.shape, -jnp.inf, s.dtype),
                             update=lambda c, v, i: jnp.maximum(c, v), finalize=lambda c: c,
                             aggregate=lambda v: jnp.max(v, axis=0))
    out = fm.microbatch(lambda y: jnp.max(y), 0, 2, biggest)(Y)
    np.testing.assert_allclose(out, jnp.max(Y))


def test_microbatch_errors_match_optax():
    f = lambda x, y: jnp.sum(x) + jnp.sum(y)  # noqa: E731
    for lib in (fm, OM):
        with pytest.raises(ValueError, match="equal-size batch axes"):
            lib.microbatch(f, (0, 1), 2)(X, Y[:6])
        with pytest.raises(ValueError, match="must be divisible by microbatch_size=3"):
            lib.microbatch(f, (0, 1), 3)(X, Y)
        with pytest.raises(ValueError, match="require floating-point"):
            lib.microbatch(lambda i: i, 0, 2, lib.AccumulationType.MEAN)(jnp.arange(4))
        with pytest.raises(NotImplementedError):
            lib.micro_vmap(jnp.sin, out_axes=1)


@pytest.mark.parametrize("size", [None, 2])
def test_micro_vmap_matches_optax_and_vmap(size):
    f = lambda x, y, *, c: jnp.sum(x) * y + c  # noqa: E731
    c = jnp.arange(8.0)
    for kind in ("CONCAT", "SUM", "MEAN"):
        ours = fm.micro_vmap(f, (0, None), microbatch_size=size,
                             accumulator=getattr(fm.AccumulationType, kind))(X, 2.0, c=c)
        theirs = OM.micro_vmap(f, (0, None), microbatch_size=size,
                               accumulator=getattr(OM.AccumulationType, kind))(X, 2.0, c=c)
        same(ours, theirs)
    full = jax.vmap(lambda x, c: f(x, 2.0, c=c))(X, c)
    same(fm.micro_vmap(f, (0, None), microbatch_size=size)(X, 2.0, c=c), full)


@pytest.mark.parametrize("size", [None, 4])
def test_micro_grad_matches_optax_and_per_example_grads(size):
    def loss(w, batch):
        x, y = batch
        r = x @ w - y
        return jnp.mean(r ** 2), r

    def clip(g):
        return g / jnp.maximum(1.0, jnp.linalg.norm(g))

    kw = dict(has_aux=True, microbatch_size=size, transform_fn=clip,
              metrics_fn=lambda g: jnp.linalg.norm(g))
    ours_g, ours_aux = jax.jit(fm.micro_grad(loss, **kw))(W, (X, Y))
    theirs_g, theirs_aux = OM.micro_grad(loss, **kw)(W, (X, Y))
    same(ours_g, theirs_g)
    same(tuple(ours_aux), tuple(theirs_aux))
    per_ex = jax.vmap(jax.grad(lambda w, x, y: loss(w, (x[None], y[None]))[0]),
                      (None, 0, 0))(W, X, Y)
    np.testing.assert_allclose(ours_g, jax.vmap(clip)(per_ex).sum(0), rtol=1e-5)
    np.testing.assert_allclose(ours_aux.metrics, jnp.linalg.norm(per_ex, axis=1), rtol=1e-5)
    # Without the batch dimension, and averaged.
    flat_loss = lambda w, x, y: (x @ w - y) ** 2  # noqa: E731
    for kind in ("MEAN",):
        ours = fm.micro_grad(flat_loss, batch_argnums=(1, 2), keep_batch_dim=False,
                             microbatch_size=size,
                             accumulator=getattr(fm.AccumulationType, kind))(W, X, Y)
        theirs = OM.micro_grad(flat_loss, batch_argnums=(1, 2), keep_batch_dim=False,
                               microbatch_size=size,
                               accumulator=getattr(OM.AccumulationType, kind))(W, X, Y)
        same(ours[0], theirs[0])
        same(tuple(ours[1]), tuple(theirs[1]))
        np.testing.assert_allclose(ours[0], jax.grad(lambda w: jnp.mean(flat_loss(w, X, Y)))(W),
                                   rtol=1e-5)


def test_batched_keyword_argument_matches_optax():
    f = lambda x, *, y: (x @ W - y) ** 2  # noqa: E731
    for lib in (fm, OM):
        out = lib.microbatch(f, 0, 2, lib.AccumulationType.CONCAT, argnames="y")(X, y=Y)
        np.testing.assert_allclose(out, f(X, y=Y), rtol=1e-5)
