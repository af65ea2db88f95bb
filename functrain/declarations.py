"""What each optimizer, builder and state class declares about itself, where it is defined.

Every public optimizer builder carries :func:`declare_optimizer` (its name, docs group,
paper, whether optax has it, whether its step holds a conditional or a decomposition, its
row in docs/optimizers.md); every builder :func:`hyperparameters` (its numeric arguments'
kinds, checked when it is called, and its static ones), which records what each call was
given (:func:`builder_record`, read by :func:`functrain.current_hyperparams`); and every
state class whose fields ``functrain.quantized_state`` quantizes carries
:func:`state_value_kinds` (the low-bit code of each field). ``declare_optimizer`` and
``state_value_kinds`` return what they decorate unchanged; ``hyperparameters`` puts the
checks in front. Nothing runs inside a step.

The lists elsewhere are generated or checked from ``OPTIMIZERS`` and
``STATE_VALUE_KINDS``: the low-bit field codes, the stress list, the API pages, the
README table, lightbench's list and the tests' registry (``tests/test_declarations.py``
and ``tests/test_registry.py`` name a stale entry); docs/optimizers.md's tables are
written from them by ``make docs-tables`` (docs/generate_tables.py).

This module imports nothing from functrain but :mod:`functrain.arg_checks` (the checks of
one argument): every layer above may use it.

>>> import functrain
>>> from functrain.declarations import OPTIMIZERS
>>> OPTIMIZERS["adam"].group, OPTIMIZERS["adam"].optax, OPTIMIZERS["adam"].paper
('optimizers', 'core', 'Kingma & Ba, 2014')
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import weakref
from typing import Any, Callable, Iterable, NamedTuple, Optional

from functrain.arg_checks import KINDS as ARGUMENT_KINDS, check_hyperparameter, is_transformation

__all__ = ["GROUPS", "OPTAX", "KINDS", "Declared", "OPTIMIZERS", "STATE_VALUE_KINDS",
           "declare_optimizer", "state_value_kinds", "value_kinds_of", "declared_state_classes",
           "hyperparameters", "BuilderRecord", "record_builder", "record_parts",
           "record_reader", "builder_record"]

#: docs group -> (its API page under docs/api/, its section heading in docs/optimizers.md).
GROUPS: dict[str, tuple[str, str]] = {
    "optimizers": ("optimizers.rst", "## Optimizers"),
    "contrib": ("contrib.rst", "## `functrain.contrib`: optax.contrib's optimizers"),
    "beyond optax": ("contrib.rst", "## Beyond optax"),
}
#: Where optax has the optimizer: ``"core"`` (``optax.<name>``), ``"contrib"``
#: (``optax.contrib.<name>``), or ``None`` (optax lacks it).
OPTAX = ("core", "contrib", None)
#: The low-bit value kinds of a state field: either sign, never negative, not quantized,
#: or a matrix that an element-wise code would break: any (statistics, Kronecker factors),
#: an orthogonal eigenbasis, or a symmetric matrix kept through its eigenbasis (an inverse
#: root). ``quantized_state(..., bases=True)`` stores the last two as low-bit eigenvectors.
KINDS = ("signed", "unsigned", "keep", "matrix", "orthogonal", "symmetric")


@dataclasses.dataclass(frozen=True)
class Declared:
    """One optimizer's declaration (see :func:`declare_optimizer`).

    Attributes:
      name: its public name (the function's ``__name__``).
      module: the module defining it (its family's folder under ``functrain/families/``).
      function: the builder itself.
      group: its docs group, a key of ``GROUPS``.
      paper: the citation of its paper (or what it comes from).
      optax: ``"core"``, ``"contrib"`` or ``None`` (see ``OPTAX``).
      stressed: its step holds a conditional, a loop or a matrix decomposition, so it is
        on the stress run's list (tests/stress/run_stress.py).
      summary: its row's text in docs/optimizers.md (one sentence), or ``None`` if it is
        listed in another optimizer's row (``listed_with``).
      signature: its row's first cell (the call, defaults abridged with ``...``), or
        ``None``: its full signature with every default (docs/generate_tables.py).
      listed_with: the optimizer whose row lists this one too, after it, or ``None``.

    >>> import functrain
    >>> OPTIMIZERS["muon"].stressed, OPTIMIZERS["muon"].contrib
    (True, True)
    """

    name: str
    module: str
    function: Callable
    group: str
    paper: str
    optax: Optional[str]
    stressed: bool
    summary: Optional[str] = None
    signature: Optional[str] = None
    listed_with: Optional[str] = None

    @property
    def contrib(self) -> bool:
        """Whether it is public as ``functrain.contrib.<name>`` (every optimizer optax has only
        in ``optax.contrib``, or not at all), rather than ``functrain.<name>``."""
        return self.optax != "core"


#: name -> declaration, for every public optimizer (filled as functrain's modules load).
OPTIMIZERS: dict[str, Declared] = {}
#: state class name -> field -> value kind (filled as functrain's modules load).
STATE_VALUE_KINDS: dict[str, dict[str, str]] = {}
_STATE_CLASSES: dict[str, type] = {}


def declare_optimizer(group: str, paper: str, *, optax: Optional[str], stressed: bool = False,
                      summary: Optional[str] = None, signature: Optional[str] = None,
                      listed_with: Optional[str] = None) -> Callable[[Callable], Callable]:
    """Declares the public optimizer builder it decorates; returns the builder itself.

    Args:
      group: its docs group: a key of ``GROUPS``.
      paper: the citation of its paper (``"Kingma & Ba, 2014"``), or what it comes from.
      optax: where optax has it: ``"core"``, ``"contrib"``, or ``None`` (optax lacks it).
      stressed: whether its step holds a conditional, a loop or a matrix decomposition.
      summary: the text of its row in its group's table in docs/optimizers.md, one
        sentence (``"LaProp (Ziyin et al., 2020): ..."``).
      signature: the row's first cell, ``name(arg, key=default, ...)``, where the full
        signature (the default) is too long; its defaults must be the function's.
      listed_with: instead of ``summary``: the optimizer whose row lists this one after
        it (``schedule_free`` in ``schedule_free_adamw``'s), its summary covering both.

    Returns:
      A decorator recording the function in ``OPTIMIZERS`` under its ``__name__`` and
      returning the same function object. A second declaration of one name, an unknown
      group or optax value, an empty paper or summary, or both ``summary`` and
      ``listed_with``, raises a ``ValueError``.

    >>> def my_sgd(learning_rate: float) -> None:
    ...     '''An example.'''
    >>> declare_optimizer("optimizers", "Robbins & Monro, 1951", optax="core",
    ...                   summary="SGD (Robbins & Monro, 1951).")(my_sgd) is my_sgd
    True
    >>> OPTIMIZERS.pop("my_sgd").summary
    'SGD (Robbins & Monro, 1951).'
    """
    if group not in GROUPS:
        raise ValueError(f"declare_optimizer: group {group!r} is none of {sorted(GROUPS)}")
    if optax not in OPTAX:
        raise ValueError(f"declare_optimizer: optax={optax!r} is none of {OPTAX}")
    if not isinstance(paper, str) or not paper.strip():
        raise ValueError("declare_optimizer: paper must name the paper (a non-empty string)")
    if summary is not None and (listed_with is not None or not summary.strip()):
        raise ValueError("declare_optimizer: give a non-empty summary, or listed_with, not both")

    def record(function: Callable) -> Callable:
        name = function.__name__
        if name in OPTIMIZERS and OPTIMIZERS[name].function is not function:
            raise ValueError(f"declare_optimizer: {name} is declared twice (in "
                             f"{OPTIMIZERS[name].module} and {function.__module__})")
        if listed_with == name:
            raise ValueError(f"declare_optimizer: {name} is listed_with itself")
        OPTIMIZERS[name] = Declared(name, function.__module__, function, group, paper, optax,
                                    bool(stressed), summary, signature, listed_with)
        return function
    return record


def state_value_kinds(**kinds: str) -> Callable[[type], type]:
    """Declares the low-bit value kind of each field of the state class it decorates.

    ``quantized_state`` stores a ``"signed"`` field with a code for values of either sign,
    an ``"unsigned"`` one (second moments: never negative) with a code for non-negative
    values, and keeps a ``"keep"`` field (or an undeclared field of a declared class) as it
    is; a ``"matrix"`` field (statistics, Kronecker factors: matrices the optimizer
    decomposes or multiplies by, which element-wise rounding breaks) it refuses unless told
    to keep it (``keep_matrices=True``); so it does an ``"orthogonal"`` field (an
    eigenbasis) or a ``"symmetric"`` one (an inverse root, kept through its eigenbasis)
    unless told to keep it or, with ``bases=True``, to store it as low-bit eigenvectors
    re-orthogonalized on reading (``functrain.matrix.quantized_bases``). The
    declaration is keyed by the
    class's name, so a class of the same name from another library (optax's
    ``ScaleByAdamState``) gets the same codes: see :func:`value_kinds_of`.

    Args:
      **kinds: field name -> ``"signed"``, ``"unsigned"``, ``"keep"``, ``"matrix"``,
        ``"orthogonal"`` or ``"symmetric"``.

    Returns:
      A decorator recording the kinds in ``STATE_VALUE_KINDS`` and returning the same
      class. An unknown field or kind, or another class of the same name declared with
      other kinds, raises a ``ValueError``.

    >>> from typing import NamedTuple
    >>> @state_value_kinds(mu="signed", nu="unsigned")
    ... class MyState(NamedTuple):
    ...     count: int
    ...     mu: float
    ...     nu: float
    >>> value_kinds_of(MyState)
    {'mu': 'signed', 'nu': 'unsigned'}
    >>> del STATE_VALUE_KINDS["MyState"], _STATE_CLASSES["MyState"]
    """
    bad = {f: k for f, k in kinds.items() if k not in KINDS}
    if bad:
        raise ValueError(f"state_value_kinds: kinds must be one of {KINDS}, got {bad}")

    def record(cls: type) -> type:
        name = cls.__name__
        unknown = sorted(set(kinds) - set(getattr(cls, "_fields", ())))
        if unknown:
            raise ValueError(f"state_value_kinds: {name} has no field(s) {unknown}")
        if name in STATE_VALUE_KINDS and STATE_VALUE_KINDS[name] != kinds:
            raise ValueError(f"state_value_kinds: two state classes named {name} "
                             f"({_STATE_CLASSES[name].__module__} and {cls.__module__}) "
                             f"declare different kinds")
        STATE_VALUE_KINDS[name] = dict(kinds)
        _STATE_CLASSES[name] = cls
        return cls
    return record


def value_kinds_of(cls: type) -> Optional[dict[str, str]]:
    """The declared field -> value kind of a state class, or ``None`` if none is declared.

    Looked up by the class's name: a state class of the same name as a declared one (optax's
    ``ScaleByAdamState``, ``TraceState``, ... when optax's optimizers are wrapped) takes its
    kinds, as the fields of such classes mean the same.

    Args:
      cls: a state class (a ``NamedTuple`` type).

    Returns:
      The declared kinds (fields not in it are kept), or ``None``.

    >>> import functrain
    >>> value_kinds_of(functrain.ScaleByAdamState)
    {'mu': 'signed', 'nu': 'unsigned'}
    """
    return STATE_VALUE_KINDS.get(cls.__name__)


def declared_state_classes() -> dict[str, type]:
    """Class name -> the functrain state class that declared its value kinds.

    Returns:
      A new dict (the classes declared so far).

    >>> import functrain
    >>> declared_state_classes()["ScaleByAdamState"] is functrain.ScaleByAdamState
    True
    """
    return dict(_STATE_CLASSES)


# --------------------------------------------------------------------------
# What a builder declares of its arguments: checked when called, recorded with its result
# --------------------------------------------------------------------------

def hyperparameters(*, static: tuple[str, ...] = (),
                    **kinds: str) -> Callable[[Callable], Callable]:
    """Decorator: a builder's declaration of its arguments, checked before it runs.

    Each keyword names an argument of the decorated function and its kind (see
    :func:`check_hyperparameter`): ``"number"``, ``"schedule"``, ``"bound"``, ``"decay"``,
    ``"int"``, each optionally ``" or None"``. Errors name the argument and the function.
    Ranges are each builder's business (:func:`check_range`, :func:`check_betas`).
    ``static`` names the arguments that fix shapes or branches (a rank, a block size, a
    refresh period, a mesh): :func:`functrain.inject_hyperparams` keeps them as Python
    values, never arrays (the builder's ``static_hyperparams``).

    Args:
      static: the static arguments' names.
      **kinds: argument name -> kind.

    Returns:
      A decorator returning the function with the checks in front (same name,
      docstring and signature; ``static_hyperparams`` is ``static``); what it returns is
      recorded (:func:`record_builder`: the declared arguments, defaults included) for
      :func:`functrain.current_hyperparams`. Declaring a name the function does not take,
      or an unknown kind, raises ``TypeError`` at decoration time.

    >>> @hyperparameters(learning_rate="schedule", momentum="number or None")
    ... def sgd_like(learning_rate, momentum=None):
    ...     return learning_rate
    >>> sgd_like(float('nan'))
    Traceback (most recent call last):
    ...
    ValueError: sgd_like: learning_rate must be finite, got nan.
    """
    for kind in kinds.values():
        if kind.removesuffix(" or None") not in ARGUMENT_KINDS:
            raise TypeError(f"hyperparameters: unknown kind {kind!r}; use one of "
                            f"{sorted(ARGUMENT_KINDS)}, optionally followed by ' or None'.")

    def decorate(fn: Callable) -> Callable:
        signature = inspect.signature(fn)
        unknown = sorted((set(kinds) | set(static)) - set(signature.parameters))
        if unknown:
            raise TypeError(f"hyperparameters: {fn.__name__} takes no argument(s) {unknown}.")

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            for name, value in bound.arguments.items():
                if name in kinds:
                    check_hyperparameter(fn.__name__, name, value, kinds[name])
            result = fn(*args, **kwargs)
            bound.apply_defaults()
            record_builder(result, fn.__name__, {n: (bound.arguments[n], kinds[n])
                                                 for n in kinds},
                           [v for v in bound.arguments.values() if is_transformation(v)])
            return result

        checked.hyperparameter_kinds = dict(kinds)  # type: ignore[attr-defined]
        checked.static_hyperparams = tuple(static)  # type: ignore[attr-defined]
        return checked

    return decorate


# --------------------------------------------------------------------------
# What each builder was given: read by functrain.current_hyperparams
# --------------------------------------------------------------------------

class BuilderRecord(NamedTuple):
    """What a builder declared with :func:`hyperparameters` was called with.

    Attributes:
      builder: the builder's name (``'adam'``).
      values: argument name -> ``(value as given, kind)`` for every declared
        argument, defaults included (a number, an array, a schedule or ``None``).
      parts: ``((state path or None, transformation), ...)``: the transformations it
        contains whose hyperparameters are reported too: a ``chain``'s members (with the
        path of each one's state) and a wrapper's inner transformations (path ``None``:
        somewhere inside the wrapper's state).
      labels: empty, or one per part: the label its hyperparameters are reported under
        (``multi_transform``'s, keys ``'<label>/<name>'``), or ``None`` for none.
      read: ``None``, or ``read(state) -> ((part state, transformation), ...)``: parts
        made from the state itself (``inject_hyperparams`` builds its inner optimizer
        from the values its state holds), reported after ``parts``.

    >>> import functrain
    >>> builder_record(functrain.sgd(0.1)).values['learning_rate']
    (0.1, 'schedule')
    """

    builder: str
    values: dict
    parts: tuple
    labels: tuple = ()
    read: Optional[Callable] = None


# anchor (see _anchor) -> BuilderRecord; weak, so a record lives as long as its transformation.
_RECORDS: "weakref.WeakKeyDictionary[Any, BuilderRecord]" = weakref.WeakKeyDictionary()


def _anchor(tx: Any) -> Any:
    """The object a record of ``tx`` hangs on: ``tx`` unless it is a tuple (a
    ``GradientTransformation``), then its ``update`` (a function or program), or the object
    a bound ``update`` belongs to (``MultiSteps(...).gradient_transformation()``)."""
    update = getattr(tx, "update", None)
    for candidate in ((update.__self__,) if inspect.ismethod(update) else ()) + (tx, update):
        if candidate is None or isinstance(candidate, tuple) or inspect.ismethod(candidate):
            continue
        try:
            weakref.ref(candidate)
        except TypeError:
            continue
        return candidate
    return None


def builder_record(tx: Any) -> Optional[BuilderRecord]:
    """The record of the builder call that made ``tx``, if any.

    Args:
      tx: a transformation.

    Returns:
      Its :class:`BuilderRecord`, or ``None`` (not made by a declared builder or a chain).

    >>> import functrain
    >>> builder_record(functrain.adam(0.1)).builder
    'adam'
    """
    anchor = _anchor(tx)
    return None if anchor is None else _RECORDS.get(anchor)


def record_builder(result: Any, builder: str, values: dict, inner: list) -> None:
    """Record that ``builder`` made ``result`` from ``values`` and ``inner`` transformations.

    Replaces what the stages and chains the builder assembled recorded (their arguments
    are the builder's, restated), keeping only the transformations it was given.

    Args:
      result: what the builder returned (anything else than a transformation is ignored).
      builder: the builder's name.
      values: argument name -> ``(value, kind)``.
      inner: the transformations among its arguments.

    Returns:
      ``None``.

    >>> import functrain
    >>> tx = functrain.scale(2.0)
    >>> record_builder(tx, 'double', {'factor': (2.0, 'number')}, [])
    >>> builder_record(tx).values
    {'factor': (2.0, 'number')}
    """
    anchor = _anchor(result) if is_transformation(result) else None
    if anchor is None:
        return
    old = _RECORDS.get(anchor)
    parts = tuple((None, tx) for tx in inner if _anchor(tx) is not anchor)
    if any(_anchor(tx) is anchor for tx in inner) and old is not None:
        # It returned what it was given (a no-op wrapper): keep what that holds.
        values, parts = {**old.values, **values}, old.parts + parts
    _RECORDS[anchor] = BuilderRecord(builder, dict(values), parts)


def record_reader(result: Any, builder: str, read: Callable) -> None:
    """Record that ``result``'s hyperparameters are those of parts built from its state.

    Args:
      result: the transformation (``inject_hyperparams(adam)(...)``, say).
      builder: what made it (``'inject_hyperparams'``).
      read: ``read(state) -> ((part state, transformation), ...)``: the inner
        transformations as ``result``'s next ``update`` builds them, with their states.

    Returns:
      ``None``.

    >>> import functrain
    >>> opt = functrain.inject_hyperparams(functrain.sgd)(learning_rate=0.1)
    >>> builder_record(opt).builder
    'inject_hyperparams'
    """
    anchor = _anchor(result)
    if anchor is not None:
        _RECORDS[anchor] = BuilderRecord(builder, {}, (), (), read)


def record_parts(result: Any, parts: Iterable[tuple], builder: str = "chain",
                 labels: Iterable[Any] = ()) -> None:
    """Record that ``result`` (a ``chain``, say) holds ``parts``: ``(state path, tx)`` pairs.

    Args:
      result: the transformation made of the parts.
      parts: ``(state path, transformation)`` pairs, the path of each part's state inside
        ``result``'s state.
      builder: what made ``result`` (``'chain'``, ``'masked'``, ``'multi_transform'``).
      labels: empty, or per part the label its hyperparameters are reported under.

    Returns:
      ``None``.

    >>> import functrain
    >>> [path for path, _ in builder_record(functrain.chain(functrain.sgd(0.1))).parts]
    [(0,)]
    """
    anchor = _anchor(result)
    if anchor is not None:
        _RECORDS[anchor] = BuilderRecord(builder, {}, tuple(parts), tuple(labels))
