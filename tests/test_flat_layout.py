"""functrain.flat_layout / on_flat_layout: the buffers, their gradient, optax's numbers on the
tree for per-element optimizers, the refusals, and the few-kernel program."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain
from functrain.jax_compat import enable_x64


def tree(dtype=jnp.float32, layers=3):
    rng = np.random.default_rng(0)
    return {f"l{i}": {"b": jnp.asarray(rng.standard_normal(3) * (i + 1), dtype),
                      "w": jnp.asarray(rng.standard_normal((3, 2)) * (i + 1), dtype)}
            for i in range(layers)}


def test_flatten_unflatten_round_trip_and_order():
    params = {"z": jnp.arange(4.0).reshape(2, 2), "a": jnp.arange(3, dtype=jnp.bfloat16),
              "c": jnp.ones(2, jnp.complex64), "m": jnp.full(2, 7.0)}
    layout = functrain.flat_layout(params)
    flat = layout.flatten(params)
    assert sorted(flat) == ["bfloat16", "complex64", "float32"]
    # leaves keep the tree's order ('m' before 'z') inside a buffer
    np.testing.assert_array_equal(flat["float32"], [7, 7, 0, 1, 2, 3])
    back = layout.unflatten(flat)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_groups_split_buffers():
    layout = functrain.flat_layout(tree(), lambda path, x: "decay" if x.ndim > 1 else "none")
    assert {k: v.shape for k, v in layout.buffers.items()} == {
        "decay/float32": (18,), "none/float32": (9,)}


def test_bad_input_names_the_leaf_or_buffer():
    params = tree()
    layout = functrain.flat_layout(params)
    bad = jax.tree.map(lambda x: x, params)
    bad["l1"]["w"] = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match=r"leaf \['l1'\]\['w'\] is float32\[2, 3\]"):
        layout.flatten(bad)
    with pytest.raises(ValueError, match=r"structure differs.*\['l9'\]"):
        layout.flatten({**params, "l9": jnp.zeros(1)})
    with pytest.raises(ValueError, match=r"buffer 'float32' is float32\[5\]"):
        layout.unflatten({"float32": jnp.zeros(5)})
    with pytest.raises(ValueError, match=r"expected the layout's flat buffers \['float32'\]"):
        layout.unflatten(params)
    with pytest.raises(TypeError, match=r"group gave 3 for leaf \['l0'\]\['b'\]"):
        functrain.flat_layout(params, lambda path, x: 3)
    with pytest.raises(TypeError, match=r"leaf \['x'\] is a str"):
        functrain.flat_layout({"x": "no"})
    with pytest.raises(TypeError, match="not a FlatLayout"):
        functrain.on_flat_layout(functrain.sgd(0.1), params)
    opt = functrain.on_flat_layout(functrain.sgd(0.1), layout)
    with pytest.raises(ValueError, match="on_flat_layout.init: params"):
        opt.init(params)


def test_gradient_through_unflatten_is_the_trees_gathered():
    params = {**tree(), "unused": jnp.ones(4), "h": jnp.ones(2, jnp.bfloat16),
              "steps": jnp.arange(2)}
    layout = functrain.flat_layout(params)

    def loss(p):
        return (sum(jnp.sum(jnp.sin(x) * x) for k, v in p.items() if k.startswith("l")
                    for x in v.values()) + jnp.sum(p["h"].astype(jnp.float32) ** 2))

    expected = jax.grad(loss, allow_int=True)(params)
    for grad in (jax.grad, lambda f, **kw: jax.jit(jax.grad(f, **kw))):
        got = grad(lambda f: loss(layout.unflatten(f)), allow_int=True)(layout.flatten(params))
        assert got["int32"].dtype == jax.dtypes.float0
        floats = {k: v for k, v in got.items() if k != "int32"}
        want = layout.flatten(jax.tree.map(
            lambda g, p: jnp.zeros(p.shape, p.dtype) if g.dtype == jax.dtypes.float0 else g,
            expected, params))
        for key in floats:  # jit may contract sin(x) * x's derivative into an FMA: 1 ulp
            np.testing.assert_allclose(np.asarray(floats[key], np.float32),
                                       np.asarray(want[key], np.float32), rtol=1e-6, atol=0)
        assert not np.any(np.asarray(got["float32"])[-4:])  # 'unused' gets zeros


PER_ELEMENT = {
    "adamw": lambda lib: lib.adamw(0.01, weight_decay=0.1),
    "clip+adam": lambda lib: lib.chain(lib.clip_by_global_norm(0.5), lib.adam(0.01)),
    "lion": lambda lib: lib.lion(0.01),
    "sgd momentum": lambda lib: lib.sgd(0.1, momentum=0.9, nesterov=True),
}


@pytest.mark.parametrize("name", sorted(PER_ELEMENT))
def test_per_element_optimizers_give_optaxs_numbers_on_the_tree(name):
    with enable_x64():
        params = tree(jnp.float64)
        layout = functrain.flat_layout(params)
        flat_opt = functrain.on_flat_layout(PER_ELEMENT[name](functrain), layout)
        ref = PER_ELEMENT[name](optax)
        p_flat, p_tree = layout.flatten(params), params
        s_flat, s_tree = flat_opt.init(p_flat), ref.init(p_tree)
        step_flat = jax.jit(lambda p, s, g: flat_opt.update(g, s, p))
        for t in range(4):
            g = jax.tree.map(lambda x: jnp.cos(x * (t + 1)) * 3, p_tree)
            u, s_flat = step_flat(p_flat, s_flat, layout.flatten(g))
            p_flat = functrain.apply_updates(p_flat, u)
            u_ref, s_tree = ref.update(g, s_tree, p_tree)
            p_tree = optax.apply_updates(p_tree, u_ref)
        got = layout.unflatten(p_flat)
        for a, b, p0 in zip(jax.tree.leaves(got), jax.tree.leaves(p_tree),
                            jax.tree.leaves(params)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
            assert np.any(np.asarray(b) != np.asarray(p0))


@pytest.mark.parametrize("name,build", [
    ("lamb", lambda: functrain.lamb(0.01)),
    ("adafactor", lambda: functrain.adafactor(0.01)),
    ("muon", lambda: functrain.contrib.muon(0.01)),
    ("clip_by_block_rms", lambda: functrain.clip_by_block_rms(0.1)),
    ("mask for the tree", lambda: functrain.adamw(
        0.01, mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p))),
    ("noise", lambda: functrain.add_noise(0.1, 0.5, 0)),
])
def test_refuses_steps_that_are_not_per_element(name, build):
    layout = functrain.flat_layout(tree())
    with pytest.raises(ValueError, match=r"differ from its updates on the tree at step 1, "
                                         r"for leaves \['l"):
        functrain.on_flat_layout(build(), layout)


def test_masks_through_per_buffer_on_a_grouped_layout():
    params = tree()
    decay = lambda p: jax.tree.map(lambda x: x.ndim > 1, p)  # noqa: E731
    with pytest.raises(ValueError, match=r"buffer 'float32' holds leaves of different "
                                         r"values.*group="):
        functrain.flat_layout(params).per_buffer(decay)
    layout = functrain.flat_layout(params, lambda path, x: "w" if x.ndim > 1 else "b")
    mask = layout.per_buffer(decay)
    assert mask(layout.flatten(params)) == {"w/float32": True, "b/float32": False}
    opt = functrain.on_flat_layout(functrain.adamw(0.1, weight_decay=0.5, mask=mask), layout)
    ref = optax.adamw(0.1, weight_decay=0.5, mask=decay)
    g = jax.tree.map(jnp.zeros_like, params)  # only the decay moves the params
    u, _ = opt.update(layout.flatten(g), opt.init(layout.flatten(params)),
                      layout.flatten(params))
    u_ref, _ = ref.update(g, ref.init(params), params)
    for a, b in zip(jax.tree.leaves(layout.unflatten(u)), jax.tree.leaves(u_ref)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=0)
    assert np.any(np.asarray(u["w/float32"]) != 0) and not np.any(np.asarray(u["b/float32"]))


def test_the_flat_step_is_a_few_kernels_whatever_the_leaves():
    opt = functrain.adamw(1e-3)

    def fusions(o, p):
        def step(p, s, g):
            u, s = o.update(g, s, p)
            return functrain.apply_updates(p, u), s
        text = jax.jit(step).lower(p, o.init(p), p).compile().as_text()
        entry = text[text.index("\nENTRY "):]
        return len(re.findall(r" = \S+ fusion\(", entry[:entry.index("\n}")]))

    counts = []
    for layers in (5, 100):
        params = tree(layers=layers)
        layout = functrain.flat_layout(params)
        counts.append(fusions(functrain.on_flat_layout(opt, layout), layout.flatten(params)))
    assert fusions(opt, tree(layers=100)) >= 200  # one per leaf: the count the layout removes
    assert counts[0] == counts[1] <= 8, counts  # the step count's scalars, and one pass


def test_the_check_refuses_layouts_too_large_to_probe(monkeypatch):
    import importlib
    module = importlib.import_module("functrain.flat_layout")
    monkeypatch.setattr(module, "PROBE_ELEMENTS", 20)
    layout = functrain.flat_layout(tree())
    with pytest.raises(ValueError, match=r"27 elements here, more than the 20.*check=False"):
        functrain.on_flat_layout(functrain.adam(0.1), layout)
    functrain.on_flat_layout(functrain.adam(0.1), layout, check=False)  # as asked


def test_a_state_made_on_the_tree_moves_to_the_buffers_and_back():
    # optax's adamw with bfloat16 moments: two steps on the tree, the state moved to the
    # buffers, two more steps there = four steps on the tree; and back again, bit for bit
    params = tree(layers=4)
    layout = functrain.flat_layout(params)
    ref = optax.adamw(0.01, mu_dtype=jnp.bfloat16)
    flat_opt = functrain.on_flat_layout(ref, layout, check=False)
    grads = [jax.tree.map(lambda x, t=t: jnp.cos(x * (t + 1)), params) for t in range(4)]
    step = jax.jit(lambda o, p, s, g: o.update(g, s, p), static_argnums=0)
    p_tree, s_tree = params, ref.init(params)
    for t, g in enumerate(grads):
        if t == 2:
            p_flat, s_flat = layout.flatten(p_tree), layout.state_to_flat(s_tree)
            assert jax.tree.structure(s_flat) == jax.tree.structure(flat_opt.init(p_flat))
            back = layout.state_from_flat(s_flat)
            for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(s_tree)):
                assert a.dtype == b.dtype
                np.testing.assert_array_equal(np.asarray(a, np.float32),
                                              np.asarray(b, np.float32))
        if t >= 2:
            u, s_flat = step(flat_opt, p_flat, s_flat, layout.flatten(g))
            p_flat = optax.apply_updates(p_flat, u)
        u, s_tree = step(ref, p_tree, s_tree, g)
        p_tree = optax.apply_updates(p_tree, u)
    for a, b in zip(jax.tree.leaves(layout.unflatten(p_flat)), jax.tree.leaves(p_tree)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    for a, b in zip(jax.tree.leaves(layout.state_from_flat(s_flat)), jax.tree.leaves(s_tree)):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=1e-2, atol=1e-6)  # bfloat16 moments: one rounding
