# shellcheck shell=bash
# Helpers shared by the scripts in this folder. Sourced, never run.
#
# After sourcing: KOLO_ROOT is the repository root (absolute), whatever the caller's directory;
# KOLO_PRESET the CMake preset that scripts/build and scripts/test use (default: "default"; see
# CMakePresets.json) and KOLO_BUILD_DIR its build folder (build/, or build-<preset>/);
# KOLO_MPIRUN_ARGS are the mpirun flags for ranks on this host over loopback TCP.

KOLO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KOLO_SCRIPT=${KOLO_SCRIPT:-$(basename "$0")}
KOLO_PRESET=${KOLO_PRESET:-default}
if [[ ! $KOLO_PRESET =~ ^(default|debug|minimal|asan|thread-safety)$ ]]; then
  printf '%s: error: KOLO_PRESET=%s is not a preset: allowed are %s\n' "$KOLO_SCRIPT" \
    "$KOLO_PRESET" "default, debug, minimal, asan, thread-safety" >&2
  exit 2
fi
if [[ $KOLO_PRESET == default ]]; then
  KOLO_BUILD_DIR=$KOLO_ROOT/build
else
  KOLO_BUILD_DIR=$KOLO_ROOT/build-$KOLO_PRESET
fi

# shellcheck disable=SC2034,SC2054  # used by the scripts that source this; "self,tcp" is one word
KOLO_MPIRUN_ARGS=(--oversubscribe --allow-run-as-root --mca btl self,tcp
                  --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)

# Prints a message on stderr, prefixed with the script's name.
kolo_say() { printf '%s: %s\n' "$KOLO_SCRIPT" "$*" >&2; }

# Prints an error on stderr and exits 1.
kolo_die() {
  kolo_say "error: $*"
  exit 1
}

# Runs scripts/bootstrap unless KOLO_SKIP_BOOTSTRAP=1.
kolo_bootstrap() {
  if [[ ${KOLO_SKIP_BOOTSTRAP:-0} != 1 ]]; then
    "$KOLO_ROOT/scripts/bootstrap"
  fi
}
