#!/usr/bin/env bash
# The habits that keep the house in order: layer contracts (import-linter), ruff, a type checker on
# duplex/ and tools/ (mypy.ini), no import cycles (tools too) between modules or between rooms, no
# wrong-way arrow between rooms, no file over 500 lines nor over 400 unless its docstring says
# why it is one file (a paragraph that begins "One file:"), and the docs (the README's size and links,
# the site built in strict mode: scripts/docs.sh).
# Run from scripts/test.sh before the suite; needs the venv from scripts/setup.sh --test.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
echo "== lint: layer contracts"
lint-imports --no-cache
echo "== lint: ruff"
ruff check duplex tools tests
echo "== lint: mypy (duplex, tools)"
mypy duplex tools/duplex_tools
echo "== lint: import cycles"
python scripts/import_cycles.py
echo "== lint: import graph between rooms (no cycle, no wrong-way arrow)"
python scripts/import_graph.py
echo "== lint: file sizes"
big=$(git ls-files '*.py' | xargs wc -l | awk '$2 != "total" && $1 > 500 {print "  " $2 " (" $1 " lines)"}')
if [ -n "$big" ]; then echo "files over 500 lines:"; echo "$big"; exit 1; fi
unsaid=$(git ls-files '*.py' | xargs wc -l | awk '$2 != "total" && $1 > 400 {print $2}' \
         | while read -r f; do head -n 40 "$f" | grep -q '^One file:' || echo "  $f"; done)
if [ -n "$unsaid" ]; then echo "files over 400 lines whose docstring does not say why (One file: ...):"; echo "$unsaid"; exit 1; fi
echo "== lint: docs (README budget and links, mkdocs build --strict)"
bash scripts/docs.sh
echo "== lint: ok"
