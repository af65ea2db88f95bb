"""functrain.arg_checks: hyperparameter tables, range checks, transformation and state checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain as ft
from functrain import arg_checks
from functrain.arg_checks import check_state_type
from functrain.declarations import hyperparameters
from functrain.engine.protocol import EmptyState


def test_check_range_and_friends_name_the_argument():
    with pytest.raises(ValueError, match=r"adam: b1 must be in \[0.0, 1.0\), got 1.5"):
        arg_checks.check_range("b1", 1.5, 0.0, 1.0, owner="adam")
    with pytest.raises(ValueError, match="lr must be >= 0.0, got -1"):
        arg_checks.check_range("lr", -1, 0.0)
    with pytest.raises(ValueError, match="b1"):
        arg_checks.check_range("b1", float("nan"), 0.0, 1.0)
    arg_checks.check_range("decay", 1.0, 0.0, 1.0, high_inclusive=True)  # allowed
    arg_checks.check_range("b1", lambda c: 2.0, 0.0, 1.0)                # schedules pass
    jax.jit(lambda b1: arg_checks.check_range("b1", b1, 0.0, 1.0) or b1)(5.0)  # traced values pass
    with pytest.raises(ValueError, match="b2"):
        arg_checks.check_betas("adam", b1=0.9, b2=1.0)
    with pytest.raises(ValueError, match="momentum"):
        arg_checks.check_momentum("sgd", -0.1)
    arg_checks.check_momentum("sgd", None)
    with pytest.raises(ValueError, match="eps"):
        arg_checks.check_nonnegative("adam", eps=-1e-8)


@hyperparameters(size="int", limit="int or None")
def _sized(size, limit=None):
    return size


@pytest.mark.parametrize("good", [0, 7, np.int64(7), np.uint8(7), jnp.asarray(7),
                                  np.asarray(7, np.int16)])
def test_int_kind_accepts_integers(good):
    assert _sized(good) is good
    assert _sized(good, limit=good) is good and _sized(good, limit=None) is good


@pytest.mark.parametrize("bad,got", [
    (1.5, "float 1.5"), (8.0, "float 8.0"), (True, "bool True"), ("3", "str '3'"),
    (None, "NoneType None"), (np.float32(2), "float32"),
    (jnp.asarray(2.0), r"ArrayImpl of shape \(\)"),
    (jnp.arange(3), r"ArrayImpl of shape \(3,\)"), ([1], r"list \[1\]"), (1 + 0j, "complex"),
])
def test_int_kind_refuses_other_values_with_a_type_error(bad, got):
    # 8.0 == 8 in Python: the kind is about the type, not the value.
    wanted = r"_sized: size must be an int \(a Python or numpy integer\), got "
    with pytest.raises(TypeError, match=wanted + got):
        _sized(bad)
    with pytest.raises(TypeError, match="_sized: limit must be an int"):
        _sized(3, limit=bad if bad is not None else 2.5)
    jax.jit(lambda n: _sized(n))(jnp.asarray(2.0))  # traced values pass, as for every kind


def test_protocol_checks():
    with pytest.raises(TypeError, match="masked: inner is a int"):
        arg_checks.check_transformation(3, "masked")
    arg_checks.check_transformation(ft.adam(1e-3), "masked")
    with pytest.raises(TypeError, match="scale expected its state as EmptyState, got tuple"):
        arg_checks.check_state_type((), ft.EmptyState, "scale")


@hyperparameters(learning_rate="schedule", decay="number or None", max_norm="bound",
                 steps="number")
def _builder(learning_rate, decay=None, max_norm=float("inf"), steps: "int | None" = 3):
    return learning_rate


def test_declared_kinds_are_checked_whatever_the_annotation():
    assert _builder(0.1) == 0.1 and _builder(lambda c: 0.1, 0.5, 1.0, 2)(0) == 0.1
    # "int | None" is not an annotation the old reader knew: the table checks it anyway
    with pytest.raises(TypeError, match=r"_builder: steps must be a real number, got str"):
        _builder(0.1, steps="3")
    with pytest.raises(ValueError, match="_builder: steps must be finite, got inf"):
        _builder(0.1, steps=float("inf"))
    with pytest.raises(TypeError, match="decay must be a real number, got function"):
        _builder(0.1, decay=lambda c: 0.1)  # a number, not a schedule
    _builder(0.1, decay=None, max_norm=float("inf"))  # optional; a bound may be infinite
    with pytest.raises(ValueError, match="max_norm must be finite, got nan"):
        _builder(0.1, max_norm=float("nan"))
    assert _builder.hyperparameter_kinds["decay"] == "number or None"
    assert _builder.__name__ == "_builder" and "decay" in str(
        __import__("inspect").signature(_builder))


def test_tables_are_checked_when_declared():
    with pytest.raises(TypeError, match=r"takes no argument\(s\) \['lr'\]"):
        hyperparameters(lr="number")(lambda learning_rate: learning_rate)
    with pytest.raises(TypeError, match="unknown kind 'float'"):
        hyperparameters(lr="float")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32,
                                   np.float64])
def test_zero_d_arrays_of_any_real_dtype_are_numbers(dtype):
    # optax's tests pass e.g. slope_rtol=jnp.asarray(1e-5, jnp.bfloat16).
    value = jnp.asarray(3, dtype) if dtype is not np.float64 else np.float64(3)
    assert arg_checks.concrete_real(value) == 3.0
    ft.scale_by_backtracking_linesearch(max_backtracking_steps=15,
                                        slope_rtol=jnp.asarray(1e-5, jnp.bfloat16))
    ft.adam(jnp.asarray(1e-3, jnp.bfloat16), b1=jnp.asarray(0.9, dtype=jnp.float16))
    with pytest.raises(TypeError, match="learning_rate must be a real number or a schedule"):
        ft.adam(jnp.asarray(1e-3 + 1j))


def test_every_builder_declares_a_table_for_its_numbers():
    # The tables replaced reading annotations; check no declared name is mistyped and
    # the common hyperparameters are declared where they exist.
    for name in ("adam", "adamw", "lamb", "sgd", "lion", "rmsprop"):
        kinds = getattr(ft, name).hyperparameter_kinds
        assert kinds["learning_rate"] == "schedule", name


def test_error_sentences():
    assert "lamb needs the current parameters" in str(arg_checks.needs_params_error("lamb"))
    err = arg_checks.state_mismatch_error("chain", "2 states for 3", "this chain", TypeError)
    assert isinstance(err, TypeError)
    assert str(err) == "chain: 2 states for 3: was the state made by this chain's init?"


@pytest.mark.parametrize("name,kwargs", [("adamw", {"weight_decay": 0.1}), ("lamb", {}),
                                         ("sgd", {"momentum": 0.9}), ("lion", {})])
def test_optax_states_are_accepted_mid_migration(name, kwargs):
    """A state made by optax's init continues in functrain's update with optax's numbers."""
    import optax
    import functrain
    p = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    g = jax.tree.map(lambda x: 0.1 * x + 0.5, p)
    theirs, ours = getattr(optax, name)(1e-2, **kwargs), getattr(functrain, name)(1e-2, **kwargs)
    s_theirs = s_ours = theirs.init(p)
    for _ in range(3):
        u_theirs, s_theirs = theirs.update(g, s_theirs, p)
        u_ours, s_ours = ours.update(g, s_ours, p)
        for a, b in zip(jax.tree.leaves(u_theirs), jax.tree.leaves(u_ours)):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_a_class_of_the_same_name_with_other_fields_is_refused():
    import collections
    Fake = collections.namedtuple("EmptyState", ["x"])
    with pytest.raises(TypeError, match="expected its state as EmptyState"):
        check_state_type(Fake(1), EmptyState, "scale")


def test_sorted_labels_orders_mixed_labels_by_repr():
    assert arg_checks.sorted_labels(["b", 1, "a"]) == ["a", "b", 1]
