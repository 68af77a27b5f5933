#!/usr/bin/env bash
# The allowed dependency directions of docs/ARCHITECTURE.md, checked mechanically.
#
# Inside dflashd (daemon/src), dflash-engine (engine/src), dflash-shared (shared/src) and
# dflash-tui (tui/src) it reads every `crate::<module>` path of the code that ships (comments
# stripped; a file's `#[cfg(test)]` tail, `*_tests.rs` and `*/tests.rs` files are test code and exempt) and
# fails on any against the directions the page states, naming the file, the import and the
# rule. Between crates it checks with `cargo tree -e normal` (skipped with a note when cargo
# cannot answer offline) that dflash-engine has no tokio, ratatui, nvml-wrapper, sysinfo or
# daemon dependency, dflash-shared none on tokio, ratatui, tch, nvml-wrapper or another crate
# of the workspace, and dflash-tui none on tch or the engine.
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
  "engine/src/train/eval/mod.rs|decode|ARCHITECTURE.md: the offline evaluation hands tree_metrics decode's GoldSlot and tree types"
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

# rule ROOT FORBIDDEN_MODULES RULE_TEXT: every shipping file under ROOT (a directory or a single
# file) may not refer to crate::<m> for m in FORBIDDEN_MODULES.
rule() {
  local root=$1 forbidden=$2 text=$3 file module
  while IFS= read -r file; do
    case "$file" in *_tests.rs|*/tests.rs) continue ;; esac
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
  "train/ uses decode/ only in the evaluations (trainer/online_eval.rs, continuation_eval.rs, error.rs, tree_metrics.rs, eval/mod.rs), and plan/ only for MFU's FLOP counts (throughput.rs, peak.rs)"
engine_rule dist "files device collective" \
  "dist/ (the cross-process groups) stands on collective/, never on train/ or the model"
engine_rule embedded "files device collective model data decode plan train" \
  "embedded/ (the built-in default) is a top room: nothing but the binaries imports it"
engine_rule regenerate "files device model data decode" \
  "regenerate/ drives decode/ over data/; it uses no training code"

# --- dflash-shared, bottom up: the vocabulary (metrics, job, format, clock, run_dir, ...) →
# events/ (their words too) → health/ → config/ → launch/ → status → protocol/, run_end →
# recording. A module is a file and, where it has one, the folder beside it.
# module_rule CRATE MODULE FORBIDDEN RULE_TEXT: the module's file and folder under CRATE/src may
# not import FORBIDDEN (a module may always use itself); the module counts as placed.
module_rule() {
  local crate=$1 module=$2 root forbidden=" $3 " placed_var="${1}_placed"
  forbidden=${forbidden// $module / }
  printf -v "$placed_var" '%s %s ' "${!placed_var}" "$module"
  for root in "$crate/src/$module.rs" "$crate/src/$module"; do
    if [ -e "$root" ]; then rule "$root" "$forbidden" "$4"; fi
  done
}
shared_rule() { module_rule shared "$@"; }
shared_placed=" lib "
shared_above_vocabulary="events health config launch status protocol run_end recording"
for module in serde_util job metrics clock format actions last_run socket_path run_dir \
  invocation gpu_peaks best_checkpoint; do
  shared_rule "$module" "$shared_above_vocabulary" \
    "inside dflash-shared the vocabulary (metrics, formats, the clock, run-dir names) imports no module above it"
done
shared_rule events "health config launch status protocol run_end recording" \
  "events/ and their words sit below health/: a detector may word its events, never the reverse"
shared_rule health "config launch status protocol run_end recording" \
  "health/ sits below config/: the detectors own their thresholds and config/ composes them"
shared_rule config "launch status protocol run_end recording" \
  "config/ imports only the vocabulary, events/ and health/"
shared_rule launch "status protocol run_end recording" \
  "launch/ imports only config/, health/ and what is below them"
shared_rule status "protocol run_end recording" \
  "status imports neither the protocol that carries it nor what reads it back"
for module in protocol run_end; do
  shared_rule "$module" "recording" "protocol/ and run_end sit below recording"
done
shared_rule recording "" "recording is the top floor"

# --- dflash-tui: cmd/ → console, terminal → ui/, feed, report/, replay → app/ → client/ →
# paths, actions, fmt
tui_placed=" lib main "
tui_rule() { module_rule tui "$@"; }
for module in paths actions fmt; do
  tui_rule "$module" "client app ui feed report replay console terminal cmd paths actions fmt" \
    "inside dflash-tui paths, actions and fmt are the floor: they import no other module of the console"
done
tui_rule client "app ui feed report replay console terminal cmd" \
  "client/ imports only paths, actions and fmt"
tui_rule app "ui feed report replay console terminal cmd" \
  "app/ is below the views: it imports client/, paths, actions and fmt only"
for module in ui feed report replay; do
  tui_rule "$module" "client ui feed report replay console terminal cmd" \
    "ui/, feed, report/ and replay read app/'s state, never client/ nor each other"
done
for module in console terminal; do
  tui_rule "$module" "cmd console terminal" "console and terminal import neither cmd/ nor each other"
done

tui_rule cmd "" "cmd/ is the top floor"

# --- dflash-bench: the harness's modules, and objectives/ (the tournament) beside them. The
# tournament stands on stats and error alone, and only report.rs (its tables) reads it.
bench_modules=$(for path in bench/src/*; do basename "$path" .rs; done | grep -vx 'lib\|main\|stats\|error\|objectives' | tr '\n' ' ')
rule bench/src/objectives "$bench_modules" \
  "objectives/ (the tournament) uses only stats and error of the harness"
for path in bench/src/*.rs; do
  [ "$path" = bench/src/report.rs ] && continue
  rule "$path" "objectives" "only report.rs (and main.rs) reads objectives/"
done

# A module no rule above names would go unchecked: every module file or folder must be on a floor.
for crate in shared tui; do
  placed_var="${crate}_placed"
  for path in "$crate"/src/*; do
    module=$(basename "$path" .rs)
    if [[ "${!placed_var}" != *" $module "* ]]; then
      echo "check-architecture: $path is on no floor — against: docs/ARCHITECTURE.md names every module's floor"
      violations=$((violations + 1))
    fi
  done
done

# --- libtorch's one generator: seeded only through engine/src/device/global_rng.rs, whose guard
# keeps other threads' draws out from between a seed and its draws (tests run on parallel threads).
while IFS=: read -r file line _; do
  [ "$file" = engine/src/device/global_rng.rs ] && continue
  echo "check-architecture: $file:$line seeds libtorch's generator itself — against: seed through dflash_engine::device::global_rng::seeded, which holds the generator's lock from the seed to the last draw"
  violations=$((violations + 1))
done < <(git ls-files '*.rs' | xargs grep -n 'manual_seed' | grep -v '^[^:]*:[0-9]*:[[:space:]]*//' || true)

# --- between crates
# crate_deps CRATE "FORBIDDEN..." RULE_TEXT: fails when CRATE depends on any of FORBIDDEN.
crate_deps() {
  local crate=$1 forbidden=$2 text=$3 tree dep
  if ! tree=$(cargo tree -p "$crate" -e normal --prefix none --offline 2>/dev/null); then
    echo "check-architecture: note: cargo tree -p $crate failed offline; its crate-dependency check was skipped"
    return 0
  fi
  for dep in $forbidden; do
    if printf '%s\n' "$tree" | awk '{print $1}' | grep -qx "$dep"; then
      echo "check-architecture: $crate depends on $dep — against: $text"
      violations=$((violations + 1))
    fi
  done
}
crate_deps dflash-engine "tokio ratatui nvml-wrapper sysinfo dflashd dflash-tui" \
  "dflash-engine depends on no tokio, ratatui, nvml-wrapper, sysinfo or daemon code"
crate_deps dflash-shared "tokio ratatui tch torch-sys nvml-wrapper sysinfo dflash-engine dflashd dflash-tui" \
  "dflash-shared is pure: no tokio, ratatui, libtorch, NVML, nor another crate of the workspace"
crate_deps dflash-tui "tch torch-sys dflash-engine dflashd" \
  "dflash-tui links no libtorch: no tch, no engine, no daemon"

if [ "$violations" -gt 0 ]; then
  echo "check-architecture: $violations violation(s) of docs/ARCHITECTURE.md"
  exit 1
fi
echo "check-architecture: ok (dependency directions of docs/ARCHITECTURE.md hold)"
