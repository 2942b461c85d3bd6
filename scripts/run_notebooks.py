"""Executes notebooks from a clean kernel in the project's environment; with --save, writes their outputs back.

    .venv/bin/python scripts/run_notebooks.py --save            # every notebooks/*.ipynb (make notebooks-refresh)
    .venv/bin/python scripts/run_notebooks.py notebooks/03_keras_model_apis.ipynb

Stops at the first failing cell of a notebook (an `assert` whose claim no longer holds) and exits non-zero.

Each notebook's metadata gets, under "mlops", the project files its kernel had imported when the last cell ended
(`sys.modules`, files of this repository outside .venv) and the files the notebooks read (the taxi job's config and
the schema it names) with their sha256, the sha256 of the notebook's own code cells, and one fingerprint over all of
them: tests/notebooks/test_outputs_current.py fails when today's files or cells give another fingerprint, so outputs
written by older code, another config or a cell edited since cannot pass unnoticed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import nbformat
import yaml
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
CELL_TIMEOUT_S = 600
# Run in the kernel after the notebook's last cell: every imported module with a file, as one line
# "<marker> {name: file}" (the marker keeps apart whatever a thread the notebook left running prints meanwhile).
IMPORTED_FILES_MARKER = "mlops-imported-files:"
IMPORTED_FILES_SNIPPET = (
    f"print({IMPORTED_FILES_MARKER!r}, __import__('json').dumps({{name: module.__file__ for name, module in"
    " list(__import__('sys').modules.items()) if isinstance(getattr(module, '__file__', None), str)}))")
NOT_PROJECT_CODE = {".venv", ".venv-tools"}  # top-level folders of the repository whose files are not its code
# What the notebooks read rather than import (taxi.py loads it): its outputs depend on it as on the code.
CONFIG = "pipeline/configs/taxi.yaml"


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def code_fingerprint(code_files: dict[str, str], cells: str = "") -> str:
    """One sha256 over the files' repository-relative paths and contents' sha256, in path order, and the sha256 of
    the notebook's code cells: no time, no machine, so the same code gives the same fingerprint wherever and whenever
    it is computed."""
    digest = hashlib.sha256()
    for relative in sorted(code_files):
        digest.update(f"{relative}\0{code_files[relative]}\n".encode())
    if cells:
        digest.update(f"cells\0{cells}\n".encode())
    return digest.hexdigest()


def read_files(root: Path = REPO) -> dict[str, str]:
    """{repository-relative path: sha256} of the files the notebooks read: the taxi job's config and the schema it
    names (beside it)."""
    config = root / CONFIG
    schema = yaml.safe_load(config.read_text()).get("schema_path")
    files = [config] + ([config.parent / schema] if schema else [])
    return {path.relative_to(root).as_posix(): file_sha256(path) for path in files}


def cells_sha256(notebook: nbformat.NotebookNode) -> str:
    """One sha256 over the sources of the notebook's code cells, in order: a cell edited after the notebook ran (and
    so not what made its outputs) changes it; the prose of markdown cells does not."""
    digest = hashlib.sha256()
    for cell in notebook.cells:
        if cell.cell_type == "code":
            digest.update(cell.source.encode() + b"\0")
    return digest.hexdigest()


def project_code(imported: dict[str, str], notebook: Path, root: Path = REPO) -> dict[str, str]:
    """{repository-relative path: sha256} of the imported files that are this repository's code.

    A module of one of the repository's own packages (components, pipeline, ...) imported from somewhere else (an
    editable install of another checkout, say) is an error: the notebook would have run, and be fingerprinted as,
    code that is not this checkout's.
    """
    root = root.resolve()
    packages = {path.parent.name for path in root.glob("*/__init__.py")} - {"tests"}  # site-packages has a `tests`
    code, foreign = {}, []
    for name, file in sorted(imported.items()):
        path = Path(file).resolve()
        try:
            relative = path.relative_to(root)
        except ValueError:
            if name.split(".")[0] in packages:
                foreign.append(f"{name} from {path}")
            continue
        if relative.parts[0] in NOT_PROJECT_CODE or path == notebook.resolve() or not path.is_file():
            continue
        code[relative.as_posix()] = file_sha256(path)
    if foreign:
        raise RuntimeError(f"{notebook.name}'s kernel imported this repository's packages from elsewhere "
                           f"({', '.join(foreign[:3])}); run it with PYTHONPATH={root}.")
    return dict(sorted(code.items()))


def record_code(notebook: nbformat.NotebookNode, imported: dict[str, str], path: Path) -> None:
    code_files = dict(sorted({**project_code(imported, path), **read_files()}.items()))
    cells = cells_sha256(notebook)
    notebook.metadata["mlops"] = {"code_files": code_files, "cells_sha256": cells,
                                  "code_fingerprint": code_fingerprint(code_files, cells)}


def execute(path: Path, cell_timeout_s: int = CELL_TIMEOUT_S) -> tuple[nbformat.NotebookNode, float]:
    """Runs every cell of the notebook at `path` in a fresh kernel of this interpreter, in the notebook's folder.

    The kernel is this Python (the .venv), never a `python3` kernel spec found elsewhere on the machine. It is shut
    down when the notebook ends, passed or failed: nbclient leaves a kernel it was handed (`km=`) running unless
    told `cleanup_kc=True`, and a suite of notebooks would otherwise keep every kernel's memory until it exits.
    After the last cell, one more cell (removed again) asks the kernel which files it imported, and the project's
    among them are recorded in `notebook.metadata["mlops"]` (see `record_code`).
    """
    notebook = nbformat.read(path, as_version=4)
    probe = nbformat.v4.new_code_cell(IMPORTED_FILES_SNIPPET)
    notebook.cells.append(probe)
    manager = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    client = NotebookClient(notebook, km=manager, timeout=cell_timeout_s, record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    started = time.perf_counter()
    try:
        client.execute(cleanup_kc=True)
    finally:
        if manager.has_kernel:  # the kernel started but nbclient's own clean-up did not run or did not finish
            manager.shutdown_kernel(now=True)
        notebook.cells = [cell for cell in notebook.cells if cell is not probe]
    seconds = time.perf_counter() - started
    printed = "".join(output.text for output in probe.outputs
                      if output.output_type == "stream" and output.name == "stdout")
    [imported] = [line.removeprefix(IMPORTED_FILES_MARKER) for line in printed.splitlines()
                  if line.startswith(IMPORTED_FILES_MARKER)]
    record_code(notebook, json.loads(imported), path)
    return notebook, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/*.ipynb")
    parser.add_argument("--save", action="store_true", help="write the outputs into the notebook files")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(NOTEBOOKS.glob("*.ipynb"))
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}; pass .ipynb files, or nothing for all of notebooks/.")
    total = 0.0
    for path in paths:
        print(f"{path.name} ...", end=" ", flush=True)
        try:
            notebook, seconds = execute(path)
        except CellExecutionError as error:
            print(f"FAILED\n{error}")
            return 1
        total += seconds
        print(f"{seconds:.1f}s")
        if args.save:
            nbformat.write(notebook, path)
    print(f"{len(paths)} notebook(s) in {total:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
