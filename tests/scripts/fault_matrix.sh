#!/usr/bin/env bash
# The fault matrix: real kolo-train jobs (replay compute, ResNet-101) in which one rank is killed
# (SIGKILL) or stopped (SIGSTOP: a hung rank) at start-up, in steady training or mid-collective,
# for the ring, MPI and parameter-server backends (the victim a worker or the server), under
# kolo-run and mpirun. Each cell asserts that the launcher ends the job with a non-zero status
# within a bound, that the survivors' errors name the victim's rank, and that no process of the
# job is left (the stopped one included).
#
#   start-up        the victim is signalled 0.3 s after its process appears: rendezvous, mesh
#                   set-up or the first broadcast
#   steady          after the job's first timed step line, from outside
#   mid-collective  the victim raises the signal itself (KOLO_FAULT_INJECT) right after posting
#                   its 600th message of 4 KiB or more (ring, ps), or on entering its 40th MPI
#                   collective (mpi)
#
# And faults that are not a lost rank (ring and mpi backends):
#   TERM start-up     the victim gets SIGTERM at start-up (ends within a second, the job with it)
#   MISMATCH start-up the victim runs with another --num-batches (every rank refuses at start-up,
#                     naming the setting and the rank)
#   EXIT steady       the victim stops training after 3 steps as if done (KOLO_FAULT_INJECT
#                     R:EXIT:step:4): its final collective and the others' gradients stall, and
#                     the job ends after KOLO_STALL_SHUTDOWN_SECONDS (10 s here), naming it as the
#                     one rank that submitted what the others never did (or the one missing)
#   SKEW negotiate    the victim's step check records a collective the others did not agree
#                     (R:SKEW:negotiate:60): every rank stops in that exchange, out of step,
#                     naming each rank's history
#
# Usage: fault_matrix.sh BIN_DIR [--all | --cell "LAUNCHER BACKEND FAULT PHASE"]... [--table FILE]
#   default: a slice of 10 cells covering every backend, fault, phase and launcher (CI);
#   --all: every cell (54; about 10 minutes on 2 cores); --cell: that one (repeatable), e.g.
#   --cell "mpirun ps-server STOP start-up". --table: the results as Markdown.
# Exit 77 (skip) without kolo-train or kolo-run; mpirun cells are left out without mpirun or the
# build's MPI (said in the table).
set -euo pipefail

bin=${1:?usage: fault_matrix.sh BIN_DIR [--all] [--table FILE]}
shift
all=0
table=
cells=()
while (($#)); do
  case $1 in
    --all) all=1 ;;
    --table) table=${2:?--table needs a file}; shift ;;
    --cell) cells+=("${2:?--cell needs \"LAUNCHER BACKEND FAULT PHASE\"}"); shift ;;
    *) echo "fault_matrix.sh: unknown argument '$1' (allowed: --all, --cell SPEC, --table FILE)" >&2; exit 2 ;;
  esac
  shift
done
train=$bin/kolo-train
run=$bin/kolo-run
root=$(cd "$(dirname "$0")/../.." && pwd)
for tool in "$train" "$run"; do
  [[ -x $tool ]] || { echo "skip: $tool not built"; exit 77; }
done
have_mpi=0
if command -v mpirun >/dev/null && grep -q "KOLO_HAVE_MPI 1" "$bin/../generated/kolo/config.h" 2>/dev/null; then
  have_mpi=1
fi

work=$(mktemp -d)
# shellcheck source=tests/scripts/lib/job.bash
source "$(dirname "$0")/lib/job.bash"
marker="--json $work/run.json"
trap 'job_cleanup "$marker"; rm -rf "$work"' EXIT
failures=0
# Inside a cell's fault phase (a subshell): record why and leave the subshell.
fail() {
  echo "$*" >"$work/why"
  exit 1
}

# The peer timeout: 10 s rather than a shorter one, because CI runs this beside other multi-rank
# tests on 2 cores, where a parameter server busy with its first update can go 5 s without a
# keepalive; the survivors would then blame it before the fault is injected.
timeout_s=10
# KOLO_STALL_SHUTDOWN_SECONDS, set only in the EXIT cells (the one mechanism they check): elsewhere
# a rank slowed by the load can lag the others in the start-up broadcast by seconds, which is not a
# stall and must not end the job before its fault.
stall_s=10
# Under mpirun, MPI's start-up has its own bound (KOLO_START_TIMEOUT_SECONDS): MPI_Init alone can
# take several seconds on a slow host (more than 5 s in CI's fresh root), so it is not the peer
# timeout.
start_timeout_s=60
# Longest a launcher may take to end the job after the fault: the peer timeout (the start-up
# bound for a rank stopped inside MPI's start-up), the survivors' own exit, and kolo-run's stop
# sequence (3 s for the ranks to fail on their own, then SIGTERM, and SIGKILL for a stopped rank).
bound=30
mpirun_args=(--oversubscribe --allow-run-as-root --mca btl self,tcp --mca btl_tcp_if_include lo
  --mca oob_tcp_if_include lo --bind-to none)

rows=()
# cell LAUNCHER BACKEND FAULT PHASE
cell() {
  local launcher=$1 backend=$2 fault=$3 phase=$4
  local np=3 victim=1 engine=(--backend "$backend") rank_var inject=
  case $backend in
    ps-worker) np=4 victim=1 engine=(--backend ps --ps-servers 1) ;;
    ps-server) np=4 victim=3 engine=(--backend ps --ps-servers 1) ;;
  esac
  if [[ $phase == mid-collective ]]; then
    if [[ $backend == mpi ]]; then inject="$victim:$fault:mpi:40"; else inject="$victim:$fault:send:600"; fi
  fi
  local stall=300
  [[ $fault == EXIT ]] && inject="$victim:EXIT:step:4" && stall=$stall_s
  [[ $fault == SKEW ]] && inject="$victim:SKEW:negotiate:60"
  local args=(--model resnet101 --batch-size 64 --compute replay
    --profile "$root/models/profiles/resnet101-h100-b64.json" --num-warmup-batches 1
    --display-every 2 --peer-timeout-s "$timeout_s" "${engine[@]}" --json "$work/run.json")
  # --num-batches last, through a shell that gives the victim another value for MISMATCH.
  local victim_batches=100000
  [[ $fault == MISMATCH ]] && victim_batches=50
  local wrap=(sh -c 'b=100000; [ "${KOLO_RANK:-$OMPI_COMM_WORLD_RANK}" = "$V" ] && b=$VB; exec "$0" "$@" --num-batches "$b"')
  rm -f "$work/run.json"
  if [[ $launcher == kolo-run ]]; then
    rank_var=KOLO_RANK
    V=$victim VB=$victim_batches KOLO_FAULT_INJECT=$inject KOLO_STALL_SHUTDOWN_SECONDS=$stall \
      job_start "$run" -np "$np" --timeout-s 200 "${wrap[@]}" "$train" "${args[@]}"
  else
    rank_var=OMPI_COMM_WORLD_RANK
    V=$victim VB=$victim_batches KOLO_FAULT_INJECT=$inject KOLO_STALL_SHUTDOWN_SECONDS=$stall \
      KOLO_START_TIMEOUT_SECONDS=$start_timeout_s job_start mpirun \
      "${mpirun_args[@]}" -x V -x VB -x KOLO_FAULT_INJECT -x KOLO_STALL_SHUTDOWN_SECONDS \
      -x KOLO_START_TIMEOUT_SECONDS -np "$np" "${wrap[@]}" "$train" "${args[@]}"
  fi
  local pid= waited=0 start seconds named=no left= verdict=ok rc= limit=$bound
  # A rank stopped inside MPI's start-up is bounded by the start-up timeout instead.
  [[ $launcher == mpirun && $phase == start-up && $fault == STOP ]] && limit=$((start_timeout_s + 15))
  rm -f "$work/why"
  (
    case $phase in
      start-up)
        [[ $fault == MISMATCH ]] && exit 0  # the settings differ from the start: nothing to send
        until pid=$(job_rank_pid "$marker" "$rank_var=$victim") && [[ -n $pid ]]; do
          ((waited++ < 300)) || fail "rank $victim did not start within 30 s"
          sleep 0.1
        done
        sleep 0.3
        kill "-$fault" "$pid"
        ;;
      steady)
        job_wait_step "first step"
        if [[ $fault == EXIT ]]; then
          until grep -q "KOLO_FAULT_INJECT: rank $victim stops training" "$work/out" 2>/dev/null; do
            kill -0 "$launched" 2>/dev/null || fail "the job ended before the injected early exit"
            ((waited++ < 1200)) || fail "no injected early exit within 120 s"
            sleep 0.1
          done
          exit 0
        fi
        pid=$(job_rank_pid "$marker" "$rank_var=$victim")
        [[ -n $pid ]] || fail "rank $victim not found"
        kill "-$fault" "$pid"
        ;;
      mid-collective | negotiate)
        until grep -Eq "KOLO_FAULT_INJECT: rank $victim (raises|skews)" "$work/out" 2>/dev/null; do
          kill -0 "$launched" 2>/dev/null || fail "the job ended before the injected fault"
          ((waited++ < 1200)) || fail "no injected fault within 120 s"
          sleep 0.1
        done
        ;;
    esac
  ) || verdict="FAIL: $(cat "$work/why" 2>/dev/null || echo "could not inject the fault")"
  start=$SECONDS
  if ! job_wait_bounded "$limit"; then
    [[ $verdict != ok ]] || verdict="FAIL: still running $limit s after the fault"
    job_cleanup "$marker"
    job_wait_bounded 15 || true
  fi
  seconds=$((SECONDS - start))
  [[ $verdict != ok ]] || ((rc != 0)) || verdict="FAIL: the launcher exited 0"
  # Named: an error of a survivor (or the launcher's report) points at the victim's rank.
  local who="rank $victim"
  if grep -Eq "($who\)? has sent nothing|connection to $who lost|$who\)? (exited|was killed|killed by signal|closed)|noticed that process rank $victim|rank $victim exited|$who shut down|$who: exchange [0-9]+|never by ranks $victim\b|submitted by ranks $victim, never by|num_batches is [^;]*'[0-9]+' on $who\b|not connected to rank\(s\) ([0-9]+, )*$victim\b|$who has not published|ranks ([0-9]+, )*$victim(, [0-9]+)* have not published|Process name: \[\[[0-9]+,[0-9]+\],$victim\])" "$work/out"; then
    named=yes
  elif [[ $launcher == mpirun && $fault == STOP ]] && grep -q "MPI does not say which" "$work/out"; then
    named="no (MPI does not say which)"
  fi
  # And no error blames another rank's silence.
  local blamed
  blamed=$(grep -Eo "rank [0-9]+\)? has sent nothing" "$work/out" | grep -Eo "[0-9]+" | sort -u | tr '\n' ' ' || true)
  [[ -z $blamed || $blamed == "$victim " ]] || verdict="FAIL: errors name the silence of ranks $blamed, not only rank $victim"
  sleep 1
  left=$(pgrep -f -- "$marker" || true)
  [[ -z $left ]] || verdict="FAIL: processes left: $left"
  if [[ $named == no && $verdict == ok ]]; then verdict="FAIL: no error names rank $victim"; fi
  job_cleanup "$marker"
  rows+=("| $launcher | $backend | $victim | $fault | $phase | $rc | $seconds | $named | ${left:+yes}${left:-no} | $verdict |")
  echo "${rows[-1]}"
  if [[ $verdict != ok ]]; then
    failures=$((failures + 1))
    echo "--- output of the failed cell:"
    tail -40 "$work/out" || true
  fi
  launched=
}

header="| launcher | backend | victim rank | fault | phase | exit | s to end | victim named | left behind | result |"
echo "$header"
echo "|---|---|---|---|---|---|---|---|---|---|"
if ((${#cells[@]})); then
  for spec in "${cells[@]}"; do
    read -r launcher backend fault phase <<<"$spec"
    case "$launcher/$backend/$fault/$phase" in
      kolo-run/mpi/*) echo "--cell '$spec': the mpi backend needs mpirun" >&2; exit 2 ;;
      kolo-run/* | mpirun/*) ;;
      *) echo "--cell '$spec': launcher kolo-run or mpirun" >&2; exit 2 ;;
    esac
    [[ $backend =~ ^(ring|mpi|ps-worker|ps-server)$ ]] || { echo "--cell '$spec': backend ring, mpi, ps-worker or ps-server" >&2; exit 2; }
    case "$fault/$phase" in
      KILL/start-up | KILL/steady | KILL/mid-collective | STOP/start-up | STOP/steady | STOP/mid-collective) ;;
      TERM/start-up | MISMATCH/start-up | EXIT/steady | SKEW/negotiate)
        [[ $backend =~ ^(ring|mpi)$ ]] || { echo "--cell '$spec': $fault cells run the ring or mpi backend" >&2; exit 2; } ;;
      *) echo "--cell '$spec': fault and phase KILL or STOP at start-up, steady or mid-collective; TERM or MISMATCH at start-up; EXIT steady; SKEW negotiate" >&2; exit 2 ;;
    esac
    [[ $launcher == mpirun ]] && ((!have_mpi)) && { echo "skip: no mpirun or no MPI in this build"; exit 77; }
    cell "$launcher" "$backend" "$fault" "$phase"
  done
elif ((all)); then
  for launcher in kolo-run mpirun; do
    [[ $launcher == mpirun ]] && ((!have_mpi)) && continue
    for backend in ring mpi ps-worker ps-server; do
      [[ $backend == mpi && $launcher == kolo-run ]] && continue  # the mpi backend needs mpirun
      for fault in KILL STOP; do
        for phase in start-up steady mid-collective; do
          cell "$launcher" "$backend" "$fault" "$phase"
        done
      done
      if [[ $backend =~ ^(ring|mpi)$ ]]; then
        cell "$launcher" "$backend" TERM start-up
        cell "$launcher" "$backend" MISMATCH start-up
        cell "$launcher" "$backend" EXIT steady
        cell "$launcher" "$backend" SKEW negotiate
      fi
    done
  done
else
  cell kolo-run ring STOP mid-collective
  cell kolo-run ps-server STOP steady
  cell kolo-run ps-worker KILL mid-collective
  cell kolo-run ring KILL start-up
  cell kolo-run ring MISMATCH start-up
  cell kolo-run ring EXIT steady
  cell kolo-run ring SKEW negotiate
  if ((have_mpi)); then
    cell mpirun mpi STOP mid-collective
    cell mpirun ps-worker STOP steady
    cell mpirun mpi TERM start-up
  else
    echo "mpirun cells left out: no mpirun or this build has no MPI"
  fi
fi

if [[ -n $table ]]; then
  {
    echo "$header"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
  } >"$table"
fi
echo "${#rows[@]} cells, $failures failed (peer timeout ${timeout_s} s, stall shutdown ${stall_s} s in EXIT cells, MPI start-up bound ${start_timeout_s} s, bound ${bound} s)"
((failures == 0)) && echo PASS
exit $((failures > 0))
