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
