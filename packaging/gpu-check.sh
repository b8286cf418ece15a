#!/bin/bash
# make gpu-check: on a machine with NVIDIA GPUs, run ptraind's NVML inventory
# and a real allocation (examples/gpu_check.rs) and print what they saw.
# Without the NVIDIA driver it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

have_driver() {
    [ -e /proc/driver/nvidia/version ] && return 0
    ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml\.so\.1' && return 0
    return 1
}

if ! have_driver; then
    echo "gpu-check: no NVIDIA driver on this machine (no /proc/driver/nvidia/version," \
        "no libnvidia-ml.so.1 in the loader cache); nothing to check."
    exit 0
fi

# For comparison with what ptrain's inventory prints below.
if command -v nvidia-smi >/dev/null; then
    echo "== nvidia-smi -L"
    nvidia-smi -L || true
    echo "== nvidia-smi --query-gpu"
    nvidia-smi --query-gpu=index,uuid,pci.bus_id,memory.total,memory.used \
        --format=csv || true
    echo "== nvidia-smi topo -m"
    nvidia-smi topo -m || true
fi

${CARGO:-cargo} build --release --quiet --example gpu_check
exec "${CARGO_TARGET_DIR:-target}/release/examples/gpu_check" "$@"
