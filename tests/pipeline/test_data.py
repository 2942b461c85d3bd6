import pytest

from pipeline.data import DataError, check_csv_folder


def test_missing_folder(tmp_path):
    with pytest.raises(DataError, match=f"data folder {tmp_path / 'absent'} does not exist"):
        check_csv_folder(tmp_path / "absent")


def test_folder_without_csv(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DataError, match="holds no .csv files"):
        check_csv_folder(tmp_path)


def test_empty_csv(tmp_path):
    (tmp_path / "a.csv").write_text("")
    with pytest.raises(DataError, match="a.csv is empty"):
        check_csv_folder(tmp_path)


def test_header_only(tmp_path):
    (tmp_path / "a.csv").write_text("x,y\n")
    with pytest.raises(DataError, match="has a header but no data rows"):
        check_csv_folder(tmp_path)


def test_ragged_row_is_named(tmp_path):
    (tmp_path / "a.csv").write_text("x,y\n1,2\n3,4,5\n")
    with pytest.raises(DataError, match="line 3 has 3 fields but the header has 2"):
        check_csv_folder(tmp_path)


def test_binary_file(tmp_path):
    (tmp_path / "a.csv").write_bytes(b"x,y\n\xff\xfe\x00\x01,2\n")
    with pytest.raises(DataError, match="cannot be read as UTF-8 CSV"):
        check_csv_folder(tmp_path)


def test_headers_must_agree(tmp_path):
    (tmp_path / "a.csv").write_text("x,y\n1,2\n")
    (tmp_path / "b.csv").write_text("x,z\n1,2\n")
    with pytest.raises(DataError, match="different header"):
        check_csv_folder(tmp_path)


def test_good_folder(tmp_path):
    (tmp_path / "a.csv").write_text("x,y\n1,2\n")
    (tmp_path / "b.csv").write_text("x,y\n3,\n")
    assert [p.name for p in check_csv_folder(tmp_path)] == ["a.csv", "b.csv"]


def test_a_bundled_dataset_is_written_once_below_output_root(tmp_path):
    import csv

    from pipeline.data import resolve_data_dir

    folder = resolve_data_dir("sklearn:diabetes", str(tmp_path))
    assert folder == tmp_path / "data" / "diabetes"
    with open(folder / "data.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 442 and list(rows[0]) == ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6",
                                                  "progression"]
    # Whole-number columns are written as integers (ExampleGen reads them as INT), the others as floats.
    assert rows[0]["age"] == "59" and rows[0]["sex"] == "2" and rows[0]["progression"] == "151"
    assert rows[0]["bmi"] == "32.1"
    # Unchanged content is not rewritten, so ExampleGen's cache (sizes and times of the files) holds.
    written = (folder / "data.csv").stat().st_mtime_ns
    assert resolve_data_dir("sklearn:diabetes", str(tmp_path)) == folder
    assert (folder / "data.csv").stat().st_mtime_ns == written
    iris = resolve_data_dir("sklearn:iris", str(tmp_path)) / "data.csv"
    assert iris.read_text().splitlines()[:2] == ["sepal_length,sepal_width,petal_length,petal_width,species",
                                                  "5.1,3.5,1.4,0.2,setosa"]


def test_an_unknown_bundled_dataset_is_one_sentence(tmp_path):
    from pipeline.data import resolve_data_dir

    with pytest.raises(DataError, match=r"^data.path sklearn:wine names no bundled dataset; use one of sklearn:iris, "
                                        r"sklearn:diabetes, or a folder of CSV files.$"):
        resolve_data_dir("sklearn:wine", str(tmp_path))
    assert not (tmp_path / "data").exists()
