#!/usr/bin/env bash
# GPU check for dflash on a CUDA node without network access and without Rust.
#
# What it needs next to it (`make gpu-bundle` puts them in runs/gpu-bundle/, under 60 MB):
#   dflashd, dflash-bench        the release binaries (built against libtorch 2.11.0)
#   benches/reference/*.py       the PyTorch reference scripts
# and, on the node: a Python with torch 2.11.0 (CUDA 13 build) and its usual companions
# (triton for flex_attention / torch.compile; transformers is not needed here).
#
# What it does, in under 8 minutes (each step has its own timeout inside that budget):
#   1. finds libtorch through the node's Python and points LD_LIBRARY_PATH at it;
#   2. checks the binaries run and see CUDA (`dflashd doctor`, a bf16 matmul by dflash-bench);
#   3. reference self-check on CUDA: eager (dense mask) vs flex_attention, forward and backward;
#   4. correctness parity on the tiny config: engine CUDA vs CPU (fp32, same weights and batch),
#      and engine CUDA bf16 vs the reference in bf16;
#   5. the drafter-step benchmark on the `gpu-large` config (a Qwen3-8B-sized drafter, 4096
#      tokens, 512 anchors, block 16) in bf16: engine vs the reference with flex_attention and
#      torch.compile; tok/s and MFU against the H200 datasheet figure (989 TFLOP/s dense bf16,
#      NVIDIA's spec sheet; no sparsity) and against a bf16 matmul measured in the same run.
#
# Environment: PYTHON (default python3), DFLASHD and DFLASH_BENCH (default ./dflashd and
# ./dflash-bench next to this script, else target/release/ of the repository), OUT (default
# ./gpu-check-results), BUDGET_S (480).
# DEVICE=cpu is a plumbing self-test for machines without a GPU: the same steps on the CPU with
# the tiny config in fp32 (no parity, no flex/compile in the benchmark); its figures mean nothing.
#
# Status: written without access to a GPU; the CPU paths it drives are tested, this script as a
# whole is untested on a CUDA node.
set -u

BUDGET_S=${BUDGET_S:-480}
DEVICE=${DEVICE:-cuda}
START=$SECONDS
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/gpu-check-results}
mkdir -p "$OUT"
LOG="$OUT/gpu-check.log"
: >"$LOG"

declare -a SUMMARY=()
FAILED=0
say() { echo "$*" | tee -a "$LOG"; }
ok() { SUMMARY+=("ok       $1"); say "[ok] $1"; }
missing() { SUMMARY+=("MISSING  $1"); say "[MISSING] $1"; FAILED=1; }
failed() { SUMMARY+=("FAILED   $1"); say "[FAILED] $1"; FAILED=1; }
skipped() { SUMMARY+=("skipped  $1"); say "[skipped] $1"; }
left() { echo $((BUDGET_S - (SECONDS - START))); }

finish() {
    say ""
    say "=== summary ($((SECONDS - START)) s of ${BUDGET_S} s; log: $LOG) ==="
    for line in "${SUMMARY[@]}"; do say "  $line"; done
    exit "$FAILED"
}

# Runs "$@" with a timeout of min($1, time left) seconds, output to the log and $OUT/$2.out.
run_step() {
    local limit=$1 name=$2
    shift 2
    local remaining
    remaining=$(left)
    if [ "$remaining" -lt 20 ]; then
        skipped "$name: the ${BUDGET_S} s budget is spent"
        return 99
    fi
    [ "$limit" -gt "$remaining" ] && limit=$remaining
    say "--- $name (timeout ${limit} s): $*"
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
    local rc=$?
    cat "$OUT/$name.out" >>"$LOG"
    tail -n 20 "$OUT/$name.err" >>"$LOG"
    [ $rc -eq 124 ] && say "    (killed after ${limit} s)"
    return $rc
}

say "dflash gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
command -v nvidia-smi >/dev/null && nvidia-smi -L 2>&1 | tee -a "$LOG"

# --- 1. Python, torch, libtorch --------------------------------------------------------------
if ! command -v "$PY" >/dev/null; then
    missing "python: \`$PY\` not found (set PYTHON=/path/to/python with torch 2.11.0)"
    finish
fi
TORCH_INFO=$("$PY" - <<'EOF' 2>>"$LOG"
import importlib.util, os, torch
print(os.path.dirname(torch.__file__))
print(torch.__version__)
print(torch.cuda.is_available())
print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
print(",".join(m for m in ("triton", "transformers") if importlib.util.find_spec(m) is None) or "-")
EOF
)
if [ -z "$TORCH_INFO" ]; then
    missing "torch: \`$PY -c 'import torch'\` fails (see $LOG); this node's Python needs torch 2.11.0"
    finish
fi
TORCH_DIR=$(sed -n 1p <<<"$TORCH_INFO")
TORCH_VERSION=$(sed -n 2p <<<"$TORCH_INFO")
TORCH_CUDA=$(sed -n 3p <<<"$TORCH_INFO")
GPU_NAME=$(sed -n 4p <<<"$TORCH_INFO")
ABSENT=$(sed -n 5p <<<"$TORCH_INFO")
say "torch $TORCH_VERSION at $TORCH_DIR; CUDA available: $TORCH_CUDA; device 0: $GPU_NAME"
case "$TORCH_VERSION" in
    2.11.0*) ok "torch $TORCH_VERSION (the libtorch dflashd was built against)" ;;
    *) failed "torch $TORCH_VERSION: dflashd is built for libtorch 2.11.0; a different libtorch may not load or may misbehave" ;;
esac
[ "$TORCH_CUDA" = "True" ] || [ "$DEVICE" = cpu ] || { missing "CUDA: torch.cuda.is_available() is False on this node (driver? CUDA_VISIBLE_DEVICES?)"; finish; }
[ "$ABSENT" = "-" ] || say "note: python modules not installed: $ABSENT (triton is needed for flex_attention and torch.compile)"
if [ ! -d "$TORCH_DIR/lib" ]; then
    missing "libtorch: $TORCH_DIR/lib does not exist"
    finish
fi
export LD_LIBRARY_PATH="$TORCH_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# --- 2. the binary ----------------------------------------------------------------------------
DFLASHD=${DFLASHD:-}
if [ -z "$DFLASHD" ]; then
    for c in "$HERE/dflashd" "$HERE/../target/release/dflashd"; do
        [ -x "$c" ] && DFLASHD=$c && break
    done
fi
if [ -z "$DFLASHD" ] || [ ! -x "$DFLASHD" ]; then
    missing "dflashd: no executable at \$DFLASHD, $HERE/dflashd or $HERE/../target/release/dflashd (copy the release binary next to this script)"
    finish
fi
DFLASH_BENCH=${DFLASH_BENCH:-}
if [ -z "$DFLASH_BENCH" ]; then
    for c in "$HERE/dflash-bench" "$HERE/../target/release/dflash-bench"; do
        [ -x "$c" ] && DFLASH_BENCH=$c && break
    done
fi
if [ -z "$DFLASH_BENCH" ] || [ ! -x "$DFLASH_BENCH" ]; then
    missing "dflash-bench: no executable at \$DFLASH_BENCH, $HERE/dflash-bench or $HERE/../target/release/dflash-bench (copy the release binary next to this script)"
    finish
fi
REF=""
for c in "$HERE/benches/reference" "$HERE/../benches/reference"; do
    [ -f "$c/bench_step.py" ] && REF=$(cd "$c" && pwd) && break
done
[ -n "$REF" ] || missing "reference scripts: no benches/reference/bench_step.py next to this script or in its repository"
if command -v ldd >/dev/null; then
    for BIN in "$DFLASHD" "$DFLASH_BENCH"; do
        UNRESOLVED=$(ldd "$BIN" 2>/dev/null | grep 'not found')
        [ -n "$UNRESOLVED" ] && { missing "shared libraries for $BIN: $(echo "$UNRESOLVED" | tr '\n' ' ')"; finish; }
    done
fi
if run_step 60 doctor "$DFLASHD" doctor; then
    ok "dflashd doctor runs against $TORCH_DIR/lib: $(tr '\n' ' ' <"$OUT/doctor.out")"
else
    failed "dflashd doctor exited non-zero: $(tail -n 3 "$OUT/doctor.err" | tr '\n' ' ')"
    finish
fi
# The proof that the engine drives the GPU: a bf16 matmul through libtorch_cuda.
if run_step 60 cuda-matmul "$DFLASH_BENCH" --child matmul --device "$DEVICE" --dtype bf16 --matmul-n 4096 --warmup 1 --steps 3 --work-dir "$OUT"; then
    ok "engine on $DEVICE: $(grep -o '"gflops":[0-9.]*' "$OUT/cuda-matmul.out") (bf16 4096^3 matmul)"
else
    failed "the engine cannot run on CUDA (libtorch_cuda not linked or not loadable?): $(tail -n 3 "$OUT/cuda-matmul.out" "$OUT/cuda-matmul.err" | tr '\n' ' ')"
    finish
fi
[ -n "$REF" ] || finish

last_json() { grep '^{' "$1" | tail -n 1; }

# --- 3. reference self-check --------------------------------------------------------------------
if run_step 150 reference-backends "$PY" "$REF/check_backends.py" --device "$DEVICE"; then
    ok "reference: eager and flex_attention agree on $DEVICE ($(tail -n 2 "$OUT/reference-backends.out" | tr '\n' ' '))"
else
    failed "reference self-check (eager vs flex on CUDA): see $OUT/reference-backends.err"
fi

# --- 4. parity -----------------------------------------------------------------------------------
COMMON=(--python "$PY" --reference-dir "$REF" --device "$DEVICE")
if [ "$DEVICE" = cpu ]; then
    skipped "parity: needs CUDA"
elif run_step 180 parity "$DFLASH_BENCH" --cases parity "${COMMON[@]}" --reference-attention eager --out-dir "$OUT/parity" --timeout-s 170; then
    P=$(last_json "$OUT/parity.out")
    CUDA_CPU=$(echo "$P" | "$PY" -c 'import json,sys; print(json.load(sys.stdin).get("parity_cuda_vs_cpu"))' 2>/dev/null)
    BF16_REF=$(echo "$P" | "$PY" -c 'import json,sys; print(json.load(sys.stdin).get("parity_bf16_vs_reference"))' 2>/dev/null)
    [ "$CUDA_CPU" = "ok" ] && ok "parity: engine CUDA fp32 = CPU fp32 on the tiny config (first-step loss within 1e-4)" || failed "parity CUDA vs CPU: $CUDA_CPU"
    [ "$BF16_REF" = "ok" ] && ok "parity: engine CUDA bf16 = reference bf16 (first-step loss within 2e-2)" || failed "parity CUDA bf16 vs reference: $BF16_REF"
else
    failed "parity run: see $OUT/parity.err and $OUT/parity/results.json"
fi

# --- 5. benchmark ---------------------------------------------------------------------------------
if [ "$DEVICE" = cpu ]; then
    BENCH=(--configs tiny --dtype f32 --reference-attention eager --warmup 1 --steps 2)
else
    BENCH=(--configs gpu-large --dtype bf16 --reference-attention flex --reference-compile --warmup 3 --steps 10)
fi
if run_step 420 gpu-large "$DFLASH_BENCH" --cases step "${COMMON[@]}" "${BENCH[@]}" --datasheet-peak-tflops 989 \
    --out-dir "$OUT/gpu-large" --timeout-s 400; then
    B=$(last_json "$OUT/gpu-large.out")
    echo "$B" | "$PY" -c '
import json, sys
b = json.load(sys.stdin)
def f(key, scale=1.0, digits=1):
    v = b.get(key)
    return "-" if v is None else "%.*f" % (digits, v * scale)
print("engine    %s ms/step, %s tok/s, MFU %s%% of the 989 TFLOP/s datasheet figure, %s%% of the measured bf16 matmul"
      % (f("engine_step_ms"), f("engine_tokens_per_s", digits=0), f("engine_mfu_datasheet", 100), f("engine_fraction_of_matmul_peak", 100)))
print("reference %s ms/step, %s tok/s, MFU %s%% (flex_attention + torch.compile)"
      % (f("reference_step_ms"), f("reference_tokens_per_s", digits=0), f("reference_mfu_datasheet", 100)))
print("ratio engine/reference %s; comparison %s" % (f("ratio", digits=2), b.get("comparison")))
' 2>>"$LOG" | tee -a "$LOG"
    ok "gpu-large benchmark: figures above, full results in $OUT/gpu-large/results.md"
else
    failed "gpu-large benchmark: see $OUT/gpu-large.err and $OUT/gpu-large/results.json"
fi
finish
