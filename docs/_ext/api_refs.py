"""Resolve the short names the docstrings use (``:func:`scale_by_adam```) across the API.

A docstring says ``:func:`adam``` or ``:class:`EmptyState``` wherever it lives, the way a
reader says it; the reference documents each object once, under the name users type
(``functrain.adam``, ``functrain.contrib.muon``, ``functrain.tree.add``). When Sphinx cannot
resolve a Python reference in the docstring's own module, this looks the last component up
among every documented object, in the order ``functrain.X``, ``functrain.contrib.X``,
``functrain.tree.X``, then any single documented ``*.X``. A name that matches nothing, or
several objects with none preferred, is left unresolved, so the strict build reports it.

It also writes ``Optional[ScalarOrSchedule]`` in signatures as ``ScalarOrSchedule | None``
(Sphinx 9 prints a type alias inside ``Optional`` as its internal ``TypeAliasForwardRef``).
"""

from __future__ import annotations

import re

from sphinx.util.nodes import make_refnode

PREFERRED = ("functrain.", "functrain.contrib.", "functrain.tree.")


def find(objects: dict, target: str) -> str | None:
    """The documented full name that ``target`` (maybe quoted, maybe qualified) refers to."""
    target = target.strip("'\"")
    if target in objects:
        return target
    last = target.rsplit(".", 1)[-1]
    for prefix in PREFERRED:
        if prefix + last in objects:
            return prefix + last
    matches = [name for name in objects if name.endswith("." + last)]
    return matches[0] if len(matches) == 1 else None


def _on_missing_reference(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    domain = env.get_domain("py")
    name = find(domain.objects, node["reftarget"])
    if name is None:
        return None
    entry = domain.objects[name]
    return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode,
                        name)


FORWARD_REF = re.compile(r"TypeAliasForwardRef\('([\w.]+)'\)")


def _on_process_signature(app, what, name, obj, options, signature, return_annotation):
    """Sphinx writes ``Optional[alias]`` as ``TypeAliasForwardRef('alias') | None``."""
    if signature is None and return_annotation is None:
        return None
    clean = lambda text: FORWARD_REF.sub(r"\1", text) if text else text
    return clean(signature), clean(return_annotation)


def setup(app):
    app.connect("missing-reference", _on_missing_reference)
    app.connect("autodoc-process-signature", _on_process_signature)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
