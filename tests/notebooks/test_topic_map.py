"""notebooks/README.md maps every TensorFlow topic, once, to a notebook section or to project code and its test."""
import re
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
TOPICS = 51
ROW = re.compile(r"^\| (\d+) \| ([^|]+) \| (.+) \|$")
SECTION = re.compile(r"^`(\d\d_\w+\.ipynb)` § (.+)$")
REFERENCE = re.compile(r"`([\w./-]+\.\w+)(?:::(\w+))?`")


def topic_rows() -> dict[int, str]:
    rows: dict[int, list[str]] = {}
    for line in (NOTEBOOKS / "README.md").read_text().splitlines():
        match = ROW.match(line)
        if match:
            rows.setdefault(int(match.group(1)), []).append(match.group(3).strip())
    duplicates = {number: places for number, places in rows.items() if len(places) > 1}
    assert not duplicates, f"topics listed more than once: {sorted(duplicates)}"
    return {number: places[0] for number, places in rows.items()}


def headings(notebook: Path) -> list[str]:
    cells = nbformat.read(notebook, as_version=4).cells
    return [line[3:].strip() for cell in cells if cell.cell_type == "markdown"
            for line in cell.source.splitlines() if line.startswith("## ")]


def test_every_topic_appears_exactly_once():
    assert sorted(topic_rows()) == list(range(1, TOPICS + 1))


@pytest.mark.parametrize("number", range(1, TOPICS + 1))
def test_each_topic_points_at_something_that_exists(number):
    place = topic_rows()[number]
    section = SECTION.match(place)
    if section:
        notebook, heading = NOTEBOOKS / section.group(1), section.group(2)
        assert notebook.exists(), f"topic {number}: {notebook.name} does not exist"
        assert heading in headings(notebook), f"topic {number}: no section '{heading}' in {notebook.name}"
        assert heading.startswith(f"{number}. "), f"topic {number}: the section's heading must start with its number"
        return
    references = REFERENCE.findall(place)
    tests = [(path, test) for path, test in references if test]
    assert references and tests, f"topic {number}: name a notebook section, or project files and a test"
    for path, test in references:
        assert (REPO / path).exists(), f"topic {number}: {path} does not exist"
        if test:
            assert re.search(rf"^def {test}\(", (REPO / path).read_text(), re.M), f"topic {number}: no {test} in {path}"


def test_every_notebook_teaches_a_topic_of_the_map():
    mapped = {SECTION.match(place).group(1) for place in topic_rows().values() if SECTION.match(place)}
    assert mapped == {path.name for path in NOTEBOOKS.glob("*.ipynb")}


def test_every_numbered_section_is_in_the_map():
    rows = topic_rows()
    for notebook in NOTEBOOKS.glob("*.ipynb"):
        for heading in headings(notebook):
            number = re.match(r"(\d+)\. ", heading)
            if number:
                assert rows[int(number.group(1))] == f"`{notebook.name}` § {heading}", heading
