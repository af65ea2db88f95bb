"""``.. declared-modules:: GROUP``: the API entries of a group's optimizer modules, generated.

Each optimizer declares its docs group where it is defined (``@declare_optimizer(group,
...)``, :mod:`functrain.declarations`). On an API page, the directive

.. code-block:: rst

   .. declared-modules:: beyond optax

stands for one section per module that defines an optimizer declared in that group (every
module of ``functrain.families`` is imported first, so the
Sphinx build and the tests find the same modules, exported or not): a title,
an ``autosummary`` of the module's public names (its ``__all__``, in the order the module
defines them) and an
``autoclass`` or ``autofunction`` entry for each. A name is documented where users import it:
``functrain.contrib.NAME`` (or ``functrain.NAME``) when that package exports the same object,
else under its module
(``functrain.families.parameter_free.parameter_free.scale_by_dog``). A class that is no
tuple (no state class) lists the public methods it defines (``:members:``).

The modules come in the order of ``ORDER`` (the page's order before it was generated), then
the others alphabetically. A section's title is ``PREFIX[group]`` and the module's entry in
``TITLES``, or else the first words of its docstring, up to a colon or a parenthesis
(``"SOAP (Vyas et al., 2024): ..."`` gives ``SOAP``); modules next to each other with one
title share a section. A name that is another name of an object (``NormalizeState`` is
``EmptyState``) is left to the page documenting the object. So a new optimizer module needs
nothing here: its ``__all__`` and its export are its API entries.

The directive inserts the generated reStructuredText into the page, as ``.. include::``
does: Sphinx and the checks that read the pages (tests/test_docs.py, tests/test_declarations.py,
through :func:`expand`) see the same text.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

from sphinx.util.docutils import SphinxDirective

#: group -> the modules in the order of the page before it was generated; the group's other
#: modules follow, alphabetically.
ORDER: dict[str, list[str]] = {
    "contrib": ["functrain.families." + m for m in (
        "muon.muon", "averaging.schedule_free", "parameter_free.parameter_free",
        "parameter_free.mechanic", "parameter_free.coin_betting", "adam.adopt", "rms.madgrad",
        "adam.acprop", "adam.ademamix", "low_rank.galore", "second_order.sophia",
        "modifiers.sam", "parameter_free.momo", "modifiers.reduce_on_plateau",
        "modifiers.privacy", "modifiers.normalize", "modifiers.complex_valued",)],
    "beyond optax": ["functrain.families." + m for m in (
        "preconditioned.shampoo", "preconditioned.soap", "preconditioned.kron", "muon.dion",
        "muon.normuon", "muon.adamuon", "preconditioned.splus", "adam.mars", "rms.came",
        "adam.laprop", "adam.adam_mini", "low_rank.apollo", "modifiers.modifiers",)],
}
#: Modules whose sections stay at the end of their page (not optimizers of their own).
LAST = {"functrain.families.modifiers.modifiers"}
_ADAM_VARIANTS = "Adam variants: ADOPT, MADGRAD, ACProp, AdEMAMix"
#: module -> its section's title, where the docstring's first words are not the title;
#: modules next to each other in the order with the same title share one section.
TITLES: dict[str, str] = {
    "functrain.families.preconditioned.kron": "Kron (PSGD)",
    "functrain.families.adam.mars": "MARS",
    "functrain.families.modifiers.modifiers": "modifiers for any optimizer",
    "functrain.families.averaging.schedule_free": "Schedule-Free",
    "functrain.families.parameter_free.parameter_free":
        "Learning-rate-free: Prodigy, D-Adaptation, DoG, DoWG",
    "functrain.families.parameter_free.mechanic": "Mechanic and COCOB",
    "functrain.families.parameter_free.coin_betting": "Mechanic and COCOB",
    "functrain.families.adam.adopt": _ADAM_VARIANTS,
    "functrain.families.rms.madgrad": _ADAM_VARIANTS,
    "functrain.families.adam.acprop": _ADAM_VARIANTS,
    "functrain.families.adam.ademamix": _ADAM_VARIANTS,
    "functrain.families.parameter_free.momo": "Momo",
    "functrain.families.modifiers.reduce_on_plateau": "Reduce on plateau",
    "functrain.families.modifiers.normalize": "Normalization and complex parameters",
    "functrain.families.modifiers.complex_valued": "Normalization and complex parameters",
}
#: group -> what its section titles begin with.
PREFIX: dict[str, str] = {"beyond optax": "Beyond optax: "}
#: The directive, as a page writes it (what :func:`expand` replaces).
DIRECTIVE = re.compile(r"^\.\. declared-modules::[ \t]+(.+?)[ \t]*$", re.MULTILINE)


def modules(group: str) -> list[str]:
    """The modules defining an optimizer declared in ``group``, in the page's order."""
    import functrain.families
    from functrain.declarations import GROUPS, OPTIMIZERS

    package = functrain.families  # the declarations are recorded on import
    for found in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(found.name)
    if group not in GROUPS:
        raise ValueError(f"declared-modules: group {group!r} is none of {sorted(GROUPS)}")
    found = {d.module for d in OPTIMIZERS.values() if d.group == group}
    known = [m for m in ORDER.get(group, []) if m in found]
    last = [m for m in known if m in LAST]
    # A module not in ORDER (a new optimizer's) comes after the listed ones, before LAST.
    return ([m for m in known if m not in LAST] + sorted(found - set(known)) + last)


def title(module: str, group: str) -> str:
    """The title of ``module``'s section: ``TITLES``, or its docstring's first words."""
    name = TITLES.get(module)
    if name is None:
        first = (importlib.import_module(module).__doc__ or module).strip().splitlines()[0]
        name = re.split(r":(?!\w)| \(", first, maxsplit=1)[0].strip().rstrip(".")
    return PREFIX.get(group, "") + name


def public_path(module: str, name: str) -> str:
    """The dotted name users import ``module``'s ``name`` by."""
    import functrain
    import functrain.contrib

    from functrain.declarations import OPTIMIZERS

    obj = getattr(importlib.import_module(module), name)
    # A module of functrain.contrib's optimizers documents its names there first.
    in_contrib = any(d.module == module and d.contrib for d in OPTIMIZERS.values())
    for package in (functrain.contrib, functrain) if in_contrib else (functrain,):
        if getattr(package, name, None) is obj:
            return f"{package.__name__}.{name}"
    return f"{module}.{name}"


def names(module: str) -> list[str]:
    """``module``'s public names (its ``__all__``, else the functions and classes it defines)
    in the order the module defines them; names it imports come last."""
    mod = importlib.import_module(module)
    if hasattr(mod, "__all__"):
        public = list(mod.__all__)
    else:
        public = [n for n, obj in vars(mod).items() if not n.startswith("_")
                  and (inspect.isfunction(obj) or inspect.isclass(obj))
                  and getattr(obj, "__module__", None) == module]

    def line(name: str) -> float:
        obj = getattr(mod, name)
        try:
            if getattr(obj, "__module__", None) == module:
                return inspect.getsourcelines(obj)[1]
        except (OSError, TypeError):
            pass
        return float("inf")
    return sorted(public, key=line)  # a stable sort: __all__'s order where no line is known


def entries(module: str) -> list[tuple[str, str, list[str]]]:
    """(``"class"``, ``"function"`` or ``"data"``, dotted path, members) for each public
    name."""
    mod = importlib.import_module(module)
    out = []
    for name in names(module):
        obj = getattr(mod, name)
        if getattr(obj, "__name__", name) != name:
            continue  # another name of an object documented under its own name
        members = []
        if inspect.isclass(obj) and not issubclass(obj, tuple):
            members = [m for m, v in vars(obj).items()
                       if not m.startswith("_") and inspect.isfunction(v)]
        kind = "class" if inspect.isclass(obj) else "function" if callable(obj) else "data"
        out.append((kind, public_path(module, name), members))
    return out


def rst(group: str) -> str:
    """The reStructuredText the directive stands for on a page."""
    sections: list[tuple[str, list]] = []  # (title, entries), next modules of one title merged
    for module in modules(group):
        heading = title(module, group)
        if sections and sections[-1][0] == heading:
            sections[-1][1].extend(entries(module))
        else:
            sections.append((heading, entries(module)))
    lines: list[str] = []
    for heading, found in sections:
        if not found:
            continue
        lines += [heading, "-" * len(heading), "", ".. autosummary::", ""]
        lines += [f"   {path}" for _, path, _ in found] + [""]
        for kind, path, members in found:
            lines.append(f".. auto{kind}:: {path}")
            if members:
                lines.append(f"   :members: {', '.join(members)}")
            lines.append("")
    return "\n".join(lines)


def expand(text: str) -> str:
    """A page's text with each ``.. declared-modules::`` replaced by what it stands for."""
    return DIRECTIVE.sub(lambda m: rst(m.group(1)).rstrip("\n"), text)


class DeclaredModules(SphinxDirective):
    """``.. declared-modules:: GROUP`` (see the module's docstring)."""

    required_arguments = 1
    final_argument_whitespace = True
    has_content = False

    def run(self):
        group = self.arguments[0].strip()
        try:
            text = rst(group)
            for module in modules(group):  # the page is read again when a module changes
                self.env.note_dependency(inspect.getsourcefile(importlib.import_module(module)))
        except (ValueError, ImportError, AttributeError) as error:
            raise self.error(f"declared-modules:: {group}: {error}")
        self.state_machine.insert_input(text.splitlines(),
                                        f"<declared-modules:: {group}>")
        return []


def setup(app):
    app.add_directive("declared-modules", DeclaredModules)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
