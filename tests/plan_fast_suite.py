"""Plan ``make test`` to fit its time budget: which measured tests go to ``make test-long``.

``make test`` must stay under 15 minutes on a 2-core machine, a slow and busy one included;
``make test-long`` (which CI runs too) takes the rest. The tests marked ``long`` in their
files are there by nature (notebooks, fresh processes, model-scale twins). This script moves
more of them there by measurement: from a ``pytest --durations=0`` log of the suite less
those (``make test-plan`` runs it, with the list below switched off), it marks the heaviest
test cases ``long`` until the rest of the suite sums to at most ``--keep`` of the measured
total (a fraction, so that a measurement on a busy or slow machine plans the same), keeping at least one case of every test function in ``make test`` (the cheapest ones are
kept; so every check runs in the quick suite, on its cheapest subjects, and on all of them
in ``make test-long``). It writes the chosen node ids to ``tests/long_by_duration.txt``,
which ``tests/conftest.py`` reads at collection: the list is committed, so which tests run
where never depends on the machine that runs them.

The budget: 28%. The suite less its marked long checks measured 2,307 worker-seconds on the
developers' quiet 2-core machine (2026-11-28); 28% of it is about 5.5 minutes of
``pytest -n 2`` wall time plus a minute of collection, so that a machine twice as slow (or
the same one beside busy processes: the README's "Tests and dependencies" section gives the
times measured) stays under 15 minutes.

Usage::

    python tests/plan_fast_suite.py LOG [--keep FRACTION] [--whole-above SECONDS]
                                        [--out tests/long_by_duration.txt]
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "long_by_duration.txt"
LINE = re.compile(r"^(\d+(?:\.\d+)?)s (call|setup|teardown)\s+(\S.*?)\s*$")


def read_durations(text: str) -> dict[str, float]:
    """node id -> seconds (setup, call and teardown summed) from a ``--durations=0`` log."""
    seconds: dict[str, float] = collections.defaultdict(float)
    for line in text.splitlines():
        match = LINE.match(line)
        if match:
            seconds[match.group(3)] += float(match.group(1))
    return dict(seconds)


def function_of(node_id: str) -> str:
    """The test function a node id belongs to (its parametrization cut off)."""
    return node_id.split("[", 1)[0]


def plan(seconds: dict[str, float], budget: float, whole_above: float = float("inf")
         ) -> list[str]:
    """The node ids to mark ``long``: the heaviest first, until the others sum to at most
    ``budget``; never the last remaining case of a parametrized test function, and a test of
    one case only if it takes at least ``whole_above`` seconds.

    >>> plan({"t.py::a[1]": 5.0, "t.py::a[2]": 1.0, "t.py::b": 9.0}, budget=11.0)
    ['t.py::a[1]']
    >>> plan({"t.py::a[1]": 5.0, "t.py::a[2]": 1.0, "t.py::b": 9.0}, 5.0, whole_above=8.0)
    ['t.py::a[1]', 't.py::b']
    """
    remaining = collections.Counter(function_of(n) for n in seconds)
    cases = dict(remaining)
    total = sum(seconds.values())
    chosen = []
    for node, t in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0])):
        if total <= budget:
            break
        if remaining[function_of(node)] > 1 or (cases[function_of(node)] == 1
                                                and t >= whole_above):
            remaining[function_of(node)] -= 1
            total -= t
            chosen.append(node)
    return sorted(chosen)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=pathlib.Path)
    parser.add_argument("--keep", type=float, default=0.28,
                        help="the fraction of the measured worker-seconds make test keeps")
    parser.add_argument("--whole-above", type=float, default=4.0,
                        help="a test of one case may go long if it takes this many seconds")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    seconds = read_durations(args.log.read_text())
    if not seconds:
        print(f"no durations in {args.log}: run pytest with --durations=0", file=sys.stderr)
        return 2
    budget = args.keep * sum(seconds.values())
    chosen = plan(seconds, budget, args.whole_above)
    kept = sum(t for n, t in seconds.items() if n not in set(chosen))
    header = [
        "# Test cases make test leaves to make test-long, by measured duration (written by",
        "# tests/plan_fast_suite.py from a --durations=0 run; make test-plan). One node id a line.",
        f"# Measured: {len(seconds)} cases, {sum(seconds.values()):.0f} worker-seconds; these "
        f"{len(chosen)} take {sum(seconds.values()) - kept:.0f},",
        f"# leaving {kept:.0f} ({args.keep:.0%} of the total: budget {budget:.0f}) in make test.",
    ]
    args.out.write_text("\n".join(header + chosen) + "\n")
    print("\n".join(header[2:]).replace("# ", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
