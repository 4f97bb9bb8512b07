#!/usr/bin/env bash
# GPU smoke test for the first machine with an NVIDIA GPU (one is enough; it uses every GPU it sees). Under ten
# minutes on one GPU, after the one-time install. It runs, each on CUDA with NCCL and bf16 compute:
#   1. nvrx:   the NVRx FSDP loop (training.nvrx_fsdp under torchrun) with the NVRx async saver, and an exception
#              injected at step 12 that NVRx's in-process restart must recover (resume from the last checkpoint);
#   2. ray:    the Ray Train fine-tune (training.ray_finetune --use-gpu) on a local Ray cluster;
#   3. fabric: the all-reduce probe (training.fabric_probe) over the GPUs (one GPU: bus bandwidth is 0 by
#              definition; the run still proves NCCL initializes and the probe reports);
# then prints one table of what it measured. A tiny Qwen2 model is built locally (tests/training/tiny.py): nothing
# is downloaded but the pinned packages, which go into its own virtualenv (versions from requirements-dev.txt).
#
#   scripts/gpu_smoke.sh                   run (work files under /tmp/gpu-smoke, or $GPU_SMOKE_DIR)
#   scripts/gpu_smoke.sh --print-commands  print the three commands, one per line, and exit
#
# Needs Python 3.12 or older for nvidia-resiliency-ext 0.4.1's wheels ($PYTHON, default python3.12).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
work=${GPU_SMOKE_DIR:-/tmp/gpu-smoke}
venv=$work/venv
model=$work/tiny-model
gpus=1
if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L | grep -c '^GPU ' || true)
fi
[ "$gpus" -ge 1 ] || gpus=1

nvrx_cmd=(torchrun --standalone "--nproc-per-node=$gpus" -m training.nvrx_fsdp
    "--model=$model" --steps=20 --batch-size=2 --seq-len=128 --device=cuda
    "--ckpt-dir=$work/nvrx" --ckpt-every=5 --ckpt-mode=async --ckpt-saver=nvrx
    --inprocess --inprocess-max-iterations=3 --fault=exception --fault-step=12
    "--metrics-file=$work/nvrx/metrics.json")
ray_cmd=(python -m training.ray_finetune
    "--model=$model" "--num-workers=$gpus" --use-gpu --steps=10 --batch-size=2 --seq-len=128
    "--storage-path=$work/ray-results" "--output-json=$work/ray.json")
fabric_cmd=(torchrun --standalone "--nproc-per-node=$gpus" -m training.fabric_probe
    --device=cuda --max-bytes=256M --iters=10 "--output-json=$work/fabric.json")

if [ "${1:-}" = "--print-commands" ]; then
    printf '%q ' "${nvrx_cmd[@]}"
    echo
    printf '%q ' "${ray_cmd[@]}"
    echo
    printf '%q ' "${fabric_cmd[@]}"
    echo
    exit 0
fi

set -e
started=$SECONDS
mkdir -p "$work"
if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3.12}" -m venv "$venv"
    mapfile -t pins < <(grep -E '^(torch|ray\[default,train\]|transformers|tokenizers|safetensors|numpy|nvidia-resiliency-ext)==' \
        "$root/requirements-dev.txt")
    "$venv/bin/python" -m pip install --quiet "${pins[@]}"
fi
export PATH=$venv/bin:$PATH PYTHONPATH=$root
cd "$root"
rm -rf "$work/nvrx" "$work/ray-results" "$work/ray.json" "$work/fabric.json"
python -c "import sys; from pathlib import Path; from tests.training.tiny import corpus_lines, save_tiny_model
save_tiny_model(Path(sys.argv[1]), corpus_lines())" "$model"
python -m training.nvrx_fsdp "${nvrx_cmd[@]:5}" --check-args
set +e

declare -A status seconds
run() {
    local name=$1
    shift
    local begin=$SECONDS
    echo "=== $name: $*"
    timeout 240 "$@" 2>&1 | tail -n 40 | tee "$work/$name.log"
    local rc=${PIPESTATUS[0]}
    seconds[$name]=$((SECONDS - begin))
    if [ "$rc" -eq 0 ]; then status[$name]=PASS; else status[$name]="FAIL (exit $rc)"; fi
}
run nvrx "${nvrx_cmd[@]}"
run ray "${ray_cmd[@]}"
run fabric "${fabric_cmd[@]}"

python - "$work" "$gpus" "${status[nvrx]}" "${seconds[nvrx]}" "${status[ray]}" "${seconds[ray]}" \
    "${status[fabric]}" "${seconds[fabric]}" "$((SECONDS - started))" <<'PY'
import json, sys
from pathlib import Path

work, gpus = Path(sys.argv[1]), sys.argv[2]
(nvrx_status, nvrx_s, ray_status, ray_s, fabric_status, fabric_s, total_s) = sys.argv[3:]

def load(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}

def num(value, fmt):
    return format(value, fmt) if isinstance(value, (int, float)) else "n/a"

nvrx, ray, fabric = load(work / "nvrx/metrics.json"), load(work / "ray.json"), load(work / "fabric.json")
steps = [s["seconds"] for s in nvrx.get("step_times", [])]
median_step = sorted(steps)[len(steps) // 2] if steps else None
stall = nvrx.get("save_stall_s", {})
savers = sorted({s["saver"] for s in nvrx.get("saves", [])})
recovery = (nvrx.get("recoveries") or [{}])[0]
rows = [
    ("nvrx", nvrx_status, nvrx_s,
     f"median step {num(median_step, '.3f')} s; saver {','.join(savers) or 'n/a'}, median save stall "
     f"{num(stall.get('median'), '.3f')} s; fault {recovery.get('fault', 'none')} at step {recovery.get('step', '-')}: "
     f"{recovery.get('recovered_by', 'not recovered')} in {num(recovery.get('recovery_s'), '.1f')} s, "
     f"resumed at {recovery.get('resumed_step', '-')}"),
    ("ray", ray_status, ray_s,
     f"{num(ray.get('metrics', {}).get('mean_tokens_per_s'), '.0f')} tokens/s, final loss "
     f"{num(ray.get('metrics', {}).get('final_loss'), '.3f')}, checkpoint {ray.get('checkpoint_path') or 'none'}"),
    ("fabric", fabric_status, fabric_s,
     f"{fabric.get('world_size', 'n/a')} rank(s), backend {fabric.get('backend', 'n/a')}, peak bus bandwidth "
     f"{num(fabric.get('peak_busbw_gbps'), '.1f')} GB/s"),
]
print(f"\nGPU smoke on {gpus} GPU(s), {total_s} s in all")
print(f"{'step':<7} {'result':<14} {'seconds':>7}  measured")
for name, status, secs, measured in rows:
    print(f"{name:<7} {status:<14} {secs:>7}  {measured}")
PY
[ "${status[nvrx]}" = PASS ] && [ "${status[ray]}" = PASS ] && [ "${status[fabric]}" = PASS ]
