#!/usr/bin/env bash
# Fray's one setup command: `bash tools/setup.sh`.
#
# 1. Bazel 7 in a private prefix. No Bazel release can be downloaded on our machines, so the
#    Debian `bazel-bootstrap` build from sid is unpacked (never installed) into $FRAY_BAZEL_PREFIX
#    with its own libc/JRE; only Bazel's own executables are re-pointed at them (patchelf), so
#    gcc, nvcc and Python keep the host's glibc. The Debian-packaged rule sets come along.
# 2. The pinned Python packages (tools/requirements*.txt) for the default python3, and pybind11
#    for the Python 3.12 interpreter that builds the GPU bundle (the H200 runs Python 3.12).
# 3. .bazelrc.offline (git-ignored, pulled in by .bazelrc with try-import): everything specific to
#    machines without the Bazel Central Registry. MODULE.bazel itself stays a normal module.
#
# A second run skips what is already in place. Any failing step stops the script with its error.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=${FRAY_BAZEL_PREFIX:-/opt/fray-bazel}
ROOT=$PREFIX/root
BAZEL_DEBS="bazel-bootstrap bazel-rules-python bazel-rules-cc bazel-platforms bazel-skylib
  bazel-features bazel-rules-java bazel-rules-proto bazel-rules-license default-jre-headless
  libblake3-0"
export DEBIAN_FRONTEND=noninteractive
log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

sudo_if_needed() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

bazel_ok() {
  [ -x "$PREFIX/bazel" ] && "$PREFIX/bazel" --version 2>/dev/null | grep -q '^bazel 7\.'
}

install_bazel() {
  local aptd=$PREFIX/apt
  log "installing Bazel 7 into $PREFIX (private prefix; the system is not touched)"
  sudo_if_needed apt-get update -qq || die "apt-get update failed"
  sudo_if_needed apt-get install -y -qq --no-install-recommends patchelf ca-certificates \
    || die "apt-get install patchelf failed"
  rm -rf "$PREFIX"
  mkdir -p "$aptd"/etc/apt.conf.d "$aptd"/etc/sources.list.d "$aptd"/etc/preferences.d \
           "$aptd"/state/lists/partial "$aptd"/cache/archives/partial "$ROOT"
  # Use the mirror this machine's own apt sources name (never a hard-coded host).
  local mirror
  mirror=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -n1 | awk '{print $2}' || true)
  [ -n "$mirror" ] || mirror=$(grep -h '^deb ' /etc/apt/sources.list 2>/dev/null | grep -v security | head -n1 | awk '{print $2}' || true)
  [ -n "$mirror" ] || die "no Debian mirror found in /etc/apt/sources.list{,.d}"
  cat > "$aptd/etc/sources.list.d/sid.sources" <<EOF
Types: deb
URIs: $mirror
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  # Packages the host already provides are declared installed so apt does not fetch them.
  : > "$aptd/status"
  for p in build-essential default-jdk-headless python3 unzip zlib1g-dev; do
    printf 'Package: %s\nStatus: install ok installed\nVersion: 99:0\nArchitecture: all\nMaintainer: host\nDescription: provided by the host\n\n' "$p" >> "$aptd/status"
  done
  cat > "$aptd/apt.conf" <<EOF
Dir::State "$aptd/state";
Dir::State::status "$aptd/status";
Dir::Cache "$aptd/cache";
Dir::Etc::main "/dev/null";
Dir::Etc::parts "$aptd/etc/apt.conf.d";
Dir::Etc::sourcelist "/dev/null";
Dir::Etc::sourceparts "$aptd/etc/sources.list.d";
Dir::Etc::preferencesparts "$aptd/etc/preferences.d";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
APT::Install-Recommends "false";
Acquire::Check-Valid-Until "false";
Acquire::Languages "none";
Debug::NoLocking "true";
EOF
  local out
  if ! out=$(APT_CONFIG=$aptd/apt.conf apt-get update 2>&1); then
    printf '%s\n' "$out" >&2; die "apt-get update (private sid configuration) failed"
  fi
  # libblake3-0: Bazel's libunix_jni.so links it but the package does not depend on it.
  # shellcheck disable=SC2086
  if ! out=$(APT_CONFIG=$aptd/apt.conf apt-get install -y -d $BAZEL_DEBS 2>&1); then
    printf '%s\n' "$out" >&2; die "downloading the Bazel packages from sid failed"
  fi
  local deb
  for deb in "$aptd"/cache/archives/*.deb; do dpkg-deb -x "$deb" "$ROOT"; done
  rm -rf "$aptd"

  # Absolute symlinks inside the unpacked tree point at /...: re-point them into $ROOT.
  find "$ROOT" -type l -lname '/*' -print0 | while IFS= read -r -d '' l; do
    t=$(readlink "$l")
    if [ -e "$ROOT$t" ] || [ -L "$ROOT$t" ]; then ln -sfn "$ROOT$t" "$l"; fi
  done
  # Debian's jars name their dependencies by absolute Class-Path in their manifests; give Bazel
  # the whole closure, relocated, or the server dies with NoClassDefFoundError.
  python3 "$REPO/tools/relocate_classpath.py" "$ROOT"

  local ld=$ROOT/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
  local libs=$ROOT/usr/lib/x86_64-linux-gnu
  local jh
  jh=$(readlink -f "$ROOT/usr/lib/jvm/default-java")
  local f
  for f in "$ROOT/usr/bin/bazel" "$ROOT"/usr/libexec/x86_64-linux-gnu/bazel/*; do
    [ -f "$f" ] || continue
    patchelf --set-interpreter "$ld" --force-rpath --set-rpath "$libs" "$f"
  done
  for f in "$jh/bin/java" "$jh/lib/jspawnhelper"; do
    patchelf --set-interpreter "$ld" --force-rpath --set-rpath "\$ORIGIN:\$ORIGIN/../lib:$libs" "$f"
  done
  cat > "$PREFIX/bazel" <<EOF
#!/bin/sh
exec "$ROOT/usr/bin/bazel" --install_base="$ROOT/usr/share/bazel" --trust_install_base \\
  --server_javabase="$jh" \\
  --host_jvm_args=-Djava.library.path="$ROOT/usr/share/bazel:$libs/jni:$libs" "\$@"
EOF
  chmod +x "$PREFIX/bazel"
}

find_python312() {
  local c
  for c in "${FRAY_PY312:-}" "$(command -v python3.12 2>/dev/null || true)" \
           "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3; do
    [ -n "$c" ] && [ -x "$c" ] && "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null \
      && { echo "$c"; return 0; }
  done
  return 1
}

# ---- 1. Bazel -------------------------------------------------------------------------------
if bazel_ok; then
  log "Bazel already in $PREFIX"
else
  install_bazel
  bazel_ok || die "Bazel in $PREFIX does not report version 7.x"
fi
ln -sfn "$PREFIX/bazel" /usr/local/bin/bazel 2>/dev/null || sudo_if_needed ln -sfn "$PREFIX/bazel" /usr/local/bin/bazel

# ---- 2. Python packages -----------------------------------------------------------------------
PY=${PYTHON_BIN_PATH:-$(command -v python3)}
log "Python packages for $PY"
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1
"$PY" -m pip install -q -r "$REPO/tools/requirements.txt" || die "pip install -r tools/requirements.txt failed"
"$PY" -m pip install -q --no-deps -r "$REPO/tools/requirements-nodeps.txt" || die "pip install nvidia-cutlass failed"
if PY312=$(find_python312); then
  log "pybind11 for the bundle's Python 3.12 ($PY312)"
  "$PY312" -m pip install -q "$(grep '^pybind11==' "$REPO/tools/requirements.txt")" \
    || die "pip install pybind11 for $PY312 failed"
else
  log "no Python 3.12 found: --config=py312 (the GPU bundle) will not build on this machine"
fi

# ---- 3. Offline Bazel configuration ------------------------------------------------------------
python3 "$REPO/tools/write_offline_bazelrc.py" --repo "$REPO" --debian "$ROOT/usr/share/bazel"

v=$(bazel --version)
log "$v"
case "$v" in "bazel 7."*) ;; *) die "expected Bazel 7.x, got: $v" ;; esac
log "done"
