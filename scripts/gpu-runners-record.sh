#!/bin/sh
# Record what pre-flight's real runners print on a real GPU, byte for byte, for the parsing tests
# (tests/fixtures/preflight/). Usage, from the repository root of a machine with an NVIDIA
# driver and torch: scripts/gpu-runners-record.sh OUT_DIR. Each file holds one tool's stdout;
# stderr goes to a .err beside it. Tools that are not installed are noted in tools.txt.
set -u
out=${1:-gpu-runners-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONDONTWRITEBYTECODE=1
worker="python3 -m agent.preflight.real.torch_worker"
{
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
    nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max \
        --format=csv,noheader
    for tool in nvbandwidth all_reduce_perf ib_write_bw mpirun; do
        printf '%s: %s\n' "$tool" "$(command -v "$tool" || echo missing)"
    done
} > "$out/tools.txt" 2>&1
timeout 120 $worker host --gpus 0 --size 67108864 --iters 16 \
    > "$out/torch_worker_host.txt" 2> "$out/torch_worker_host.err"
echo "host: rc $?"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
timeout 120 $worker ladder --rank 0 --world 1 --local-rank 0 --master 127.0.0.1 --port "$port" \
    --backend auto --timeout 90 --steps 20 --batch 32 \
    > "$out/torch_worker_ladder.txt" 2> "$out/torch_worker_ladder.err"
echo "ladder: rc $?"
timeout 60 $worker pairs --gpus 0,1 --size 67108864 --iters 16 \
    > "$out/torch_worker_pairs_missing_gpu.txt" 2> "$out/torch_worker_pairs_missing_gpu.err"
echo "pairs on a GPU that is not there: rc $?"
cat "$out/tools.txt"
tail -n 1 "$out"/torch_worker_*.txt
