"""Config and folder changes while serving: no request fails, new versions take over, broken ones are reported."""
from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from types import SimpleNamespace

from serving.clients import GrpcClient, RestClient
from serving.repository.base import write_model_server_config
from serving.repository.local import ModelRepository
from serving.server.errors import ServingRequestError
from serving.server.model_manager import FailedLoad, ModelManager, load_retry_due, single_model_config
from serving.server.model_server import ModelServer
from serving.server.servable import ServableLoadError
from tests.serving.conftest import MODEL, ROW, copy_export, http_json, version_answering, wait_for


def test_rollout_under_load_fails_no_request_and_switches_versions(repository, server, tiny_exports):
    answers: list[tuple[str, str, int | None, int]] = []  # transport, label, version answering, sender
    failures: list[str] = []
    stop = threading.Event()

    def send_continuously(sender: int) -> None:
        # No retries: a request that fails during the change must show up here.
        with RestClient(server.rest_url, retries=0) as rest, GrpcClient(server.grpc_target, retries=0) as grpc:
            while not stop.is_set():
                for transport, client in (("rest", rest), ("grpc", grpc)):
                    for label in ("stable", "canary"):
                        try:
                            probability = client.predict(ROW, MODEL, label=label, timeout=10)[0]
                            answers.append((transport, label, version_answering(probability), sender))
                        except Exception as e:  # noqa: BLE001 - every failure is collected and asserted on
                            failures.append(f"{transport} {label}: {e!r}")

    def answered_since(start: int, label: str, version: int) -> bool:
        # Every sender, over both transports, has seen `label` answered by `version` since `start`.
        seen = {(a[0], a[3]) for a in answers[start:] if a[1] == label and a[2] == version}
        return seen == {(transport, sender) for transport in ("rest", "grpc") for sender in range(2)}

    def more_traffic(count: int = 40) -> None:
        mark = len(answers)
        wait_for(lambda: len(answers) >= mark + count, what=f"{count} more answers")

    senders = [threading.Thread(target=send_continuously, args=(i,), daemon=True) for i in range(2)]
    for sender in senders:
        sender.start()
    try:
        wait_for(lambda: answered_since(0, "canary", 2) and answered_since(0, "stable", 1),
                 what="traffic on the initial versions")
        more_traffic()

        # A new version arrives and becomes the canary; stable stays on 1.
        repository.add_version(MODEL, tiny_exports[3], version=3)
        repository.serve(MODEL, [1, 2, 3], {"stable": 1, "canary": 3})
        mark = len(answers)
        wait_for(lambda: answered_since(mark, "canary", 3), what="canary answering from version 3")
        assert server.manager.labels(MODEL) == {"stable": 1, "canary": 3}
        more_traffic()

        # Promotion: stable moves to 3 and the old versions are unloaded in the same change.
        repository.serve(MODEL, [3], {"stable": 3, "canary": 3})
        mark = len(answers)
        wait_for(lambda: answered_since(mark, "stable", 3), what="stable answering from version 3")
        wait_for(lambda: server.manager.available_versions(MODEL) == [3], what="versions 1 and 2 unloaded")
        more_traffic()
    finally:
        stop.set()
        for sender in senders:
            sender.join(timeout=30)

    assert failures == []
    assert len(answers) >= 120
    assert all(answer[2] is not None for answer in answers)
    for sender in range(2):
        for transport in ("rest", "grpc"):
            for label, expected_switches in (("stable", [1, 3]), ("canary", [2, 3])):
                sequence = [a[2] for a in answers if a[0] == transport and a[1] == label and a[3] == sender]
                # One sender's requests are sequential: each label switched once, old to new, never back.
                switches = [v for i, v in enumerate(sequence) if i == 0 or v != sequence[i - 1]]
                assert switches == expected_switches, (sender, transport, label)
    status, body = http_json("GET", f"{server.rest_url}/v1/models/{MODEL}")
    assert {(row["version"], row["state"]) for row in body["model_version_status"]} == {
        ("3", "AVAILABLE"), ("2", "END"), ("1", "END")
    }


def test_a_version_that_fails_to_load_is_reported_and_the_others_keep_serving(repository, server):
    broken = repository.model_dir(MODEL) / "5"
    broken.mkdir()
    (broken / "saved_model.pb").write_bytes(b"this is not a SavedModel")
    repository.serve(MODEL, [1, 2, 5], {"stable": 1, "canary": 2})

    def version_5_state():
        status, body = http_json("GET", f"{server.rest_url}/v1/models/{MODEL}/versions/5")
        return body["model_version_status"][0] if status == 200 else None

    wait_for(lambda: (version_5_state() or {}).get("state") == "END", what="version 5 to fail")
    state = version_5_state()
    assert state["status"]["error_code"] != "OK"
    assert "5" in state["status"]["error_message"]
    assert server.manager.available_versions(MODEL) == [1, 2]

    # Pointing a label at the broken version keeps that label's previous version and says so.
    repository.set_label(MODEL, "canary", 5)
    problems = server.reload()
    assert any("labels {'canary': 5} point at versions that are not available" in p for p in problems), problems
    assert server.manager.labels(MODEL) == {"stable": 1, "canary": 2}
    with RestClient(server.rest_url) as client:
        assert version_answering(client.predict(ROW, MODEL)[0]) == 2
        assert version_answering(client.predict(ROW, MODEL, label="canary")[0]) == 2
        assert version_answering(client.predict(ROW, MODEL, label="stable")[0]) == 1

    # A valid change applies, and the problem is gone.
    repository.serve(MODEL, [1, 2], {"stable": 2, "canary": 1})
    wait_for(lambda: server.manager.labels(MODEL) == {"stable": 2, "canary": 1}, what="the labels to move")
    assert server.reload() == []


def test_labels_fall_back_one_by_one(repository, server):
    # stable moves to 2 as asked; canary points at a version that is not on disk and keeps its previous version.
    config = repository.read_config()
    config.model_config_list.config[0].version_labels["stable"] = 2
    config.model_config_list.config[0].version_labels["canary"] = 7
    config.model_config_list.config[0].version_labels["beta"] = 7
    write_model_server_config(config, repository.config_path)
    problems = server.reload()
    assert any("not available" in p and "leaving ['beta'] unset" in p for p in problems), problems
    assert server.manager.labels(MODEL) == {"stable": 2, "canary": 2}
    with GrpcClient(server.grpc_target) as client:
        assert version_answering(client.predict(ROW, MODEL, label="stable")[0]) == 2


def test_a_label_problem_is_warned_about_once_not_every_poll(repository, server, caplog):
    caplog.set_level(logging.WARNING, logger="serving.server.model_manager")
    config = repository.read_config()
    config.model_config_list.config[0].version_labels["canary"] = 7
    write_model_server_config(config, repository.config_path)
    for _ in range(5):
        assert any("not available" in p for p in server.reload())
    time.sleep(0.5)  # several polls too
    warnings = [r for r in caplog.records if "not available" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]


def test_on_a_fresh_start_valid_labels_serve_although_another_is_invalid(tmp_path, tiny_exports):
    repository = ModelRepository(tmp_path / "models")
    repository.add_version(MODEL, tiny_exports[1], version=1)
    config = repository.serve(MODEL, [1], {"stable": 1})
    config.model_config_list.config[0].version_labels["canary"] = 2
    server = ModelServer(config=config, rest_port=None, grpc_port=None, poll_seconds=0)
    try:
        problems = server.start()
        assert any("leaving ['canary'] unset" in p for p in problems), problems
        assert server.manager.labels(MODEL) == {"stable": 1}
    finally:
        server.stop()


def test_a_broken_config_file_keeps_the_current_config(repository, server):
    config = repository.read_config()
    repository.config_path.write_text("model_config_list { config { name: ")
    problems = server.reload()
    assert len(problems) == 1 and "is not a valid text-format ModelServerConfig" in problems[0], problems
    assert server.manager.available_versions(MODEL) == [1, 2]
    with GrpcClient(server.grpc_target) as client:
        assert version_answering(client.predict(ROW, MODEL, label="stable")[0]) == 1

    # Once the file is valid again, it applies.
    config.model_config_list.config[0].version_labels["stable"] = 2
    write_model_server_config(config, repository.config_path)
    wait_for(lambda: server.manager.labels(MODEL) == {"stable": 2, "canary": 2}, what="the fixed config to apply")
    assert server.reload() == []


def test_an_empty_config_file_changes_nothing(repository, server):
    # A file caught mid-write (0 bytes) is an empty ModelServerConfig: TF Serving takes no action on it.
    repository.config_path.write_text("")
    assert server.reload() == []
    time.sleep(0.3)  # several polls too
    assert server.manager.available_versions(MODEL) == [1, 2]
    assert server.manager.labels(MODEL) == {"stable": 1, "canary": 2}


def test_concurrent_reloads_never_leave_an_older_config_in_force(tmp_path):
    # Versions are stand-ins (no TensorFlow): what matters is which config the manager ends up with.
    for version in (1, 2, 3):
        (tmp_path / MODEL / str(version)).mkdir(parents=True)
    config_path = tmp_path / "models.config"
    config = single_model_config(MODEL, str(tmp_path / MODEL))
    config.model_config_list.config[0].model_version_policy.all.SetInParent()

    def write(stable: int) -> None:
        config.model_config_list.config[0].version_labels["stable"] = stable
        write_model_server_config(config, config_path)

    write(1)
    manager = ModelManager(loader=lambda name, version, path: SimpleNamespace(path=path))
    server = ModelServer(config_path=config_path, rest_port=None, grpc_port=None, poll_seconds=0, manager=manager)
    server.start()
    write(2)
    apply_config = manager.apply_config
    other_reload: list[threading.Thread] = []

    def slow_apply(new_config):
        if not other_reload:
            # While this reload applies the file it read, the file changes again and another reload starts.
            write(3)
            other_reload.append(threading.Thread(target=server.reload, daemon=True))
            other_reload[0].start()
            other_reload[0].join(timeout=1.0)  # it must wait for this one to finish (a lock), else it wins here
        return apply_config(new_config)

    manager.apply_config = slow_apply
    try:
        server.reload()
        other_reload[0].join(timeout=10)
        assert not other_reload[0].is_alive()
        assert manager.labels(MODEL) == {"stable": 3}
    finally:
        server.stop()


def test_single_model_mode_follows_the_latest_version_folder(tmp_path, tiny_exports):
    model_dir = tmp_path / MODEL
    copy_export(tiny_exports[1], model_dir / "1")
    server = ModelServer.for_model(MODEL, model_dir, rest_port=0, grpc_port=0, poll_seconds=0.1)
    server.start()
    try:
        with GrpcClient(server.grpc_target) as client:
            assert version_answering(client.predict(ROW, MODEL)[0]) == 1
            # Staged under a hidden name, then renamed, as a pusher does: the server never sees half a model.
            copy_export(tiny_exports[2], model_dir / ".incoming")
            (model_dir / ".incoming").rename(model_dir / "2")
            wait_for(lambda: server.manager.available_versions(MODEL) == [2], what="version 2 to replace 1")
            assert version_answering(client.predict(ROW, MODEL)[0]) == 2
    finally:
        server.stop()


def test_a_version_still_being_copied_is_served_once_its_files_are_complete(repository, server, tiny_exports):
    # The copy is not staged: the folder, saved_model.pb and variables/ appear first, the variables' data is
    # written into them afterwards, and none of those three changes its mtime when that happens.
    target = repository.model_dir(MODEL) / "4"
    shutil.copytree(tiny_exports[3], target)
    data_files = sorted((target / "variables").glob("variables.data-*"))
    complete = {path: path.read_bytes() for path in data_files}
    for path in data_files:
        path.write_bytes(b"")
    watched = [target, target / "saved_model.pb", target / "variables"]
    stamps = {path: path.stat().st_mtime_ns for path in watched}
    repository.serve(MODEL, [1, 2, 4], {"stable": 1, "canary": 2})

    def given_up() -> bool:
        try:
            return server.manager.model_status(MODEL, 4)[0].state == "END"
        except ServingRequestError:  # no status yet
            return False

    wait_for(given_up, what="the incomplete version to fail all its retries")
    assert server.manager.available_versions(MODEL) == [1, 2]

    for path, data in complete.items():
        path.write_bytes(data)
    for path, stamp in stamps.items():
        os.utime(path, ns=(stamp, stamp))
    wait_for(lambda: 4 in server.manager.available_versions(MODEL), what="version 4 once its files are complete")
    with GrpcClient(server.grpc_target) as client:
        assert version_answering(client.predict(ROW, MODEL, version=4)[0]) == 3


def test_failed_loads_are_retried_a_bounded_number_of_times_at_the_interval(tmp_path):
    (tmp_path / MODEL / "1").mkdir(parents=True)
    attempts: list[float] = []
    now = [100.0]

    def failing_loader(name, version, path):
        attempts.append(now[0])
        raise ServableLoadError("DATA_LOSS", "corrupt")

    manager = ModelManager(loader=failing_loader, max_num_load_retries=2, load_retry_interval_s=10.0,
                           clock=lambda: now[0])
    manager.apply_config(single_model_config(MODEL, str(tmp_path / MODEL)))
    state = manager.model_status(MODEL, 1)[0]
    assert (state.state, state.error_code) == ("LOADING", "OK") and "retry 1 of 2 in 10 s" in state.error_message
    now[0] = 109.9
    manager.refresh()
    assert attempts == [100.0]  # not yet due
    for at in (110.0, 125.0, 200.0, 300.0):
        now[0] = at
        manager.refresh()
    assert attempts == [100.0, 110.0, 125.0]  # the first try and two retries, then it gives up
    state = manager.model_status(MODEL, 1)[0]
    assert (state.state, state.error_code, state.error_message) == ("END", "DATA_LOSS", "corrupt")

    # A change inside the folder (e.g. the rest of a copy, or a fix) starts over.
    (tmp_path / MODEL / "1" / "saved_model.pb").write_bytes(b"new")
    manager.refresh()
    assert attempts[-1] == 300.0 and manager.model_status(MODEL, 1)[0].state == "LOADING"


def test_load_retry_is_due_only_with_retries_left_and_the_interval_passed():
    failed = FailedLoad(fingerprint="f", retries=1, next_retry_at=50.0, code="UNKNOWN", reason="x")
    assert load_retry_due(failed, max_num_load_retries=2, now=50.0)
    assert not load_retry_due(failed, max_num_load_retries=2, now=49.9)
    assert not load_retry_due(failed, max_num_load_retries=1, now=60.0)


def test_a_version_folder_with_other_formats_and_a_manifest_beside_the_saved_model_serves(repository, server,
                                                                                          tiny_exports):
    target = repository.model_dir(MODEL) / "6"
    shutil.copytree(tiny_exports[3], target)
    (target / "manifest.json").write_text('{"files": {}}')
    for folder, name in (("tflite", "model.tflite"), ("onnx", "model.onnx"), ("tfjs", "model.json")):
        (target / folder).mkdir()
        (target / folder / name).write_bytes(b"not a SavedModel")
    repository.serve(MODEL, [1, 2, 6], {"stable": 1, "canary": 6})
    wait_for(lambda: server.manager.labels(MODEL).get("canary") == 6, what="version 6 to serve")
    with RestClient(server.rest_url) as client:
        assert version_answering(client.predict(ROW, MODEL, label="canary")[0]) == 3
