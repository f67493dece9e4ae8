#!/usr/bin/env bash
# No secret on the wire: captures everything on loopback while 2-rank jobs run over TCP (the store,
# the transports and, under mpirun, MPI's own TCP channel) and checks that the job secret appears
# nowhere in it, as text or as bytes (engine/docs/wire.md, "The secret under mpirun").
#   - mpirun: only rank 0 is given the secret (KOLO_JOB_SECRET); rank 1 can log in to the store
#     only with the copy rank 0 sealed for it under their X25519 key. The capture must hold the
#     rendezvous broadcast itself ("ok 127.0.0.1:"), or it proves nothing.
#   - kolo-run: the secret comes from the environment; each rank writes its copy for the check.
# Usage: wire_secret.sh BIN_DIR. Exit 77 (skip) without root (CAP_NET_RAW), kolo-train, oneDNN;
# the mpirun half also skips without mpirun or the build's MPI.
set -euo pipefail

bin=${1:?usage: wire_secret.sh BIN_DIR}
train=$bin/kolo-train
root=$(cd "$(dirname "$0")/../.." && pwd)
capture=(python3 "$root/tests/scripts/lib/lo_capture.py")
[[ -x $train ]] || { echo "skip: $train not built"; exit 77; }
[[ $("$train" --help) == *onednn* ]] || { echo "skip: this build has no oneDNN backend"; exit 77; }
((EUID == 0)) || { echo "skip: capturing on lo needs root (CAP_NET_RAW)"; exit 77; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
args=(--model tiny-cnn --batch-size 2 --num-warmup-batches 1 --num-batches 2 --num-classes 10
      --compute onednn --transport tcp --peer-timeout-s 60)

# Whether the capture holds the secret (hex text as given, its bytes, or upper-case hex).
check_absent() {
  local pcap=$1 secret=$2 what=$3
  python3 - "$pcap" "$secret" "$what" <<'PY' || fail "$3: the job secret crossed the wire"
import sys
data = open(sys.argv[1], "rb").read()
secret, what = sys.argv[2], sys.argv[3]
forms = {"text": secret.encode(), "upper-case text": secret.upper().encode(),
         "bytes": bytes.fromhex(secret)}
found = [name for name, form in forms.items() if form in data]
print(f"{what}: {len(data)} bytes captured; secret found as: {found or 'nothing'}")
sys.exit(1 if found else 0)
PY
}

secret=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')

# --- mpirun: the secret reaches rank 1 over MPI, sealed.
if command -v mpirun >/dev/null && grep -q "KOLO_HAVE_MPI 1" "$bin/../generated/kolo/config.h" 2>/dev/null; then
  mpi=(mpirun --oversubscribe --allow-run-as-root --mca btl self,tcp --mca btl_tcp_if_include lo
       --mca oob_tcp_if_include lo)
  timeout 300 "${capture[@]}" "$work/mpirun.cap" -- "${mpi[@]}" \
    -np 1 env KOLO_JOB_SECRET="$secret" "$train" "${args[@]}" : -np 1 "$train" "${args[@]}" \
    >"$work/mpirun.out" 2>&1 || { cat "$work/mpirun.out"; fail "mpirun job exited $?"; }
  grep -q "^total images/sec" "$work/mpirun.out" || { cat "$work/mpirun.out"; fail "mpirun: no total"; }
  grep -q "ok 127.0.0.1:" "$work/mpirun.cap" ||
    fail "mpirun: the rendezvous broadcast is not in the capture (MPI did not use lo's TCP?)"
  check_absent "$work/mpirun.cap" "$secret" mpirun
else
  echo "mpirun half skipped: no mpirun or no MPI in this build"
fi

# --- kolo-run: the secret comes from the environment and stays off the wire.
timeout 300 "${capture[@]}" "$work/kolo-run.cap" -- "$bin/kolo-run" -np 2 -- \
  sh -c 'echo "$KOLO_JOB_SECRET" >"$0/secret.$KOLO_RANK"; exec "$@"' "$work" "$train" "${args[@]}" \
  >"$work/kolo-run.out" 2>&1 || { cat "$work/kolo-run.out"; fail "kolo-run job exited $?"; }
grep -q "^total images/sec" "$work/kolo-run.out" || { cat "$work/kolo-run.out"; fail "kolo-run: no total"; }
run_secret=$(<"$work/secret.0")
[[ $run_secret =~ ^[0-9a-f]{32}$ ]] || fail "kolo-run: unexpected secret form '$run_secret'"
[[ $(stat -c %s "$work/kolo-run.cap") -gt 10000 ]] || fail "kolo-run: hardly any traffic captured"
check_absent "$work/kolo-run.cap" "$run_secret" kolo-run
echo "PASS: no job secret in any captured frame"
