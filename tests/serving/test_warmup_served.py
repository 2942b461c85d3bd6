"""Warm-up through a running `mlops serve`: a version is AVAILABLE only after its warm-up requests ran, and one whose
requests fail ends with TF Serving's reason. Apart from tests/serving/test_warmup.py, which `make mutation` runs: a
served RestApp is probed by uvicorn in a way mutmut's trampolines answer wrongly (see test_transport_limits.py)."""
from __future__ import annotations

import numpy as np

from serving.server.warmup import WARMUP_FILE, write_warmup_requests
from tests.serving.conftest import MODEL, ROW, copy_export, http_json, wait_for
from tests.serving.test_warmup import predict_log, write_records


def test_the_server_warms_a_version_up_before_it_is_available_and_reports_one_that_fails(repository, server,
                                                                                        tiny_exports):
    warmed = copy_export(tiny_exports[3], repository.model_dir(MODEL) / "3")
    write_warmup_requests(str(warmed), {name: np.array([value]) for name, value in ROW.items()})
    broken = copy_export(tiny_exports[3], repository.model_dir(MODEL) / "4")
    write_records(broken, [predict_log(warmed, fare=np.array(["a string"]))])
    repository.serve(MODEL, [1, 2, 3, 4], {"stable": 1, "canary": 2})

    def state(version):
        status, body = http_json("GET", f"{server.rest_url}/v1/models/{MODEL}/versions/{version}")
        return body["model_version_status"][0] if status == 200 else {}

    wait_for(lambda: state(3).get("state") == "AVAILABLE" and state(4).get("state") == "END",
             what="version 3 to load and version 4 to fail")
    assert state(4)["status"]["error_code"] == "INVALID_ARGUMENT"
    assert state(4)["status"]["error_message"].startswith(f"warmup request 1 of {broken}/{WARMUP_FILE} failed: ")
    assert server.manager.available_versions(MODEL) == [1, 2, 3]
