"""Other projects' optax-using tests, run with optax and with functrain in its place:
``make clients``.

What runs:

* **flax** (the version installed, the ``flax`` extra): its NNX optimizer tests
  (``tests/nnx/optimizer_test.py``) and ``tests/linen/linen_test.py``, from flax's released
  source distribution of that version (downloaded once by pip into ``.clients/``; nothing of
  flax's is kept in this repository).
* **optimistix**: its released sources carry no tests, so ``tests/clients/optimistix_check.py``
  (ours) drives its ``OptaxMinimiser`` the way optimistix's own tests do; with
  ``OPTIMISTIX_SRC=<a checkout of optimistix>`` its own ``tests/test_minimise.py`` runs too.

Each file runs twice in fresh pytest processes: once as it is (``import optax`` is optax),
once with ``tests/clients/functrain_as_optax.py`` loaded, which makes ``import optax`` give
functrain (and ``FUNCTRAIN_OPTAX_TYPES=0``, so functrain does not import optax either). The
two runs are compared test by test: outcome (passed, failed, skipped), and for our optimistix
checks every solution bit for bit. The run fails on a difference not listed in
``tests/clients/known_differences.toml`` (a glob over the test id, and the reason), on a listed
one that did not occur, or when the functrain run cannot show that ``optax`` was functrain.

``--reduced`` (what CI runs) keeps, of flax's files, the tests whose source mentions optax.

Usage::

    .venv/bin/python tests/clients/run_clients.py [--reduced] [--out benchmarks/results]
        [-n 2]
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
CACHE = REPO / ".clients"
LIST_FILE = HERE / "known_differences.toml"
FLAX_FILES = ("tests/nnx/optimizer_test.py", "tests/linen/linen_test.py")


def flax_sources() -> pathlib.Path:
    """The released flax source tree of the installed version (its tests), fetched once."""
    version = importlib.metadata.version("flax")
    root = CACHE / f"flax-{version}"
    if not (root / FLAX_FILES[0]).exists():
        CACHE.mkdir(exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", ":all:", f"flax=={version}",
                        "-d", str(CACHE)], check=True)
        with tarfile.open(CACHE / f"flax-{version}.tar.gz") as archive:
            members = [m for m in archive.getmembers()
                       if m.name.startswith(f"flax-{version}/tests/")]
            archive.extractall(CACHE, members=members, filter="data")
    return root


def tests_mentioning_optax(path: pathlib.Path) -> list[str]:
    """The test functions of a file whose source mentions optax."""
    source = path.read_text()
    return sorted({node.name for node in ast.walk(ast.parse(source))
                   if isinstance(node, ast.FunctionDef) and node.name.startswith("test")
                   and "optax" in ast.get_source_segment(source, node)})


def run_pytest(root: pathlib.Path, files: list[str], functrain: bool, tmp: pathlib.Path,
               workers: int, select: list[str] = ()) -> dict:
    """One pytest process over ``files`` (relative to ``root``); test id -> outcome, and the
    values the tests recorded, and whether optax was functrain."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "pytest.ini").write_text("[pytest]\n")
    mark, values = tmp / "mark.txt", tmp / "values.jsonl"
    for f in (mark, values):
        f.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-c", str(tmp / "pytest.ini"), f"--rootdir={root}",
           "-p", "no:cacheprovider", "-q",
           "--tb=line", "-W", "ignore", f"--junitxml={tmp / 'junit.xml'}"]
    if root == HERE:
        cmd += ["--noconftest"]  # our checks, not functrain's test suite
    if functrain:
        cmd += ["-p", "functrain_as_optax"]
    if workers > 0:
        cmd += ["-n", str(workers)]
    if select:
        cmd += ["-k", " or ".join(select)]
    cmd += [str(root / f) for f in files]
    env = dict(os.environ, FUNCTRAIN_CLIENTS_MARK=str(mark), FUNCTRAIN_CLIENTS_VALUES=str(values),
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE),
                                                        os.environ.get("PYTHONPATH")])))
    start = time.time()
    with open(tmp / "pytest.log", "w") as log:
        subprocess.run(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    outcomes = {}
    if (tmp / "junit.xml").exists():
        for case in ET.parse(tmp / "junit.xml").getroot().iter("testcase"):
            kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), None)
            outcome = {"failure": "failed", "error": "failed", "skipped": "skipped"}.get(
                kind, "passed")
            outcomes[f"{case.get('classname')}::{case.get('name')}"] = outcome
    recorded = {}
    if values.exists():
        for line in values.read_text().splitlines():
            row = json.loads(line)
            recorded[row["test"]] = row["value"]
    return {"outcomes": outcomes, "values": recorded, "seconds": time.time() - start,
            "optax_was_functrain": mark.exists() and "optax is functrain" in mark.read_text(),
            "log": str(tmp / "pytest.log")}


def load_differences() -> list[dict]:
    with open(LIST_FILE, "rb") as f:
        return tomllib.load(f).get("difference", [])


def compare(name: str, with_optax: dict, with_functrain: dict) -> list[dict]:
    """The tests whose outcome or recorded values differ between the two runs."""
    found = []
    ids = sorted(set(with_optax["outcomes"]) | set(with_functrain["outcomes"]))
    for test in ids:
        a = with_optax["outcomes"].get(test, "absent")
        b = with_functrain["outcomes"].get(test, "absent")
        if a != b:
            found.append({"suite": name, "test": test, "optax": a, "functrain": b})
    for test, value in sorted(with_optax["values"].items()):
        other = with_functrain["values"].get(test)
        if other != value:
            found.append({"suite": name, "test": test, "optax": "values",
                          "functrain": "other values" if other is not None else "no values"})
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reduced", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("-n", type=int, default=2)
    args = parser.parse_args(argv)

    suites = []
    flax_root = flax_sources()
    select = ([n for f in FLAX_FILES for n in tests_mentioning_optax(flax_root / f)]
              if args.reduced else [])
    suites.append((f"flax {importlib.metadata.version('flax')}", flax_root, list(FLAX_FILES),
                   select))
    suites.append((f"optimistix {importlib.metadata.version('optimistix')} (our checks)", HERE,
                   ["optimistix_check.py"], []))
    if os.environ.get("OPTIMISTIX_SRC"):  # its tests also need diffrax (pip install diffrax)
        suites.append(("optimistix (its own tests)", pathlib.Path(os.environ["OPTIMISTIX_SRC"]),
                       ["tests/test_minimise.py"], []))

    differences, summary = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, root, files, sel) in enumerate(suites):
            runs = {}
            for side in ("optax", "functrain"):
                runs[side] = run_pytest(root, files, side == "functrain",
                                        pathlib.Path(tmp) / f"{i}-{side}", args.n, sel)
                counts = {o: list(runs[side]["outcomes"].values()).count(o)
                          for o in ("passed", "failed", "skipped")}
                print(f"{name}, with {side}: {counts} in {runs[side]['seconds']:.0f} s",
                      flush=True)
                if not counts["passed"]:
                    print(open(runs[side]["log"]).read()[-3000:])
                    print(f"{name}, with {side}: nothing passed; the suite did not run")
                    return 1
                summary.append({"suite": name, "side": side, **counts,
                                "seconds": round(runs[side]["seconds"], 1),
                                "values_compared": len(runs[side]["values"])})
            if not runs["functrain"]["optax_was_functrain"]:
                print(f"{name}: the functrain run did not show that optax was functrain")
                return 1
            differences += compare(name, runs["optax"], runs["functrain"])

    listed = load_differences()
    new = [d for d in differences
           if not any(fnmatch.fnmatchcase(d["test"], e["test"]) for e in listed)]
    stale = [e for e in listed
             if not any(fnmatch.fnmatchcase(d["test"], e["test"]) for d in differences)]
    for d in differences:
        print(f"  differs: {d['suite']}: {d['test']}: optax {d['optax']}, "
              f"functrain {d['functrain']}")
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "clients.json").write_text(json.dumps(
            {"reduced": args.reduced, "runs": summary, "differences": differences}, indent=1)
            + "\n")
        lines = ["| suite | with | passed | failed | skipped | values compared | seconds |",
                 "|---|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['suite']} | {r['side']} | {r['passed']} | {r['failed']} | "
                  f"{r['skipped']} | {r['values_compared']} | {r['seconds']:.0f} |"
                  for r in summary]
        lines += ["", f"Differences: {len(differences)} ({len(new)} not listed)."]
        (out / "clients.md").write_text("\n".join(lines) + "\n")
    if new or (stale and not args.reduced):
        for d in new:
            print(f"NEW difference: {d['test']}")
        for e in stale:
            print(f"listed but did not occur: {e['test']}")
        return 1
    print(f"clients: {len(differences)} differences, all listed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
