#!/usr/bin/env bash
# Coverage-guided fuzzing of fgpu's parsers (cargo-fuzz + libFuzzer): builds the targets of
# fuzz/ and runs each for FUZZ_SECONDS (default 600), one after the other, on one core.
#   hack/fuzz.sh                   every target      (make fuzz)
#   hack/fuzz.sh quantity authority  only these
#   FUZZ_SECONDS=60 hack/fuzz.sh   a shorter run
#
# cargo-fuzz is built once per machine from crates.io (cargo install --locked) into
# $FGPU_CACHE/tools/cargo-fuzz-<version> (cached_cargo_tool in lib.sh). libFuzzer needs the compiler's unstable
# -Zsanitizer flags: the fuzz build alone sets RUSTC_BOOTSTRAP=1 on the pinned stable
# toolchain (nothing else in the project does). Sanitizer: none (the fuzzed code is safe
# Rust, apart from the shim's file mappings; FUZZ_SANITIZER=address for ASan), with debug
# assertions (integer overflow panics). Its target directory is $FGPU_CACHE/target-fuzz.
#
# Each target reads the committed seeds (fuzz/corpus/<target>) and keeps what it finds in
# $FUZZ_WORK/corpus/<target> (default _out/fuzz, not committed). A crash stops the target
# and leaves its input in $FUZZ_WORK/artifacts/<target>/: fix the product, then commit the
# input under fuzz/regressions/<target>/ (cargo test -p fgpu-fuzz-targets replays them).
# libFuzzer's last line per target (execs, cov, ft) goes to $FUZZ_WORK/summary.txt.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CARGO_FUZZ_VERSION="${CARGO_FUZZ_VERSION:-0.13.2}"
FUZZ_SECONDS="${FUZZ_SECONDS:-600}"
FUZZ_SANITIZER="${FUZZ_SANITIZER:-none}"
FUZZ_WORK="${FUZZ_WORK:-$FGPU_ROOT/_out/fuzz}"
bin="$(cached_cargo_tool cargo-fuzz "$CARGO_FUZZ_VERSION")"

cd "$FGPU_ROOT/fuzz"
if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <("$bin" list)
fi

export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$FGPU_CACHE/target-fuzz}"
build=(--release --debug-assertions --sanitizer "$FUZZ_SANITIZER")
log "building ${#targets[@]} fuzz targets (sanitizer $FUZZ_SANITIZER)"
"$bin" build "${build[@]}"

mkdir -p "$FUZZ_WORK"
summary="$FUZZ_WORK/summary.txt"
: >"$summary"
failed=()
for t in "${targets[@]}"; do
  mkdir -p "$FUZZ_WORK/corpus/$t" "$FUZZ_WORK/artifacts/$t"
  seeds=("$FGPU_ROOT/fuzz/corpus/$t")
  [ -d "$FGPU_ROOT/fuzz/regressions/$t" ] && seeds+=("$FGPU_ROOT/fuzz/regressions/$t")
  log "fuzzing $t for ${FUZZ_SECONDS}s"
  logf="$FUZZ_WORK/$t.log"
  # -jobs=1: one process on one core; new inputs go to the first corpus directory only.
  if "$bin" run "${build[@]}" "$t" "$FUZZ_WORK/corpus/$t" "${seeds[@]}" -- \
    -max_total_time="$FUZZ_SECONDS" -artifact_prefix="$FUZZ_WORK/artifacts/$t/" \
    -print_final_stats=1 -rss_limit_mb=4096 >"$logf" 2>&1; then
    status=ok
  else
    status=CRASH
    failed+=("$t")
  fi
  # libFuzzer's last status line (#execs ... cov: N ft: N ...) and its final stats.
  line="$(grep -a -E '^#[0-9]+' "$logf" | tail -1 || true)"
  execs="$(grep -a -E '^stat::number_of_executed_units' "$logf" | awk '{print $2}' || true)"
  printf '%-18s %-5s execs=%s %s\n' "$t" "$status" "${execs:-?}" "$line" | tee -a "$summary"
done

if [ ${#failed[@]} -gt 0 ]; then
  die "crashes in: ${failed[*]} (inputs under $FUZZ_WORK/artifacts/, logs $FUZZ_WORK/<target>.log)"
fi
log "no crashes; summary in $summary"
