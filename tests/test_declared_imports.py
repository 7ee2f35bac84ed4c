"""Every third-party module that ``duplex/`` imports comes from a requirement that pyproject.toml
declares directly, in ``[project.dependencies]`` or the ``local`` extra (what scripts/serve.sh
installs). Otherwise the test venv, which also has the test extra and the tools, hides the gap
and the serve command crashes on a fresh machine (``httpx`` once came only with the test extra).

The walk is static (ast): top-level imports, lazy ones inside functions, and
``import_module("literal")``. A name given to ``import_module`` by a variable is not seen; the
serve-path tests (tests/test_serve_fresh.py, tests/test_wheel_serve.py) run those for real."""

from __future__ import annotations

import ast
import importlib.metadata
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
SERVE_EXTRAS = ("local",)
# Imported on purpose without being a requirement; each import is guarded where it is made.
OPTIONAL = {
    "duplex_tools": "the separate tools package (tools/): `duplex bench` and `duplex scenario` say how to install it",
}


def _imported_in(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and _callee(node.func) == "import_module"):
            names.add(node.args[0].value)
    return {name.split(".")[0] for name in names}


def _callee(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def third_party_imports(package: Path) -> dict[str, list[str]]:
    """Top-level module name -> the files that import it (standard library and duplex left out)."""
    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        for name in _imported_in(path.read_text()):
            if name not in sys.stdlib_module_names and name != package.name:
                found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def declared(pyproject: Path, extras: tuple[str, ...]) -> set[str]:
    """Canonical names of the base requirements and those of ``extras``."""
    project = tomllib.loads(pyproject.read_text())["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return {canonicalize_name(Requirement(line).name) for line in lines}


def undeclared(imports: dict[str, list[str]], allowed: set[str]) -> list[str]:
    """One line per imported module no allowed requirement provides (or that is not installed here)."""
    providers = importlib.metadata.packages_distributions()
    problems = []
    for module, files in sorted(imports.items()):
        if module in OPTIONAL:
            continue
        dists = {canonicalize_name(dist) for dist in providers.get(module, [])}
        if not dists:
            problems.append(f"{module} (imported by {', '.join(files)}): no installed distribution provides it")
        elif not dists & allowed:
            problems.append(f"{module} (imported by {', '.join(files)}): provided by {', '.join(sorted(dists))}, "
                            f"which is neither a dependency nor in the extras {list(SERVE_EXTRAS)}")
    return problems


def test_every_import_of_the_serve_path_is_a_declared_requirement():
    imports = third_party_imports(ROOT / "duplex")
    assert "numpy" in imports and "zmq" in imports, "the walk found nothing: it looks in the wrong place"
    problems = undeclared(imports, declared(ROOT / "pyproject.toml", SERVE_EXTRAS))
    assert problems == [], "declare these in pyproject.toml:\n" + "\n".join(problems)


def test_the_check_sees_lazy_and_dynamic_imports_and_names_the_missing_requirement():
    source = ("import numpy\n"
              "def later():\n    import httpx\n    from importlib import import_module\n"
              "    return import_module('yaml.constructor')\n")
    assert _imported_in(source) == {"numpy", "httpx", "importlib", "yaml"}
    problems = undeclared({"numpy": ["a.py"], "httpx": ["b.py"], "yaml": ["c.py"]}, {"numpy", "pyyaml"})
    assert len(problems) == 1 and problems[0].startswith("httpx (imported by b.py): provided by httpx")
