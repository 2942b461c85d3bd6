"""Every shell block of the README and the documentation site says whether it runs here: `<!-- runnable -->` on the
line before the fence, and the test runs it, or `<!-- illustrative: why -->` (it needs a cluster, a registry, root, a
published model). A runnable block runs with bash -euo pipefail in a scratch folder that links every top-level entry
of the repository (so `.venv/bin/mlops` and `pipeline/configs/` are where the page says) but holds its own `outputs/`
and whatever the block writes."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Pages the site generates from the code (scripts/reference_docs.py) hold no shell blocks of their own.
GENERATED = {"reference/configuration.md", "reference/cli.md", "reference/exit-codes.md", "reference/metrics.md"}
FENCE = re.compile(r"^(\s*)```(sh|bash|console|shell)\s*$")
MARKER = re.compile(r"^\s*<!-- (runnable|illustrative: \S.*) -->\s*$")
# What a runnable block may write in its scratch folder, instead of linking the repository's own.
WRITTEN = {"outputs", "data", "my_project", "pipeline.yaml", "site"}


def pages() -> list[Path]:
    docs = REPO / "docs"
    found = [REPO / "README.md"]
    for page in sorted(docs.rglob("*.md")):
        relative = page.relative_to(docs).as_posix()
        if relative.split("/")[0] != "notebooks" and relative not in GENERATED:
            found.append(page)
    return found


def shell_blocks() -> list[tuple[str, str | None, str]]:
    """(where, marker, script) of every shell block: where is page:line, marker None when the block has none."""
    blocks = []
    for page in pages():
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines):
            opened = FENCE.match(line)
            if not opened:
                continue
            end = next(i for i in range(number + 1, len(lines)) if lines[i].strip() == "```")
            indent = len(opened.group(1))
            script = "\n".join(body[indent:] for body in lines[number + 1:end])
            marked = MARKER.match(lines[number - 1]) if number else None
            where = f"{page.relative_to(REPO)}:{number + 1}"
            blocks.append((where, marked.group(1) if marked else None, script))
    return blocks


RUNNABLE = [(where, script) for where, marker, script in shell_blocks() if marker == "runnable"]


def test_every_shell_block_is_marked_runnable_or_illustrative():
    blocks = shell_blocks()
    assert len(blocks) >= 20, "the pages' shell blocks were not found"
    assert [where for where, marker, _ in blocks if marker is None] == []
    assert len(RUNNABLE) >= 2


def test_a_block_without_a_marker_is_found(tmp_path, monkeypatch):
    page = tmp_path / "docs" / "tutorials" / "planted.md"
    page.parent.mkdir(parents=True)
    page.write_text("# Planted\n\n<!-- runnable -->\n```sh\ntrue\n```\n\n```bash\nfalse\n```\n\n"
                    "<!-- illustrative: needs a cluster -->\n```sh\nkubectl get pods\n```\n")
    (tmp_path / "README.md").write_text("```sh\nmake demo\n```\n")
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assert [(where, marker) for where, marker, _ in shell_blocks()] == [
        ("README.md:1", None), ("docs/tutorials/planted.md:4", "runnable"), ("docs/tutorials/planted.md:8", None),
        ("docs/tutorials/planted.md:13", "illustrative: needs a cluster")]


@pytest.mark.parametrize("where,script", RUNNABLE, ids=[where for where, _ in RUNNABLE])
def test_a_runnable_block_runs(where, script, tmp_path):
    for entry in REPO.iterdir():
        if entry.name not in WRITTEN:
            (tmp_path / entry.name).symlink_to(entry)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, (f"{where} exited with {done.returncode}:\n{script}\n--- stdout\n{done.stdout[-3000:]}"
                                  f"\n--- stderr\n{done.stderr[-3000:]}")
