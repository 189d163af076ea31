#!/bin/sh
# The standing check on real NVIDIA hardware (docs/performance.md, tests/fixtures/nvml/).
# Usage, from the repository root of a machine with an NVIDIA driver: scripts/gpu-check.sh OUT_DIR
# Where the project's packages are not installed, wheels in .whl/ are unpacked to /tmp/site first.
set -u
out=${1:-gpu-check-out}
mkdir -p "$out"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 2
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONDONTWRITEBYTECODE=1
python3 scripts/gpu_check.py "$out"
for nvml in real sim; do
    echo "## bench/agent_poll.py --nvml $nvml"
    timeout 120 python3 bench/agent_poll.py --nvml "$nvml" --polls 100 --rounds 3 2>&1
done > "$out/agent_poll.txt"
{
    echo "## dmesg | fleetwatch scan -"
    dmesg 2>&1 | python3 -c "import sys; from cli.main import main; sys.exit(main())" scan -
    echo "## dmesg | grep -i nvrm (last 40)"
    dmesg 2>&1 | grep -i -e nvrm -e xid | tail -40
} > "$out/misc.txt" 2>&1
timeout 180 python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -q > "$out/pytest.txt" 2>&1
echo "pytest -m gpu: rc $?"
tail -3 "$out/pytest.txt"
