"""Writes the site's reference pages from the code: every configuration key from the typed settings (settings/config.py:
its type, default and the comment above it), every `mlops` command and flag from the argument parsers, the exit codes
of the errors a user can cause, and the metrics the servers and `mlops monitor` export. `make docs` runs it with
.venv's python before MkDocs builds; it fails, naming them, when a key, a section, a command or a flag has no
description."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Pages this script writes under docs/ (ignored by git: they are built from the code each time).
PAGES = ("reference/configuration.md", "reference/cli.md", "reference/exit-codes.md", "reference/metrics.md")
# Folders scanned for the errors a user can cause (classes with an `exit_code`).
CODE_FOLDERS = ("settings", "pipeline", "components", "serving", "rollout", "monitoring")


class Undescribed(Exception):
    """Keys, sections, commands or flags without a description: the message lists each."""


@dataclasses.dataclass
class Key:
    path: str
    type: str
    default: str
    description: str


@dataclasses.dataclass
class Section:
    path: str
    cls: type
    description: str
    keys: list[Key]


def _field_comments(cls: type) -> tuple[str, dict[str, str], dict[str, str]]:
    """The class's own docstring (not the signature @dataclass puts in __doc__ when it has none), each field's comment
    (the comment lines right above it, or one at the end of its line) and its annotation as written, from the
    class's source."""
    lines, _ = inspect.getsourcelines(cls)
    source = textwrap.dedent("".join(lines))
    tree = ast.parse(source).body[0]
    source_lines = source.splitlines()
    comments, annotations = {}, {}
    for node in tree.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        annotations[name] = ast.unparse(node.annotation)
        above = []
        row = node.lineno - 2
        while row >= 0 and source_lines[row].strip().startswith("#"):
            above.insert(0, source_lines[row].strip().lstrip("#").strip())
            row -= 1
        inline = source_lines[node.lineno - 1].partition("  # ")[2].strip()
        comments[name] = " ".join(above + ([inline] if inline else []))
    return " ".join((ast.get_docstring(tree) or "").split()), comments, annotations


def _default(value: dataclasses.Field) -> Any:
    if value.default is not dataclasses.MISSING:
        return value.default
    if value.default_factory is not dataclasses.MISSING:
        return value.default_factory()
    return None


def _yaml(value: Any) -> str:
    if value == "":
        return '`""`'
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return "`" + text.removesuffix("\n...").removesuffix("...").strip() + "`"


def _dataclass_of(annotation: Any) -> type | None:
    """The settings dataclass a field holds, directly or as the values of a dict (monitoring.features.<name>)."""
    if dataclasses.is_dataclass(annotation):
        return annotation
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
        return args[1]
    return None


def config_sections(root: type | None = None, path: str = "") -> list[Section]:
    """Every section of the configuration, depth first, with each of its keys."""
    from settings.config import PipelineConfig
    root = root or PipelineConfig
    docstring, comments, annotations = _field_comments(root)
    hints = typing.get_type_hints(root)
    section = Section(path, root, docstring, [])
    nested = []
    for value in dataclasses.fields(root):
        key = f"{path}.{value.name}" if path else value.name
        held = _dataclass_of(hints[value.name])
        if held is not None and dataclasses.is_dataclass(hints[value.name]):
            nested.append((held, key))
            continue
        if held is not None:  # a dict of sections, by name
            nested.append((held, f"{key}.<name>"))
        section.keys.append(Key(key, annotations[value.name], _yaml(_default(value)), comments[value.name]))
    found = [section]
    for held, key in nested:
        found += config_sections(held, key)
    return found


def undescribed_config(sections: list[Section]) -> list[str]:
    missing = [f"the section {s.path or '(top level)'} ({s.cls.__name__}: no docstring)"
               for s in sections if not s.description]
    return missing + [f"{k.path} (no comment above it in {s.cls.__name__})"
                      for s in sections for k in s.keys if not k.description]


def _prose(text: str) -> str:
    """Text from a comment or a help string as Markdown: `<name>` placeholders outside code spans are escaped, so the
    page shows them instead of swallowing them as HTML tags."""
    pieces = text.split("`")
    return "`".join(p.replace("<", "&lt;").replace(">", "&gt;") if i % 2 == 0 else p for i, p in enumerate(pieces))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def configuration_page(sections: list[Section]) -> str:
    out = ["# Configuration", "",
           "Every key of the one typed configuration (`settings/config.py`), generated from its dataclasses: the "
           "type and the default as the code declares them, and the description from the comment above each field. "
           "A config file (`pipeline/configs/taxi.yaml`, or the one `mlops init` writes) sets any of them, and "
           "`--set key.sub=value` overrides one for a single command (the value is YAML: "
           "`--set training.hidden_units=[32,16]`). An unknown key or a wrong type stops with a message that names "
           "the key and lists the valid ones.", ""]
    for section in sections:
        title = section.path or "top level"
        out += [f"## `{title}`" if section.path else "## Top level", "", _prose(section.description), ""]
        if not section.keys:
            continue
        out += ["| key | type | default | description |", "|---|---|---|---|"]
        out += [f"| `{k.path}` | `{_cell(k.type)}` | {_cell(k.default)} | {_cell(_prose(k.description))} |"
                for k in section.keys]
        out.append("")
    return "\n".join(out)


def _commands(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, argparse.ArgumentParser, str]]:
    """(name, parser, help) of every command below `parser`, depth first."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                found.append((f"{prefix} {name}", sub, helps.get(name) or ""))
                found += _commands(sub, f"{prefix} {name}")
    return found


def _flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def undescribed_cli(parser: argparse.ArgumentParser) -> list[str]:
    missing = []
    for name, sub, help_text in _commands(parser, "mlops"):
        if not (help_text or sub.description):
            missing.append(f"the command `{name}` (no help= or description=)")
        missing += [f"`{name}` {'/'.join(a.option_strings) or a.dest} (no help=)"
                    for a in _flags(sub) if not a.help]
    return missing


def _flag_name(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar or action.dest
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return names
    return f"{names} {action.metavar or action.dest.upper()}"


def cli_page(parser: argparse.ArgumentParser) -> str:
    out = ["# Command line", "",
           "Every `mlops` command and flag, generated from the argument parsers (`pipeline/cli.py` and the "
           "`register` function of each package's `cli.py`). `mlops <command> --help` prints the same.", ""]
    for name, sub, help_text in _commands(parser, "mlops"):
        level = "#" * min(2 + name.count(" ") - 1, 4)
        out += [f"{level} `{name}`", "", _cell(_prose(sub.description or help_text)), ""]
        sub.prog = name
        out += ["```", " ".join(sub.format_usage().removeprefix("usage: ").split()), "```", ""]
        flags = _flags(sub)
        if flags:
            out += ["| argument | default | description |", "|---|---|---|"]
            for action in flags:
                default = "" if action.default in (None, False, [], argparse.SUPPRESS) else _yaml(action.default)
                choices = f" (one of {', '.join(map(str, action.choices))})" if action.choices else ""
                required = " (required)" if action.required and action.option_strings else ""
                out.append(f"| `{_cell(_flag_name(action))}` | {_cell(default)} | "
                           f"{_cell(_prose((action.help or '') % {'default': action.default}))}{choices}{required} |")
            out.append("")
        if sub.epilog:
            out += [_cell(_prose(sub.epilog)), ""]
    return "\n".join(out)


def user_errors() -> list[tuple[str, str, int, str]]:
    """(module path, class, exit code, docstring) of every class in the code that sets `exit_code`."""
    found = []
    for folder in CODE_FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef):
                    continue
                for item in node.body:
                    if (isinstance(item, ast.Assign) and [getattr(t, "id", None) for t in item.targets] == ["exit_code"]
                            and isinstance(item.value, ast.Constant)):
                        doc = " ".join((ast.get_docstring(node) or "").split())
                        found.append((str(path.relative_to(REPO)), node.name, item.value.value, doc))
    return found


def exit_codes_page(errors: list[tuple[str, str, int, str]]) -> str:
    out = ["# Exit codes", "",
           "Every `mlops` command exits 0 when it did what was asked. An error a user can cause is caught at the "
           "edge (`settings/arguments.py`, `run_command`): its message, one sentence that says what to do, goes to "
           "stderr, and the command exits with the error's code. The errors, generated from the code (each class "
           "that sets `exit_code`):", "",
           "| exit code | error | where | what it means |", "|---|---|---|---|"]
    out += [f"| {code} | `{name}` | `{path}` | {_cell(_prose(doc))} |"
            for path, name, code, doc in sorted(errors, key=lambda e: (e[2], e[0], e[1]))]
    out += ["", "Commands whose exit code also reports a verdict: `mlops run` 3 when the data-validation gate found "
            "anomalies (`DataValidationError` above); `mlops monitor` 3 when a threshold was crossed and 4 when the "
            "retraining run failed (its help, on [the command line page](cli.md)); `mlops rollout` 3 when the "
            "rollout was rolled back, 4 when it paused, 143 when SIGTERM stopped it "
            "([what to do about each](../operations/rollouts.md)).", ""]
    return "\n".join(out)


def metrics_page() -> str:
    from monitoring import prometheus as monitor_metrics
    from rollout import metrics as rollout_metrics
    from serving.server import monitoring as serving_metrics
    out = ["# Metrics", "",
           "What the project exports to Prometheus, generated from the code that writes it.", "",
           "## The servers", "",
           "`mlops serve` and the `mlops log-proxy` sidecar serve these at `/monitoring/prometheus/metrics` "
           "(`serving/server/monitoring.py`):", "",
           _prose(inspect.getdoc(serving_metrics) or ""), "",
           "## What the rollout controller reads", "", "`rollout/metrics.py`:", "",
           _prose(inspect.getdoc(rollout_metrics) or ""), "",
           "## `mlops monitor`'s gauges", "",
           "Written to `metrics.prom` beside each monitor record, to `<monitoring.output_dir>/<model>.prom` for "
           "node-exporter's textfile collector, and PUT to a Pushgateway when one is set "
           "(`monitoring/prometheus.py`):", "",
           "| gauge | what |", "|---|---|"]
    out += [f"| `{monitor_metrics.PREFIX}_{name}` | {_cell(_prose(text))} |"
            for name, text in monitor_metrics.GAUGES.items()]
    return "\n".join(out) + "\n"


def build_parser() -> argparse.ArgumentParser:
    from pipeline.cli import build_parser as mlops_parser
    return mlops_parser()


def write(docs: Path) -> list[Path]:
    """Writes the reference pages under `docs`; raises Undescribed naming every key or flag without a description."""
    sections = config_sections()
    parser = build_parser()
    missing = undescribed_config(sections) + undescribed_cli(parser)
    if missing:
        raise Undescribed("these have no description; add one (a comment above the field in settings/config.py, "
                          "help= for a flag, a docstring for a section):\n  " + "\n  ".join(missing))
    pages = dict(zip(PAGES, (configuration_page(sections), cli_page(parser), exit_codes_page(user_errors()),
                             metrics_page()), strict=True))
    written = []
    for name, text in pages.items():
        target = docs / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=Path, default=REPO / "docs", help="the docs folder to write into")
    args = parser.parse_args(argv)
    try:
        written = write(args.docs)
    except Undescribed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {len(written)} reference pages under {args.docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
