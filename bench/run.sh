#!/usr/bin/env bash
# Build bench/.venv (jobspool from this checkout, editable, plus the peers from
# PyPI in bench/requirements.txt) once, then run the benchmark in it.
# Usage: bench/run.sh [--quick] [--only NAME] [...]   (see: bench/run.sh --help)
# PYTHON=/path/to/python3.11+ picks the interpreter the venv is built from.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
venv="$here/.venv"
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
  # The venv ignores itself, so it never shows up in git status.
  echo '*' > "$venv/.gitignore"
fi
stamp="$venv/.installed"
if [ ! -f "$stamp" ] || [ "$here/requirements.txt" -nt "$stamp" ] \
   || [ "$repo/pyproject.toml" -nt "$stamp" ]; then
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -e "$repo" -r "$here/requirements.txt"
  touch "$stamp"
fi
cd "$repo"
exec "$venv/bin/python" -m bench "$@"
