"""`--ranks-per-pod N`: at most N training processes in a pod that would start one per GPU.

On CPU every rank is a whole Python with torch, and 8 of them per pod (p5) or 4 (g6) on a 2-core machine spend a run
importing and context-switching. The rewrite caps what starts processes per pod and leaves what the scheduler and
Kueue see (the pods' GPU requests) as the chart wrote it:
- `--nproc-per-node=K` of ft_launcher and torchrun in a container's command or args -> N;
- the `num-gpus` a Ray GPU worker group advertises (the chart's rayStartParams value, or the one KubeRay derives from
  the GPU limit: rehearse/kuberay.py) -> N, and a RayJob entrypoint's `--num-workers K` (Ray Train, one GPU each) ->
  N per GPU worker pod, so Ray Train still spreads its workers over every worker pod.
Every rewrite is reported.
"""

from __future__ import annotations

import re
from typing import Any

from rehearse.kuberay import RAY_CONTAINER, gpu_limit
from rehearse.scale import texts

_NPROC = re.compile(r"(?<![\w-])(--nproc-per-node|--nproc_per_node)([= ]+)(\d+)")
_NUM_WORKERS = re.compile(r"(?<![\w-])(--num-workers)([= ]+)(\d+)")


def _worker_groups(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec") or {}
    cluster = spec.get("rayClusterSpec", spec) if obj.get("kind") == "RayJob" else spec
    groups: list[dict[str, Any]] = (cluster or {}).get("workerGroupSpecs") or []
    return groups


def ranks_per_pod(obj: dict[str, Any], n: int) -> list[str]:
    """Caps the processes per pod of `obj` at `n` in place; what it rewrote."""
    done = []
    for text in texts(obj):

        def cap(m: re.Match[str]) -> str:
            return f"{m.group(1)}{m.group(2)}{min(int(m.group(3)), n)}"

        new = _NPROC.sub(cap, text.value)
        if new != text.value:
            text.set(new)
            counts = sorted({m.group(3) for m in _NPROC.finditer(text.value) if int(m.group(3)) > n})
            done.append(f"{text.where}: --ranks-per-pod {n} set --nproc-per-node {', '.join(counts)} -> {n}")
    gpu_pods = 0
    for group in _worker_groups(obj):
        gpus = gpu_limit(group["template"]["spec"]["containers"][RAY_CONTAINER])
        if gpus == 0:
            continue
        gpu_pods += int(group.get("replicas", group.get("minReplicas", 1)))
        params = group.setdefault("rayStartParams", {})
        advertised = int(float(params.get("num-gpus", gpus)))
        if advertised > n:
            params["num-gpus"] = str(n)
            done.append(
                f"{obj['kind']}/{obj['metadata'].get('name')}: worker group {group.get('groupName')!r} "
                f"--ranks-per-pod {n} set num-gpus {advertised} -> {n}"
            )
    spec = obj.get("spec") or {}
    entrypoint = spec.get("entrypoint")
    if obj.get("kind") == "RayJob" and isinstance(entrypoint, str) and gpu_pods:
        m = _NUM_WORKERS.search(entrypoint)
        if m and int(m.group(3)) > gpu_pods * n:
            spec["entrypoint"] = (
                entrypoint[: m.start()] + f"{m.group(1)}{m.group(2)}{gpu_pods * n}" + entrypoint[m.end() :]
            )
            done.append(
                f"RayJob/{obj['metadata'].get('name')}: spec.entrypoint --ranks-per-pod {n} set --num-workers "
                f"{m.group(3)} -> {gpu_pods * n} ({gpu_pods} GPU worker pod(s) x {n})"
            )
    return done
