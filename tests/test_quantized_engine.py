"""quantized_state inside the engine's per-leaf pass.

For optimizers made of stages (adamw, lion, sgd, ...) the state is decoded and encoded
again leaf by leaf inside ``run_block``, each leaf's decode waiting for the previous
leaf's encode. Checked here against the other path, where the whole state is decoded
around the optimizer's ``update`` (what any transformation that is not a stage gets):
the same numbers, and a compiled step whose scratch memory is one leaf's, not the tree's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.quantization import QuantizedArray, dequantize_blockwise, quantize_blockwise


def opaque(tx):
    """``tx`` behind plain functions: the engine cannot see its stages."""
    return functrain.GradientTransformation(lambda p: tx.init(p),
                                            lambda u, s, p=None: tx.update(u, s, p))


def tree(seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    return {"a": jax.random.normal(k[0], (64, 96)), "b": jax.random.normal(k[1], (5000,)),
            "small": jax.random.normal(k[2], (7,))}


BASES = {"adamw": lambda: functrain.adamw(1e-2, weight_decay=0.1),
         "lion": lambda: functrain.lion(1e-3),
         "sgd": lambda: functrain.sgd(1e-2, momentum=0.9, nesterov=True),
         "amsgrad": lambda: functrain.amsgrad(1e-2)}


def run(opt, steps=6):
    params = tree()
    state = opt.init(params)
    step = jax.jit(lambda g, s, p: opt.update(g, s, p))
    out = []
    for t in range(steps):
        grads = jax.tree_util.tree_map(lambda x: 0.1 * x, tree(seed=t + 1))
        updates, state = step(grads, state, params)
        params = functrain.apply_updates(params, updates)
        out.append(updates)
    return out, state


@pytest.mark.parametrize("bits", [8, 4, "fp8"])
@pytest.mark.parametrize("name", sorted(BASES))
def test_per_leaf_pass_gives_the_whole_state_paths_numbers(name, bits):
    """6 jitted steps; every update and state array equal."""
    kw = dict(bits=bits, min_size=1000)
    fast_updates, fast_state = run(functrain.quantized_state(BASES[name](), **kw))
    ref_updates, ref_state = run(functrain.quantized_state(opaque(BASES[name]()), **kw))
    quantized = [x for x in jax.tree_util.tree_leaves(
        fast_state, is_leaf=lambda x: isinstance(x, QuantizedArray))
        if isinstance(x, QuantizedArray)]
    assert len(quantized) >= 2                       # leaves 'a' and 'b' of each moment
    # the same float32 math on the same decoded values: bit for bit
    for got, want in zip(jax.tree_util.tree_leaves((fast_updates, fast_state)),
                         jax.tree_util.tree_leaves((ref_updates, ref_state))):
        np.testing.assert_array_equal(got, want)


def test_a_chain_with_a_transformation_that_is_not_a_stage():
    user_clip = opaque(functrain.clip(0.05))         # runs on the whole decoded state
    make = lambda clip: functrain.chain(functrain.scale_by_adam(), clip,  # noqa: E731
                                        functrain.scale(-1e-2))
    fast = run(functrain.quantized_state(make(user_clip), min_size=1000))
    ref = run(functrain.quantized_state(opaque(make(functrain.clip(0.05))), min_size=1000))
    for got, want in zip(jax.tree_util.tree_leaves(fast), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("code", ["dynamic8_signed", "dynamic8_unsigned", "dynamic4_signed",
                                  "linear4_unsigned", "linear4_unsigned_rank1", "fp8"])
def test_the_ordering_argument_never_changes_the_values(code):
    x = jax.random.normal(jax.random.PRNGKey(3), (3, 300))
    q = quantize_blockwise(jnp.abs(x) if "unsigned" in code else x, code, 128)
    plain = np.asarray(dequantize_blockwise(q))
    for flag in (True, False):
        np.testing.assert_array_equal(dequantize_blockwise(q, after=jnp.asarray(flag)), plain)


def step_temp_bytes(opt, params):
    state = opt.init(params)

    def step(p, s, g):
        updates, s = opt.update(g, s, p)
        return functrain.apply_updates(p, updates), s

    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_compiled_scratch_is_one_leaf_at_a_time():
    # 8 leaves of 131,072 float32 values (512 KiB each, 4 MiB in all)
    params = {f"w{i}": jnp.full((256, 512), 0.1 * (i + 1)) for i in range(8)}
    leaf = 256 * 512 * 4
    fast = step_temp_bytes(functrain.adamw_8bit(1e-3), params)
    whole = step_temp_bytes(functrain.quantized_state(opaque(functrain.adamw(1e-3))), params)
    # one leaf: its two decoded moments and its two new ones at most
    assert fast <= 4 * leaf + 65536, fast / leaf
    # the whole-state path keeps decoded moments of every leaf: the bound is not trivial
    assert whole > 8 * leaf, whole / leaf
