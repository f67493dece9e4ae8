#!/usr/bin/env bash
# Rank scripts are single-quoted on purpose: the ranks expand them, not this shell.
# shellcheck disable=SC2016
# End-to-end tests of kolo-run: environment of the ranks, failure propagation, timeouts, signal
# forwarding, clean-up (no process left behind), flag errors, and a real rendezvous of the ranks
# through the launcher's store (and through mpirun, when this build has MPI).
# Usage: kolo_run.sh BIN_DIR   (exit 77 = skipped)
set -u

BIN=${1:?usage: kolo_run.sh BIN_DIR}
RUN="$BIN/kolo-run"
if [[ ! -x "$RUN" ]]; then
  echo "SKIP: $RUN not built"
  exit 77
fi
for tool in pgrep timeout; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool is not installed"
    exit 77
  fi
done

FAILURES=0
TMP=$(mktemp -d)
# Unique sleep lengths double as markers in argv, so pgrep finds exactly this test's processes.
MARK="$$$RANDOM"
cleanup() {
  # Only this test's processes carry the marker; kill them by id if any check let one escape.
  for p in $(pgrep -f -- "300\.${MARK}"); do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  FAILURES=$((FAILURES + 1))
}
now() { date +%s.%N; }
elapsed() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.3f", a - b }'; }
less_than() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }
# Waits up to $2 seconds for background process $1 to exit (then kills it), reaps it, and sets
# RC to its exit code.
wait_bounded() {
  for _ in $(seq $(($2 * 10))); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$1" 2>/dev/null
  wait "$1"
  RC=$?
}

# Waits up to 3 s for every process whose command line contains $1 to be gone.
expect_no_leftovers() {
  for _ in $(seq 30); do
    pgrep -f -- "$1" >/dev/null || return 0
    sleep 0.1
  done
  fail "$2: processes left behind: $(pgrep -af -- "$1")"
}

# --- 1. Every rank gets its environment.
out=$(timeout 30 "$RUN" -np 3 sh -c \
  'echo "rank=$KOLO_RANK size=$KOLO_SIZE local=$KOLO_LOCAL_RANK/$KOLO_LOCAL_SIZE store=$KOLO_STORE_ADDR secret=${#KOLO_JOB_SECRET}"' \
  2>"$TMP/err")
rc=$?
[[ $rc == 0 ]] || fail "env: exit code $rc, stderr: $(cat "$TMP/err")"
for r in 0 1 2; do
  grep -Eq "^rank=$r size=3 local=$r/3 store=127\.0\.0\.1:[0-9]+ secret=32$" <<<"$out" ||
    fail "env: no correct line for rank $r in: $out"
done
[[ $(grep -c . <<<"$out") == 3 ]] || fail "env: expected 3 lines, got: $out"
[[ $(grep -o 'store=[^ ]*' <<<"$out" | sort -u | wc -l) == 1 ]] || fail "env: ranks disagree on the store"

# --- 2. A failing rank stops the others promptly and sets the exit code.
t0=$(now)
timeout 30 "$RUN" -np 3 sh -c \
  'if [ "$KOLO_RANK" = 1 ]; then sleep 0.3; exit 3; fi; sleep "$0"' "300.${MARK}1" 2>"$TMP/err"
rc=$?
t=$(elapsed "$t0")
[[ $rc == 3 ]] || fail "failing rank: exit code $rc, expected 3"
grep -q "rank 1 exited with code 3" "$TMP/err" || fail "failing rank: message missing: $(cat "$TMP/err")"
less_than "$t" 4 || fail "failing rank: the other ranks took ${t} s to stop"
expect_no_leftovers "300.${MARK}1" "failing rank"

# --- 3. A rank killed by a signal is reported as such.
timeout 30 "$RUN" -np 2 sh -c \
  'if [ "$KOLO_RANK" = 0 ]; then kill -9 $$; fi; sleep "$0"' "300.${MARK}2" 2>"$TMP/err"
rc=$?
[[ $rc == 137 ]] || fail "signalled rank: exit code $rc, expected 137"
grep -q "rank 0 killed by signal 9" "$TMP/err" || fail "signalled rank: message missing: $(cat "$TMP/err")"
expect_no_leftovers "300.${MARK}2" "signalled rank"

# --- 4. --timeout-s stops a hanging job.
t0=$(now)
timeout 30 "$RUN" --timeout-s 1 -np 2 sleep "300.${MARK}3" 2>"$TMP/err"
rc=$?
t=$(elapsed "$t0")
[[ $rc == 124 ]] || fail "timeout: exit code $rc, expected 124"
grep -q "timed out after 1 s" "$TMP/err" || fail "timeout: message missing: $(cat "$TMP/err")"
if ! { less_than 0.9 "$t" && less_than "$t" 4; }; then fail "timeout: took ${t} s, expected about 1 s"; fi
expect_no_leftovers "300.${MARK}3" "timeout"

# --- 5. A rank that ignores SIGTERM is killed after the grace period; its children go too.
t0=$(now)
timeout 30 "$RUN" -np 2 sh -c \
  'if [ "$KOLO_RANK" = 1 ]; then sleep 0.2; exit 5; fi; trap "" TERM; sleep "$0" & sleep "$0"' \
  "300.${MARK}4" 2>"$TMP/err"
rc=$?
t=$(elapsed "$t0")
[[ $rc == 5 ]] || fail "SIGKILL escalation: exit code $rc, expected 5"
grep -q "sending SIGKILL" "$TMP/err" || fail "SIGKILL escalation: message missing: $(cat "$TMP/err")"
if ! { less_than 4.5 "$t" && less_than "$t" 12; }; then fail "SIGKILL escalation: took ${t} s, expected ~5 s"; fi
expect_no_leftovers "300.${MARK}4" "SIGKILL escalation"

# --- 6. SIGTERM to the launcher is forwarded to every rank.
"$RUN" -np 3 sleep "300.${MARK}5" 2>"$TMP/err" &
pid=$!
sleep 0.5
kill -TERM "$pid"
t0=$(now)
wait_bounded "$pid" 15
rc=$RC
t=$(elapsed "$t0")
[[ $rc == 143 ]] || fail "SIGTERM forwarding: exit code $rc, expected 143"
grep -q "forwarding it to 3 ranks" "$TMP/err" || fail "SIGTERM forwarding: message missing: $(cat "$TMP/err")"
less_than "$t" 4 || fail "SIGTERM forwarding: took ${t} s"
expect_no_leftovers "300.${MARK}5" "SIGTERM forwarding"

# --- 7. Ranks die with the launcher even when it is SIGKILLed.
"$RUN" -np 2 sleep "300.${MARK}6" 2>/dev/null &
pid=$!
sleep 0.5
pgrep -f "300.${MARK}6" >/dev/null || fail "launcher death: ranks never started"
kill -KILL "$pid"
wait_bounded "$pid" 5 2>/dev/null
expect_no_leftovers "300.${MARK}6" "launcher death"

# --- 8. Flag errors name the flag and fail.
timeout 10 "$RUN" --bogus -np 2 true >"$TMP/out" 2>&1 && fail "bad flag: exit code 0"
grep -q -- "--bogus" "$TMP/out" || fail "bad flag: message does not name it: $(cat "$TMP/out")"
timeout 10 "$RUN" -np 0 true >"$TMP/out" 2>&1 && fail "-np 0: exit code 0"
grep -q -- "--np" "$TMP/out" || fail "-np 0: message does not name the flag: $(cat "$TMP/out")"
timeout 10 "$RUN" -np 2 >"$TMP/out" 2>&1 && fail "no command: exit code 0"
timeout 10 "$RUN" true >"$TMP/out" 2>&1 && fail "missing -np: exit code 0"
timeout 10 "$RUN" -np 2 "no-such-command-${MARK}" >"$TMP/out" 2>&1
[[ $? == 127 ]] || fail "unknown command: expected exit code 127"
# Options after the command belong to the command.
out=$(timeout 10 "$RUN" -np 1 -- sh -c 'echo "$@"' x -np 5 --bogus)
[[ $out == "-np 5 --bogus" ]] || fail "command arguments were altered: '$out'"

# --- 9. --bind-to: each rank on its own hardware thread or core of the launcher's CPUs, wrapping
# round when ranks outnumber them.
allowed() { grep Cpus_allowed_list /proc/self/status | awk '{print $2}'; }
CPUS=$(nproc)
out=$(timeout 30 "$RUN" -np 2 --bind-to hwthread --report-bindings -- sh -c \
  'echo "rank $KOLO_RANK on $(grep Cpus_allowed_list /proc/self/status | cut -f2)"' 2>"$TMP/err")
rc=$?
[[ $rc == 0 ]] || fail "--bind-to hwthread: exit code $rc: $(cat "$TMP/err")"
r0=$(sed -n 's/^rank 0 on //p' <<<"$out")
r1=$(sed -n 's/^rank 1 on //p' <<<"$out")
[[ $r0 =~ ^[0-9]+$ && $r1 =~ ^[0-9]+$ ]] || fail "--bind-to hwthread: a rank is not on one CPU: $out"
if ((CPUS >= 2)); then
  [[ $r0 != "$r1" ]] || fail "--bind-to hwthread: both ranks on CPU $r0 of $CPUS"
fi
grep -q "rank 0 bound to CPU(s) $r0\$" "$TMP/err" || fail "--report-bindings: rank 0 not reported as on $r0: $(cat "$TMP/err")"
# Cores: every rank is bound to the threads of one core, each a CPU the launcher may use.
out=$(timeout 30 "$RUN" -np "$CPUS" --bind-to core -- sh -c \
  'grep Cpus_allowed_list /proc/self/status | cut -f2' 2>"$TMP/err") ||
  fail "--bind-to core: exit code $?: $(cat "$TMP/err")"
[[ $(grep -c . <<<"$out") == "$CPUS" ]] || fail "--bind-to core: $CPUS ranks printed '$out'"
if [[ $(allowed) =~ ^0-([0-9]+)$ ]]; then
  last=${BASH_REMATCH[1]}
  while read -r cpus; do
    for c in ${cpus//[,-]/ }; do
      ((c <= last)) || fail "--bind-to core: CPU $c is outside the launcher's 0-$last"
    done
  done <<<"$out"
fi
if command -v taskset >/dev/null; then
  # Launched on CPU 0 only, two ranks share it and kolo-run says so.
  out=$(timeout 30 taskset -c 0 "$RUN" -np 2 --bind-to hwthread -- sh -c \
    'grep Cpus_allowed_list /proc/self/status | cut -f2' 2>"$TMP/err")
  [[ $(sort -u <<<"$out") == 0 ]] || fail "--bind-to within taskset -c 0: ranks on '$out', not CPU 0"
  grep -q "2 ranks on 1 hwthreads: bound round-robin" "$TMP/err" ||
    fail "--bind-to with more ranks than CPUs: not said: $(cat "$TMP/err")"
else
  echo "note: taskset not installed; binding within a restricted CPU set not checked"
fi
timeout 10 "$RUN" -np 2 --bind-to socket true >"$TMP/out" 2>&1
rc=$?
[[ $rc == 2 ]] || fail "--bind-to socket: exit code $rc, want 2"
grep -q "'socket' is not allowed; allowed: none, core, hwthread" "$TMP/out" ||
  fail "--bind-to socket: error does not name the value and what is allowed: $(cat "$TMP/out")"
out=$(timeout 10 "$RUN" -np 1 -- sh -c 'grep Cpus_allowed_list /proc/self/status | cut -f2')
[[ $out == "$(allowed)" ]] || fail "no --bind-to: rank on '$out', the launcher's CPUs are '$(allowed)'"

# --- 10. The ranks really meet through the launcher's store (and over MPI under mpirun).
TEST_BIN="$BIN/kolo_bootstrap_test"
if [[ -x "$TEST_BIN" ]]; then
  out=$(timeout 120 "$RUN" -np 3 "$TEST_BIN" --gtest_filter='Launched.*' 2>&1)
  rc=$?
  [[ $rc == 0 ]] || fail "rendezvous under kolo-run: exit code $rc: $out"
  for r in 0 1 2; do
    grep -q "launched rank $r of 3 met 3 ranks" <<<"$out" || fail "rendezvous under kolo-run: rank $r did not meet the others: $out"
  done
  CONFIG="$BIN/../generated/kolo/config.h"
  if command -v mpirun >/dev/null && grep -q "KOLO_HAVE_MPI 1" "$CONFIG" 2>/dev/null; then
    out=$(timeout 120 mpirun --oversubscribe --allow-run-as-root --mca btl self,tcp \
      --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -np 3 \
      "$TEST_BIN" --gtest_filter='Launched.*' 2>&1)
    rc=$?
    [[ $rc == 0 ]] || fail "rendezvous under mpirun: exit code $rc: $out"
    for r in 0 1 2; do
      grep -q "launched rank $r of 3 met 3 ranks" <<<"$out" || fail "rendezvous under mpirun: rank $r did not meet the others: $out"
    done
  else
    echo "note: mpirun rendezvous not checked (no mpirun or no MPI in this build)"
  fi
else
  echo "note: $TEST_BIN not built; rendezvous through the store not checked"
fi

if [[ $FAILURES != 0 ]]; then
  echo "$FAILURES check(s) failed"
  exit 1
fi
echo "all kolo-run checks passed"
