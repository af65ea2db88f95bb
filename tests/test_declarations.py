"""Every list of optimizers outside their modules agrees with what each declares where it is
defined (``@declare_optimizer``, ``@state_value_kinds``: functrain.declarations).

Generated from the declarations (no list to go stale): the low-bit field codes
(quantized_state.field_codes), tests/test_checkpoint_interchange.py's BEYOND_OPTAX, the
registry's contrib flags and optax references. Checked here, each failure naming the entry:
docs/optimizers.md's tables, the README's optimizer tables, the API pages docs/api/*.rst,
functrain.contrib's docstring, the benchmarks' lists (lightbench, beyond_optax). Checked
elsewhere: the stress list (tests/test_stress_list.py), the registry (tests/test_registry.py).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pathlib
import re
import sys
import types
from typing import NamedTuple

import jax.numpy as jnp
import optax
import pytest

import functrain
from functrain import declarations
from functrain.declarations import (GROUPS, OPTIMIZERS as DECLARED, STATE_VALUE_KINDS,
                                    declare_optimizer, declared_state_classes,
                                    state_value_kinds)
from functrain.quantized_state import field_codes
import registry
from helpers import api_pages

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _public(name: str, contrib: bool) -> object:
    return getattr(functrain.contrib if contrib else functrain, name, None)


def _exists(name: str) -> bool:
    """Whether ``name`` is a function or class of functrain or functrain.contrib."""
    return any(inspect.isfunction(o) or inspect.isclass(o)
               for o in (_public(name, False), _public(name, True)))


# --------------------------------------------------------------------------
# The declarations themselves
# --------------------------------------------------------------------------


def face_problems(contrib_face: object, top: object) -> list[str]:
    """Where functrain.contrib and functrain (the faces over functrain/families/) disagree
    with the declarations: every optimizer is exported under its declared face as the declared
    function, contrib exports no core optimizer, and every optimizer contrib exports (a
    public function returning a transformation, less stages and parts) is declared."""
    problems = []
    for name, d in sorted(DECLARED.items()):
        face = contrib_face if d.contrib else top
        if getattr(face, name, None) is not d.function:
            problems.append(f"{name} (declared optax={d.optax!r}, in {d.module}) is not "
                            f"{'functrain.contrib' if d.contrib else 'functrain'}.{name}")
        if not d.contrib and getattr(contrib_face, name, None) is not None:
            problems.append(f"functrain.contrib.{name}: {name} is optax's core optimizer")
    for name in sorted(set(registry.contrib_functions(contrib_face)) - set(DECLARED)):
        problems.append(f"functrain.contrib.{name} returns a transformation but is no "
                        f"declared optimizer (@declare_optimizer where it is defined)")
    return problems


def test_the_faces_export_what_is_declared():
    assert not face_problems(functrain.contrib, functrain), face_problems(functrain.contrib,
                                                                          functrain)
    planted = types.SimpleNamespace(**vars(functrain.contrib))
    del planted.laprop
    planted.adamw = functrain.adamw
    planted.zz = lambda: None
    planted.zz.__annotations__["return"] = "GradientTransformation"
    found = face_problems(planted, functrain)
    assert any(p.startswith("laprop ") for p in found), found
    assert any(p.startswith("functrain.contrib.adamw:") for p in found), found
    assert any(p.startswith("functrain.contrib.zz ") for p in found), found

def test_declarations_are_complete_and_well_formed():
    assert len(DECLARED) >= 67, sorted(DECLARED)
    for name, d in DECLARED.items():
        assert d.function.__name__ == name and d.group in GROUPS and d.paper.strip(), name
        assert (d.optax == "core") == (d.group == "optimizers"), (name, d.group, d.optax)
        assert (d.optax == "contrib") == (d.group == "contrib"), (name, d.group, d.optax)
        assert d.contrib == (d.group != "optimizers"), (name, d.module)
        if d.optax:  # optax has a function of this name where declared
            home = optax.contrib if d.optax == "contrib" else optax
            assert callable(getattr(home, name, None)), f"{name}: optax has no {d.optax} {name}"
        else:
            assert getattr(optax, name, None) is None and getattr(optax.contrib, name, None) \
                is None, f"{name} is declared optax=None, but optax has it"
        years = re.findall(r"\b(?:19|20)\d\d\b", d.paper)
        assert all(y in (d.function.__doc__ or "") for y in years), (
            f"{name}: its docstring does not cite the declared paper {d.paper!r}")


def test_the_decorators_return_what_they_decorate_and_refuse_bad_declarations(monkeypatch):
    with pytest.raises(ValueError, match="two state classes named ScaleByAdamState"):
        state_value_kinds(mu="signed")(
            type("ScaleByAdamState", (NamedTuple("S0", [("mu", float)]),), {}))
    for table in ("OPTIMIZERS", "STATE_VALUE_KINDS", "_STATE_CLASSES"):  # on empty tables
        monkeypatch.setattr(declarations, table, {})

    def my_opt(learning_rate: float) -> None:
        """Example."""
    assert declare_optimizer("contrib", "A & B, 2020", optax=None)(my_opt) is my_opt
    assert declarations.OPTIMIZERS["my_opt"].function is my_opt
    with pytest.raises(ValueError, match="declared twice"):
        def my_opt(learning_rate: float) -> None:  # noqa: F811 (another one, same name)
            """Example."""
        declare_optimizer("contrib", "A & B, 2020", optax=None)(my_opt)
    with pytest.raises(ValueError, match="group"):
        declare_optimizer("optimisers", "A, 2020", optax="core")
    with pytest.raises(ValueError, match="optax"):
        declare_optimizer("optimizers", "A, 2020", optax="yes")
    with pytest.raises(ValueError, match="paper"):
        declare_optimizer("optimizers", " ", optax="core")

    class S(NamedTuple):
        mu: float
    assert state_value_kinds(mu="signed")(S) is S
    assert declarations.STATE_VALUE_KINDS == {"S": {"mu": "signed"}}
    with pytest.raises(ValueError, match="no field"):
        state_value_kinds(nu="unsigned")(S)
    with pytest.raises(ValueError, match="kinds must be"):
        state_value_kinds(mu="positive")


# The table quantized_state held before the declarations (FIELD_CODES): the codes stay.
CODES_BEFORE = {
    "ScaleByAdamState": {"mu": "signed", "nu": "unsigned"},
    "ScaleByAmsgradState": {"mu": "signed", "nu": "unsigned", "nu_max": "unsigned"},
    "ScaleByBeliefState": {"mu": "signed", "nu": "unsigned"},
    "ScaleByLapropState": {"mu": "signed", "nu": "unsigned"},
    "ScaleByAdemamixState": {"m1": "signed", "m2": "signed", "nu": "unsigned"},
    "ScaleBySimplifiedAdEMAMixState": {"m": "signed", "n": "unsigned"},
    "ScaleByAdanState": {"m": "signed", "v": "signed", "n": "unsigned", "g": "signed"},
    "ScaleByLionState": {"mu": "signed"},
    "MuonState": {"mu": "signed"},
    "TraceState": {"trace": "signed"},
    "EmaState": {"ema": "signed"},
    "ScaleByRmsState": {"nu": "unsigned"},
    "ScaleByRmsWithCountState": {"nu": "unsigned"},
    "ScaleByRStdDevState": {"mu": "signed", "nu": "unsigned"},
    "ScaleByRStdDevWithCountState": {"mu": "signed", "nu": "unsigned"},
    "ScaleByRssState": {"sum_of_squares": "unsigned"},
    "ScaleByAdaDeltaState": {"e_g": "unsigned", "e_x": "unsigned"},
    "MultiStepsState": {},
}


def test_state_value_kinds_keep_the_codes_of_before():
    assert {n: k for n, k in STATE_VALUE_KINDS.items() if n in CODES_BEFORE} == CODES_BEFORE
    assert set(declared_state_classes()) == set(STATE_VALUE_KINDS)
    # A wrong kind on a second moment would store it with the signed code, silently.
    unsigned = {f for k in STATE_VALUE_KINDS.values() for f, v in k.items() if v == "unsigned"}
    assert unsigned <= {"nu", "nu_max", "n", "sum_of_squares", "e_g", "e_x"}, unsigned


OPTAX_STATES = {  # optax's optimizer -> functrain's of the same state classes
    "adam": lambda m: m.adam(1e-3), "amsgrad": lambda m: m.amsgrad(1e-3),
    "adabelief": lambda m: m.adabelief(1e-3), "adan": lambda m: m.adan(1e-3),
    "lion": lambda m: m.lion(1e-3), "sgd_momentum": lambda m: m.sgd(1e-3, momentum=0.9),
    "rmsprop_centered": lambda m: m.rmsprop(1e-3, centered=True),
    "adagrad": lambda m: m.adagrad(1e-3), "adadelta": lambda m: m.adadelta(1e-3),
    "multi_steps_adam": lambda m: m.MultiSteps(m.adam(1e-3), 2),
    "muon": lambda m: m.contrib.muon(1e-3), "ademamix": lambda m: m.contrib.ademamix(1e-3),
}


@pytest.mark.parametrize("name", sorted(OPTAX_STATES))
def test_optax_state_classes_get_the_codes_of_functrain_classes_of_the_same_name(name):
    params = {"w": jnp.ones((4, 3)), "b": jnp.ones(3)}
    theirs = field_codes(OPTAX_STATES[name](optax).init(params))
    ours = field_codes(OPTAX_STATES[name](functrain).init(params))
    assert str(theirs) == str(ours), (theirs, ours)  # same class names, fields and codes
    assert "unsigned" in str(ours) or name in ("lion", "sgd_momentum", "muon"), ours


def test_optax_adam_wrapped_in_quantized_state_stores_nu_with_the_unsigned_code():
    params = {"w": jnp.ones((64, 64))}
    state = functrain.quantized_state(optax.adam(1e-3), min_size=64).init(params)
    assert type(state[0]).__module__.startswith("optax")
    assert state[0].mu["w"].code.endswith("_signed") and state[0].nu["w"].code.endswith(
        "_unsigned"), (state[0].mu["w"].code, state[0].nu["w"].code)


# --------------------------------------------------------------------------
# Lists checked against the declarations
# --------------------------------------------------------------------------

sys.path.insert(0, str(ROOT / "docs"))
import generate_tables  # noqa: E402  (docs/generate_tables.py: make docs-tables)

OPTIMIZERS_MD_IS_STALE = ("docs/optimizers.md's tables differ from the declarations "
                          "(@declare_optimizer's summary=, signature=, listed_with=); run "
                          "`make docs-tables` (python docs/generate_tables.py):\n  ")


def test_optimizers_md_tables_are_written_from_the_declarations():
    """Each group's table in docs/optimizers.md is what docs/generate_tables.py writes: one
    row per declared optimizer (or per row of optimizers ``listed_with`` it), in its group."""
    problems = generate_tables.stale_rows((ROOT / "docs" / "optimizers.md").read_text())
    assert not problems, OPTIMIZERS_MD_IS_STALE + "\n  ".join(problems)


def test_declared_row_signatures_keep_the_functions_defaults():
    problems = generate_tables.signature_problems() + generate_tables.declaration_problems()
    assert not problems, "@declare_optimizer(..., signature=...) is stale:\n  " + \
        "\n  ".join(problems)


def test_the_row_checks_name_planted_bad_declarations(monkeypatch):
    md = (ROOT / "docs" / "optimizers.md").read_text()
    monkeypatch.setitem(DECLARED, "adam", dataclasses.replace(DECLARED["adam"], summary=None))
    monkeypatch.setitem(DECLARED, "sgd", dataclasses.replace(DECLARED["sgd"],
                                                             signature="sgd(lr, momentum=0.9)"))
    assert any("adam: no summary" in p for p in generate_tables.stale_rows(md))
    assert any("'lr'" in p for p in generate_tables.signature_problems())
    assert any("momentum=0.9" in p for p in generate_tables.signature_problems())


def test_declare_optimizer_refuses_a_bad_row(monkeypatch):
    monkeypatch.setattr(declarations, "OPTIMIZERS", {})

    def my_opt(learning_rate: float) -> None:
        """Example."""
    for bad in (dict(summary=" "), dict(summary="A row.", listed_with="adam")):
        with pytest.raises(ValueError, match="summary"):
            declare_optimizer("contrib", "A & B, 2020", optax=None, **bad)
    with pytest.raises(ValueError, match="listed_with itself"):
        declare_optimizer("contrib", "A & B, 2020", optax=None, listed_with="my_opt")(my_opt)
    declare_optimizer("contrib", "A & B, 2020", optax=None, summary="A row.")(my_opt)
    assert declarations.OPTIMIZERS["my_opt"].summary == "A row."


def stale_in_readme(text: str) -> list[str]:
    """The README lists a selection: what its optimizer tables name must be declared (the
    'optimizers' row of the API table, the beyond-optax table) or exist (contrib's)."""
    problems = []
    tables = re.findall(r"((?:^\|.*\n)+)", text, flags=re.MULTILINE)
    checked = 0
    for table in tables:
        header = table.splitlines()[0].split("|")[1].strip()
        for line in table.splitlines()[2:]:
            cells = line.split("|")
            if header == "optimizer":        # the beyond-optax table
                names, must_declare = generate_tables.NAMED.findall(cells[1]), True
            elif header == "group" and cells[1].strip() == "optimizers":
                names, must_declare = generate_tables.NAMED.findall(cells[2]), True
            elif header == "family":         # contrib's families: names of functrain.contrib
                names, must_declare = generate_tables.NAMED.findall(cells[2]), False
            else:
                continue
            checked += len(names)
            for name in names:
                if must_declare and name not in DECLARED:
                    problems.append(f"{name} is listed as an optimizer but not declared")
                elif _public(name, True) is None and _public(name, False) is None:
                    problems.append(f"{name} is no name of functrain or functrain.contrib")
    assert checked >= 40, f"the README's optimizer tables were not found ({checked} names)"
    return problems


def test_readme_lists_only_declared_optimizers():
    problems = stale_in_readme((ROOT / "README.md").read_text())
    assert not problems, "README.md is stale:\n  " + "\n  ".join(problems)


def test_readme_optimizer_tables_are_written_from_the_declarations():
    """The README's row of optax's core optimizers and its table of optax.contrib's by family
    are what docs/generate_tables.py writes (``make docs-tables``)."""
    problems = generate_tables.stale_readme((ROOT / "README.md").read_text())
    assert not problems, ("README.md's generated tables differ from the declarations; run "
                          "`make docs-tables`:\n  " + "\n  ".join(problems))


def test_the_readme_tables_follow_the_declarations_and_escape_markdown(monkeypatch):
    text = (ROOT / "README.md").read_text()
    rendered = generate_tables.render_readme(text)
    core = next(line for line in rendered.splitlines() if line.startswith("| optimizers |"))
    assert {n for n, d in DECLARED.items() if d.optax == "core"} == set(
        re.findall(r"`(\w+)`", core))
    table = rendered[rendered.index("<!-- contrib by family"):
                     rendered.index("<!-- end contrib by family")]
    assert {n for n, d in DECLARED.items() if d.optax == "contrib"} == set(
        re.findall(r"`(\w+)`", table))
    # a declared optimizer moved to another family moves row; a pipe is escaped
    monkeypatch.setitem(DECLARED, "madgrad", dataclasses.replace(
        DECLARED["madgrad"], module="functrain.families.muon.madgrad"))
    monkeypatch.setattr(generate_tables, "family_title", lambda f: f"{f} | x")
    moved = generate_tables.readme_table()
    assert "| muon \\| x | `madgrad`, `muon` |" in moved, moved
    assert any("README: - " in p for p in generate_tables.stale_readme(text.replace(
        "`madgrad`", "`madgrad`, `adam`")))
    assert generate_tables.stale_readme(text.replace("<!-- end contrib by family -->", ""))


DIRECTIVE = re.compile(r"^\.\. auto(function|class)::\s+([\w.]+)", re.MULTILINE)


def stale_in_api_pages(pages: dict[str, str]) -> list[str]:
    """Every declared optimizer has an autofunction on its group's page, every declared state
    class an autoclass on some page (``pages``: file name -> text)."""
    problems = []
    for name, d in sorted(DECLARED.items()):
        page = GROUPS[d.group][0]
        path = f"functrain.{'contrib.' if d.contrib else ''}{name}"
        if (".. autofunction:: " + path) not in pages.get(page, "").splitlines():
            problems.append(f"{path}: no '.. autofunction:: {path}' in docs/api/{page} (on "
                            f"contrib.rst: export it from functrain.contrib and list it in its "
                            f"module's __all__)")
    classes = {}
    for text in pages.values():
        for kind, path in DIRECTIVE.findall(text):
            module, _, attr = path.rpartition(".")
            if kind == "class":
                classes[id(getattr(importlib.import_module(module), attr))] = path
    for name, cls in sorted(declared_state_classes().items()):
        if id(cls) not in classes:
            problems.append(f"{cls.__module__}.{name}: declared @state_value_kinds, no "
                            f"'.. autoclass::' in docs/api/*.rst")
    return problems


def test_api_pages_document_every_declared_optimizer_and_state_class():
    # The pages as Sphinx reads them: each '.. declared-modules::' expanded into its entries.
    problems = stale_in_api_pages(api_pages())
    assert not problems, "docs/api/*.rst is stale:\n  " + "\n  ".join(problems)


def stale_in_contrib_docstring(doc: str) -> list[str]:
    """functrain.contrib's docstring names (``name``) every optimizer optax lacks, and its
    'also at functrain's top level' list is what the top level re-exports."""
    named = set(re.findall(r"``(\w+)``", doc))
    problems = [f"{n} (declared optax=None) is not named in functrain.contrib's docstring"
                for n, d in sorted(DECLARED.items()) if d.contrib and d.optax is None
                and n not in named]
    listed = set(re.findall(r"``(\w+)``", doc.split("\n\n")[0]))  # the first paragraph's list
    problems += [f"``{n}`` in functrain.contrib's docstring's list is no declared contrib "
                 f"optimizer" for n in sorted(listed)
                 if n not in DECLARED or not DECLARED[n].contrib]
    top = re.search(r"top level: (.*?)\. ", doc.replace("\n", " "))
    listed = set(re.findall(r"``(\w+)``", top.group(1))) if top else set()
    at_top = {n for n, d in DECLARED.items() if d.contrib and _public(n, False) is d.function}
    problems += [f"{n}: re-exported at the top level, not in the docstring's list"
                 for n in sorted(at_top - listed)]
    problems += [f"{n}: in the docstring's top-level list, not at functrain's top level"
                 for n in sorted(listed - at_top)]
    return problems


def test_contrib_docstring_names_the_declared_optimizers():
    problems = stale_in_contrib_docstring(functrain.contrib.__doc__)
    assert not problems, "functrain/contrib/__init__.py's docstring is stale:\n  " + \
        "\n  ".join(problems)


def stale_in_benchmark(optimizers: dict) -> list[str]:
    """Each benchmark entry (lightbench's, beyond_optax's) is named after declared optimizers
    (``a+b``: a modifier in front; ``name_variant``: a setting) and calls only declared
    optimizers and chain."""
    problems = []
    for key, build in sorted(optimizers.items()):
        for part in key.split("+"):
            if not any(part == n or part.startswith(n + "_") for n in DECLARED):
                problems.append(f"{key!r}: {part!r} names no declared optimizer")
        called = {n for n in build.__code__.co_names if _exists(n)}  # functions only
        undeclared = sorted(called - set(DECLARED) - {"chain"})
        if undeclared or not called & set(DECLARED):
            problems.append(f"{key!r} calls {sorted(called)}: not declared optimizers: "
                            f"{undeclared}")
    return problems


def test_lightbench_names_only_declared_optimizers():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import lightbench
    problems = stale_in_benchmark(lightbench.OPTIMIZERS)
    assert not problems, "benchmarks/lightbench.py is stale:\n  " + "\n  ".join(problems)


def test_beyond_optax_benchmark_names_only_declared_optimizers():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import beyond_optax
    problems = stale_in_benchmark(beyond_optax.OPTIMIZERS)
    assert not problems, "benchmarks/beyond_optax.py is stale:\n  " + "\n  ".join(problems)


# --------------------------------------------------------------------------
# Each check fails on a planted stale entry, naming it
# --------------------------------------------------------------------------

def _text(*parts: str) -> str:
    return (ROOT.joinpath(*parts)).read_text()


def test_the_checks_name_planted_stale_entries():
    md = _text("docs", "optimizers.md")
    row = next(line for line in md.splitlines() if line.startswith("| `sgd("))
    assert any("sgd(" in p for p in generate_tables.stale_rows(md.replace(row + "\n", "")))
    muon = next(line for line in md.splitlines() if line.startswith("| `muon("))
    moved = md.replace(muon + "\n", "").replace(row, row + "\n" + muon)
    assert sum(p.endswith(muon) for p in generate_tables.stale_rows(moved)) == 2  # - and +
    planted = md.replace(row, row + "\n| `adamz(lr)` | x |")
    assert any("adamz" in p for p in generate_tables.stale_rows(planted))
    assert any("sgd(" in p for p in generate_tables.stale_rows(md.replace("(Nesterov)", "N")))

    readme = _text("README.md")
    planted = readme.replace("| `sgd`, ", "| `sgd`, `adamz`, ")
    assert any("adamz" in p for p in stale_in_readme(planted))

    pages = api_pages()
    pages["optimizers.rst"] = pages["optimizers.rst"].replace(
        ".. autofunction:: functrain.adam\n", "")
    pages["building_blocks.rst"] = pages["building_blocks.rst"].replace(
        ".. autoclass:: functrain.ScaleByAdamState\n", "")
    problems = stale_in_api_pages(pages)
    assert any(p.startswith("functrain.adam:") for p in problems), problems
    assert any("ScaleByAdamState" in p for p in problems), problems
    with pytest.MonkeyPatch.context() as patch:  # a generated section: its module's __all__
        patch.setattr(importlib.import_module("functrain.families.adam.laprop"), "__all__",
                      ["scale_by_laprop"])
        pages = api_pages()
    problems = stale_in_api_pages(pages)
    assert any(p.startswith("functrain.contrib.laprop:") for p in problems), problems
    assert any("ScaleByLapropState" in p for p in problems), problems

    doc = functrain.contrib.__doc__
    planted = doc.replace("``soap``, ", "")
    assert any(p.startswith("soap ") for p in stale_in_contrib_docstring(planted))
    assert any("prodigy" in p for p in stale_in_contrib_docstring(doc.replace("``prodigy``, ", "")))
    planted = doc.replace("``soap``, ", "``soap``, ``adamz``, ")
    assert any("``adamz``" in p for p in stale_in_contrib_docstring(planted))

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import lightbench
    planted = {**lightbench.OPTIMIZERS, "adamz": lambda lr: functrain.adam(lr),
               "clipped": lambda lr: functrain.clip(lr)}
    problems = stale_in_benchmark(planted)
    assert any("'adamz'" in p for p in problems) and any("'clipped'" in p for p in problems)
