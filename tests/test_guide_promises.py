"""docs/coming_from_optax.md, claim by claim, backed by tests.

A claim is a top-level bullet of the guide: a line starting with ``- `` at column 0,
outside fenced code blocks (between lines starting with three backquotes), together with its
indented continuation lines (up to a blank line, the next bullet, a fence or an unindented
line). Its key in ``CLAIM_TESTS``:

* the bold lead, if the bullet starts with ``**...**``, exactly as written inside the
  asterisks (``Names, arguments, defaults.``);
* otherwise the bullet's first clause, whitespace-normalized: its text up to the first
  ``.``, ``:`` or ``;`` followed by a space or ending the bullet, or the first `` (``,
  whichever comes first, not counting those inside backquoted code
  (``16-bit tree norms are summed in float32, where optax's overflow``).

``CLAIM_TESTS`` names, for each claim, the tests that check it: tests elsewhere in ``tests/``,
and the ``test_claim_*`` tests of this file where no other test checked the claim (or checked
only functrain's side of a difference). A change of behaviour then fails a named test until
the guide says the new truth. ``test_every_claim_of_the_migration_guide_names_its_tests``
keeps the two in step: every claim has an entry, every entry is a claim, no entry is empty,
and every test named exists (the node-id checks of tests/test_readme_promises.py, read with
``ast``, nothing imported).

When the guide changes:

* a reworded bold lead or first clause: rename its key in ``CLAIM_TESTS``;
* a new claim (a new bullet): add the tests that check it (write a ``test_claim_*`` test here
  if none does), and name them in its entry; prose outside bullets escapes these checks, so
  write a claim as a bullet;
* a bullet removed: remove its entry (and any ``test_claim_*`` test only it used);
* a named test renamed or moved: update its node id.

Node ids are ``tests/<path>.py::<function>``, without parametrization brackets (a
parametrized test is named once, for all its cases).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib  # noqa: F401  (the references)
import optax.losses as ol
import pytest

import functrain as ft
import registry
from functrain import jax_compat, losses
from functrain.declarations import OPTIMIZERS as DECLARED
from functrain.losses.checks import LossInputError
from helpers import assert_same_trajectory, make_params
from test_readme_promises import named_test_problems

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "coming_from_optax.md"
SOAK_RECORD = ROOT / "benchmarks" / "results" / "soak.json"
CONFORMANCE_RECORD = ROOT / "benchmarks" / "results" / "conformance.json"
THIS = "tests/test_guide_promises.py"
LOSSES = "tests/losses"

CLAIM_TESTS: dict[str, tuple[str, ...]] = {
    # --- What is the same ---
    "Names, arguments, defaults.": (
        "tests/test_optax_coverage.py::test_the_enumeration_sees_optax",
        "tests/test_optax_coverage.py::test_every_optax_name_has_a_functrain_counterpart",
        "tests/test_optax_coverage.py::test_keyword_names_and_defaults_match_optax",
        "tests/test_optax_coverage.py::test_exclusions_are_still_true",
    ),
    "Numbers.": (
        "tests/parity/test_optax_parity.py::test_matches_optax",
        f"{THIS}::test_claim_every_shared_optimizer_matches_optax_in_float64",
        "tests/test_properties.py::test_complex_matches_optax",
        "tests/contrib/test_common.py::test_matches_optax_contrib",
        "tests/contrib/test_common.py::test_converges_on_optax_targets",
    ),
    "Bits.": (
        "tests/parity/test_bit_identity.py::test_jitted_steps_are_optax_bits",
        "tests/parity/test_bit_identity.py::test_optimized_jitted_steps_are_optax_bits",
        "tests/parity/test_bit_identity.py::test_fused_multiply_adds_are_the_cause",
        f"{THIS}::test_claim_bit_identity_counts_and_exceptions",
    ),
    "The protocol.": (
        "tests/engine/test_protocol.py::test_gradient_transformation_is_a_plain_pair",
        "tests/parity/test_optax_parity.py::test_optax_transforms_inside_functrain_chain",
        "tests/parity/test_optax_parity.py::test_functrain_transforms_inside_optax_chain",
        "tests/test_checkpoint_sweep.py::test_checkpoint_interchanges_with_optax",
        "tests/test_docs.py::test_guide_code_runs",
    ),
    "Integrations.": (
        "tests/test_integrations.py::test_flax_train_state_with_functrain_lamb_matches_optax_lamb",
        "tests/test_integrations.py::"
        "test_flax_nnx_optimizer_with_functrain_adamw_matches_optax_adamw",
        "tests/test_integrations.py::test_equinox_filter_and_partition_with_functrain_match_optax",
        "tests/test_equinox_closures.py::"
        "test_new_optimizer_with_array_learning_rate_compiles_as_optax_does",
        "tests/test_integrations.py::"
        "test_orbax_optimizer_state_round_trip_continues_bit_identically",
        "tests/test_equinox_closures.py::test_equal_hyperparameters_give_equal_static_parts",
    ),
    "Client projects.": (
        "tests/test_clients.py::test_import_optax_gives_functrain_and_never_optax",
        "tests/test_clients.py::test_the_comparison_finds_outcome_and_value_differences",
        "tests/test_clients.py::test_the_reduced_selection_is_the_tests_that_mention_optax",
    ),
    "optax's types.": (
        "tests/engine/test_protocol.py::"
        "test_functrain_transformations_are_optax_transformations_where_optax_is_installed",
        "tests/engine/test_protocol.py::test_without_optax_the_classes_are_plain_named_tuples",
        f"{THIS}::test_claim_functrain_imports_optax_only_for_its_types",
    ),
    # --- Long runs and checkpoints, both ways ---
    "The soak.": (
        "tests/test_soak.py::test_reduced_soak_matches_optax_and_resumes_bit_identically",
        f"{THIS}::test_claim_soak_runs_in_ci_and_its_table_is_the_recorded_run",
    ),
    "Bit-identical, or as far as optax from itself.": (
        f"{THIS}::test_claim_soak_adamw_and_muon_stay_optax_bits_lamb_drifts_as_optax_does",
        f"{THIS}::test_claim_soak_float64_lamb_gap_starts_near_1e_15_and_grows_about_30x",
        f"{THIS}::test_claim_soak_runs_in_ci_and_its_table_is_the_recorded_run",
    ),
    "Resumed from Orbax.": (
        "tests/test_soak.py::test_reduced_soak_matches_optax_and_resumes_bit_identically",
        f"{THIS}::test_claim_soak_runs_in_ci_and_its_table_is_the_recorded_run",
    ),
    "Orbax checkpoints interchange.": (
        "tests/test_checkpoint_interchange.py::"
        "test_checkpoint_restores_across_libraries_and_continues",
        "tests/test_checkpoint_sweep.py::test_checkpoint_interchanges_with_optax",
    ),
    "optax's states.": (
        "tests/test_arg_checks.py::test_optax_states_are_accepted_mid_migration",
        "tests/test_arg_checks.py::test_a_class_of_the_same_name_with_other_fields_is_refused",
        "tests/contrib/test_contrib_reduce_on_plateau.py::test_optax_state_is_taken",
        "tests/wrappers/test_masking.py::test_full_mask_reads_optax_state",
    ),
    # --- What is out of scope ---
    "Every loss of `optax.losses`.": (
        "tests/test_optax_coverage.py::test_losses_at_the_top_level_are_optaxs",
        "tests/test_optax_coverage.py::test_every_optax_name_has_a_functrain_counterpart",
        "tests/test_optax_coverage.py::test_keyword_names_and_defaults_match_optax",
    ),
    "Losses compared with optax's.": (
        f"{LOSSES}/test_classification.py::"
        "test_float32_and_bfloat16_values_and_gradients_are_optaxs",
        f"{LOSSES}/test_classification.py::test_float64_values_and_gradients_are_optaxs",
        f"{LOSSES}/test_ctc.py::test_float32_and_16_bit_values_and_gradients_are_optaxs",
        f"{LOSSES}/test_ctc.py::test_float64_values_and_gradients_are_optaxs",
        f"{LOSSES}/test_divergences.py::test_float32_and_bfloat16_values_and_gradients_are_optaxs",
        f"{LOSSES}/test_divergences.py::test_float64_values_and_gradients_are_optaxs",
        f"{LOSSES}/test_fenchel_young.py::test_float32_values_and_gradients_are_optaxs",
        f"{LOSSES}/test_fenchel_young.py::test_float64_and_bfloat16_values_are_optaxs",
        f"{LOSSES}/test_margin.py::test_float32_and_bfloat16_values_and_gradients_are_optaxs",
        f"{LOSSES}/test_margin.py::test_float64_values_and_gradients_are_optaxs",
        f"{LOSSES}/test_ranking.py::test_float32_values_and_gradients_are_optaxs",
        f"{LOSSES}/test_ranking.py::test_float64_and_bfloat16_values_are_optaxs",
        f"{LOSSES}/test_regression.py::test_float32_and_bfloat16_values_and_gradients_are_optaxs",
        f"{LOSSES}/test_regression.py::test_float64_values_and_gradients_are_optaxs",
        f"{LOSSES}/test_segmentation.py::"
        "test_float32_and_bfloat16_values_and_gradients_are_optaxs",
        f"{LOSSES}/test_segmentation.py::test_float64_values_and_gradients_are_optaxs",
        f"{LOSSES}/test_self_supervised.py::"
        "test_float32_and_bfloat16_values_and_gradients_are_optaxs",
        f"{LOSSES}/test_self_supervised.py::test_float64_values_and_gradients_are_optaxs",
        f"{LOSSES}/test_smoothing.py::test_float32_values_and_gradients_are_optaxs",
        f"{LOSSES}/test_smoothing.py::test_float64_and_bfloat16_values_are_optaxs",
    ),
    "optax's own loss tests.": (
        f"{THIS}::test_claim_conformance_runs_optax_loss_tests",
        "tests/test_conformance_list.py::test_entry_names_an_existing_optax_test",
    ),
    "Losses at the top level.": (
        "tests/test_optax_coverage.py::test_losses_at_the_top_level_are_optaxs",
    ),
    "Left to optax.": (
        "tests/test_optax_coverage.py::test_exclusions_are_still_true",
        "tests/test_optax_coverage.py::test_excluded_modules_say_where_to_get_them",
        "tests/parity/test_optax_parity.py::test_optax_transforms_inside_functrain_chain",
        "tests/parity/test_optax_parity.py::test_optax_wrappers_around_functrain_optimizers",
    ),
    "`optax.tree_utils`.": (
        "tests/test_tree_utils.py::test_every_optax_tree_utils_name_with_a_counterpart_is_an_alias",
        "tests/test_tree_utils.py::test_gives_optax_numbers_on_a_small_tree",
        "tests/test_tree_utils.py::test_deprecated_names_warn_and_give_optax_numbers",
    ),
    # --- Deliberate differences ---
    "`MultiSteps` accumulates complex gradients as complex": (
        f"{THIS}::test_claim_multisteps_accumulates_complex_gradients_as_complex",
    ),
    "`monitor`'s state has a fixed structure from `init`, so it works under `lax.scan`": (
        "tests/wrappers/test_monitoring.py::test_monitor_state_is_stable_under_jit_and_scan",
        f"{THIS}::test_claim_monitor_under_scan_and_optax_state_changing_structure",
    ),
    "16-bit tree norms are summed in float32, where optax's overflow": (
        "tests/test_tree_ops.py::test_16bit_norm_accumulates_in_float32_where_optax_overflows",
    ),
    "`apply_if_finite` resets its counter after applying the update it lets through": (
        "tests/wrappers/test_finite.py::test_apply_if_finite_counter_resets_after_forced_update",
        "tests/test_readme_promises.py::test_row_apply_if_finite_optax_never_resets_its_counter",
    ),
    "The losses check their inputs before any array math": (
        f"{THIS}::test_claim_loss_input_errors_where_optax_broadcasts_or_fails_in_jnp",
        f"{LOSSES}/test_classification.py::test_bad_input_is_named_before_any_math",
        f"{LOSSES}/test_ctc.py::test_bad_input_is_named_before_any_math",
        f"{LOSSES}/test_divergences.py::test_bad_input_is_named_before_any_math",
        f"{LOSSES}/test_fenchel_young.py::test_bad_input_is_named",
        f"{LOSSES}/test_margin.py::test_bad_input_is_named_before_any_math",
        f"{LOSSES}/test_ranking.py::test_bad_input_is_named_before_any_math",
        f"{LOSSES}/test_regression.py::test_bad_input_is_named_before_any_math",
        f"{LOSSES}/test_segmentation.py::test_bad_input_is_named_before_any_math",
        f"{LOSSES}/test_self_supervised.py::test_bad_input_is_named_before_any_math",
        f"{LOSSES}/test_smoothing.py::test_bad_input_is_named_before_any_math",
        f"{LOSSES}/test_classification.py::test_errors_have_optaxs_exception_types",
    ),
    "`triplet_margin_loss` takes `|a - p|` to the power `norm_degree`, a distance for every "
    "degree": (
        f"{LOSSES}/test_self_supervised.py::test_odd_and_fractional_norm_degrees_are_distances",
        f"{THIS}::test_claim_optax_triplet_distance_is_a_signed_sum_for_odd_degrees",
    ),
    "`dice_loss` and `binary_dice_loss` take probabilities": (
        f"{LOSSES}/test_segmentation.py::test_probabilities_work_under_jit_and_for_one_channel",
    ),
    "A `where` of the examples' shape in `smooth_labels` is an error": (
        f"{LOSSES}/test_smoothing.py::"
        "test_optax_would_count_a_per_example_mask_along_the_class_axis",
        f"{LOSSES}/test_smoothing.py::test_bad_input_is_named_before_any_math",
    ),
    "The loss of `make_fenchel_young_loss` passes keyword arguments on to `max_fun`": (
        f"{LOSSES}/test_fenchel_young.py::test_keyword_arguments_reach_max_fun",
    ),
    "`sigmoid_focal_loss` refuses `alpha` outside `[0, 1]` and `gamma < 0`": (
        f"{LOSSES}/test_classification.py::test_bad_input_is_named_before_any_math",
        f"{THIS}::test_claim_focal_loss_refuses_what_optax_takes",
    ),
    "`multiclass_sparsemax_loss` of 16-bit scores computes in float32 throughout": (
        f"{THIS}::test_claim_sparsemax_of_16_bit_scores_computes_in_float32_throughout",
        f"{LOSSES}/test_margin.py::test_float32_and_bfloat16_values_and_gradients_are_optaxs",
    ),
}


# --------------------------------------------------------------------------
# The guide and the mapping agree
# --------------------------------------------------------------------------

def claim_key(text: str) -> str:
    """The key of a claim whose bullet text (after ``- ``) is ``text``: its bold lead, or
    its first clause (the rule of the module docstring), whitespace-normalized."""
    text = " ".join(text.split())
    bold = re.match(r"\*\*(.+?)\*\*", text)
    if bold:
        return bold.group(1).strip()
    in_code = False
    for i, char in enumerate(text):
        if char == "`":
            in_code = not in_code
        elif in_code:
            continue
        elif char in ".:;" and (i + 1 == len(text) or text[i + 1] == " "):
            return text[:i]
        elif char == "(" and i > 0 and text[i - 1] == " ":
            return text[:i - 1]
    return text


def guide_claims(text: str) -> list[str]:
    """The keys of the top-level bullets of ``text`` (outside fenced code), in order."""
    bullets: list[list[str]] = []
    current: list[str] | None = None
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced, current = not fenced, None
        elif fenced:
            continue
        elif line.startswith("- "):
            current = [line[2:]]
            bullets.append(current)
        elif current is not None and line.strip() and line[0].isspace():
            current.append(line)
        else:
            current = None
    return [claim_key(" ".join(lines)) for lines in bullets]


def test_the_guide_reader_finds_bullets_and_their_keys():
    text = "\n".join([
        "Prose. - not a bullet",
        "- **Bold lead.** More text.",
        "  continued (here).",
        "```python",
        "- inside a fence",
        "```",
        "- `a.b` takes `f(x)` as given (optax does not). Second.",
        "- Clause ends here: the rest",
        "  - a nested bullet, part of the claim",
        "",
        "  - after a blank line: not a claim",
        "- One sentence without parentheses.",
    ])
    assert guide_claims(text) == ["Bold lead.", "`a.b` takes `f(x)` as given",
                                  "Clause ends here", "One sentence without parentheses"]


def test_every_claim_of_the_migration_guide_names_its_tests():
    claims = guide_claims(GUIDE.read_text())
    assert len(claims) >= 20, f"the guide's bullets were not found: {claims}"
    repeated = sorted({claim for claim in claims if claims.count(claim) > 1})
    assert not repeated, f"two claims share a key: {repeated}"
    missing = [claim for claim in claims if claim not in CLAIM_TESTS]
    assert not missing, f"claims of the guide with no entry in CLAIM_TESTS: {missing}"
    stale = [key for key in CLAIM_TESTS if key not in claims]
    assert not stale, f"CLAIM_TESTS entries that are no claim of the guide: {stale}"
    problems = named_test_problems(CLAIM_TESTS)
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------
# The claims no other test checked (or checked on functrain's side only)
# --------------------------------------------------------------------------

def load_module(path: Path, name: str) -> types.ModuleType:
    """The module at ``path``, loaded under its own ``name`` (apart from pytest's copy)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Every optimizer both libraries have (tests/registry.py, optax's reference), but the two
# whose update takes a function, compared in their own files.
TAKE_A_FUNCTION = {"sam", "sophia"}
SHARED = sorted(n for n, r in registry.REGISTRY.items() if r.reference.startswith("optax."))
STEPPED_BY_GRADIENTS = [n for n in SHARED if n not in TAKE_A_FUNCTION]


@pytest.mark.long  # 54 trajectories pairs, about 50 s: beyond make test's budget
@pytest.mark.parametrize("name", STEPPED_BY_GRADIENTS)
def test_claim_every_shared_optimizer_matches_optax_in_float64(name):
    """50 jitted steps with float64 parameters and gradients (the parity tree and gradients,
    widened) give optax's parameters at rtol 1e-9 (measured: the same bits)."""
    record = registry.REGISTRY[name]
    assert_same_trajectory(record.make(ft), record.make(optax),
                           params=make_params(scalar="scalar_leaf" not in record.skip),
                           with_value=record.extra is not None, name=name, float64=True)


def test_claim_bit_identity_counts_and_exceptions():
    """The guide's counts: 56 optimizers both libraries have, 54 of them (all but sam and
    sophia) in the bit-identity test; on JAX 0.10.2 none listed with the operations as
    written and four (momo, momo_adam, novograd, prodigy) under XLA's default optimizations,
    so 50 give optax's bits there; on JAX 0.5.x mechanize, muon and novograd listed. Every
    listed difference but mechanize's is put down to fused multiply-adds (which
    test_fused_multiply_adds_are_the_cause checks)."""
    bits = load_module(ROOT / "tests" / "parity" / "test_bit_identity.py", "_guide_bit_identity")
    assert len(SHARED) == 56 == sum(d.optax is not None for d in DECLARED.values())
    assert set(bits.OWN_FILES) == TAKE_A_FUNCTION
    assert bits.NAMES == STEPPED_BY_GRADIENTS and len(bits.NAMES) == 54
    listed = {**bits.NOT_BIT_IDENTICAL, **bits.NOT_BIT_IDENTICAL_OPTIMIZED}
    assert sorted(n for n, why in listed.items() if bits._FMA not in why) == (
        ["mechanize"] if "mechanize" in listed else [])
    if jax_compat.JAX_VERSION[:2] == (0, 5):
        assert set(bits.NOT_BIT_IDENTICAL) == {"mechanize", "muon", "novograd"}
    else:
        assert bits.NOT_BIT_IDENTICAL == {}
        assert set(bits.NOT_BIT_IDENTICAL_OPTIMIZED) == {"momo", "momo_adam", "novograd",
                                                         "prodigy"}
        assert len(bits.NAMES) - len(bits.NOT_BIT_IDENTICAL_OPTIMIZED) == 50


IMPORTS_OPTAX = "import sys, functrain; print('optax' in sys.modules)"


def test_claim_functrain_imports_optax_only_for_its_types():
    """``import functrain`` imports optax (for its classes' bases) where optax is installed,
    and not with ``FUNCTRAIN_OPTAX_TYPES=0``."""
    seen = {}
    for value in (None, "0"):
        env = {k: v for k, v in os.environ.items() if k != "FUNCTRAIN_OPTAX_TYPES"}
        if value is not None:
            env["FUNCTRAIN_OPTAX_TYPES"] = value
        out = subprocess.run([sys.executable, "-c", IMPORTS_OPTAX], capture_output=True,
                             text=True, timeout=300, env=env, cwd=ROOT)
        assert out.returncode == 0, out.stderr[-2000:]
        seen[value] = out.stdout.split()[-1]
    assert seen == {None: "True", "0": "False"}


# --- the soak --------------------------------------------------------------------------

SOAK_STEPS, SOAK_CHUNK = 10_000, 1_000


def soak_table(text: str) -> list[list[str]]:
    """The cells of the guide's soak table (the table whose header starts ``| optimizer |``),
    header first, separator left out."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| optimizer |"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return [rows[0]] + rows[2:]


def test_claim_soak_runs_in_ci_and_its_table_is_the_recorded_run():
    """CI runs ``make soak``, which runs tests/soak/run_soak.py; the committed record of a run
    (``RECORDS`` defaults to benchmarks/results; CI's own runs write to a scratch folder) is
    benchmarks/results/soak.json: 10,000 steps compared every 1,000. The guide's table is
    that record (to one digit): adamw and muon 0 at every chunk, lamb's largest 7e-2, every
    resumed run bit-identical."""
    assert "make soak" in [line.strip() for line in (ROOT / ".ci" / "run").read_text()
                           .splitlines()]
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^soak:.*\n\t(.*)$", makefile, re.MULTILINE)
    assert recipe and "tests/soak/run_soak.py" in recipe.group(1) and (
        "--out $(RECORDS)" in recipe.group(1)), recipe
    assert re.search(r"^RECORDS \?= benchmarks/results$", makefile, re.MULTILINE)
    record = json.loads(SOAK_RECORD.read_text())
    assert (record["steps"], record["chunk"]) == (SOAK_STEPS, SOAK_CHUNK)
    results = record["results"]
    chunks = [str(t) for t in range(SOAK_CHUNK, SOAK_STEPS + 1, SOAK_CHUNK)]

    def cells(curve: dict) -> list[str]:
        return [f"{curve[t]:.0e}" for t in chunks]

    expected = [["optimizer"] + [f"{int(t) // 1000}k" for t in chunks] + ["resumed from Orbax"]]
    for name in ("adamw", "lamb", "muon"):
        resumed = "bit-identical" if results[name]["resumed_bit_identical"] else "differs"
        expected.append([f"{name} vs optax"] + cells(results[name]["curve"]) + [resumed])
        expected.append(["optax vs optax, one-ulp nudge"] + cells(results[name]["optax_nudged"])
                        + [""])
    assert not results["soap"]["curve"] and results["soap"]["resumed_bit_identical"]
    expected.append(["soap (no optax)"] + ["-"] * len(chunks) + ["bit-identical"])
    assert soak_table(GUIDE.read_text()) == expected
    for name in ("adamw", "muon"):
        assert set(results[name]["curve"].values()) == {0.0}, name
    assert f"{max(results['lamb']['curve'].values()):.0e}" == "7e-02"
    assert all(r["resumed_bit_identical"] for r in results.values())


@functools.lru_cache(maxsize=None)
def load_soak() -> types.ModuleType:
    """tests/soak/run_soak.py (``make soak``'s script), loaded once."""
    return load_module(ROOT / "tests" / "soak" / "run_soak.py", "_guide_run_soak")


def soak_gaps(soak: types.ModuleType, ours, theirs, nudge: bool = False) -> dict[int, float]:
    """Step -> the soak's relative difference between ``ours`` and ``theirs`` (``theirs``
    from parameters nudged by one ulp when ``nudge``), every ``SOAK_CHUNK`` steps."""
    reference: dict = {}
    soak.train(theirs, SOAK_STEPS, SOAK_CHUNK,
               on_chunk=lambda t, p: reference.__setitem__(t, p))
    gaps: dict = {}
    soak.train(ours, SOAK_STEPS, SOAK_CHUNK, nudge=nudge,
               on_chunk=lambda t, p: gaps.__setitem__(t, soak.rel_diff(p, reference[t])))
    return gaps


@pytest.mark.long
def test_claim_soak_adamw_and_muon_stay_optax_bits_lamb_drifts_as_optax_does():
    """The soak's 10,000 float32 steps, run here: adamw's and muon's parameters are optax's
    bits at every 1,000 steps; lamb drifts (beyond 1e-3) but no further than twice as far as
    optax from its own run with parameters nudged by one ulp."""
    soak = load_soak()
    for name in ("adamw", "muon"):
        gaps = soak_gaps(soak, *soak.builders(name))
        assert len(gaps) == SOAK_STEPS // SOAK_CHUNK and set(gaps.values()) == {0.0}, (
            name, gaps)
    ours, theirs = soak.builders("lamb")
    drift = max(soak_gaps(soak, ours, theirs).values())
    own = max(soak_gaps(soak, theirs, theirs, nudge=True).values())
    assert 1e-3 < drift <= 2 * own, (drift, own)


@pytest.mark.long
def test_claim_soak_float64_lamb_gap_starts_near_1e_15_and_grows_about_30x():
    """The soak's lamb in float64: the gap to optax after 1,000 steps is of the order of
    1e-15 (between 1e-16 and 1e-14), and it grows by a factor between 15 and 60 per 1,000
    steps (geometric mean over the 10,000 steps; measured 1e-15 and 35x)."""
    soak = load_soak()
    with jax_compat.enable_x64(True):
        soak.DTYPE = jnp.float64  # what its --float64 sets
        try:
            gaps = soak_gaps(soak, *soak.builders("lamb"))
        finally:
            soak.DTYPE = jnp.float32
    first, last = gaps[SOAK_CHUNK], gaps[SOAK_STEPS]
    assert 1e-16 <= first <= 1e-14, gaps
    growth = (last / first) ** (SOAK_CHUNK / (SOAK_STEPS - SOAK_CHUNK))
    assert 15 <= growth <= 60, (growth, gaps)


# --- optax's own loss tests ------------------------------------------------------------

def test_claim_conformance_runs_optax_loss_tests():
    """``make conformance`` runs every loss test file of the installed optax with functrain's
    losses swapped in, and its recorded run (optax 0.2.8) has each of them run with functrain's
    names, none of optax's left, and no failure."""
    sys.path.insert(0, str(ROOT / "tests" / "conformance"))
    try:
        from run_conformance import optax_test_files
    finally:
        sys.path.remove(str(ROOT / "tests" / "conformance"))
    installed = Path(optax.__file__).parent
    loss_files = sorted(str(p.relative_to(installed))
                        for p in (installed / "losses").glob("*_test.py"))
    assert len(loss_files) >= 5, loss_files
    assert set(loss_files) <= set(optax_test_files(installed))
    record = json.loads(CONFORMANCE_RECORD.read_text())
    assert record["optax"] == optax.__version__
    for path in loss_files:
        run = record["files"][path]
        assert run["names_swapped"] > 0 and run["names_optax"] == 0 and run["passed"] > 0, (
            path, run)
    assert not [test for test in record["failed"] if test.startswith("losses/")]


# --- deliberate differences: optax's side (and functrain's where no test had it) -------

@pytest.mark.filterwarnings("ignore:Casting from complex to real")  # optax's accumulator
def test_claim_multisteps_accumulates_complex_gradients_as_complex():
    """Two complex micro-gradients through MultiSteps(sgd(1.0), 2): functrain's update is
    minus their mean; optax's accumulator is float32, so it keeps only the first one's real
    part, and its update is -(Re g1 + (g2 - Re g1) / 2) (by hand)."""
    params = {"z": jnp.asarray([1 + 1j, -2j], jnp.complex64)}
    micro = [jnp.asarray([1 + 2j, 3 - 1j], jnp.complex64),
             jnp.asarray([-1 + 4j, 1 + 1j], jnp.complex64)]
    updates = {}
    for m in (ft, optax):
        opt = m.MultiSteps(m.sgd(1.0), 2)
        state = opt.init(params)
        assert state.acc_grads["z"].dtype == (jnp.complex64 if m is ft else jnp.float32)
        for g in micro:
            update, state = opt.update({"z": g}, state, params)
        updates[m.__name__] = update["z"]
    np.testing.assert_allclose(updates["functrain"], [-3j, -2.0], rtol=1e-6)
    np.testing.assert_allclose(updates["optax"], [-2j, -2.0 - 0.5j], rtol=1e-6)


def test_claim_monitor_under_scan_and_optax_state_changing_structure():
    """functrain's monitor steps under lax.scan from its init state; optax's init holds no
    measurements and its first update adds them, so scan refuses the changed carry."""
    params = {"w": jnp.asarray([1.0, -2.0, 0.5])}
    grads = {"w": jnp.arange(12.0).reshape(4, 3)}
    for m in (ft, optax):
        opt = m.monitor({"norm": m.tree.norm})

        def step(state, g, opt=opt):
            return opt.update(g, state, params)[1], None

        if m is ft:
            last, _ = jax.lax.scan(step, opt.init(params), grads)
            np.testing.assert_allclose(last.measurements["norm"], np.linalg.norm([9, 10, 11]),
                                       rtol=1e-6)
        else:
            assert opt.init(params).measurements == {}
            with pytest.raises(TypeError, match="same pytree structure"):
                jax.lax.scan(step, opt.init(params), grads)


def test_claim_loss_input_errors_where_optax_broadcasts_or_fails_in_jnp():
    """Labels that would broadcast the loss to a larger shape, a ``where`` that does not fit,
    an axis out of range: functrain raises a LossInputError (a ValueError and a TypeError)
    naming the loss and the argument; optax broadcasts the labels silently and fails on the
    others inside jnp, with jnp's messages."""
    assert issubclass(LossInputError, ValueError) and issubclass(LossInputError, TypeError)
    logits, labels = np.ones(3, np.float32), np.ones((2, 3), np.float32)
    assert ol.softmax_cross_entropy(logits, labels).shape == (2,)
    with pytest.raises(LossInputError, match=r"softmax_cross_entropy: labels of shape \(2, 3\)"):
        losses.softmax_cross_entropy(logits, labels)

    where = np.array([True, False])
    with pytest.raises(ValueError, match="Incompatible shapes for broadcasting"):
        ol.poly_loss_cross_entropy(labels, labels, where=where)
    with pytest.raises(LossInputError, match=r"poly_loss_cross_entropy: where of shape \(2,\)"):
        losses.poly_loss_cross_entropy(labels, labels, where=where)

    with pytest.raises(ValueError, match="axis 2 is out of bounds for array of dimension 2"):
        ol.softmax_cross_entropy(labels, labels, axis=2)
    with pytest.raises(LossInputError, match="softmax_cross_entropy: axis=2 is out of range"):
        losses.softmax_cross_entropy(labels, labels, axis=2)


def test_claim_optax_triplet_distance_is_a_signed_sum_for_odd_degrees():
    """optax raises ``a - p`` itself to the power: for degree 3 its distance is the cube root
    of the signed sum (NaN where that sum is negative); functrain's is the distance of
    ``|a - p|``. For degree 2 the two agree."""
    anchors = np.array([[1.0, 0.0], [-1.0, 0.0]], np.float32)
    positives = np.array([[0.0, 0.5], [0.0, -0.5]], np.float32)   # differences (1, -0.5), (-1, 0.5)
    negatives = np.zeros((2, 2), np.float32)                       # differences (1, 0), (-1, 0)
    eps = 1e-6
    theirs = np.asarray(ol.triplet_margin_loss(anchors, positives, negatives, norm_degree=3,
                                               margin=1.0, eps=eps))
    # Row 0: (1 - 0.125 + eps)^(1/3) - (1 + eps)^(1/3) + 1; row 1: the sums are negative.
    np.testing.assert_allclose(theirs[0], (0.875 + eps) ** (1 / 3) - (1 + eps) ** (1 / 3) + 1,
                               rtol=1e-5)
    assert np.isnan(theirs[1])
    ours = np.asarray(losses.triplet_margin_loss(anchors, positives, negatives, norm_degree=3,
                                                 margin=1.0, eps=0.0))
    np.testing.assert_allclose(ours, [1.125 ** (1 / 3)] * 2, rtol=1e-5)
    for lib in (ol, losses):
        np.testing.assert_allclose(
            lib.triplet_margin_loss(anchors, positives, negatives, norm_degree=2, eps=0.0),
            [1.25 ** 0.5] * 2, rtol=1e-5)


def test_claim_focal_loss_refuses_what_optax_takes():
    """alpha 1.5 or gamma -1: optax computes a loss, functrain raises a ValueError naming the
    argument; in range the two give the same numbers."""
    logits = np.array([0.5, -1.0, 2.0], np.float32)
    labels = np.array([1.0, 0.0, 1.0], np.float32)
    for kwargs, argument in (({"alpha": 1.5}, "alpha"), ({"gamma": -1.0}, "gamma")):
        assert np.all(np.isfinite(ol.sigmoid_focal_loss(logits, labels, **kwargs)))
        with pytest.raises(ValueError, match=f"sigmoid_focal_loss: {argument} must be"):
            losses.sigmoid_focal_loss(logits, labels, **kwargs)
    np.testing.assert_allclose(losses.sigmoid_focal_loss(logits, labels, alpha=0.25, gamma=2.0),
                               ol.sigmoid_focal_loss(logits, labels, alpha=0.25, gamma=2.0),
                               rtol=1e-6)


def test_claim_sparsemax_of_16_bit_scores_computes_in_float32_throughout():
    """bfloat16 and float16 scores give the bits of the same scores cast to float32 first;
    optax's loss of bfloat16 scores (float32 too) does not (it subtracts in bfloat16)."""
    rng = np.random.default_rng(3)
    scores = jnp.asarray(rng.standard_normal((64, 7)) * 3, jnp.float32)
    labels = jnp.asarray(rng.integers(0, 7, 64))
    for dtype in (jnp.bfloat16, jnp.float16):
        narrow = scores.astype(dtype)
        ours = losses.multiclass_sparsemax_loss(narrow, labels)
        assert ours.dtype == jnp.float32
        np.testing.assert_array_equal(
            ours, losses.multiclass_sparsemax_loss(narrow.astype(jnp.float32), labels))
    narrow = scores.astype(jnp.bfloat16)
    theirs = ol.multiclass_sparsemax_loss(narrow, labels)
    assert theirs.dtype == jnp.float32
    assert not np.array_equal(theirs, ol.multiclass_sparsemax_loss(narrow.astype(jnp.float32),
                                                                   labels))
