#!/usr/bin/env bash
# Step time of the working tree's functrain against an older commit's, in ONE run
# of benchmarks/run.py (interleaved call by call, same process, same machine).
#
#   benchmarks/before_after.sh REV [run.py arguments...]
#   e.g. benchmarks/before_after.sh 505ae16 --opts lamb,lars --reps 15
#
# The commit's functrain/ is exported to a temporary folder as the package
# `functrain_before` (its self-imports renamed), and run.py compares the libraries
# functrain, module:functrain_before and optax: the ratios of the first two are
# after/before.
set -euo pipefail
rev="$1"; shift
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
py="${PYTHON:-$root/.venv/bin/python}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
git -C "$root" archive "$rev" functrain | tar -x -C "$tmp"
mv "$tmp/functrain" "$tmp/functrain_before"
find "$tmp/functrain_before" -name '*.py' -exec sed -i -E 's/\bfunctrain\b/functrain_before/g' {} +
PYTHONPATH="$tmp${PYTHONPATH:+:$PYTHONPATH}" "$py" "$here/run.py" \
    --libs functrain,module:functrain_before,optax "$@"
