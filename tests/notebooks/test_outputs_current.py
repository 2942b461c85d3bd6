"""Every notebook's committed outputs come from today's code: the fingerprint that `make notebooks-refresh` recorded
of the project files the notebook imported, the files it read (the taxi config and its schema) and its own code cells
(scripts/run_notebooks.py) is recomputed from the files and cells as they are now. Fast: no notebook is run."""
import importlib.util
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
REFRESH = "`make notebooks-refresh`"

_spec = importlib.util.spec_from_file_location("run_notebooks", REPO / "scripts" / "run_notebooks.py")
run_notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_notebooks)


def stale_outputs(path: Path, root: Path = REPO) -> str | None:
    """One sentence saying why the outputs of the notebook at `path` may come from other code; None if they do not."""
    name = path.relative_to(root).as_posix()
    notebook = nbformat.read(path, as_version=4)
    recorded = notebook.metadata.get("mlops", {})
    if not {"code_files", "cells_sha256", "code_fingerprint"} <= set(recorded):
        return f"{name} records no fingerprint of the code its outputs came from; run {REFRESH} to write one."
    files = recorded["code_files"]
    uncovered = sorted(set(run_notebooks.read_files(root)) - set(files))
    if uncovered:
        return (f"{name} records no fingerprint of {', '.join(uncovered)}, which its outputs depend on; run {REFRESH} "
                "to write one.")
    missing = sorted(file for file in files if not (root / file).is_file())
    changed = sorted(file for file in files if file not in missing
                     and run_notebooks.file_sha256(root / file) != files[file])
    cells_changed = run_notebooks.cells_sha256(notebook) != recorded["cells_sha256"]
    if (missing or changed or cells_changed
            or run_notebooks.code_fingerprint(files, recorded["cells_sha256"]) != recorded["code_fingerprint"]):
        what = ([f"{', '.join(changed)} changed"] if changed else []) + (
            [f"{', '.join(missing)} no longer {'exists' if len(missing) == 1 else 'exist'}"] if missing else []
        ) + (["its code cells changed"] if cells_changed else []
             ) or ["its recorded fingerprint does not match its recorded files"]
        return (f"{name} shows outputs of older code ({'; '.join(what)} since they were written); "
                f"run {REFRESH} to re-run it and save current outputs.")
    return None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_the_outputs_come_from_todays_code(path):
    message = stale_outputs(path)
    assert message is None, message


SMALL_CONFIG = {"pipeline/configs/taxi.yaml": "schema_path: taxi_schema.pbtxt\n",
                "pipeline/configs/taxi_schema.pbtxt": "feature { name: 'fare' type: FLOAT }\n"}


def notebook_fingerprinting(root: Path, code: dict[str, str]) -> Path:
    """A notebook under `root` whose metadata fingerprints `code` ({relative path: content}), a config and its
    schema, and its own cells, as they are now."""
    code = {**SMALL_CONFIG, **code}
    for relative, content in code.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(content)
    files = {relative: run_notebooks.file_sha256(root / relative) for relative in sorted(code)}
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Tiny"),
                                               nbformat.v4.new_code_cell("from taxi import load_taxi")])
    cells = run_notebooks.cells_sha256(notebook)
    notebook.metadata["mlops"] = {"code_files": files, "cells_sha256": cells,
                                  "code_fingerprint": run_notebooks.code_fingerprint(files, cells)}
    path = root / "notebooks" / "tiny.ipynb"
    nbformat.write(notebook, path)
    return path


def test_a_changed_file_is_named_with_the_command(tmp_path):
    path = notebook_fingerprinting(tmp_path, {"notebooks/taxi.py": "ROWS = 1\n", "components/model.py": "UNITS = 8\n"})
    assert stale_outputs(path, tmp_path) is None
    (tmp_path / "components" / "model.py").write_text("UNITS = 16\n")
    message = stale_outputs(path, tmp_path)
    assert message == ("notebooks/tiny.ipynb shows outputs of older code (components/model.py changed since they "
                       "were written); run `make notebooks-refresh` to re-run it and save current outputs.")


def test_a_file_that_no_longer_exists_is_named(tmp_path):
    path = notebook_fingerprinting(tmp_path, {"notebooks/taxi.py": "ROWS = 1\n", "components/old.py": "X = 1\n"})
    (tmp_path / "components" / "old.py").unlink()
    assert "(components/old.py no longer exists since they were written)" in stale_outputs(path, tmp_path)


def test_the_config_and_the_schema_it_names_are_covered(tmp_path):
    path = notebook_fingerprinting(tmp_path, {"notebooks/taxi.py": "ROWS = 1\n"})
    (tmp_path / "pipeline/configs/taxi_schema.pbtxt").write_text("feature { name: 'fare' type: INT }\n")
    assert "(pipeline/configs/taxi_schema.pbtxt changed since they were written)" in stale_outputs(path, tmp_path)
    (tmp_path / "pipeline/configs/taxi.yaml").write_text("schema_path: other_schema.pbtxt\n")
    (tmp_path / "pipeline/configs/other_schema.pbtxt").write_text("feature { name: 'fare' type: FLOAT }\n")
    assert stale_outputs(path, tmp_path) == (
        "notebooks/tiny.ipynb records no fingerprint of pipeline/configs/other_schema.pbtxt, which its outputs depend "
        "on; run `make notebooks-refresh` to write one.")


def test_an_edited_code_cell_fails_and_edited_prose_does_not(tmp_path):
    path = notebook_fingerprinting(tmp_path, {"notebooks/taxi.py": "ROWS = 1\n"})
    notebook = nbformat.read(path, as_version=4)
    notebook.cells[0].source = "# Tiny, explained better"
    nbformat.write(notebook, path)
    assert stale_outputs(path, tmp_path) is None
    notebook.cells[1].source = "from taxi import load_taxi as load"
    nbformat.write(notebook, path)
    assert stale_outputs(path, tmp_path) == (
        "notebooks/tiny.ipynb shows outputs of older code (its code cells changed since they were written); run "
        "`make notebooks-refresh` to re-run it and save current outputs.")


def test_a_notebook_without_a_fingerprint_fails(tmp_path):
    path = notebook_fingerprinting(tmp_path, {"notebooks/taxi.py": "ROWS = 1\n"})
    notebook = nbformat.read(path, as_version=4)
    del notebook.metadata["mlops"]
    nbformat.write(notebook, path)
    assert stale_outputs(path, tmp_path) == ("notebooks/tiny.ipynb records no fingerprint of the code its outputs "
                                             "came from; run `make notebooks-refresh` to write one.")


def test_the_fingerprint_is_the_same_for_the_same_code_and_another_for_other_code():
    files = {"b.py": "2" * 64, "a.py": "1" * 64}
    assert run_notebooks.code_fingerprint(files) == run_notebooks.code_fingerprint(dict(sorted(files.items())))
    assert run_notebooks.code_fingerprint(files, "c" * 64) != run_notebooks.code_fingerprint(files, "d" * 64)
    assert run_notebooks.code_fingerprint(files) != run_notebooks.code_fingerprint({**files, "a.py": "3" * 64})
    assert run_notebooks.code_fingerprint(files) != run_notebooks.code_fingerprint({"a.py": "1" * 64})


def test_only_the_repositorys_code_is_kept_and_another_checkouts_packages_are_refused(tmp_path):
    root = tmp_path / "repo"
    for relative in ["components/__init__.py", "components/model.py", "notebooks/taxi.py", ".venv/lib/six.py"]:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(f"# {relative}\n")
    notebook = root / "notebooks" / "tiny.ipynb"
    imported = {"components": root / "components/__init__.py", "components.model": root / "components/model.py",
                "taxi": root / "notebooks/taxi.py", "six": root / ".venv/lib/six.py", "json": "/usr/lib/json.py"}
    code = run_notebooks.project_code({name: str(file) for name, file in imported.items()}, notebook, root)
    assert list(code) == ["components/__init__.py", "components/model.py", "notebooks/taxi.py"]
    assert code["notebooks/taxi.py"] == run_notebooks.file_sha256(root / "notebooks/taxi.py")
    elsewhere = {"components.model": str(tmp_path / "other-checkout" / "components" / "model.py")}
    with pytest.raises(RuntimeError, match="imported this repository's packages from elsewhere"):
        run_notebooks.project_code(elsewhere, notebook, root)
