"""The former path of :mod:`functrain.matrix.blocks` (how the matrix optimizers merge axes
and cut a leaf into blocks), kept so that ``functrain.contrib.partition.<name>`` still
imports: every name here is the same object as in :mod:`functrain.matrix.blocks`. New code
should import from there.

>>> import functrain.matrix.blocks
>>> block_grid is functrain.matrix.blocks.block_grid
True
"""

# Re-exports only.
from functrain.matrix.blocks import (block_grid, block_groups, check_block_size, from_blocks,
                                     from_layer_blocks, gather_blocks, layer_block_groups,
                                     map_by_shape, merged_shape, scatter_blocks, to_blocks,
                                     to_layer_blocks)

__all__ = ["check_block_size", "merged_shape", "block_grid", "to_blocks", "from_blocks",
           "block_groups", "gather_blocks", "scatter_blocks", "to_layer_blocks",
           "from_layer_blocks", "layer_block_groups", "map_by_shape"]
