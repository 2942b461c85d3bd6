"""What runs recorded in ML Metadata: the one module that queries it, through MLMD's public API.

TFX records, per run, a `pipeline_run` context; per component, a `node` context named `<pipeline>.<node id>`; and
for each execution of a node the artifacts it read and wrote (events), whether it ran or was served from the cache.
Everything the command line and the run summary want to know about past runs (the latest run and its outputs, the
latest Transform output, the eval split, the stages of a run in progress) is read here, never from folder names.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

Execution = metadata_store_pb2.Execution
PIPELINE_CONTEXT = "pipeline"
RUN_CONTEXT = "pipeline_run"
NODE_CONTEXT = "node"
FINISHED = (Execution.COMPLETE, Execution.CACHED)
OUTPUT_EVENTS = (metadata_store_pb2.Event.OUTPUT, metadata_store_pb2.Event.DECLARED_OUTPUT)


class NoRecordError(LookupError):
    """ML Metadata holds nothing of what was asked for; the message says which run to make first."""


@dataclass(frozen=True)
class Output:
    """One artifact a node wrote (or reused from the cache) in a run."""

    node: str
    key: str
    type_name: str
    artifact: metadata_store_pb2.Artifact


@dataclass(frozen=True)
class NodeExecution:
    """One execution of a node: its state and its MLMD time stamps (milliseconds since the epoch)."""

    node: str
    execution_id: int
    state: int
    started_ms: int
    updated_ms: int

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    @property
    def cached(self) -> bool:
        return self.state == Execution.CACHED

    @property
    def failed(self) -> bool:
        return self.state in (Execution.FAILED, Execution.CANCELED)

    @property
    def seconds(self) -> float:
        return max(0.0, (self.updated_ms - self.started_ms) / 1000.0)


def connect(metadata_path: str) -> metadata_store.MetadataStore:
    """A read-only connection to the SQLite database at `metadata_path`; NoRecordError if there is none yet."""
    if not os.path.isfile(metadata_path):
        raise NoRecordError(f"no ML Metadata database at {metadata_path}; run the pipeline first (mlops run).")
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = metadata_path
    config.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READONLY
    return metadata_store.MetadataStore(config)


def _pipeline_execution_ids(store: metadata_store.MetadataStore, pipeline_name: str) -> set[int]:
    pipeline = store.get_context_by_type_and_name(PIPELINE_CONTEXT, pipeline_name)
    if pipeline is None:
        return set()
    return {e.id for e in store.get_executions_by_context(pipeline.id)}


def runs(store: metadata_store.MetadataStore, pipeline_name: str) -> list[metadata_store_pb2.Context]:
    """The run contexts of `pipeline_name`, oldest first."""
    in_pipeline = _pipeline_execution_ids(store, pipeline_name)
    found = []
    for run in store.get_contexts_by_type(RUN_CONTEXT):
        if any(e.id in in_pipeline for e in store.get_executions_by_context(run.id)):
            found.append(run)
    return sorted(found, key=lambda c: (c.create_time_since_epoch, c.id))


def latest_run(store: metadata_store.MetadataStore, pipeline_name: str) -> metadata_store_pb2.Context:
    found = runs(store, pipeline_name)
    if not found:
        raise NoRecordError(f"no run of pipeline '{pipeline_name}' is recorded; run it first (mlops run).")
    return found[-1]


def _node_names(store: metadata_store.MetadataStore, execution_ids: list[int], pipeline_name: str) -> dict[int, str]:
    node_type = store.get_context_type(NODE_CONTEXT)
    prefix = f"{pipeline_name}."
    names = {}
    for execution_id in execution_ids:
        for context in store.get_contexts_by_execution(execution_id):
            if context.type_id == node_type.id and context.name.startswith(prefix):
                names[execution_id] = context.name[len(prefix):]
    return names


def run_executions(store: metadata_store.MetadataStore, run: metadata_store_pb2.Context,
                   pipeline_name: str) -> list[NodeExecution]:
    """Every execution of a run, in the order they started."""
    executions = sorted(store.get_executions_by_context(run.id), key=lambda e: (e.create_time_since_epoch, e.id))
    nodes = _node_names(store, [e.id for e in executions], pipeline_name)
    return [NodeExecution(nodes.get(e.id, ""), e.id, e.last_known_state, e.create_time_since_epoch,
                          e.last_update_time_since_epoch) for e in executions]


def _outputs(store: metadata_store.MetadataStore, executions: list[metadata_store_pb2.Execution],
             pipeline_name: str) -> list[Output]:
    if not executions:
        return []
    nodes = _node_names(store, [e.id for e in executions], pipeline_name)
    events = [e for e in store.get_events_by_execution_ids([e.id for e in executions]) if e.type in OUTPUT_EVENTS]
    artifacts = {a.id: a for a in store.get_artifacts_by_id([e.artifact_id for e in events])}
    types = {t.id: t.name for t in store.get_artifact_types()}
    found = []
    for event in events:
        artifact = artifacts.get(event.artifact_id)
        key = event.path.steps[0].key if event.path.steps else ""
        if artifact is not None:
            found.append(Output(nodes.get(event.execution_id, ""), key, types.get(artifact.type_id, ""), artifact))
    return found


def run_outputs(store: metadata_store.MetadataStore, run: metadata_store_pb2.Context,
                pipeline_name: str) -> list[Output]:
    """The artifacts every finished execution of `run` wrote or reused."""
    executions = [e for e in store.get_executions_by_context(run.id) if e.last_known_state in FINISHED]
    return _outputs(store, executions, pipeline_name)


def latest_outputs(store: metadata_store.MetadataStore, pipeline_name: str,
                   node: str) -> dict[str, metadata_store_pb2.Artifact]:
    """Output key -> artifact of the newest finished execution of `node` (a node id such as "Transform")."""
    node_context = store.get_context_by_type_and_name(NODE_CONTEXT, f"{pipeline_name}.{node}")
    if node_context is None:
        raise NoRecordError(f"pipeline '{pipeline_name}' has never run {node}; run the pipeline first (mlops run).")
    executions = [e for e in store.get_executions_by_context(node_context.id) if e.last_known_state in FINISHED]
    if not executions:
        raise NoRecordError(f"no run of pipeline '{pipeline_name}' finished {node}; run the pipeline first "
                            "(mlops run).")
    latest = max(executions, key=lambda e: (e.create_time_since_epoch, e.id))
    return {output.key: output.artifact for output in _outputs(store, [latest], pipeline_name)}


def latest_split(store: metadata_store.MetadataStore, pipeline_name: str, node: str, key: str, split: str) -> str:
    """The folder of one split of the newest `node` output `key` (for example CsvExampleGen's eval examples)."""
    from components import artifacts

    outputs = latest_outputs(store, pipeline_name, node)
    if key not in outputs:
        raise NoRecordError(f"{node} of pipeline '{pipeline_name}' recorded no '{key}' output.")
    artifact = outputs[key]
    names = json.loads(artifact.properties["split_names"].string_value or "[]") \
        if "split_names" in artifact.properties else []
    if split not in names:
        raise NoRecordError(f"{node}'s {key} ({artifact.uri}) has no '{split}' split, only {', '.join(names)}.")
    return artifacts.split_uri(artifact.uri, split)
