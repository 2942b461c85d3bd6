"""CSV headers as R, pandas and spreadsheets write them, read alike by `mlops init`, ExampleGen and `mlops predict`:
quoted names, a byte-order mark, blanks around names, a leading unnamed row index; a header that cannot name the
columns (a name twice, an empty name) refused in one sentence."""
import apache_beam as beam
import pytest
import tensorflow as tf
from google.protobuf import json_format
from tfx.types import standard_component_specs

from components.example_gen.executor import _CsvToExample, custom_config
from pipeline.data import DataError, check_csv_folder, csv_header, profile_columns
from serving.cli import read_rows_and_lines
from settings.csv_header import FEATURE_NAME, CsvHeaderError, feature_name, header_of_line, parse_header

# R's write.csv: every header cell quoted, the row names as a first column with an empty name, strings quoted.
R_CSV = ('"","species","bill length","mass_g"\n'
         '"1","Adelie",39.1,3750\n'
         '"2","Gentoo",NA,5200\n'
         '"3","Adelie",40.3,NA\n')
# pandas' to_csv with its index, and Excel's "CSV UTF-8": a byte-order mark, blanks around names.
PANDAS_CSV = "\ufeff,species , bill length,mass_g\n0,Adelie,39.1,3750\n1,Gentoo,,5200\n"


def test_quotes_bom_blanks_and_a_row_index_are_read_as_a_csv_reader_reads_them():
    assert parse_header(['"a"', "b"], "f.csv").columns == ('"a"', "b"), "parsed cells arrive unquoted: kept as given"
    header = header_of_line(R_CSV.splitlines()[0], "r.csv")
    assert (header.names, header.row_index, header.fields) == (("species", "bill_length", "mass_g"), True, 4)
    header = header_of_line(PANDAS_CSV.encode().splitlines()[0], "p.csv")
    assert (header.names, header.row_index) == (("species", "bill_length", "mass_g"), True)
    assert parse_header(["Unnamed: 0", "x"], "f.csv").row_index
    assert not parse_header(["id", "x"], "f.csv").row_index


@pytest.mark.parametrize("cells, message", [
    (["a", "b", "a"], "the header of f.csv names 'a' twice (columns 1 and 3); rename one of them."),
    (["a", " ", "c"], "column 2 of the header of f.csv has no name; name it, or remove the column."),
    (["", "a", "a "], "the header of f.csv names 'a' twice (columns 2 and 3); rename one of them."),
])
def test_a_header_that_cannot_name_the_columns_is_refused_in_one_sentence(cells, message):
    with pytest.raises(CsvHeaderError) as caught:
        parse_header(cells, "f.csv")
    assert str(caught.value) == message


def test_init_and_run_read_r_and_pandas_files_by_their_names(tmp_path):
    for name, text in (("r", R_CSV), ("pandas", PANDAS_CSV)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "data.csv").write_text(text, encoding="utf-8")
        files = check_csv_folder(folder)
        assert csv_header(files[0]) == ["species", "bill_length", "mass_g"]
        profiles = profile_columns(files, ["NA"])
        assert set(profiles) == {"species", "bill_length", "mass_g"}
        assert profiles["species"].values == {"Adelie": 1 + (name == "r"), "Gentoo": 1}, "the index is left out"
        assert profiles["bill_length"].types["float"] == 1 + (name == "r")
    (tmp_path / "dup").mkdir()
    (tmp_path / "dup" / "data.csv").write_text('"a","a"\n1,2\n')
    with pytest.raises(DataError, match=r"names 'a' twice \(columns 1 and 2\); rename one of them\.$"):
        check_csv_folder(tmp_path / "dup")


def test_example_gen_names_the_columns_as_the_header_does_and_leaves_the_row_index_out(tmp_path):
    (tmp_path / "data.csv").write_text(R_CSV)
    properties = {standard_component_specs.INPUT_BASE_KEY: str(tmp_path),
                  standard_component_specs.CUSTOM_CONFIG_KEY: json_format.MessageToJson(custom_config(["NA"], "x"))}
    with beam.Pipeline() as pipeline:
        _ = (pipeline | _CsvToExample(properties, "*.csv") | beam.Map(lambda e: e.SerializeToString())
             | beam.io.WriteToTFRecord(str(tmp_path / "examples"), shard_name_template=""))
    examples = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(tmp_path / "examples"))]
    assert len(examples) == 3
    for example in examples:
        assert set(example.features.feature) == {"species", "bill_length", "mass_g"}
    masses = sorted(v for e in examples for v in e.features.feature["mass_g"].int64_list.value)
    assert masses == [3750, 5200], "numbers stay numbers: the quoted index no longer shifts the columns"


def test_predict_reads_the_same_names_from_the_users_file(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text(R_CSV)
    rows, lines = read_rows_and_lines(None, str(path))
    assert rows[0] == {"species": "Adelie", "bill_length": "39.1", "mass_g": "3750"}
    assert lines == [2, 3, 4]
    path.write_text('"a","a"\n1,2\n')
    with pytest.raises(ValueError, match="names 'a' twice"):
        read_rows_and_lines(None, str(path))


# A spreadsheet in a German locale: semicolons between cells, decimal commas, a byte-order mark, CRLF.
SEMICOLON_CSV = "\ufeffAlter;Einkommen;Stadt;gekauft\r\n47;4831,57;Köln;ja\r\n35;2950,10;Bonn;nein\r\n"


@pytest.mark.parametrize("text, separator", [
    (SEMICOLON_CSV, "semicolons"), ("a;b;c\r\n1;2;3\r\n", "semicolons"), ("a\tb\n1\t2\n", "tabs"),
    ("a|b\n1|2\n", "'|'")])
def test_a_file_separated_by_something_else_than_commas_is_named_so_by_init_run_and_predict(tmp_path, text,
                                                                                           separator):
    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "data.csv"
    path.write_text(text, encoding="utf-8", newline="")
    said = f"{path} is separated by {separator}, not commas"
    with pytest.raises(DataError, match="save it as comma-separated CSV, with '.' as the decimal point.$") as caught:
        check_csv_folder(tmp_path / "data")
    assert said in str(caught.value)
    with pytest.raises(ValueError, match=said):
        read_rows_and_lines(None, str(path))


def test_commas_with_a_semicolon_in_a_name_and_one_column_without_one_are_read_as_before():
    assert parse_header(["a;b", "c"], "f.csv").columns == ("a;b", "c")
    assert parse_header(["price"], "f.csv").names == ("price",)


def test_predict_names_a_file_that_is_not_utf8_and_says_what_to_do(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_bytes("risk,Catégorie\n0.2,café\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"^CSV file {path} cannot be read as UTF-8 CSV \(.*\); re-export it as "
                                         r"UTF-8 CSV\.$"):
        read_rows_and_lines(None, str(path))


@pytest.mark.parametrize("column, feature", [
    ("Island", "island"), ("bill length (mm)", "bill_length_mm"), ("Größe", "grosse"), ("2nd try", "c_2nd_try"),
    ("flipper.length-mm", "flipper_length_mm"), ("体重", "column_3"), ("body_mass_g", "body_mass_g")])
def test_every_header_name_becomes_a_feature_name_every_stage_and_format_takes(column, feature):
    from tensorflow.core.function.polymorphism.function_type import sanitize_arg_name

    assert feature_name(column, 3) == feature
    assert FEATURE_NAME.fullmatch(feature)
    # TF's own rule for a signature's input names (and its tensors' lower case) leaves the feature's name as it is.
    assert sanitize_arg_name(feature).lower() == feature


def test_init_predict_and_example_gen_read_columns_by_their_feature_names(tmp_path):
    header = parse_header(["Island", "bill length (mm)", "body_mass_g"], "f.csv")
    assert header.names == ("island", "bill_length_mm", "body_mass_g")
    assert header.renamed() == [("Island", "island"), ("bill length (mm)", "bill_length_mm")]
    with pytest.raises(CsvHeaderError, match="names the columns 'Mass g' and 'mass_g', which both become the feature "
                                             r"'mass_g' \(lower case, letters, digits and _\); rename one of them\.$"):
        parse_header(["Mass g", "mass_g"], "f.csv")
    path = tmp_path / "rows.csv"
    path.write_text("Island,bill length (mm)\nBiscoe,39.1\n")
    assert read_rows_and_lines(None, str(path))[0] == [{"island": "Biscoe", "bill_length_mm": "39.1"}]
