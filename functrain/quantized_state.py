"""Low-bit optimizer state: 8-bit, 4-bit and fp8 block-wise moments for any optimizer.

:func:`quantized_state` wraps an optimizer and stores its large params-shaped floating
state fields block-wise quantized (the codes and arrays of :mod:`functrain.quantization`):
each block of ``block_size`` values keeps one float32 ``absmax`` and one small code per
value. Inside ``update`` the state is dequantized to its own dtype, the optimizer runs
unchanged, and the new state is quantized again: for an optimizer made of stages
(adam's, lion's, ...) inside the engine's pass over the leaves, one leaf at a time.

Which fields are non-negative (the unsigned codes) is declared where each state class is
defined (``@state_value_kinds`` of :mod:`functrain.declarations`), never guessed from values;
so are the fields holding matrices that an element-wise code would break (statistics,
Kronecker factors: kind ``"matrix"``; eigenbases: ``"orthogonal"``; inverse roots:
``"symmetric"``), which are refused, or with ``bases=True`` the eigenbases and inverse roots
stored as low-bit eigenvectors re-orthogonalized on reading (Wang et al., 2024:
``functrain.matrix.quantized_bases``).
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from functrain import jax_compat
from functrain import tree as ft
from functrain.arg_checks import check_range, check_transformation, state_mismatch_error
from functrain.declarations import hyperparameters, value_kinds_of
from functrain.families.adam.optimizers import adam, adamw
from functrain.quantization import (CODES, DEFAULT_BLOCK, QuantizedArray, block_size_of,
                                    code_for, dequantize_blockwise, quantize_blockwise,
                                    scales_shape)
from functrain.engine.protocol import (GradientTransformationExtraArgs, MaskOrFn, OptState, Params,
                                       ScalarOrSchedule, Updates, call_update)
from functrain.engine.state_io import StateIO
from functrain.engine.program import Program, fusion_plan
from functrain.matrix.quantized_bases import (BJORCK_ITERATIONS, QuantizedBasis, basis_code,
                                              check_basis, decode_basis, encode_like,
                                              quantize_basis)

Array = jax.Array
PyTree = Any

# The code of each field comes from its state class's ``@state_value_kinds(...)``
# declaration (functrain.declarations), looked up by class name: optax's state classes of
# the same names (``optax.adam``'s ``ScaleByAdamState``, ...) get the same codes.
# Undeclared fields of a declared class are kept. Fields of a class nobody declared use the
# signed code: it represents every value (a non-negative field loses one bit of
# resolution), where an error would refuse every optimizer not declared.



# --------------------------------------------------------------------------
# The wrapper
# --------------------------------------------------------------------------

#: The value kinds of matrix fields, never given an element-wise code.
MATRIX_KINDS = ("matrix", "orthogonal", "symmetric")


def _is_named_tuple(x: Any) -> bool:  # a state's NamedTuple, not a stored QuantizedArray
    return ft.is_named_tuple(x) and not isinstance(x, QuantizedArray)


def field_codes(state: PyTree, default: str = "signed") -> PyTree:
    """A tree like ``state`` whose leaves say how each is quantized, from each state class's
    ``@state_value_kinds`` declaration (by class name, so optax's classes of the same names
    count; classes nobody declared take ``default``).

    Args:
      state: an optimizer state.
      default: the code kind of leaves outside any listed state class.

    Returns:
      The same structure with ``"signed"``, ``"unsigned"``, ``"keep"``, ``"matrix"``,
      ``"orthogonal"`` or ``"symmetric"`` as leaves.

    >>> import jax.numpy as jnp, functrain
    >>> field_codes(functrain.adam(1e-3).init(jnp.ones(2)))
    (ScaleByAdamState(count='keep', mu='signed', nu='unsigned'), EmptyState())
    """
    if _is_named_tuple(state):
        table = value_kinds_of(type(state))
        kinds = [default if table is None else table.get(f, "keep") for f in state._fields]
        return type(state)(*(field_codes(v, "signed" if k == "keep" else k)
                             if _is_named_tuple(v) else _leaf_kinds(v, k)
                             for v, k in zip(state, kinds)))
    return _leaf_kinds(state, default)


def _leaf_kinds(node: PyTree, kind: str) -> PyTree:
    return jax.tree_util.tree_map(
        lambda x: field_codes(x) if _is_named_tuple(x) else kind, node, is_leaf=_is_named_tuple)


def _check_bits(bits: Any, block_size: Optional[int]) -> int:
    """The block size for ``bits`` and ``block_size``, after checking both: ``bits`` is the
    int 8 or 4 (a numpy integer too; not ``8.0`` or ``True``, which equal 8 and 1) or
    ``'fp8'``."""
    wanted = "quantized_state: bits must be the int 8 or 4 or the string 'fp8', got"
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer, str)):
        raise TypeError(f"{wanted} {type(bits).__name__} {bits!r:.40}.")
    if bits not in (8, 4, "fp8"):
        raise ValueError(f"{wanted} {bits!r:.40}.")
    if block_size is None:
        return DEFAULT_BLOCK[bits]
    if not isinstance(block_size, (int, np.integer)) or isinstance(block_size, bool):
        raise TypeError(f"quantized_state: block_size must be an int, got {block_size!r}.")
    check_range("block_size", block_size, 2 if bits == 4 else 1, owner="quantized_state")
    if bits == 4 and block_size % 2:
        raise ValueError(f"quantized_state: block_size must be even for bits=4 (two codes "
                         f"per byte), got {block_size}.")
    return int(block_size)


def _check_flags(keep_matrices: Any, bits: Any, **flags: Any) -> tuple:
    """The 4-bit-only flags (``rank1``, ``stochastic_rounding``) resolved, ``None`` as
    ``bits == 4``, after checking them and ``keep_matrices``, ``bases`` and ``moments``."""
    for name, value in (("keep_matrices", keep_matrices), ("bases", flags.pop("bases")),
                        ("moments", flags.pop("moments"))):
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"quantized_state: {name} must be True or False, got "
                            f"{type(value).__name__} {value!r:.40}.")
    what = {"rank1": "the rank-1 normalization of the 4-bit second-moment code (Li et al., "
                     "2023)",
            "stochastic_rounding": "the stochastic rounding of the 4-bit first-moment code"}
    resolved = []
    for name, flag in flags.items():
        if flag is not None and not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"quantized_state: {name} must be None, True or False, got "
                            f"{type(flag).__name__} {flag!r:.40}.")
        if flag and bits != 4:
            raise ValueError(f"quantized_state: {name}=True is {what[name]}; bits={bits!r} "
                             f"has none. Pass bits=4, or leave {name} out.")
        resolved.append(bits == 4 if flag is None else bool(flag))
    return tuple(resolved)


def _matrix_error(state: PyTree, path: tuple, leaf: Any) -> ValueError:
    """The refusal of a ``"matrix"`` field (eigenbases, preconditioners, Kronecker factors)."""
    node, field = state, "?"
    for key in path:  # the innermost state class and field on the way to the leaf
        if isinstance(key, jax.tree_util.GetAttrKey):
            if _is_named_tuple(node):
                field = f"{type(node).__name__}.{key.name}"
            node = getattr(node, key.name)
        elif isinstance(key, (jax.tree_util.DictKey, jax.tree_util.SequenceKey)):
            node = node[key.key if isinstance(key, jax.tree_util.DictKey) else key.idx]
        else:
            break
    return ValueError(
        f"quantized_state: state leaf {jax.tree_util.keystr(path)} ({field}, shape "
        f"{np.shape(leaf)}) is a matrix the optimizer decomposes or multiplies by (an "
        f"eigenbasis, a preconditioner or a Kronecker factor), not an element-wise moment: "
        f"a block-wise code rounds each entry alone, which breaks its orthogonality or "
        f"definiteness, and training can diverge. Pass keep_matrices=True to keep such "
        f"fields in their own dtype and quantize only the element-wise moments (mu, nu), "
        f"or bases=True to store the eigenbases and inverse roots (SOAP's bases, Shampoo's "
        f"precond_l/r) as low-bit eigenvectors re-orthogonalized on reading and keep the "
        f"other matrices.")


@hyperparameters(min_size="int")
def quantized_state(optimizer: Any, *, bits: Union[int, str] = 8,
                    block_size: Optional[int] = None, min_size: int = 4096,
                    rank1: Optional[bool] = None, stochastic_rounding: Optional[bool] = None,
                    keep_matrices: bool = False, bases: bool = False,
                    bjorck_iterations: Optional[int] = None, moments: bool = True
                    ) -> GradientTransformationExtraArgs:
    """``optimizer`` with its params-shaped floating state stored in 8, 4 or fp8 bits.

    Every floating state leaf with the shape of a parameter and at least ``min_size``
    elements is kept as a :class:`QuantizedArray` (signed or unsigned code per
    ``field_codes``); counts, scalars, other shapes, complex and small leaves stay as
    they are. With ``bits=4`` the unsigned fields (second moments) of leaves with 2 or
    more dimensions use Li et al.'s rank-1 normalization: each value is scaled by the
    smaller of its row's and its column's largest value (the smallest over all axes for
    more dimensions) rather than by its block's, with the linear code without zero; the
    signed fields (first moments) use the paper's signed dynamic code with stochastic
    rounding (``dynamic4_signed_sr``: the decoded moment is the moment in expectation),
    where nearest rounding sends a decayed 4-bit moment back to the code value it left.
    Fields holding matrices (SOAP's statistics and eigenbases, Shampoo's statistics and
    inverse roots, Kron's factors) are refused, or kept as they are with
    ``keep_matrices=True``. With ``bases=True`` the fields declared ``"orthogonal"`` (SOAP's
    eigenbases ``Q``) and ``"symmetric"`` (Shampoo's inverse roots ``precond_l/r``) are
    stored as Wang et al. (2024) store Shampoo's preconditioners: the eigenvectors ``U`` in
    ``bits`` (signed dynamic code, nearest rounding, blocks of 64 along each eigenvector),
    an inverse root's eigenvalues in float32 (its ``eigh`` each time it is written), and
    after each decode ``bjorck_iterations`` Björck iterations ``U <- 1.5 U - 0.5 U U^T U``
    restore the orthogonality the rounding broke, before the matrix is rebuilt
    (``functrain.matrix.quantized_bases``); the other matrix fields (the statistics,
    Kron's factors) stay in their dtype. A matrix written back unchanged keeps its codes.
    Shampoo's roots are read only when ``precondition_frequency > 1`` (else each step
    recomputes them before use).
    ``update`` dequantizes to each leaf's dtype, calls ``optimizer.update``, and quantizes
    the new state with the same codes. References: Dettmers et al., 2021, "8-bit
    Optimizers via Block-wise Quantization"; Li et al., 2023, "Memory Efficient
    Optimizers with 4-bit States".

    Args:
      optimizer: any transformation (functrain's, optax's, user-written).
      bits: ``8`` (dynamic code, blocks of 256), ``4`` (blocks of 128, two codes per
        byte) or ``"fp8"`` (float8_e4m3fn, blocks of 256); an int (``8.0`` is refused
        with a ``TypeError``) or that string.
      block_size: values per block; ``None`` for the defaults above. (Rank-1 scaled
        second moments store their codes in blocks too; only the scales differ.)
      min_size: an int ``>= 0``; leaves with fewer elements are not quantized.
      rank1: ``None`` (the default: as Li et al., rank-1 scaled second moments with
        ``bits=4``, none otherwise), or ``False`` for per-block scales with ``bits=4``
        (``True`` with other ``bits`` is a ``ValueError``).
      stochastic_rounding: ``None`` (the default: stochastic rounding of the signed
        fields with ``bits=4``, none otherwise), or ``False`` for Li et al.'s nearest
        rounding (code ``dynamic4_signed``) with ``bits=4`` (``True`` with other
        ``bits`` is a ``ValueError``). Nearest rounding cannot decay a 4-bit first moment
        (``0.9 c`` rounds back to ``c``); stochastic rounding can, and trained the
        speedrun model to float32's loss where nearest rounding ended 3.7% above it, but
        its per-step noise cost 8-12% of final loss on a convex problem at a constant
        learning rate (benchmarks/results/quantized_state.md): try ``False`` there.
      keep_matrices: keep the matrix fields in their own dtype and quantize the rest;
        ``False`` (the default) raises a ``ValueError`` naming such a field when it has a
        leaf of ``min_size`` or more floating values (unless ``bases``).
      bases: store the eigenbases and inverse roots (leaves of ``min_size`` or more
        values) as low-bit eigenvectors, re-orthogonalized after decoding, and keep the
        other matrix fields in their dtype (Wang et al., 2024, "4-bit Shampoo for
        Memory-Efficient Network Training").
      bjorck_iterations: Björck iterations after each decode of such a basis, an int
        ``>= 0``; ``None``: 4 with ``bits=4`` (Wang et al.'s, before an inverse root), 2
        with 8 bits or fp8 (float32's orthogonality already).
      moments: quantize the element-wise fields (``False``: keep them in their dtype, so
        that with ``bases=True`` only the eigenbases and inverse roots are low-bit).

    Returns:
      A ``GradientTransformationExtraArgs`` with ``optimizer``'s state structure, the
      quantized leaves replaced by :class:`QuantizedArray`.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.quantized_state(functrain.adamw(1e-3), bits=8, min_size=16)
    >>> params = {'w': jnp.ones((8, 8))}
    >>> state = opt.init(params)
    >>> state[0].nu['w'].code, state[0].nu['w'].codes.dtype
    ('dynamic8_unsigned', dtype('uint8'))
    >>> updates, state = opt.update({'w': jnp.ones((8, 8))}, state, params)
    >>> updates['w'][0, :2]
    Array([-0.001, -0.001], dtype=float32)
    >>> four = functrain.quantized_state(functrain.adamw(1e-3), bits=4, min_size=16)
    >>> four.init(params)[0].nu['w'].code, four.init(params)[0].mu['w'].code
    ('linear4_unsigned_rank1', 'dynamic4_signed_sr')
    >>> soap4 = functrain.quantized_state(functrain.contrib.soap(3e-3), bits=4, bases=True)
    >>> bases = soap4.init({'w': jnp.ones((64, 64))})[0].bases['w']
    >>> bases[0].vectors.code, bases[0].vectors.codes.shape, bases[0].iterations
    ('dynamic4_signed', (64, 32), 4)
    """
    check_transformation(optimizer, "quantized_state", "optimizer")
    size = _check_bits(bits, block_size)
    bits = bits if isinstance(bits, str) else int(bits)  # a numpy integer as the int
    check_range("min_size", min_size, 0, owner="quantized_state")
    rank1, stochastic = _check_flags(keep_matrices, bits, rank1=rank1,
                                     stochastic_rounding=stochastic_rounding, bases=bases,
                                     moments=moments)
    if bjorck_iterations is None:
        bjorck_iterations = BJORCK_ITERATIONS[bits]
    elif isinstance(bjorck_iterations, bool) or not isinstance(bjorck_iterations,
                                                               (int, np.integer)):
        raise TypeError(f"quantized_state: bjorck_iterations must be None or an int >= 0, "
                        f"got {type(bjorck_iterations).__name__} {bjorck_iterations!r:.40}.")
    check_range("bjorck_iterations", bjorck_iterations, 0, owner="quantized_state")

    def large(x: Any) -> bool:
        return (hasattr(x, "dtype") and np.ndim(x) > 0 and np.size(x) >= min_size
                and jnp.issubdtype(x.dtype, jnp.floating))

    def quantize(x: Any, kind: str, shapes: set) -> Any:
        if kind in ("orthogonal", "symmetric") and bases and large(x):
            return quantize_basis(x, basis_code(bits), int(bjorck_iterations),
                                  symmetric=kind == "symmetric")
        if (kind in ("keep",) + MATRIX_KINDS or not moments or not large(x)
                or tuple(np.shape(x)) not in shapes):
            return x
        return quantize_like(x, code_for(bits, kind, np.ndim(x), rank1, stochastic), size, None)

    def init_fn(params: Params) -> OptState:
        state = optimizer.init(params)
        kinds = field_codes(state)
        if not (keep_matrices or bases):  # refused before anything is quantized
            def refuse(path: tuple, kind: str, x: Any) -> None:
                if kind in MATRIX_KINDS and large(x):
                    raise _matrix_error(state, path, x)
            jax.tree_util.tree_map_with_path(refuse, kinds, state)
        shapes = {tuple(np.shape(p)) for p in jax.tree_util.tree_leaves(params)}
        return ft.distinct_buffers(jax.tree_util.tree_map(
            lambda kind, x: quantize(x, kind, shapes), kinds, state))

    return GradientTransformationExtraArgs(init_fn, Program(
        fusion_plan(optimizer), io=QuantizedStateIO(), guards=(_check_quantized_leaves,)))


# --------------------------------------------------------------------------
# Layout on a mesh
# --------------------------------------------------------------------------

# On a mesh with explicit axes (jax.make_mesh's default) a split leaf's reshapes to and
# from blocks run with the axes made automatic: blocks split like the leaf's first dim
# where whole blocks line up (else replicated); a quantized leaf keeps its layout.

def _explicit(x: Any) -> Any:
    sharding = getattr(jax.typeof(x), "sharding", None)
    return sharding if AxisType.Explicit in getattr(getattr(sharding, "mesh", None),
                                                    "axis_types", ()) else None


def _aligned(sharding: Any, shape: tuple, blocks: int, block_size: int) -> PartitionSpec:
    axes = (tuple(sharding.spec) + (None,) * len(shape))[:len(shape)]
    n = int(np.prod([sharding.mesh.shape[a] for a in np.atleast_1d(axes[0] or ())]))
    ok = (axes[0] is not None and not any(axes[1:]) and shape[0] % n == blocks % n == 0
          and int(np.prod(shape, dtype=np.int64)) == blocks * block_size)
    return PartitionSpec(axes[0] if ok else None)


def quantize_like(x: Array, code: str, block_size: int, like: Optional[QuantizedArray]) -> Any:
    """``quantize_blockwise(x, code, block_size)``, laid out on ``x``'s mesh or like ``like``.

    On a mesh with explicit axes the reshape to blocks runs with the axes made automatic:
    new blocks are split like ``x``'s first dimension where whole blocks line up (else
    replicated); with ``like`` (the state being replaced) its codes' and scales' layout.

    Args:
      x: the array to quantize.
      code: a key of ``CODES``.
      block_size: values per block.
      like: the quantized array ``x`` replaces, or ``None``.

    Returns:
      The :class:`QuantizedArray`.
    """
    sharding = _explicit(x if like is None else like.codes)
    if sharding is None:
        return quantize_blockwise(x, code, block_size)
    if like is None:
        spec = _aligned(sharding, np.shape(x), -(-np.size(x) // block_size), block_size)
        codes, absmax = (NamedSharding(sharding.mesh, PartitionSpec(*spec, None)),
                         NamedSharding(sharding.mesh, spec if CODES[code].scaling == "block"
                                       else PartitionSpec()))  # rank-1 maxima: replicated
    else:
        codes, absmax = sharding, jax.typeof(like.absmax).sharding
    out = QuantizedArray(codes, absmax, tuple(np.shape(x)), jnp.dtype(x.dtype), code)
    return jax_compat.auto_axes(lambda v: quantize_blockwise(v, code, block_size),
                                out_sharding=out)(x)


def dequantize_like(q: QuantizedArray, after: Optional[Array] = None) -> Array:
    """``dequantize_blockwise(q, after)``, laid out like ``q`` on a mesh with explicit axes.

    Args:
      q: the quantized array.
      after: as for :func:`dequantize_blockwise`.

    Returns:
      An array of ``q.shape`` and ``q.dtype``.
    """
    sharding = _explicit(q.codes)
    if sharding is None:
        return dequantize_blockwise(q, after)
    spec = _aligned(sharding, q.shape, q.codes.shape[0], block_size_of(q))
    return jax_compat.auto_axes(dequantize_blockwise,
                                out_sharding=NamedSharding(sharding.mesh, spec))(q, after)


def written_mark(q: QuantizedArray) -> Array:
    """A boolean scalar computed from ``q``'s scales: ``absmax[0] >= -1`` (True unless it is
    NaN; a maximum of absolute values is never negative), for ``dequantize_blockwise``'s
    ``after``. On a mesh with explicit axes it is read with the axes made automatic (a
    one-element slice of scales split over devices is refused), replicated.

    Args:
      q: a quantized array with at least one scale.

    Returns:
      A boolean scalar.

    >>> import jax.numpy as jnp
    >>> written_mark(quantize_blockwise(jnp.ones(4), 'fp8', 4))
    Array(True, dtype=bool)
    """
    sharding = _explicit(q.absmax)
    if sharding is None:
        return q.absmax[0] >= -1.0
    return jax_compat.auto_axes(lambda a: a[0] >= -1.0, out_sharding=NamedSharding(
        sharding.mesh, PartitionSpec()))(q.absmax)


def _check_quantized_leaves(run: Any, updates: Updates, state: OptState,
                            params: Optional[Params], extra_args: dict
                            ) -> tuple[Updates, OptState]:
    """Every quantized leaf of ``state`` checked (before any array math), then ``run``."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(state, is_leaf=_is_quantized)[0]:
        if isinstance(leaf, QuantizedBasis):
            check_basis(leaf, jax.tree_util.keystr(path))
            _check_quantized(leaf.vectors, path + (jax.tree_util.GetAttrKey("vectors"),))
        elif _is_quantized(leaf):
            _check_quantized(leaf, path)
    return run(updates, state, params, extra_args)


def _is_quantized(x: Any) -> bool:
    return isinstance(x, (QuantizedArray, QuantizedBasis))


class QuantizedStateIO(StateIO):
    """How the engine reads and writes quantized state: the one implementation of low-bit I/O.

    Stages (adam's, lion's, ...) get each leaf's state dequantized just before they run and
    quantized again just after, inside the engine's per-leaf pass; any other transformation
    (optax's, a wrapper) gets its whole state dequantized before its ``update`` and quantized
    after it. Within one pass, each leaf's dequantize waits for what the previous leaf with
    quantized state wrote (:meth:`leaf_done`), so that one leaf's dequantized state is alive
    at a time: the order is a data dependency XLA keeps (``dequantize_blockwise``'s
    ``after``).

    >>> import jax.numpy as jnp
    >>> io = QuantizedStateIO().begin()
    >>> io.read(jnp.ones(2))  # a plain entry is read as it is
    Array([1., 1.], dtype=float32)
    """

    def __init__(self) -> None:
        self._written: Sequence[Any] = ()

    def begin(self) -> "QuantizedStateIO":
        return QuantizedStateIO()

    def read(self, stored: Any) -> Any:
        """``stored`` dequantized; after the previous leaf's quantized state exists, if any."""
        if not _is_quantized(stored):
            return stored
        if isinstance(stored, QuantizedBasis):  # decoded and re-orthogonalized
            return decode_basis(stored)
        # True unless a block maximum is NaN (it is never negative), which XLA cannot know;
        # either way the decode gives the same values (dequantize_blockwise's ``after``).
        marks = [written_mark(w) for w in self._written
                 if isinstance(w, QuantizedArray) and w.absmax.size]
        return dequantize_like(stored, functools.reduce(jnp.logical_and, marks)
                               if marks else None)

    def write(self, new: Any, stored: Any, where: str = "") -> Any:
        if not _is_quantized(stored):
            return new
        if tuple(np.shape(new)) != stored.shape:
            raise state_mismatch_error("quantized_state", f"state leaf {where} came back with "
                                       f"shape {np.shape(new)}, not {stored.shape}")
        if isinstance(stored, QuantizedBasis):
            return encode_like(new, stored)
        return quantize_like(new, stored.code, block_size_of(stored), stored)

    def leaf_done(self, written: list) -> None:
        if any(_is_quantized(n) for n in written):
            self._written = written

    def update_opaque(self, tx: Any, updates: Updates, state: OptState,
                      params: Optional[Params], extra_args: dict) -> tuple[Updates, OptState]:
        paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(state,
                                                                     is_leaf=_is_quantized)
        inner = treedef.unflatten([self.read(x) for _, x in paths_leaves])
        new_updates, new_inner = call_update(tx, updates, inner, params, extra_args)
        new_leaves, new_def = jax.tree_util.tree_flatten(new_inner)
        if new_def != jax.tree_util.tree_structure(inner):
            raise state_mismatch_error("quantized_state", "the optimizer's update returned a "
                                       "state of another structure than it was given")
        return new_updates, treedef.unflatten([
            self.write(new, old, jax.tree_util.keystr(path))
            for (path, old), new in zip(paths_leaves, new_leaves)])


def _check_quantized(q: QuantizedArray, path: tuple) -> None:
    where = jax.tree_util.keystr(path)
    if q.code not in CODES or np.ndim(q.codes) != 2 or np.ndim(q.absmax) != 1:
        raise state_mismatch_error("quantized_state", f"state leaf {where} is not a "
                                   f"quantized array (code {q.code!r}, codes "
                                   f"{np.shape(q.codes)}, absmax {np.shape(q.absmax)})")
    want = jnp.float8_e4m3fn if q.code == "fp8" else jnp.uint8
    blocks = -(-int(np.prod(q.shape, dtype=np.int64)) // block_size_of(q))
    if q.codes.dtype != want or q.codes.shape[0] != blocks:
        raise state_mismatch_error("quantized_state", f"state leaf {where} has codes "
                                   f"{q.codes.dtype}{list(q.codes.shape)}, expected {want.__name__}"
                                   f" with {blocks} blocks for shape {q.shape}")
    scales = scales_shape(q.code, q.shape, blocks)
    if np.shape(q.absmax) != scales:
        raise state_mismatch_error("quantized_state", f"state leaf {where} has absmax of "
                                   f"shape {np.shape(q.absmax)}, expected {scales} for code "
                                   f"{q.code!r} and shape {q.shape}")


# --------------------------------------------------------------------------
# Presets with the names users know
# --------------------------------------------------------------------------

@hyperparameters(min_size="int")
def adam_8bit(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
              eps: float = 1e-8, eps_root: float = 0.0, *, nesterov: bool = False,
              block_size: Optional[int] = None, min_size: int = 4096
              ) -> GradientTransformationExtraArgs:
    """Adam (Kingma & Ba, 2014) with 8-bit block-wise state (Dettmers et al., 2021).

    ``quantized_state(adam(...), bits=8)``: about 2 bytes of state per parameter
    instead of 8.

    Args:
      learning_rate: a number or a schedule.
      b1: the first moment's decay.
      b2: the second moment's decay.
      eps: added to the root of the second moment.
      eps_root: added inside the root.
      nesterov: NAdam's Nesterov momentum.
      block_size: values per block (``None``: 256).
      min_size: smaller state leaves stay float32.

    Returns:
      The optimizer, a ``GradientTransformationExtraArgs``.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adam_8bit(1e-3, min_size=4)
    >>> opt.init({'w': jnp.ones(4)})[0].mu['w'].codes.dtype
    dtype('uint8')
    """
    return quantized_state(adam(learning_rate, b1, b2, eps, eps_root, nesterov=nesterov),
                           bits=8, block_size=block_size, min_size=min_size)


def _adamw_preset(bits: Union[int, str], name: str, title: str, layout: str, block: str,
                  example: str) -> Any:
    """One of the ``adamw_<bits>`` presets: ``quantized_state(adamw(...), bits=bits)``."""
    def preset(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
               eps: float = 1e-8, eps_root: float = 0.0, weight_decay: ScalarOrSchedule = 1e-4,
               mask: Optional[MaskOrFn] = None, *, nesterov: bool = False,
               block_size: Optional[int] = None, min_size: int = 4096
               ) -> GradientTransformationExtraArgs:
        return quantized_state(adamw(learning_rate, b1, b2, eps, eps_root, None, weight_decay,
                                     mask, nesterov=nesterov),
                               bits=bits, block_size=block_size, min_size=min_size)

    preset.__name__ = preset.__qualname__ = name
    preset.__doc__ = f"""AdamW (Loshchilov & Hutter, 2019) with {title}.

    ``quantized_state(adamw(...), bits={bits!r})``: {layout}

    Args:
      learning_rate: a number or a schedule.
      b1: the first moment's decay.
      b2: the second moment's decay.
      eps: added to the root of the second moment.
      eps_root: added inside the root.
      weight_decay: the decoupled weight decay (a number or a schedule).
      mask: which parameters are decayed (a tree of bools or a function of params).
      nesterov: NAdamW's Nesterov momentum.
      block_size: values per block (``None``: {block}).
      min_size: smaller state leaves stay float32.

    Returns:
      The optimizer, a ``GradientTransformationExtraArgs``.

    >>> import jax.numpy as jnp, functrain
{example}
    """
    return hyperparameters(min_size="int")(preset)


adamw_8bit = _adamw_preset(
    8, "adamw_8bit", "8-bit block-wise state (Dettmers et al., 2021)",
    "the dynamic code, signed for the first\n    moment and unsigned for the second, blocks "
    "of 256; about 2.03 bytes of state per\n    parameter instead of 8.", "256",
    "    >>> opt = functrain.adamw_8bit(1e-3, min_size=4)\n"
    "    >>> opt.init({'w': jnp.ones(300)})[0].nu['w'].absmax.shape\n    (2,)")
adamw_4bit = _adamw_preset(
    4, "adamw_4bit", "4-bit block-wise state (Li et al., 2023)",
    "blocks of 128, the signed 4-bit dynamic code\n    for the first moment (rounded "
    "stochastically) and the linear code without zero\n    for the second, two codes per "
    "byte, the second moment of matrices scaled by the\n    paper's rank-1 normalization "
    "(the smaller of its row's and its column's maximum)\n    instead of per block; about "
    "1.0 byte of state per parameter instead of 8.", "128; even",
    "    >>> opt = functrain.adamw_4bit(1e-3, min_size=4)\n"
    "    >>> opt.init({'w': jnp.ones(256)})[0].mu['w'].codes.shape\n    (2, 64)")
adamw_fp8 = _adamw_preset(
    "fp8", "adamw_fp8", "float8_e4m3fn block-wise state",
    "each block of 256 stores\n    ``448 x / absmax`` as float8_e4m3fn and one float32 "
    "``absmax``.", "256",
    "    >>> opt = functrain.adamw_fp8(1e-3, min_size=4)\n"
    "    >>> opt.init({'w': jnp.ones(4)})[0].mu['w'].codes.dtype\n    dtype(float8_e4m3fn)")
