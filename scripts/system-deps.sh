#!/usr/bin/env bash
# Debian packages the service needs, and its tests: PostgreSQL (its initdb/pg_ctl; the tests start
# their own throwaway cluster), Chromium (the dashboard's browser tests drive it through
# Playwright) and bubblewrap (every job of `dlscale serve` runs in its sandbox).
#
#   scripts/system-deps.sh          install what is missing (as root), else say what to run
#   scripts/system-deps.sh --check  only report: exit 0 when all are present, 1 listing what's missing
#
# Idempotent: when all are present it prints that and exits 0 without touching apt.
# Detection reads PATH (chromium, bwrap) and DLSCALE_PG_LIB_DIR (default /usr/lib/postgresql), so a test
# can point them at empty folders to see what would be installed; DLSCALE_PG_COMMON_DIR (default
# /etc/postgresql-common) lets it check the cluster setting without touching the system's file.
set -euo pipefail

check_only=0
case "${1:-}" in
  "") ;;
  --check) check_only=1 ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

pg_lib_dir="${DLSCALE_PG_LIB_DIR:-/usr/lib/postgresql}"
missing=()
shopt -s nullglob
initdbs=("$pg_lib_dir"/*/bin/initdb)
shopt -u nullglob
if ((${#initdbs[@]})); then
  echo "postgresql: ${initdbs[0]}"
else
  missing+=(postgresql)
fi
if chromium_path=$(command -v chromium); then
  echo "chromium: $chromium_path"
else
  missing+=(chromium)
fi
if bwrap_path=$(command -v bwrap); then
  echo "bubblewrap: $bwrap_path"
else
  missing+=(bubblewrap)
fi

if ((${#missing[@]} == 0)); then
  echo "system packages for the tests are present"
  exit 0
fi

install_command="apt-get install -y --no-install-recommends ${missing[*]}"
if ((check_only)); then
  echo "missing: ${missing[*]}"
  echo "would run: $install_command"
  exit 1
fi
if ((EUID != 0)); then
  echo "missing: ${missing[*]}; as root run:" >&2
  echo "  sudo DEBIAN_FRONTEND=noninteractive $install_command" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "missing: ${missing[*]}; this is not a Debian system (no apt-get): install them by hand" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# Installs the given packages; runs `apt-get update` only when the install failed for want of
# package lists (a fresh image has none; stale ones point at files the mirror no longer has).
apt_install() {
  if apt-get install -y --no-install-recommends "$@" 2>&1 | tee "$log"; then
    return 0
  fi
  if grep -qE "Unable to locate package|has no installation candidate|Failed to fetch" "$log"; then
    apt-get update
    apt-get install -y --no-install-recommends "$@"
  else
    return 1
  fi
}

if [[ " ${missing[*]} " == *" postgresql "* ]]; then
  # Debian's postgresql package creates (and, where services may start, starts) a "main" cluster on
  # port 5432. The tests never use it, so switch that off before the server package is configured.
  apt_install postgresql-common
  conf="${DLSCALE_PG_COMMON_DIR:-/etc/postgresql-common}/createcluster.conf"
  sed -ri 's/^#?[[:space:]]*create_main_cluster[[:space:]]*=.*$/create_main_cluster = false/' "$conf"
  grep -q '^create_main_cluster = false' "$conf" || echo 'create_main_cluster = false' >>"$conf"
fi
apt_install "${missing[@]}"
echo "installed: ${missing[*]}"
