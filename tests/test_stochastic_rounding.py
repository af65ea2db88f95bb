"""functrain.apply_updates_stochastic: bfloat16 parameters with stochastic rounding.

The expectations are derived by hand: a float32 sum ``x`` strictly between two
neighbouring bfloat16 values ``lo < x < hi`` must round to ``hi`` with probability
``(x - lo) / (hi - lo)`` (so ``E[result] = x``), to ``lo`` otherwise, and never to anything
else; a representable ``x`` is kept exactly. The statistical bounds are 5 standard errors
(a correct rounding fails one with probability below 1e-6; the keys are fixed, so the
results are deterministic), and the last test checks that round-to-nearest fails them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import functrain

BF16 = ml_dtypes.bfloat16
N = 200_000

# (param, update, lower neighbour, upper neighbour) with the neighbours worked out by hand
# from bfloat16's 8 significant bits: the spacing in [2**e, 2**(e+1)) is 2**(e-7).
CASES = [
    # in [1, 2): spacing 2**-7; 1 + 0.3 * 2**-7 lies 30% of the way up
    (1.0, 0.3 * 2.0 ** -7, 1.0, 1.0 + 2.0 ** -7),
    # the last value below 2: the upper neighbour is the next binade's first, 2.0
    (2.0 - 2.0 ** -7, 0.25 * 2.0 ** -7, 2.0 - 2.0 ** -7, 2.0),
    # negative, in [2, 4) by magnitude: spacing 2**-6; 90% of the way to -3 - 2**-6
    (-3.0, -0.9 * 2.0 ** -6, -3.0 - 2.0 ** -6, -3.0),
    # small: in [2**-10, 2**-9) the spacing is 2**-17
    (2.0 ** -10, 0.5 * 2.0 ** -17, 2.0 ** -10, 2.0 ** -10 + 2.0 ** -17),
    # an update far below the parameter's spacing: 1e-3 / 2**-7 = 12.8% of the way up
    (1.0, 1e-3, 1.0, 1.0 + 2.0 ** -7),
    # from zero: float32(1e-3) = 2**-10 * (1 + 0.024) lies between 2**-10 + 3 * 2**-17
    # and 2**-10 + 4 * 2**-17
    (0.0, 1e-3, 2.0 ** -10 + 3 * 2.0 ** -17, 2.0 ** -10 + 4 * 2.0 ** -17),
]


def round_many(param: float, update: float, key: jax.Array = None, n: int = N,
               fn=None) -> np.ndarray:
    key = jax.random.key(0) if key is None else key
    params = {"w": jnp.full(n, param, jnp.bfloat16)}
    updates = {"w": jnp.full(n, update, jnp.float32)}
    if fn is None:
        out = functrain.apply_updates_stochastic(params, updates, key)
    else:
        out = fn(params, updates)
    assert out["w"].dtype == jnp.bfloat16
    return np.asarray(out["w"]).astype(np.float64)


def check_unbiased(got: np.ndarray, x: float, lo: float, hi: float) -> None:
    """Only lo or hi; the fraction of hi and the mean within 5 standard errors of theory."""
    assert set(np.unique(got)) <= {lo, hi}, np.unique(got)
    p_hi = (x - lo) / (hi - lo)
    assert 0.0 < p_hi < 1.0
    se = np.sqrt(p_hi * (1 - p_hi) / got.size)
    frac = np.mean(got == hi)
    assert abs(frac - p_hi) < 5 * se, (frac, p_hi, se)
    assert abs(got.mean() - x) < 5 * se * (hi - lo), (got.mean(), x)


@pytest.mark.parametrize("param,update,lo,hi", CASES)
def test_unbiased_between_the_two_neighbours(param, update, lo, hi):
    assert float(BF16(lo)) == lo and float(BF16(hi)) == hi       # the table's neighbours
    assert np.nextafter(BF16(lo), BF16(hi)) == BF16(hi)           # ... are adjacent
    x = float(np.float32(param) + np.float32(update))             # the float32 sum
    assert lo < x < hi
    check_unbiased(round_many(param, update), x, lo, hi)


@pytest.mark.parametrize("n", [N + 1, 1])
def test_unbiased_for_odd_and_scalar_leaves(n):
    # Leaves with an even last dimension take two draws per 32-bit word; odd ones and
    # scalars one 16-bit draw each: both unbiased. Scalars: many keys, one value each.
    param, update, lo, hi = CASES[0]
    x = float(np.float32(param) + np.float32(update))
    if n > 1:
        got = round_many(param, update, n=n)
    else:
        keys = jax.random.split(jax.random.key(4), 20_000)
        fn = jax.jit(jax.vmap(lambda k: functrain.apply_updates_stochastic(
            jnp.asarray(param, jnp.bfloat16), jnp.asarray(update, jnp.float32), k)))
        got = np.asarray(fn(keys)).astype(np.float64)
    check_unbiased(got, x, lo, hi)


def test_sharded_params_keep_their_layout_and_numbers():
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    rng = np.random.default_rng(6)
    params = jnp.asarray(rng.standard_normal((8, 6)), jnp.bfloat16)
    updates = jnp.asarray(rng.standard_normal((8, 6)) * 1e-3, jnp.float32)
    want = functrain.apply_updates_stochastic(params, updates, jax.random.key(2))
    for axis_type in (AxisType.Explicit, AxisType.Auto):
        mesh = jax.make_mesh((1,), ("data",), axis_types=(axis_type,))
        sharding = NamedSharding(mesh, P("data"))
        got = jax.jit(functrain.apply_updates_stochastic)(
            jax.device_put(params, sharding), jax.device_put(updates, sharding),
            jax.random.key(2))
        assert got.sharding.is_equivalent_to(sharding, 2)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_round_to_nearest_fails_the_unbiasedness_check():
    # The check above can fail: apply_updates (round to nearest) never moves 1.0 by 1e-3.
    param, update, lo, hi = CASES[4]
    got = round_many(param, update, fn=functrain.apply_updates)
    x = float(np.float32(param) + np.float32(update))
    with pytest.raises(AssertionError):
        check_unbiased(got, x, lo, hi)


def test_results_are_always_one_of_the_two_neighbours():
    rng = np.random.default_rng(0)
    n = 50_000
    p = (rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 3, n)).astype(BF16)
    u = (rng.standard_normal(n) * 10.0 ** rng.uniform(-9, 1, n)).astype(np.float32)
    got = np.asarray(functrain.apply_updates_stochastic(
        jnp.asarray(p), jnp.asarray(u), jax.random.key(1)))
    x = p.astype(np.float32) + u                                  # the exact float32 sum
    nearest = x.astype(BF16)
    other = np.nextafter(nearest, np.where(x > nearest.astype(np.float32), BF16(np.inf),
                                           BF16(-np.inf)).astype(BF16))
    exact = nearest.astype(np.float32) == x
    lo = np.minimum(nearest.astype(np.float64), other.astype(np.float64))
    hi = np.maximum(nearest.astype(np.float64), other.astype(np.float64))
    g = got.astype(np.float64)
    assert np.all(exact | (lo <= x) & (x <= hi))                  # the neighbours bracket x
    assert np.all(np.where(exact, g == x, (g == lo) | (g == hi)))
    # The farther neighbour is taken with probability (distance to the nearest) / spacing:
    # the count of such choices is within 5 standard errors of the sum of those.
    p_far = np.where(exact, 0.0, np.abs(x - nearest.astype(np.float64)) / (hi - lo))
    far = ~exact & (got != nearest)
    expected, se = p_far.sum(), np.sqrt(np.sum(p_far * (1 - p_far)))
    assert abs(far.sum() - expected) < 5 * se, (far.sum(), expected, se)
    assert far.sum() > 1000


def test_exact_when_representable():
    # Sums that bfloat16 holds exactly come back unchanged, whatever the key.
    p = jnp.asarray([1.0, -3.0, 0.5, 0.0, 256.0, 2.0 ** -100], jnp.bfloat16)
    u = jnp.asarray([2.0 ** -7, 2.0 ** -6, -0.25, -1.5, 2.0, 0.0], jnp.float32)
    want = np.asarray(p, np.float32) + np.asarray(u)
    for seed in range(20):
        got = functrain.apply_updates_stochastic(p, u, jax.random.key(seed))
        np.testing.assert_array_equal(np.asarray(got, np.float32), want)
    zero = functrain.apply_updates_stochastic(p, jnp.zeros(6), jax.random.key(3))
    np.testing.assert_array_equal(np.asarray(zero), np.asarray(p))


def test_infinities_and_nans_pass_through():
    p = jnp.asarray([np.inf, -np.inf, np.nan, 1.0, 3e38], jnp.bfloat16)
    u = jnp.asarray([1.0, -1.0, 0.0, np.nan, 0.0], jnp.float32)
    got = np.asarray(functrain.apply_updates_stochastic(p, u, jax.random.key(0)), np.float32)
    assert got[0] == np.inf and got[1] == -np.inf
    assert np.isnan(got[2]) and np.isnan(got[3])
    assert got[4] == np.float32(BF16(3e38))                       # representable: kept


def test_other_dtypes_get_apply_updates_exactly():
    rng = np.random.default_rng(2)
    params = {"f32": jnp.asarray(rng.standard_normal((4, 5)), jnp.float32),
              "f16": jnp.asarray(rng.standard_normal(7), jnp.float16),
              "f64": np.asarray(rng.standard_normal(3)),
              "bf16": jnp.asarray(rng.standard_normal(6), jnp.bfloat16),
              "none": None}
    updates = {k: (None if v is None else jnp.asarray(rng.standard_normal(np.shape(v)) * 1e-3,
                                                      jnp.float32))
               for k, v in params.items()}
    got = functrain.apply_updates_stochastic(params, updates, jax.random.key(0))
    want = functrain.apply_updates(params, updates)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert got["none"] is None
    for k in ("f32", "f16", "f64"):
        assert got[k].dtype == want[k].dtype
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]), err_msg=k)
    assert got["bf16"].dtype == jnp.bfloat16
    assert functrain.apply_updates_stochastic(None, None, jax.random.key(0)) is None


def test_bf16_updates_and_bf16_params():
    # bfloat16 updates (a bf16 model's gradients) are added in float32 as well.
    p = jnp.full(N, 1.0, jnp.bfloat16)
    u = jnp.full(N, 1e-3, jnp.bfloat16)                           # bf16(1e-3) = 0.00100708
    x = float(np.float32(1.0) + np.float32(BF16(1e-3)))
    got = np.asarray(functrain.apply_updates_stochastic(p, u, jax.random.key(5)), np.float64)
    check_unbiased(got, x, 1.0, 1.0 + 2.0 ** -7)


def test_jit_and_keys():
    params = {"a": jnp.ones(4096, jnp.bfloat16), "b": jnp.ones(4096, jnp.bfloat16)}
    updates = {"a": jnp.full(4096, 1e-3), "b": jnp.full(4096, 1e-3)}
    key = jax.random.key(7)
    eager = functrain.apply_updates_stochastic(params, updates, key)
    jitted = jax.jit(functrain.apply_updates_stochastic)(params, updates, key)
    for k in params:
        np.testing.assert_array_equal(np.asarray(eager[k]), np.asarray(jitted[k]))
    # The same key gives the same rounding; another key another one; each leaf its own key.
    again = functrain.apply_updates_stochastic(params, updates, key)
    assert all(np.array_equal(np.asarray(eager[k]), np.asarray(again[k])) for k in params)
    other = functrain.apply_updates_stochastic(params, updates, jax.random.key(8))
    assert not np.array_equal(np.asarray(eager["a"]), np.asarray(other["a"]))
    assert not np.array_equal(np.asarray(eager["a"]), np.asarray(eager["b"]))
    # Raw uint32[2] keys (jax.random.PRNGKey) work too, under jit as well.
    raw = jax.jit(functrain.apply_updates_stochastic)(params, updates, jax.random.PRNGKey(7))
    assert set(np.unique(np.asarray(raw["a"], np.float32))) <= {1.0, 1.0 + 2 ** -7}


@pytest.mark.parametrize("key,got", [
    (0, "int"),
    (jnp.zeros(3, jnp.uint32), r"uint32\[3\]"),
    (jnp.zeros(2, jnp.float32), r"float32\[2\]"),
    (jax.random.split(jax.random.key(0), 2), r"key<fry>\[2\]"),
    (None, "NoneType"),
])
def test_a_bad_key_is_named(key, got):
    with pytest.raises(TypeError, match=r"apply_updates_stochastic: key must be one PRNG "
                                        r"key .*got " + got):
        functrain.apply_updates_stochastic({"w": jnp.ones(2, jnp.bfloat16)},
                                           {"w": jnp.ones(2)}, key)


def test_bad_trees_are_named_as_apply_updates_does():
    params = {"w": jnp.ones(3, jnp.bfloat16)}
    with pytest.raises(ValueError, match="updates"):
        functrain.apply_updates_stochastic(params, {"v": jnp.ones(3)}, jax.random.key(0))
    with pytest.raises(ValueError, match=r"\['w'\]"):
        functrain.apply_updates_stochastic(params, {"w": jnp.ones(4)}, jax.random.key(0))


def test_the_benchmark_shows_the_difference():
    """benchmarks/stochastic_rounding.py on a short run: round-to-nearest stalls with Adam
    at lr 1e-3 on bfloat16 weights; stochastic rounding and compensated weights track
    float32."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "stochastic_rounding.py"
    spec = importlib.util.spec_from_file_location("_stochastic_rounding_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = {r["mode"]: r for r in bench.run(steps=400, settings=(("adam", 1e-3),))}
    start, end = "loss@0", "loss@400"
    f32, rtn, sr, comp = (rows[m][end] for m in ("float32", "bf16 nearest", "bf16 stochastic",
                                                  "bf16 compensated"))
    assert comp < 1.5 * f32  # the compensated bfloat16 weights track float32 too
    assert rows["bf16 stochastic"][start] == rows["bf16 nearest"][start]
    np.testing.assert_allclose(rows["float32"][start], rows["bf16 nearest"][start], rtol=1e-2)
    assert rtn > 0.7 * rows["bf16 nearest"][start]        # barely moved
    assert sr < 1.5 * f32 and f32 < 0.5 * rows["float32"][start]
    assert rows["bf16 stochastic"]["weights changed"] > 0.9 * 64
    assert rows["bf16 nearest"]["weights changed"] < 64
