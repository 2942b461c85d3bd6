"""Opens the model repository at a base path: a local or mounted folder, or gs://bucket/path."""
from __future__ import annotations

from pathlib import Path

from serving.repository.base import GCS_SCHEME, RepositoryBase, check_repository_location
from serving.repository.local import ModelRepository


def open_repository(
    base_dir: str | Path, track: str | None = None, served_base_dir: str | None = None
) -> RepositoryBase:
    """The model repository at `base_dir`: a local folder, or gs://bucket/path (the object store TF Serving reads);
    with `track`, as that server track sees it (its own config file)."""
    base = check_repository_location(base_dir)
    if base.startswith(GCS_SCHEME):
        from serving.repository.gcs import GcsModelRepository

        repository_class: type = GcsModelRepository
    else:
        repository_class = ModelRepository
    if track is None:
        return repository_class(base, served_base_dir=served_base_dir)
    return repository_class.for_track(base, track, served_base_dir)
