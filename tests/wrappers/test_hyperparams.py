"""functrain.wrappers.hyperparams: inject_hyperparams by hand (every optimizer through it:
tests/families/; every step against optax: tests/parity/test_optax_parity.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain as ft
from helpers import assert_empty_params_step, assert_state_donatable


def test_inject_hyperparams_lr_change_by_hand():
    opt = ft.inject_hyperparams(ft.sgd)(learning_rate=0.1, momentum=0.9)
    params = [jnp.array([0.0])]
    state = opt.init(params)
    step = jax.jit(opt.update)
    trace, expected, got = 0.0, [], []
    for t, g in enumerate([1.0, 2.0, -1.0, 0.5]):
        if t == 2:
            state.hyperparams["learning_rate"] = 0.01
        lr = 0.1 if t < 2 else 0.01
        trace = g + 0.9 * trace
        expected.append(-lr * trace)
        u, state = step([jnp.array([g])], state)
        got.append(float(u[0][0]))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert step._cache_size() == 1


def test_inject_hyperparams_compiles_once_for_three_learning_rates():
    opt = ft.inject_hyperparams(ft.adam)(learning_rate=0.1)
    params = {"w": jnp.ones(3)}
    state = opt.init(params)

    @jax.jit
    def train_step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return ft.apply_updates(params, updates), state

    seen = []
    for lr in (0.1, np.float32(0.05), jnp.asarray(0.01, jnp.float32)):
        state.hyperparams["learning_rate"] = lr
        new_params, state = train_step(params, state, {"w": jnp.ones(3)})
        seen.append(float(params["w"][0] - new_params["w"][0]))
        params = new_params
    np.testing.assert_allclose(seen, [0.1, 0.05, 0.01], rtol=1e-4)
    assert train_step._cache_size() == 1


def test_inject_hyperparams_schedule_and_static_args():
    opt = ft.inject_hyperparams(ft.sgd, static_args="nesterov")(
        learning_rate=lambda count: 0.1 * (count + 1), nesterov=False)
    state = opt.init([jnp.zeros(1)])
    us = []
    for _ in range(3):
        u, state = opt.update([jnp.ones(1)], state)
        us.append(float(u[0][0]))
    np.testing.assert_allclose(us, [-0.1, -0.2, -0.3], rtol=1e-6)
    np.testing.assert_allclose(state.hyperparams["learning_rate"], 0.3, rtol=1e-6)
    assert "nesterov" not in state.hyperparams
    with pytest.raises(ValueError, match="static_args"):
        ft.inject_hyperparams(ft.sgd, static_args=("not_an_argument",))


@pytest.mark.parametrize("make", [lambda: ft.inject_hyperparams(ft.adam)(0.1)],
                         ids=["inject_hyperparams"])
def test_empty_params(make):
    assert_empty_params_step(make())


@pytest.mark.parametrize("make", [lambda: ft.inject_hyperparams(ft.adamw)(0.1, b1=0.9, b2=0.9)],
                         ids=["inject_hyperparams"])
def test_state_can_be_donated_and_abstractly_initialised(make):
    assert_state_donatable(make())


# --------------------------------------------------------------------------
# inject_stateful_hyperparams, StatefulSchedule, WrappedSchedule: against optax 0.2.8
# --------------------------------------------------------------------------

import warnings  # noqa: E402

import optax  # noqa: E402

from helpers import loss_value, make_grads, make_params  # noqa: E402


class HalveOnPlateau:
    """A stateful schedule: halve the value whenever the loss did not improve by 1%."""

    def __init__(self, value):
        self.value = value

    def init(self):
        return {"scale": jnp.ones([]), "best": jnp.full([], jnp.inf, jnp.float32)}

    def update(self, state, value=None, **extra):
        worse = value > 0.99 * state["best"]
        return {"scale": jnp.where(worse, 0.5 * state["scale"], state["scale"]),
                "best": jnp.minimum(state["best"], value)}

    def __call__(self, state, **extra):
        return self.value * state["scale"]


def stateful_cases(m):
    return {
        "plateau_lr_adam": m.inject_stateful_hyperparams(m.adam)(
            learning_rate=HalveOnPlateau(0.5), b1=0.8),
        "wrapped_schedule_sgd": m.inject_stateful_hyperparams(m.sgd)(
            learning_rate=m.WrappedSchedule(m.linear_schedule(0.1, 0.01, 20)), momentum=0.9),
        "plain_schedule_adamw": m.inject_stateful_hyperparams(m.adamw, static_args="mask")(
            learning_rate=m.cosine_decay_schedule(0.05, 25), weight_decay=1e-3),
    }


def optax_cases():
    with warnings.catch_warnings():  # optax marks it deprecated (for inject_hyperparams)
        warnings.simplefilter("ignore", DeprecationWarning)
        return stateful_cases(optax)


@pytest.mark.parametrize("case", ["plateau_lr_adam", "wrapped_schedule_sgd",
                                  "plain_schedule_adamw"])
def test_inject_stateful_hyperparams_matches_optax_step_by_step(case):
    ours, theirs = stateful_cases(ft)[case], optax_cases()[case]
    params = make_params()
    grads = make_grads(params, 30)

    def stepper(opt, m):
        @jax.jit
        def step(p, s, g):
            u, s = opt.update(g, s, p, value=loss_value(p))
            return m.apply_updates(p, u), s
        return step

    p1 = p2 = params
    s1, s2 = ours.init(params), theirs.init(params)
    step1, step2 = stepper(ours, ft), stepper(theirs, optax)
    lrs = []
    for t in range(30):
        g = jax.tree_util.tree_map(lambda x: x[t], grads)
        p1, s1 = step1(p1, s1, g)
        p2, s2 = step2(p2, s2, g)
        for x, y in zip(jax.tree_util.tree_leaves(p1), jax.tree_util.tree_leaves(p2)):
            np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6, err_msg=f"{case} step {t}")
        assert sorted(s1.hyperparams) == sorted(s2.hyperparams)
        for k in s2.hyperparams:
            np.testing.assert_allclose(s1.hyperparams[k], s2.hyperparams[k], rtol=1e-6)
        for x, y in zip(jax.tree_util.tree_leaves(s1.hyperparams_states),
                        jax.tree_util.tree_leaves(s2.hyperparams_states)):
            np.testing.assert_allclose(x, y, rtol=1e-6)
        assert int(s1.count) == int(s2.count) == t + 1
        lrs.append(float(s1.hyperparams["learning_rate"]))
    assert len(set(lrs)) > 2  # the schedule really changed the learning rate
    assert type(s1).__name__ == "InjectStatefulHyperparamsState"


def test_stateful_schedule_protocol_and_wrapped_schedule():
    sched = ft.WrappedSchedule(ft.linear_schedule(1.0, 0.0, 4))
    assert isinstance(sched, ft.StatefulSchedule)
    assert isinstance(HalveOnPlateau(1.0), ft.StatefulSchedule)
    assert not isinstance(ft.linear_schedule(1.0, 0.0, 4), ft.StatefulSchedule)
    theirs = optax.WrappedSchedule(optax.linear_schedule(1.0, 0.0, 4))
    s1, s2 = sched.init(), theirs.init()
    for _ in range(6):
        assert float(sched(s1, value=1.0)) == float(theirs(s2))
        s1, s2 = sched.update(s1, value=1.0), theirs.update(s2)
        assert int(s1.count) == int(s2.count)


def test_numeric_hyperparams_can_be_changed_and_unknown_keys_are_refused():
    opt = ft.inject_stateful_hyperparams(ft.sgd)(learning_rate=0.1, momentum=0.5)
    params = [jnp.zeros(1)]
    state = opt.init(params)
    state.hyperparams["learning_rate"] = 1.0
    u, state = opt.update([jnp.ones(1)], state)
    np.testing.assert_allclose(u[0], [-1.0])
    state.hyperparams["nesterov_typo"] = 1.0
    with pytest.raises(ValueError, match="inject_stateful_hyperparams: the state holds"):
        opt.update([jnp.ones(1)], state)
    with pytest.raises(ValueError, match="static_args"):
        ft.inject_stateful_hyperparams(ft.sgd, static_args="nope")
    with pytest.raises(TypeError, match="WrappedSchedule: schedule_fn must be a function"):
        ft.WrappedSchedule(0.1)


def test_inject_stateful_hyperparams_compiles_once():
    # bfloat16 params would round b2=0.999 to 1.0 (optax's default dtype): float32 asked for.
    opt = ft.inject_stateful_hyperparams(ft.adam, hyperparam_dtype=jnp.float32)(
        learning_rate=HalveOnPlateau(0.1))
    params = {"w": jnp.ones(3, jnp.bfloat16)}
    state = opt.init(params)
    step = jax.jit(lambda p, s, g: opt.update(g, s, p, value=jnp.sum(g["w"])))
    for _ in range(3):
        _, state = step(params, state, {"w": jnp.ones(3, jnp.bfloat16)})
    assert step._cache_size() == 1
    assert state.hyperparams["learning_rate"].dtype == jnp.float32


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_default_hyperparam_dtype_and_weak_types_are_optax(dtype):
    """The params' highest dtype, strongly typed; integers and fixed-dtype arrays as given."""
    params = [jnp.ones((1, 2), dtype), jnp.ones(2, dtype)]
    kwargs = dict(learning_rate=lambda count: 0.1 / (count + 1), b1=0.9,
                  b2=jnp.asarray(0.95, jnp.bfloat16), eps=jnp.asarray(1e-3), eps_root=0)
    states = []
    for m in (optax, ft):
        opt = m.inject_hyperparams(m.adam)(**kwargs)
        state = opt.init(params)
        _, state = jax.jit(opt.update)(params, state, params)  # one step: schedules' values
        states.append({k: (v.dtype, v.weak_type) for k, v in state.hyperparams.items()})
    assert states[0] == states[1]
    assert states[1]["b1"] == (jnp.dtype(dtype), False)
    assert states[1]["eps_root"] == (jnp.dtype(jnp.int32), True)


class RunningTotal:
    """optax's test schedule: its state is a NamedTuple-like dict summed from an extra arg."""

    def init(self):
        return {"total": jnp.zeros([], jnp.float32)}

    def update(self, state, addendum=None, **extra):
        return {"total": state["total"] + addendum}

    def __call__(self, state, **extra):
        return state["total"]


def test_inject_hyperparams_takes_a_stateful_schedule_as_optax():
    # optax 0.2.8's inject_hyperparams keeps a StatefulSchedule's state (it used to
    # be called with the step count: "DynamicJaxprTracer has no attribute total").
    params = (jnp.ones(3), jnp.ones(2))
    out = {}
    for m in (optax, ft):
        tx = m.inject_hyperparams(m.scale)(step_size=RunningTotal())
        state = jax.jit(tx.init)(params)
        step = jax.jit(lambda g, s: tx.update(g, s, params, addendum=jnp.asarray(0.3)))
        us = []
        for _ in range(3):
            u, state = step(params, state)
            us.append(u)
        out[m] = us, state
    (us1, s1), (us2, s2) = out[ft], out[optax]
    assert type(s1).__name__ == type(s2).__name__ == "InjectStatefulHyperparamsState"
    for a, b in zip(jax.tree_util.tree_leaves(us1), jax.tree_util.tree_leaves(us2)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(us1[1][0], 0.3 * np.ones(3), rtol=1e-6)  # step 2 uses total 0.3
    np.testing.assert_allclose(s1.hyperparams["step_size"], s2.hyperparams["step_size"])
    np.testing.assert_allclose(s1.hyperparams_states["step_size"]["total"], 0.9, rtol=1e-6)


@pytest.mark.parametrize("inject", ["inject_hyperparams", "inject_stateful_hyperparams"])
@pytest.mark.parametrize("hyperparam_dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("param_dtype", [jnp.float32, jnp.bfloat16])
def test_hyperparam_dtype_gives_that_dtype_as_optax(inject, hyperparam_dtype, param_dtype):
    # A number, a schedule returning a Python float and one returning a weakly typed
    # array are all stored in hyperparam_dtype, after init and after update.
    params = [jnp.ones((1, 2), param_dtype), jnp.ones(2, param_dtype)]
    dtypes = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for m in (optax, ft):
            opt = getattr(m, inject)(m.scale_by_adam, hyperparam_dtype=hyperparam_dtype)(
                b1=0.9, b2=lambda count: 0.95, eps=lambda count: jnp.asarray(1e-3))
            state = jax.jit(opt.init)(params)
            new = jax.jit(opt.update)([p.astype(jnp.float32) for p in params], state)[1]
            dtypes[m] = [{k: v.dtype for k, v in s.hyperparams.items()} for s in (state, new)]
    assert dtypes[ft] == dtypes[optax]
    assert dtypes[ft][1] == {k: jnp.dtype(hyperparam_dtype) for k in
                             ("b1", "b2", "eps", "eps_root")}


@pytest.mark.parametrize("params, expected", [
    ([jnp.ones(2, jnp.complex64)], jnp.float32),  # optax: complex64 hyperparameters
    ([jnp.ones(2, jnp.bfloat16), jnp.ones(2, jnp.float16)], jnp.float32),  # optax raises
    ([jnp.ones(2, jnp.int32)], jnp.float32),  # optax: learning rate rounded to int 0
], ids=["complex", "bfloat16_and_float16", "integers"])
def test_default_hyperparam_dtype_is_a_real_float(params, expected):
    """Where optax's rule gives no real float dtype, a real float (never a rounded rate)."""
    def factory(learning_rate):  # any params: a transformation that checks none
        return ft.identity()
    state = ft.inject_hyperparams(factory)(learning_rate=0.1).init(params)
    assert state.hyperparams["learning_rate"].dtype == expected
    np.testing.assert_allclose(state.hyperparams["learning_rate"], 0.1, rtol=1e-7)
