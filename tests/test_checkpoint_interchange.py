"""Checkpoints interchange with optax: an Orbax checkpoint of optax's adamw, lamb
and muon state restores into functrain's state (functrain's ``jax.eval_shape(init)`` as the
target) and training continues with optax's numbers, and the other way round.

Compared with: the library that wrote the checkpoint, continuing its own run on the same
gradients (functrain and optax give the same numbers, so the two continuations agree). The
state paths (NamedTuple field names and nesting) are the same in both libraries; this test
keeps them so.
"""

from __future__ import annotations

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

BUILDERS = {
    "adamw": (lambda m: m.adamw(1e-2, weight_decay=1e-2)),
    "lamb": (lambda m: m.lamb(1e-2, weight_decay=1e-2)),
    "muon": (lambda m: m.contrib.muon(1e-2)),
}


def _params():
    rng = np.random.default_rng(0)
    return {"w": jnp.asarray(rng.standard_normal((8, 6)), jnp.float32),
            "b": jnp.asarray(rng.standard_normal(6), jnp.float32)}


def _grads(step):
    rng = np.random.default_rng(100 + step)
    return {"w": jnp.asarray(rng.standard_normal((8, 6)), jnp.float32),
            "b": jnp.asarray(rng.standard_normal(6), jnp.float32)}


def _train(opt, params, state, steps, start, extra=None):
    for t in range(start, start + steps):
        updates, state = opt.update(_grads(t), state, params, **(extra or {}))
        params = optax.apply_updates(params, updates)
    return params, state


@pytest.mark.parametrize("name", sorted(BUILDERS))
@pytest.mark.parametrize("direction", ["optax_to_functrain", "functrain_to_optax"])
def test_checkpoint_restores_across_libraries_and_continues(name, direction, tmp_path):
    theirs, ours = BUILDERS[name](optax), BUILDERS[name](functrain)
    writer, reader = (theirs, ours) if direction == "optax_to_functrain" else (ours, theirs)
    params = _params()
    params, state = _train(writer, params, writer.init(params), 4, 0)

    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "ckpt", {"params": params, "opt_state": state})
    checkpointer.wait_until_finished()
    target = jax.eval_shape(lambda: {"params": params, "opt_state": reader.init(params)})
    restored = checkpointer.restore(tmp_path / "ckpt", target)
    assert jax.tree.structure(restored["opt_state"]) == jax.tree.structure(
        reader.init(params)), "the reader's own state classes"
    for a, b in zip(jax.tree.leaves(restored["opt_state"]), jax.tree.leaves(state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    # The reader continues from the restored state, the writer from its own in-memory one.
    p_reader, _ = _train(reader, restored["params"], restored["opt_state"], 4, 4)
    p_writer, _ = _train(writer, params, state, 4, 4)
    for k in params:
        np.testing.assert_allclose(p_reader[k], p_writer[k], rtol=2e-5, atol=1e-6, err_msg=k)


# Every optimizer optax lacks (declared ``optax=None`` where it is defined), built as
# tests/registry.py builds it; Shampoo and SOAP refresh their preconditioners every 2 steps.
BEYOND_OPTAX = sorted(n for n, d in DECLARED.items() if d.optax is None)
_REFRESH = {"shampoo": dict(precondition_frequency=2), "soap": dict(precondition_frequency=2)}


def _beyond(name):
    record = registry.REGISTRY[name]
    return record.make(functrain, **{**record.args, **_REFRESH.get(name, {})})


@pytest.mark.parametrize("name", BEYOND_OPTAX)
def test_optimizers_optax_lacks_round_trip_through_orbax(name, tmp_path):
    """Their states hold no zero-size array (Orbax refuses those) and restore exactly."""
    opt = _beyond(name)
    params = _params()
    # the keywords its update needs (muon_clip's attention logits), as the registry gives them
    extra = registry.REGISTRY[name].update_kwargs(
        lambda q: sum(jnp.sum(x * x) for x in jax.tree.leaves(q)), params)
    params, state = _train(opt, params, opt.init(params), 3, 0, extra)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "ckpt", {"params": params, "opt_state": state})
    checkpointer.wait_until_finished()
    restored = checkpointer.restore(tmp_path / "ckpt", jax.eval_shape(
        lambda: {"params": params, "opt_state": opt.init(params)}))
    for a, b in zip(jax.tree.leaves(restored),
                    jax.tree.leaves({"params": params, "opt_state": state})):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    p1, _ = _train(opt, restored["params"], restored["opt_state"], 2, 3, extra)
    p2, _ = _train(opt, params, state, 2, 3, extra)
    for k in params:
        np.testing.assert_array_equal(p1[k], p2[k])
