"""`mlops serve` (the local TF-Serving-compatible server) and `mlops predict` (the clients from the shell)."""
from __future__ import annotations

import argparse
import csv
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from serving import (
    DEFAULT_GRPC_PORT,
    DEFAULT_HOST,
    DEFAULT_LOAD_RETRY_INTERVAL_S,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_NUM_LOAD_RETRIES,
    DEFAULT_REST_PORT,
    DEFAULT_UPSTREAM_GRPC,
    DEFAULT_UPSTREAM_REST,
    ServingLimits,
)
from settings import arguments
from settings.csv_header import feature_name, parse_header

if TYPE_CHECKING:
    from settings.config import RequestLogConfig


def register(subparsers: argparse._SubParsersAction,
             add_config_args: Callable[[argparse.ArgumentParser], None]) -> None:
    """Adds the `serve`, `log-proxy` and `predict` subcommands to the `mlops` parser; `add_config_args` adds
    --config and --set (the serving.request_log section)."""
    serve = subparsers.add_parser(
        "serve",
        help="serve models over TF Serving's REST and gRPC APIs (a local stand-in for tensorflow_model_server)",
    )
    add_config_args(serve)
    source = serve.add_argument_group("what to serve (a config file, or one model)")
    source.add_argument("--model-config", help="text-format ModelServerConfig (models.config), re-read while running")
    source.add_argument("--model-base-path", help="folder holding <integer version>/ SavedModels of one model")
    source.add_argument("--model-name", help="name to serve --model-base-path under")
    serve.add_argument("--rest-port", type=int, default=DEFAULT_REST_PORT, help="REST port (0: any free port)")
    serve.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT, help="gRPC port (0: any free port)")
    serve.add_argument("--host", default=DEFAULT_HOST, help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    serve.add_argument(
        "--poll-seconds", type=float, default=1.0,
        help="re-read the config file and model folders this often; 0 turns polling off (default 1)",
    )
    serve.add_argument(
        "--max-batch-size", type=int, default=DEFAULT_MAX_BATCH_SIZE,
        help=f"largest number of examples in one request (default {DEFAULT_MAX_BATCH_SIZE})",
    )
    serve.add_argument(
        "--grpc-workers", type=int, default=8,
        help="threads for gRPC status, metadata and reload calls; Predict runs on the event loop (default 8)",
    )
    batching = serve.add_argument_group("server-side batching (TF Serving's flags and file format)")
    batching.add_argument(
        "--enable_batching", "--enable-batching", dest="enable_batching", action="store_true",
        help="merge concurrent requests (REST and gRPC alike) into batches",
    )
    batching.add_argument(
        "--batching_parameters_file", "--batching-parameters-file", dest="batching_parameters_file", metavar="FILE",
        help="text-format BatchingParameters, e.g. k8s/serving/base/batching_parameters.txt (the cluster's file)",
    )
    retries = serve.add_argument_group("failed loads (TF Serving's flags)")
    retries.add_argument(
        "--max_num_load_retries", "--max-num-load-retries", dest="max_num_load_retries", type=int,
        default=DEFAULT_MAX_NUM_LOAD_RETRIES,
        help=f"retries of a version that failed to load (default {DEFAULT_MAX_NUM_LOAD_RETRIES}); "
             "any change in its folder starts over",
    )
    retries.add_argument(
        "--load_retry_interval_micros", "--load-retry-interval-micros", dest="load_retry_interval_micros", type=int,
        default=int(DEFAULT_LOAD_RETRY_INTERVAL_S * 1e6),
        help=f"wait between retries (default {int(DEFAULT_LOAD_RETRY_INTERVAL_S * 1e6)}, one minute)",
    )
    limits = serve.add_argument_group("limits on requests")
    limits.add_argument(
        "--max-request-bytes", type=int, default=ServingLimits.max_request_bytes,
        help=f"largest REST body or gRPC message (default {ServingLimits.max_request_bytes})",
    )
    limits.add_argument(
        "--max-in-flight-requests", type=int, default=ServingLimits.max_in_flight_requests,
        help="requests in progress over both transports before more get UNAVAILABLE / HTTP 503 "
             f"(default {ServingLimits.max_in_flight_requests})",
    )
    limits.add_argument(
        "--max-connections", type=int, default=ServingLimits.max_connections,
        help=f"open REST connections before more get HTTP 503 (default {ServingLimits.max_connections})",
    )
    serve.set_defaults(handler=serve_command)

    proxy = subparsers.add_parser(
        "log-proxy",
        help="forward TF Serving's REST and gRPC APIs to a TF Serving and log sampled predictions "
             "(serving.request_log; the sidecar of k8s/serving)",
    )
    add_config_args(proxy)
    proxy.add_argument("--rest-port", type=int, default=DEFAULT_REST_PORT, help="REST port (0: any free port)")
    proxy.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT, help="gRPC port (0: any free port)")
    proxy.add_argument("--host", default=DEFAULT_HOST, help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    proxy.add_argument("--upstream-rest", default=DEFAULT_UPSTREAM_REST, metavar="HOST:PORT",
                       help=f"TF Serving's REST port (default {DEFAULT_UPSTREAM_REST})")
    proxy.add_argument("--upstream-grpc", default=DEFAULT_UPSTREAM_GRPC, metavar="HOST:PORT",
                       help=f"TF Serving's gRPC port (default {DEFAULT_UPSTREAM_GRPC})")
    proxy.add_argument(
        "--max-request-bytes", type=int, default=ServingLimits.max_request_bytes,
        help=f"largest REST body or gRPC message forwarded (default {ServingLimits.max_request_bytes})",
    )
    proxy.set_defaults(handler=log_proxy_command)

    predict = subparsers.add_parser("predict", help="ask a TF Serving (real or local) for predictions")
    transport = predict.add_mutually_exclusive_group(required=True)
    transport.add_argument("--rest", metavar="URL", help="REST address, e.g. http://127.0.0.1:8501")
    transport.add_argument("--grpc", metavar="HOST:PORT", help="gRPC address, e.g. 127.0.0.1:8500")
    predict.add_argument("--model", required=True, help="model name")
    choice = predict.add_mutually_exclusive_group()
    choice.add_argument("--version", type=int, help="a version number (default: the latest)")
    choice.add_argument("--label", help="a version label, e.g. stable or canary")
    rows = predict.add_mutually_exclusive_group(required=True)
    rows.add_argument("--json", dest="json_rows", metavar="JSON", help="one row as a JSON object, or a list of them")
    rows.add_argument("--csv", metavar="FILE", help="CSV file with a header; one prediction per row")
    predict.add_argument("--signature-name", default="serving_default", help="signature to call")
    predict.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for each answer")
    predict.add_argument(
        "--rows-per-request", type=int, default=DEFAULT_MAX_BATCH_SIZE,
        help=f"more rows go as several requests (default {DEFAULT_MAX_BATCH_SIZE}, the server's default largest "
             "batch); lower it for a server with a smaller --max-batch-size",
    )
    predict.add_argument(
        "--drop-unknown-features", action="store_true",
        help="ignore keys the model does not take in --json rows (--csv always leaves such columns out, with a note)",
    )
    predict.add_argument(
        "--repository", metavar="DIR",
        help="the model repository the server serves (default: outputs/serving when it holds the model): --csv "
             "reads the answering version's data.missing_values and label column from its publication.json",
    )
    predict.set_defaults(handler=predict_command)


def serve_command(args: argparse.Namespace) -> int:
    one_model = args.model_base_path or args.model_name
    if args.model_config and one_model:
        return _usage_error("give either --model-config or --model-base-path with --model-name, not both")
    if not args.model_config and not (args.model_base_path and args.model_name):
        return _usage_error("give --model-config FILE, or --model-base-path DIR with --model-name NAME")
    if args.max_batch_size < 1:
        return _usage_error("--max-batch-size must be at least 1")
    if args.grpc_workers < 1:
        return _usage_error("--grpc-workers must be at least 1")
    if args.batching_parameters_file and not args.enable_batching:
        return _usage_error("--batching_parameters_file applies only with --enable_batching; add it")
    if args.max_num_load_retries < 0 or args.load_retry_interval_micros < 0:
        return _usage_error("--max_num_load_retries and --load_retry_interval_micros must not be negative")
    for flag, value in (("--max-request-bytes", args.max_request_bytes),
                        ("--max-in-flight-requests", args.max_in_flight_requests),
                        ("--max-connections", args.max_connections)):
        if value < 1:
            return _usage_error(f"{flag} must be at least 1")
    batching = None
    if args.enable_batching:
        from serving.server.batching import BatchingConfigError, BatchingParameters, read_batching_parameters

        try:
            batching = (read_batching_parameters(args.batching_parameters_file) if args.batching_parameters_file
                        else BatchingParameters())
        except BatchingConfigError as e:
            return _usage_error(str(e))
    limits = ServingLimits(
        max_request_bytes=args.max_request_bytes, max_in_flight_requests=args.max_in_flight_requests,
        max_in_flight_bytes=max(ServingLimits.max_in_flight_bytes, 4 * args.max_request_bytes),
        max_connections=args.max_connections,
    )

    try:
        request_log_settings, request_log_dir = _request_log_settings(args)
    except ValueError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options = dict(
        host=args.host, rest_port=args.rest_port, grpc_port=args.grpc_port, poll_seconds=args.poll_seconds,
        max_batch_size=args.max_batch_size, grpc_workers=args.grpc_workers, batching=batching, limits=limits,
        max_num_load_retries=args.max_num_load_retries, load_retry_interval_s=args.load_retry_interval_micros / 1e6,
    )
    # The handler is in place before the ports open (and so before the ready line): a SIGTERM from then on stops
    # the server cleanly instead of killing the process.
    stopped = threading.Event()
    previous_handler = signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        return _run_server(args, options, stopped, request_log_settings, request_log_dir)
    finally:
        if previous_handler is not None:  # None: installed outside Python, cannot be put back
            signal.signal(signal.SIGTERM, previous_handler)


def request_log_note(settings: RequestLogConfig, folder: str) -> str:
    """What a server says of its request logging when it starts (`mlops deploy local` reads it back)."""
    return (f"logging {settings.sampling_rate:g} of predictions under {folder}" if settings.enabled
            else "request logging off (serving.request_log.enabled)")


def _request_log_settings(args: argparse.Namespace) -> tuple[RequestLogConfig, str]:
    """The serving.request_log section of --config/--set, and the folder it writes to."""
    from settings.config import load_config

    config = load_config(args.config, args.overrides)
    return config.serving.request_log, config.request_log_dir


def _run_server(args: argparse.Namespace, options: dict, stopped: threading.Event,
                request_log_settings: RequestLogConfig, request_log_dir: str) -> int:
    from serving.repository.base import validate_model_name
    from serving.server.model_server import ModelServer
    from serving.server.request_log import open_request_logger

    options = {**options, "request_logger": open_request_logger(request_log_settings, request_log_dir)}
    try:
        if args.model_config:
            if not Path(args.model_config).is_file():
                return _usage_error(f"model config {args.model_config} does not exist")
            server = ModelServer(config_path=args.model_config, **options)
        else:
            validate_model_name(args.model_name)
            server = ModelServer.for_model(args.model_name, args.model_base_path, **options)
        problems = server.start()
    except OSError as e:
        print(f"error: cannot open the server ports: {e}", file=sys.stderr)
        return 1
    try:
        for problem in problems:
            print(f"warning: {problem}", file=sys.stderr)
        # One write: whoever waits for the first line (`mlops deploy local`) finds the logging note with it.
        print(f"serving REST on {server.rest_url} and gRPC on {server.grpc_target} (Ctrl-C to stop)\n"
              f"{request_log_note(request_log_settings, request_log_dir)}", flush=True)
        while not stopped.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    print("server stopped", flush=True)
    return 0


def log_proxy_command(args: argparse.Namespace) -> int:
    if args.max_request_bytes < 1:
        return _usage_error("--max-request-bytes must be at least 1")
    try:
        request_log_settings, request_log_dir = _request_log_settings(args)
    except ValueError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from serving.server.log_proxy import LogProxy
    from serving.server.request_log import open_request_logger

    try:
        proxy = LogProxy(args.upstream_rest, args.upstream_grpc, args.host, args.rest_port, args.grpc_port,
                         open_request_logger(request_log_settings, request_log_dir),
                         ServingLimits(max_request_bytes=args.max_request_bytes))
    except ValueError as e:
        return _usage_error(str(e))
    stopped = threading.Event()
    previous_handler = signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        try:
            proxy.start()
        except OSError as e:
            print(f"error: cannot open the proxy's ports: {e}", file=sys.stderr)
            return 1
        logging_note = request_log_note(request_log_settings, request_log_dir)
        print(f"proxying REST on {proxy.rest_url} to {args.upstream_rest} and gRPC on {proxy.grpc_target} to "
              f"{args.upstream_grpc}, {logging_note} (Ctrl-C to stop)", flush=True)
        while not stopped.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)
    print("proxy stopped", flush=True)
    return 0


def read_rows(json_rows: str | None, csv_path: str | None) -> list[dict]:
    """The rows given on the command line: a JSON object or list, or a CSV file with a header."""
    return read_rows_and_lines(json_rows, csv_path)[0]


def read_rows_and_lines(json_rows: str | None, csv_path: str | None) -> tuple[list[dict], list[int]]:
    """read_rows, with the CSV line each row starts on (none for --json)."""
    if json_rows is not None:
        try:
            parsed = json.loads(json_rows)
        except json.JSONDecodeError as e:
            raise ValueError(f"--json is not valid JSON ({e}); pass an object like '{{\"fare\": 12.5}}'.") from e
        rows = [parsed] if isinstance(parsed, dict) else parsed
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError("--json must be a JSON object or a list of objects, one per row.")
        return rows, []
    path = Path(csv_path)
    if not path.is_file():
        raise ValueError(f"CSV file {path} does not exist.")
    try:
        return _read_csv_rows(path)
    except UnicodeDecodeError as e:
        # As init and run say it (pipeline.data.check_csv_folder): the file's name and what to do.
        raise ValueError(f"CSV file {path} cannot be read as UTF-8 CSV ({e}); re-export it as UTF-8 CSV.") from None


def _read_csv_rows(path: Path) -> tuple[list[dict], list[int]]:
    rows, lines = [], []
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = parse_header(next(reader, []), str(path))
        started = reader.line_num + 1
        for cells in reader:
            if not cells:
                started = reader.line_num + 1
                continue
            if len(cells) > header.fields:
                raise ValueError(f"CSV file {path} line {reader.line_num} has {len(cells)} fields but the header "
                                 f"names {header.fields}; fix that row or the header.")
            # A short row's last columns are empty, as csv.DictReader reads them.
            values = header.cells(cells) + [""] * (header.fields - len(cells))
            rows.append(dict(zip(header.names, values, strict=False)))
            # A quoted cell can span lines: the row starts where the previous one ended.
            lines.append(started)
            started = reader.line_num + 1
    return rows, lines


def read_request_record(repository: str | None, model: str, version: int) -> dict:
    """The `request` record of a published version (its data.missing_values and label columns), from
    publication.json in `repository` (outputs/serving when None and it holds the model); empty when not found."""
    from serving.repository.factory import open_repository

    base = repository or "outputs/serving"
    if repository is None and not (Path(base) / model).is_dir():
        return {}
    try:
        record = open_repository(base).publication(model, version).get("request")
    except (OSError, ValueError):
        return {}
    return dict(record) if isinstance(record, dict) else {}


def missing_value_markers(request: dict) -> set[str]:
    """The version's data.missing_values as the cells that hold them read, surrounding spaces ignored."""
    return {str(m).strip() for m in request.get("missing_values") or [] if str(m).strip()}


def blank_json_markers(rows: list[dict], request: dict) -> list[dict]:
    """--json rows with each string value that is one of the version's missing-value markers ("NA") sent as the
    empty value, the gap ExampleGen made of it in training; numbers (-999) the model's signature reads itself."""
    markers = missing_value_markers(request)
    return [{name: "" if isinstance(value, str) and value.strip() in markers else value
             for name, value in row.items()} for row in rows]


def prepare_csv_rows(rows: list[dict], lines: list[int], path: str, inputs: dict, request: dict,
                     ) -> tuple[list[dict], list[str]]:
    """CSV rows as the model takes them, and notes for the user: columns the model does not take are left out (a
    label named as such), cells holding the version's missing-value markers become empty, and a value the model
    cannot take is refused with its line, row and column (ValueError)."""
    from serving.clients import InvalidInputError, convert_value

    notes = []
    header = list(rows[0]) if rows else []
    labels = [c for c in header if c in (request.get("label_columns") or [])]
    others = [c for c in header if c not in inputs and c not in labels]
    if labels:
        notes.append(f"left out the label column{'s' * (len(labels) > 1)} {', '.join(labels)} of {path}: the "
                     "model predicts it")
    if others:
        notes.append(f"left out column{'s' * (len(others) > 1)} {', '.join(others)} of {path}: the model does not "
                     "take them")
    markers = missing_value_markers(request)
    prepared = []
    for index, (row, line) in enumerate(zip(rows, lines, strict=True)):
        kept = {name: ("" if str(value).strip() in markers else value) for name, value in row.items()
                if name in inputs}
        for name, spec in inputs.items():
            try:
                convert_value(kept.get(name), spec.dtype, name)
            except InvalidInputError:
                if markers:
                    hint = f"this version reads {', '.join(repr(m) for m in sorted(markers))} as missing"
                elif "missing_values" in request:
                    hint = "this version reads only empty cells as missing: its data.missing_values list is empty"
                else:
                    hint = ("no data.missing_values of this version were found (pass --repository with the model "
                            "repository to apply them)")
                raise ValueError(f"{path} line {line} (row {index + 1}), column {name!r}: {kept[name]!r} is not a "
                                 f"{spec.dtype} value; fix the cell or leave it empty for missing ({hint}).") from None
        prepared.append(kept)
    return prepared, notes


def predict_command(args: argparse.Namespace) -> int:
    from serving.clients import ServingError, connect, format_prediction

    try:
        rows, lines = read_rows_and_lines(args.json_rows, args.csv)
    except ValueError as e:
        return _usage_error(str(e))
    try:
        with connect(rest=args.rest, grpc=args.grpc) as client:
            if args.csv is not None or not args.drop_unknown_features:
                metadata = client.metadata(args.model, args.version, args.label, args.timeout)
                signature = metadata.signatures.get(args.signature_name)
                inputs = signature.inputs if signature is not None else None
                if inputs is not None and args.csv is not None:
                    rows, notes = prepare_csv_rows(rows, lines, args.csv, inputs,
                                                   read_request_record(args.repository, args.model, metadata.version))
                    for note in notes:
                        print(f"note: {note}", file=sys.stderr)
                elif inputs is not None:
                    _check_known_keys(rows, inputs)
                    rows = blank_json_markers(rows, read_request_record(args.repository, args.model,
                                                                        metadata.version))
            predictions = client.predict_outputs(
                rows, args.model, version=args.version, label=args.label, timeout=args.timeout,
                signature_name=args.signature_name, drop_unknown_features=args.drop_unknown_features,
                rows_per_request=args.rows_per_request,
            )
    except ValueError as e:
        return _usage_error(str(e))
    except ServingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    # One line per row: the probability (binary), the value (regression), or the class and each class's probability.
    for outputs in predictions:
        print(format_prediction(outputs))
    return 0


def _check_known_keys(rows: list[dict], inputs: dict) -> None:
    """--json rows: a key the model does not take is an error that names the flag that leaves it out."""
    for index, row in enumerate(rows):
        # A CSV column's own name goes to the input it became (the client maps it, serving/clients/values.py).
        unknown = sorted(key for key in row if key not in inputs and feature_name(key) not in inputs)
        if unknown:
            raise ValueError(f"--json row {index + 1} has keys the model does not take: {', '.join(unknown)}; its "
                             f"inputs are {', '.join(sorted(inputs))} (drop those keys, or pass "
                             "--drop-unknown-features).")


def _usage_error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Runs `serve`, `log-proxy` or `predict` without the rest of `mlops` (used by the benchmark and tests)."""
    parser = argparse.ArgumentParser(prog="python -m serving.cli")
    register(parser.add_subparsers(dest="command", required=True), arguments.add_config_args)
    args = parser.parse_args(argv)
    return arguments.run_command(args)


if __name__ == "__main__":
    sys.exit(main())
