#!/usr/bin/env bash
# Install realsim from nothing, idempotently.
#
#   scripts/install.sh            # venv in .venv, pinned deps, tf2_msgs shim if needed, colcon build
#   scripts/install.sh --relock   # re-resolve and rewrite constraints.txt (maintainers only)
#
# Every step is skipped when its inputs did not change (stamp files in .venv/.stamps),
# so a second run takes seconds. Environment:
#   REALSIM_VENV   where the virtual environment lives (default: <repo>/.venv)
#   PYTHON         interpreter used to create it (default: python3, must be 3.10+)
#   ROS_DISTRO     when set (a ROS 2 Humble/Jazzy install is sourced) the venv sees the
#                  system packages and neither the ROS wheels nor the tf2_msgs shim are installed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${REALSIM_VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
STAMPS=$VENV/.stamps
RELOCK=0
[[ "${1:-}" == "--relock" ]] && RELOCK=1

log() { printf '[install] %s\n' "$*" >&2; }
die() { printf '[install] error: %s\n' "$*" >&2; exit 1; }
hash_of() { cat "$@" 2>/dev/null | sha256sum | cut -c1-16; }
# hash of every file under the given dirs (names + contents), ignoring build outputs
hash_tree() {
  (cd "$ROOT" && find "$@" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 2>/dev/null \
    | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16
}
stamp_ok() { [[ -f "$STAMPS/$1" && "$(cat "$STAMPS/$1")" == "$2" ]]; }
stamp_set() { mkdir -p "$STAMPS"; echo "$2" > "$STAMPS/$1"; }

# ---------------------------------------------------------------- Debian packages
# EGL/OSMesa for MuJoCo's headless renderer; cmake + a compiler for the tf2_msgs shim.
apt_need=()
need_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed" || apt_need+=("$1"); }
if command -v dpkg-query >/dev/null; then
  for p in libegl1 libgl1 libosmesa6 libglib2.0-0; do need_pkg "$p"; done
  if [[ -z "${ROS_DISTRO:-}" ]]; then
    for p in cmake g++ make; do need_pkg "$p"; done
  fi
  if ((${#apt_need[@]})); then
    if [[ $(id -u) -eq 0 ]]; then
      log "apt: installing ${apt_need[*]}"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq >/dev/null
      apt-get install -y -qq --no-install-recommends "${apt_need[@]}" >/dev/null
    else
      die "missing Debian packages: ${apt_need[*]} (run: sudo apt-get install ${apt_need[*]})"
    fi
  fi
fi

# ---------------------------------------------------------------- virtual environment
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || die "$PYTHON is older than Python 3.10"
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating virtual environment in $VENV"
  if [[ -n "${ROS_DISTRO:-}" ]]; then
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
VPY=$VENV/bin/python
PIP=(pip_quiet "$VPY" -m pip --disable-pip-version-check -q)
# pip repeats a warning per package for find-links folders that some machines configure
pip_quiet() { "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }

# ---------------------------------------------------------------- Python packages (pinned)
# Python 3.10 (Ubuntu 22.04, ROS 2 Humble) cannot take the 3.11+ pins: it has its own set.
CONSTRAINTS=$ROOT/constraints.txt
if "$VPY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))'; then
  CONSTRAINTS=$ROOT/requirements/constraints-py310.txt
  if ((RELOCK)); then die "--relock rewrites constraints.txt and needs Python 3.11+ (3.10: $CONSTRAINTS)"; fi
fi
reqs=(-e "$ROOT[dev]")
if [[ -z "${ROS_DISTRO:-}" ]]; then
  reqs+=(-r "$ROOT/requirements/ros-wheels.txt")
fi
if ((RELOCK)); then
  log "relock: resolving the newest allowed versions"
  "${PIP[@]}" install --upgrade "${reqs[@]}"
  "${PIP[@]}" install --no-deps -r "$ROOT/requirements/test-models.txt"
  { echo "# Exact versions for every install (scripts/install.sh, docker/). Regenerate with"
    echo "# scripts/install.sh --relock after changing pyproject.toml."
    "$VPY" -m pip freeze --exclude-editable | grep -v -E '^(-e |tf2.msgs)'
  } > "$ROOT/constraints.txt"
  log "wrote constraints.txt"
fi
req_files=()
for f in "$ROOT"/requirements/*.txt; do [[ $f == */constraints-py310.txt ]] || req_files+=("$f"); done
pip_key=$(hash_of "$CONSTRAINTS" "$ROOT/pyproject.toml" "${req_files[@]}"; echo "${ROS_DISTRO:-wheels}")
if ! stamp_ok pip "$pip_key"; then
  log "pip: installing pinned packages (first run downloads ~1 GB; later runs skip this)"
  "${PIP[@]}" install -c "$CONSTRAINTS" "${reqs[@]}"
  "${PIP[@]}" install --no-deps -c "$CONSTRAINTS" -r "$ROOT/requirements/test-models.txt"
  stamp_set pip "$pip_key"
  rm -f "$STAMPS/shim" "$STAMPS/colcon"  # rebuild what links against the wheels
fi

# ---------------------------------------------------------------- tf2_msgs shim
# PyPI has no tf2_msgs wheel. Where it is not importable, generate TFMessage from its
# one-line definition with the rosidl wheels and install it into the venv prefix (which the
# wheels already use as their ament prefix and library path).
if [[ -z "${ROS_DISTRO:-}" ]]; then
  shim_key=$(hash_tree third_party/tf2_msgs_shim)-$pip_key
  if ! stamp_ok shim "$shim_key" || ! "$VPY" -c 'import tf2_msgs.msg' 2>/dev/null; then
    log "building the tf2_msgs shim (TFMessage) with rosidl"
    # The rosidl wheels bake the build machine's include dirs into their CMake exports;
    # point them at this venv's Python and numpy headers.
    py_inc=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    np_inc=$("$VPY" -c 'import numpy; print(numpy.get_include())')
    { grep -l "/opt/python/cp3" "$VENV"/share/*/cmake/*.cmake 2>/dev/null || true; } | xargs -r sed -i -E \
      -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/include/python3\.[0-9]+#$py_inc#g" \
      -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/lib/python3\.[0-9]+/site-packages/numpy/_core/include#$np_inc#g"
    rm -rf "$ROOT/build/tf2_msgs_shim"
    mkdir -p "$ROOT/build"
    (
      export AMENT_PREFIX_PATH=$VENV CMAKE_PREFIX_PATH=$VENV PATH=$VENV/bin:$PATH
      "$VENV/bin/colcon" --log-base "$ROOT/build/tf2_msgs_shim/log" build \
        --base-paths "$ROOT/third_party/tf2_msgs_shim" \
        --build-base "$ROOT/build/tf2_msgs_shim" --install-base "$VENV" --merge-install \
        --event-handlers console_direct- summary- \
        --cmake-args -DBUILD_TESTING=OFF -DPython3_EXECUTABLE="$VPY" >"$ROOT/build/tf2_msgs_shim.log" 2>&1
    ) || die "tf2_msgs shim build failed; see build/tf2_msgs_shim.log"
    "$VPY" -c 'import tf2_msgs.msg' || die "tf2_msgs shim built but does not import"
    stamp_set shim "$shim_key"
  fi
fi

# ---------------------------------------------------------------- ROS workspace
colcon_key=$(hash_tree ros2_ws/src launch config)-$pip_key
if ! stamp_ok colcon "$colcon_key" || [[ ! -f "$ROOT/ros2_ws/install/setup.bash" ]]; then
  log "colcon: building ros2_ws"
  (
    cd "$ROOT/ros2_ws"
    if [[ -n "${ROS_DISTRO:-}" ]]; then
      colcon build --event-handlers console_direct- summary- >"$ROOT/ros2_ws/colcon.log" 2>&1
    else
      export AMENT_PREFIX_PATH=$VENV PATH=$VENV/bin:$PATH
      "$VENV/bin/colcon" build --event-handlers console_direct- summary- >"$ROOT/ros2_ws/colcon.log" 2>&1
    fi
  ) || die "colcon build failed; see ros2_ws/colcon.log"
  stamp_set colcon "$colcon_key"
fi

log "ready: $VENV (run commands through scripts/with-env)"
