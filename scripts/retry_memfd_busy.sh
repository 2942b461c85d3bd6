#!/usr/bin/env bash
# Runs a buildah command up to three times while it fails before its step starts: buildah re-executes itself from a
# sealed memfd copy (containers/storage pkg/unshare/unshare.c, copy_self_proc_exe), and the kernel refuses the seal
# with EBUSY while the copy's pages are still pinned, which a busy machine sometimes shows. With --layers a second
# `buildah bud` resumes from the layers the first one committed.
set -uo pipefail
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
for attempt in 1 2 3; do
  "$@" 2> >(tee "$errors" >&2)
  status=$?
  wait  # for tee, so that $errors is complete
  if [ "$status" -eq 0 ] || ! grep -q "sealing memfd copy: Device or resource busy" "$errors"; then
    exit "$status"
  fi
  [ "$attempt" -lt 3 ] && echo "retry_memfd_busy.sh: buildah's re-exec found its memfd copy busy; running it again" >&2
done
exit "$status"
