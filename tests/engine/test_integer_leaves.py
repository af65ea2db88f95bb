"""Integer leaves (functrain/engine/program.py, check_leaf_dtypes in functrain/tree/checks.py)
against optax 0.2.8 on the same integer inputs.

The rule (docs/design.md, "Dtypes"): a stage computes an integer leaf in the float jnp's
arithmetic gives it (``0.1 * g``: float32, float64 with x64) and returns its update in
that float, as optax's updates come out; integer params of a stage that keeps per-leaf
state get that state in the same float (optax's is integer, and its adam's nu truncated);
bool leaves, and integer leaves of the transformations with their own ``update`` (L-BFGS,
prodigy, ...) raise a ``TypeError`` naming the leaf.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
import registry
from functrain.jax_compat import enable_x64
from helpers import loss_value

PARAMS = {"w": jnp.asarray([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], jnp.float32),
          "b": jnp.asarray([0.1, -0.2, 0.3], jnp.float32)}
INT_GRADS = [{"w": jnp.asarray([[1, -2, 3], [0, 4, -1]], jnp.int32),
              "b": jnp.asarray([2, -3, 1], jnp.int8)},
             {"w": jnp.asarray([[-1, 1, 2], [3, 0, -2]], jnp.int32),
              "b": jnp.asarray([1, 1, -4], jnp.int8)}]
# float32 parity with optax, as tests/helpers.py's assert_same_trajectory.
RTOL, ATOL = 2e-5, 1e-6

# Optimizers built from stages, one or two per family, with optax's function of the same name.
OPTIMIZERS = {
    "sgd": lambda m: m.sgd(0.1),
    "sgd_nesterov": lambda m: m.sgd(0.1, momentum=0.9, nesterov=True),
    "sgd_schedule": lambda m: m.sgd(m.linear_schedule(0.1, 0.05, 4)),
    "adam": lambda m: m.adam(0.1),
    "adamw": lambda m: m.adamw(0.1, weight_decay=0.1),
    "rmsprop": lambda m: m.rmsprop(0.1, momentum=0.5),
    "adafactor": lambda m: m.adafactor(0.1),
    "lamb": lambda m: m.lamb(0.1),
    "lion": lambda m: m.lion(0.1),
    "adabelief": lambda m: m.adabelief(0.1),
    "nadam": lambda m: m.nadam(0.1),
    "madgrad": lambda m: m.contrib.madgrad(0.1),
    "schedule_free_sgd": lambda m: m.contrib.schedule_free_sgd(0.1, warmup_steps=2),
}
# Where optax's answer on integer gradients is not its answer on the same values as floats:
# optax casts an intermediate to the gradient's integer dtype (nadam's Nesterov term divides
# the gradient by its bias correction cast to int32, 0: inf; scale_by_schedule casts the
# learning rate to int32, 0, as does schedule_free_sgd's warmup; madgrad's update is
# truncated to 0). functrain gives the answer on the equal floats there too.
OPTAX_INTEGER_BUGS = {"nadam", "madgrad", "sgd_schedule", "schedule_free_sgd"}


def updates(opt, grads, params=PARAMS, **extra):
    state, out = opt.init(params), []
    for g in grads:
        u, state = opt.update(g, state, params, **extra)
        out.append(u)
    return out


def assert_same(ours, theirs, rtol=RTOL, atol=ATOL):
    """Same dtypes (a Python number as the array jnp makes of it) and values."""
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        a, b = jnp.asarray(a), jnp.asarray(b)
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def as_float32(tree):
    return jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), tree)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_integer_gradients_give_optax_answer(name):
    """Updates in float32, with optax's numbers on the same integer gradients (where optax's
    are its own numbers for the equal float gradients) and optax's numbers on those floats."""
    make = OPTIMIZERS[name]
    ours = updates(make(ft), INT_GRADS)
    on_floats = updates(make(optax), [as_float32(g) for g in INT_GRADS])
    assert_same(ours, on_floats)
    theirs = updates(make(optax), INT_GRADS)
    if name in OPTAX_INTEGER_BUGS:
        with pytest.raises(AssertionError):  # optax's integer answer: inf, nan or zeros
            assert_same(theirs, on_floats, rtol=1e-3, atol=1e-3)
    else:
        assert_same(ours, theirs)


def test_integer_gradients_under_x64_give_float64_as_optax():
    """With float64 params. (With float32 params optax is not consistent under x64: its
    stateless sgd gives float64, ``0.1 * g``, as functrain; its adam float32.)"""
    with enable_x64():
        params = {"w": jnp.asarray([0.5, -1.0, 2.0], jnp.float64)}
        grads = [{"w": jnp.asarray([1, -2, 3], jnp.int32)}] * 2
        for make in (OPTIMIZERS["sgd"], OPTIMIZERS["adam"]):
            ours, theirs = updates(make(ft), grads, params), updates(make(optax), grads, params)
            assert ours[0]["w"].dtype == jnp.float64
            assert_same(ours, theirs, rtol=1e-12, atol=1e-15)


def test_integer_params_of_stateless_stages_give_optax_answer():
    """optax's test_extra_args's Python-int params, to stages that keep no per-leaf state."""
    params = {"a": 1, "b": 2}
    for make in (lambda m: m.sgd(0.1),
                 lambda m: m.chain(m.add_decayed_weights(0.5), m.sgd(0.1))):
        ours, theirs = updates(make(ft), [params] * 2, params), \
            updates(make(optax), [params] * 2, params)
        assert ours[0]["a"].dtype == jnp.float32
        assert_same(ours, theirs)
    # The update applied to an integer param is cast back to it, as optax's apply_updates.
    new = ft.apply_updates(params, ours[0])
    assert_same(new, optax.apply_updates(params, theirs[0]))


@pytest.mark.parametrize("make", [lambda m: m.adam(1e-3), lambda m: m.sgd(0.1, momentum=0.9),
                                  lambda m: m.adamw(1e-3, weight_decay=0.1)],
                         ids=["adam", "sgd_momentum", "adamw"])
def test_integer_params_of_stateful_stages_keep_float_state(make):
    """optax's test_extra_args's Python-int params to a stage with per-leaf state: the state
    is float32 (the float ``0.1 * p`` gives), the first update is optax's, and every update
    is optax's on the equal float params. optax's own state is int32 at init, and its adam
    truncates nu to 0 (where (1 - b2) g^2 is 0.001 and 0.004), so from the second step on
    its updates differ from its answer on floats; the test asserts that too, so that it
    notices if optax changes."""
    params, floats = {"a": 1, "b": 2}, {"a": 1.0, "b": 2.0}
    state = make(ft).init(params)
    assert {x.dtype for x in jax.tree_util.tree_leaves(state)} <= {
        jnp.dtype(jnp.float32), jnp.dtype(jnp.int32)}  # int32: adam's count
    per_leaf = [x for x in jax.tree_util.tree_leaves(state) if x.dtype != jnp.int32]
    assert per_leaf and all(x.dtype == jnp.float32 for x in per_leaf)
    ours = updates(make(ft), [params] * 3, params)
    theirs = updates(make(optax), [params] * 3, params)
    on_floats = updates(make(optax), [floats] * 3, floats)
    assert_same(ours, on_floats)
    assert_same(ours[:1], theirs[:1])
    if isinstance(make(optax).init(params)[0], optax.ScaleByAdamState):
        with pytest.raises(AssertionError):  # optax's nu truncated to 0 from the first update
            assert_same(theirs[1:], on_floats[1:], rtol=1e-3, atol=1e-6)
    with enable_x64():
        state = make(ft).init({"a": jnp.asarray(1, jnp.int64)})
        assert any(x.dtype == jnp.float64 for x in jax.tree_util.tree_leaves(state))


def test_needs_updates_stage_reads_integer_updates_as_floats():
    """clip_by_global_norm's norm of integer gradients, against the formula in numpy (optax's
    raises on them: lax.select of its float32 and int32 branches)."""
    g = {"w": jnp.asarray([3, -4], jnp.int32), "b": jnp.asarray([12], jnp.int32)}
    opt = ft.clip_by_global_norm(6.5)
    u, _ = opt.update(g, opt.init(as_float32(g)))
    expected = np.array([3.0, -4.0, 12.0]) * 6.5 / 13.0
    assert u["w"].dtype == jnp.float32
    np.testing.assert_allclose(np.concatenate([u["b"], u["w"]]), expected[[2, 0, 1]],
                               rtol=1e-6)


def test_inject_hyperparams_scale_by_integer_schedule():
    """optax's test_inject_hyperparams_starts_with_step_count_zero: the same numbers; the
    dtype is float32 (optax: int32, an int32 step size times int32 gradients)."""
    grads = jnp.asarray([-1, 0, 1])
    for m in (ft, optax):
        opt = m.inject_hyperparams(m.scale)(lambda count: count)
        out = updates(opt, [grads] * 3, jnp.zeros(3))
        if m is ft:
            ours = out
    assert all(u.dtype == jnp.float32 for u in ours)
    for a, b in zip(ours, out):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ours[2], 2 * np.asarray(grads))


def test_leaves_only_any_dtype_stages_touch_keep_their_integers():
    big = jnp.asarray([2 ** 24 + 1, -7], jnp.int32)  # not a float32
    params = {"w": jnp.ones(2), "step": big}
    opt = ft.chain(ft.masked(ft.adam(0.1), {"w": True, "step": False}), ft.identity())
    u, _ = opt.update(params, opt.init(params), params)
    assert u["step"].dtype == jnp.int32
    np.testing.assert_array_equal(u["step"], big)


@pytest.mark.parametrize("what", ["updates", "params"])
def test_bool_leaves_are_refused_naming_the_leaf(what):
    opt = ft.sgd(0.1)
    flags = {"w": jnp.ones(2), "on": jnp.asarray([True, False])}
    floats = {"w": jnp.ones(2), "on": jnp.ones(2)}
    with pytest.raises(TypeError, match=rf"{what} leaf \['on'\] has dtype bool"):
        if what == "params":
            opt.init(flags)
        else:
            opt.update(flags, opt.init(floats))


@pytest.mark.parametrize("make", [lambda: ft.lbfgs(), lambda: ft.contrib.prodigy(),
                                  lambda: ft.add_noise(0.1, 0.55)],
                         ids=["lbfgs", "prodigy", "add_noise"])
def test_own_update_transformations_refuse_integer_gradients(make):
    opt = make()
    params = {"w": jnp.ones(3)}
    with pytest.raises(TypeError, match=r"updates leaf \['w'\] has dtype int32, but"):
        opt.update({"w": jnp.asarray([1, 2, 3])}, opt.init(params), params,
                   value=jnp.float32(1.0), grad=params, value_fn=lambda p: jnp.float32(1.0))


@pytest.mark.parametrize("name", registry.names())
def test_every_optimizer_computes_integer_leaves_as_floats_or_refuses_them(name):
    """No silently wrong number on integer leaves, for every optimizer of tests/registry.py:
    integer gradients give, bit for bit, the updates of the equal float32 gradients (checked
    against optax by the parity tests), and integer params those of the equal float32 params;
    or a TypeError names the leaf. (Found six matrix optimizers whose own update cast its
    result back to the gradient's integer dtype: now refused.)"""
    record = registry.REGISTRY.get(name) or registry.default_record(name)
    int_params = {"w": jnp.asarray([[1, -1, 2], [2, 0, -1]]), "b": jnp.asarray([1, -2, 3])}
    float_grads = [jax.tree_util.tree_map(lambda x: 0.5 * x.astype(jnp.float32), g)
                   for g in INT_GRADS]
    cases = [(INT_GRADS, PARAMS, [as_float32(g) for g in INT_GRADS], PARAMS),
             (float_grads, int_params, float_grads, as_float32(int_params))]
    for grads, params, float_grads_, float_params in cases:
        extra = record.update_kwargs(loss_value, float_params)
        try:
            ours = updates(record.make(ft), grads, params, **extra)
        except TypeError as e:
            assert re.search(r"leaf \['[wb]'\] has dtype int", str(e)), str(e)
            continue
        on_floats = updates(record.make(ft), float_grads_, float_params, **extra)
        for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(on_floats)):
            assert a.dtype == b.dtype == jnp.float32, (a.dtype, b.dtype)
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("make", [lambda: ft.contrib.schedule_free_sgd(0.1),
                                  lambda: ft.contrib.reduce_on_plateau(),
                                  lambda: ft.inject_hyperparams(ft.adam)(learning_rate=0.1)],
                         ids=["schedule_free", "reduce_on_plateau", "inject_hyperparams"])
def test_scalar_state_in_the_params_dtype_is_float_for_integer_params(make):
    """Scalars kept "in the params' dtype" (schedule-free's b1 = 0.9, reduce_on_plateau's
    scale = 1 and best_value = inf, the injected learning rate) are the float the integer
    params compute in: the same state as for the equal float32 params. (optax's would be
    int32: b1 0, learning rate 0, and inf does not convert.)"""
    ints, floats = {"a": 1, "b": jnp.asarray([2, 3])}, {"a": 1.0, "b": jnp.asarray([2.0, 3.0])}
    a, b = make().init(ints), make().init(floats)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert x.dtype == y.dtype and np.array_equal(x, y), (x, y)
