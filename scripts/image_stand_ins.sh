#!/usr/bin/env bash
# Stand-ins for the registry's python:3.10-slim-bookworm and node:20-bookworm-slim in buildah's local storage, for
# machines that reach no container registry: Debian bookworm (minbase, from Debian's packages, by mmdebstrap) with
# this machine's Python 3.10 and Node.js 20 in /usr/local, where the registry's images have theirs. `make image-test`
# builds the unchanged Dockerfile on them; each image is rebuilt only when its inputs' hash (a label) changes.
#   scripts/image_stand_ins.sh PYTHON NODE    e.g. ~/.pyenv/versions/3.10.13/bin/python3.10 /usr/bin/node
set -euo pipefail

PYTHON_IMAGE=docker.io/library/python:3.10-slim-bookworm
NODE_IMAGE=docker.io/library/node:20-bookworm-slim
LABEL=io.tfx-mlops.stand-in
# The packages a slim image keeps besides minbase; the libraries Python's and Node.js's binaries link to are added.
SLIM_PACKAGES=(ca-certificates netbase tzdata)
# This machine's trust store replaces Debian's, so that builds behind a TLS-inspecting proxy reach PyPI and npm.
HOST_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
# The three suites the registry's bookworm images list, so that apt-get in a build sees the same packages.
DEBIAN_SOURCES=("deb http://deb.debian.org/debian bookworm main" "deb http://deb.debian.org/debian bookworm-updates main"
  "deb http://deb.debian.org/debian-security bookworm-security main")
BASE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

if [ $# -ne 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
  echo "usage: $0 PYTHON3.10 NODE (both executables); 'make image-test' passes the ones 'make setup' uses." >&2
  exit 2
fi
python=$1
node=$(readlink -f "$2")
python_prefix=$("$python" -c 'import sys; print(sys.base_prefix)')
python_version=$("$python" -c 'import platform; print(platform.python_version())')
node_version=$("$node" --version)
npm_dir=$(dirname "$(readlink -f "$(dirname "$2")/npm")")/..
npm_dir=$(readlink -f "$npm_dir")
[ -f "$npm_dir/package.json" ] || { echo "npm is not next to $2: install Node.js 20 with its npm." >&2; exit 2; }
for tool in buildah mmdebstrap dpkg; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: run 'sudo make image-deps' (Debian)." >&2; exit 2; }
done

# The Debian packages that hold the shared libraries the given binaries load (from outside the copied tree).
library_packages() {
  local tree=$1; shift
  local library
  ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | { grep -v "^$tree/" || true; } | sort -u \
    | while read -r library; do
        # By file name: with merged /usr, dpkg knows a library under one of its two paths only.
        dpkg -S "*/$(basename "$library")" | cut -d: -f1 | tr ', ' '\n\n'
      done | grep -v '^$' | sort -u
}

inputs_hash() {
  { cat "$0"; printf '%s\n' "$@"; [ -f "$HOST_CA_BUNDLE" ] && cat "$HOST_CA_BUNDLE"; } | sha256sum | cut -c1-16
}

current_hash() {
  buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$LABEL.inputs\"}}" "$1" 2>/dev/null || true
}

# Debian bookworm minbase plus PACKAGES, then COPY_HOOK (a shell command on the root file system "$1"), committed
# as IMAGE with CONFIG (buildah config flags).
assemble() {
  local image=$1 hash=$2 packages=$3 copy_hook=$4; shift 4
  local container mount
  container=$(buildah from scratch)
  mount=$(buildah mount "$container")
  mmdebstrap --quiet --variant=minbase --include="$packages" --customize-hook="$copy_hook" \
    --customize-hook="[ ! -f $HOST_CA_BUNDLE ] || cp $HOST_CA_BUNDLE \"\$1$HOST_CA_BUNDLE\"" \
    bookworm "$mount" "${DEBIAN_SOURCES[@]}"
  buildah umount "$container" >/dev/null
  buildah config --label "$LABEL=stand-in for the registry's image, assembled by scripts/image_stand_ins.sh" \
    --label "$LABEL.inputs=$hash" --env PATH="$BASE_PATH" --env LANG=C.UTF-8 "$@" "$container"
  buildah commit --quiet --rm "$container" "$image" >/dev/null
  echo "built $image (stand-in, inputs $hash)"
}

# The Python tree without what the official image deletes (tests, bytecode, the static libpython) and without its
# site-packages (ensurepip puts pip and setuptools back); shebangs point at /usr/local; ld.so.cache finds libpython.
python_hook="tar -C '$python_prefix' -c --exclude=./lib/python3.10/site-packages --exclude=test --exclude=tests \
--exclude=idle_test --exclude=__pycache__ --exclude='libpython*.a' --exclude='./bin/pip*' . \
| tar -C \"\$1/usr/local\" -x --no-same-owner \
&& mkdir -p \"\$1/usr/local/lib/python3.10/site-packages\" \
&& grep -Il '^#!$python_prefix/bin/' \"\$1\"/usr/local/bin/* | xargs -r sed -i '1s|^#!$python_prefix/bin/|#!/usr/local/bin/|' \
&& chroot \"\$1\" ldconfig && chroot \"\$1\" /usr/local/bin/python3 -m ensurepip --default-pip >/dev/null \
&& chroot \"\$1\" /usr/local/bin/python3 -c 'import ssl, sqlite3, ctypes, lzma, bz2, zlib, uuid, venv'"

node_hook="install -m 0755 '$node' \"\$1/usr/local/bin/node\" && mkdir -p \"\$1/usr/local/lib/node_modules\" \
&& cp -a '$npm_dir' \"\$1/usr/local/lib/node_modules/npm\" \
&& ln -s ../lib/node_modules/npm/bin/npm-cli.js \"\$1/usr/local/bin/npm\" \
&& ln -s ../lib/node_modules/npm/bin/npx-cli.js \"\$1/usr/local/bin/npx\" \
&& chroot \"\$1\" /usr/local/bin/npm --version >/dev/null"

# Without Tk's libraries (and X11's under them): a slim image runs no GUI.
python_libraries=$(library_packages "$python_prefix" "$python_prefix"/bin/python3.10 \
  $(ls "$python_prefix"/lib/python3.10/lib-dynload/*.so | grep -v /_tkinter))
python_packages=$(printf '%s\n' "${SLIM_PACKAGES[@]}" $python_libraries | sort -u | paste -sd,)
python_hash=$(inputs_hash "$python_prefix" "$python_version" "$python_packages" \
  "$(sha256sum "$python_prefix"/bin/python3.10 "$python_prefix"/lib/libpython3.10.so.1.0)")
if [ "$(current_hash "$PYTHON_IMAGE")" = "$python_hash" ]; then
  echo "$PYTHON_IMAGE: stand-in up to date (inputs $python_hash)"
else
  assemble "$PYTHON_IMAGE" "$python_hash" "$python_packages" "$python_hook" \
    --env PYTHON_VERSION="$python_version" --env SSL_CERT_FILE="$HOST_CA_BUNDLE" --env PIP_CERT="$HOST_CA_BUNDLE" \
    --cmd python3
fi

node_packages=$(printf '%s\n' "${SLIM_PACKAGES[@]}" $(library_packages /nonexistent "$node") | sort -u | paste -sd,)
node_hash=$(inputs_hash "$node" "$node_version" "$npm_dir" "$node_packages" "$(sha256sum "$node")" \
  "$(cat "$npm_dir/package.json")")
if [ "$(current_hash "$NODE_IMAGE")" = "$node_hash" ]; then
  echo "$NODE_IMAGE: stand-in up to date (inputs $node_hash)"
else
  assemble "$NODE_IMAGE" "$node_hash" "$node_packages" "$node_hook" \
    --env NODE_VERSION="${node_version#v}" --env NODE_EXTRA_CA_CERTS="$HOST_CA_BUNDLE" --cmd node
fi
