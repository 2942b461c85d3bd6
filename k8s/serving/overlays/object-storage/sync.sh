#!/bin/sh
# Copies each committed version folder of the model from object storage once (versions never change), into a
# hidden staging folder, checks it against the remote, then renames it into place: TF Serving never sees half a
# version.
set -eu
remote="${REMOTE}/${MODEL_NAME}"
target="/models/${MODEL_NAME}"
mkdir -p "$target"
while true; do
  for version in $(rclone lsf --dirs-only "$remote" | tr -d /); do
    case "$version" in *[!0-9]*|"") continue ;; esac
    [ -d "$target/$version" ] && continue
    # Committed versions only: a publisher writes MANIFEST.json last (serving/gcs_repository.py).
    rclone lsf --files-only "$remote/$version" | grep -qx MANIFEST.json || continue
    staging="$target/.staging-$version"
    rm -rf "$staging"
    if rclone copy "$remote/$version" "$staging" && rclone check "$remote/$version" "$staging" --one-way; then
      mv "$staging" "$target/$version"
      echo "synced version $version"
    else
      rm -rf "$staging"
      echo "version $version: copy failed, retrying later" >&2
    fi
  done
  [ "${ONCE:-}" = "1" ] && exit 0
  sleep "${SYNC_SECONDS:-30}"
done
