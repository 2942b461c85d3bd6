"""k8s/serving/overlays/object-storage/sync.sh, run with a stand-in for rclone over a folder standing for the bucket
(rclone's `lsf --dirs-only` lists folders with a trailing `/`, `lsf --files-only` files, `copy` copies a folder's
files, `check --one-way` fails when a source file is missing or differs, and every command exits non-zero on an
error, as rclone 1.68 does): committed versions are copied, a failing listing is an error and not "no versions",
and versions the track does not serve are pruned but for the newest."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SYNC = REPO / "k8s/serving/overlays/object-storage/sync.sh"
FAKE_RCLONE = r"""#!/bin/sh
# models:<path> is $BUCKET/<path>.
[ -n "${RCLONE_FAIL:-}" ] && { echo "Failed to lsf: 403 Forbidden" >&2; exit 3; }
path() { echo "$BUCKET/${1#models:}"; }
case "$1" in
  lsf)
    kind="$2"; dir=$(path "$3")
    [ -d "$dir" ] || { echo "directory not found" >&2; exit 3; }
    for entry in $(ls -A "$dir"); do
      if [ -d "$dir/$entry" ]; then [ "$kind" = "--dirs-only" ] && echo "$entry/"
      else [ "$kind" = "--files-only" ] && echo "$entry"; fi
    done ;;
  copy) mkdir -p "$3" && cp -R "$(path "$2")/." "$3/" ;;
  check) diff -r "$(path "$2")" "$3" >/dev/null ;;
  *) exit 2 ;;
esac
"""


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    tools = tmp_path / "bin"
    tools.mkdir(exist_ok=True)
    (tools / "rclone").write_text(FAKE_RCLONE)
    (tools / "rclone").chmod(0o755)
    environment = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "BUCKET": str(tmp_path / "bucket"),
                   "REMOTE": "models:serving", "MODEL_NAME": "taxi", "TARGET_ROOT": str(tmp_path / "models"),
                   "ONCE": "1", **env}
    return subprocess.run(["/bin/sh", str(SYNC)], env=environment, capture_output=True, text=True, timeout=60)


def publish(tmp_path: Path, version: int, committed: bool = True) -> None:
    folder = tmp_path / "bucket/serving/taxi" / str(version)
    folder.mkdir(parents=True)
    (folder / "saved_model.pb").write_text(f"model {version}")
    if committed:
        (folder / "MANIFEST.json").write_text("{}")


def local_versions(tmp_path: Path) -> list[str]:
    return sorted(os.listdir(tmp_path / "models/taxi"))


def test_committed_versions_are_copied_and_uncommitted_ones_wait(tmp_path):
    publish(tmp_path, 1)
    publish(tmp_path, 2, committed=False)
    result = run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert local_versions(tmp_path) == ["1"]
    assert (tmp_path / "models/taxi/1/saved_model.pb").read_text() == "model 1"


def test_a_failing_listing_is_an_error_not_an_empty_bucket(tmp_path):
    publish(tmp_path, 1)
    result = run(tmp_path, RCLONE_FAIL="1")
    assert result.returncode != 0 and "listing models:serving/taxi failed" in result.stderr
    assert local_versions(tmp_path) == []


def test_versions_the_track_does_not_serve_are_pruned_but_the_newest_stay(tmp_path):
    for version in range(1, 7):
        publish(tmp_path, version)
    config = tmp_path / "models.config"
    config.write_text('model_config_list {\n  config {\n    name: "taxi"\n    model_version_policy {\n'
                      "      specific {\n        versions: 2\n      }\n    }\n  }\n}\n")
    result = run(tmp_path, MODELS_CONFIG=str(config), KEEP="2")
    assert result.returncode == 0, result.stderr
    # Served: 2. Newest two: 5 and 6. Versions 1, 3 and 4 would fill the emptyDir until the pod is evicted.
    assert local_versions(tmp_path) == ["2", "5", "6"]
    # Run again: nothing pruned comes back.
    assert run(tmp_path, MODELS_CONFIG=str(config), KEEP="2").returncode == 0
    assert local_versions(tmp_path) == ["2", "5", "6"]
    # A config that names nothing (being rewritten) prunes nothing; the newest still arrives.
    config.write_text("")
    publish(tmp_path, 7)
    assert run(tmp_path, MODELS_CONFIG=str(config), KEEP="1").returncode == 0
    assert local_versions(tmp_path) == ["2", "5", "6", "7"]
