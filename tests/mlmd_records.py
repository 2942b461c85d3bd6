"""ML Metadata records laid out the way TFX's runners write them, for tests of what reads them back.

Per run a `pipeline_run` context, per node a `node` context named `<pipeline>.<node>`, the `pipeline` context, and
each execution associated with all three, its outputs linked by OUTPUT events whose path names the output key. A
cached execution links the artifacts it reuses the same way.
"""
from __future__ import annotations

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2 as pb

Execution = pb.Execution


class Recorder:
    def __init__(self, path: str, pipeline: str = "taxi"):
        config = pb.ConnectionConfig()
        config.sqlite.filename_uri = path
        config.sqlite.connection_mode = pb.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
        self.store = metadata_store.MetadataStore(config)
        self.pipeline = pipeline
        self._context_types = {name: self.store.put_context_type(pb.ContextType(name=name))
                               for name in ("pipeline", "pipeline_run", "node")}
        self._pipeline_context = self._context("pipeline", pipeline)
        self._clock = 1_000_000

    def _context(self, kind: str, name: str) -> pb.Context:
        found = self.store.get_context_by_type_and_name(kind, name)
        if found is not None:
            return found
        [context_id] = self.store.put_contexts([pb.Context(type_id=self._context_types[kind], name=name)])
        [context] = self.store.get_contexts_by_id([context_id])
        return context

    def run(self, run_id: str) -> pb.Context:
        return self._context("pipeline_run", run_id)

    def artifact(self, type_name: str, uri: str, split_names: str | None = None,
                 custom: dict[str, int] | None = None) -> pb.Artifact:
        properties = {"split_names": pb.STRING} if type_name == "Examples" else {}
        type_id = self.store.put_artifact_type(pb.ArtifactType(name=type_name, properties=properties),
                                               can_add_fields=True)
        artifact = pb.Artifact(type_id=type_id, uri=uri, state=pb.Artifact.LIVE)
        if split_names is not None:
            artifact.properties["split_names"].string_value = split_names
        for key, value in (custom or {}).items():
            artifact.custom_properties[key].int_value = value
        [artifact.id] = self.store.put_artifacts([artifact])
        return artifact

    def execution(self, run: pb.Context, node: str, state: int = Execution.COMPLETE,
                  outputs: dict[str, list[pb.Artifact]] | None = None, seconds: float = 1.0) -> int:
        """Records one execution of `node` in `run` that wrote (or, cached, reused) `outputs`."""
        type_id = self.store.put_execution_type(pb.ExecutionType(name=f"tfx.{node}"))
        started = self._clock
        self._clock += int(seconds * 1000) + 1000
        execution = pb.Execution(type_id=type_id, last_known_state=state, create_time_since_epoch=started,
                                 last_update_time_since_epoch=started + int(seconds * 1000))
        events = []
        for key, artifacts in (outputs or {}).items():
            for index, artifact in enumerate(artifacts):
                event = pb.Event(type=pb.Event.OUTPUT)
                event.path.steps.add().key = key
                event.path.steps.add().index = index
                events.append((artifact, event))
        contexts = [self._pipeline_context, run, self._context("node", f"{self.pipeline}.{node}")]
        execution_id, _, _ = self.store.put_execution(execution, events, contexts, reuse_context_if_already_exist=True)
        return execution_id

    def set_state(self, execution_id: int, state: int, seconds: float) -> None:
        [execution] = self.store.get_executions_by_id([execution_id])
        execution.last_known_state = state
        execution.last_update_time_since_epoch = execution.create_time_since_epoch + int(seconds * 1000)
        self.store.put_executions([execution])
