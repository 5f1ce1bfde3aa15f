# shellcheck shell=bash
# Adversarial cases of the shim's tests, sourced by run.sh (which defines run, must_fail,
# ok, ko, $SHIM, $BIN, $WORK). Each attacks one protection and was seen failing against
# the shim of commit 0e99016 (FGPU_TEST_SHIM=<old libfgpu.so> runs the suite against it).
# The claim-mode cases build /etc/fgpu/claims inside a private mount namespace (an
# overlay on /etc and bind mounts there; nothing is mounted in the host's namespace).

H=$BIN/hostile
MI=$((1 << 20))
ACC_SIZE=164928 # state::FILE_SIZE
CORE_SIZE=4160  # core::FILE_SIZE
chmod 0755 "$WORK"

uuid() { printf 'GPU-fa4ec0da-0000-0000-8000-0000000000%02x' "$1"; }

# claim_file UID LINE...: the limits file of claim UID (contract v2) beside zero-filled
# accounts of the plugin's sizes, mode 0666; prints the file's path.
claim_file() {
  local uid=$1 d="$WORK/claims/$1"
  shift
  mkdir -p "$d"
  chmod 0755 "$WORK/claims" "$d"
  truncate -s $ACC_SIZE "$d/memory.state"
  truncate -s $CORE_SIZE "$d/core.state"
  chmod 0666 "$d/memory.state" "$d/core.state"
  {
    echo version=2
    echo "claim=test/$uid"
    echo "claim_uid=$uid"
    echo "memory_account=$d/memory.state"
    echo "core_account=$d/core.state"
    printf '%s\n' "$@"
  } >"$d/limits"
  echo "$d/limits"
}

# in_ns SETUP CMD...: CMD in a private mount namespace whose /etc/fgpu/claims SETUP made
# with `mount_claim UID FILE` (a read-only bind mount, as the plugin's CDI spec does) and
# `forge_claim UID FILE` (a plain copy: what a workload could make).
in_ns() {
  local setup=$1 ns
  shift
  ns=$(mktemp -d "$WORK/ns.XXXXXX")
  # shellcheck disable=SC2016 # expanded by the inner shell
  unshare -m bash -c '
    set -e
    ns=$1 setup=$2
    shift 2
    mount --make-rprivate /
    mount -t tmpfs tmpfs "$ns"
    mkdir "$ns/up" "$ns/wk"
    mount -t overlay overlay -o "lowerdir=/etc,upperdir=$ns/up,workdir=$ns/wk" /etc
    mkdir -p /etc/fgpu/claims
    mount_claim() {
      mkdir -p "/etc/fgpu/claims/$1"
      touch "/etc/fgpu/claims/$1/limits"
      mount --bind -o ro "$2" "/etc/fgpu/claims/$1/limits"
    }
    forge_claim() { mkdir -p "/etc/fgpu/claims/$1"; cp "$2" "/etc/fgpu/claims/$1/limits"; }
    eval "$setup"
    exec "$@"' in_ns "$ns" "$setup" "$@"
}

# refused NAME PATTERN CMD...: CMD fails and its stderr names the problem.
refused() {
  local name=$1 pat=$2
  shift 2
  if "$@" >"$WORK/out" 2>"$WORK/err"; then
    ko "$name (expected a refusal)"
    sed 's/^/      /' "$WORK/out"
  elif grep -q -- "$pat" "$WORK/err"; then
    ok "$name: $(grep -m1 -- "$pat" "$WORK/err" | cut -c1-160)"
  else
    ko "$name (refused without naming '$pat')"
    sed 's/^/      /' "$WORK/err"
  fi
}

S=(env LD_PRELOAD="$SHIM")
# The claim-mode cases need root (a private mount namespace); without it they fail
# loudly rather than pass unseen.
if ! in_ns ":" true 2>"$WORK/err"; then
  ko "claim-mode cases need root and a private mount namespace (unshare -m): $(head -n1 "$WORK/err")"
fi
G0=$(uuid 0) G1=$(uuid 1)

echo "== claim mode: the plugin's limits files are the only source"
L=$(claim_file redir "gpu.$G0.memory=$((32 * MI))")
printf 'FGPU_MEMORY_LIMIT=1Gi\n' >"$WORK/elsewhere"
: >"$WORK/empty-limits"
run "FGPU_LIMITS_FILE=/elsewhere + FGPU_MEMORY_LIMIT cannot loosen the mounted file" \
  in_ns "mount_claim redir $L" "${S[@]}" FGPU_LIMITS_FILE="$WORK/elsewhere" FGPU_MEMORY_LIMIT=2Gi \
  "$H" quota 0 $((32 * MI))
run "FGPU_LIMITS_FILE=/empty and no FGPU_MEMORY_LIMIT* cannot switch it off" \
  in_ns "mount_claim redir $L" "${S[@]}" FGPU_LIMITS_FILE="$WORK/empty-limits" \
  "$H" quota 0 $((32 * MI))
F=$(claim_file forged "gpu.$G0.memory=$((1 << 40))")
refused "a forged (not mounted) limits file is not trusted: everything refused" "no limits file mounted" \
  in_ns "forge_claim forged $F" "${S[@]}" "$H" alloc 0 4096
run "a forged file beside the mounted one changes nothing" \
  in_ns "mount_claim redir $L; forge_claim forged $F" "${S[@]}" "$H" quota 0 $((32 * MI))
M=$(claim_file bad "gpu.$G0.memory=$((32 * MI))")
sed -i 's/^version=2/version=3/' "$M"
refused "a malformed limits file (version=3) refuses every allocation" "version" \
  in_ns "mount_claim bad $M" "${S[@]}" "$H" alloc 0 4096
M2=$(claim_file bad2 "gpu.$G0.memory=lots")
refused "a malformed value refuses every allocation" "expected a byte count" \
  in_ns "mount_claim bad2 $M2" "${S[@]}" "$H" alloc 0 4096
refused "a GPU no claim names is refused" "no claim of this container names it" \
  in_ns "mount_claim redir $L" "${S[@]}" "$H" alloc 1 4096

echo "== claim mode: the research tier spills past the physical part to managed memory"
GI=$((1 << 30))
P=$(claim_file spill "gpu.$G0.memory=$((3 * GI))" "gpu.$G0.physical=$((2 * GI))")
run "grant 3 GiB, physical 2 GiB: 2 GiB device, the next 1 GiB managed (counted), 1 byte more refused" \
  in_ns "mount_claim spill $P" "${S[@]}" "$H" spill 0 $((3 * GI)) $((2 * GI)) "$WORK/claims/spill/memory.state"
N=$(claim_file nospill "gpu.$G0.memory=$((3 * GI))")
must_fail "without physical= in the plugin's file nothing spills (all 3 GiB on the device)" \
  in_ns "mount_claim nospill $N" "${S[@]}" "$H" spill 0 $((3 * GI)) $((2 * GI)) "$WORK/claims/nospill/memory.state"
FP=$(claim_file forgedp "gpu.$G0.memory=$((3 * GI))" "gpu.$G0.physical=$((2 * GI))")
must_fail "a tenant cannot add physical=: a forged file beside the plugin's changes nothing" \
  in_ns "mount_claim nospill $N; forge_claim forgedp $FP" "${S[@]}" "$H" spill 0 $((3 * GI)) $((2 * GI)) \
  "$WORK/claims/nospill/memory.state"

echo "== claim mode: limits by GPU UUID, several claims"
O=$(claim_file order "gpu.$G0.memory=$((16 * MI))" "gpu.$G1.memory=$((48 * MI))")
run "CUDA_VISIBLE_DEVICES=1,0: device 0 (GPU 1) keeps GPU 1's 48 MiB" \
  in_ns "mount_claim order $O" "${S[@]}" CUDA_VISIBLE_DEVICES=1,0 "$H" quota 0 $((48 * MI))
run "CUDA_VISIBLE_DEVICES=1,0: device 1 (GPU 0) keeps GPU 0's 16 MiB" \
  in_ns "mount_claim order $O" "${S[@]}" CUDA_VISIBLE_DEVICES=1,0 "$H" quota 1 $((16 * MI))
A=$(claim_file ca "gpu.$G0.memory=$((16 * MI))")
B=$(claim_file cb "gpu.$G1.memory=$((24 * MI))")
run "two claims merge: GPU 0 at claim a's 16 MiB" \
  in_ns "mount_claim ca $A; mount_claim cb $B" "${S[@]}" "$H" quota 0 $((16 * MI))
run "two claims merge: GPU 1 at claim b's 24 MiB" \
  in_ns "mount_claim ca $A; mount_claim cb $B" "${S[@]}" "$H" quota 1 $((24 * MI))
D=$(claim_file cd "gpu.$G0.memory=$((64 * MI))")
refused "a GPU named by two claims is refused, naming both" "test/ca, test/cd" \
  in_ns "mount_claim ca $A; mount_claim cd $D" "${S[@]}" "$H" alloc 0 4096

echo "== accounts: fail closed, any UID"
X=$(claim_file dmg "gpu.$G0.memory=$((32 * MI))")
head -c $ACC_SIZE /dev/urandom >"$WORK/claims/dmg/memory.state"
refused "a damaged account (bad header) refuses" "unknown magic" \
  in_ns "mount_claim dmg $X" "${S[@]}" "$H" alloc 0 4096
Y=$(claim_file del "gpu.$G0.memory=$((32 * MI))")
rm "$WORK/claims/del/memory.state"
refused "a deleted account refuses (never a private one)" "No such file" \
  in_ns "mount_claim del $Y" "${S[@]}" "$H" alloc 0 4096
Z=$(claim_file short "gpu.$G0.memory=$((32 * MI))")
truncate -s 4096 "$WORK/claims/short/memory.state"
refused "an account of the wrong size refuses" "expected exactly" \
  in_ns "mount_claim short $Z" "${S[@]}" "$H" alloc 0 4096
ln -sf "$WORK/claims/redir/memory.state" "$WORK/claims/sym.state"
SY=$(claim_file sym "gpu.$G0.memory=$((32 * MI))")
sed -i "s|^memory_account=.*|memory_account=$WORK/claims/sym.state|" "$SY"
refused "an account behind a symlink is not followed" "Too many levels of symbolic links" \
  in_ns "mount_claim sym $SY" "${S[@]}" "$H" alloc 0 4096
edir="$WORK/env-damaged"
mkdir -p "$edir"
head -c $ACC_SIZE /dev/urandom >"$edir/fgpu-memory.state"
refused "env mode: a damaged account refuses (no private fallback)" "unknown magic" \
  "${S[@]}" FGPU_MEMORY_LIMIT=64Mi FGPU_STATE_DIR="$edir" "$H" alloc 0 4096

# Non-root: 4 processes of UID 1000 share one 64 MiB quota: three hold 20 MiB each,
# the fourth cannot take 20 MiB more but can take 4 MiB.
NR=$(claim_file nonroot "gpu.$G0.memory=$((64 * MI))")
cat >"$WORK/nonroot.sh" <<EOS
set -u
as() { setpriv --reuid 1000 --regid 1000 --clear-groups env LD_PRELOAD="$SHIM" LD_LIBRARY_PATH="\$LD_LIBRARY_PATH" "\$@"; }
pids=""
for i in 1 2 3; do
  # exec: \$! is then the holder itself (setpriv and env exec too), which the kill below
  # must reach; a function run in the background is a subshell of its own.
  (as_exec() { exec setpriv --reuid 1000 --regid 1000 --clear-groups env LD_PRELOAD="$SHIM" LD_LIBRARY_PATH="\$LD_LIBRARY_PATH" "\$@"; }
   as_exec "$H" hold 0 $((20 * MI)) none) >"$WORK/nr-\$i" 2>&1 &
  pids="\$pids \$!"
done
for i in 1 2 3; do
  for _ in \$(seq 100); do grep -q holding "$WORK/nr-\$i" && break; sleep 0.05; done
done
r=0
if as "$H" alloc 0 $((20 * MI)) 2>/dev/null; then echo "a 4th process took 20 MiB past the shared 64 MiB"; r=1; fi
as "$H" alloc 0 $((4 * MI)) || r=1
cat "$WORK"/nr-1 "$WORK"/nr-2 "$WORK"/nr-3 >&2
kill \$pids
wait \$pids 2>/dev/null
exit \$r
EOS
if in_ns "mount_claim nonroot $NR" bash "$WORK/nonroot.sh" >"$WORK/out" 2>"$WORK/err" &&
  [ "$(grep -c holding "$WORK/err")" = 3 ]; then
  ok "UID 1000: 4 processes share one 64 MiB quota (3 x 20 MiB held, a 4th 20 MiB refused, 4 MiB taken)"
else
  ko "UID 1000 sharing one quota"
  sed 's/^/      /' "$WORK/out" "$WORK/err"
fi

echo "== liveness survives a program closing descriptors it did not open"
for mode in closefrom close_range dup2 close; do
  st="$WORK/state-$mode"
  mkdir -p "$st"
  "${S[@]}" FGPU_MEMORY_LIMIT=64Mi FGPU_STATE_DIR="$st" "$H" hold 0 $((48 * MI)) $mode >"$WORK/hold-$mode" 2>&1 &
  holder=$!
  for _ in $(seq 100); do grep -q holding "$WORK/hold-$mode" && break; sleep 0.05; done
  must_fail "$mode(3..): the holder's 48 MiB stay counted (a second process cannot take 32 MiB)" \
    "${S[@]}" FGPU_MEMORY_LIMIT=64Mi FGPU_STATE_DIR="$st" "$H" alloc 0 $((32 * MI))
  kill -KILL $holder
  wait $holder 2>/dev/null
  run "$mode: ... and are reclaimed once it is killed" \
    "${S[@]}" FGPU_MEMORY_LIMIT=64Mi FGPU_STATE_DIR="$st" "$H" alloc 0 $((32 * MI))
done

echo "== priority coordination files"
gdir="$WORK/gpu-dir-hostile"
mkdir -p "$gdir"
printf 'precious\n' >"$WORK/victim"
chmod 0600 "$WORK/victim"
ln -s "$WORK/victim" "$gdir/$G0.priority"
"${S[@]}" FGPU_PRIORITY=high FGPU_GPU_DIR="$gdir" "$H" max-gap 0.2 0 >/dev/null 2>"$WORK/err"
if [ "$(stat -c %a "$WORK/victim")" = 600 ] && [ "$(cat "$WORK/victim")" = precious ]; then
  ok "a symlink planted in FGPU_GPU_DIR is not followed (target's mode and bytes unchanged): $(head -c 120 "$WORK/err")"
else
  ko "the shim followed a planted symlink: mode $(stat -c %a "$WORK/victim"), $(od -c "$WORK/victim" | head -n2)"
fi
printf 'precious\n' >"$WORK/victim2"
ln "$WORK/victim2" "$gdir/$G1.priority"
"${S[@]}" FGPU_PRIORITY=high FGPU_GPU_DIR="$gdir" "$H" max-gap 0.2 1 >/dev/null 2>&1
if printf 'precious\n' | cmp -s - "$WORK/victim2"; then
  ok "a hard link planted in FGPU_GPU_DIR is not stamped (bytes unchanged)"
else
  ko "a planted hard link was written: $(od -c "$WORK/victim2" | head -n2)"
fi
# A tenant stamping the (env mode, shared) file 30 ms into the future, continuously:
# stamps from the future are ignored, so the low-priority claim is not stalled.
pdir="$WORK/gpu-dir-forged"
mkdir -p "$pdir"
head -c 64 /dev/zero >"$pdir/$G0.priority"
"$H" forge "$pdir/$G0.priority" 1.5 30 &
forger=$!
"${S[@]}" FGPU_PRIORITY=low FGPU_GPU_DIR="$pdir" "$H" max-gap 1.2 0 >"$WORK/gap" 2>&1
wait $forger
gap=$(sed -n 's/max_gap_ms=\([0-9.]*\).*/\1/p' "$WORK/gap")
if awk -v g="$gap" 'BEGIN { exit !(g != "" && g < 100) }'; then
  ok "forged future stamps do not stall a low-priority claim: longest gap $gap ms"
else
  ko "forged stamps stalled the low-priority claim: '$(cat "$WORK/gap")'"
fi
# Claim mode: the plugin mounts the GPU's file read-only into a low-priority claim;
# the shim must open it read-only and still honour a high-priority claim's stamps.
PF="$WORK/claims/$G0.priority"
head -c 64 /dev/zero >"$PF"
chmod 0666 "$PF"
LP=$(claim_file low "priority=low" "gpu.$G0.memory=$((64 * MI))" "gpu.$G0.priority_file=$PF")
"$H" forge "$PF" 1.5 0 &
forger=$!
in_ns "mount_claim low $LP; mount --bind -o ro $PF $PF" "${S[@]}" "$H" max-gap 1.2 0 >"$WORK/gap" 2>&1
wait $forger
gap=$(sed -n 's/max_gap_ms=\([0-9.]*\).*/\1/p' "$WORK/gap")
if awk -v g="$gap" 'BEGIN { exit !(g != "" && g > 500) }'; then
  ok "claim mode: a read-only priority file still makes a low claim yield to high-priority stamps (gap $gap ms)"
else
  ko "claim mode low priority did not yield: '$(cat "$WORK/gap")'"
fi

echo "== core quota with NVML reporting foreign PIDs"
core2() {
  exec env FAKE_CUDA_GPUS=4 FAKE_CUDA_STATE="$WORK/fake-gpu-hostile" FAKE_CUDA_BLOCK_NS=10000 \
    FAKE_CUDA_GRAPH_NS=3000000 LD_PRELOAD="$SHIM" "$@"
}
mkdir -p "$WORK/c-zero" "$WORK/c-hidden" "$WORK/c-claim"
core2 FAKE_CUDA_NVML_PID_OFFSET=0 FGPU_CORE_LIMIT=30 FGPU_STATE_DIR="$WORK/c-zero" HT_DEV=0 \
  "$BIN/hooktest" work 7 2 >"$WORK/core-zero" 2>&1 &
core2 FAKE_CUDA_NVML_HIDE_MEMORY=1 FGPU_CORE_LIMIT=30 FGPU_STATE_DIR="$WORK/c-hidden" HT_DEV=1 \
  "$BIN/hooktest" work 7 2 >"$WORK/core-hidden" 2>&1 &
CQ=$(claim_file core "gpu.$(uuid 2).cores=40" "gpu.$(uuid 2).memory=$((64 * MI))")
in_ns "mount_claim core $CQ" env FAKE_CUDA_GPUS=4 FAKE_CUDA_STATE="$WORK/fake-gpu-hostile" \
  FAKE_CUDA_BLOCK_NS=10000 FAKE_CUDA_GRAPH_NS=3000000 LD_PRELOAD="$SHIM" HT_DEV=2 \
  "$BIN/hooktest" work 7 2 >"$WORK/core-claim" 2>&1 &
# A damaged core account (wrong size): the claim cannot share its quota, so its GPU is
# held to 1 % (closed), with one line on stderr.
CB=$(claim_file corebad "gpu.$(uuid 3).cores=50" "gpu.$(uuid 3).memory=$((64 * MI))")
truncate -s 100 "$WORK/claims/corebad/core.state"
in_ns "mount_claim corebad $CB" env FAKE_CUDA_GPUS=4 FAKE_CUDA_STATE="$WORK/fake-gpu-hostile" \
  FAKE_CUDA_BLOCK_NS=10000 FAKE_CUDA_GRAPH_NS=3000000 LD_PRELOAD="$SHIM" HT_DEV=3 \
  "$BIN/hooktest" work 4 1 >"$WORK/core-bad" 2>"$WORK/core-bad-err" &
wait
gz=$(share_of "$WORK/core-zero")
gh=$(share_of "$WORK/core-hidden")
gc=$(share_of "$WORK/core-claim")
if within "$gz" 30 3; then ok "control, NVML PIDs = own PIDs (offset 0): 30 % quota -> $gz %"; else ko "offset 0: '$gz'"; cat "$WORK/core-zero"; fi
if within "$gh" 30 3; then ok "unidentifiable process (NVML hides memory): never fails open, 30 % quota -> $gh %"; else ko "unidentified: '$gh'"; cat "$WORK/core-hidden"; fi
gb=$(share_of "$WORK/core-bad")
if awk -v g="$gb" 'BEGIN { exit !(g != "" && g < 5) }' && grep -q "core account" "$WORK/core-bad-err"; then
  ok "a damaged core account holds its claim to 1 % (asked 50 %): $gb %; $(head -c 110 "$WORK/core-bad-err")"
else
  ko "damaged core account: '$gb'"
  cat "$WORK/core-bad" "$WORK/core-bad-err"
fi
if within "$gc" 40 3; then ok "claim mode: gpu.<UUID>.cores=40 with foreign PIDs -> $gc %"; else ko "claim-mode core quota: '$gc'"; cat "$WORK/core-claim"; fi

# The node's feed replaces the upper bound: claim A (30 %, unidentifiable: NVML hides memory) shares
# GPU 3 with claim B (50 %). Without a feed A can only count B's time as its own (the
# upper bound) and stays far below its quota: closed, not open. With a fresh feed saying
# A's own utilisation (written as the node monitor would), A gets its 30 %.
mkdir -p "$WORK/fa" "$WORK/fb" "$WORK/fa2" "$WORK/fb2"
core2 FAKE_CUDA_NVML_HIDE_MEMORY=1 FGPU_CORE_LIMIT=30 FGPU_STATE_DIR="$WORK/fa" HT_DEV=3 \
  FGPU_FEED_FILE="$WORK/feed" "$BIN/hooktest" work 7 2 >"$WORK/feed-a" 2>&1 &
a=$!
core2 FGPU_CORE_LIMIT=50 FGPU_STATE_DIR="$WORK/fb" HT_DEV=3 "$BIN/hooktest" work 7 2 >"$WORK/feed-b" 2>&1 &
env FAKE_CUDA_GPUS=4 FAKE_CUDA_STATE="$WORK/fake-gpu-hostile" "$H" feed "$WORK/feed" "$(uuid 3)" 3 $a 7 &
# Two claims, one GPU each: a launch on claim A's GPU 0 first, then work on claim B's GPU
# 1. Both GPUs are entry 0 of their claim's account; registering in A's must not pass
# for registering in B's (B's quota would then measure none of its own work: open).
T1=$(claim_file twoa "gpu.$(uuid 0).cores=30" "gpu.$(uuid 0).memory=$((64 * MI))")
T2=$(claim_file twob "gpu.$(uuid 1).cores=30" "gpu.$(uuid 1).memory=$((64 * MI))")
in_ns "mount_claim twoa $T1; mount_claim twob $T2" env FAKE_CUDA_GPUS=4 \
  FAKE_CUDA_STATE="$WORK/fake-gpu-hostile" FAKE_CUDA_BLOCK_NS=10000 FAKE_CUDA_GRAPH_NS=3000000 \
  LD_PRELOAD="$SHIM" HT_TOUCH0=1 HT_DEV=1 "$BIN/hooktest" work 7 2 >"$WORK/core-two" 2>&1 &
wait
gt=$(share_of "$WORK/core-two")
if within "$gt" 30 3; then
  ok "a process of two claims: claim B's GPU keeps its 30 % after a launch under claim A's: $gt %"
else
  ko "two claims, core quota on the second: '$gt'"
  cat "$WORK/core-two"
fi
core2 FAKE_CUDA_NVML_HIDE_MEMORY=1 FGPU_CORE_LIMIT=30 FGPU_STATE_DIR="$WORK/fa2" HT_DEV=2 \
  "$BIN/hooktest" work 7 2 >"$WORK/nofeed-a" 2>&1 &
core2 FGPU_CORE_LIMIT=50 FGPU_STATE_DIR="$WORK/fb2" HT_DEV=2 "$BIN/hooktest" work 7 2 >"$WORK/nofeed-b" 2>&1 &
wait
fa=$(share_of "$WORK/feed-a") fb=$(share_of "$WORK/feed-b")
na=$(share_of "$WORK/nofeed-a") nb=$(share_of "$WORK/nofeed-b")
if within "$fa" 30 3 && within "$fb" 50 3; then
  ok "a fresh utilisation feed replaces the upper bound: unidentifiable 30 % claim at $fa % beside 50 % at $fb %"
else
  ko "feed: '$fa' + '$fb'"
  cat "$WORK/feed-a" "$WORK/feed-b"
fi
if awk -v a="$na" 'BEGIN { exit !(a != "" && a < 27) }' && within "$nb" 50 3; then
  ok "without the feed the unidentifiable claim errs closed: $na % (quota 30) beside $nb %"
else
  ko "no feed: '$na' + '$nb'"
fi
