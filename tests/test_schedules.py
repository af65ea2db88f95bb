"""Tests for functrain.schedules: parity with optax 0.2.8, hand-written formulas, errors."""

import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from functrain import schedules as fs

RTOL = 1e-6  # float32 parity with optax.

# Counts at which every schedule is compared: before the start (negative),
# through every transition used below, and far past the end.
COUNTS = (list(range(-3, 125)) + [150, 199, 200, 201, 250, 999, 1000, 1001,
                                  10**6, 2**31 - 1])
FLOAT_COUNTS = [0.5, 2.5, 4.75, 9.5, 37.25, 99.5, 1000.5]

# Each case builds the same schedule from a library (functrain.schedules or
# optax); `lib` is the module, so join_schedules gets each library's own parts.
CASES = {
    'constant_float': lambda lib: lib.constant_schedule(0.1),
    'constant_int': lambda lib: lib.constant_schedule(3),
    'constant_array': lambda lib: lib.constant_schedule(jnp.array(-2.5)),
    'poly_default_begin': lambda lib: lib.polynomial_schedule(1.0, 0.01, 2, 100),
    'poly_begin': lambda lib: lib.polynomial_schedule(
        init_value=1.0, end_value=0.01, power=2, transition_steps=100,
        transition_begin=5),
    'poly_increasing_sqrt': lambda lib: lib.polynomial_schedule(
        0.5, 2.0, 0.5, 37, transition_begin=3),
    'poly_negative_begin': lambda lib: lib.polynomial_schedule(
        1.0, 0.0, 3, 10, transition_begin=-4),
    'poly_zero_steps': lambda lib: lib.polynomial_schedule(2.0, 1.0, 1.5, 0),
    'poly_negative_steps': lambda lib: lib.polynomial_schedule(2.0, 1.0, 2, -3),
    'linear': lambda lib: lib.linear_schedule(1.0, 0.01, 100),
    'linear_begin_up': lambda lib: lib.linear_schedule(
        init_value=0.0, end_value=1.0, transition_steps=50, transition_begin=10),
    'linear_negative_begin': lambda lib: lib.linear_schedule(3.0, -1.0, 7, -2),
    'linear_zero_steps': lambda lib: lib.linear_schedule(1.0, 0.0, 0),
    'cosine': lambda lib: lib.cosine_decay_schedule(1.0, 100),
    'cosine_alpha': lambda lib: lib.cosine_decay_schedule(0.5, 37, alpha=0.1),
    'cosine_alpha_exponent': lambda lib: lib.cosine_decay_schedule(
        init_value=2.0, decay_steps=20, alpha=0.3, exponent=2.0),
    'cosine_long_sqrt': lambda lib: lib.cosine_decay_schedule(
        1.0, 1000, exponent=0.5),
    'warmup_cosine': lambda lib: lib.warmup_cosine_decay_schedule(
        0.0, 1.0, 10, 100),
    'warmup_cosine_end': lambda lib: lib.warmup_cosine_decay_schedule(
        init_value=0.1, peak_value=1.0, warmup_steps=5, decay_steps=50,
        end_value=0.05),
    'warmup_cosine_no_warmup': lambda lib: lib.warmup_cosine_decay_schedule(
        0.0, 2.0, 0, 30, end_value=0.2, exponent=2.0),
    'warmup_cosine_zero_peak': lambda lib: lib.warmup_cosine_decay_schedule(
        0.3, 0.0, 5, 20, end_value=0.1),
    'warmup_constant': lambda lib: lib.warmup_constant_schedule(0.0, 1.0, 10),
    'warmup_constant_down': lambda lib: lib.warmup_constant_schedule(
        init_value=2.0, peak_value=0.5, warmup_steps=3),
    'warmup_constant_zero_steps': lambda lib: lib.warmup_constant_schedule(
        0.1, 1.0, 0),
    'exp': lambda lib: lib.exponential_decay(1.0, 10, 0.5),
    'exp_staircase_begin': lambda lib: lib.exponential_decay(
        init_value=1.0, transition_steps=10, decay_rate=0.5,
        transition_begin=5, staircase=True),
    'exp_lower_bound': lambda lib: lib.exponential_decay(
        1.0, 7, 0.9, end_value=0.6),
    'exp_growth_upper_bound': lambda lib: lib.exponential_decay(
        0.1, 5, 1.5, transition_begin=3, end_value=0.5),
    'exp_staircase_bound': lambda lib: lib.exponential_decay(
        2.0, 4, 0.25, staircase=True, end_value=0.2),
    'exp_negative_begin': lambda lib: lib.exponential_decay(
        1.0, 10, 0.5, transition_begin=-3),
    'exp_zero_steps': lambda lib: lib.exponential_decay(1.0, 0, 0.5),
    'exp_zero_rate': lambda lib: lib.exponential_decay(1.0, 10, 0.0),
    'piecewise': lambda lib: lib.piecewise_constant_schedule(
        1.0, {100: 0.1, 200: 0.01}),
    'piecewise_unsorted': lambda lib: lib.piecewise_constant_schedule(
        init_value=0.5, boundaries_and_scales={10: 0.5, 3: 2.0, 7: 0.25}),
    'piecewise_zero_boundary_and_scale': lambda lib:
        lib.piecewise_constant_schedule(1.5, {0: 0.5, 5: 0.0}),
    'piecewise_none': lambda lib: lib.piecewise_constant_schedule(2.0),
    'piecewise_empty': lambda lib: lib.piecewise_constant_schedule(2.0, {}),
    'join_three': lambda lib: lib.join_schedules(
        [lib.constant_schedule(1.0), lib.linear_schedule(1.0, 0.0, 10),
         lib.cosine_decay_schedule(0.5, 20)], [5, 15]),
    'join_exp_poly': lambda lib: lib.join_schedules(
        schedules=[lib.exponential_decay(1.0, 3, 0.7),
                   lib.polynomial_schedule(0.3, 0.0, 2, 40, 2)],
        boundaries=[7]),
}


def _assert_close(ours, theirs, context):
  np.testing.assert_allclose(np.asarray(ours, np.float32),
                             np.asarray(theirs, np.float32),
                             rtol=RTOL, atol=0, err_msg=context)


@pytest.mark.parametrize('case', sorted(CASES))
def test_matches_optax_python_int_counts(case):
  ours, theirs = CASES[case](fs), CASES[case](optax)
  for count in COUNTS:
    _assert_close(ours(count), theirs(count), f'{case} count={count}')


@pytest.mark.parametrize('case', sorted(CASES))
def test_matches_optax_array_counts(case):
  ours, theirs = CASES[case](fs), CASES[case](optax)
  for counts in (jnp.array(COUNTS, jnp.int32),
                 jnp.array(FLOAT_COUNTS, jnp.float32)):
    _assert_close(ours(counts), theirs(counts), f'{case} counts={counts}')
    _assert_close(ours(counts[7]), theirs(counts[7]), f'{case} scalar array')


@pytest.mark.parametrize('case', sorted(CASES))
def test_matches_optax_under_jit(case):
  ours = jax.jit(CASES[case](fs))
  theirs = jax.jit(CASES[case](optax))
  for count in COUNTS:
    count = jnp.int32(count)
    out = ours(count)
    assert jnp.shape(out) == ()
    _assert_close(out, theirs(count), f'{case} jit count={count}')


def _check(schedule, reference, counts, scale=1.0):
  """Compares with a float64 formula; atol covers float32 cancellation."""
  for count in counts:
    for c in (count, jnp.int32(count)):
      np.testing.assert_allclose(float(schedule(c)), reference(count),
                                 rtol=1e-5, atol=1e-6 * scale,
                                 err_msg=f'count={count}')
    np.testing.assert_allclose(float(jax.jit(schedule)(jnp.int32(count))),
                               reference(count), rtol=1e-5, atol=1e-6 * scale)


def test_constant_by_hand():
  value = jnp.array([0.25])[0]
  assert fs.constant_schedule(value)(17) is value  # returned unchanged
  assert fs.constant_schedule(0.25)(17) == 0.25
  assert float(jax.jit(fs.constant_schedule(0.25))(jnp.int32(3))) == 0.25


def test_polynomial_by_hand():
  init, end, power, steps, begin = 2.0, 0.5, 3.0, 40, 6
  def ref(t):
    if t <= begin:
      return init
    if t >= begin + steps:
      return end
    return end + (init - end) * (1.0 - (t - begin) / steps) ** power
  sched = fs.polynomial_schedule(init, end, power, steps, begin)
  _check(sched, ref, [0, 3, 6, 7, 20, 45, 46, 47, 500])


def test_linear_by_hand():
  sched = fs.linear_schedule(0.2, 1.0, transition_steps=8, transition_begin=2)
  ref = lambda t: 0.2 + 0.8 * min(max(t - 2, 0), 8) / 8
  _check(sched, ref, [0, 2, 3, 6, 10, 11, 99])
  assert float(sched(6)) == pytest.approx(0.6)


def test_cosine_by_hand():
  init, steps, alpha, exponent = 3.0, 25, 0.2, 1.5
  def ref(t):
    t = min(t, steps)
    c = 0.5 * (1.0 + math.cos(math.pi * t / steps))
    return init * (alpha + (1.0 - alpha) * c ** exponent)
  sched = fs.cosine_decay_schedule(init, steps, alpha, exponent)
  _check(sched, ref, [0, 1, 12, 24, 25, 26, 1000], scale=init)
  assert float(sched(25)) == pytest.approx(init * alpha)


def test_cosine_negative_count_mirrors_like_optax():
  # optax does not clip the count from below; cos is even.
  sched = fs.cosine_decay_schedule(1.0, 10)
  assert float(sched(-3)) == pytest.approx(float(sched(3)))
  assert float(sched(-3)) < 1.0


def test_warmup_cosine_by_hand():
  init, peak, warmup, total, end, exponent = 0.1, 2.0, 8, 40, 0.3, 2.0
  def ref(t):
    if t < warmup:
      return init + (peak - init) * max(t, 0) / warmup
    t = min(t - warmup, total - warmup)
    c = 0.5 * (1.0 + math.cos(math.pi * t / (total - warmup)))
    return end + (peak - end) * c ** exponent
  sched = fs.warmup_cosine_decay_schedule(init, peak, warmup, total, end,
                                          exponent)
  _check(sched, ref, [0, 4, 7, 8, 9, 24, 39, 40, 41, 900], scale=peak)


def test_warmup_constant_by_hand():
  sched = fs.warmup_constant_schedule(0.5, 1.5, 4)
  _check(sched, lambda t: 0.5 + min(t, 4) / 4, [0, 1, 2, 3, 4, 5, 10**5])


def test_exponential_by_hand():
  init, steps, rate, begin, end = 2.0, 6, 0.8, 4, 0.9
  def ref(t, staircase):
    if t <= begin:
      value = init
    else:
      p = (t - begin) / steps
      value = init * rate ** (math.floor(p) if staircase else p)
    return max(value, end)
  counts = [0, 4, 5, 9, 10, 11, 16, 17, 30, 100]
  for staircase in (False, True):
    sched = fs.exponential_decay(init, steps, rate, begin, staircase, end)
    _check(sched, lambda t, s=staircase: ref(t, s), counts)
  growth = fs.exponential_decay(1.0, 2, 3.0, end_value=20.0)
  _check(growth, lambda t: min(3.0 ** (t / 2), 20.0), [0, 1, 2, 5, 6, 7, 50])


def test_piecewise_constant_by_hand():
  table = {30: 0.5, 10: 3.0, 20: 0.1}
  def ref(t):
    return 4.0 * math.prod(s for b, s in table.items() if t >= b)
  sched = fs.piecewise_constant_schedule(4.0, table)
  _check(sched, ref, [0, 9, 10, 11, 19, 20, 29, 30, 31, 1000])


def test_join_passes_count_minus_boundary():
  seen = lambda offset: (lambda c: jnp.asarray(c, jnp.float32) + offset)
  sched = fs.join_schedules([seen(1000.0), seen(2000.0), seen(3000.0)],
                            [5, 12])
  ref = lambda t: 1000.0 + t if t < 5 else (
      2000.0 + t - 5 if t < 12 else 3000.0 + t - 12)
  _check(sched, ref, [0, 4, 5, 6, 11, 12, 13, 100], scale=1000.0)


def test_python_int_counts_past_int32():
  # optax overflows int32 here for polynomial schedules; functrain does not.
  big = 2**40
  assert float(fs.linear_schedule(1.0, 0.25, 10)(big)) == 0.25
  assert float(fs.polynomial_schedule(1.0, 0.5, 2, 10, 3)(big)) == 0.5
  assert float(fs.cosine_decay_schedule(1.0, 10, alpha=0.5)(big)) == 0.5
  assert float(fs.exponential_decay(1.0, 10, 0.5, end_value=0.1)(big)) == (
      pytest.approx(0.1))


@pytest.mark.parametrize('decay_steps', [0, -5])
def test_cosine_rejects_non_positive_decay_steps(decay_steps):
  with pytest.raises(ValueError, match='decay_steps'):
    fs.cosine_decay_schedule(1.0, decay_steps)
  with pytest.raises(ValueError):  # optax raises too.
    optax.cosine_decay_schedule(1.0, decay_steps)


@pytest.mark.parametrize('warmup, total', [(10, 10), (10, 4)])
def test_warmup_cosine_rejects_decay_not_after_warmup(warmup, total):
  with pytest.raises(ValueError, match='decay_steps'):
    fs.warmup_cosine_decay_schedule(0.0, 1.0, warmup, total)
  with pytest.raises(ValueError):
    optax.warmup_cosine_decay_schedule(0.0, 1.0, warmup, total)


@pytest.mark.parametrize('scale', [-0.1, float('nan')])
def test_piecewise_rejects_negative_scales(scale):
  table = {5: 0.5, 10: scale}
  with pytest.raises(ValueError, match='boundaries_and_scales'):
    fs.piecewise_constant_schedule(1.0, table)
  with pytest.raises(ValueError):
    optax.piecewise_constant_schedule(1.0, table)


@pytest.mark.parametrize('make, words', [
    (lambda: fs.polynomial_schedule(1.0, 0.0, 2, 0), '`transition_steps`'),
    (lambda: fs.linear_schedule(1.0, 0.0, -1), '`transition_steps`'),
    (lambda: fs.polynomial_schedule(1.0, 0.0, 2, 5, -1), '`transition_begin`'),
    (lambda: fs.exponential_decay(1.0, 0, 0.5), '`transition_steps`'),
    (lambda: fs.exponential_decay(1.0, 5, 0.0), '`decay_rate`'),
    (lambda: fs.exponential_decay(1.0, 5, 0.5, -2), '`transition_begin`'),
])
def test_info_logged_when_arguments_are_replaced(make, words, caplog):
  with caplog.at_level(logging.INFO):
    make()
  assert any(words in r.getMessage() for r in caplog.records
             if r.name == 'absl' and r.levelno == logging.INFO)


def test_no_info_logged_for_valid_arguments(caplog):
  with caplog.at_level(logging.INFO):
    fs.polynomial_schedule(1.0, 0.0, 2, 5, 1)
    fs.exponential_decay(1.0, 5, 0.5, 1)
  assert not [r for r in caplog.records if r.name == 'absl']


def test_join_rejects_mismatched_lengths():
  """A boundary list that does not fit the schedules is an error, not ignored."""
  with pytest.raises(ValueError, match='one shorter'):
    fs.join_schedules([fs.constant_schedule(1.0)] * 2, [5, 10])
  with pytest.raises(ValueError, match='one shorter'):
    fs.join_schedules([fs.constant_schedule(1.0)] * 3, [5])


# --------------------------------------------------------------------------
# piecewise_interpolate, one-cycle, warmup_exponential_decay, sgdr: against optax
# --------------------------------------------------------------------------

NEW_CASES = {
    'interp_linear': lambda lib: lib.piecewise_interpolate_schedule(
        'linear', 1.0, {4: 0.1, 8: 0.01}),
    'interp_cosine_unsorted': lambda lib: lib.piecewise_interpolate_schedule(
        interpolate_type='cosine', init_value=0.5,
        boundaries_and_scales={50: 0.5, 10: 3.0, 120: 0.0}),
    'interp_zero_boundary': lambda lib: lib.piecewise_interpolate_schedule(
        'linear', 2.0, {0: 0.5, 7: 4.0}),
    'interp_none': lambda lib: lib.piecewise_interpolate_schedule('cosine', 0.3),
    'onecycle_linear': lambda lib: lib.linear_onecycle_schedule(100, 1.0),
    'onecycle_linear_args': lambda lib: lib.linear_onecycle_schedule(
        transition_steps=37, peak_value=0.1, pct_start=0.2, pct_final=0.7,
        div_factor=10.0, final_div_factor=100.0),
    'onecycle_cosine': lambda lib: lib.cosine_onecycle_schedule(200, 0.5),
    'onecycle_cosine_args': lambda lib: lib.cosine_onecycle_schedule(
        transition_steps=50, peak_value=2.0, pct_start=0.5, div_factor=4.0,
        final_div_factor=10.0),
    'warmup_exp': lambda lib: lib.warmup_exponential_decay_schedule(
        0.0, 1.0, 10, 20, 0.5),
    'warmup_exp_all_args': lambda lib: lib.warmup_exponential_decay_schedule(
        init_value=0.1, peak_value=2.0, warmup_steps=5, transition_steps=7,
        decay_rate=0.8, transition_begin=3, staircase=True, end_value=0.5),
    'warmup_exp_growth': lambda lib: lib.warmup_exponential_decay_schedule(
        0.5, 0.2, 3, 10, 1.5, end_value=1.0),
    'sgdr': lambda lib: lib.sgdr_schedule([
        dict(init_value=0.0, peak_value=1.0, warmup_steps=5, decay_steps=40),
        dict(init_value=0.1, peak_value=0.5, warmup_steps=0, decay_steps=30,
             end_value=0.05),
        dict(init_value=0.0, peak_value=0.2, warmup_steps=10, decay_steps=60,
             exponent=2.0)]),
    'sgdr_one_cycle': lambda lib: lib.sgdr_schedule(
        [dict(init_value=0.0, peak_value=1.0, warmup_steps=3, decay_steps=20)]),
}


@pytest.mark.parametrize('case', sorted(NEW_CASES))
def test_new_schedules_match_optax(case):
  ours, theirs = NEW_CASES[case](fs), NEW_CASES[case](optax)
  for count in COUNTS:  # every boundary above lies on this grid
    _assert_close(ours(count), theirs(count), f'{case} count={count}')
  # optax's piecewise_interpolate takes scalar counts only: vmap it for arrays.
  for counts in (jnp.array(COUNTS, jnp.int32), jnp.array(FLOAT_COUNTS, jnp.float32)):
    _assert_close(ours(counts), jax.vmap(theirs)(counts), f'{case} counts={counts}')
  jitted, their_jit = jax.jit(ours), jax.jit(theirs)
  for count in COUNTS[:140:3] + COUNTS[-4:]:
    out = jitted(jnp.int32(count))
    assert jnp.shape(out) == ()
    # Compiled, XLA may evaluate optax's vectorised cosine and ours a few ulp apart.
    np.testing.assert_allclose(out, their_jit(jnp.int32(count)), rtol=1e-5, atol=0,
                               err_msg=f'{case} jit count={count}')
  values = {float(ours(c)) for c in range(0, 200, 5)}
  assert len(values) > 1 or case == 'interp_none'


def test_piecewise_interpolate_by_hand():
  lin = fs.piecewise_interpolate_schedule('linear', 1.0, {4: 0.1, 8: 0.01})
  cos = fs.piecewise_interpolate_schedule('cosine', 1.0, {4: 0.1})
  _check(lin, lambda c: [1.0, 0.775, 0.55, 0.325, 0.1, 0.07525, 0.0505, 0.02575,
                         0.001, 0.001][c], range(10))
  _check(cos, lambda c: 0.1 + 0.45 * (1 + math.cos(math.pi * min(c, 4) / 4)),
         range(8))
  assert float(lin(-1)) == 0.0  # optax's value before step 0


def test_onecycle_by_hand():
  # linear: 0.04 -> 1.0 at step 30, back to 0.04 at 85, then to 4e-6 at 100.
  lin = fs.linear_onecycle_schedule(100, 1.0)
  _check(lin, lambda c: (0.04 + 0.96 * c / 30 if c <= 30 else
                         1.0 - 0.96 * (c - 30) / 55 if c <= 85 else
                         0.04 + (4e-6 - 0.04) * min(c - 85, 15) / 15),
         [0, 15, 30, 50, 85, 90, 100, 150])
  cos = fs.cosine_onecycle_schedule(10, 1.0, pct_start=0.5, div_factor=2.0,
                                    final_div_factor=5.0)
  _check(cos, lambda c: (1.0 + (0.5 - 1.0) / 2 * (1 + math.cos(math.pi * c / 5))
                         if c <= 5 else
                         0.1 + (1.0 - 0.1) / 2 * (1 + math.cos(math.pi * min(c - 5, 5) / 5))),
         range(13))


def test_warmup_exponential_and_sgdr_by_hand():
  sched = fs.warmup_exponential_decay_schedule(0.0, 1.0, 4, 2, 0.5)
  _check(sched, lambda c: c / 4 if c < 4 else 0.5 ** ((c - 4) / 2), range(12))
  cycle = dict(init_value=0.0, peak_value=1.0, warmup_steps=2, decay_steps=10)
  sgdr = fs.sgdr_schedule([cycle, cycle])
  single = fs.warmup_cosine_decay_schedule(**cycle)
  _check(sgdr, lambda c: float(single(c if c < 10 else c - 10)), range(25))


@pytest.mark.parametrize('make, words', [
    (lambda: fs.piecewise_interpolate_schedule('cubic', 1.0), 'interpolate_type'),
    (lambda: fs.piecewise_interpolate_schedule('linear', 1.0, {5: -0.5}),
     'non-negative'),
    (lambda: fs.linear_onecycle_schedule(0, 1.0), 'transition_steps'),
    (lambda: fs.cosine_onecycle_schedule(-3, 1.0), 'transition_steps'),
    (lambda: fs.sgdr_schedule([]), 'cosine_kwargs'),
    (lambda: fs.sgdr_schedule([dict(init_value=0.0, peak_value=1.0,
                                    warmup_steps=2)]), r'cosine_kwargs\[0\]'),
])
def test_new_schedules_errors_name_the_argument(make, words):
  with pytest.raises(ValueError, match=words):
    make()


# --------------------------------------------------------------------------
# Under jax_enable_x64: optax's dtype (and weak type) and numbers for every count type
# --------------------------------------------------------------------------

def _x64_counts():
  """Integer and float step counts, built inside ``enable_x64`` so int64/float64 exist."""
  return [0, 7, 130, 7.5, 130.25, np.int32(7), np.int64(130), np.float32(7.5),
          jnp.asarray(7, jnp.int32), jnp.asarray(130, jnp.int64), jnp.asarray(7),
          jnp.asarray(7.5, jnp.float32), jnp.asarray(130.25, jnp.float64),
          jnp.asarray(7.5, jnp.bfloat16), jnp.asarray([3, 7, 130], jnp.int32),
          jnp.asarray([3.5, 7.5, 130.25], jnp.float64)]


def _kind(value):
  return jnp.result_type(value), getattr(value, 'weak_type', None)


@pytest.mark.parametrize('case', sorted(CASES) + sorted(NEW_CASES))
def test_x64_dtype_and_values_match_optax(case):
  from functrain.jax_compat import enable_x64
  make = CASES.get(case) or NEW_CASES[case]
  with enable_x64():
    ours, theirs = make(fs), make(optax)
    for count in _x64_counts():
      if np.ndim(count) and case.startswith(('interp', 'onecycle', 'sgdr', 'warmup_exp')):
        continue  # optax's piecewise_interpolate takes scalar counts only
      mine, ref = ours(count), theirs(count)
      context = f'{case} count={count!r}'
      assert _kind(mine) == _kind(ref), context
      assert np.shape(mine) == np.shape(ref), context
      exact = jnp.result_type(ref) == jnp.float64
      np.testing.assert_allclose(np.asarray(mine, np.float64), np.asarray(ref, np.float64),
                                 rtol=1e-12 if exact else 1e-6, atol=0, err_msg=context)


def test_x64_keeps_float64_by_hand():
  """Independent of optax: a Python or int64 count gives float64 numbers under x64."""
  from functrain.jax_compat import enable_x64
  with enable_x64():
    for sched, count, want in (
        (fs.cosine_decay_schedule(1.0, 3), jnp.asarray(1, jnp.int64), 0.75),
        (fs.piecewise_constant_schedule(1.0, {2: 1 / 3}), 5, 1 / 3),
        (fs.linear_onecycle_schedule(30, 1.0), 3, 1 / 25 + (1 - 1 / 25) * 3 / 9),
        (fs.exponential_decay(1.0, 3, 0.1), 1, 0.1**(1 / 3))):
      out = sched(count)
      assert out.dtype == jnp.float64
      assert float(out) == pytest.approx(want, rel=1e-14)


def test_piecewise_constant_takes_the_float_count_dtype():
  """A float32 count gives float32 under x64, as optax's formula computes with the count."""
  from functrain.jax_compat import enable_x64
  with enable_x64():
    sched = fs.piecewise_constant_schedule(1.0, {2: 0.5})
    assert sched(jnp.float32(3.0)).dtype == jnp.float32
    assert sched(jnp.int32(3)).dtype == jnp.float64
    assert fs.piecewise_constant_schedule(1.0)(jnp.float32(3.0)) == 1.0  # no boundaries
