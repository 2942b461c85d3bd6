"""Reading request logs back: file names and spans, which files and records a window takes, both TensorProto
encodings, batched requests, the missing-value markers, records left out, a file still being written."""
from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from monitoring import logs
from serving.server.request_log import log_file_name
from tests.monitoring.request_logs import encode, prediction_log, write_log_file

T0 = datetime(2026, 1, 31, 12, 0, tzinfo=timezone.utc)
TYPES = {"fare": np.float32, "trip_start_hour": np.int64, "payment_type": object}


def rows(count, start=0):
    return [{"fare": float(start + i), "trip_start_hour": (start + i) % 24, "payment_type": b"Cash"}
            for i in range(count)]


def records(count, start=0, version=1, **kwargs):
    return [prediction_log(encode([row], TYPES), version, **kwargs) for row in rows(count, start)]


def fares(window, version=None):
    statistics = window.statistics(version)
    [fare] = [f for f in statistics.datasets[0].features if f.path.step == ["fare"]]
    return statistics.datasets[0].num_examples, fare.num_stats


def test_the_writers_names_sort_by_time_and_say_who_wrote_them():
    start = datetime(2026, 1, 31, 12, 0, 1, 250000, tzinfo=timezone.utc)
    name = log_file_name(start.timestamp(), 4321, 7)
    assert name == "requests-20260131T120001250000Z-4321-000007.tfrecord"
    assert logs.parse_start(name) == (start, "4321", 7)
    for other in ("requests-20260131T120001250000Z-4321-7.tfrecord.tmp", "requests-20260131T120001Z-1-0.tfrecord",
                  "request-20260131T120001250000Z-1-0.tfrecord", "models.config"):
        assert logs.parse_start(other) is None, other
    later = log_file_name((start + timedelta(microseconds=1)).timestamp(), 1, 0)
    assert sorted([later, name]) == [name, later]


def test_a_file_ends_where_its_writers_next_file_starts_or_at_its_modification_time(tmp_path):
    folder = tmp_path / "taxi"
    write_log_file(folder, T0, records(1), writer=1, seq=0)
    write_log_file(folder, T0 + timedelta(minutes=5), records(1), writer=2, seq=0,
                   modified=T0 + timedelta(minutes=50))
    write_log_file(folder, T0 + timedelta(minutes=10), records(1), writer=1, seq=1,
                   modified=T0 + timedelta(minutes=40))
    (folder / "notes.txt").write_text("not a log")
    files = logs.list_log_files(str(tmp_path), "taxi")
    assert [(f.writer, f.seq) for f in files] == [("1", 0), ("2", 0), ("1", 1)]
    assert [f.end - T0 for f in files] == [timedelta(minutes=10), timedelta(minutes=50), timedelta(minutes=40)]


def test_a_clock_behind_the_name_ends_a_file_at_its_start(tmp_path):
    write_log_file(tmp_path / "taxi", T0, records(1), modified=T0 - timedelta(hours=1))
    [only] = logs.list_log_files(str(tmp_path), "taxi")
    assert only.end == only.start == T0


def test_no_folder_or_no_files_is_said_in_a_sentence(tmp_path):
    with pytest.raises(logs.LogError, match=r"no request logs of model 'taxi': .* does not exist; point "
                                             r"serving.request_log.directory at"):
        logs.list_log_files(str(tmp_path), "taxi")
    (tmp_path / "taxi").mkdir()
    (tmp_path / "taxi" / "other.tfrecord").write_bytes(b"")
    with pytest.raises(logs.LogError, match=r"holds no request log files \(requests-\*.tfrecord\); turn request "
                                             r"logging on \(serving.request_log.enabled\)"):
        logs.list_log_files(str(tmp_path), "taxi")


def _file(start_minutes, end_minutes):
    return logs.LogFile(f"f{start_minutes}", T0 + timedelta(minutes=start_minutes), T0 + timedelta(minutes=end_minutes),
                        "1", 0)


def test_a_time_window_takes_every_file_that_meets_it():
    files = [_file(0, 10), _file(10, 20), _file(20, 30), _file(30, 30), _file(30, 45), _file(45, 60)]
    chosen = logs.files_between(files, T0 + timedelta(minutes=20), T0 + timedelta(minutes=45))
    # Ending exactly at the start, or starting exactly at the end, is outside; a file of no length at the start is in.
    assert [f.path for f in chosen] == ["f20", "f30", "f30"]
    chosen = logs.files_between(files, T0 + timedelta(minutes=15), T0 + timedelta(minutes=31))
    assert [f.path for f in chosen] == ["f10", "f20", "f30", "f30"]
    assert logs.files_between(files, T0 + timedelta(minutes=60), T0 + timedelta(minutes=90)) == []


def test_time_windows_read_this_window_and_the_one_as_long_before(tmp_path):
    folder = tmp_path / "taxi"
    for i in range(4):
        write_log_file(folder, T0 + timedelta(minutes=10 * i), records(i + 1, start=10 * i), seq=i,
                       modified=T0 + timedelta(minutes=10 * i + 5))
    files = logs.list_log_files(str(tmp_path), "taxi")
    current, previous = logs.WindowStatistics(), logs.WindowStatistics()
    seen = []
    logs.read_time_windows(files, T0 + timedelta(minutes=20), T0 + timedelta(minutes=40), current, previous,
                           lambda done, total, requests: seen.append((done, total, requests)))
    assert current.total_requests == 3 + 4 and previous.total_requests == 1 + 2
    assert current.span() == (T0 + timedelta(minutes=20), T0 + timedelta(minutes=35))
    assert previous.span() == (T0, T0 + timedelta(minutes=20))
    assert seen == [(1, 4, 1), (2, 4, 3), (3, 4, 6), (4, 4, 10)], "oldest file first"


@pytest.mark.parametrize("count, current_files, previous_files", [
    (2, ["2"], ["2"]),
    (4, ["2"], ["2", "1"]),
    (5, ["2"], ["1"]),
    (7, ["2", "1"], ["1", "0"]),
    (20, ["2", "1", "0"], []),
])
def test_the_last_n_requests_and_the_n_before_them_are_read_newest_first(tmp_path, count, current_files,
                                                                         previous_files):
    folder = tmp_path / "taxi"
    for i in range(3):
        write_log_file(folder, T0 + timedelta(minutes=i), records(5, start=5 * i), seq=i)
    files = logs.list_log_files(str(tmp_path), "taxi")
    current, previous = logs.WindowStatistics(), logs.WindowStatistics()
    logs.read_last(files, count, current, previous)
    assert [f.path[-10] for f in current.files] == current_files
    assert [f.path[-10] for f in previous.files] == previous_files
    assert current.total_requests == min(count, 15) and previous.total_requests == min(count, max(0, 15 - count))
    # The newest requests are the current window's: fares 15 - count ... 14.
    _, fare = fares(current)
    assert (fare.min, fare.max) == (15 - min(count, 15), 14)
    if previous.total_requests:
        _, fare = fares(previous)
        assert (fare.min, fare.max) == (max(0, 15 - 2 * count), 14 - count)


def test_the_last_n_requests_are_the_newest_answered_across_every_servers_files(tmp_path):
    """Two servers log at once: the newest file by name (server 2's, begun a minute later) holds older requests than
    server 1's, which went on logging. A third server's old file cannot hold any of the requests kept: it is not
    read."""
    folder = tmp_path / "taxi"
    second = timedelta(seconds=1)
    write_log_file(folder, T0, [records(1, start=100 + i, version=1, answered=T0 + timedelta(minutes=5) + i * second)[0]
                                for i in range(10)], writer=1, modified=T0 + timedelta(minutes=10))
    write_log_file(folder, T0 + timedelta(minutes=1),
                   [records(1, start=i, version=2, answered=T0 + timedelta(minutes=1) + i * second)[0]
                    for i in range(10)], writer=2, modified=T0 + timedelta(minutes=3))
    write_log_file(folder, T0 - timedelta(hours=1), records(5, start=500, version=3), writer=3,
                   modified=T0 - timedelta(minutes=50))
    files = logs.list_log_files(str(tmp_path), "taxi")
    assert [f.writer for f in files] == ["3", "1", "2"], "by name, server 2's file is the newest"
    current, previous = logs.WindowStatistics(), logs.WindowStatistics()
    seen = []
    logs.read_last(files, 10, current, previous, lambda done, total, kept: seen.append((done, total, kept)))
    assert dict(current.requests) == {1: 10} and dict(previous.requests) == {2: 10}
    assert [f.writer for f in current.files] == ["1"] and [f.writer for f in previous.files] == ["2"]
    assert current.span() == (T0 + timedelta(minutes=5), T0 + timedelta(minutes=5) + 9 * second)
    assert seen == [(1, 3, 10), (2, 3, 20)], "server 3's file, ended 50 minutes before, was not read"
    # Seven: the newest seven of server 1, then its three before them and server 2's newest four.
    current, previous = logs.WindowStatistics(), logs.WindowStatistics()
    logs.read_last(files, 7, current, previous)
    assert dict(current.requests) == {1: 7} and dict(previous.requests) == {1: 3, 2: 4}
    _, fare = fares(previous)
    assert (fare.min, fare.max) == (6, 102)


def test_both_tensor_encodings_and_batched_requests_give_the_same_statistics():
    batched = [prediction_log(encode(rows(40)[i:i + 8], TYPES), 1) for i in range(0, 40, 8)]
    windows = []
    for chunk in (records(40), records(40, as_values=True), batched):
        window = logs.WindowStatistics()
        window.add(chunk)
        windows.append(window)
    figures = [fares(w) for w in windows]
    assert all(count == 40 for count, _ in figures)
    assert all(str(stats) == str(figures[0][1]) for _, stats in figures)
    assert [w.total_requests for w in windows] == [40, 40, 5]
    assert [w.rows[1] for w in windows] == [40, 40, 40]


def test_a_single_value_fills_its_shape_and_a_short_tensor_is_left_out():
    log = prediction_log_pb2.PredictionLog.FromString(prediction_log(encode(rows(3), TYPES), 1))
    fare = log.predict_log.request.inputs["fare"]
    fare.ClearField("tensor_content")
    fare.float_val.append(2.5)
    values, count, kind = logs.tensor_values(fare)
    assert (count, kind, list(values)) == (3, "float", [2.5, 2.5, 2.5])
    fare.float_val.append(3.5)
    with pytest.raises(ValueError, match="2 values for shape"):
        logs.tensor_values(fare)
    window = logs.WindowStatistics()
    window.add([log.SerializeToString()])
    assert window.skipped == {"inputs that cannot be decoded": 1} and window.total_requests == 0


def test_the_clients_missing_markers_count_as_missing_values():
    served = [{"fare": None, "trip_start_hour": None, "payment_type": None}, *rows(3)]
    window = logs.WindowStatistics()
    window.add([prediction_log(encode(served, TYPES), 1)])
    statistics = window.statistics(1)
    assert statistics.datasets[0].num_examples == 4
    missing = {f.path.step[0]: (f.num_stats if f.HasField("num_stats") else f.string_stats).common_stats.num_missing
               for f in statistics.datasets[0].features}
    assert missing == {"fare": 1, "trip_start_hour": 1, "payment_type": 1}
    by_name = {f.path.step[0]: f for f in statistics.datasets[0].features}
    assert by_name["trip_start_hour"].num_stats.min == 0, "-1 is the marker, not a value"
    assert [v.value for v in by_name["payment_type"].string_stats.top_values] == ["Cash"]


def test_versions_are_counted_apart_and_other_records_are_left_out_with_their_reason():
    classify = prediction_log_pb2.PredictionLog()
    classify.classify_log.request.model_spec.name = "taxi"
    unversioned = prediction_log_pb2.PredictionLog.FromString(records(1)[0])
    unversioned.log_metadata.model_spec.ClearField("version")
    other_batch = prediction_log_pb2.PredictionLog.FromString(prediction_log(encode(rows(2), TYPES), 1))
    other_batch.predict_log.request.inputs["fare"].CopyFrom(tf.make_tensor_proto(np.zeros(3, np.float32)))
    changed = prediction_log(encode(rows(1), {**TYPES, "fare": object}), 1)
    mixed = [*records(6, version=1, sampling_rate=0.5), *records(2, version=2, signature="scores"), b"\x00garbage",
             classify.SerializeToString(), unversioned.SerializeToString(), other_batch.SerializeToString(), changed]
    windows = [logs.WindowStatistics() for _ in range(4)]
    for window in windows:
        window.add(mixed)
    window = windows[0]
    assert window.requests == {1: 6, 2: 2} and window.rows == {1: 6, 2: 2}
    assert window.sampling_rates == {0.5: 6, 1.0: 2}
    assert window.signatures == {"serving_default": 6, "scores": 2}
    assert window.skipped == {"not a PredictionLog": 1, "not a Predict request": 1, "no model version": 1,
                              "inputs of different batch sizes": 1, "an input whose type changed": 1}
    assert [fares(w, v)[0] for w, v in zip(windows, (1, 2, None), strict=False)] == [6, 2, 8]
    assert windows[3].statistics(3) is None
    with pytest.raises(RuntimeError, match="extracted once"):
        windows[0].statistics(2)


def test_a_file_still_being_written_gives_its_whole_records(tmp_path):
    path = write_log_file(tmp_path / "taxi", T0, records(10))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 7)
    read, truncated = logs.read_records(str(path))
    assert truncated and len(read) == 9
    whole = write_log_file(tmp_path / "taxi", T0 + timedelta(seconds=1), records(10), seq=1)
    read, truncated = logs.read_records(str(whole))
    assert not truncated and len(read) == 10


def test_times_are_iso_utc_or_spans_before_now():
    now = datetime(2026, 1, 31, 12, 0, tzinfo=timezone.utc)
    assert logs.parse_when("90m", now) == now - timedelta(minutes=90)
    assert logs.parse_when("2h", now) == now - timedelta(hours=2)
    assert logs.parse_when("1.5d", now) == now - timedelta(days=1.5)
    assert logs.parse_when("30s", now) == now - timedelta(seconds=30)
    assert logs.parse_when("2026-01-30T08:00:00Z", now) == datetime(2026, 1, 30, 8, tzinfo=timezone.utc)
    assert logs.parse_when("2026-01-30T08:00", now) == datetime(2026, 1, 30, 8, tzinfo=timezone.utc)
    assert logs.parse_when("2026-01-30T09:00:00+01:00", now) == datetime(2026, 1, 30, 8, tzinfo=timezone.utc)
    with pytest.raises(logs.LogError, match=r"'yesterday' is not a time; write an ISO 8601 UTC time"):
        logs.parse_when("yesterday", now)


def test_requests_with_their_own_time_are_taken_by_it_and_the_span_is_theirs(tmp_path):
    folder = tmp_path / "taxi"
    # One file from 12:20 to 12:40, a request a minute; the window is 12:30 to 12:40, the one before 12:20 to 12:30.
    timed = [prediction_log(encode([row], TYPES), 1, answered=T0 + timedelta(minutes=20 + i))
             for i, row in enumerate(rows(20))]
    write_log_file(folder, T0 + timedelta(minutes=20), timed, modified=T0 + timedelta(minutes=40))
    # An older file without times, wholly in the window before: its requests go with it.
    write_log_file(folder, T0 + timedelta(minutes=5), records(3, start=100), seq=1, writer=2,
                   modified=T0 + timedelta(minutes=25))
    files = logs.list_log_files(str(tmp_path), "taxi")
    current, previous = logs.WindowStatistics(), logs.WindowStatistics()
    logs.read_time_windows(files, T0 + timedelta(minutes=30), T0 + timedelta(minutes=40), current, previous)
    assert (current.total_requests, previous.total_requests) == (10, 10 + 3)
    assert current.span() == (T0 + timedelta(minutes=30), T0 + timedelta(minutes=39))
    _, fare = fares(current)
    assert (fare.min, fare.max) == (10, 19)
    assert [f.writer for f in current.files] == ["1"] and sorted(f.writer for f in previous.files) == ["1", "2"]
    # The window before holds both kinds; the span is that of the requests with a time.
    assert previous.span() == (T0 + timedelta(minutes=20), T0 + timedelta(minutes=29))


def test_requests_outside_both_windows_are_left_out(tmp_path):
    timed = [prediction_log(encode([row], TYPES), 1, answered=T0 + timedelta(minutes=i)) for i, row in
             enumerate(rows(60))]
    write_log_file(tmp_path / "taxi", T0, timed, modified=T0 + timedelta(minutes=60))
    files = logs.list_log_files(str(tmp_path), "taxi")
    current, previous = logs.WindowStatistics(), logs.WindowStatistics()
    logs.read_time_windows(files, T0 + timedelta(minutes=40), T0 + timedelta(minutes=50), current, previous)
    assert (current.total_requests, previous.total_requests) == (10, 10)
    assert current.skipped == {} and previous.skipped == {}
