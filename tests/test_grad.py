"""Tests of functrain.grad: grad, value_and_grad, jac, execute_with_gradients,
stop_gradient, and the name `functrain.grad` (the function).

Every example of seeds 000 and 001 for these functions is reproduced with its
printed numbers (tight tolerance where ~8 digits are printed, looser where 3),
plus MXNet's stop_gradient example (seed 004).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
import functrain.grad
from functrain.grad import (
    execute_with_gradients,
    jac,
    stop_gradient,
    value_and_grad,
)

from helpers import loose, tight

A = jnp.array


def mean_square(x):
    return jnp.mean(jnp.square(x))


X_SEED = A([[4.6, 2.1, 5], [2.8, 1.3, 6.2]])


# --------------------------------------------------------------------------
# The name `functrain.grad`: the function, as jax.grad; the module stays importable.
# --------------------------------------------------------------------------


def test_functrain_grad_is_the_function():
    mod = importlib.import_module("functrain.grad")
    assert functrain.grad is mod.grad
    assert isinstance(functrain.grad, types.FunctionType)
    assert not isinstance(sys.modules["functrain.grad"], types.FunctionType)
    loose(functrain.grad(mean_square)(X_SEED), [[1.53, 0.7, 1.67], [0.933, 0.433, 2.07]])
    # argnums is forwarded
    tight(functrain.grad(lambda a, b: jnp.sum(a * b), argnums=1)(A(2.0), A(3.0)), 2.0)
    tight(functrain.grad(lambda a, b: jnp.sum(a * b), 1)(A(2.0), A(3.0)), 2.0)
    assert list(inspect.signature(functrain.grad).parameters) == ["func", "argnums"]


def test_the_modules_functions_import_from_it():
    from functrain.grad import grad as grad_function, value_and_grad
    assert grad_function is functrain.grad
    assert value_and_grad is functrain.value_and_grad


def test_grad_composes_with_jit_and_itself():
    f = lambda x: jnp.sum(x**3)
    second = jax.jit(functrain.grad(lambda x: jnp.sum(functrain.grad(f)(x))))
    tight(second(A([1.0, 2.0])), [6.0, 12.0])


def test_top_level_exports():
    for name in ("value_and_grad", "jac", "execute_with_gradients", "stop_gradient"):
        assert getattr(functrain, name) is getattr(sys.modules["functrain.grad"], name)
    from functrain import compat

    for name in compat.__all__:
        assert getattr(functrain, name) is getattr(compat, name)


# --------------------------------------------------------------------------
# grad / value_and_grad / jac: seed 001 examples
# --------------------------------------------------------------------------


def test_grad_seed():
    loose(functrain.grad(mean_square)(X_SEED), [[1.53, 0.7, 1.67], [0.933, 0.433, 2.07]])


def test_value_and_grad_seed():
    value, g = value_and_grad(mean_square)(X_SEED)
    tight(value, 16.42333412)
    tight(g, [[1.5333333, 0.69999999, 1.66666675], [0.93333334, 0.43333334, 2.0666666]])


def test_value_and_grad_argnums_and_aux():
    f = lambda a, b: (jnp.sum(a * b**2), {"b": b})
    (value, aux), (ga, gb) = value_and_grad(f, argnums=(0, 1), has_aux=True)(A(2.0), A(3.0))
    tight(value, 18.0)
    tight(aux["b"], 3.0)
    tight(ga, 9.0)
    tight(gb, 12.0)


def test_jac_seed():
    loose(jac(mean_square)(X_SEED), [[1.53, 0.7, 1.67], [0.933, 0.433, 2.07]])


def test_jac_vector_function_and_argnums():
    f = lambda x, y: jnp.stack([x[0] * y, x[1] ** 2])
    tight(jac(f)(A([1.0, 2.0]), A(3.0)), [[3.0, 0.0], [0.0, 4.0]])
    tight(jac(f, argnums=1)(A([1.0, 2.0]), A(3.0)), [1.0, 0.0])
    # pytree output and input: out tree of in trees
    j = jac(lambda p: {"s": p["a"] * p["b"]})({"a": A(2.0), "b": A(5.0)})
    tight(j["s"]["a"], 5.0)
    tight(j["s"]["b"], 2.0)


def test_grad_functions_under_jit():
    x = X_SEED
    tight(jax.jit(functrain.grad(mean_square))(x), functrain.grad(mean_square)(x))
    v1, g1 = jax.jit(value_and_grad(mean_square))(x)
    v2, g2 = value_and_grad(mean_square)(x)
    tight(v1, v2)
    tight(g1, g2)
    tight(jax.jit(jac(lambda v: v**2))(A([1.0, 3.0])), [[2.0, 0.0], [0.0, 6.0]])


# --------------------------------------------------------------------------
# stop_gradient: seed 000 (Ivy), 003 (MLX), 004 (MXNet)
# --------------------------------------------------------------------------


def test_stop_gradient_seed_arrays():
    tight(stop_gradient(A([1.0, 2.0, 3.0]), preserve_type=True), [1.0, 2.0, 3.0])
    tight(stop_gradient(jnp.zeros((2, 3)), preserve_type=False), [[0.0] * 3] * 2)


def test_stop_gradient_seed_containers():
    x = {"a": A([0.0, 1.0, 2.0]), "b": A([3.0, 4.0, 5.0])}
    for preserve in (False, True):
        y = stop_gradient(x, preserve_type=preserve)
        assert set(y) == {"a", "b"}
        tight(y["a"], [0.0, 1.0, 2.0])
        tight(y["b"], [3.0, 4.0, 5.0])


def test_stop_gradient_blocks_the_gradient():
    x = A([1.0, -2.0, 3.0])
    # d/dx sum(sg(x) * x) = sg(x) = x (the stopped factor is a constant).
    tight(jax.grad(lambda x: jnp.sum(stop_gradient(x) * x))(x), x)
    tight(jax.grad(lambda x: jnp.sum(stop_gradient(x) ** 2))(x), [0.0, 0.0, 0.0])
    tree = [A(2.0), (A(3.0), {"k": A(4.0)})]
    g = jax.grad(lambda t: sum(jax.tree.leaves(jax.tree.map(lambda s, v: s * v, stop_gradient(t), t))))(tree)
    assert jax.tree.structure(g) == jax.tree.structure(tree)
    jax.tree.map(tight, g, tree)


def test_stop_gradient_mxnet_example():
    # loss = stop_gradient(3 * b) + a, a = [1, 2], b = [0, 1].
    def loss(a, b):
        return stop_gradient(3 * b) + a

    a, b = A([1.0, 2.0]), A([0.0, 1.0])
    tight(loss(a, b), [1.0, 5.0])
    # MXNet's backward with a head gradient of ones: a vjp with ones.
    out, vjp = jax.vjp(loss, a, b)
    ga, gb = vjp(jnp.ones_like(out))
    tight(ga, [1.0, 1.0])
    tight(gb, [0.0, 0.0])
    # The same through execute_with_gradients, both inputs selected.
    ret, grads = execute_with_gradients(lambda xs: jnp.sum(loss(*xs)), [a, b], xs_grad_idxs=None)
    tight(ret, 6.0)
    tight(grads[0], [1.0, 1.0])
    tight(grads[1], [0.0, 0.0])


def test_stop_gradient_under_jit_and_non_array_leaves():
    f = jax.jit(jax.grad(lambda x: jnp.sum(stop_gradient(x) * x)))
    tight(f(A([2.0, 3.0])), [2.0, 3.0])
    tree = {"name": "layer", "w": A([1.0])}
    out = stop_gradient(tree)
    assert out["name"] == "layer"
    tight(out["w"], [1.0])
    # Constants to JAX (numpy arrays, Python numbers) come back unchanged.
    host = np.array([1.0, 2.0])
    assert stop_gradient(host) is host
    assert stop_gradient(2.5) == 2.5


# --------------------------------------------------------------------------
# execute_with_gradients: seed 001 examples
# --------------------------------------------------------------------------


def test_execute_with_gradients_seed_array_integers():
    x = A([[1, 4, 6], [2, 6, 9]])  # integers: promoted to float
    ret, grads = execute_with_gradients(mean_square, x, retain_grads=True)
    tight(ret, 29.0)
    tight(grads, [[0.33333334, 1.33333337, 2.0], [0.66666669, 2.0, 3.0]])
    assert grads.dtype == jnp.float32


def test_execute_with_gradients_seed_container():
    x = {"a": A([1, 4, 6]), "b": A([2, 6, 9])}
    func = lambda x: jax.tree.map(mean_square, x)  # Ivy maps mean over a Container
    ret, grads = execute_with_gradients(func, x, retain_grads=True)
    tight(ret["a"], 17.666666)
    tight(ret["b"], 40.333332)
    # The Jacobian's tree of trees: grads[out_key][in_key].
    assert jax.tree.structure(grads) == jax.tree.structure(
        {"a": {"a": 0, "b": 0}, "b": {"a": 0, "b": 0}}
    )
    tight(grads["a"]["a"], [0.66666669, 2.66666675, 4.0])
    tight(grads["a"]["b"], [0.0, 0.0, 0.0])
    tight(grads["b"]["a"], [0.0, 0.0, 0.0])
    tight(grads["b"]["b"], [1.33333337, 4.0, 6.0])


# --------------------------------------------------------------------------
# execute_with_gradients: index selection
# --------------------------------------------------------------------------


def tuple_loss(xs):
    w, b = xs
    return jnp.sum(w**2) + 3.0 * b, "aux string"


XS = [A([1.0, 2.0]), A(4.0)]


def test_default_selection_on_list_and_tuple_result():
    # xs is a list: ((0,),) selects xs[0].  The result is a tuple: ((0,),)
    # selects its first element.  grads mirrors xs[0], unwrapped.
    ret, grads = execute_with_gradients(tuple_loss, XS)
    tight(ret[0], 1.0 + 4.0 + 12.0)
    assert ret[1] == "aux string"  # unselected outputs may be anything
    assert isinstance(grads, jax.Array)
    tight(grads, [2.0, 4.0])


def test_all_inputs_mirror_xs():
    ret, grads = execute_with_gradients(tuple_loss, XS, xs_grad_idxs=None)
    assert isinstance(grads, list) and len(grads) == 2
    tight(grads[0], [2.0, 4.0])
    tight(grads[1], 3.0)


def test_several_input_paths_give_a_tuple_in_order():
    _, grads = execute_with_gradients(tuple_loss, XS, xs_grad_idxs=((1,), (0,)))
    assert isinstance(grads, tuple) and len(grads) == 2
    tight(grads[0], 3.0)
    tight(grads[1], [2.0, 4.0])
    _, grads = execute_with_gradients(tuple_loss, XS, xs_grad_idxs=[[1]])
    tight(grads, 3.0)


def test_nested_input_paths():
    xs = [A(2.0), {"w": A([1.0, -1.0]), "b": A(0.5)}]
    f = lambda xs: xs[0] * jnp.sum(xs[1]["w"] ** 2) + xs[1]["b"]
    _, g = execute_with_gradients(f, xs, xs_grad_idxs=((1, "w"),))
    tight(g, [4.0, -4.0])
    _, g = execute_with_gradients(f, xs, xs_grad_idxs=((1,),))
    assert set(g) == {"w", "b"}
    tight(g["w"], [4.0, -4.0])
    tight(g["b"], 1.0)
    _, g = execute_with_gradients(f, xs, xs_grad_idxs=((0,), (1, "b")))
    tight(g[0], 2.0)
    tight(g[1], 1.0)


class Layer(NamedTuple):
    w: jax.Array
    b: jax.Array


def test_namedtuple_paths_by_field_or_position():
    xs = Layer(w=A([1.0, 2.0]), b=A(3.0))
    f = lambda p: jnp.sum(p.w * p.b)
    _, by_name = execute_with_gradients(f, xs, xs_grad_idxs=(("b",),))
    _, by_pos = execute_with_gradients(f, xs, xs_grad_idxs=((1,),))
    tight(by_name, 3.0)
    tight(by_pos, 3.0)
    _, default = execute_with_gradients(f, xs)  # a tuple: ((0,),) is xs.w
    tight(default, [3.0, 3.0])
    _, everything = execute_with_gradients(f, xs, xs_grad_idxs=None)
    assert isinstance(everything, Layer)
    tight(everything.w, [3.0, 3.0])
    tight(everything.b, 3.0)


def test_output_paths():
    def f(xs):
        w = xs["w"]
        return {"loss": jnp.sum(w**2), "aux": (jnp.sum(w), "tag")}

    xs = {"w": A([1.0, 3.0])}
    # A dict result: the default means all outputs; the string must then be
    # left out explicitly, so select the two array outputs by path.
    _, g = execute_with_gradients(f, xs, ret_grad_idxs=(("loss",),))
    tight(g["w"], [2.0, 6.0])
    _, g = execute_with_gradients(f, xs, ret_grad_idxs=(("loss",), ("aux", 0)))
    assert isinstance(g, tuple)
    tight(g[0]["w"], [2.0, 6.0])
    tight(g[1]["w"], [1.0, 1.0])


def test_vector_output_gives_jacobian():
    ret, g = execute_with_gradients(lambda x: x**2, A([1.0, 2.0]))
    tight(ret, [1.0, 4.0])
    tight(g, [[2.0, 0.0], [0.0, 4.0]])


def test_unselected_integer_inputs_are_not_promoted():
    xs = [A([10.0, 20.0, 30.0]), A([2, 0])]

    def f(xs):
        table, idx = xs
        assert jnp.issubdtype(idx.dtype, jnp.integer)
        return jnp.sum(table[idx])

    ret, g = execute_with_gradients(f, xs)
    tight(ret, 40.0)
    tight(g, [1.0, 0.0, 1.0])


def test_selected_integer_inputs_are_promoted():
    _, g = execute_with_gradients(lambda xs: jnp.sum(xs[0] * xs[1]), [A([1, 2]), A([3, 4])],
                                  xs_grad_idxs=((0,), (1,)))
    assert g[0].dtype == jnp.float32 and g[1].dtype == jnp.float32
    tight(g[0], [3.0, 4.0])
    tight(g[1], [1.0, 2.0])


def test_bad_index_paths():
    with pytest.raises(KeyError, match="no child 2"):
        execute_with_gradients(tuple_loss, XS, xs_grad_idxs=((2,),))
    with pytest.raises(KeyError, match="'c'"):
        execute_with_gradients(lambda x: x["a"], {"a": A(1.0)}, xs_grad_idxs=(("c",),))
    with pytest.raises(ValueError, match="overlap"):
        execute_with_gradients(tuple_loss, XS, xs_grad_idxs=((0,), (0,)))
    with pytest.raises(TypeError, match="sequence of paths"):
        execute_with_gradients(tuple_loss, XS, xs_grad_idxs=(0,))
    with pytest.raises(ValueError, match="selects nothing"):
        execute_with_gradients(tuple_loss, XS, xs_grad_idxs=())
    with pytest.raises(KeyError, match="ret_grad_idxs"):
        execute_with_gradients(tuple_loss, XS, ret_grad_idxs=((5,),))


# --------------------------------------------------------------------------
# execute_with_gradients: retain_grads, jit
# --------------------------------------------------------------------------


def test_retain_grads_controls_second_order():
    cube = lambda x: jnp.sum(x**3)
    x = A([1.0, 2.0])

    def outer(x, retain):
        ret, g = execute_with_gradients(cube, x, retain_grads=retain)
        return jnp.sum(g) + ret

    # d/dx [sum(3 x^2) + sum(x^3)] = 6x + 3x^2
    tight(jax.grad(outer)(x, True), [6.0 + 3.0, 12.0 + 12.0])
    tight(jax.grad(outer)(x, False), [0.0, 0.0])


def test_execute_with_gradients_under_jit():
    f = jax.jit(lambda xs: execute_with_gradients(tuple_loss, xs, xs_grad_idxs=None)[1])
    g = f([A([1.0, 2.0]), A(4.0)])
    tight(g[0], [2.0, 4.0])
    tight(g[1], 3.0)
