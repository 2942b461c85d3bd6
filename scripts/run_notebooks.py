"""Executes notebooks from a clean kernel in the project's environment; with --save, writes their outputs back.

    .venv/bin/python scripts/run_notebooks.py --save            # every notebooks/*.ipynb (make notebooks-refresh)
    .venv/bin/python scripts/run_notebooks.py notebooks/03_keras_model_apis.ipynb

Stops at the first failing cell of a notebook (an `assert` whose claim no longer holds) and exits non-zero.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CELL_TIMEOUT_S = 600


def execute(path: Path, cell_timeout_s: int = CELL_TIMEOUT_S) -> tuple[nbformat.NotebookNode, float]:
    """Runs every cell of the notebook at `path` in a fresh kernel of this interpreter, in the notebook's folder.

    The kernel is this Python (the .venv), never a `python3` kernel spec found elsewhere on the machine. It is shut
    down when the notebook ends, passed or failed: nbclient leaves a kernel it was handed (`km=`) running unless
    told `cleanup_kc=True`, and a suite of notebooks would otherwise keep every kernel's memory until it exits.
    """
    notebook = nbformat.read(path, as_version=4)
    manager = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    client = NotebookClient(notebook, km=manager, timeout=cell_timeout_s, record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    started = time.perf_counter()
    try:
        client.execute(cleanup_kc=True)
    finally:
        if manager.has_kernel:  # the kernel started but nbclient's own clean-up did not run or did not finish
            manager.shutdown_kernel(now=True)
    return notebook, time.perf_counter() - started


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
