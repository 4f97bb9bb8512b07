"""What a rehearsal run is asked to do: `Options` (timeouts, kills, back-off, host paths, network, seams)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rehearse.errors import RehearsalError
from rehearse.seams import Admission, AlwaysAdmit, ApiServer, Clock, MonotonicClock, Placement, Unconstrained

_KILL = re.compile(r"^(?P<pod>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)@(?P<seconds>\d+(\.\d+)?)(,after=(?P<after>[^,]+))?$")


def after_path(option: str, text: str, after: str | None) -> Path | None:
    """The `after=PATH` of a kill option: relative to the output directory, without '..'."""
    if after is None:
        return None
    path = Path(after)
    if path.is_absolute() or ".." in path.parts:
        raise RehearsalError(
            f"{option} {text!r}: after={after} must be relative to the output directory, without '..' "
            "(a claim's files are under claims/<namespace>/<claim>/)"
        )
    return path


@dataclass(frozen=True, kw_only=True)
class Kill:
    """Kill the first running pod whose name or hostname starts with `pod`, `seconds` into the run, or `seconds`
    after the path `after` (relative to the output directory, e.g. a committed checkpoint on a claim:
    `claims/<ns>/<claim>/...`) first exists, so a run can lose a node at a point of the training."""

    pod: str
    seconds: float
    after: Path | None = None

    @classmethod
    def parse(cls, text: str) -> Kill:
        m = _KILL.match(text)
        if not m:
            raise RehearsalError(
                f"--kill {text!r}: write it as POD@SECONDS, e.g. nvrx-fsdp-1@30, or POD@SECONDS,after=PATH, e.g. "
                "nvrx-fsdp-1@0,after=claims/training/checkpoints/nvrx-fsdp/step_000000002/COMMITTED"
            )
        after = after_path("--kill", text, m.group("after"))
        return cls(pod=m.group("pod"), seconds=float(m.group("seconds")), after=after)


@dataclass(frozen=True, kw_only=True)
class Options:
    output_dir: Path | None = None
    timeout_s: float = 1800.0
    kills: tuple[Kill, ...] = ()
    # Kubernetes delays the pod that replaces a counted failure by 10 s, doubling (capped at 6 min).
    backoff_base_s: float = 10.0
    # Host directories every pod sees read-only at the same path (standing in for files in the image).
    host_paths: tuple[Path, ...] = ()
    log: Callable[[str], None] | None = None
    # "auto": a private bridge network where the machine allows it, else the loopback fallback (network.py);
    # "loopback": the fallback even where the bridge works.
    network: str = "auto"
    # The cluster model's seams (rehearse/seams.py): where pods run and when workloads are admitted.
    placement: Placement = field(default_factory=Unconstrained)
    admission: Admission = field(default_factory=AlwaysAdmit)
    clock: Clock = field(default_factory=MonotonicClock)
    # How often the loop looks at pods, seconds of `clock`.
    tick_s: float = 0.1
    # Node name -> address, for the Downward API's status.hostIP of pods a Placement bound to a node.
    node_addresses: Mapping[str, str] = field(default_factory=dict)
    # A Kubernetes API the pods reach (rehearse/seams.py ApiServer; the cluster rehearsal's), None: no API server.
    api: ApiServer | None = None
    # Image reference (repository:tag; a digest is ignored) -> the Python interpreter whose bin directory comes
    # first on PATH in that image's containers, so `python`, `ft_launcher` and `ray` are that environment's: a
    # virtualenv with the image's Python and package versions (scripts/image_envs.py). Other images run this
    # process's environment.
    image_python: Mapping[str, Path] = field(default_factory=dict)
    # At most this many training processes per pod where a workload starts one per GPU (rehearse/ranks.py); None: as
    # the manifest says. The pods' GPU requests, and so placement and quota, stay the chart's.
    ranks_per_pod: int | None = None

    def __post_init__(self) -> None:
        if self.network not in ("auto", "loopback"):
            raise RehearsalError(f"network={self.network!r}: use 'auto' or 'loopback'")
        if self.timeout_s <= 0:
            raise RehearsalError(f"timeout={self.timeout_s}: must be positive")
        if self.ranks_per_pod is not None and self.ranks_per_pod < 1:
            raise RehearsalError(f"ranks_per_pod={self.ranks_per_pod}: must be 1 or more (--ranks-per-pod)")
        if self.backoff_base_s < 0:
            raise RehearsalError(f"backoff_base_s={self.backoff_base_s}: must be 0 or more")
        for path in self.host_paths:
            if not Path(path).exists():
                raise RehearsalError(f"host path {path} does not exist")
        for image, python in self.image_python.items():
            if not os.access(python, os.X_OK):
                raise RehearsalError(
                    f"image_python[{image!r}]={str(python)!r} is not an executable Python; build the image's "
                    "environment first (make image-envs)"
                )
