#!/usr/bin/env bash
# SIGKILL during shared-memory set-up leaves nothing behind. A job of kolo-allreduce-bench over
# --transport shm (16 ranks under kolo-run: every pair of ranks shares a segment, twice, for the
# benchmark's own device and for the engine's) is killed whole, every rank and the launcher, with
# SIGKILL (no code of kolo runs: as the OOM killer does it) at a random moment of its start-up,
# many times. After each kill, once every process of the job is gone (bounded), /dev/shm must hold
# no file the job made and no process of the job may be left.
#
# The moment is uniform in [0, D], D being how long a whole short job takes here (start, set-up,
# one allreduce, shutdown: set-up is most of it), at most 1.5 s; --max-delay S sets D. Each kill
# first freezes the ranks (SIGSTOP) to count the segments they had mapped, so that the summary
# says how many kills landed before, during and after set-up; then SIGKILL. With the segments of
# before (named in /dev/shm until both ranks had opened them) about half the runs left a file.
# Usage: shm_kill_setup.sh BIN_DIR [--runs N] [--ranks N] [--max-delay S]   (exit 77 = skipped)
set -u -o pipefail

BIN=${1:?usage: shm_kill_setup.sh BIN_DIR [--runs N] [--ranks N] [--max-delay S]}
shift
RUNS=10
NP=16
MAX_DELAY=
while (($# > 0)); do
  case $1 in
    --runs) RUNS=${2:?--runs needs a number}; shift 2 ;;
    --ranks) NP=${2:?--ranks needs a number}; shift 2 ;;
    --max-delay) MAX_DELAY=${2:?--max-delay needs seconds}; shift 2 ;;
    *) echo "unknown argument '$1'; usage: shm_kill_setup.sh BIN_DIR [--runs N] [--ranks N] [--max-delay S]"; exit 2 ;;
  esac
done
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || { echo "--runs '$RUNS': expected a positive whole number"; exit 2; }
if ! [[ $NP =~ ^[1-9][0-9]*$ ]] || ((NP < 2)); then
  echo "--ranks '$NP': expected a number >= 2"
  exit 2
fi
if [[ -n $MAX_DELAY ]] && ! awk -v d="$MAX_DELAY" 'BEGIN { exit !(d + 0 > 0 && d + 0 <= 60) }'; then
  echo "--max-delay '$MAX_DELAY': expected seconds in (0, 60]"
  exit 2
fi

RUN=$BIN/kolo-run
BENCH=$BIN/kolo-allreduce-bench
for exe in "$RUN" "$BENCH"; do
  [[ -x $exe ]] || { echo "SKIP: $exe not built"; exit 77; }
done
[[ -d /dev/shm ]] || { echo "SKIP: no /dev/shm here"; exit 77; }
for tool in pgrep timeout sha256sum awk comm; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool is not installed"; exit 77; }
done

FAILURES=0
fail() {
  echo "FAIL: $*"
  FAILURES=$((FAILURES + 1))
}
TMP=$(mktemp -d)
# Every process of a job carries SHM_KILL_SETUP_MARK=<mark> in its environment (kolo-run passes
# its own on to the ranks), which finds them whatever became of their parent. Not a KOLO_
# variable: the ranks refuse KOLO_ variables they do not know.
MARK_BASE="shm-kill-setup-$$-$RANDOM"
job_pids() {  # $1: the mark; prints the pids of the processes that carry it, if any
  grep -lsaF "SHM_KILL_SETUP_MARK=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3
}
cleanup() {
  for p in $(job_pids "$MARK_BASE"); do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT

# What /dev/shm holds before: anything there now, or made by others meanwhile under other names,
# is not this test's business.
find /dev/shm -mindepth 1 -maxdepth 1 -printf '%f\n' | sort >"$TMP/before"

# Seconds since $1 (date +%s.%N).
elapsed() { awk -v a="$(date +%s.%N)" -v b="$1" 'BEGIN { printf "%.3f", a - b }'; }

# 1. A whole short job: shared memory works here, and how long start-up takes.
t0=$(date +%s.%N)
timeout 120 "$RUN" --timeout-s 100 -np "$NP" "$BENCH" --transport shm -b 4K -e 4K -n 1 -w 0 \
  >"$TMP/calibrate.out" 2>&1
rc=$?
whole=$(elapsed "$t0")
if ((rc != 0)) || ! grep -q "every result matches" "$TMP/calibrate.out"; then
  echo "FAIL: a $NP-rank job over shm does not run here (exit $rc):"
  tail -n 20 "$TMP/calibrate.out"
  exit 1
fi
[[ -n $MAX_DELAY ]] || MAX_DELAY=$(awk -v w="$whole" 'BEGIN { printf "%.3f", (w < 1.5 ? w : 1.5) }')
# Segment mappings of every rank once both meshes are up: up to 16 ranks each rank connects to
# every other (beyond, the connection plan picks its peers), once for each mesh.
FULL=0
((NP > 16)) || FULL=$((2 * NP * (NP - 1)))
echo "a whole $NP-rank job takes ${whole} s here; $RUNS kills at random in [0, ${MAX_DELAY}] s"

before_setup=0
during_setup=0
after_setup=0
for run in $(seq "$RUNS"); do
  mark="$MARK_BASE-$run-job"  # "-job": no run's mark is a prefix of another's
  delay=$(awk -v m="$MAX_DELAY" -v r="$RANDOM" 'BEGIN { printf "%.3f", m * r / 32767 }')
  # --timeout-s: should this script die before its kill, the job still ends by itself.
  SHM_KILL_SETUP_MARK=$mark "$RUN" --timeout-s 120 -np "$NP" "$BENCH" --transport shm \
    -b 4K -e 4K -n 1000000 -w 0 >"$TMP/run.out" 2>&1 &
  launcher=$!
  sleep "$delay"
  # Freeze the ranks where they are (SIGSTOP: no code of theirs runs until the SIGKILL), to count
  # the segments they had mapped. Not the launcher: it hosts the store, and a job without it stalls
  # where it next looks something up, after finishing the segment exchanges under way, so that a
  # kill would never find one half done.
  ranks=$(pgrep -P "$launcher" | tr '\n' ' ')
  if [[ -z $ranks ]] && ! kill -0 "$launcher" 2>/dev/null; then
    wait "$launcher"
    fail "run $run: the job ended by itself (exit $?) before the kill at ${delay} s: $(tail -n 5 "$TMP/run.out")"
    continue
  fi
  # shellcheck disable=SC2086  # one pid per word
  [[ -z $ranks ]] || kill -STOP $ranks 2>/dev/null
  mapped=0
  secret=
  for r in $ranks; do
    n=$(grep -cE '(/memfd:|/dev/shm/)kolo-' "/proc/$r/maps" 2>/dev/null) || n=0
    mapped=$((mapped + n))
    [[ -n $secret ]] || secret=$(tr '\0' '\n' <"/proc/$r/environ" 2>/dev/null |
      sed -n 's/^KOLO_JOB_SECRET=//p')
  done
  # The kill itself: every rank and the launcher at once (ranks it started after the listing die
  # with it: PR_SET_PDEATHSIG is SIGKILL).
  # shellcheck disable=SC2086
  kill -KILL $ranks "$launcher" 2>/dev/null
  wait "$launcher" 2>/dev/null
  if ((mapped == 0)); then
    before_setup=$((before_setup + 1))
  elif ((FULL == 0 || mapped < FULL)); then
    during_setup=$((during_setup + 1))
  else
    after_setup=$((after_setup + 1))
  fi

  # Every process of the job gone (bounded): ranks are reparented and reaped by others; a zombie
  # has no environment left and holds nothing, so it counts as gone.
  left=
  for _ in $(seq 100); do
    left=$(job_pids "$mark" | tr '\n' ' ')
    [[ -n $left ]] || break
    sleep 0.1
  done
  if [[ -n $left ]]; then
    fail "run $run: processes of the job still there 10 s after SIGKILL: $left"
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null
  fi

  # Nothing of the job in /dev/shm: no file under this job's id (segments were named
  # kolo-<job>-<low>-<high>-<random>, <job> from the job secret), nor any new kolo file at all.
  job=
  [[ -z $secret ]] || job=$(printf '%s%s' "kolo shm job v1" "$secret" | sha256sum | cut -c1-16)
  find /dev/shm -mindepth 1 -maxdepth 1 -printf '%f\n' | sort >"$TMP/after"
  new=$(comm -13 "$TMP/before" "$TMP/after" |
    awk -v job="$job" '/^kolo/ || (job != "" && index($0, job) > 0)' | tr '\n' ' ')
  if [[ -n $new ]]; then
    fail "run $run: killed after ${delay} s with $mapped segment mappings in the ranks, it left in /dev/shm: $new"
    # Remove what this job left (its id is in the name), so that the next run starts clean.
    if [[ -n $job ]]; then
      for f in $new; do [[ $f != *"$job"* ]] || rm -f "/dev/shm/$f"; done
    fi
  fi
  echo "run $run: SIGKILL after ${delay} s, $mapped segment mappings in the ranks$( ((FULL == 0)) || echo " (of $FULL)")"
done

if ((FULL > 0)); then
  echo "kills before set-up: $before_setup, during: $during_setup, after: $after_setup"
else
  echo "kills before set-up: $before_setup, during or after: $during_setup"
fi
# A test whose kills all missed set-up proved nothing about it; with the window measured above
# that should not happen in 10 runs, and says the window needs --max-delay.
if ((FULL > 0 && during_setup == 0 && RUNS >= 10)); then
  fail "no kill landed during set-up in $RUNS runs (try --max-delay)"
fi
if ((FAILURES > 0)); then
  echo "FAILED: $FAILURES check(s)"
  exit 1
fi
echo "PASS"
