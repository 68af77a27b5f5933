#!/usr/bin/env bash
# Step 6 of scripts/gpu-check.sh: two dflashd processes as the two nodes of one job on this
# machine (issue 23), node n on DEVICE_n, meeting at a loopback rendezvous (libtorch's
# TCPStore; on CUDA the gradient sum is NCCL's, ncclCommInitRank with the unique id through
# the store; on CPU libtorch's Gloo). 4 steps of the embedded default; each node's run dir,
# output and errors under OUT_DIR/node<n>/. Exit status: the first failing node's.
#
# usage: gpu-check-two-node.sh DFLASHD PYTHON OUT_DIR DEVICE_0 DEVICE_1
set -u
dflashd=$1 py=$2 out=$3
shift 3
devices=("$@")
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for n in 0 1; do
    dir="$out/node$n"
    mkdir -p "$dir"
    # Each node its own socket, run dir and state dir, as on two machines. The CPU peak is
    # given, not timed: MFU is not what this step checks.
    XDG_RUNTIME_DIR="$dir" XDG_STATE_HOME="$dir" DFLASH_CPU_PEAK_FLOPS=1e11 \
        "$dflashd" start --device "${devices[$n]}" --run-dir "$dir/run" --socket "$dir/control/dflashd.sock" \
        --nnodes 2 --node-rank "$n" --rendezvous "127.0.0.1:$port" --collective-timeout-s 20 \
        --max-steps 4 --log-every 1 >"$dir/out" 2>"$dir/err" &
    pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do
    wait "$pid"
    status=$?
    [ $rc -eq 0 ] && rc=$status
done
exit $rc
