"""Generated reference pages of the documentation site, so they never drift from the code.

Run by MkDocs as a hook (``hooks:`` in mkdocs.yml): a page holding a marker line gets the marker
replaced at build time with tables made from the code itself:

- ``<!-- duplex:config-reference -->``: every field of the pydantic settings models (the pipeline
  YAML of duplex/config/, the session settings of duplex/session/, the server's and the phone
  doors' settings), with its type, default, bounds and the comment the code gives it; a settings
  model of those rooms that the reference does not reach fails the build;
- ``<!-- duplex:cli-reference -->``: ``duplex --help`` of every command, from the argparse parser.

``python scripts/docs_hooks.py config|cli`` prints a page's generated part.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import io
import os
import pkgutil
import re
import sys
import tokenize
import types
import typing
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

CONFIG_MARKER = "<!-- duplex:config-reference -->"
CLI_MARKER = "<!-- duplex:cli-reference -->"
_FIELD_LINE = re.compile(r"^    (\w+)\s*:")
_BOUNDS = ((annotated_types.Ge, ">="), (annotated_types.Gt, ">"), (annotated_types.Le, "<="),
           (annotated_types.Lt, "<"), (annotated_types.MinLen, "length >="), (annotated_types.MaxLen, "length <="))


def _sections() -> list[tuple[str, str, type[BaseModel]]]:
    """(heading, where it is set, model): imported here so that importing the hook costs nothing."""
    from duplex.config.pipeline import PipelineConfig
    from duplex.config.session import SessionConfig
    from duplex.edge.config import EdgeConfig
    from duplex.edge.sip.config import SipConfig
    from duplex.edge.twilio.config import TwilioLimits
    from duplex.models.engine.stages import EngineThinkerArgs
    from duplex.server.watch import WatchConfig

    return [
        ("Pipeline", "the pipeline YAML file (`--config`), or `duplex serve --KEY VALUE`", PipelineConfig),
        ("Session", "a pipeline's `session:` block; clients change a subset with `session.update`",
         SessionConfig),
        ("Server: HTTP, WebRTC, Realtime WebSocket", "`duplex serve` flags", EdgeConfig),
        ("Server: watching", "`duplex serve` flags", WatchConfig),
        ("Phone: SIP", "`duplex serve --sip ...` flags", SipConfig),
        ("Phone: Twilio Media Streams", "`duplex serve --twilio ...` flags", TwilioLimits),
        ("Engine thinker arguments", "the `engine.thinker` stage's `args:` (`--thinker.args.KEY VALUE`)",
         EngineThinkerArgs),
    ]


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """The comments the source gives each field: the block right above it, then the one after it."""
    try:
        source = inspect.getsource(model)
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    lines = source.splitlines()
    found: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        match = _FIELD_LINE.match(line)
        if not match:
            continue
        above, row = [], number - 1
        while row >= 1 and lines[row - 1].strip().startswith("#"):
            above.insert(0, comments.get(row, ""))
            row -= 1
        parts = [*above, comments.get(number, "")] if not line.strip().startswith("#") else []
        found[match.group(1)] = " ".join(part for part in parts if part)
    return found


def _type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(arg) for arg in typing.get_args(annotation))
    if origin is typing.Literal:
        return " \\| ".join(f"`{arg}`" for arg in typing.get_args(annotation))
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(arg) for arg in typing.get_args(annotation))}]"
    return getattr(annotation, "__name__", str(annotation)).replace("|", "\\|")


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        return "" if isinstance(value, BaseModel) else f"`{value!r}`"
    if field.default is PydanticUndefined:
        return "required"
    return f"`{field.default!r}`"


def _bounds(field: Any) -> str:
    return ", ".join(f"{sign} {getattr(meta, next(iter(meta.__dataclass_fields__)))}"
                     for meta in field.metadata for kind, sign in _BOUNDS if isinstance(meta, kind))


def _submodels(annotation: Any) -> list[type[BaseModel]]:
    """Settings models nested in a field's type (a model, a list of them, a union of them)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _submodels(arg)]


def model_rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str, str]]:
    """(key, type, default, bounds, comment) for every field, nested models flattened to dotted keys."""
    rows, comments = [], field_comments(model)
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        nested = _submodels(field.annotation)
        if len(nested) == 1:
            doc = comments.get(name) or inspect.cleandoc(nested[0].__doc__ or "").split("\n\n")[0]
            if not nested[0].__doc__ and not comments.get(name):
                doc = ""
            suffix = "[]." if typing.get_origin(field.annotation) is list else "."
            rows.append((key, _type_name(field.annotation), _default(field), "", _prose(doc)))
            rows.extend(model_rows(nested[0], key + suffix))
            continue
        if len(nested) > 1:  # a union told apart by a discriminator (the scheduler kinds)
            rows.append((key, " \\| ".join(m.__name__ for m in nested), _default(field), "",
                         " ".join(filter(None, (comments.get(name), "one of the kinds below, chosen by `kind`")))))
            for sub in nested:
                rows.extend(model_rows(sub, f"{key}({sub.model_fields['kind'].default})."))
            continue
        rows.append((key, _type_name(field.annotation), _default(field), _bounds(field),
                     _prose(comments.get(name, ""))))
    return rows


def _prose(text: str) -> str:
    """A docstring as one Markdown line (reST's double backticks as Markdown's single ones)."""
    return " ".join(text.replace("``", "`").split())


def _cell(text: str) -> str:
    return text.replace("\n", " ").replace("|", "\\|") if "\\|" not in text else text.replace("\n", " ")


# Settings models whose fields the sections show under other headings.
_SHOWN_ELSEWHERE = {"duplex.server.phone_edges.PhoneConfig": "its parts are the SIP and Twilio sections"}
_SETTINGS_PACKAGES = ("duplex.config", "duplex.session", "duplex.edge", "duplex.server")


def _settings_models() -> set[type[BaseModel]]:
    """Every public pydantic model of the rooms that hold settings (their modules imported first)."""
    for name in _SETTINGS_PACKAGES:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, name + "."):
            importlib.import_module(module.name)
    found, pending = set(), list(BaseModel.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__.startswith(_SETTINGS_PACKAGES) and not cls.__name__.startswith("_"):
            found.add(cls)
    return found


def _reached(model: type[BaseModel]) -> set[type[BaseModel]]:
    seen = {model}
    for field in model.model_fields.values():
        for sub in _submodels(field.annotation):
            seen |= _reached(sub)
    return seen


def render_config() -> str:
    """The reference; refuses to build when a settings model is missing from it (a new one must be
    added to ``_sections``, or to ``_SHOWN_ELSEWHERE`` with the reason)."""
    sections = _sections()
    shown = set().union(*(_reached(model) for _, _, model in sections))
    missing = sorted(f"{cls.__module__}.{cls.__name__}" for cls in _settings_models() - shown)
    missing = [name for name in missing if name not in _SHOWN_ELSEWHERE]
    if missing:
        raise RuntimeError(f"the configuration reference does not cover: {', '.join(missing)} "
                           "(add them to scripts/docs_hooks.py _sections)")
    out = []
    for heading, where, model in sections:
        out += [f"## {heading}", "", f"`{model.__module__}.{model.__name__}`; set in {where}.", ""]
        doc = inspect.cleandoc(model.__doc__ or "")
        if doc and not doc.startswith(model.__name__):
            out += [_prose(doc), ""]
        out += ["| key | type | default | bounds | what it does |", "|---|---|---|---|---|"]
        out += [f"| `{key}` | {_cell(kind)} | {_cell(default)} | {bounds} | {_cell(comment)} |"
                for key, kind, default, bounds, comment in model_rows(model)]
        out.append("")
    return "\n".join(out)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def render_cli() -> str:
    from duplex.cli import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal: the page must not depend on one
    out, pending = [], [("duplex", build_parser())]
    while pending:
        name, parser = pending.pop(0)
        out += [f"## `{name}`", "", "```text", parser.format_help().rstrip(), "```", ""]
        pending += [(f"{name} {sub}", child) for sub, child in _subparsers(parser).items()]
    return "\n".join(out)


GENERATORS = {CONFIG_MARKER: render_config, CLI_MARKER: render_cli}
PAGES = {"reference/configuration.md": CONFIG_MARKER, "reference/cli.md": CLI_MARKER}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs hook: fill in the markers of the page being built."""
    expected = PAGES.get(page.file.src_uri)
    if expected is not None and expected not in markdown:
        raise RuntimeError(f"docs/{page.file.src_uri} lost its {expected} line: its reference would be missing")
    for marker, render in GENERATORS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown


if __name__ == "__main__":
    print({"config": render_config, "cli": render_cli}[sys.argv[1]]())
