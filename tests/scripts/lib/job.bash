# Helpers for the scripted fault tests: start a launcher (kolo-run or mpirun) in a session of its
# own, wait (bounded) for its first step line, find one rank's process, and wait (bounded) for the
# job to end. Sourced by tests/scripts/*.sh; expects `fail` to be defined and `$work/out` as the
# job's output.

launched=

# job_start CMD...: runs CMD in a new session, its output in $work/out; sets `launched`.
job_start() {
  rm -f "$work/out"
  setsid "$@" >"$work/out" 2>&1 &
  launched=$!
}

# job_wait_step WHAT: waits up to 120 s for the job's first timed step line.
job_wait_step() {
  local waited=0
  until grep -Eq $'^[0-9]+\timages/sec' "$work/out" 2>/dev/null; do
    kill -0 "$launched" 2>/dev/null || fail "$1: exited before training"
    ((waited++ < 600)) || fail "$1: no step line within 120 s"
    sleep 0.2
  done
}

# job_rank_pid PATTERN VAR=VALUE: the pid of the process whose command line matches PATTERN and
# whose environment holds VAR=VALUE (the launcher's rank variable), or nothing.
job_rank_pid() {
  local pid
  for pid in $(pgrep -f -- "$1"); do
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "$2" && { echo "$pid"; return; }
  done
}

# job_wait_bounded SECONDS: waits up to SECONDS for the launcher to exit. Returns 0 once it has,
# with its exit status in `rc` (and `launched` cleared); 1 if it is still running then.
job_wait_bounded() {
  local bound=$1 start=$SECONDS
  while kill -0 "$launched" 2>/dev/null; do
    ((SECONDS - start < bound)) || return 1
    sleep 0.2
  done
  set +e
  wait "$launched"
  rc=$?
  set -e
  launched=
}

# job_wait_exit SECONDS WHAT: waits up to SECONDS for the launcher to exit (fails naming WHAT if it
# does not); sets `rc`, and SECONDS to how long it took.
job_wait_exit() {
  SECONDS=0
  job_wait_bounded "$1" || fail "$2: still running ${1} s after the fault"
}

# job_cleanup PATTERN: resumes and kills whatever is left of the job (a stopped process ignores
# SIGTERM) and its session.
job_cleanup() {
  local pid
  for pid in $(pgrep -f -- "$1" || true); do
    kill -CONT "$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
  done
  [[ -n $launched ]] && kill -KILL -- "-$launched" 2>/dev/null || true
}
