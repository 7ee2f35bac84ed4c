#!/usr/bin/env bash
# The documentation: the README within its size budget with every link reaching a page that exists
# (scripts/docs_check.py), then the MkDocs site built in strict mode (a broken link or anchor, or a
# page missing from the nav, fails). The configuration and command-line references are generated from
# the code while the site builds (scripts/docs_hooks.py). The site goes to site/ (ignored by git).
# Needs the venv with the docs extra (scripts/setup.sh --test).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${VIRTUAL_ENV:-}" ] || . .venv/bin/activate
python scripts/docs_check.py
command -v mkdocs >/dev/null || { echo "docs: mkdocs is not installed: pip install -e '.[docs]'" >&2; exit 1; }
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir site
echo "docs: README $(wc -c < README.md) bytes; site built in site/"
