# dflash — a newcomer needs two commands: `make run` and `make test`.
# Everything is provisioned from here: uv (from PyPI), the torch==2.11.0 wheel that provides
# libtorch (into the project-local .venv), and the Rust build. Nothing else is downloaded.
SHELL := /bin/bash
.DEFAULT_GOAL := build

VENV        := .venv
UV          := python3 -m uv
TORCH_STAMP := $(VENV)/.provisioned-torch-2.11.0
RUN_DIR     ?= runs/default
# Extra `dflashd start` flags for `make run`, e.g. DFLASHD_ARGS="--accept-drift 3fa9c2d1e0b47a65".
DFLASHD_ARGS ?=
BIN         := $(or $(CARGO_TARGET_DIR),target)/release

# tch/torch-sys build against the wheel's libtorch (C++11 ABI), never a downloaded zip.
LIBTORCH_DIR = $(shell $(VENV)/bin/python -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)
CARGO = LIBTORCH="$(LIBTORCH_DIR)" LIBTORCH_CXX11_ABI=1 cargo

.PHONY: build run test soak test-deps lint fmt bench doctor clean provision

$(TORCH_STAMP): pyproject.toml uv.lock
	@$(UV) --version >/dev/null 2>&1 || python3 -m pip install --quiet uv
	$(UV) sync --frozen
	@$(VENV)/bin/python -c 'import torch; assert torch.__version__.startswith("2.11.0"), torch.__version__'
	@touch $@

provision: $(TORCH_STAMP)

build: provision
	$(CARGO) build --release --workspace

# Starts dflashd in the background on the embedded default (or reuses the one answering on the
# default socket), then attaches the console. Quitting the console leaves the daemon training;
# the console prints how to watch again and how to stop. Without a terminal (or under CI) it
# prints the status instead of attaching, so it never hangs.
run: build
	@$(BIN)/dflashd start --detach --reuse-running --run-dir $(RUN_DIR) $(DFLASHD_ARGS); rc=$$?; \
	if [ $$rc -eq 3 ]; then echo "make run: to accept it: make run DFLASHD_ARGS='--accept-drift TOKEN'"; fi; \
	exit $$rc
	@if [ -n "$$CI" ] || [ ! -t 0 ] || [ ! -t 1 ]; then \
		echo "make run: no terminal (or CI is set): not attaching the console. dflashd keeps training."; \
		$(BIN)/dflash-tui status; \
		echo "  watch:  $(BIN)/dflash-tui attach   (headless: $(BIN)/dflash-tui tail --follow)"; \
		echo "  stop:   $(BIN)/dflash-tui stop, then $(BIN)/dflash-tui confirm-stop"; \
	else \
		exec $(BIN)/dflash-tui attach; \
	fi

# The Prometheus end-to-end test scrapes dflashd with a real Prometheus server: Debian's
# `prometheus` package (prometheus + promtool), installed here when absent (as root, as CI runs;
# recommends such as node-exporter left out). Its service is never used: the test starts its
# own server on a free loopback port; where systemd started the packaged one, it is stopped.
# Debian's `libgloo-dev`: gloo's headers, which the torch wheel lacks, for the engine's shim over
# libtorch's own ProcessGroupGloo (headers only; nothing of Debian's libgloo is linked).
test-deps:
	@if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then \
		if [ "$$(id -u)" != 0 ]; then \
			echo "make test: the Prometheus end-to-end test needs Debian's prometheus package: sudo apt-get install --no-install-recommends prometheus"; \
			exit 1; \
		fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
		if command -v systemctl >/dev/null 2>&1; then systemctl disable --now prometheus >/dev/null 2>&1 || true; fi; \
	fi
	@if [ ! -f /usr/include/gloo/context.h ]; then \
		if [ "$$(id -u)" != 0 ]; then \
			echo "make test: the two-process Gloo tests need gloo's headers (Debian's libgloo-dev; the engine compiles libtorch's own ProcessGroupGloo against them): sudo apt-get install --no-install-recommends libgloo-dev"; \
			exit 1; \
		fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libgloo-dev >/dev/null; \
	fi

# DFLASH_REQUIRE_PROMETHEUS: under `make test` the Prometheus tests fail instead of skipping
# when the server is missing.
# The build and the test execution are timed apart: the README quotes both, and the suite's
# budget (5 min on the 2-core machine) is for the tests alone.
test: provision test-deps
	@s=$$(date +%s); $(CARGO) test --workspace --release --no-run && \
		echo "make test: build $$(( $$(date +%s) - s )) s"
	@s=$$(date +%s); DFLASH_REQUIRE_PROMETHEUS=1 $(CARGO) test --workspace --release && \
		echo "make test: tests $$(( $$(date +%s) - s )) s"

# The long runs `make test` leaves out, at their full lengths (CI runs both): every
# `#[ignore]`d test (the 200-step shape-bound run, the real structure's 6 trained steps, the
# GPU script's whole CPU self-test) and the reliability campaign at DFLASH_CAMPAIGN=soak
# (6 kill -9 rounds, 10,000 fuzzed frames, two crowded phases; `full` is the issue's 20 rounds).
# `make test` checks each of these behaviours at its shortest telling length. The loaders'
# checks (daemon/tests/daemon/loaders.rs) need the `loaders` uv group (speculators, z-lab's
# dflash, sglang without its CUDA dependencies), synced here first; torch stays the pinned 2.11.0.
soak: provision test-deps
	$(UV) sync --frozen --group loaders
	@$(VENV)/bin/python -c 'import torch; assert torch.__version__.startswith("2.11.0"), torch.__version__'
	DFLASH_REQUIRE_PROMETHEUS=1 $(CARGO) test --workspace --release -- --ignored --skip campaign_
	DFLASH_CAMPAIGN=soak $(CARGO) test --release -p dflashd --test daemon -- --include-ignored campaign_

lint: provision
	cargo fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --release -- -D warnings
	scripts/check-architecture.sh

fmt:
	cargo fmt --all

doctor: build
	$(BIN)/dflashd doctor

clean:
	cargo clean

# --- Performance harness (docs/BENCHMARKS.md): the engine side by side with the PyTorch
# reference in benches/reference, same weights and batches. Results: runs/bench/results.{md,json}.
# transformers (the target-pass reference) comes from the `fixtures` dependency group.
BENCH_ARGS ?=
.PHONY: gpu-bundle
bench: build
	@$(UV) sync --frozen --inexact --group fixtures >/dev/null 2>&1 || echo "note: could not add transformers (uv sync --group fixtures); the target case will report it missing"
	$(BIN)/dflash-bench --out-dir runs/bench $(BENCH_ARGS)

# What scripts/gpu-check.sh needs on a CUDA node without network or Rust: the release binaries,
# the script and the reference scripts, in one directory.
gpu-bundle: build
	rm -rf runs/gpu-bundle && mkdir -p runs/gpu-bundle/benches/reference
	cp $(BIN)/dflashd $(BIN)/dflash-bench scripts/gpu-check.sh scripts/gpu-check-two-node.sh runs/gpu-bundle/
	cp benches/reference/*.py runs/gpu-bundle/benches/reference/
	@du -sh runs/gpu-bundle
	@test $$(du -sm runs/gpu-bundle | cut -f1) -le 64 || { echo "runs/gpu-bundle is over 64 MiB, what a device run can carry"; exit 1; }
