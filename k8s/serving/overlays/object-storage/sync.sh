#!/bin/sh
# Copies the version folders of the model the server needs from object storage (versions never change), each into
# a hidden staging folder, checked against the remote, then renamed into place: TF Serving never sees half a version.
# Needed: the versions the track's models.config ($MODELS_CONFIG) names, and the newest $KEEP committed ones (a
# candidate about to be loaded, a previous version kept for a rollback); other versions are removed, so the
# emptyDir never fills up. A listing that fails is an error, never "no versions": the init container (ONCE=1) exits
# non-zero so the pod does not start without its versions, and the sidecar retries.
set -eu
remote="${REMOTE}/${MODEL_NAME}"
target="${TARGET_ROOT:-/models}/${MODEL_NAME}"
keep="${KEEP:-3}"
mkdir -p "$target"

committed() {
  # A publisher writes MANIFEST.json last (serving/repository/gcs.py).
  rclone lsf --files-only "$remote/$1" | grep -qx MANIFEST.json
}

served_versions() {
  [ -f "${MODELS_CONFIG:-}" ] || return 0
  sed -n 's/^[[:space:]]*versions:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$MODELS_CONFIG"
}

sync_once() {
  listing=$(rclone lsf --dirs-only "$remote") || return 1
  remote_versions=$(echo "$listing" | tr -d / | grep -E '^[0-9]+$' | sort -rn || true)
  newest=""
  count=0
  for version in $remote_versions; do
    [ "$count" -ge "$keep" ] && break
    committed "$version" || continue
    newest="$newest $version"
    count=$((count + 1))
  done
  served=$(served_versions | tr '\n' ' ')
  wanted=" $served $newest "
  for version in $wanted; do
    [ -d "$target/$version" ] && continue
    echo "$remote_versions" | grep -qx "$version" || { echo "version $version is not in $remote" >&2; continue; }
    committed "$version" || continue
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
  # Prune only against a config that names versions (a config being rewritten, or none, prunes nothing).
  [ -n "$(echo "$served" | tr -d ' ')" ] || return 0
  for version in $(ls "$target" | grep -E '^[0-9]+$' || true); do
    case "$wanted" in *" $version "*) continue ;; esac
    mv "$target/$version" "$target/.pruning-$version" && rm -rf "$target/.pruning-$version"
    echo "pruned version $version (not served, not among the newest $keep)"
  done
}

while true; do
  if ! sync_once; then
    echo "listing $remote failed; nothing synced or pruned" >&2
    [ "${ONCE:-}" = "1" ] && exit 1
  fi
  [ "${ONCE:-}" = "1" ] && exit 0
  sleep "${SYNC_SECONDS:-30}"
done
