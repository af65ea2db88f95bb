"""optax's own tests, run against functrain: ``make conformance``.

What it runs: the test files that ship in the installed optax wheel (optax 0.2.8, the
peer in the test extra), read where pip put them (``site-packages/optax/**/*_test.py``);
nothing of optax's is copied into this repository. The files are those of the parts
functrain mirrors (``SUBPACKAGES``: ``_src``, ``contrib``, ``projections``,
``microbatching``, ``schedules``, ``transforms``, ``tree_utils``, ``losses`` and the
top-level ``optax_test.py``); ``assignment``, ``perturbations`` and ``experimental`` are
left out, since functrain has none of them (tests/test_optax_coverage.py).

How functrain gets in: pytest loads ``swap_plugin.py`` (this directory) with ``-p``.
Before any optax test module is imported, the plugin replaces every public function and
class of optax's modules by functrain's object of the same name, where functrain has one
(``optax.adam``, ``optax._src.alias.adam``, ``optax._src.transform.scale_by_adam``,
``optax.tree.add``, ``optax.contrib.muon``, ...). optax's own code that calls those names
through its modules calls functrain's too. Names functrain lacks stay optax's, so a test
can run wholly on optax: the plugin records, per test, whether any functrain code ran
(the table's "reached" column), and per file how many of the optax names the file refers
to were swapped.

What it checks: every failing test must match an entry of ``known_differences.toml``
(a glob over pytest's node id, with a category and a reason). The run exits 1 when a
failure matches no entry (a *new* failure), when an entry matches no test that ran, when a
failure listed as ``upstream`` passes on pure optax, or when pytest itself errors. Entries that
match only passing tests are reported as *stale* but do not fail the run (``--strict``
makes them fail): a stale entry only makes the list more permissive than it needs to be,
and failing on it would make the commit that fixes a ``BUG:`` entry fail CI unless it edits
the list too.

Usage::

    .venv/bin/python tests/conformance/run_conformance.py [--out benchmarks/results]
        [-n 2] [--strict] [--files _src/alias_test.py ...] [--keep DIR] [--no-swap]

``--out DIR`` writes ``DIR/conformance.md`` (the per-file table and the failures) and
``DIR/conformance.json`` (the failures' messages, the skipped tests with optax's reasons, the
tests that ran without calling functrain). Two pytest-xdist workers by default. ``--no-swap``
runs the same files on pure optax (the baseline; no list check). Every run also re-runs the
failures listed as ``upstream`` on pure optax, to check that they fail there too.
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time
import tomllib

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
LIST_FILE = HERE / "known_differences.toml"

# optax sub-packages whose test files run (functrain mirrors them), and those left out.
SUBPACKAGES = ("_src", "contrib", "projections", "microbatching", "schedules", "transforms",
               "tree_utils", "losses")
TOP_LEVEL_FILES = ("optax_test.py",)
LEFT_OUT = {
    "assignment": "the Hungarian algorithm: not an optimizer (use optax.assignment)",
    "perturbations": "perturbed smoothing: not an optimizer (use optax.perturbations)",
    "experimental": "optax's experimental aggregating API: not mirrored",
}
CATEGORIES = {
    "upstream": "fails on pure optax too (re-run on pure optax by every run to check)",
    "messages": "the text or type of an error or of verbose output, or when it is raised",
    "behaviour": "documented behaviour differences",
    "state": "a documented optimizer-state layout other than optax's",
    "numerics": "last-bit rounding differences, with their cause",
    "BUG": "functrain bugs, to fix (listed so that the run stays green meanwhile)",
}


def optax_dir() -> pathlib.Path:
    import optax
    return pathlib.Path(optax.__file__).parent


def optax_test_files(root: pathlib.Path) -> list[str]:
    files = [f for f in TOP_LEVEL_FILES if (root / f).exists()]
    for sub in SUBPACKAGES:
        files += sorted(str(p.relative_to(root)) for p in (root / sub).glob("*_test.py"))
    return files


def load_differences(path: pathlib.Path = LIST_FILE) -> list[dict]:
    with open(path, "rb") as f:
        return tomllib.load(f).get("difference", [])


def run_pytest(root: pathlib.Path, targets: list[str], workers: int, tmp: pathlib.Path,
               swap: bool = True) -> int:
    """Run pytest on optax's files (or node ids), recording into ``tmp``; its exit code."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "reports.jsonl").unlink(missing_ok=True)
    (tmp / "pytest.ini").write_text("[pytest]\n")
    cmd = [sys.executable, "-m", "pytest", "-c", str(tmp / "pytest.ini"),
           f"--rootdir={root}", "-p", "swap_plugin", "-p", "no:cacheprovider", "-q",
           "--tb=line", "-W", "ignore", "--no-header", "-rN"]
    if workers > 0:
        cmd += ["-n", str(workers)]
    cmd += [str(root / f) for f in targets]
    env = dict(os.environ, FUNCTRAIN_CONFORMANCE_OUT=str(tmp),
               FUNCTRAIN_CONFORMANCE_NO_SWAP="0" if swap else "1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), str(REPO),
                                                        os.environ.get("PYTHONPATH")])))
    with open(tmp / "pytest.log", "w") as log:
        proc = subprocess.run(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc.returncode


def collect_results(tmp: pathlib.Path) -> dict[str, dict]:
    """nodeid -> {outcome, reached, messages} (a test fails if any phase or subtest does)."""
    tests: dict[str, dict] = {}
    path = tmp / "reports.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    for row in rows:
        t = tests.setdefault(row["nodeid"], {"outcome": "passed", "reached": False,
                                             "messages": [], "ran": False,
                                             "seconds": 0.0})
        if not row["subtest"]:
            t["seconds"] += row.get("duration") or 0.0
        if row["reached"]:
            t["reached"] = True
            t.setdefault("first_functrain_call", row.get("first"))
        if row["when"] == "call" and not row["subtest"]:
            t["ran"] = True
        if row["outcome"] == "failed":
            t["outcome"] = "failed"
            if row["message"] and len(t["messages"]) < 3:
                t["messages"].append(row["message"])
        elif row["outcome"] == "skipped" and t["outcome"] == "passed" and not row["subtest"]:
            t["outcome"] = "skipped"
            t["skip_reason"] = row["message"]
    return tests


def match(nodeid: str, differences: list[dict]) -> dict | None:
    for d in differences:
        if fnmatch.fnmatchcase(nodeid, d["test"]):
            return d
    return None


def analyse(root, files, tests, differences, names):
    per_file = collections.OrderedDict(
        (f, collections.Counter()) for f in files)
    new, listed, used = [], [], collections.defaultdict(list)
    for nodeid, t in sorted(tests.items()):
        f = nodeid.split("::")[0]
        c = per_file.setdefault(f, collections.Counter())
        c["tests"] += 1
        c["reached"] += t["reached"]
        c["seconds"] += t["seconds"]
        c[t["outcome"]] += 1
        d = match(nodeid, differences)
        if d is not None:
            used[d["test"]].append((nodeid, t["outcome"]))
        if t["outcome"] == "failed":
            if d is None:
                c["new"] += 1
                new.append((nodeid, t["messages"]))
            else:
                c["listed"] += 1
                listed.append((nodeid, d))
    ran_files = set(files)
    stale = [d for d in differences
             if d["test"].split("::")[0] in ran_files and used.get(d["test"])
             and all(o != "failed" for _, o in used[d["test"]])]
    unmatched = [d for d in differences
                 if d["test"].split("::")[0] in ran_files and not used.get(d["test"])]
    for f, c in per_file.items():
        info = names.get(str(root / f), {})
        c["names_swapped"] = len(info.get("swapped", []))
        c["names_optax"] = len(info.get("optax_only", []))
    return per_file, new, listed, stale, unmatched


COLUMNS = [  # (heading, counter key); the list columns are left out of the baseline's table
    ("tests", "tests"), ("reached functrain", "reached"), ("passed", "passed"),
    ("skipped", "skipped"), ("failed", "failed"), ("listed differences", "listed"),
    ("new failures", "new")]


def table(per_file, baseline: bool = False):
    """The per-file table as Markdown lines, and the totals."""
    columns = [c for c in COLUMNS if not (baseline and c[1] in ("listed", "new"))]
    lines = ["| file | " + " | ".join(h for h, _ in columns)
             + " | optax names swapped / optax-only | test seconds |",
             "|" + "---|" * (len(columns) + 3)]
    total = collections.Counter()
    for f, c in per_file.items():
        total.update(c)
        lines.append(f"| `{f}` | " + " | ".join(str(c[k]) for _, k in columns)
                     + f" | {c['names_swapped']} / {c['names_optax']} | {c['seconds']:.0f} |")
    lines.append("| **total** | " + " | ".join(str(total[k]) for _, k in columns)
                 + f" | | {total['seconds']:.0f} |")
    return lines, total


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def verify_upstream(root, listed, workers, tmp) -> list[tuple[str, dict]]:
    """The failures listed as ``upstream``, run again on pure optax: those that pass there."""
    nodeids = [n for n, d in listed if d["category"] == "upstream"]
    if not nodeids:
        return []
    run_pytest(root, nodeids, min(workers, len(nodeids)), tmp / "upstream", swap=False)
    optax_results = collect_results(tmp / "upstream")
    return [(n, d) for n, d in listed if n in nodeids
            and optax_results.get(n, {}).get("outcome") != "failed"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, help="write conformance.md/.json here")
    parser.add_argument("-n", "--workers", type=int, default=2, help="pytest-xdist workers")
    parser.add_argument("--strict", action="store_true", help="stale list entries fail too")
    parser.add_argument("--files", nargs="*", help="optax test files (relative to optax/)")
    parser.add_argument("--keep", type=pathlib.Path, help="keep pytest's raw output here")
    parser.add_argument("--no-swap", action="store_true",
                        help="the baseline: run the same files on pure optax (no list check; "
                             "--out writes conformance-optax.json)")
    args = parser.parse_args(argv)

    import optax
    root = optax_dir()
    files = args.files or optax_test_files(root)
    differences = load_differences()
    tmp = args.keep or pathlib.Path(tempfile.mkdtemp(prefix="conformance-"))

    start, cpu_start = time.perf_counter(), _children_cpu()
    rc = run_pytest(root, files, args.workers, tmp, swap=not args.no_swap)
    seconds, cpu = time.perf_counter() - start, _children_cpu() - cpu_start
    tests = collect_results(tmp)
    names = {}
    for p in tmp.glob("names-*.json"):
        names.update(json.loads(p.read_text()))
    per_file, new, listed, stale, unmatched = analyse(root, files, tests, differences, names)
    lines, total = table(per_file, baseline=args.no_swap)
    print("\n".join(lines))
    where = "pure optax (nothing swapped)" if args.no_swap else "functrain swapped in"
    print(f"\n{total['tests']} tests in {len(per_file)} files from optax {optax.__version__}, "
          f"{where}, in {seconds:.0f} s ({args.workers} workers, {cpu:.0f} s of CPU); "
          f"{total['reached']} reached "
          f"functrain code; {total['failed']} failed.")
    pytest_error = rc not in (0, 1) or not tests
    if pytest_error:
        print(f"pytest exited {rc}; its output: {tmp / 'pytest.log'}")
        print((tmp / "pytest.log").read_text()[-3000:])
    if args.no_swap:
        for nodeid, t in sorted(tests.items()):
            if t["outcome"] == "failed":
                print(f"FAILS ON PURE OPTAX {nodeid}: {' / '.join(t['messages'])[:300]}")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "conformance-optax.json").write_text(json.dumps(
                {"optax": optax.__version__, "seconds": round(seconds, 1),
                 "workers": args.workers, "totals": dict(total), "tests": tests},
                indent=1, sort_keys=True) + "\n")
        return 1 if pytest_error else 0

    upstream_passing = verify_upstream(root, listed, args.workers, tmp)
    print(f"{total['listed']} failures are listed differences, {total['new']} are new; "
          f"{len(stale)} stale and {len(unmatched)} unmatched list entries; "
          f"{len(upstream_passing)} 'upstream' failures pass on pure optax.")
    for nodeid, messages in new:
        print(f"NEW FAILURE {nodeid}\n    " + "\n    ".join(m[:400] for m in messages))
    for nodeid, d in upstream_passing:
        print(f"NOT UPSTREAM (listed as failing on pure optax too, but passes there): {nodeid}")
    for d in stale:
        print(f"STALE (listed, now passes; remove it): {d['test']}")
    for d in unmatched:
        print(f"UNMATCHED (listed, no such test ran): {d['test']}")

    if args.out:
        write_outputs(args.out, per_file, lines, total, tests, new, listed, stale, unmatched,
                      (seconds, cpu), args.workers, optax.__version__)
        print(f"wrote {args.out / 'conformance.md'} and {args.out / 'conformance.json'}")
    failed = (bool(new) or bool(unmatched) or bool(upstream_passing) or pytest_error
              or (args.strict and bool(stale)))
    return 1 if failed else 0


def write_outputs(out, per_file, lines, total, tests, new, listed, stale, unmatched, timing,
                  workers, version):
    """``out/conformance.md`` (the table, the failures) and ``out/conformance.json``."""
    import jax
    out.mkdir(parents=True, exist_ok=True)
    seconds, cpu = timing
    pure = sorted(n for n, t in tests.items() if not t["reached"] and t["outcome"] != "skipped")
    md = [f"# Conformance: optax {version}'s tests against functrain", "",
          "Written by `make conformance` (tests/conformance/run_conformance.py); "
          "docs/conformance.md explains it.", "",
          f"optax {version}, jax {jax.__version__}, {time.strftime('%Y-%m-%d')}: "
          f"{total['tests']} tests, {total['reached']} reached functrain code, "
          f"{total['passed']} passed, {total['skipped']} skipped, {total['failed']} failed "
          f"({total['listed']} listed differences, {total['new']} new). {len(pure)} tests ran "
          f"without calling functrain (listed in conformance.json). {seconds:.0f} s with "
          f"{workers} pytest-xdist workers ({cpu:.0f} s of CPU).", "", *lines, ""]
    if listed:
        md += ["## Failures on the list of deliberate differences", "",
               "| test | category | reason |", "|---|---|---|"]
        md += [f"| `{n}` | {d['category']} | {d['reason']} |" for n, d in listed]
        md.append("")
    if new:
        md += ["## New failures", ""] + [f"- `{n}`: {' / '.join(m)[:300]}" for n, m in new]
        md.append("")
    if stale or unmatched:
        md += ["## Stale list entries", ""] + [f"- `{d['test']}`" for d in stale + unmatched]
    (out / "conformance.md").write_text("\n".join(md) + "\n")
    summary = {
        "optax": version, "jax": jax.__version__, "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu, 1), "workers": workers,
        "totals": {k: round(v, 1) for k, v in total.items()},
        "files": {f: {k: round(v, 1) for k, v in c.items()} for f, c in per_file.items()},
        "failed": {n: {"category": d["category"], "messages": tests[n]["messages"]}
                   for n, d in listed} | {n: {"category": None, "messages": m} for n, m in new},
        "ran_without_functrain": pure,
        "skipped": {n: t.get("skip_reason") for n, t in sorted(tests.items())
                    if t["outcome"] == "skipped"},
    }
    (out / "conformance.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    sys.exit(main())
