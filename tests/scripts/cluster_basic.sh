#!/usr/bin/env bash
# The emulated cluster (scripts/cluster) with 3 hosts at 1 Gbit/s: each host has its own host
# name and address, exec passes stdin, stdout and the exit status through, every pair pings, the
# root namespace's network is untouched, tbf shapes each link in both directions (one flow and a
# 2-to-1 incast each reach about the link's rate, not more), status reports the counters, and down
# stops a process left in a host (one that ignores SIGTERM) and removes every namespace and the
# state.
# Usage: cluster_basic.sh BIN_DIR (unused). Exit 77 (skip) when scripts/cluster check fails.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }
# shellcheck source=tests/scripts/lib/cluster.bash
source "$(dirname "$0")/lib/cluster.bash"
cluster_gate
command -v ping >/dev/null || { echo "SKIP: ping not found (scripts/bootstrap installs iputils-ping)"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 is needed for the flows"; exit 77; }
flow=$root/tests/scripts/lib/tcp_flow.py

cluster_name tb
work=$(mktemp -d)
trap 'cluster_teardown; rm -rf "$work"' EXIT

ip -o link show | sed 's/^[0-9]*: //' | cut -d: -f1 | sort >"$work/links-before"
"$cluster" up --hosts 3 --link 1gbit --name "$name" || fail "up exited $?"
ip -o link show | sed 's/^[0-9]*: //' | cut -d: -f1 | sort >"$work/links-after"
cmp -s "$work/links-before" "$work/links-after" ||
  fail "up changed the root namespace's interfaces: $(diff "$work/links-before" "$work/links-after" | tr '\n' ' ')"

mapfile -t hosts < <("$cluster" hosts --name "$name")
((${#hosts[@]} == 3)) || fail "hosts printed ${#hosts[@]} lines: ${hosts[*]}"
declare -A addr
for line in "${hosts[@]}"; do
  read -r h a <<<"$line"
  addr[$h]=$a
done
for i in 0 1 2; do
  [[ ${addr[h$i]:-} =~ ^10\.201\.[0-9]+\.$((10 + i))$ ]] || fail "h$i has address '${addr[h$i]:-}'"
  got=$("$cluster" exec --name "$name" "h$i" hostname)
  [[ $got == "h$i" ]] || fail "h$i's host name is '$got'"
  got=$("$cluster" exec --name "$name" "h$i" ip -4 -o addr show dev kolo0)
  [[ $got == *"${addr[h$i]}/24"* ]] || fail "h$i's kolo0: $got"
  # The other hosts' names resolve to their addresses, as on a real cluster.
  got=$("$cluster" exec --name "$name" "h$i" getent hosts "h$(((i + 1) % 3))")
  [[ $got == "${addr[h$(((i + 1) % 3))]} "* ]] || fail "h$i resolves h$(((i + 1) % 3)) to '$got'"
done

# exec passes stdin, stdout and the exit status through.
rc=0
got=$(echo "through h1" | "$cluster" exec --name "$name" h1 sh -c 'cat; exit 7') || rc=$?
[[ $got == "through h1" && $rc == 7 ]] || fail "exec h1: output '$got', status $rc (expected 'through h1', 7)"

for a in 0 1 2; do
  for b in 0 1 2; do
    ((a != b)) || continue
    "$cluster" exec --name "$name" "h$a" ping -c 2 -i 0.2 -W 2 -q "${addr[h$b]}" >"$work/ping" 2>&1 ||
      fail "h$a cannot ping h$b: $(cat "$work/ping")"
  done
done
echo "ok: host names, addresses and all 6 ordered pairs ping"

# tbf on both ends of each link: the host's side (kolo0) and its switch port.
sw=$(cluster_status_py 'print(s["switch_namespace"])')
for i in 0 1 2; do
  tc -n "$name-h$i" qdisc show dev kolo0 | grep -q "tbf .*rate 1Gbit" || fail "h$i: no 1Gbit tbf on kolo0"
  tc -n "$sw" qdisc show dev "v$i" | grep -q "tbf .*rate 1Gbit" || fail "h$i: no 1Gbit tbf on switch port v$i"
done

# One flow h1 -> h0, then an incast h1 + h2 -> h0: about the link rate each time (goodput at most
# 95.6% of the L2 rate; at least 60% of it, so a 2-core host under load still passes).
measure() {  # SENDERS... : prints "BYTES SECONDS" of h0's receiver
  local port=$((20000 + RANDOM % 20000)) s
  "$cluster" exec --name "$name" h0 timeout 60 python3 "$flow" recv "$port" $# >"$work/recv" &
  local receiver=$!
  local senders=()
  for s in "$@"; do
    "$cluster" exec --name "$name" "$s" timeout 60 python3 "$flow" send "${addr[h0]}" "$port" 50000000 &
    senders+=($!)
  done
  for s in "${senders[@]}"; do wait "$s" || fail "a sender to h0 failed"; done
  wait "$receiver" || fail "h0's receiver failed"
  cat "$work/recv"
}
check_rate() {  # WHAT BYTES SECONDS
  local gbps
  gbps=$(awk -v b="$2" -v s="$3" 'BEGIN { printf "%.3f", b * 8 / s / 1e9 }')
  echo "$1: $2 bytes in $3 s = $gbps Gbit/s into h0"
  awk -v g="$gbps" 'BEGIN { exit !(g >= 0.6 && g <= 1.0) }' ||
    fail "$1: $gbps Gbit/s into h0, expected 0.6-1.0 for a 1gbit link"
}
before=$(cluster_status_py 'print(s["host_list"][0]["ingress"]["bytes"], s["host_list"][1]["egress"]["bytes"])')
read -r bytes seconds <<<"$(measure h1)"
check_rate "one flow h1 -> h0" "$bytes" "$seconds"
after=$(cluster_status_py 'print(s["host_list"][0]["ingress"]["bytes"], s["host_list"][1]["egress"]["bytes"])')
read -r in0 out1 <<<"$before"
read -r in0b out1b <<<"$after"
((out1b - out1 >= 50000000)) || fail "h1's egress tbf counted $((out1b - out1)) bytes for a 50 MB flow"
((in0b - in0 >= 50000000)) || fail "h0's ingress tbf counted $((in0b - in0)) bytes for a 50 MB flow"
read -r bytes seconds <<<"$(measure h1 h2)"
check_rate "incast h1 + h2 -> h0" "$bytes" "$seconds"

"$cluster" status --name "$name" >"$work/status" || fail "status exited $?"
cat "$work/status"
for i in 0 1 2; do grep -q "^h$i .*${addr[h$i]} " "$work/status" || fail "status lacks h$i"; done
cluster_status_py 'assert s["hosts"] == 3 and s["link"] == "1gbit" and s["ranks_per_host"] == 1, s
assert all(h["egress"]["qdisc"] == "tbf" and h["ingress"]["qdisc"] == "tbf" for h in s["host_list"]), s
assert all(h["egress"]["bytes"] > 0 and h["ingress"]["bytes"] > 0 for h in s["host_list"]), s' ||
  fail "status --json"
[[ -f /run/kolo-cluster/$name/cluster.env && -f /run/kolo-cluster/$name/cluster.json ]] ||
  fail "no state files under /run/kolo-cluster/$name"
python3 -c "import json, sys; d = json.load(open(sys.argv[1])); assert d['hosts'] == 3, d" \
  "/run/kolo-cluster/$name/cluster.json" || fail "cluster.json"

# A process that ignores SIGTERM, left running in h2: down must end it too.
"$cluster" exec --name "$name" h2 sh -c 'trap "" TERM; exec sleep 600' &
straggler=$!
for _ in $(seq 50); do [[ -n $(ip netns pids "$name-h2") ]] && break; sleep 0.1; done
[[ -n $(ip netns pids "$name-h2") ]] || fail "the process in h2 did not start"
timeout 30 "$cluster" down --name "$name" --grace-s 1 || fail "down exited $?"
wait "$straggler" 2>/dev/null && fail "the process in h2 ended normally instead of being killed"
kill -0 "$straggler" 2>/dev/null && fail "the process in h2 is still running after down"
left=$(cluster_leftovers)
[[ -z $left ]] || fail "down left: $left"
"$cluster" status --name "$name" >/dev/null 2>&1 && fail "status succeeded after down"
echo "PASS"
