#!/usr/bin/env bash
# `make image`: build dlscale's container image with podman (or docker) on a host that reaches
# Debian's mirror and PyPI but no image registry. Steps, each skipped when its output exists:
#   1. base: a minimal Debian bookworm root file system (debootstrap; python3, venv, CA
#      certificates), imported as localhost/dlscale-base:bookworm;
#   2. wheels: dlscale and every pinned dependency as wheels (torch: the local CPU wheel, as the
#      Makefile installs it), into build/image/wheels;
#   3. the image, from docker/Dockerfile, with no network during the build.
# The quirks of restricted hosts are encoded, not in prose: podman gets `--runtime runc` and
# explicit open-file and process limits no higher than this host allows (runc fails to set its
# defaults here), from the one place the service's container executor takes them too
# (src/dlscale/service/container.py).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${IMAGE:-dlscale:$(.venv/bin/python -c 'import dlscale; print(dlscale.__version__)')}"
BASE="localhost/dlscale-base:bookworm"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CONTEXT=build/image
ENGINE="${DLSCALE_CONTAINER_ENGINE:-$(command -v podman || command -v docker || true)}"
if [ -z "$ENGINE" ]; then
    echo "make image: neither podman nor docker is installed (apt-get install podman)" >&2
    exit 2
fi
export DLSCALE_CONTAINER_ENGINE="$ENGINE"
# podman's default runtime, crun, refuses a host whose cgroups are v1 or hybrid ("cgroups in
# hybrid mode not supported"); runc runs there, and flags() below picks it when installed.
if [ "$(basename "$ENGINE")" = podman ] && ! command -v runc >/dev/null \
    && [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" != cgroup2fs ]; then
    echo "make image: this host's cgroups are v1, which podman's default runtime (crun) does not run on: install runc (apt-get install runc)" >&2
    exit 2
fi
read -r -a build_opts <<< "$(.venv/bin/python -m dlscale.service.container flags)"
start=$(date +%s)

if ! "$ENGINE" image exists "$BASE" 2>/dev/null && ! "$ENGINE" image inspect "$BASE" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null || {
        echo "make image: debootstrap is needed for the base image (apt-get install debootstrap)" >&2
        exit 2
    }
    rootfs=$(mktemp -d)
    trap 'rm -rf "$rootfs"' EXIT
    echo "base: debootstrap bookworm into $rootfs ..."
    debootstrap --variant=minbase \
        --include=python3,python3-venv,ca-certificates,passwd,libgomp1,bubblewrap \
        bookworm "$rootfs" "$MIRROR" >/dev/null
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | "$ENGINE" import - "$BASE" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
fi

# The dependencies' wheels are kept while constraints.txt and pyproject.toml stay the same;
# dlscale's own wheel is made again every time, from the tree as it is.
pins=$(cat constraints.txt pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat "$CONTEXT/wheels/.pins" 2>/dev/null)" != "$pins" ]; then
    echo "wheels: dlscale's pinned dependencies into $CONTEXT/wheels ..."
    rm -rf "$CONTEXT/wheels"
    mkdir -p "$CONTEXT/wheels"
    .venv/bin/python -m pip wheel --quiet -c constraints.txt -w "$CONTEXT/wheels" torch==2.13.0
    .venv/bin/python -m pip wheel --quiet -c constraints.txt -w "$CONTEXT/wheels" '.[ray]'
    echo "$pins" > "$CONTEXT/wheels/.pins"
fi
rm -f "$CONTEXT"/wheels/dlscale-*.whl
.venv/bin/python -m pip wheel --quiet --no-deps -w "$CONTEXT/wheels" .
cp docker/Dockerfile "$CONTEXT/Dockerfile"

echo "image: $IMAGE with $ENGINE ..."
"$ENGINE" build "${build_opts[@]}" --network none -t "$IMAGE" -f "$CONTEXT/Dockerfile" "$CONTEXT" \
    | grep -v '^Copying blob\|^Writing manifest\|^Storing signatures' || true
"$ENGINE" image inspect "$IMAGE" >/dev/null
size=$("$ENGINE" image inspect "$IMAGE" --format '{{.Size}}')
echo "built $IMAGE in $(( $(date +%s) - start )) s; $((size / 1000000)) MB"
