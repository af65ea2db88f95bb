"""``weight_dimension_numbers=`` of soap, shampoo and kron: stacked (scanned) layers.

Compared with: the same optimizer run on the layers as separate leaves, cut out of the
stacked leaf here by hand (numpy slicing, not the library's reshapes), in float64, at every
step (the updates) and at the end (the state, per layer):

* SOAP: 6 calls with ``precondition_frequency=2``: ``eigh`` on the first call, power
  step + QR on calls 2 and 4. Square layers and blocks only: a rank-deficient first
  statistic leaves ``eigh``'s null-space basis to rounding (soap.py's docstring), which
  would make the comparison depend on the order of a sum.
* Shampoo: 6 calls, inverse roots (``eigh``) from call 2, every other call.
* Kron: 6 calls, the preconditioner updated at every call (triangular solves), and with
  probability 0.5 (coin flips). Its noise is ONE flat normal draw per step from the
  state's key, cut in leaf order; a stacked leaf cuts it in layer order. So the reference
  tree holds the layers as a list at the stacked leaf's place, with the same seed: both
  runs split the same keys, flip the same coins and give each layer the same noise.

The comparison itself is to 1e-9 relative: the two programs batch the same matrices
differently (one stack of layers vs. same-shape leaves concatenated), so sums may round
differently, ~1e-16 per operation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import MuonDimensionNumbers as Dims
from functrain.jax_compat import enable_x64

STEPS = 6
OPTIMIZERS = {
    "soap": lambda **kw: functrain.contrib.soap(0.1, precondition_frequency=2, **kw),
    # Shampoo has no normalize_grads: its per-layer norm is the grafting's (on by default)
    "shampoo": lambda normalize_grads=False, **kw: functrain.contrib.shampoo(
        0.1, start_preconditioning_step=2, precondition_frequency=2, **kw),
    "kron": lambda **kw: functrain.contrib.kron(0.1, preconditioner_update_probability=1.0,
                                                **kw),
    "kron_coin": lambda **kw: functrain.contrib.kron(
        0.1, preconditioner_update_probability=0.5, seed=3, **kw),
}


# Each case: the stacked leaves (shape, dimension numbers, the layers cut by hand, the layer
# axes' sizes) and the optimizer's extra arguments.
def _layers_last2(x):
    return [x[i] for i in range(x.shape[0])]


def _layers_middle(x):  # (m, layers, n), Dims(0, 2): axis 1 holds the layers
    return [x[:, j, :] for j in range(x.shape[1])]


def _layers_conv(x):  # (l1, l2, kh, cin, cout), Dims((2, 3), 4): (kh * cin, cout) per layer
    return [x[a, b].reshape(-1, x.shape[-1]) for a in range(x.shape[0])
            for b in range(x.shape[1])]


CASES = {
    "layers": ({"w": ((3, 4, 4), Dims(-2, -1), _layers_last2, (3,))}, {}),
    "rectangular": ({"w": ((3, 4, 6), Dims(1, 2), _layers_last2, (3,))}, {}),
    "blocks": ({"w": ((2, 6, 6), Dims(-2, -1), _layers_last2, (2,))},
               {"block_size": 3, "normalize_grads": True}),
    "axes": ({"b": ((3, 5), Dims((), -1), _layers_last2, (3,)),
              "conv": ((2, 2, 2, 3, 6), Dims((2, 3), 4), _layers_conv, (2, 2)),
              "mid": ((4, 3, 4), Dims(0, 2), _layers_middle, (3,))}, {}),
}
PAIRS = [(name, case) for name in OPTIMIZERS for case in CASES
         if not (name == "soap" and case == "rectangular")  # see the module docstring
         and not (name == "kron_coin" and case != "layers")]


def _trees(stacked: dict, seed: int) -> tuple:
    """(stacked params, per-layer params, stacked grads per step, per-layer grads per step);
    every tree also holds an unstacked matrix and vector (no dimension numbers)."""
    rng = np.random.default_rng(seed)

    def draw():
        tree = {"plain": rng.normal(size=(4, 4)), "v": rng.normal(size=(5,))}
        tree.update({k: rng.normal(size=shape) for k, (shape, *_) in stacked.items()})
        return tree

    def per_layer(tree):
        out = dict(tree)
        out.update({k: cut(tree[k]) for k, (_, _, cut, _) in stacked.items()})
        return out

    params, grads = draw(), [draw() for _ in range(STEPS)]
    as_jnp = lambda t: jax.tree_util.tree_map(jnp.asarray, t)  # noqa: E731
    return (as_jnp(params), as_jnp(per_layer(params)), [as_jnp(g) for g in grads],
            [as_jnp(per_layer(g)) for g in grads])


def _run(opt, params, grads) -> tuple:
    step = jax.jit(lambda p, s, g: opt.update(g, s, p))
    state, out = opt.init(params), []
    for g in grads:
        u, state = step(params, state, g)
        out.append(u)
    return out, state[0]


def _close(got, want, where):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-9, atol=1e-11,
                               err_msg=where)


@pytest.mark.parametrize("name, case", PAIRS)
@pytest.mark.long
def test_stacked_leaf_equals_its_layers_as_leaves_float64(name, case):
    stacked, kwargs = CASES[case]
    dims = {"plain": None, "v": None, **{k: d for k, (_, d, _, _) in stacked.items()}}
    with enable_x64(True):
        params, layer_params, grads, layer_grads = _trees(stacked, seed=len(case))
        ours, state = _run(OPTIMIZERS[name](weight_dimension_numbers=dims, **kwargs),
                           params, grads)
        theirs, layer_state = _run(OPTIMIZERS[name](**kwargs), layer_params, layer_grads)
    moved = False
    for t, (u, v) in enumerate(zip(ours, theirs)):
        for key in ("plain", "v"):
            _close(u[key], v[key], f"step {t} {key}")
        for key, (_, _, cut, _) in stacked.items():
            for j, (a, b) in enumerate(zip(cut(u[key]), v[key])):
                _close(a, b, f"step {t} {key} layer {j}")
                moved |= bool(np.any(np.asarray(b) != 0))
    assert moved
    for field in state._fields:
        if field in ("count", "key"):
            assert np.array_equal(getattr(state, field), getattr(layer_state, field))
            continue
        for key, (_, _, cut, layer_axes) in stacked.items():
            mine, per = getattr(state, field)[key], getattr(layer_state, field)[key]
            for j, want in enumerate(per):
                if field in ("mu", "nu"):  # shaped like the params: cut like them
                    _close(cut(mine)[j], want, f"{field} {key} layer {j}")
                    continue
                for k, (m, w) in enumerate(zip(mine, want) if isinstance(want, tuple)
                                           else [(mine, want)]):
                    if m.shape == w.shape:  # a placeholder (no statistic on this axis)
                        _close(m, w, f"{field} {key} [{k}]")
                        continue
                    # stacked over the layer axes, in front
                    assert m.shape[:len(layer_axes)] == layer_axes, (field, key, m.shape)
                    layers = m.reshape((-1,) + m.shape[len(layer_axes):])
                    _close(layers[j], w, f"{field} {key} [{k}] layer {j}")


def test_state_is_stacked_over_the_layer_axes():
    params = {"w": jnp.zeros((4, 6, 5)), "conv": jnp.zeros((2, 3, 3, 4, 8)), "b": jnp.zeros(5)}
    dims = {"w": Dims(1, 2), "conv": Dims((2, 3), 4), "b": None}
    soap = functrain.contrib.soap(weight_dimension_numbers=dims).init(params)[0]
    assert [s.shape for s in soap.stats["w"]] == [(4, 6, 6), (4, 5, 5)]
    assert [s.shape for s in soap.bases["conv"]] == [(2, 3, 12, 12), (2, 3, 8, 8)]
    assert soap.nu["conv"].shape == (2, 3, 3, 4, 8)
    shampoo = functrain.contrib.shampoo(1e-3, block_size=4, weight_dimension_numbers=dims
                                        ).init(params)[0]
    assert shampoo.stats_l["w"].shape == (4, 4, 3, 3)  # (layers, blocks, b, b)
    assert shampoo.precond_r["conv"].shape == (2, 3, 6, 4, 4)
    np.testing.assert_array_equal(shampoo.precond_r["conv"][1, 2, 5], np.eye(4))
    kron = functrain.contrib.kron(weight_dimension_numbers=dims).init(params)[0]
    assert [q.shape for q in kron.qs["w"]] == [(4, 6, 6), (4, 5, 5)]
    assert [q.shape for q in kron.qs["b"]] == [(5,)]
    np.testing.assert_array_equal(kron.qs["conv"][0][1, 2], np.eye(12))


def _stacked_tree():
    return {"w": jnp.ones((3, 4, 4)), "b": jnp.ones(4)}


@pytest.mark.parametrize("name", ["soap", "shampoo", "kron"])
@pytest.mark.long
def test_a_function_of_the_params_gives_the_same_numbers_as_a_tree(name):
    make = OPTIMIZERS[name]
    by_tree = make(weight_dimension_numbers={"w": Dims(-2, -1), "b": None})
    by_fn = make(weight_dimension_numbers=lambda p: jax.tree_util.tree_map(
        lambda x: Dims(-2, -1) if x.ndim == 3 else None, p))
    params = _stacked_tree()
    grads = {"w": jnp.arange(48.).reshape(3, 4, 4) % 7 - 3, "b": jnp.arange(4.) - 1}
    ends = []
    for opt in (by_tree, by_fn):
        state = opt.init(params)
        for _ in range(3):
            u, state = opt.update(grads, state, params)
        ends.append(jax.tree_util.tree_leaves((u, state)))
    assert np.any(np.asarray(ends[0][0]) != 0)
    for x, y in zip(*ends):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", ["soap", "shampoo", "kron"])
def test_inject_hyperparams_keeps_the_dimension_numbers_static(name):
    factory = {"soap": functrain.contrib.soap, "shampoo": functrain.contrib.shampoo,
               "kron": functrain.contrib.kron}[name]
    dims = lambda p: {"w": Dims(-2, -1), "b": None}  # noqa: E731  # not a schedule
    opt = functrain.inject_hyperparams(factory)(learning_rate=0.1,
                                                weight_dimension_numbers=dims)
    plain = factory(0.1, weight_dimension_numbers=dims)
    params = _stacked_tree()
    grads = {"w": jnp.arange(48.).reshape(3, 4, 4) % 5 - 2, "b": jnp.arange(4.)}
    u, state = opt.update(grads, opt.init(params), params)
    v, _ = plain.update(grads, plain.init(params), params)
    assert "weight_dimension_numbers" not in state.hyperparams
    # float32, its hyperparameters injected as float32 arrays: rounding of those
    np.testing.assert_allclose(u["w"], v["w"], rtol=1e-5, atol=1e-7)
    assert np.any(np.asarray(v["w"]) != 0)


@pytest.mark.parametrize("name", ["soap", "shampoo", "kron"])
def test_bad_dimension_numbers_are_named(name):
    make = OPTIMIZERS[name]
    with pytest.raises(TypeError, match="weight_dimension_numbers must hold "
                                        "MuonDimensionNumbers"):
        make(weight_dimension_numbers=(1, 2))
    with pytest.raises(TypeError, match="weight_dimension_numbers must hold"):
        make(weight_dimension_numbers={"w": "rows"})
    params = _stacked_tree()
    with pytest.raises(ValueError, match=r"names axis 3, but leaf \['w'\] has shape \(3, 4, 4\)"):
        make(weight_dimension_numbers={"w": Dims(1, 3), "b": None}).init(params)
    with pytest.raises(ValueError, match=r"repeats an axis for leaf \['w'\]"):
        make(weight_dimension_numbers={"w": Dims(1, -2), "b": None}).init(params)
    with pytest.raises(ValueError, match=r"\['c'\] in the weight_dimension_numbers of "
                                         r"scale_by_\w+ (is|are) missing from params"):
        make(weight_dimension_numbers={"w": Dims(1, 2), "c": None}).init(params)
    # a state made without them does not fit an update with them, and the message says why
    opt = make(weight_dimension_numbers={"w": Dims(1, 2), "b": None})
    with pytest.raises(ValueError, match=r"\(3, 1?,? ?4, 4\).*was the state made"):
        opt.update(params, make().init(params), params)
