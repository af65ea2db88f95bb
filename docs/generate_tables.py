"""Writes docs/optimizers.md's optimizer tables, and the README's table of optax.contrib's
optimizers by family, from the declarations (``make docs-tables``).

Each group of ``functrain.declarations.GROUPS`` has one table in docs/optimizers.md between

    <!-- generated from functrain.declarations by `make docs-tables`: <group> -->
    <!-- end generated -->

whose rows are written from each optimizer's ``@declare_optimizer(..., summary=...,
signature=...)``: the first cell is ``signature`` (default: the full signature, every default
shown), the second ``summary``. An optimizer declared ``listed_with=other`` is listed in
``other``'s row, after it. Rows keep the order they have in the file (reorder them there by
hand if you like); a new optimizer's row goes last, in the order of its module and line.
Rows that name no declared optimizer (helpers such as ``palm_beta2_schedule``) are kept as
they are, after the optimizers' rows; each must name a function of functrain.

The README's row ``| optimizers | ... |`` lists optax's core optimizers (declared
``optax="core"``) by family, and its block between ``<!-- contrib by family: generated ... -->`` and
``<!-- end contrib by family -->`` has one row per family folder (in
``functrain.families.ORDER``) holding an optimizer declared ``optax="contrib"``: the family's
title (its package docstring, up to a colon or the first full stop) and the optimizers'
names, in the order of their module and line; cells are escaped for Markdown tables.

``tests/test_declarations.py`` fails, naming the stale rows, when a file differs from what
this writes. ``python docs/generate_tables.py --check`` prints them without writing.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import pathlib
import re
import sys
from typing import Callable, Optional

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # this checkout's functrain, whatever the working directory
    sys.path.insert(0, str(ROOT))

import importlib  # noqa: E402

import functrain  # noqa: E402  (loads every module, so every declaration)
import functrain.contrib  # noqa: E402
import functrain.families  # noqa: E402
from functrain.declarations import GROUPS, OPTIMIZERS, Declared  # noqa: E402

PAGE = ROOT / "docs" / "optimizers.md"
BEGIN = "<!-- generated from functrain.declarations by `make docs-tables`: {} -->"
END = "<!-- end generated -->"
BLOCK = re.compile(r"^<!-- generated from functrain\.declarations by `make docs-tables`: "
                   r"(.+?) -->\n(.*?)^<!-- end generated -->$", re.MULTILINE | re.DOTALL)
HEADER = ["| Optimizer | What it is |", "|---|---|"]
NAMED = re.compile(r"`(\w+)[`(]")
README = ROOT / "README.md"
README_BLOCK = re.compile(r"^(<!-- contrib by family: generated from functrain\.declarations by "
                          r"`make docs-tables` -->\n)(.*?)^(<!-- end contrib by family -->)$",
                          re.MULTILINE | re.DOTALL)
CORE_ROW = re.compile(r"^\| optimizers \| .*\|$", re.MULTILINE)

def summary(d: Declared) -> Optional[str]:
    return d.summary


def full_signature(function: Callable) -> str:
    """``name(a, b=1.0, *, c=None)``: the call with every default, without annotations."""
    out, star = [], False
    for name, p in inspect.signature(function).parameters.items():
        if p.kind == p.KEYWORD_ONLY and not star:
            out.append("*")
        star = star or p.kind in (p.KEYWORD_ONLY, p.VAR_POSITIONAL)
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        default = "" if p.default is p.empty else f"={p.default!r}"
        out.append(prefix + name + default)
    return f"{function.__name__}({', '.join(out)})"


def signature(d: Declared) -> str:
    return d.signature or full_signature(d.function)


def _where(d: Declared) -> tuple:
    return d.module, d.function.__code__.co_firstlineno


def declaration_problems() -> list[str]:
    """Each declared optimizer has a summary or is ``listed_with`` one of its group that has."""
    problems = []
    for name, d in sorted(OPTIMIZERS.items()):
        lead = OPTIMIZERS.get(d.listed_with) if d.listed_with else None
        if d.listed_with and (lead is None or lead.group != d.group or summary(lead) is None):
            problems.append(f"{name}: listed_with={d.listed_with!r} names no declared optimizer "
                            f"of group {d.group!r} with a summary")
        elif not d.listed_with and summary(d) is None:
            problems.append(f"{name}: no summary=... (its row's text in docs/optimizers.md) in "
                            f"its @declare_optimizer in {d.module}")
    return problems


def signature_problems() -> list[str]:
    """The declared ``signature=`` cells against the functions: each named argument exists
    and each literal default (``b1=0.9``) is the function's."""
    problems = []
    for name, d in sorted(OPTIMIZERS.items()):
        text = signature(d)
        if text == full_signature(d.function) or "(" not in text:
            continue
        params = inspect.signature(d.function).parameters
        inner = text[text.index("(") + 1:text.rindex(")")]
        depth, parts, cur = 0, [], ""
        for ch in inner:  # split at the top level's commas
            depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(ch, 0)
            if ch == "," and depth == 0:
                parts.append(cur.strip())
                cur = ""
            else:
                cur += ch
        parts.append(cur.strip())
        for part in (p for p in parts if p and p not in ("...", "*")):
            key, _, value = part.partition("=")
            if key not in params:
                problems.append(f"{name}: its signature cell names {key!r}, no argument of it")
                continue
            try:
                literal = ast.literal_eval(value) if value and value != "..." else None
            except (ValueError, SyntaxError):
                continue  # a call (lbfgs's linesearch): not checked
            if value and value != "..." and literal != params[key].default:
                problems.append(f"{name}: its signature cell says {key}={value}, the function's "
                                f"default is {params[key].default!r}")
    return problems


def optimizer_rows(group: str, order: list[str]) -> dict[str, str]:
    """lead name -> its row, for the optimizers of ``group``: those named in ``order`` first,
    in that order, then the others by module and line."""
    declared = [d for d in OPTIMIZERS.values() if d.group == group]
    leads = sorted((d for d in declared if not d.listed_with), key=_where)
    leads.sort(key=lambda d: order.index(d.name) if d.name in order else len(order))
    rows = {}
    for lead in leads:
        listed = [lead] + sorted((d for d in declared if d.listed_with == lead.name), key=_where)
        cell = ", ".join(f"`{signature(d)}`" for d in listed)
        rows[lead.name] = f"| {cell} | {summary(lead)} |"
    return rows


def _exists(name: str) -> bool:
    return any(inspect.isfunction(getattr(m, name, None)) or inspect.isclass(getattr(m, name, None))
               for m in (functrain, functrain.contrib))


def table(group: str, old: str) -> str:
    """The block of ``group`` written from the declarations, given its text ``old``: the
    order of its rows and its rows that name no declared optimizer are kept."""
    order, kept = [], []
    for line in old.splitlines():
        if not line.startswith("| `"):
            continue
        names = NAMED.findall(line.split("|")[1])
        declared = [n for n in names if n in OPTIMIZERS]
        if declared:
            order.append(declared[0])
        elif names and all(_exists(n) for n in names):
            kept.append(line)
        else:
            raise ValueError(f"docs/optimizers.md, table {group!r}: this row names no declared "
                             f"optimizer and no function of functrain (remove it or declare "
                             f"it):\n  {line}")
    rows = list(optimizer_rows(group, order).values())
    return "\n".join(["", *HEADER, *rows, *kept, "", ""])


def render(text: str) -> str:
    """``text`` (docs/optimizers.md) with each group's table written from the declarations."""
    problems = declaration_problems()
    if problems:
        raise ValueError("declarations the tables cannot be written from:\n  "
                         + "\n  ".join(problems))
    found = [m.group(1) for m in BLOCK.finditer(text)]
    if sorted(found) != sorted(GROUPS):
        raise ValueError(f"docs/optimizers.md: one generated block per group {sorted(GROUPS)} "
                         f"expected, found {found} (markers: {BEGIN.format('<group>')} ... "
                         f"{END})")
    return BLOCK.sub(lambda m: f"{BEGIN.format(m.group(1))}\n{table(m.group(1), m.group(2))}"
                               f"{END}", text)


def stale_rows(text: str) -> list[str]:
    """What :func:`render` would change in ``text``, table by table: ``<group>: - line`` (in
    the file, not written) and ``<group>: + line`` (written, not in the file); empty when
    the file is up to date."""
    try:
        new = render(text)
    except ValueError as error:
        return [str(error)]
    diff = []
    for was, now in zip(BLOCK.finditer(text), BLOCK.finditer(new)):
        old_lines, new_lines = was.group(2).splitlines(), now.group(2).splitlines()
        diff += [f"{was.group(1)}: - {line}" for line in old_lines if line not in new_lines]
        diff += [f"{was.group(1)}: + {line}" for line in new_lines if line not in old_lines]
    return diff or ([] if new == text else ["the rows' order or spacing differs"])


def md_cell(text: str) -> str:
    """``text`` safe in a Markdown table cell: pipes escaped, newlines as spaces."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def family_title(family: str) -> str:
    """A family's title: its package docstring's first words, up to a colon or full stop."""
    doc = (importlib.import_module(f"functrain.families.{family}").__doc__ or family).strip()
    return re.split(r":|\.(?:\s|$)", " ".join(doc.split()), maxsplit=1)[0].strip()


def names_by_family(optax: str) -> dict[str, list[str]]:
    """family -> the names of its optimizers declared ``optax=optax`` (a family's
    ``optimizers.py`` first, then by module and line), for the families holding any, in
    ``functrain.families.ORDER``."""
    ordered = sorted((d for d in OPTIMIZERS.values() if d.optax == optax),
                     key=lambda d: (not d.module.endswith(".optimizers"), *_where(d)))
    found = {family: [d.name for d in ordered if d.module.split(".")[2] == family]
             for family in functrain.families.ORDER}
    return {family: names for family, names in found.items() if names}


def _names_cell(names: list[str]) -> str:
    return md_cell(", ".join(f"`{n}`" for n in names))


def readme_table() -> str:
    """The README's table of optax.contrib's optimizers, one row per family."""
    rows = [f"| {md_cell(family_title(family))} | {_names_cell(names)} |"
            for family, names in names_by_family("contrib").items()]
    return "\n".join(["| family | names |", "|---|---|", *rows]) + "\n"


def core_row() -> str:
    """The README's row of optax's core optimizers (``functrain.<name>``), by family."""
    names = [n for names in names_by_family("core").values() for n in names]
    return f"| optimizers | {_names_cell(names)} |"


def render_readme(text: str) -> str:
    """The README with its generated block and its row of core optimizers rewritten (a
    ``ValueError`` if it has not one of each)."""
    if len(README_BLOCK.findall(text)) != 1 or len(CORE_ROW.findall(text)) != 1:
        raise ValueError("README.md: one block '<!-- contrib by family: generated ... -->' ... "
                         "'<!-- end contrib by family -->' and one row '| optimizers | ... |' "
                         "expected")
    text = CORE_ROW.sub(lambda m: core_row(), text)
    return README_BLOCK.sub(lambda m: m.group(1) + readme_table() + m.group(3), text)


def stale_readme(text: str) -> list[str]:
    """The README's generated lines that differ from what :func:`render_readme` writes."""
    try:
        new = render_readme(text)
    except ValueError as error:
        return [str(error)]
    old_lines, new_lines = text.splitlines(), new.splitlines()
    return ([f"README: - {line}" for line in old_lines if line not in new_lines]
            + [f"README: + {line}" for line in new_lines if line not in old_lines])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="print stale rows, write nothing")
    check = parser.parse_args().check
    status = 0
    for path, stale, write in ((PAGE, lambda t: signature_problems() + stale_rows(t), render),
                               (README, stale_readme, render_readme)):
        text = path.read_text()
        problems = stale(text)
        if check or not problems or not all(": - " in p or ": + " in p for p in problems):
            print("\n".join(problems) or f"{path.relative_to(ROOT)}: up to date")
            status = status or (1 if problems else 0)
            continue
        path.write_text(write(text))
        print(f"{path.relative_to(ROOT)}: tables written ({len(problems)} lines changed)")
    return status


if __name__ == "__main__":
    sys.exit(main())
