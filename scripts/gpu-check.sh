#!/usr/bin/env bash
# GPU check for dflash on a CUDA node without network access and without Rust (issue 12).
#
# What it needs next to it (`make gpu-bundle` puts them in runs/gpu-bundle/, under 64 MiB):
#   dflashd, dflash-bench        the release binaries (built against libtorch 2.11)
#   benches/reference/*.py       the PyTorch reference scripts (the bf16 parity)
# and, on the node: a Python with torch 2.11 (its libtorch is the one the binaries load).
#
# One run takes at most BUDGET_S = 540 s (9 minutes) wall, start-up included. The steps run in
# order of value, each under its own limit; STARTUP_S plus the limits add up to no more than
# the budget, which the script checks before it starts (`--check-budget` only checks). A step
# never gets more than what is left of the budget.
#   1. doctor         `dflashd doctor`: NCCL version and path, SDPA kernels, NVML, allocator
#   2. parity         engine on DEVICE vs CPU (f32) and engine bf16 vs the reference (bf16),
#                     at the tiny shape (one attention chunk) and at `small` (several chunks)
#   3. drafter_step   the drafter step at the real structure (hidden 5120, 4 sliding + 1 full
#                     layers, 32/8 heads × 128, 1024 anchors × block 32, S = 3072, vocabulary
#                     248,320 or the largest the memory model says fits), bf16, a fresh length
#                     and fresh anchors every step; per step the timings, allocator and NVML
#                     readings and the memory model's prediction
#   4. target_layers  Qwen3.6-27B layers (random weights), Gated DeltaNet and gated attention,
#                     forward at S = 4096 in bf16: tokens/s and MFU per layer kind
#   5. multi_gpu      with 2+ GPUs visible: the NCCL all-reduce of the drafter's gradient size
#                     (bus bandwidth) on cuda:0,cuda:1 and a 2-rank step of the tiny default
#                     against the 1-rank step (losses within the dtype's tolerance); skipped
#                     on one GPU; on the CPU self-test, two CPU ranks
#   6. two_node       with 2+ GPUs visible: two dflashd processes as the two nodes of one job
#                     (issue 23; scripts/gpu-check-two-node.sh), node 0 on cuda:0 and node 1 on
#                     cuda:1, summing gradients over NCCL across processes; 4 steps of the
#                     embedded default, then each node's journal must say the two nodes' fp32
#                     weights agree (SHA-256 through the store) and each step line must carry the
#                     job's view; skipped on one GPU; on the CPU self-test, two CPU nodes (Gloo)
#
# Results: OUT/gpu-check.json (one JSON document, rewritten after every step, so a kill keeps
# every finished step) and OUT/summary.md (regenerated with it); each step's own output in
# OUT/<step>/ and OUT/<step>.{out,err}.
#
# Environment: DEVICE (cuda, or cpu for the self-test), PYTHON (default python3), DFLASHD and
# DFLASH_BENCH (default: next to this script, else target/release/ of the repository), OUT
# (default ./gpu-check-results), PEAK_TFLOPS (989: H200 dense bf16, NVIDIA's datasheet; MFU is
# against it), BUDGET_S (540).
# DEVICE=cpu is the self-test of every step at reduced shapes (CI runs it: bench/tests/
# gpu_check.rs); its figures mean nothing.
#
# Status: written without access to a GPU; only the DEVICE=cpu self-test has run.
set -u

BUDGET_S=${BUDGET_S:-540}
STARTUP_S=30
STEP_NAMES=(doctor parity drafter_step target_layers multi_gpu two_node)
# The limits share the 540 s budget (how they were split: docs/development.md#gpu-check); none
# has run on a GPU yet, so they are estimates, not timings.
declare -A LIMIT=([doctor]=30 [parity]=140 [drafter_step]=185 [target_layers]=60 [multi_gpu]=50 [two_node]=45)

budget_sum() {
    local sum=$STARTUP_S s
    for s in "${STEP_NAMES[@]}"; do sum=$((sum + LIMIT[$s])); done
    echo "$sum"
}
SUM=$(budget_sum)
if [ "$SUM" -gt "$BUDGET_S" ]; then
    echo "gpu-check: start-up (${STARTUP_S} s) plus the step limits add up to ${SUM} s, over the ${BUDGET_S} s budget; lower a limit in LIMIT or raise BUDGET_S" >&2
    exit 2
fi
if [ "${1:-}" = "--check-budget" ]; then
    echo "budget ok: ${SUM} s of ${BUDGET_S} s"
    exit 0
fi

DEVICE=${DEVICE:-cuda}
START=$SECONDS
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/gpu-check-results}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
JSON="$OUT/gpu-check.json"
LOG="$OUT/gpu-check.log"
: >"$LOG"
FAILED=0
say() { echo "$*" | tee -a "$LOG"; }
left() { echo $((BUDGET_S - (SECONDS - START))); }

if ! command -v "$PY" >/dev/null; then
    echo "gpu-check: python \`$PY\` not found; set PYTHON=/path/to/python with torch 2.11" >&2
    exit 1
fi

# record KEY STATUS SECONDS [RESULT_FILE] [NOTE]: puts one step into the JSON document and
# regenerates the summary, both written to a temporary file and renamed.
record() {
    "$PY" - "$JSON" "$OUT/summary.md" "$@" <<'EOF'
import json, os, sys
path, md, key, status, seconds = sys.argv[1:6]
result_file = sys.argv[6] if len(sys.argv) > 6 else ""
note = sys.argv[7] if len(sys.argv) > 7 else ""
doc = json.load(open(path)) if os.path.exists(path) else {}
entry = {"status": status, "seconds": float(seconds)}
if note:
    entry["note"] = note
if result_file and os.path.exists(result_file):
    text = open(result_file).read().strip()
    try:
        entry["result"] = json.loads(text)
    except ValueError:
        entry["result"] = text
doc.setdefault("steps", {})[key] = entry
if key == "meta":
    doc["meta"] = entry.get("result", {})
    del doc["steps"]["meta"]
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
os.replace(tmp, path)

def fmt(v, scale=1.0, digits=1):
    return "-" if v is None else "%.*f" % (digits, v * scale)
meta = doc.get("meta", {})
lines = ["# dflash GPU check", "",
         "%s on %s, device %s, budget %s s" % (meta.get("started_utc", "?"), meta.get("host", "?"),
                                               meta.get("device", "?"), meta.get("budget_s", "?")), "",
         "| step | status | seconds | limit | note |", "|---|---|---|---|---|"]
for name, e in doc.get("steps", {}).items():
    lines.append("| %s | %s | %.0f | %s | %s |" % (name, e["status"], e["seconds"],
                 meta.get("limits_s", {}).get(name, "-"), e.get("note", "")))
steps = doc.get("steps", {})
d = steps.get("drafter_step", {}).get("result")
if isinstance(d, dict):
    lines += ["", "## Drafter step (%s, %s, vocab %s, SDPA %s)" % (d.get("device"), d.get("dtype"), d.get("vocab"), d.get("sdpa_backend")),
              "", "median %s ms/step, %s tok/s, %s draft positions/s, MFU %s%%; peak allocated %s MiB, "
              "memory model (prediction, not a measurement) %s MiB; NVML growth %s MiB" % (
                  fmt(d.get("median_wall_ms")), fmt(d.get("median_tokens_per_s"), digits=0),
                  fmt(d.get("median_draft_positions_per_s"), digits=0), fmt(d.get("median_mfu"), 100),
                  fmt(d.get("max_peak_allocated_mb"), digits=0), fmt(d.get("max_model_predicted_peak_mb"), digits=0),
                  fmt(d.get("nvml_growth_mb"), digits=0)),
              "", "| step | S | ms | tok/s | MFU % | peak MiB | model MiB | reserved MiB | retries | NVML MiB |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in d.get("steps", []):
        lines.append("| %s%s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["step"], " (warmup)" if r.get("warmup") else "", r["seq_len"], fmt(r["wall_ms"]),
            fmt(r["tokens_per_s"], digits=0), fmt(r.get("mfu"), 100), fmt(r.get("peak_allocated_mb"), digits=0),
            fmt(r.get("model_predicted_peak_mb"), digits=0), fmt(r.get("reserved_mb"), digits=0),
            fmt(r.get("num_alloc_retries"), digits=0), fmt(r.get("nvml_used_mb"), digits=0)))
t = steps.get("target_layers", {}).get("result")
if isinstance(t, dict):
    lines += ["", "## Target layers (%s, %s, hidden %s)" % (t.get("device"), t.get("dtype"), t.get("hidden")), "",
              "| kind | layers | S | ms/layer | tok/s per layer | MFU % |", "|---|---|---|---|---|---|"]
    for k in t.get("kinds", []):
        lines.append("| %s | %s | %s | %s | %s | %s |" % (k["kind"], k["layers"], k["seq_len"],
                     fmt(k.get("median_ms_per_layer"), digits=2), fmt(k.get("tokens_per_s_per_layer"), digits=0),
                     fmt(k.get("mfu"), 100)))
m = steps.get("multi_gpu", {}).get("result")
if isinstance(m, dict):
    a, p = m.get("all_reduce", {}), m.get("two_rank_step", {})
    lines += ["", "## Multi-device (%s)" % ",".join(a.get("devices", [])), "",
              "all-reduce of %s fp32 elements (%s MiB): median %s ms, algorithm %s GB/s, bus %s GB/s" % (
                  a.get("elements"), fmt(a.get("bytes"), 1 / 1048576, 0), fmt(a.get("median_ms"), digits=2),
                  fmt(a.get("algo_gb_per_s"), digits=1), fmt(a.get("bus_gb_per_s"), digits=1)),
              "2-rank step vs 1-rank step: largest relative loss difference %s (tolerance %s): %s" % (
                  p.get("max_rel_diff"), p.get("tolerance"), "equal" if p.get("ok") else "DIFFERENT")]
j = steps.get("two_node", {}).get("result")
if isinstance(j, dict):
    lines += ["", "## Two nodes of one job (one dflashd per device, %s)" % ("equal" if j.get("ok") else "FAILED"), "",
              "| node | device | steps | weights agree | job tok/s per step |", "|---|---|---|---|---|"]
    for n in j.get("nodes", []):
        lines.append("| %s | %s | %s | %s | %s |" % (n.get("node"), n.get("device"), n.get("steps"),
                     n.get("weights_agree"), ", ".join(str(t) for t in n.get("job_tokens_per_s", []))))
with open(md + ".tmp", "w") as f:
    f.write("\n".join(lines) + "\n")
os.replace(md + ".tmp", md)
EOF
}

# run_step NAME CMD...: runs CMD under min(what is left of LIMIT[NAME] since the step began at
# $t0, what is left of the budget), output to OUT/NAME.{out,err}. Returns the command's status
# (124 when the limit killed it, 99 when no time was left).
run_step() {
    local name=$1 limit=$((LIMIT[$1] - (SECONDS - t0))) remaining
    shift
    remaining=$(left)
    [ "$limit" -lt "$remaining" ] && remaining=$limit
    if [ "$remaining" -lt 5 ]; then
        return 99
    fi
    [ "$limit" -gt "$remaining" ] && limit=$remaining
    say "--- $name (limit ${limit} s): $*"
    timeout --kill-after=5 "$limit" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
}

last_json() { grep '^{' "$1" | tail -n 1 >"$2"; }

# finish_step NAME RC T0 RESULT_FILE: records the outcome of a step.
finish_step() {
    local name=$1 rc=$2 t0=$3 result=$4 secs=$((SECONDS - $3)) status note=""
    case $rc in
        0) status=ok ;;
        99) status=skipped; note="the ${BUDGET_S} s budget is spent" ;;
        124 | 137) status=killed; note="over its ${LIMIT[$name]} s limit; partial results under $name/"; FAILED=1 ;;
        *) status=failed; note="exit $rc: $(tail -n 2 "$OUT/$name.err" 2>/dev/null | tr '\n' ' ' | cut -c1-300)"; FAILED=1 ;;
    esac
    record "$name" "$status" "$secs" "$result" "$note"
    say "[$status] $name ($secs s) $note"
}

# --- start-up: binaries, torch, libtorch -------------------------------------------------------
find_bin() {
    local var=$1 name=$2 c
    if [ -n "${!var:-}" ]; then echo "${!var}"; return; fi
    for c in "$HERE/$name" "$HERE/../target/release/$name"; do
        [ -x "$c" ] && { echo "$c"; return; }
    done
}
DFLASHD=$(find_bin DFLASHD dflashd)
DFLASH_BENCH=$(find_bin DFLASH_BENCH dflash-bench)
REF=""
for c in "$HERE/benches/reference" "$HERE/../benches/reference"; do
    [ -f "$c/bench_step.py" ] && REF=$(cd "$c" && pwd) && break
done
TORCH_DIR=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>>"$LOG")
[ -n "$TORCH_DIR" ] && export LD_LIBRARY_PATH="$TORCH_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
GPUS=0
command -v nvidia-smi >/dev/null && GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
LIMITS_JSON=$(for s in "${STEP_NAMES[@]}"; do printf '"%s": %s, ' "$s" "${LIMIT[$s]}"; done)
cat >"$OUT/meta.json" <<EOF
{"started_utc": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "host": "$(hostname)", "device": "$DEVICE",
 "budget_s": $BUDGET_S, "startup_s": $STARTUP_S, "limits_s": {${LIMITS_JSON%, }},
 "gpus_visible": $GPUS, "torch_dir": "$TORCH_DIR", "dflashd": "$DFLASHD", "dflash_bench": "$DFLASH_BENCH",
 "peak_tflops": $PEAK_TFLOPS, "self_test": $([ "$DEVICE" = cpu ] && echo true || echo false)}
EOF
rm -f "$JSON"
record meta ok 0 "$OUT/meta.json"
say "dflash gpu-check on $(hostname), device $DEVICE, budget ${BUDGET_S} s (limits add up to ${SUM} s)"
for need in "DFLASHD:$DFLASHD" "DFLASH_BENCH:$DFLASH_BENCH" "reference scripts:$REF" "torch (\$PYTHON):$TORCH_DIR"; do
    if [ -z "${need#*:}" ]; then
        say "[missing] ${need%%:*}: copy it next to this script (make gpu-bundle) or set it"
        record startup failed $((SECONDS - START)) "" "missing ${need%%:*}"
        exit 1
    fi
done
if [ "$DEVICE" = cpu ]; then
    REDUCED=(--reduced)
    DTYPE=f32
    WARMUP=1 STEPS=4 TSTEPS=2
    PEAK=()  # an MFU against a GPU's datasheet means nothing on the CPU
else
    REDUCED=()
    DTYPE=bf16
    WARMUP=2 STEPS=12 TSTEPS=5
    PEAK=(--datasheet-peak-tflops "$PEAK_TFLOPS")
fi

# --- 1. doctor --------------------------------------------------------------------------------
t0=$SECONDS
run_step doctor "$DFLASHD" doctor
rc=$?
"$PY" - "$OUT/doctor.out" >"$OUT/doctor.json" <<'EOF'
import json, sys
lines = [l.rstrip("\n") for l in open(sys.argv[1])] if len(sys.argv) > 1 else []
def field(name):
    return [l.split(":", 1)[1].strip() for l in lines if l.split(":", 1)[0].strip() == name]
nccl = (field("nccl") or [""])[0]
print(json.dumps({"nccl": nccl, "nccl_version": nccl.split(" from ")[0] if " from " in nccl else None,
                  "sdpa_choice": (field("sdpa choice") or [None])[0], "sdpa": field("sdpa"),
                  "nvml": (field("nvml") or [None])[0], "allocator_shim": (field("allocator shim") or [None])[0],
                  "allocator": field("allocator"), "cuda_available": (field("cuda available") or [None])[0],
                  "lines": lines}))
EOF
finish_step doctor $rc $t0 "$OUT/doctor.json"

# --- 2. parity: one chunk, several chunks ------------------------------------------------------
t0=$SECONDS
mkdir -p "$OUT/parity"
: >"$OUT/parity/results.jsonl"
parity_rc=0
for config in tiny small; do
    run_step parity "$DFLASH_BENCH" --cases parity --configs "$config" --device "$DEVICE" --python "$PY" \
        --reference-dir "$REF" --reference-attention eager --warmup 0 --steps 1 --matmul-n 256 \
        --out-dir "$OUT/parity/$config" --timeout-s "${LIMIT[parity]}"
    rc=$?
    [ $rc -ne 0 ] && parity_rc=$rc
    grep '^{' "$OUT/parity.out" | tail -n 1 | "$PY" -c '
import json, sys
s = json.load(sys.stdin)
ok = s.get("parity_cuda_vs_cpu") == "ok" and s.get("parity_bf16_vs_reference") == "ok" and not s.get("errors")
print(json.dumps({"config": sys.argv[1], "multi_chunk": sys.argv[1] != "tiny", "device_vs_cpu": s.get("parity_cuda_vs_cpu"),
                  "bf16_vs_reference": s.get("parity_bf16_vs_reference"), "errors": s.get("errors"), "ok": ok}))
sys.exit(0 if ok else 3)' "$config" >>"$OUT/parity/results.jsonl" || { [ $parity_rc -eq 0 ] && parity_rc=3; }
    cp "$OUT/parity.err" "$OUT/parity/$config.err" 2>/dev/null
    [ $rc -eq 99 ] || [ $rc -eq 124 ] && break
done
"$PY" -c 'import json, sys; print(json.dumps({"shapes": [json.loads(l) for l in open(sys.argv[1]) if l.strip()]}))' \
    "$OUT/parity/results.jsonl" >"$OUT/parity.json"
finish_step parity $parity_rc $t0 "$OUT/parity.json"

# --- 3. the drafter step at the real structure -------------------------------------------------
t0=$SECONDS
mkdir -p "$OUT/drafter_step"
run_step drafter_step "$DFLASH_BENCH" --child real-step "${REDUCED[@]}" --device "$DEVICE" --dtype "$DTYPE" \
    --warmup "$WARMUP" --steps "$STEPS" "${PEAK[@]}" --work-dir "$OUT/drafter_step"
rc=$?
last_json "$OUT/drafter_step.out" "$OUT/drafter_step.json"
if [ ! -s "$OUT/drafter_step.json" ] && [ -s "$OUT/drafter_step/steps.jsonl" ]; then
    # Killed mid-run: the steps it finished.
    "$PY" -c 'import json, sys; print(json.dumps({"partial": True, "steps": [json.loads(l) for l in open(sys.argv[1])]}))' \
        "$OUT/drafter_step/steps.jsonl" >"$OUT/drafter_step.json"
fi
finish_step drafter_step $rc $t0 "$OUT/drafter_step.json"

# --- 4. target layers --------------------------------------------------------------------------
t0=$SECONDS
run_step target_layers "$DFLASH_BENCH" --child target-layers "${REDUCED[@]}" --device "$DEVICE" --dtype "$DTYPE" \
    --warmup 1 --steps "$TSTEPS" "${PEAK[@]}" --work-dir "$OUT"
rc=$?
last_json "$OUT/target_layers.out" "$OUT/target_layers.json"
finish_step target_layers $rc $t0 "$OUT/target_layers.json"

# --- 5. multi-GPU ------------------------------------------------------------------------------
t0=$SECONDS
if [ "$DEVICE" = cpu ]; then
    PAIR=cpu,cpu  # the self-test: the engine's CPU group, two CPU ranks
elif [ "$GPUS" -gt 1 ]; then
    PAIR=cuda:0,cuda:1
else
    PAIR=""
fi
if [ -n "$PAIR" ]; then
    run_step multi_gpu "$DFLASH_BENCH" --child multi-gpu "${REDUCED[@]}" --devices "$PAIR" \
        --warmup 2 --steps 5 --work-dir "$OUT"
    rc=$?
    last_json "$OUT/multi_gpu.out" "$OUT/multi_gpu.json"
    [ $rc -eq 0 ] && ! grep -q '"ok":true' "$OUT/multi_gpu.json" && rc=3
    finish_step multi_gpu $rc $t0 "$OUT/multi_gpu.json"
else
    record multi_gpu skipped 0 "" "$GPUS GPU visible; the all-reduce and the 2-rank step need 2"
    say "[skipped] multi_gpu: $GPUS GPU(s) visible"
fi

# --- 6. two nodes of one job ------------------------------------------------------------------
t0=$SECONDS
if [ "$DEVICE" = cpu ]; then
    NODE_DEVICES=(cpu cpu)
elif [ "$GPUS" -gt 1 ]; then
    NODE_DEVICES=(cuda:0 cuda:1)
else
    NODE_DEVICES=()
fi
if [ "${#NODE_DEVICES[@]}" -eq 2 ]; then
    run_step two_node "$HERE/gpu-check-two-node.sh" "$DFLASHD" "$PY" "$OUT/two_node" "${NODE_DEVICES[@]}"
    rc=$?
    "$PY" - "$OUT/two_node" "${NODE_DEVICES[@]}" >"$OUT/two_node.json" <<'EOF'
import json, os, sys
root, devices = sys.argv[1], sys.argv[2:]
nodes, ok = [], True
for n, device in enumerate(devices):
    run = os.path.join(root, "node%d" % n, "run")
    def read(name):
        path = os.path.join(run, name)
        return open(path).read() if os.path.exists(path) else ""
    agreed = [l for l in read("journal.jsonl").splitlines() if "nodes agrees" in l]
    lines = [json.loads(l) for l in read("metrics.jsonl").splitlines() if l.strip()]
    jobs = [l["job"] for l in lines if l.get("step", 0) > 0 and "job" in l]
    node = {"node": n, "device": device, "steps": len(jobs), "weights_agree": bool(agreed),
            "job_tokens_per_s": [round(j["tokens_per_s"], 1) for j in jobs],
            "busy_ms": [[round(x["busy_ms"], 1) for x in j["nodes"]] for j in jobs]}
    ok = ok and node["weights_agree"] and len(jobs) == 4
    nodes.append(node)
print(json.dumps({"nodes": nodes, "ok": ok}))
EOF
    [ $rc -eq 0 ] && ! grep -q '"ok": true' "$OUT/two_node.json" && rc=3
    finish_step two_node $rc $t0 "$OUT/two_node.json"
else
    record two_node skipped 0 "" "$GPUS GPU visible; two nodes of one job need 2"
    say "[skipped] two_node: $GPUS GPU(s) visible"
fi

"$PY" - "$JSON" "$((SECONDS - START))" "$FAILED" <<'EOF'
import json, os, sys
path = sys.argv[1]
doc = json.load(open(path))
doc["elapsed_s"] = int(sys.argv[2])
doc["ok"] = sys.argv[3] == "0"
with open(path + ".tmp", "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
os.replace(path + ".tmp", path)
EOF
say "=== $((SECONDS - START)) s of ${BUDGET_S} s; results: $JSON and $OUT/summary.md ==="
exit "$FAILED"
