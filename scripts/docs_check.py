"""The README is the front door: it stays under its size budget, every link in it reaches a file of
the checkout (a docs page that is in the site's nav, with the heading an anchor names), and the tour
reaches each of its guides in one click. Run by scripts/docs.sh before the site is built."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[1]
README_BUDGET_BYTES = 25 * 1024
# the five-minute tour: talk from the browser, call from a phone, the openai SDK, your own LLM, metrics
TOUR = ["docs/guides/webrtc.md", "docs/guides/sip.md", "docs/guides/realtime-websocket.md",
        "docs/guides/engines.md", "docs/operating/metrics.md"]
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def headings(text: str) -> set[str]:
    """The anchors a page's headings get (MkDocs' toc slugs, which GitHub's match for plain headings)."""
    found, fenced = set(), False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := _HEADING.match(line)):
            found.add(slugify(re.sub(r"`", "", match.group(1)), "-"))
    return found


def nav_pages(nav: list) -> set[str]:
    pages: set[str] = set()
    for entry in nav:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            pages |= nav_pages(value) if isinstance(value, list) else {str(value)}
    return pages


def links(text: str) -> list[str]:
    kept, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            kept += _LINK.findall(line)
    return kept


def problems(readme: Path = ROOT / "README.md") -> list[str]:
    text = readme.read_text()
    found = []
    size = len(text.encode())
    if size > README_BUDGET_BYTES:
        found.append(f"README.md is {size} bytes, over its budget of {README_BUDGET_BYTES}: move detail to docs/")
    nav = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    targets = set()
    for link in links(text):
        if re.match(r"^[a-z]+:", link):  # http(s), mailto: outside the checkout
            continue
        path, _, anchor = link.partition("#")
        target = (readme.parent / path).resolve() if path else readme
        targets.add(target.relative_to(ROOT).as_posix() if target.is_relative_to(ROOT) else str(target))
        if not target.exists():
            found.append(f"README.md links to {link}: no such file")
            continue
        page = target.relative_to(ROOT / "docs").as_posix() if target.is_relative_to(ROOT / "docs") else None
        if page and page.endswith(".md") and page not in nav:
            found.append(f"README.md links to {link}: that page is not in mkdocs.yml's nav")
        if anchor and target.suffix == ".md" and anchor not in headings(target.read_text()):
            found.append(f"README.md links to {link}: {target.name} has no heading with that anchor")
    found += [f"README.md does not link the tour's page {page}" for page in TOUR if page not in targets]
    return found


if __name__ == "__main__":
    issues = problems()
    for issue in issues:
        print(f"docs: {issue}", file=sys.stderr)
    sys.exit(1 if issues else 0)
