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

``--registry`` hashes, instead, every setting of every optimizer the tests' registry
(``tests/registry.py``) records, on a small tree with matrices, a vector and a scalar:
init's program and update's (a few minutes on two cores). Run it around a change that moves
code between modules.
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


def registry_hashes(root: str) -> None:
    """Prints ``<setting> init <hash> update <hash>`` for every registry setting."""
    sys.path[:0] = [root, f"{root}/tests"]
    import jax
    import jax.numpy as jnp
    import functrain as ft
    import registry

    params = {"w": jnp.linspace(-1.0, 1.0, 96).reshape(12, 8), "b": jnp.linspace(0.1, 0.8, 8),
              "e": jnp.linspace(-2.0, 2.0, 160).reshape(16, 10), "s": jnp.float32(0.5)}

    def loss_fn(p):
        return sum(jnp.sum(jnp.sin(x) * x) for x in jax.tree_util.tree_leaves(p))

    print(f"# functrain from {ft.__file__}")
    for name, record in sorted(registry.REGISTRY.items()):
        for setting in record.all_settings():
            try:
                opt = record.make(ft, **setting.kwargs)
                init = jax.jit(opt.init).lower(params).compile()
                state = jax.eval_shape(opt.init, params)

                def step(p, s, g, opt=opt, record=record):
                    u, s = opt.update(g, s, p, **record.update_kwargs(loss_fn, p))
                    return ft.apply_updates(p, u), s

                update = jax.jit(step).lower(params, state, params).compile()
                print(setting.label, "init", program_hash(init.as_text()), "update",
                      program_hash(update.as_text()), flush=True)
            except Exception as e:  # noqa: BLE001  (a setting that needs more than this)
                print(setting.label, "error", type(e).__name__, flush=True)


def main(root: str) -> None:
    sys.path.insert(0, root)
    import jax
    import jax.numpy as jnp
    import functrain as ft

    small = {"w": jnp.ones((64, 32)), "b": jnp.ones(32), "e": jnp.ones((128, 64)),
             "s": jnp.ones(())}
    big = {"w": jax.ShapeDtypeStruct((4096, 4096), jnp.float32)}
    bf16 = {k: v.astype(jnp.bfloat16) for k, v in small.items()}
    cases = {"adam": (ft.adam(1e-3), small), "adamw": (ft.adamw(1e-3), small),
             "lamb": (ft.lamb(1e-3, weight_decay=0.1), small), "lars": (ft.lars(1e-3), small),
             "muon": (ft.contrib.muon(1e-3), small),
             "clip+adamw": (ft.chain(ft.clip_by_global_norm(1.0), ft.adamw(1e-3)), small),
             "lamb16M": (ft.lamb(1e-3, weight_decay=0.1), big),
             # the wrappers and the low-bit state I/O around the engine
             "adamw_8bit": (ft.quantized_state(ft.adamw(1e-3), bits=8, min_size=16), small),
             "adamw_4bit": (ft.quantized_state(ft.adamw(1e-3), bits=4, min_size=16), small),
             "lion_fp8": (ft.quantized_state(ft.lion(1e-4), bits="fp8", min_size=16), small),
             "muon_8bit": (ft.quantized_state(ft.contrib.muon(1e-3), bits=8, min_size=16),
                           small),
             "adamw_mask": (ft.adamw(1e-3, mask=lambda p: {k: v.ndim > 1
                                                          for k, v in p.items()}), small),
             "masked_adam": (ft.masked(ft.adam(1e-3), {"w": True, "b": False, "e": True,
                                                        "s": False}), small),
             "inject_adam": (ft.inject_hyperparams(ft.adam)(learning_rate=1e-3), small),
             "plateau": (ft.chain(ft.adam(1e-3), ft.contrib.reduce_on_plateau()), small,
                         {"value": jnp.float32(1.0)}),
             "polyak": (ft.polyak_sgd(), small, {"value": jnp.float32(1.0)}),
             "lion": (ft.lion(1e-4), small), "sgd": (ft.sgd(1e-2, momentum=0.9), small),
             "adafactor": (ft.adafactor(1e-3), small), "sm3": (ft.sm3(1e-3), small),
             "lars_16bit": (ft.lars(1e-3), bf16),
             "lamb_none": (ft.chain(ft.set_to_zero(), ft.lamb(1e-3)), small),
             "multisteps": (ft.MultiSteps(ft.adam(1e-3), 2), small)}
    print(f"# functrain from {ft.__file__}")
    for name, (opt, params, *extra) in cases.items():
        state = jax.eval_shape(opt.init, params)

        def step(p, s, g, opt=opt, extra=(extra or [{}])[0]):
            u, s = opt.update(g, s, p, **extra)
            return ft.apply_updates(p, u), s

        compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params).compile()
        print(name, program_hash(compiled.as_text()))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--registry"]
    (registry_hashes if "--registry" in sys.argv else main)(args[0] if args else ".")
