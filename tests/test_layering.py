"""The layering contract (docs/architecture.md, "The layering contract"): each package imports only packages below it,
and no modules import each other in a circle. Read from the code's own import statements, lazy ones inside functions
included, so neither can creep back in unnoticed."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Top to bottom: a package may import the ones after it, never one before it.
LAYERS = ("pipeline.cli", "rollout", "monitoring", "pipeline", "components", "serving", "reports", "settings")
PACKAGES = {layer.split(".")[0] for layer in LAYERS}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """The index in LAYERS of the most specific layer holding `module`."""
    return min(index for index, layer in enumerate(LAYERS) if module == layer or module.startswith(f"{layer}."))


def project_imports(path: Path, root: Path) -> list[tuple[str, int]]:
    """(imported project module, line) for every import statement of the file, wherever it stands in the file."""
    here = module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from a import b` imports the module a.b when there is one, else a name of a.
            names = sorted({f"{base}.{alias.name}" if module_file(f"{base}.{alias.name}", root) else base
                            for alias in node.names})
        else:
            continue
        found += [(name, node.lineno) for name in names if name.split(".")[0] in PACKAGES]
    return found


def module_file(module: str, root: Path) -> Path | None:
    path = root.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def import_graph(root: Path) -> dict[str, list[tuple[str, int]]]:
    """{module: [(project module it imports, line)]} for every module of the layered packages under `root`."""
    graph = {}
    for package in sorted(PACKAGES):
        for path in sorted((root / package).rglob("*.py")):
            graph[module_name(path, root)] = [(name, line) for name, line in project_imports(path, root)
                                              if module_file(name, root)]
    return graph


def upward_imports(root: Path) -> list[str]:
    """'file:line imports module (layer above)' for each import from a lower layer into a higher one."""
    return [f"{module_file(module, root).relative_to(root)}:{line} imports {imported} "
            f"({LAYERS[layer_of(imported)]} is above {LAYERS[layer_of(module)]})"
            for module, imports in import_graph(root).items() for imported, line in imports
            if layer_of(imported) < layer_of(module)]


def import_circles(root: Path) -> list[list[str]]:
    """Each set of modules that import each other in a circle (a strongly connected component of two or more, or a
    module importing itself), found with Tarjan's algorithm."""
    graph = {module: sorted({name for name, _ in imports})
             for module, imports in import_graph(root).items()}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.get(module, []):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1 or module in graph.get(module, []):
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(circles)


def test_no_package_imports_one_above_it():
    upward = upward_imports(REPO)
    assert not upward, "imports against the layering (move the shared code down instead):\n" + "\n".join(upward)


def test_no_modules_import_each_other_in_a_circle():
    circles = import_circles(REPO)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(circle) for circle in circles)


def test_every_package_has_a_layer():
    packages = {path.parent.name for path in REPO.glob("*/__init__.py")} - {"tests", "benchmarks"}
    assert packages == PACKAGES


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    for package in PACKAGES:
        (root / package).mkdir(exist_ok=True)
        (root / package / "__init__.py").touch()
    return root


def test_an_upward_import_is_named_with_its_file_and_line(tmp_path):
    root = write_tree(tmp_path, {
        "settings/files.py": "import json\n\n\ndef later():\n    from pipeline import runner\n",
        "pipeline/runner.py": "from settings import files\nfrom components import model\n",
        "components/model.py": "from settings.files import NAME\n",
    })
    assert upward_imports(root) == ["settings/files.py:5 imports pipeline.runner (pipeline is above settings)"]
    assert import_circles(root) == [["components.model", "pipeline.runner", "settings.files"]]


def test_relative_imports_and_the_command_line_layer(tmp_path):
    root = write_tree(tmp_path, {
        "pipeline/cli.py": "from rollout import controller\n",
        "pipeline/local/__init__.py": "",
        "pipeline/local/runner.py": "from ..cli import main\nfrom . import progress\n",
        "pipeline/local/progress.py": "",
        "rollout/controller.py": "from pipeline.local import progress\n",
    })
    assert upward_imports(root) == [
        "pipeline/local/runner.py:1 imports pipeline.cli (pipeline.cli is above pipeline)"]
    assert import_circles(root) == []
