#!/usr/bin/env bash
# GPU smoke for the lent GPU machine, as it is: its own Python and torch, no package index. Needs the wheels of
# `make gpu-bundle` (NVRx 0.7.0, Ray 2.58.0 and what the machine lacks of theirs) carried in .gpu-bundle/, which it
# installs with pip --no-index --no-deps --target. A tiny Qwen2 model is built locally (tests/training/tiny.py).
# In about 8 minutes on one GPU, each run on CUDA with NCCL and bf16 compute:
#   nvrx-inprocess  ft_launcher (no launcher restarts) over training.nvrx_fsdp with the
#                   NVRx async saver and an exception at step 12 that NVRx's in-process restart must recover;
#   ft-sigkill      ft_launcher restarting the workers after a SIGKILL of the last rank at step 12;
#   nvrx-sync       the same loop with synchronous saves and no fault: the sync save stall and step time;
#   fabric          the all-reduce probe (training.fabric_probe; on one GPU bus bandwidth is 0 by definition);
#   ray             the Ray Train fine-tune (training.ray_finetune --use-gpu), when Ray is carried;
# then prints one table (recovery seconds per mechanism, async vs sync save stall, step time, tokens/s) and writes
# it as JSON. docs/gpu-smoke.md has the exact run command.
#
#   scripts/gpu_smoke.sh [--json PATH]     run (default PATH: $GPU_SMOKE_DIR/gpu-smoke.json; logs: PATH's
#                                          name with -logs.tar.gz)
#   scripts/gpu_smoke.sh --print-commands  print each run as `name command...`, one per line, and exit
#
# GPU_SMOKE_PYTHON  the machine's Python (default /opt/torch/.venv/bin/python3)
# GPU_SMOKE_BUNDLE  the carried wheels (default .gpu-bundle in the repository)
# GPU_SMOKE_DIR     work files (default /tmp/gpu-smoke)
# GPU_SMOKE_BUDGET_S  seconds for the whole script, runs cut or skipped to fit (default 500)
# Refuses to start (exit 2), naming what is missing, without that Python, a CUDA GPU it sees, or the wheels.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
py=${GPU_SMOKE_PYTHON:-/opt/torch/.venv/bin/python3}
bundle=${GPU_SMOKE_BUNDLE:-$root/.gpu-bundle}
work=${GPU_SMOKE_DIR:-/tmp/gpu-smoke}
site=$work/site
model=$work/tiny-model
json=$work/gpu-smoke.json
mode=run
while [ $# -gt 0 ]; do
    case $1 in
        --print-commands) mode=print ;;
        --json) json=${2:?--json needs a path}; shift ;;
        --json=*) json=${1#--json=} ;;
        *) echo "gpu_smoke: unknown argument $1 (use --json PATH or --print-commands)" >&2; exit 2 ;;
    esac
    shift
done

# --- preflight: the machine's Python, a GPU its torch sees, the carried wheels ------------------------------------
gpus=${GPU_SMOKE_GPUS:-1}
missing=()
if [ "$mode" = run ]; then
    torch_json=$work/torch.json
    mkdir -p "$work"
    if [ ! -x "$py" ]; then
        missing+=("the machine's Python: $py is not an executable (set GPU_SMOKE_PYTHON)")
    elif ! "$py" -W ignore - "$torch_json" >"$work/torch.log" 2>"$work/torch.err" <<'PY'
import json, sys
import torch

count = torch.cuda.device_count() if torch.cuda.is_available() else 0
info = {"python": sys.executable, "version": torch.__version__, "cuda": torch.version.cuda, "gpus": count,
        "device": torch.cuda.get_device_name(0) if count else None, "torch_path": torch.__file__}
with open(sys.argv[1], "w") as out:
    json.dump(info, out)
print(f"torch {info['version']} (CUDA {info['cuda']}) from {info['python']}: {count} GPU(s) {info['device'] or ''}")
PY
    then
        missing+=("torch in $py: $(tail -n 1 "$work/torch.err")")
    else
        cat "$work/torch.log"
        gpus=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["gpus"])' "$torch_json")
        if [ "$gpus" -lt 1 ]; then
            missing+=("a CUDA GPU: $(cat "$work/torch.log")")
        fi
    fi
    shopt -s nullglob
    wheels=("$bundle"/*.whl)
    shopt -u nullglob
    if [ ! -f "$bundle/manifest.json" ] || [ ${#wheels[@]} -eq 0 ]; then
        missing+=("the carried wheels: no manifest.json and *.whl in $bundle (run 'make gpu-bundle' on a CPU machine and name .gpu-bundle in the run's carry)")
    elif ! grep -q '"name": "nvidia-resiliency-ext"' "$bundle/manifest.json"; then
        missing+=("nvidia-resiliency-ext in $bundle/manifest.json (rebuild with 'make gpu-bundle')")
    fi
    if [ ${#missing[@]} -gt 0 ]; then
        echo "gpu_smoke: refusing to start; missing:" >&2
        printf '  - %s\n' "${missing[@]}" >&2
        exit 2
    fi
fi
ray_carried=false
if [ "$mode" = print ] || grep -q '"name": "ray"' "$bundle/manifest.json"; then
    ray_carried=true
fi

# --- the runs -----------------------------------------------------------------------------------------------------
batch=4
seq=128
ft=("$py" -m nvidia_resiliency_ext.fault_tolerance.launcher --standalone "--nproc-per-node=$gpus" --monitor-interval=1)
loop=(-m training.nvrx_fsdp "--model=$model" --device=cuda --steps=20 "--batch-size=$batch" "--seq-len=$seq"
    --ckpt-every=5 --log-every=5)
# One array per run, named after it with '_' for '-' (bash names cannot hold '-').
names=(nvrx-inprocess ft-sigkill nvrx-sync fabric ray)
# In-process restart (deprecated upstream from NVRx 0.6.0, k8s/nvrx_spec.py InProcessRestart) under ft_launcher's only
# policy, any-failed (0.7.0 rejects min-healthy); --max-restarts=0: only the Wrapper may recover.
nvrx_inprocess=("${ft[@]}" --max-restarts=0 "${loop[@]}"
    "--ckpt-dir=$work/inprocess" --ckpt-mode=async --ckpt-saver=nvrx --inprocess --inprocess-soft-timeout=30
    --inprocess-hard-timeout=45 --inprocess-barrier-timeout=60 --inprocess-max-iterations=3
    --fault=exception --fault-step=12 "--metrics-file=$work/inprocess/metrics.json")
ft_sigkill=("${ft[@]}" --max-restarts=2 "${loop[@]}" "--ckpt-dir=$work/sigkill" --ckpt-mode=async --ckpt-saver=nvrx
    --fault=kill --fault-step=12 "--fault-rank=$((gpus - 1))" "--metrics-file=$work/sigkill/metrics.json")
nvrx_sync=("${ft[@]}" --max-restarts=0 "${loop[@]}" "--ckpt-dir=$work/sync" --ckpt-mode=sync
    "--metrics-file=$work/sync/metrics.json")
fabric=("$py" -m torch.distributed.run --standalone "--nproc-per-node=$gpus" -m training.fabric_probe
    --device=cuda --max-bytes=256M --iters=10 "--output-json=$work/fabric.json")
ray=("$py" -m training.ray_finetune "--model=$model" "--num-workers=$gpus" --use-gpu --steps=10
    "--batch-size=$batch" "--seq-len=$seq" "--storage-path=$work/ray-results" "--output-json=$work/ray.json")
# Seconds each run may take, and the whole script (install and model included): a run is cut to what is left of
# the budget, or skipped, so the table is printed before the run tool's own timeout (docs/gpu-smoke.md: 560 s).
declare -A limit=([nvrx-inprocess]=110 [ft-sigkill]=120 [nvrx-sync]=70 [fabric]=40 [ray]=110)
budget=${GPU_SMOKE_BUDGET_S:-500}

if [ "$mode" = print ]; then
    for name in "${names[@]}"; do
        declare -n cmd="${name//-/_}"
        printf '%s ' "$name"
        printf '%q ' "${cmd[@]}"
        echo
        unset -n cmd
    done
    exit 0
fi
started=$SECONDS
rm -rf "$site" "$model" "$work/inprocess" "$work/sigkill" "$work/sync" "$work/ray-results" "$work"/*.json.part \
    "$work/fabric.json" "$work/ray.json" "$work/runs.tsv"
echo "=== install: ${#wheels[@]} carried wheels from $bundle into $site"
"$py" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
    --target "$site" "${wheels[@]}" || { echo "gpu_smoke: pip install of the carried wheels failed" >&2; exit 2; }
export PYTHONPATH=$site:$root PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 TORCH_CPP_LOG_LEVEL=ERROR
cd "$root"
"$py" scripts/gpu_bundle.py check --manifest "$bundle/manifest.json" --site "$site" || exit 2
"$py" -c "import sys; from pathlib import Path; from tests.training.tiny import corpus_lines, save_tiny_model
save_tiny_model(Path(sys.argv[1]), corpus_lines())" "$model" || { echo "gpu_smoke: the tiny model failed" >&2; exit 1; }
for cmd in nvrx_inprocess ft_sigkill nvrx_sync; do
    declare -n argv=$cmd
    # The loop's own arguments after ft_launcher's (from -m on), validated before any launcher starts.
    for i in "${!argv[@]}"; do [ "${argv[$i]}" = -m ] && [ "${argv[$((i + 1))]}" = training.nvrx_fsdp ] && break; done
    "$py" "${argv[@]:$i}" --check-args >/dev/null || { echo "gpu_smoke: $cmd's arguments were refused" >&2; exit 2; }
    unset -n argv
done

: >"$work/runs.tsv"
for name in "${names[@]}"; do
    if [ "$name" = ray ] && [ "$ray_carried" != true ]; then
        printf '%s\t%s\t%s\n' "$name" "SKIPPED: Ray not carried" 0 >>"$work/runs.tsv"
        continue
    fi
    left=$((budget - (SECONDS - started)))
    allowed=$((left < ${limit[$name]} ? left : ${limit[$name]}))
    if [ "$allowed" -lt 15 ]; then
        printf '%s\t%s\t%s\n' "$name" "SKIPPED: out of time" 0 >>"$work/runs.tsv"
        continue
    fi
    declare -n cmd="${name//-/_}"
    echo "=== $name (limit $allowed s): ${cmd[*]}"
    begin=$SECONDS
    timeout --kill-after=5 "$allowed" "${cmd[@]}" >"$work/$name.log" 2>&1
    rc=$?
    tail -n 8 "$work/$name.log"
    if [ "$rc" -eq 0 ]; then result=PASS; else result="FAIL (exit $rc)"; fi
    printf '%s\t%s\t%s\n' "$name" "$result" "$((SECONDS - begin))" >>"$work/runs.tsv"
    unset -n cmd
done

"$py" scripts/gpu_smoke_report.py "$work" --json "$json" --runs "$work/runs.tsv" --torch "$torch_json" \
    --tokens-per-step "$((batch * seq * gpus))" --total-s "$((SECONDS - started))"
tar -czf "${json%.json}-logs.tar.gz" -C "$work" --exclude=site --exclude=tiny-model --exclude='*.distcp' \
    --exclude=ray-results . 2>/dev/null || true
! grep -q FAIL "$work/runs.tsv"
