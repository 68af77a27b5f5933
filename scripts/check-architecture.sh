#!/usr/bin/env bash
# The allowed dependency directions of docs/ARCHITECTURE.md, checked mechanically.
#
# Inside dflashd (daemon/src) and dflash-engine (engine/src) it reads every `crate::<module>`
# path of the code that ships (comments stripped; a file's `#[cfg(test)]` tail and `*_tests.rs`
# files are test code and exempt) and fails on any against the directions the page states,
# naming the file, the import and the rule. Between crates it checks that dflash-engine has no
# tokio, ratatui, nvml-wrapper, sysinfo or daemon dependency (`cargo tree -p dflash-engine -e
# normal`; skipped with a note when cargo cannot answer offline).
#
# Usage: scripts/check-architecture.sh   (from anywhere; `make lint` runs it)
set -euo pipefail
cd "$(dirname "$0")/.."

violations=0

# Documented exceptions: "file|module|reason". An import listed here is allowed even though a
# rule below forbids it. Keep the reason: it is what ARCHITECTURE.md says about the exception.
EXCEPTIONS=(
  "daemon/src/runtime/guard_rails.rs|control|ARCHITECTURE.md: the one runtime/ file that imports control/ (it binds the control socket)"
  "daemon/src/runtime/guard_rails.rs|exporter|ARCHITECTURE.md: the one runtime/ file that imports exporter/ (it binds the metrics listener)"
  "engine/src/train/trainer/online_eval.rs|decode|ARCHITECTURE.md: the in-training online evaluation runs decode::run_online"
  "engine/src/train/continuation_eval.rs|decode|ARCHITECTURE.md: offline tau on decode::run_online's reference outputs"
  "engine/src/train/error.rs|decode|ARCHITECTURE.md: TrainError carries decode's DecodeError from the online evaluation"
  "engine/src/train/tree_metrics.rs|decode|ARCHITECTURE.md: the offline DDTree oracle builds decode's own tree and scores it with decode::tree_oracle"
  "engine/src/train/eval.rs|decode|ARCHITECTURE.md: the offline evaluation hands tree_metrics decode's GoldSlot and tree types"
  "engine/src/train/throughput.rs|plan|ARCHITECTURE.md: train/ reaches plan/ only for MFU's FLOP counts (the step's)"
  "engine/src/train/peak.rs|plan|ARCHITECTURE.md: train/ reaches plan/ only for MFU's FLOP counts (the measured peak's matmul)"
)

is_exception() { # file module
  local entry
  for entry in "${EXCEPTIONS[@]}"; do
    [[ "$entry" == "$1|$2|"* ]] && return 0
  done
  return 1
}

# The crate::<module> names a file's shipping code refers to, one per line.
imports_of() {
  awk '/^[[:space:]]*#\[cfg\(test\)\]/ { exit } { sub(/\/\/.*/, ""); print }' "$1" |
    grep -o 'crate::[a-z_]\+' | sed 's/^crate:://' | sort -u || true
}

# rule FILE_GLOB_ROOT FORBIDDEN_MODULES RULE_TEXT: every shipping file under ROOT (a directory
# or a single file) may not refer to crate::<m> for m in FORBIDDEN_MODULES.
rule() {
  local root=$1 forbidden=$2 text=$3 file module
  while IFS= read -r file; do
    case "$file" in *_tests.rs) continue ;; esac
    for module in $(imports_of "$file"); do
      if [[ " $forbidden " == *" $module "* ]] && ! is_exception "$file" "$module"; then
        echo "check-architecture: $file imports crate::$module — against: $text"
        violations=$((violations + 1))
      fi
    done
  done < <(if [ -d "$root" ]; then find "$root" -name '*.rs' | sort; else echo "$root"; fi)
}

# --- dflashd: main.rs → cli/ → runtime/ → {control/, exporter/} → run/ → telemetry/
rule daemon/src/runtime "control exporter" \
  "inside dflashd each floor imports only from the floors below it (runtime/ is below cli/; only guard_rails.rs imports control/ and exporter/)"
rule daemon/src/control "runtime exporter" \
  "control/ never imports runtime/; exporter/ is beside control/ (neither imports the other)"
rule daemon/src/exporter "runtime control" \
  "exporter/ is beside control/ (neither imports the other) and below runtime/"
rule daemon/src/run "runtime control exporter" \
  "run/ imports neither control/ nor runtime/ (it is below them)"
rule daemon/src/telemetry "runtime control exporter run" \
  "telemetry/ imports nothing above it"
# cli/: nothing imports it but main.rs (main.rs reaches it as dflashd::cli, not crate::cli).
for dir in runtime control exporter run telemetry; do
  rule "daemon/src/$dir" "cli" "nothing imports cli/ but main.rs"
done

# --- dflash-engine, bottom to top: {files/, device/} → collective/ → {model/, data/} →
# {decode/, plan/} → train/ ; dist/ beside train/ ; {embedded/, regenerate/} on top.
ENGINE_ROOMS="files device collective model data decode plan train dist embedded regenerate"
engine_rule() { # ROOM ALLOWED RULE_TEXT: ROOM may import only itself and ALLOWED
  local room=$1 allowed=$2 text=$3 forbidden="" r
  for r in $ENGINE_ROOMS; do
    [[ "$r" == "$room" || " $allowed " == *" $r "* ]] || forbidden="$forbidden $r"
  done
  rule "engine/src/$room" "$forbidden" "$text"
}
engine_rule files "" "files/ (the atomic write, the file hasher) imports no other room"
engine_rule device "" "device/ (the device vocabulary, the process-wide generator, panic text) imports no other room"
engine_rule collective "device" "collective/ (the all-reduce contract and its in-process endpoints) stands on device/ alone"
engine_rule model "files device" "model/ uses files/ and device/ only: never data/, decode/, plan/ or train/"
engine_rule data "files device" "data/ uses neither model/ nor train/"
engine_rule decode "model files device" "decode/ uses model/ only; decode/ never uses train/ or data/"
engine_rule plan "model collective files device" \
  "plan/ is pure: model/'s configs, parameter specs and the chunk planner, and collective/'s bucket size"
engine_rule train "files device collective model data decode plan" \
  "train/ uses everything below it but no room beside or above it (dist/, embedded/, regenerate/)"
rule engine/src/train "decode plan" \
  "train/ uses decode/ only in the evaluations (trainer/online_eval.rs, continuation_eval.rs, error.rs, tree_metrics.rs, eval.rs), and plan/ only for MFU's FLOP counts (throughput.rs, peak.rs)"
engine_rule dist "files device collective" \
  "dist/ (the cross-process groups) stands on collective/, never on train/ or the model"
engine_rule embedded "files device collective model data decode plan train" \
  "embedded/ (the built-in default) is a top room: nothing but the binaries imports it"
engine_rule regenerate "files device model data decode" \
  "regenerate/ drives decode/ over data/; it uses no training code"

# --- between crates: dflash-engine depends on no tokio, ratatui, nvml-wrapper, sysinfo or daemon code
if tree=$(cargo tree -p dflash-engine -e normal --prefix none --offline 2>/dev/null); then
  for dep in tokio ratatui nvml-wrapper sysinfo dflashd dflash-tui; do
    if printf '%s\n' "$tree" | awk '{print $1}' | grep -qx "$dep"; then
      echo "check-architecture: dflash-engine depends on $dep — against: dflash-engine depends on no tokio, ratatui, nvml-wrapper, sysinfo or daemon code"
      violations=$((violations + 1))
    fi
  done
else
  echo "check-architecture: note: cargo tree -p dflash-engine failed offline; the crate-dependency check was skipped"
fi

if [ "$violations" -gt 0 ]; then
  echo "check-architecture: $violations import(s) against docs/ARCHITECTURE.md"
  exit 1
fi
echo "check-architecture: ok (dependency directions of docs/ARCHITECTURE.md hold)"
