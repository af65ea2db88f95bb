"""Run by ``make package`` in a new venv holding only the installed wheel and its declared
dependencies: the README's quickstart runs and reaches its stated loss, and the installed
package is the wheel (not this checkout) with a version.

Usage: ``python tests/package_smoke.py README.md`` (from a directory outside the checkout).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def quickstart(readme: Path) -> str:
    """The first python block after the README's Quickstart heading."""
    text = readme.read_text()
    section = text[text.index("## Quickstart"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def main(readme: str) -> None:
    import functrain
    here = Path(readme).resolve().parent
    where = Path(functrain.__file__).resolve()
    assert here not in where.parents, f"functrain imported from the checkout: {where}"
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", functrain.__version__), functrain.__version__
    namespace: dict = {}
    exec(compile(quickstart(Path(readme)), "README quickstart", "exec"), namespace)
    final = float(namespace["loss"](namespace["params"], namespace["batch"]))
    assert final < 1e-4, final  # the README says ~1e-8
    import jax
    print(f"functrain {functrain.__version__} from {where.parent} on JAX {jax.__version__}, "
          f"Python {sys.version.split()[0]}: quickstart loss {final:.2e}")


if __name__ == "__main__":
    main(sys.argv[1])
