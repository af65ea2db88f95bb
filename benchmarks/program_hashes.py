"""Hashes of the optimized XLA programs of a few optimizers' jitted, donated steps.

A refactor that must change no behaviour must leave these unchanged. Run it on the old and
the new code and compare the two outputs, e.g.::

    git worktree add /tmp/before HEAD~1
    python benchmarks/program_hashes.py /tmp/before > before.txt
    python benchmarks/program_hashes.py . > after.txt
    diff before.txt after.txt

The hash covers the instructions only: file names, function names and source locations
(which move with any edit) are stripped. ``lamb16M`` is one 16M-parameter leaf, where the
engine's CPU trust-ratio recompute fires.
"""

from __future__ import annotations

import hashlib
import re
import sys


def program_hash(text: str) -> str:
    """The hash of a compiled program's text without metadata and source tables."""
    text = re.sub(r"metadata=\{[^}]*\}", "", text)
    text = re.sub(r", stack_frame_id=\d+", "", text)
    lines = [line for line in text.splitlines()
             if not re.match(r'^\s*\d+ ["{]', line) and not line.startswith("HloModule")]
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()[:12]


def main(root: str) -> None:
    sys.path.insert(0, root)
    import jax
    import jax.numpy as jnp
    import functrain as ft

    small = {"w": jnp.ones((64, 32)), "b": jnp.ones(32), "e": jnp.ones((128, 64)),
             "s": jnp.ones(())}
    big = {"w": jax.ShapeDtypeStruct((4096, 4096), jnp.float32)}
    cases = {"adam": (ft.adam(1e-3), small), "adamw": (ft.adamw(1e-3), small),
             "lamb": (ft.lamb(1e-3, weight_decay=0.1), small), "lars": (ft.lars(1e-3), small),
             "muon": (ft.contrib.muon(1e-3), small),
             "clip+adamw": (ft.chain(ft.clip_by_global_norm(1.0), ft.adamw(1e-3)), small),
             "lamb16M": (ft.lamb(1e-3, weight_decay=0.1), big)}
    print(f"# functrain from {ft.__file__}")
    for name, (opt, params) in cases.items():
        state = jax.eval_shape(opt.init, params)

        def step(p, s, g, opt=opt):
            u, s = opt.update(g, s, p)
            return ft.apply_updates(p, u), s

        compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params).compile()
        print(name, program_hash(compiled.as_text()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
