#!/usr/bin/env bash
# Prints the path of a Python 3.10 interpreter: python3.10 on PATH, pyenv's, or one that uv manages (installed when
# there is none, where the network allows). Progress and errors go to stderr.
# uv comes from PATH or, when absent, from PyPI into $UV_BOOTSTRAP_DIR with any python3 (version $UV_VERSION).
set -u
UV_VERSION="${UV_VERSION:-0.13.9}"
BOOTSTRAP="${UV_BOOTSTRAP_DIR:-.uv-bootstrap}"

is_python310() {
  [ -n "$1" ] && [ -x "$1" ] && "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null
}

for candidate in "$(command -v python3.10 2>/dev/null)" "$HOME"/.pyenv/versions/3.10.*/bin/python; do
  if is_python310 "$candidate"; then
    echo "$candidate"
    exit 0
  fi
done

uv="$(command -v uv 2>/dev/null)"
if [ -z "$uv" ] && [ -x "$BOOTSTRAP/bin/uv" ]; then
  uv="$BOOTSTRAP/bin/uv"
fi
if [ -z "$uv" ] && python3="$(command -v python3 2>/dev/null)"; then
  echo "Python 3.10 not found; installing uv $UV_VERSION into $BOOTSTRAP to get one" >&2
  if "$python3" -m venv "$BOOTSTRAP" >&2 && "$BOOTSTRAP/bin/pip" install -q "uv==$UV_VERSION" >&2 \
     && [ -x "$BOOTSTRAP/bin/uv" ]; then
    uv="$BOOTSTRAP/bin/uv"
  fi
fi
if [ -n "$uv" ]; then
  managed="$("$uv" python find 3.10 2>/dev/null)"
  if ! is_python310 "$managed"; then
    echo "installing a uv-managed Python 3.10 with $uv" >&2
    "$uv" python install 3.10 >&2 && managed="$("$uv" python find 3.10 2>/dev/null)"
  fi
  if is_python310 "$managed"; then
    echo "$managed"
    exit 0
  fi
fi
echo "Python 3.10 was not found on PATH or under ~/.pyenv/versions/3.10.*, and uv could not install one (it needs" \
  "python3 or uv on PATH and access to PyPI and GitHub): install Python 3.10 (for example 'uv python install 3.10'" \
  "or 'pyenv install 3.10') and run make again." >&2
exit 1
