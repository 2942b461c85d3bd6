"""The documentation site: built in strict mode (as `make docs` builds it), its reference pages generated from the code
with every configuration key, section, command and flag described, and the built site opened in headless Chromium
through a loopback HTTP server: the navigation, the search index, a rendered notebook and a chart."""
from __future__ import annotations

import dataclasses
import functools
import http.server
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from scripts import reference_docs
from tests.browser import render

REPO = Path(__file__).resolve().parents[2]
MKDOCS = REPO / ".venv-tools" / "bin" / "mkdocs"
NOTEBOOK = "notebooks/02_gradients_optimizers.html"


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The site as `make docs` builds it (the reference pages written from the code, then MkDocs --strict)."""
    if not MKDOCS.exists():
        pytest.fail(f"{MKDOCS} is missing: run `make setup` (it syncs requirements-tools.lock into .venv-tools).")
    written = subprocess.run([sys.executable, "scripts/reference_docs.py"], cwd=REPO, capture_output=True, text=True)
    assert written.returncode == 0, written.stderr
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(out)], cwd=REPO, capture_output=True,
                           text=True, timeout=900, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stderr[-6000:]}"
    return out


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on a free loopback port (Material's search runs in a worker, which file:// refuses)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def config_keys(root: type, prefix: str = "") -> list[str]:
    """Every key of the typed configuration, by walking the dataclasses (not the generator's own walk)."""
    import typing
    keys = []
    for field in dataclasses.fields(root):
        hint = typing.get_type_hints(root)[field.name]
        path = f"{prefix}{field.name}"
        args = typing.get_args(hint)
        if dataclasses.is_dataclass(hint):
            keys += config_keys(hint, path + ".")
        elif typing.get_origin(hint) is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
            keys.append(path)
            keys += config_keys(args[1], path + ".<name>.")
        else:
            keys.append(path)
    return keys


def test_every_configuration_key_and_command_line_flag_has_a_description():
    sections = reference_docs.config_sections()
    assert reference_docs.undescribed_config(sections) == []
    assert reference_docs.undescribed_cli(reference_docs.build_parser()) == []
    from settings.config import PipelineConfig
    assert sorted(k.path for s in sections for k in s.keys) == sorted(config_keys(PipelineConfig))


def test_a_key_a_section_or_a_flag_without_a_description_is_named(tmp_path, monkeypatch):
    (tmp_path / "planted_settings.py").write_text(
        "from dataclasses import dataclass, field\n\n\n"
        "@dataclass\nclass Inner:\n"
        "    # How many there are.\n    count: int = 1\n    ratio: float = 0.5\n\n\n"
        "@dataclass\nclass Outer:\n    \"\"\"The outer section.\"\"\"\n"
        "    name: str = 'x'  # the name\n    inner: Inner = field(default_factory=Inner)\n")
    spec = importlib.util.spec_from_file_location("planted_settings", tmp_path / "planted_settings.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "planted_settings", module)
    spec.loader.exec_module(module)
    sections = reference_docs.config_sections(module.Outer)
    keys = {k.path: k for s in sections for k in s.keys}
    assert keys["name"].description == "the name" and keys["inner.count"].description == "How many there are."
    assert keys["inner.count"].default == "`1`" and keys["inner.ratio"].type == "float"
    assert reference_docs.undescribed_config(sections) == [
        "the section inner (Inner: no docstring)", "inner.ratio (no comment above it in Inner)"]

    import argparse
    parser = argparse.ArgumentParser(prog="mlops")
    commands = parser.add_subparsers()
    described = commands.add_parser("described", help="has help")
    described.add_argument("--fine", help="has help")
    described.add_argument("--bare")
    commands.add_parser("silent")
    assert reference_docs.undescribed_cli(parser) == ["`mlops described` --bare (no help=)",
                                                      "the command `mlops silent` (no help= or description=)"]


def test_the_site_holds_every_section_and_the_generated_reference(site):
    nav = ["index.html", "getting-started.html", "tutorials/own-data.html", "tutorials/local-rollout.html",
           "tutorials/kubernetes.html", "tutorials/kubeflow.html", "tutorials/kubedl.html",
           "tutorials/monitoring.html", "concepts/pipeline.html", "concepts/model-repository.html",
           "concepts/rollout.html", "concepts/skew-and-drift.html", "concepts/beam.html", "architecture.html",
           "reference/configuration.html", "reference/cli.html", "reference/exit-codes.html",
           "reference/metrics.html", "reference/serving.html", "operations/rollouts.html", "operations/image.html",
           "benchmarks.html", "contributing.html", NOTEBOOK]
    assert [page for page in nav if not (site / page).exists()] == []
    configuration = (site / "reference/configuration.html").read_text()
    from settings.config import PipelineConfig
    absent = [key for key in config_keys(PipelineConfig)
              if f"<code>{key.replace('<', '&lt;').replace('>', '&gt;')}</code>" not in configuration]
    assert absent == []
    assert "<code>rollout.max_p99_ms</code></td>\n<td><code>float</code></td>\n<td><code>250.0</code></td>" in \
        configuration
    cli = (site / "reference/cli.html").read_text()
    for name, sub, _ in reference_docs._commands(reference_docs.build_parser(), "mlops"):
        assert f"<code>{name}</code>" in cli, name
        for action in reference_docs._flags(sub):
            assert all(option in cli for option in action.option_strings), (name, action.option_strings)
    codes = (site / "reference/exit-codes.html").read_text()
    for code, name in ((3, "DataValidationError"), (2, "ConfigError"), (1, "PipelineError")):
        assert f"<td>{code}</td>\n<td><code>{name}</code></td>" in codes, name
    assert "<code>mlops_monitor_threshold_crossed</code>" in (site / "reference/metrics.html").read_text()


def test_the_search_index_covers_the_pages_the_reference_and_the_notebooks(site):
    documents = json.loads((site / "search/search_index.json").read_text())["docs"]
    pages = {document["location"].split("#")[0] for document in documents}
    assert {"getting-started.html", "reference/configuration.html", "reference/cli.html", NOTEBOOK} <= pages
    assert any("rollout.skew_min_requests" in document["text"] for document in documents
               if document["location"].startswith("reference/configuration.html"))


def test_the_start_page_in_chromium_shows_the_navigation_and_the_search(served):
    page = render(f"{served}/index.html")
    assert page.console == []
    links = set(re.findall(r'class="md-nav__link[^"]*"[^>]*>\s*(?:<span class="md-ellipsis">\s*)?([^<]+?)\s*<',
                           page.dom))
    assert {"Getting started", "Tutorials", "Notebooks", "Concepts", "Reference", "Operations", "Benchmarks",
            "Configuration", "Command line", "Kubernetes on kind", "Gradients and optimizers"} <= links, links
    assert 'class="md-nav__link' in page.dom and 'data-md-component="search-query"' in page.dom
    assert 'href="reference/configuration.html"' in page.dom


def test_a_notebook_renders_with_its_outputs_and_the_benchmarks_with_their_charts(served):
    notebook = render(f"{served}/{NOTEBOOK}")
    assert notebook.console == []
    assert "jp-Notebook" in notebook.dom and "jp-OutputArea" in notebook.dom
    assert notebook.dom.count('src="data:image/png;base64,') >= 1, "the notebook's plots"
    benchmarks = render(f"{served}/benchmarks.html")
    assert benchmarks.console == []
    assert benchmarks.charts == {"stage-wall-seconds": 1, "data-stages-modes": 1}
