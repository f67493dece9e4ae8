#!/usr/bin/env bash
# scripts/cluster's refusals: bad flags exit 2 naming the value and what is allowed (before
# anything is made); then, where namespaces can be made: up on an existing name refuses and says
# how to remove it, exec on an unknown host, status of no cluster (exit 1), --delay-us without
# netem refused with nothing left behind, up failing half-way (a tc that fails on the third host)
# or stopped by SIGTERM removes what it made, and down twice succeeds twice.
# Usage: cluster_errors.sh BIN_DIR (unused). Exit 77 (skip) after the flag checks when
# scripts/cluster check fails.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }
# shellcheck source=tests/scripts/lib/cluster.bash
source "$(dirname "$0")/lib/cluster.bash"
work=$(mktemp -d)
cluster_name te
trap 'cluster_teardown; rm -rf "$work"' EXIT

# expect RC PATTERN ARGS...: scripts/cluster ARGS exits RC and its output has PATTERN.
expect() {
  local want=$1 pattern=$2 rc=0
  shift 2
  timeout 60 "$cluster" "$@" >"$work/out" 2>&1 || rc=$?
  [[ $rc == "$want" ]] || fail "cluster $*: exit $rc, expected $want: $(cat "$work/out")"
  grep -q -- "$pattern" "$work/out" || fail "cluster $*: message lacks '$pattern': $(cat "$work/out")"
  echo "ok: cluster $* -> $rc: $(head -c 200 "$work/out")"
}

form="a number followed by kbit, mbit or gbit"
expect 2 "'1gb' is not a rate: allowed is $form" up --hosts 2 --link 1gb --name "$name"
expect 2 "'fast' is not a rate" up --hosts 2 --link fast --name "$name"
expect 2 "'0mbit' is out of range: allowed is $form, from 1mbit to 100gbit" up --hosts 2 --link 0mbit --name "$name"
expect 2 "'200gbit' is out of range" up --hosts 2 --link 200gbit --name "$name"
expect 2 "needs --link RATE" up --hosts 2 --name "$name"
expect 2 "\-\-hosts '0' is not allowed: a whole number from 1 to 16" up --hosts 0 --link 1gbit --name "$name"
expect 2 "\-\-hosts '17' is not allowed: a whole number from 1 to 16" up --hosts 17 --link 1gbit --name "$name"
expect 2 "\-\-hosts 'two' is not allowed" up --hosts two --link 1gbit --name "$name"
expect 2 "\-\-ranks-per-host '0' is not allowed" up --hosts 2 --ranks-per-host 0 --link 1gbit --name "$name"
expect 2 "\-\-delay-us '-5' is not allowed" up --hosts 2 --link 1gbit --delay-us -5 --name "$name"
expect 2 "\-\-name 'Bad_Name' is not allowed: a lowercase letter" up --hosts 2 --link 1gbit --name Bad_Name
expect 2 "unknown argument '--bogus'" up --hosts 2 --link 1gbit --bogus
expect 2 "unknown command 'launch'" launch
expect 2 "check takes no arguments" check --now
expect 2 "\-\-grace-s 'soon' is not allowed: seconds" down --name "$name" --grace-s soon
[[ -z $(cluster_leftovers) ]] || fail "a refused up left: $(cluster_leftovers)"

cluster_gate

expect 1 "no cluster '$name'" status --name "$name"
expect 1 "no cluster '$name'" exec --name "$name" h0 true
expect 0 "no cluster '$name' (nothing to remove)" down --name "$name"

# --delay-us: honoured with netem, refused without it, and then nothing is made.
if "$cluster" check | grep -q "netem: yes"; then
  expect 0 "one-way delay 200 us" up --hosts 2 --link 1gbit --delay-us 200 --name "$name"
  tc -n "$name-h0" qdisc show dev kolo0 | grep -q "netem .*delay 200us" || fail "no netem on h0's link"
  expect 0 "removed" down --name "$name"
else
  expect 1 "netem is unavailable on this kernel" up --hosts 2 --link 1gbit --delay-us 200 --name "$name"
  grep -q "leave --delay-us out" "$work/out" || fail "the netem refusal does not say what to do"
  [[ -z $(cluster_leftovers) ]] || fail "the refused --delay-us left: $(cluster_leftovers)"
fi

expect 0 "up: 2 host(s)" up --hosts 2 --link 500mbit --name "$name"
expect 1 "cluster '$name' exists already (remove it: scripts/cluster down --name $name)" \
  up --hosts 3 --link 1gbit --name "$name"
expect 2 "no host 'h2' in cluster '$name' (hosts: h0..h1" exec --name "$name" h2 true
expect 2 "no host '10.0.0.1'" exec --name "$name" 10.0.0.1 true
expect 2 "exec needs HOST and a command" exec --name "$name" h0
expect 2 "no host 'h9'" partition --name "$name" h9
expect 0 "500mbit" status --name "$name"
# The second cluster gets its own subnet.
"$cluster" up --hosts 1 --link 1gbit --name "${name}b" >/dev/null 2>&1 || fail "a second cluster could not be made"
a=$("$cluster" hosts --name "$name" | awk 'NR == 1 {print $2}')
b=$("$cluster" hosts --name "${name}b" | awk 'NR == 1 {print $2}')
"$cluster" down --name "${name}b" >/dev/null 2>&1 || fail "down of the second cluster"
[[ ${a%.*} != "${b%.*}" ]] || fail "two clusters share the subnet of $a and $b"
expect 0 "cluster '$name' removed" down --name "$name"
expect 0 "no cluster '$name' (nothing to remove)" down --name "$name"
[[ -z $(cluster_leftovers) ]] || fail "down twice left: $(cluster_leftovers)"

# up failing half-way: a tc that refuses the third host's switch port. What up made is removed.
real_tc=$(command -v tc)
mkdir "$work/bin"
cat >"$work/bin/tc" <<EOF
#!/bin/sh
case "\$*" in *"dev v2 "*) echo "injected failure" >&2; exit 1 ;; esac
exec "$real_tc" "\$@"
EOF
chmod +x "$work/bin/tc"
PATH="$work/bin:$PATH" expect 1 "dev v2 .* failed: injected failure" up --hosts 4 --link 1gbit --name "$name"
grep -q "removing what it made" "$work/out" || fail "the failed up does not say it cleaned up"
[[ -z $(cluster_leftovers) ]] || fail "the failed up left: $(cluster_leftovers)"

# up stopped by SIGTERM half-way (or before it began): nothing is left.
"$cluster" up --hosts 16 --link 1gbit --name "$name" >"$work/out" 2>&1 &
up_pid=$!
sleep 2
kill -TERM "$up_pid" 2>/dev/null || true
rc=0
wait "$up_pid" || rc=$?
if ((rc == 0)); then
  echo "note: up finished before SIGTERM; removing it"
  "$cluster" down --name "$name" >/dev/null 2>&1
fi
[[ -z $(cluster_leftovers) ]] || fail "up stopped by SIGTERM (exit $rc) left: $(cluster_leftovers)"
echo "ok: up stopped by SIGTERM (exit $rc) left nothing"
echo "PASS"
