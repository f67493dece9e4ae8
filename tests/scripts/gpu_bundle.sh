#!/usr/bin/env bash
# The GPU check's prepared bundle and its dry path, rehearsed without a GPU: scripts/gpu/pack-deps
# --bin --dry-run packs this build's GPU tools and tests (stripped) with their non-CUDA libraries,
# under the size limit; scripts/gpu-check --bin BUNDLE --dry-run unpacks it and prints the plan,
# whose steps come in the documented order (tests, train, bench, ps, profiles, multi, rdma) and
# name only binaries the bundle holds; bad arguments are refused with a clear message.
# $1: the build's bin directory. Exit 77 (skip) when this build has no CUDA or cuDNN (no GPU
# tests to bundle).
set -u -o pipefail

BIN=${1:?usage: gpu_bundle.sh BUILD_BIN_DIR}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "$BIN/.." && pwd)
CONFIG=$BUILD/generated/kolo/config.h
grep -q "KOLO_HAVE_CUDNN 1" "$CONFIG" 2>/dev/null ||
  { echo "SKIP: this build has no cuDNN, so no GPU tests to bundle"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 is needed"; exit 77; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The bundle's targets must be built in this build folder (CTest builds every target).
mapfile -t TARGETS < <("$ROOT/scripts/gpu/pack-deps" --list-targets)
for t in kolo-train kolo-run kolo-allreduce-bench kolo_cudnn_backend_test kolo_cudnn_mixed_test \
         kolo_cudnn_ps_test kolo_gpu_engine_test; do
  printf '%s\n' "${TARGETS[@]}" | grep -qx "$t" || fail "--list-targets lacks $t"
done

BUNDLE=$WORK/bundle.tar.xz
if ! timeout 300 "$ROOT/scripts/gpu/pack-deps" --bin --dry-run --build-dir "$BUILD" \
    --max-mib 48 "$BUNDLE" >"$WORK/pack.out" 2>&1; then
  cat "$WORK/pack.out"
  fail "pack-deps --bin --dry-run failed"
else
  cat "$WORK/pack.out"
  bytes=$(stat -c %s "$BUNDLE")
  ((bytes < 48 * 1024 * 1024)) || fail "bundle is $bytes bytes"
  tar -tJf "$BUNDLE" >"$WORK/list" || fail "bundle is not a readable tar.xz"
  for t in "${TARGETS[@]}"; do
    grep -qx "kolo-gpu/bin/$t" "$WORK/list" || fail "bundle lacks bin/$t"
  done
  for l in libfmt libdnnl libOpenCL libgomp; do
    grep -q "^kolo-gpu/lib/$l\.so" "$WORK/list" || fail "bundle lacks lib/$l"
  done
  grep -q "^kolo-gpu/lib/libcud" "$WORK/list" && fail "bundle carries CUDA's own libraries"
  grep -qx "kolo-gpu/build-info.txt" "$WORK/list" || fail "bundle lacks build-info.txt"
  # Stripped: no symbol table left in the trainer.
  mkdir -p "$WORK/x" && tar -xJf "$BUNDLE" -C "$WORK/x" kolo-gpu/bin/kolo-train
  if readelf -S "$WORK/x/kolo-gpu/bin/kolo-train" | grep -q '\.symtab'; then
    fail "kolo-train in the bundle is not stripped"
  fi

  # The dry path: the plan, in order, naming only what the bundle has.
  if ! timeout 120 "$ROOT/scripts/gpu-check" --bin "$BUNDLE" --dry-run --budget-s 600 \
      >"$WORK/plan" 2>&1; then
    cat "$WORK/plan"
    fail "gpu-check --dry-run failed"
  fi
  python3 - "$WORK/plan" <<'EOF' || fail "the plan's steps"
import re, sys
steps = [l.split()[1] for l in open(sys.argv[1]) if l.startswith("step ")]
def first(prefix):
    idx = [i for i, s in enumerate(steps) if s.startswith(prefix)]
    assert idx, f"no step {prefix}*: {steps}"
    return idx[0]
order = ["test-", "kolo-resnet101-b64-tf32", "bench-", "ps-", "profile-", "ring-tcp", "rdma"]
pos = [first(p) for p in order]
assert pos == sorted(pos), f"steps out of order: {list(zip(order, pos))}"
for m in ("resnet101", "inception3", "vgg16"):
    for p in ("tf32", "fp16", "bf16"):
        assert f"kolo-{m}-b64-{p}" in steps and f"torch-{m}-b64-{p}" in steps, (m, p)
        assert f"profile-{m}-{p}" in steps and f"torch-profile-{m}-{p}" in steps, (m, p)
        assert f"kolo-plans-{m}-b64-{p}" in steps, (m, p)
assert "bench-np1-cuda" in steps and "bench-np2-nccl-refused" in steps
assert "ps-sync-resnet101-b64" in steps and "ps-overlap-resnet101-b64" in steps
text = open(sys.argv[1]).read()
assert "--backend nccl,nccl-direct,ring" in text.replace("\\,", ","), "the bench rows"
# kolo's tools refuse a flag given twice ("--precision: At Most 1 required but received 2"): no
# command of the plan may repeat one.
for line in open(sys.argv[1]):
    if not line.startswith("step "):
        continue
    words = line.split(":", 1)[1].split()
    starts = [i for i, w in enumerate(words) if re.search(r"/kolo-(train|allreduce-bench)$", w)]
    for s in starts:
        flags = [w for w in words[s + 1:] if w.startswith("-") and w != "--"]
        dup = {f for f in flags if flags.count(f) > 1}
        assert not dup, f"flags repeated in {line.split()[1]}: {sorted(dup)}"
print(f"plan: {len(steps)} steps in order")
EOF
  # A subset: one model, one precision, a test left out.
  timeout 120 "$ROOT/scripts/gpu-check" --bin "$BUNDLE" --dry-run --models vgg16 \
    --precisions fp16 --skip-tests kolo_cudnn_backend_test >"$WORK/subset" 2>&1 ||
    fail "gpu-check --dry-run with a subset failed"
  grep -q "^step kolo-vgg16-b64-fp16 " "$WORK/subset" || fail "the subset lacks kolo-vgg16-b64-fp16"
  grep -qE "^step (kolo|profile)-(resnet101|inception3)|^step kolo-vgg16-b64-(tf32|bf16)" \
    "$WORK/subset" && fail "the subset runs a model or precision it was not given"
  grep -q "^step test-kolo_cudnn_backend_test " "$WORK/subset" && fail "--skip-tests ran the test"
  for b in $(grep -o 'kolo-gpu/bin/[A-Za-z0-9_-]*' "$WORK/plan" | sort -u); do
    grep -qx "kolo-gpu/bin/${b##*/}" "$WORK/list" || fail "the plan names ${b##*/}, not in the bundle"
  done
fi

# Bad arguments: a clear error, not a run.
expect_error() {
  local name=$1 pattern=$2; shift 2
  timeout 300 "$@" >"$WORK/$name.out" 2>&1
  local rc=$?
  [[ $rc -ne 0 && $rc -ne 124 ]] || fail "$name: exit $rc, expected an error"
  grep -q -- "$pattern" "$WORK/$name.out" || { cat "$WORK/$name.out"; fail "$name: message lacks '$pattern'"; }
}
expect_error bad_budget "is not a whole number of seconds" "$ROOT/scripts/gpu-check" --budget-s soon --dry-run
expect_error bad_step "'bogus' is not a step" "$ROOT/scripts/gpu-check" --steps tests,bogus --dry-run
expect_error bad_model "'alexnet' is not a model" "$ROOT/scripts/gpu-check" --models alexnet --dry-run
expect_error bad_precision "'fp8' is not a precision" "$ROOT/scripts/gpu-check" --precisions fp8 --dry-run
expect_error bad_bin "is neither a folder nor a bundle file" "$ROOT/scripts/gpu-check" --bin "$WORK/none"
expect_error bad_arch "is not a CUDA architecture" "$ROOT/scripts/gpu/pack-deps" --bin --arch hopper
expect_error over_limit "over --max-mib 1" "$ROOT/scripts/gpu/pack-deps" --bin --dry-run \
  --build-dir "$BUILD" --max-mib 1 "$WORK/small.tar.xz"

# The summary of a run cut short: records that exist are tabled, an unreadable one is named.
mkdir -p "$WORK/records"
cat >"$WORK/records/kolo-resnet101-b64-fp16.json" <<'EOF'
{"status": "ok", "results": {"total_images_per_sec": 1200.0, "final_loss": 2.32}}
EOF
cat >"$WORK/records/torch-resnet101-b64-fp16.json" <<'EOF'
{"images_per_sec": 1000.0}
EOF
echo '{"status": "ok", "results": {"total_images_per_sec": 1100.0, "final_loss": 6.061}}' \
  >"$WORK/records/kolo-plans-resnet101-b64-fp16.json"
# A precision that begins with "b" (bf16) is not read as a batch size.
echo '{"status": "ok", "results": {"total_images_per_sec": 900.0}}' \
  >"$WORK/records/kolo-resnet101-b64-bf16.json"
echo '{"images_per_sec": 1000.0}' >"$WORK/records/torch-resnet101-b64-bf16.json"
echo '{"truncated": ' >"$WORK/records/kolo-vgg16-b64-bf16.json"
python3 "$ROOT/scripts/gpu/summarize.py" "$WORK/records" "$WORK/results.json" --gpu "NVIDIA H100" \
  >"$WORK/summary" 2>&1 || fail "summarize.py failed"
cat "$WORK/summary"
grep -q "| resnet101 | 64 | fp16 | 1200.0 | 1000.0 | 1.20x | 1100.0 | 1.10x | 2.32 / 6.06 |" \
  "$WORK/summary" || fail "summary row"
grep -q "| resnet101 | 64 | bf16 | 900.0 | 1000.0 | 0.90x | n/a | n/a | n/a / n/a |" "$WORK/summary" ||
  fail "bf16 row"
grep -q "| plans-" "$WORK/summary" && fail "the plans record was read as a model of its own"
grep -q "NVIDIA H100" "$WORK/summary" || fail "summary does not name the GPU"
grep -q "unreadable record kolo-vgg16-b64-bf16.json" "$WORK/summary" || fail "unreadable record"

if [[ $failures -ne 0 ]]; then
  echo "gpu_bundle: $failures failure(s)"
  exit 1
fi
echo "gpu_bundle: all checks passed"
