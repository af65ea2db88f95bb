"""tests/registry.py declares every optimizer of the package exactly once, and its
declarations are well formed (every skipped check named, with its reason)."""

import dataclasses
import inspect
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib  # noqa: F401  (the references)
import pytest

import functrain
import registry
from functrain.declarations import OPTIMIZERS as DECLARED, Declared
from helpers import all_equations
from registry import CHECKS, REGISTRY

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_optimizer_has_exactly_one_record():
    """Every named optimizer of the family modules that functrain exports and every optimizer
    of functrain.contrib (found in the package) has a record, and every record names one."""
    core, contrib = registry.optimizer_functions(), registry.contrib_functions()
    assert len(core) >= 30 and len(contrib) >= 28, (sorted(core), sorted(contrib))
    assert not set(core) & set(contrib), sorted(set(core) & set(contrib))
    missing = sorted(set(core) - set(registry.names(contrib=False))) + sorted(
        set(contrib) - set(registry.names(contrib=True)))
    assert not missing, f"optimizers without a record in tests/registry.py: {missing}"
    unknown = sorted(set(registry.names(contrib=False)) - set(core)) + sorted(
        set(registry.names(contrib=True)) - set(contrib))
    assert not unknown, f"records that name no optimizer of the package: {unknown}"
    not_exported = sorted(n for n, fn in core.items() if getattr(functrain, n, None) is not fn)
    assert not not_exported, f"optimizers not exported as functrain.<name>: {not_exported}"
    for name in REGISTRY:
        assert REGISTRY[name].make(functrain) is not None


def test_every_declared_optimizer_has_a_record_and_back():
    """``@declare_optimizer`` (functrain.declarations) and tests/registry.py name the same
    optimizers; each declaration is of the public function (``functrain.<name>``, or
    ``functrain.contrib.<name>`` for contrib's), and every optimizer the discovery finds
    in the package is declared."""
    no_record = [registry.NO_RECORD.get(n, n) for n in sorted(set(DECLARED) - set(REGISTRY))]
    assert not no_record, "declared optimizers without a record:\n  " + "\n  ".join(no_record)
    undeclared = sorted(set(REGISTRY) - set(DECLARED))
    assert not undeclared, f"records of optimizers with no @declare_optimizer: {undeclared}"
    found = {**registry.optimizer_functions(), **registry.contrib_functions()}
    not_declared = sorted(set(found) - set(DECLARED))
    assert not not_declared, f"public optimizers with no @declare_optimizer: {not_declared}"
    for name, declared in DECLARED.items():
        public = getattr(functrain.contrib if declared.contrib else functrain, name, None)
        assert public is declared.function, f"{name}: the declared function is not the public one"
        assert REGISTRY[name].contrib == declared.contrib, name


def test_discovery_leaves_out_only_building_blocks():
    """The contrib functions the discovery leaves out are schedules, evaluation helpers,
    scale_by_* building blocks and the parts listed in NOT_OPTIMIZERS."""
    public = {n for n, obj in vars(functrain.contrib).items()
              if not n.startswith("_") and inspect.isfunction(obj)}
    left_out = public - set(registry.contrib_functions())
    for name in sorted(left_out):
        returns = str(inspect.signature(getattr(functrain.contrib, name)).return_annotation)
        assert (name.startswith("scale_by_") or name in registry.NOT_OPTIMIZERS
                or "GradientTransformation" not in returns), name
    assert {"scale_by_muon", "schedule_free_eval_params",
            "hutchinson_estimator_diag_hessian"} <= left_out


def test_records_are_well_formed():
    for name, record in REGISTRY.items():
        assert record.name == name
        for setting in record.all_settings():
            for check, reason in setting.skip.items():
                assert check in CHECKS, f"{setting.label}: unknown check {check!r}"
                assert isinstance(reason, str) and len(reason) > 10, (
                    f"{setting.label}: no reason given for skipping {check}")
                if reason.startswith("already checked in "):  # the test it names exists
                    path, test = reason[len("already checked in "):].split(": ")
                    assert f"def {test}(" in (ROOT / path).read_text(), (name, reason)
        if record.reference.startswith("optax."):
            path = record.reference.split(".")[1:]
            assert getattr(optax.contrib if path[0] == "contrib" else optax, path[-1], None), (
                f"{name}: optax has no {record.reference}")
            assert "parity" not in record.skip, name
        else:  # no optax counterpart: the file holding its numpy reference must test it
            assert "parity" in record.skip, name
            path = record.reference.split()[-1]
            assert path.startswith("tests/contrib/test_contrib_"), (name, record.reference)
            assert f"{name}(" in (ROOT / path).read_text(), f"{path} never calls {name}"
        if record.build is not None:  # a recipe, not a factory: nothing to inject into
            assert "inject" in record.skip, f"{name}: a built record must skip inject"
        assert not any(callable(v) for v in record.args.values()), (
            f"{name}: args must hold no callables (inject_hyperparams reads them as "
            f"schedules); put schedules and mask functions in a setting")
    assert len(registry.settings()) > len(REGISTRY)


def test_a_declared_optimizer_without_a_record_gets_the_default_or_is_named(monkeypatch):
    """A declared optimizer with no ``_add`` line gets ``default_record`` (learning_rate=1e-2,
    the declared reference, no skip but parity's and inject's where optax lacks it); one
    whose required arguments the default cannot fill is named, with what to do."""
    laprop = DECLARED["laprop"]

    def adam_z(learning_rate: float, b1: float = 0.9) -> None:
        """An example."""

    def wrap_z(optimizer: object, learning_rate: float = 1e-3) -> None:
        """An example."""
    for function, optax_has in ((adam_z, "contrib"), (wrap_z, None)):
        monkeypatch.setitem(DECLARED, function.__name__, dataclasses.replace(
            laprop, name=function.__name__, function=function, optax=optax_has))
    before = list(REGISTRY.items())
    record = registry.default_record("adam_z")
    assert (record.args, record.reference, dict(record.skip), record.contrib) == (
        {"learning_rate": 1e-2}, "optax.contrib.adam_z", {}, True)
    assert list(REGISTRY.items()) == before  # REGISTRY left as it was
    with pytest.raises(ValueError, match=r"wrap_z: .*\['optimizer'\]: add a record"):
        registry.default_record("wrap_z")
    # the records with no _add line are exactly the default ones
    assert REGISTRY["laprop"] == registry.default_record("laprop")
    assert REGISTRY["laprop"].skip.keys() == {"parity", "inject"}
    assert REGISTRY["adan"].args == {"learning_rate": 1e-2} and not REGISTRY["adan"].skip
    assert not registry.NO_RECORD, registry.NO_RECORD


# Primitive names of the decompositions (their names across the supported JAX versions).
DECOMPOSITIONS = ("eigh", "qr", "geqrf", "householder_product", "svd", "triangular_solve",
                  "cholesky", "lu")


def test_steps_with_a_decomposition_are_marked():
    """Every record whose step's program holds a decomposition primitive (an eigh, a QR, an
    SVD, a triangular solve, ...) says so in ``decomposed`` (its jit-vs-eager property is
    then compared in float64), and a marked record says which; found on the jaxpr of one
    step on a tree with a (4, 3) matrix, so a new optimizer cannot be left unmarked."""
    params = {"w": jnp.asarray(np.arange(12.0).reshape(4, 3) / 7 - 0.6, jnp.float32),
              "b": jnp.linspace(-1.0, 1.0, 3, dtype=jnp.float32)}
    grads = jax.tree_util.tree_map(lambda x: jnp.cos(3 * x), params)

    def loss_fn(p):
        return sum(jnp.sum(x ** 2) for x in jax.tree_util.tree_leaves(p))

    unmarked = []
    for name, record in sorted(REGISTRY.items()):
        opt = record.make(functrain)
        extra = record.update_kwargs(loss_fn, params)
        jaxpr = jax.make_jaxpr(lambda g, p, opt=opt, extra=extra: opt.update(
            g, opt.init(p), p, **extra))(grads, params)
        found = sorted({e.primitive.name for e in all_equations(jaxpr)
                        if e.primitive.name in DECOMPOSITIONS})
        if found and not record.decomposed:
            unmarked.append(f"{name}: {found}")
        assert record.decomposed == "" or len(record.decomposed) > 10, name
    assert not unmarked, ("steps with a decomposition but no decomposed= in tests/registry.py: "
                          f"{unmarked}")
    assert {"dion", "soap", "shampoo", "splus", "kron", "galore", "muon"} <= {
        n for n, r in REGISTRY.items() if r.decomposed}
