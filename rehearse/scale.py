"""Models and data from a hub are cluster-only: a workload whose command would download a model or a data
set (a Hugging Face hub id as the value of a model or data flag, an http(s) URL outside the cluster) is
refused before anything runs unless `--substitute REF=LOCAL_PATH` names a local copy; and the project's own
workloads (training.nvrx_fsdp, training.ray_finetune) get a rehearsal scale, `--scale small`: the tiny Qwen2
of rehearse/tiny_model.py built locally, a few steps, small batches and sequences, as tests/rehearse does; the
fabric probe (training.fabric_probe) a short sweep.
Every rewrite is reported.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rehearse.host import containers

HUB_FLAGS = (
    "--model",
    "--model-name",
    "--model-id",
    "--model_name_or_path",
    "--model-name-or-path",
    "--tokenizer",
    "--dataset",
    "--dataset-name",
    "--data",
)
_FLAG_VALUE = re.compile(
    r"(?P<flag>" + "|".join(re.escape(f) for f in HUB_FLAGS) + r")(?P<sep>[= ]+)(?P<value>[^\s'\"]+)"
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_URL = re.compile(r"https?://(?P<host>[^\s/:'\"]+)[^\s'\"]*")
CLUSTER_SUFFIXES = (".svc", ".svc.cluster.local", ".cluster.local")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "0.0.0.0")

# The project's own workloads and the flags `--scale small` sets (tests/rehearse/test_workloads.py's sizes); the
# fabric probe's sweep ends at 16 MiB and times 5 iterations (at 1 GiB, 8 CPU ranks on gloo take minutes and memory
# a rank can be killed for). Its floor stays the chart's: on CPU the verdict is FAIL (not EFA) at any size.
SMALL = {"--steps": "6", "--batch-size": "2", "--seq-len": "32", "--ckpt-every": "2", "--num-workers": "2"}
SMALL_BY_WORKLOAD: dict[str, dict[str, str]] = {
    # A tiny-model step takes ~50 ms, under the rehearsal's 0.1 s tick: a --kill after=<a checkpoint's COMMITTED>
    # would land steps later, after the next checkpoint (training/nvrx_config.py min_step_s).
    "training.nvrx_fsdp": {**SMALL, "--min-step-s": "1"},
    "training.ray_finetune": SMALL,
    "training.fabric_probe": {"--max-bytes": str(16 << 20), "--iters": "5"},
}
# Flags `--scale small` adds where the command does not carry them (the others it only rewrites).
PACING = ("--min-step-s",)
SCALES = ("full", "small")


@dataclass(frozen=True)
class Text:
    """One command string of a workload (an argument or a RayJob entrypoint) and how to write it back."""

    where: str
    value: str
    set: Callable[[str], None]


def texts(obj: dict[str, Any]) -> Iterator[Text]:
    kind, name = obj.get("kind"), (obj.get("metadata") or {}).get("name")
    for c in containers(obj):
        for key in ("command", "args"):
            items = c.spec.get(key) or []
            for i, item in enumerate(items):

                def put(new: str, items: list[Any] = items, i: int = i) -> None:
                    items[i] = new

                yield Text(f"{kind}/{name}: container {c.spec.get('name')!r} {key}[{i}]", str(item), put)
    spec = obj.get("spec") or {}
    if kind == "RayJob" and isinstance(spec.get("entrypoint"), str):

        def put_entrypoint(new: str) -> None:
            spec["entrypoint"] = new

        yield Text(f"RayJob/{name}: spec.entrypoint", spec["entrypoint"], put_entrypoint)


def _remote_url(host: str) -> bool:
    return not ("$" in host or host in LOCAL_HOSTS or "." not in host or host.endswith(CLUSTER_SUFFIXES))


def hub_problems(obj: dict[str, Any], substitutes: Mapping[str, str]) -> Iterator[str]:
    for text in texts(obj):
        for m in _FLAG_VALUE.finditer(text.value):
            value = m.group("value")
            if _HUB_ID.match(value) and value not in substitutes and not Path(value).exists():
                yield (
                    f"{text.where}: {m.group('flag')} {value} would download {value} from a model hub, which a "
                    f"rehearsal does not do; fix: pass --substitute {value}=LOCAL_DIR (a local copy), or "
                    "--scale small for the project's own workloads"
                )
        for m in _URL.finditer(text.value):
            if _remote_url(m.group("host")) and m.group(0) not in substitutes:
                yield (
                    f"{text.where}: {m.group(0)} would be downloaded from outside the cluster, which a rehearsal "
                    f"does not do; fix: pass --substitute {m.group(0)}=LOCAL_PATH (a local copy)"
                )


def substitute(obj: dict[str, Any], substitutes: Mapping[str, str]) -> list[str]:
    """Replaces every occurrence of each REF by its local path; what it replaced."""
    done = []
    for text in texts(obj):
        new = text.value
        for ref, local in substitutes.items():
            new = new.replace(ref, local)
        if new != text.value:
            text.set(new)
            done.append(f"{text.where}: substituted {', '.join(r for r in substitutes if r in text.value)}")
    return done


def _set_flag(text: str, flag: str, value: str) -> str:
    return re.sub(rf"(?<![\w-]){re.escape(flag)}([= ]+)[^\s'\"]+", lambda m: f"{flag}{m.group(1)}{value}", text)


def scale_small(obj: dict[str, Any], model: Path) -> list[str]:
    """Rewrites the flags of the project's own workloads in `obj` to the small rehearsal scale; what it did."""
    done = []
    for text in texts(obj):
        workloads = [w for w in SMALL_BY_WORKLOAD if w in text.value]
        small = {f: v for w in workloads for f, v in SMALL_BY_WORKLOAD[w].items()}
        if not small:
            continue
        wanted = {"--model": str(model), **small}
        new = text.value
        for flag, value in wanted.items():
            new = _set_flag(new, flag, value)
        for flag in PACING:
            if flag in wanted and not re.search(rf"(?<![\w-]){re.escape(flag)}[= ]", new):
                # Not a flag the chart writes: given right after the module, among the script's own arguments.
                new = re.sub(rf"(-m {re.escape(workloads[0])})(?=\s|$)", rf"\1 {flag} {wanted[flag]}", new)
        if new != text.value:
            text.set(new)
            flags = ", ".join(f"{f} {v}" for f, v in wanted.items() if f in new)
            done.append(f"{text.where}: --scale small set {flags}")
    return done


def parse_pairs(pairs: list[str], option: str) -> dict[str, str]:
    """`A=B` option values as a mapping; ValueError naming the option and the value."""
    out = {}
    for pair in pairs:
        ref, sep, local = pair.rpartition("=")
        if not sep or not ref or not local:
            raise ValueError(f"{option} {pair!r}: write it as REF=LOCAL_PATH")
        if not Path(local).exists():
            raise ValueError(f"{option} {pair!r}: {local} does not exist on this machine")
        out[ref] = str(Path(local).resolve())
    return out
