"""`make speedrun` (examples/speedrun.py, speedrun_results.py, speedrun_track.py).

The statistics against values computed by hand, the t tables and SciPy's own Welch tests
(two-sided and one-sided); the optimization track's validity test against its formula; the
steps-to-target count on synthetic curves, and in the harness against a run evaluated at
every step, stopped at the target or trained on to the budget; every optimizer of the
speedrun built on its model; a tiny run of the whole script (tables, plot, JSON); and the
README's and docs/speedrun.md's tables against the committed results of both models.
"""

import doctest
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import functrain

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import speedrun  # noqa: E402
import speedrun_results as results  # noqa: E402
import speedrun_track as track  # noqa: E402

T_975_4 = 2.7764451051977987  # t_{0.975} with 4 degrees of freedom, to 16 digits


# ----------------------------------------------------------------------------- statistics
@pytest.mark.parametrize("p, df, table", [
    (0.975, 1, 12.706), (0.975, 4, 2.776), (0.975, 9, 2.262), (0.975, 29, 2.045),
    (0.95, 10, 1.812), (0.995, 4, 4.604), (0.9, 20, 1.325)])
def test_t_quantiles_and_p_values_match_the_t_table(p, df, table):
    # Critical values of Student's t as printed in the tables (3 decimals).
    assert abs(results.t_quantile(p, df) - table) < 5e-4
    assert abs(results.t_two_sided_p(results.t_quantile(p, df), df) - 2 * (1 - p)) < 1e-12
    assert abs(results.t_two_sided_p(-table, df) - 2 * (1 - p)) < 2e-4


def test_mean_interval_by_hand():
    mean, half = results.mean_interval([1.0, 2.0, 3.0, 4.0, 5.0])  # s^2 = 10 / 4
    assert mean == 3.0 and abs(half - T_975_4 * math.sqrt(2.5 / 5)) < 1e-12
    mean, half = results.mean_interval([10.0, 12.0])  # s = sqrt(2): half = t_{.975,1}
    assert mean == 11.0 and abs(half - 12.706204736174698) < 1e-9
    mean, half = results.mean_interval([7.0])
    assert mean == 7.0 and math.isnan(half)
    with pytest.raises(ValueError, match="values must be a non-empty list"):
        results.mean_interval([])


def test_welch_by_hand_and_against_scipy():
    t, df, p = results.welch_test([1, 2, 3, 4, 5], [2, 4, 6, 8, 10])
    assert abs(t - (-3 / math.sqrt(2.5))) < 1e-12          # (3 - 6) / sqrt(2.5/5 + 10/5)
    assert abs(df - 6.25 / (0.25 / 4 + 4.0 / 4)) < 1e-12     # (a + b)^2 / (a^2/4 + b^2/4)
    assert abs(p - 2 * stats.t.sf(3 / math.sqrt(2.5), 6.25 / 1.0625)) < 1e-12
    rng = np.random.default_rng(0)
    for nx, ny, shift, scale in [(5, 5, 0.0, 1.0), (5, 8, 1.0, 3.0), (12, 3, -2.0, 0.2),
                                 (2, 2, 0.5, 1.0)]:
        x, y = rng.normal(size=nx), shift + scale * rng.normal(size=ny)
        ref = stats.ttest_ind(x, y, equal_var=False)
        t, df, p = results.welch_test(x, y)
        assert abs(t - ref.statistic) < 1e-10 and abs(p - ref.pvalue) < 1e-10, (nx, ny)
        if hasattr(ref, "df"):
            assert abs(df - ref.df) < 1e-9


def test_welch_constant_samples_and_bad_input():
    t, df, p = results.welch_test([300, 300], [300, 300, 300])  # all censored, say
    assert (t, p) == (0.0, 1.0) and math.isnan(df)
    t, _, p = results.welch_test([100, 100], [300, 300])
    assert t == -math.inf and p == 0.0
    with pytest.raises(ValueError, match="y must hold at least two numbers"):
        results.welch_test([1, 2], [3])


def test_censored_runs_count_at_the_budget_and_are_reported():
    s = results.summarize([100, 120, None, 110, None], budget=300)
    assert s["values"] == [100, 120, 300, 110, 300] and s["censored"] == 2 and s["lower_bound"]
    mean, half = results.mean_interval([100, 120, 300, 110, 300])
    assert s["mean"] == mean and s["half_width"] == half
    assert results.format_steps(s, 300) == f"≥ {mean:.0f} ± {half:.0f}"
    none = results.summarize([None] * 5, budget=300)
    assert results.format_steps(none, 300) == "> 300" and none["censored"] == 5
    assert results.compare(none, none) is None  # nothing was measured
    fast = results.summarize([100, 110, 90, 105, 95], budget=300)
    assert results.compare(fast, none) == results.welch_test(fast["values"], [300] * 5)[2]
    assert results.format_p(results.compare(fast, none)) == "< 0.001"
    assert results.format_steps(fast, 300) == "100 ± 10"  # 2.776 * sqrt(62.5 / 5) = 9.8


def test_steps_to_target_on_synthetic_curves():
    steps = list(range(0, 301, 10))
    smooth = [1 + 3 * math.exp(-s / 100) for s in steps]  # crosses 2.0 at 100 ln 3 = 109.9
    assert results.steps_to_target(steps, smooth, 2.0) == 110
    assert results.steps_to_target(steps, smooth, 1.0) is None       # never reached
    assert results.steps_to_target(steps, smooth, 4.0) == 0          # already at the start
    # A noisy curve: the first crossing counts, even if the loss rises again after it.
    assert results.steps_to_target([0, 10, 20, 30, 40], [3, 2.5, 1.99, 2.1, 1.9], 2.0) == 20
    # A diverged run (NaN) never reaches the target.
    assert results.steps_to_target([0, 10, 20], [3.0, 2.5, math.nan], 2.0) is None
    with pytest.raises(ValueError, match="3 steps but 2 losses"):
        results.steps_to_target([0, 1, 2], [3.0, 2.0], 2.0)


def test_the_statistics_module_examples_run():
    failed, attempted = doctest.testmod(results, optionflags=doctest.ELLIPSIS)
    assert failed == 0 and attempted >= 12
    failed, attempted = doctest.testmod(track, optionflags=doctest.ELLIPSIS)
    assert failed == 0 and attempted >= 4


def test_track_validity_is_the_one_sided_test_at_the_first_step_that_passes():
    # The track's rule with the group's own spread: (target - mean) sqrt(n) >= t_{.999,n-1} s.
    rng = np.random.default_rng(0)
    n, target = 10, 2.25
    steps = [10, 20, 30, 40]
    means = [2.40, 2.252, 2.245, 2.20]  # above, just above, below but not enough, clearly
    losses = np.stack([m + 0.01 * rng.standard_normal(n) for m in means], axis=1)
    crit = stats.t.ppf(0.999, n - 1)
    passes = [(target - losses[:, j].mean()) * math.sqrt(n) >= crit * losses[:, j].std(ddof=1)
              for j in range(4)]
    assert passes == [False, False, False, True]
    got = track.track_valid(steps, losses, target)
    assert got["step"] == 40 and got["n"] == n
    assert got["mean"] == losses[:, 3].mean() and got["sd"] == losses[:, 3].std(ddof=1)
    # Never valid: the last step's numbers; a run without a loss there is never valid.
    never = track.track_valid(steps[:3], losses[:, :3], target)
    assert never["step"] is None and never["mean"] == losses[:, 2].mean()
    holed = losses.copy()
    holed[3, 3] = np.inf
    assert track.track_valid(steps, holed, target)["step"] is None
    with pytest.raises(ValueError, match="at least two runs"):
        track.track_valid(steps, losses[:1], target)


def test_lower_p_is_welchs_one_sided_test():
    rng = np.random.default_rng(1)
    for shift in (-0.5, 0.0, 0.3):
        x, y = rng.normal(size=8) + shift, rng.normal(size=6)
        ref = stats.ttest_ind(x, y, equal_var=False, alternative="less").pvalue
        assert abs(track.lower_p(x, y) - ref) < 1e-10, shift
    assert track.lower_p([1.0, np.inf], [2.0, 2.1]) == 1.0  # a diverged run never wins
    assert track.lower_p([1.0, 1.1], [2.0, np.inf]) == 0.0


def test_losses_at_grid_and_the_track_statistics_of_a_group():
    runs = [{"steps": [0, 5, 7, 10, 15, 20], "val_loss": [4, 3, 2.2, 2.1, 2.0, 1.9]},
            {"steps": [0, 5, 10, 15], "val_loss": [4, 3.1, 2.2, math.nan]}]  # diverged at 15
    steps, x = track.losses_at_grid(runs, 5, 20)
    assert steps == [5, 10, 15, 20]
    assert x.tolist() == [[3, 2.1, 2.0, 1.9], [3.1, 2.2, math.inf, math.inf]]
    good = [{"steps": [0, 10, 20], "val_loss": [4, 2.0 + 0.01 * i, 1.5 + 0.01 * i]}
            for i in range(4)]
    slow = [{"steps": [0, 10, 20], "val_loss": [4, 2.5 + 0.01 * i, 2.0 + 0.01 * i]}
            for i in range(4)]
    res = {"adamw": {"runs": slow}, "fast": {"runs": good}}
    track.add_track_statistics(res, 10, 20, 2.25)
    assert res["fast"]["track"]["step"] == 10 and res["adamw"]["track"]["step"] == 20
    # compared at the challenger's step: 10 for "fast", 20 for adamw (against "fast" there)
    assert res["fast"]["track"]["p_lower_than"]["adamw"] == track.lower_p(
        [2.0, 2.01, 2.02, 2.03], [2.5, 2.51, 2.52, 2.53])
    assert res["adamw"]["track"]["p_lower_than"] == {}  # muon is absent, adamw is itself
    assert res["fast"]["track"]["p_lower_at_budget"]["adamw"] == track.lower_p(
        [1.5, 1.51, 1.52, 1.53], [2.0, 2.01, 2.02, 2.03])  # both at step 20, the budget
    assert res["fast"]["track"]["final"] == results.mean_interval([1.5, 1.51, 1.52, 1.53])


# ----------------------------------------------------------------------------- harness
@pytest.mark.long
def test_steps_to_target_is_exact_to_the_step_and_deterministic():
    # Evaluated every 4 steps (then step by step where the target was crossed) against
    # evaluated at every step: the same count and the same losses, run after run.
    data = speedrun.load_data(speedrun.TINY)
    cfg_1 = speedrun.dataclasses.replace(speedrun.TINY, eval_every=1)
    target, lr = 3.5, 1e-2  # crossed at steps 7 and 6 (seeds 0 and 1), between evaluations
    coarse = speedrun.train_seeds("adamw", lr, data, speedrun.TINY, 12, lr, [0, 1], target, True)
    every = speedrun.train_seeds("adamw", lr, data, cfg_1, 12, lr, [0, 1], target, True,
                                 stop_at_target=False)
    for c, e in zip(coarse, every):
        assert c["steps_to_target"] is not None and c["steps_to_target"] % 4 != 0, c
        assert c["steps_to_target"] == e["steps_to_target"]
        # the run stopped at the evaluation that found the crossing (the next multiple of 4)
        assert c["steps"][-1] == -(-c["steps_to_target"] // 4) * 4
        per_step = dict(zip(e["steps"], e["val_loss"]))
        for s, loss in zip(c["steps"], c["val_loss"]):
            assert loss == per_step[s], (s, loss, per_step[s])
    assert coarse[0]["val_loss"][0] != coarse[1]["val_loss"][0]  # seeds: other inits
    # Trained on to the budget (the track's way): the same count, and every grid loss.
    full = speedrun.train_seeds("adamw", lr, data, speedrun.TINY, 12, lr, [0, 1], target, True,
                                stop_at_target=False)
    for f, e in zip(full, every):
        assert f["steps_to_target"] == e["steps_to_target"] and f["steps"][-1] == 12
        assert f["steps"] == sorted(set(f["steps"]))
        per_step = dict(zip(e["steps"], e["val_loss"]))
        assert all(loss == per_step[s] for s, loss in zip(f["steps"], f["val_loss"]))
        assert {4, 8, 12} <= set(f["steps"])


def test_every_optimizer_is_built_on_the_model_with_its_split():
    data = speedrun.load_data(speedrun.TINY)
    params = speedrun.init_params(jax.random.PRNGKey(0), speedrun.TINY, len(data["vocab"]))
    dims = speedrun.muon_dims(params)
    assert dims["tok_embed"] is None and dims["head"] is None
    assert dims["blocks"][0]["wq"] is not None and dims["blocks"][0]["attn_gain"] is None
    for name in speedrun.OPTIMIZERS:
        opt = speedrun.make_optimizer(name, speedrun.LEARNING_RATES[name], 12, 1e-3, params)
        updates, _ = jax.eval_shape(lambda p: opt.update(p, opt.init(p), p), params)
        assert jax.tree.structure(updates) == jax.tree.structure(params), name
        assert all(u.shape == p.shape and u.dtype == jnp.float32 for u, p in
                   zip(jax.tree.leaves(updates), jax.tree.leaves(params))), name


@pytest.mark.long
def test_tiny_run_writes_table_plot_and_json(tmp_path):
    # A subprocess, run as `make speedrun` runs it; XLA's backend optimizations are
    # switched off there: compilation is most of this test's time (same numbers).
    env = {**os.environ, "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "")
                                       + " --xla_backend_optimization_level=0").strip()}
    names = ("adamw", "muon", "splus")
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "speedrun.py"), "--tiny", "--quiet",
         "--out", str(tmp_path), "--opts", ",".join(names), "--seeds", "2", "--target", "3.9"],
        capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "speedrun.json").read_text())
    assert tuple(summary["results"]) == names and summary["meta"]["seeds"] == [0, 1]
    starts = [run["val_loss"][0] for res in summary["results"].values() for run in res["runs"]]
    assert abs(starts[0] - math.log(summary["meta"]["vocab"])) < 0.1  # near-uniform at init
    for name, res in summary["results"].items():
        reached = [run["steps_to_target"] for run in res["runs"]]
        assert reached == [results.steps_to_target(r["steps"], r["val_loss"], 3.9)
                           for r in res["runs"]], name
        assert res["summary"] == results.summarize(reached, 12), name
        assert [run["val_loss"][0] for run in res["runs"]] == starts[:2], name  # same inits
    assert summary["results"]["adamw"]["p_vs_adamw"] is None
    table = (tmp_path / "speedrun.md").read_text()
    assert results.results_table(summary) in table and results.results_table(summary) in \
        result.stdout
    assert (tmp_path / "speedrun.png").stat().st_size > 0


def test_missing_or_unknown_optimizer_is_named_before_training(tmp_path, monkeypatch):
    monkeypatch.delattr(functrain.contrib, "kron")
    with pytest.raises(ValueError, match=r"'kron' needs functrain\.contrib\.kron"):
        speedrun.main(["--tiny", "--out", str(tmp_path), "--opts", "adamw,kron"])
    with pytest.raises(ValueError, match=r"unknown optimizer 'lion2'"):
        speedrun.main(["--tiny", "--out", str(tmp_path), "--opts", "lion2"])
    with pytest.raises(ValueError, match=r"--seeds must be >= 2"):
        speedrun.main(["--tiny", "--out", str(tmp_path), "--opts", "adamw", "--seeds", "1"])
    assert not list(tmp_path.iterdir())  # nothing was trained or written


# ----------------------------------------------------------------------------- results
def test_targets_follow_the_stated_rule_from_the_sweeps():
    # Set after each sweep, before any measured run: 0.05 above tuned AdamW, rounded up.
    for setup in speedrun.SETUPS.values():
        adamw = setup.sweep["adamw"][setup.rates["adamw"]]
        assert setup.target == speedrun.target_from_sweep(adamw)
        assert setup.target - 0.1 < adamw + 0.05 <= setup.target


@pytest.mark.parametrize("model", ["small", "medium"])
def test_tuning_record_and_committed_results_agree_with_the_docs(model):
    setup = speedrun.SETUPS[model]
    for name, grid in setup.sweep.items():  # the chosen rate is the sweep's best
        assert setup.rates[name] == min(grid, key=grid.get), name
    assert set(setup.sweep) == set(setup.rates) == set(setup.grid)
    summary = json.loads((ROOT / "benchmarks" / "results" / f"{setup.stem}.json").read_text())
    meta = summary["meta"]
    assert meta["target"] == setup.target and meta["steps"] == setup.model.steps
    assert meta["config"] == speedrun.dataclasses.asdict(setup.model)
    assert len(meta["seeds"]) == speedrun.SEEDS and tuple(summary["results"]) == tuple(
        setup.rates)
    for name, res in summary["results"].items():  # the tables follow from the runs
        assert res["lr"] == setup.rates[name]
        reached = [results.steps_to_target(r["steps"], r["val_loss"], meta["target"])
                   for r in res["runs"]]
        assert res["summary"] == results.summarize(reached, meta["steps"]), name
        assert all(r["steps"][-1] == meta["steps"] for r in res["runs"])  # to the budget
        for ref in ("adamw", "muon"):
            expected = None if name == ref else results.compare(
                res["summary"], summary["results"][ref]["summary"])
            assert res[f"p_vs_{ref}"] == expected, (name, ref)
    recorded = {name: json.loads(json.dumps(res["track"]))
                for name, res in summary["results"].items()}
    track.add_track_statistics(summary["results"], meta["config"]["eval_every"],
                               meta["steps"], meta["target"])
    assert json.loads(json.dumps({n: r["track"] for n, r in summary["results"].items()})) \
        == recorded
    page = (ROOT / "docs" / "speedrun.md").read_text()
    assert results.results_table(summary) in page and track.track_table(summary) in page
    assert track.speedup_verdict(summary) in page
    if model == "small":
        assert results.readme_block(summary) in (ROOT / "README.md").read_text()


# ----------------------------------------------------------------------------- memory
def full_shapes() -> dict:
    """The FULL model's parameter shapes (the vocabulary of the committed run)."""
    vocab = json.loads((ROOT / "benchmarks" / "results" / "speedrun.json").read_text())[
        "meta"]["vocab"]
    return jax.eval_shape(lambda: speedrun.init_params(jax.random.PRNGKey(0), speedrun.FULL,
                                                       vocab))


def speedrun_state_bytes(name: str, shapes: dict) -> int:
    lr = speedrun.LEARNING_RATES[name]
    opt = speedrun.make_optimizer(name, lr, 300, speedrun.LEARNING_RATES["adamw"], shapes,
                                  speedrun.FULL.n_head)
    return speedrun.state_bytes(opt, shapes)


def test_apollo_rank_is_the_largest_within_a_tenth_of_adamws_state():
    # By hand: AdamW keeps two float32 moments per parameter, plus two int32 counts (its
    # own, the multiplier's). APOLLO keeps, per 2-D leaf (m, n), two float32 moments of
    # r x max(m, n) and one float32 norm; per other leaf AdamW's two moments and an unused
    # float32 norm; plus the two counts.
    shapes = full_shapes()
    leaves = jax.tree.leaves(shapes)
    n = sum(x.size for x in leaves)
    adamw = 8 * n + 8
    assert speedrun_state_bytes("adamw", shapes) == adamw

    def apollo_by_hand(r):
        return 8 + sum(8 * r * max(x.shape) + 4 if x.ndim == 2 else 8 * x.size + 4
                       for x in leaves)

    rank = speedrun.APOLLO_RANK
    with pytest.MonkeyPatch.context() as mp:
        for r in (rank, rank + 1):
            mp.setattr(speedrun, "APOLLO_RANK", r)
            assert speedrun_state_bytes("apollo", shapes) == apollo_by_hand(r), r
    assert apollo_by_hand(rank) <= 0.1 * adamw < apollo_by_hand(rank + 1)
    assert speedrun_state_bytes("apollo_mini", shapes) == apollo_by_hand(1)


def test_adam_mini_partition_of_the_model_and_its_state():
    # The official rule by hand for this model's names: one block per head of wq and wk,
    # per output neuron of wv, wo, w_in, w_out and the head, per token of the embeddings,
    # one per gain; the state is the momentum (4 bytes per parameter), one float32 per
    # block and two counts.
    shapes = full_shapes()
    cfg, vocab = speedrun.FULL, shapes["head"].shape[1]
    grids = speedrun.adam_mini_blocks(shapes, cfg.n_head)
    d = cfg.d_model
    assert grids["tok_embed"] == (vocab, 1) and grids["pos_embed"] == (cfg.context, 1)
    assert grids["head"] == (1, vocab) and grids["final_gain"] == (1,)
    for block in grids["blocks"]:
        assert block == {"attn_gain": (1,), "mlp_gain": (1,), "wq": (1, cfg.n_head),
                         "wk": (1, cfg.n_head), "wv": (1, d), "wo": (1, d),
                         "w_in": (1, 4 * d), "w_out": (1, d)}
    n = sum(x.size for x in jax.tree.leaves(shapes))
    n_blocks = sum(int(np.prod(g)) for g in jax.tree.leaves(
        grids, is_leaf=lambda g: isinstance(g, tuple)))
    nbytes = speedrun_state_bytes("adam_mini", shapes)
    assert nbytes == 4 * n + 4 * n_blocks + 8
    assert nbytes <= 0.55 * (8 * n + 8)
