"""Argument text that many builders share, written once and composed into their docstrings.

A builder's docstring names the shared arguments it takes on one line of its ``Args:``
section, ``<shared: learning_rate, b1, b2>``; :func:`shared_args`, its innermost decorator,
replaces that line with the entries ``learning_rate: ...`` of :data:`ARGS` (or of the table it
is given), wrapped at the entries' indentation. The docstring a user, ``help()``, Sphinx and
the doctests read is the composed one, so the rendered docs stay complete; the source holds
each shared sentence once.

This module imports nothing from functrain: every layer may use it.

>>> @shared_args()
... def step(learning_rate, b1):
...     '''A step.
...
...     Args:
...       <shared: learning_rate, b1>
...     '''
>>> "b1: decay rate of the first moment" in step.__doc__, "<shared" in step.__doc__
(True, False)
"""

from __future__ import annotations

import re
import textwrap
from typing import Callable, Mapping, Optional, TypeVar

__all__ = ["ARGS", "compose", "shared_args"]

F = TypeVar("F", bound=Callable)
#: The width composed entries are wrapped to, indentation included (the source's width).
WIDTH = 96

#: Argument name -> the text of its ``Args:`` entry, for every builder that takes it with
#: this meaning.
ARGS: dict[str, str] = {
    "learning_rate": "the step size: a number or a schedule (a function of the step count, "
                     "counted from 0, returning the step size to use).",
    "b1": "decay rate of the first moment, in ``[0, 1)``.",
    "b2": "decay rate of the second moment, in ``[0, 1)``.",
    "eps_root": "added to ``v_hat`` inside the square root; ``>= 0`` (see :func:`adam`).",
    "mu_dtype": "storage dtype of the first moment; ``None``: each parameter's dtype.",
    "nu_dtype": "storage dtype of the second moment; ``None``: each parameter's dtype.",
    "weight_decay": "decoupled weight decay (a number or schedule), as in ``adamw``.",
    "cautious_weight_decay": "apply the weight decay only where the update and the param agree "
                             "in sign (Cautious Weight Decay, Chen et al., 2025; see "
                             ":func:`functrain.add_decayed_weights`); default ``False``.",
    "ns_steps": "the number of Newton-Schulz steps, an integer ``>= 0``.",
    # the AdamW half of the Muon family's optimizers (the leaves Muon does not take)
    "adam_learning_rate": "AdamW's step size; ``None``: ``learning_rate``.",
    "adam_b1": "AdamW's first-moment decay.",
    "adam_b2": "AdamW's second-moment decay, or a decay-rate schedule.",
    "adam_eps_root": "AdamW's ``eps_root``.",
    "adam_weight_decay": "AdamW's decoupled weight decay.",
}

_PLACEHOLDER = re.compile(r"^(\s*)<shared: ([\w, ]+)>\s*$")


def compose(doc: Optional[str], table: Mapping[str, str], owner: str) -> Optional[str]:
    """``doc`` with each ``<shared: a, b>`` line replaced by the entries of ``table``.

    Args:
      doc: a docstring (``None`` under ``python -OO``: returned as it is).
      table: argument name -> entry text.
      owner: the function's name, for the error.

    Returns:
      The composed docstring; a name ``table`` lacks raises a ``KeyError`` naming it.

    >>> print(compose("Args:\\n  <shared: b1>", ARGS, "f"))
    Args:
      b1: decay rate of the first moment, in ``[0, 1)``.
    """
    if doc is None:
        return None
    out = []
    for line in doc.split("\n"):
        match = _PLACEHOLDER.match(line)
        if not match:
            out.append(line)
            continue
        indent, names = match.group(1), [n.strip() for n in match.group(2).split(",")]
        for name in names:
            if name not in table:
                raise KeyError(f"{owner}: no shared text for argument {name!r}")
            out += textwrap.wrap(f"{name}: {table[name]}", WIDTH, initial_indent=indent,
                                 subsequent_indent=indent + "  ", break_on_hyphens=False,
                                 break_long_words=False)
    return "\n".join(out)


def shared_args(table: Optional[Mapping[str, str]] = None) -> Callable[[F], F]:
    """Decorator: compose the function's docstring from the shared argument text.

    Args:
      table: argument name -> entry text; ``None``: :data:`ARGS`.

    Returns:
      A decorator returning the same function with its ``__doc__`` composed
      (:func:`compose`); put it innermost, so that wrappers copy the composed text.
    """
    def decorate(fn: F) -> F:
        fn.__doc__ = compose(fn.__doc__, ARGS if table is None else table, fn.__name__)
        return fn
    return decorate
