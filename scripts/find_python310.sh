#!/usr/bin/env bash
# Prints the path of a Python 3.10 interpreter, from PATH or ~/.pyenv; fails with what to install.
for candidate in "$(command -v python3.10 2>/dev/null)" "$HOME"/.pyenv/versions/3.10.*/bin/python; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] \
     && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null; then
    echo "$candidate"
    exit 0
  fi
done
echo "Python 3.10 was not found on PATH or under ~/.pyenv/versions/3.10.*: install it (for example 'pyenv install 3.10') and run make again." >&2
exit 1
