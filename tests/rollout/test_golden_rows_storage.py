"""Golden rows read where the pipeline writes them, through tf.io.gfile (so a gs:// pipeline root reads as a local
one): a CSV file or folder named by rollout.golden_data, or the newest eval split of the pipeline root. (TensorFlow's
resumable upload stalls against tests/gcs_emulator.py, so the files are written and read on a local disk here.)"""
from __future__ import annotations

import pytest
import tensorflow as tf

from rollout.verify import GoldenDataError, load_golden_rows


def example(fare: float, payment: str) -> bytes:
    return tf.train.Example(features=tf.train.Features(feature={
        "fare": tf.train.Feature(float_list=tf.train.FloatList(value=[fare])),
        "payment_type": tf.train.Feature(bytes_list=tf.train.BytesList(value=[payment.encode()]))})).SerializeToString()


def write_split(root: str, execution: int, fares: list[float]) -> None:
    folder = f"{root}/CsvExampleGen/examples/{execution}/Split-eval"
    tf.io.gfile.makedirs(folder)
    with tf.io.TFRecordWriter(f"{folder}/data_tfrecord-00000-of-00001.gz", options="GZIP") as writer:
        for fare in fares:
            writer.write(example(fare, "Cash"))


def test_the_newest_eval_split_and_a_golden_csv_folder_are_read_through_tf_io_gfile(tmp_path):
    root = str(tmp_path)
    write_split(f"{root}/pipeline", 9, [1.0, 2.0])
    write_split(f"{root}/pipeline", 10, [3.0, 4.0, 5.0])  # newer by execution id, though "10" < "9" as text
    rows = load_golden_rows("", f"{root}/pipeline", 2)
    assert [round(row["fare"], 3) for row in rows] == [3.0, 4.0] and rows[0]["payment_type"] == "Cash"
    tf.io.gfile.makedirs(f"{root}/golden")
    with tf.io.gfile.GFile(f"{root}/golden/a.csv", "w") as f:
        f.write("fare,payment_type\n7.5,Cash\n8.5,Credit Card\n")
    with tf.io.gfile.GFile(f"{root}/golden/b.csv", "w") as f:
        f.write("fare,payment_type\n9.5,Cash\n")
    assert load_golden_rows(f"{root}/golden", "", 3) == [{"fare": "7.5", "payment_type": "Cash"},
                                                          {"fare": "8.5", "payment_type": "Credit Card"},
                                                          {"fare": "9.5", "payment_type": "Cash"}]
    assert load_golden_rows(f"{root}/golden/b.csv", "", 5) == [{"fare": "9.5", "payment_type": "Cash"}]
    with pytest.raises(GoldenDataError, match=r"rollout.golden_data .*/missing.csv does not exist"):
        load_golden_rows(f"{root}/missing.csv", "", 5)
    with pytest.raises(GoldenDataError, match=r"no golden rows found in .*/empty \(eval split\)"):
        load_golden_rows("", f"{root}/empty", 5)
