"""Every optimizer and wrapper optax has, through an Orbax checkpoint in both directions.

For each case: optax and functrain each take 2 steps from the same params; each state is
saved with Orbax and restored into the *other* library's ``jax.eval_shape(init)`` target;
each library continues for 3 steps from the state the other one wrote, and its params must
equal the writer's own 3 further steps (which tests/parity checks against optax step by
step). Before that, both states must have the same layout: the same NamedTuple class names
and fields, the same nesting of dicts, lists and tuples, the same leaf shapes and dtypes
(``layout`` below). The cases are every record of tests/registry.py whose optimizer optax
has (its default arguments), plus the wrappers and masked optimizers in ``WRAPPERS``.

Compared with: optax 0.2.8 itself (its state layout and its continuation), on a small tree
(a (4, 3) matrix and a (3,) vector), eagerly (no compilation per case; about 50 s of CPU).

Every case's optax state can be rebuilt from shapes (``jax.eval_shape(optax_init)`` is the
target of the functrain -> optax restore). The one case Orbax cannot carry is listed in
``NOT_THROUGH_ORBAX`` with the reason; its states are handed over in memory instead.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib  # noqa: F401
import orbax.checkpoint as ocp  # the [orbax] extra, which make test installs
import pytest

import functrain
import registry
from functrain.declarations import OPTIMIZERS as DECLARED

MATRICES = lambda p: jax.tree.map(lambda x: x.ndim > 1, p)  # noqa: E731

# Wrappers and masked optimizers (the registry lists optimizers): build(m) for m in
# (functrain, optax).
WRAPPERS = {
    "adamw(mask)": lambda m: m.adamw(1e-2, weight_decay=0.1, mask=MATRICES),
    "lamb(mask)": lambda m: m.lamb(1e-2, weight_decay=0.1, mask=MATRICES),
    "lars(weight_decay_mask, trust_ratio_mask)": lambda m: m.lars(
        0.1, weight_decay=1e-2, weight_decay_mask=MATRICES, trust_ratio_mask=MATRICES),
    "masked(scale_by_adam())": lambda m: m.masked(m.scale_by_adam(), {"w": True, "b": False}),
    "masked(adam)": lambda m: m.masked(m.adam(1e-2), MATRICES),
    "freeze": lambda m: m.chain(m.freeze({"w": False, "b": True}), m.sgd(0.1)),
    "selective_transform": lambda m: m.selective_transform(
        m.adam(1e-2), freeze_mask={"w": False, "b": True}),
    "multi_transform": lambda m: m.multi_transform(
        {"a": m.adam(1e-2), "s": m.sgd(0.1, momentum=0.9)}, {"w": "a", "b": "s"}),
    "inject_hyperparams(adam)": lambda m: m.inject_hyperparams(m.adam)(learning_rate=1e-2),
    "inject_hyperparams(adamw, schedule)": lambda m: m.inject_hyperparams(
        m.adamw, static_args="mask")(learning_rate=m.linear_schedule(1e-2, 1e-3, 10),
                                     weight_decay=1e-2),
    "MultiSteps(adam, 2)": lambda m: m.MultiSteps(m.adam(1e-2), 2),
    "apply_if_finite(adam)": lambda m: m.apply_if_finite(m.adam(1e-2), 3),
    "chain(clip_by_global_norm, adamw)": lambda m: m.chain(m.clip_by_global_norm(1.0),
                                                           m.adamw(1e-2)),
    "lookahead(adam)": lambda m: m.lookahead(m.adam(1e-2), 2, 0.5),
}

# Cases whose state Orbax cannot save, and why: their states are handed over in memory
# (the written leaves in the reader's abstract state's structure), layout checked as above.
NOT_THROUGH_ORBAX = {
    "galore": "its state holds zero-size arrays (no projector for a vector leaf: shape "
              "(0, 0)), in optax's layout as in functrain's, and Orbax refuses to save "
              "zero-size arrays ('Cannot save arrays with zero size')",
}


def _params():
    rng = np.random.default_rng(0)
    return {"w": jnp.asarray(rng.standard_normal((4, 3)), jnp.float32),
            "b": jnp.asarray(rng.standard_normal(3), jnp.float32)}


def _loss(params):
    return 0.5 * sum(jnp.sum((x - 0.5) ** 2) for x in jax.tree.leaves(params))


def _cases() -> dict:
    cases = {}
    for name, record in registry.REGISTRY.items():
        if DECLARED[name].optax is not None:
            cases[name] = (lambda m, r=record: r.make(m), record.update_kwargs)
    for name, build in WRAPPERS.items():
        cases[name] = (build, None)
    return cases


CASES = _cases()


def layout(tree):
    """A tree's layout by names: NamedTuple class and field names, dict keys, list and
    tuple nesting, leaf shapes and dtypes (classes compare by name across libraries)."""
    if hasattr(tree, "_fields"):
        return type(tree).__name__, tuple((f, layout(getattr(tree, f))) for f in tree._fields)
    if isinstance(tree, dict):
        return "dict", tuple((k, layout(tree[k])) for k in sorted(tree))
    if isinstance(tree, (list, tuple)):
        return type(tree).__name__, tuple(layout(x) for x in tree)
    if tree is None:
        return None
    return tuple(np.shape(tree)), str(jnp.asarray(tree).dtype)


def _data(x):
    """An array's values (a PRNG key's as its key data)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x)


def _is_key(x) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


# PRNG keys go through Orbax as their key data (Orbax with the oldest supported JAX cannot
# write typed keys) and are wrapped again after the restore, with the writer's key impl.
def _keys_as_data(tree):
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _abstract_keys_as_data(tree):
    return jax.tree.map(lambda x: jax.eval_shape(jax.random.key_data, x) if _is_key(x) else x,
                        tree)


def _keys_back(tree, like):
    leaves, treedef = jax.tree.flatten(tree)
    return treedef.unflatten([
        jax.random.wrap_key_data(x, impl=jax.random.key_impl(k)) if _is_key(k) else x
        for x, k in zip(leaves, jax.tree.leaves(like))])


def _run(opt, params, state, steps, start, extra):
    for t in range(start, start + steps):
        rng = np.random.default_rng(100 + t)
        grads = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype),
                             getattr(params, "fast", params))  # lookahead: the fast params
        kwargs = extra(_loss, params) if extra else {}
        updates, state = opt.update(grads, state, params, **kwargs)
        params = optax.apply_updates(params, updates)
    return params, state


@pytest.mark.parametrize("name", sorted(CASES))
def test_checkpoint_interchanges_with_optax(name, tmp_path):
    build, extra = CASES[name]
    with warnings.catch_warnings():  # optax's deprecated optimizers (optimistic_adam) warn
        warnings.simplefilter("ignore", DeprecationWarning)
        opts = {"optax": build(optax), "functrain": build(functrain)}
    params = _params()
    if name.startswith("lookahead"):
        params = optax.LookaheadParams.init_synced(params)
    states = {lib: opt.init(params) for lib, opt in opts.items()}
    assert layout(states["functrain"]) == layout(states["optax"]), "init's layout"
    written = {lib: _run(opt, params, states[lib], 2, 0, extra) for lib, opt in opts.items()}
    assert layout(written["functrain"][1]) == layout(written["optax"][1]), "layout after steps"

    other = {"optax": "functrain", "functrain": "optax"}
    # What optax wrote is restored into functrain's abstract state, and the other way round.
    targets = {writer: jax.eval_shape(opts[reader].init, params)
               for writer, reader in other.items()}
    saved = {lib: state for lib, (_, state) in written.items()}
    if name in NOT_THROUGH_ORBAX:
        restored = {lib: jax.tree.structure(targets[lib]).unflatten(jax.tree.leaves(state))
                    for lib, state in saved.items()}
    else:
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(tmp_path / "ckpt", _keys_as_data(saved))
        checkpointer.wait_until_finished()
        restored = checkpointer.restore(tmp_path / "ckpt", _abstract_keys_as_data(targets))
        restored = {writer: _keys_back(tree, saved[writer]) for writer, tree in restored.items()}
    for writer, reader in other.items():
        p_written, s_written = written[writer]
        for a, b in zip(jax.tree.leaves(restored[writer]), jax.tree.leaves(s_written)):
            np.testing.assert_array_equal(_data(a), _data(b))
        p_reader, _ = _run(opts[reader], p_written, restored[writer], 3, 2, extra)
        p_writer, _ = _run(opts[writer], p_written, s_written, 3, 2, extra)
        for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(p_reader)[0],
                                jax.tree.leaves(p_writer)):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6, err_msg=(
                f"{reader} continuing {writer}'s checkpoint, {jax.tree_util.keystr(path)}"))
