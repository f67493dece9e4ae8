# Helpers for the emulated-cluster tests (tests/scripts/cluster*.sh). Sourced; expects `root` (the
# repository root) and `fail` to be defined.
#
# cluster_gate: exit 77 naming the reason unless `scripts/cluster check` passes.
# cluster_gate_mpi BIN: also exit 77 without mpirun or without MPI in the build.
# cluster_name PREFIX: a cluster name of this test process (PREFIX + pid), set in `name`.
# cluster_teardown: `scripts/cluster down` of `name` (for the EXIT trap).

cluster=$root/scripts/cluster
name=

cluster_gate() {
  local why
  if ! why=$("$cluster" check 2>&1); then
    echo "SKIP: scripts/cluster check says this machine cannot host a cluster: $why"
    exit 77
  fi
}

cluster_gate_mpi() {
  command -v mpirun >/dev/null || { echo "SKIP: mpirun not found"; exit 77; }
  grep -q "KOLO_HAVE_MPI 1" "$1/../generated/kolo/config.h" 2>/dev/null ||
    { echo "SKIP: this build has no MPI"; exit 77; }
}

cluster_name() {
  name=$1$$
}

cluster_teardown() {
  [[ -n $name ]] && "$cluster" down --name "$name" >/dev/null 2>&1 || true
}

# cluster_json_field EXPR: evaluates the Python expression EXPR over `status --json` (as `s`).
cluster_status_py() {
  "$cluster" status --name "$name" --json | python3 -c "import json, sys; s = json.load(sys.stdin); $1"
}

# cluster_leftovers: prints what cluster `name` left behind (namespaces, state), or nothing.
cluster_leftovers() {
  ip netns list | awk '{print $1}' | grep -E "^$name-(sw|h[0-9]+)$" || true
  [[ ! -e /run/kolo-cluster/$name ]] || echo "/run/kolo-cluster/$name"
}
