"""functrain.matrix.blocks: the merge and block rules of Shampoo, SOAP and Kron, against
expectations written out by hand."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.matrix.blocks import (block_grid, block_groups, check_block_size,
                                     from_blocks, gather_blocks, merged_shape,
                                     scatter_blocks, to_blocks)


@pytest.mark.parametrize("shape, max_dim, want", [
    ((4, 4, 64), 256, (16, 64)),
    ((4, 4, 64), 1024, (1024,)),
    ((2, 2, 6), 4, (4, 6)),
    ((3, 12), 4, (3, 12)),
    ((4, 4), 4, (4, 4)),
    ((5, 300, 2, 3), 256, (5, 300, 6)),   # a long axis stands alone
    ((1, 5), 10, (5,)),                   # a size-1 axis disappears
    ((1, 1), 10, (1,)),
    ((7,), 2, (7,)),                      # fewer than two axes: unchanged
    ((), 2, ()),
    ((3, 0), 2, (3, 0)),                  # no entries: unchanged
])
def test_merged_shape(shape, max_dim, want):
    assert merged_shape(shape, max_dim) == want
    assert np.prod(want) == np.prod(shape)


@pytest.mark.parametrize("shape, block_size, split, want", [
    ((256, 300, 5), 128, None, ((2, 128), (3, 100), (1, 5))),
    ((129,), 128, None, ((2, 65),)),          # the last block one shorter
    ((130, 7), 128, None, ((2, 65), (1, 7))),
    ((10, 10), 3, None, ((4, 3), (4, 3))),    # 3 + 3 + 3 + 1
    ((10, 10), 3, (False, True), ((1, 10), (4, 3))),
    ((10, 10), None, None, ((1, 10), (1, 10))),
    ((128,), 128, None, ((1, 128),)),
])
def test_block_grid(shape, block_size, split, want):
    assert block_grid(shape, block_size, split) == want


def test_to_blocks_row_major_zero_padded_and_back():
    x = jnp.arange(15.).reshape(3, 5)
    grid = block_grid(x.shape, 2)              # rows 2 + 1, columns 2 + 2 + 1
    assert grid == ((2, 2), (3, 2))
    blocks = np.asarray(to_blocks(x, grid))
    assert blocks.shape == (6, 2, 2)
    np.testing.assert_array_equal(blocks[0], [[0, 1], [5, 6]])
    np.testing.assert_array_equal(blocks[1], [[2, 3], [7, 8]])
    np.testing.assert_array_equal(blocks[2], [[4, 0], [9, 0]])
    np.testing.assert_array_equal(blocks[3], [[10, 11], [0, 0]])
    np.testing.assert_array_equal(blocks[5], [[14, 0], [0, 0]])
    np.testing.assert_array_equal(from_blocks(jnp.asarray(blocks), x.shape, grid), x)


def test_to_blocks_of_three_axes_and_back():
    x = jnp.arange(4 * 6 * 3.).reshape(4, 6, 3)
    grid = block_grid(x.shape, 2)
    blocks = np.asarray(to_blocks(x, grid))
    assert blocks.shape == (2 * 3 * 2, 2, 2, 2)
    # block (i, j, l) in row-major order is x[2i:2i+2, 2j:2j+2, 2l:2l+2], zero-padded
    i, j, l = 1, 2, 1
    want = np.zeros((2, 2, 2))
    want[:, :, :1] = np.asarray(x)[2 * i:2 * i + 2, 2 * j:2 * j + 2, 2 * l:]
    np.testing.assert_array_equal(blocks[(i * 3 + j) * 2 + l], want)
    np.testing.assert_array_equal(from_blocks(jnp.asarray(blocks), x.shape, grid), x)


def test_block_groups_without_padding():
    groups = block_groups((5, 4), block_grid((5, 4), 3))   # rows 3 + 2, columns 2 + 2
    assert [(s, i.tolist()) for s, i in groups] == [((3, 2), [0, 1]), ((2, 2), [2, 3])]
    groups = block_groups((5, 5), block_grid((5, 5), 3))   # 3 + 2 on both axes
    assert [(s, i.tolist()) for s, i in groups] == [
        ((3, 3), [0]), ((3, 2), [1]), ((2, 3), [2]), ((2, 2), [3])]
    assert [(s, i.tolist()) for s, i in block_groups((6,), ((2, 3),))] == [((3,), [0, 1])]


def test_gather_and_scatter_blocks_cut_to_the_group_shape():
    x = jnp.arange(25.).reshape(5, 5)
    grid = block_grid(x.shape, 3)
    blocks = to_blocks(x, grid)
    pieces = {s: gather_blocks(blocks, idx, s) for s, idx in block_groups(x.shape, grid)}
    np.testing.assert_array_equal(pieces[(2, 3)][0], np.asarray(x)[3:, :3])
    np.testing.assert_array_equal(pieces[(2, 2)][0], np.asarray(x)[3:, 3:])
    back = jnp.zeros_like(blocks)
    for s, idx in block_groups(x.shape, grid):
        back = scatter_blocks(back, idx, pieces[s])
    np.testing.assert_array_equal(from_blocks(back, x.shape, grid), x)
    # per-block matrices (stats): the corner of each entry
    stats = jnp.arange(2 * 3 * 3.).reshape(2, 3, 3)
    np.testing.assert_array_equal(gather_blocks(stats, np.array([1]), (2, 2))[0],
                                  [[9, 10], [12, 13]])
    assert gather_blocks(stats, np.arange(2), (3, 3)) is stats   # whole: no copy
    new = scatter_blocks(stats, np.array([1]), -jnp.ones((1, 2, 2)))
    np.testing.assert_array_equal(new[1], [[-1, -1, 11], [-1, -1, 14], [15, 16, 17]])
    np.testing.assert_array_equal(new[0], stats[0])


@pytest.mark.parametrize("bad", [0, -1, 2.5, "8", True])
def test_bad_block_size_is_named(bad):
    with pytest.raises(ValueError, match="opt: block_size must be None or an integer >= 1"):
        check_block_size("opt", bad)


def test_good_block_sizes():
    assert check_block_size("opt", None) is None
    assert check_block_size("opt", np.int64(4)) == 4 and check_block_size("opt", 1) == 1


# --------------------------------------------------------------------------
# The three optimizers: one block_size check, blocked states that save and restore
# --------------------------------------------------------------------------

OPTIMIZERS = {
    "shampoo": lambda **kw: functrain.contrib.shampoo(1e-2, start_preconditioning_step=1, **kw),
    "soap": lambda **kw: functrain.contrib.soap(1e-2, precondition_frequency=2, **kw),
    "kron": lambda **kw: functrain.contrib.kron(1e-2, preconditioner_update_probability=1.0,
                                                **kw),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_every_matrix_optimizer_names_a_bad_block_size(name, bad):
    with pytest.raises(ValueError, match=f"scale_by_{name}: block_size must be None or an "
                                         f"integer >= 1"):
        OPTIMIZERS[name](block_size=bad)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_blocked_state_layout_eval_shape_and_orbax(name, tmp_path):
    """A (7, 9) leaf in blocks of 4 (rows 4 + 3, columns 3 x 3: six blocks, per-block
    matrices (6, 4, 4) and (6, 3, 3)): jax.eval_shape(init) gives the state's shapes, and an
    Orbax checkpoint restores into it and continues with the same numbers."""
    ocp = pytest.importorskip("orbax.checkpoint")
    opt = OPTIMIZERS[name](block_size=4)
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.standard_normal((7, 9)), jnp.float32), "b": jnp.zeros(9)}
    grads = [jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype), params)
             for _ in range(4)]
    step = jax.jit(lambda p, s, g: opt.update(g, s, p))
    state = opt.init(params)
    per_block = {"shampoo": lambda s: [s.stats_l["w"], s.stats_r["w"]],
                 "soap": lambda s: s.stats["w"], "kron": lambda s: s.qs["w"]}[name](state[0])
    assert [m.shape for m in per_block] == [(6, 4, 4), (6, 3, 3)]
    target = jax.eval_shape(opt.init, params)
    assert [(x.shape, x.dtype) for x in jax.tree.leaves(target)] == [
        (x.shape, x.dtype) for x in jax.tree.leaves(state)]
    for g in grads[:2]:
        _, state = step(params, state, g)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "ckpt", state)
    checkpointer.wait_until_finished()
    restored = checkpointer.restore(tmp_path / "ckpt", target)
    for g in grads[2:]:
        u, state = step(params, state, g)
        u_restored, restored = step(params, restored, g)
        for a, b in zip(jax.tree.leaves(u), jax.tree.leaves(u_restored)):
            np.testing.assert_array_equal(a, b)
