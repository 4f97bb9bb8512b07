"""What NVRx (nvidia-resiliency-ext) supports, with its source: the combinations of NVRx, Python and NCCL an image
may carry for the NVRx job. The runtime-packages gate (gates/runtime_packages.py) refuses a workload whose image or
start-time install falls outside them; the image facts it compares with are the lock's (k8s/images.lock.json).

Sources, in NVIDIA/nvidia-resiliency-ext:
- Python: README.md "Platform Support" at v0.4.1 (line 51) and v0.6.0 (line 54): ">= 3.10, < 3.13";
- NCCL with in-process restart: v0.4.1 README.md line 55 ">= 2.26.2 (inprocess)"; v0.6.0 README.md line 58 and
  docs/source/release-notes.md (v0.5.0 Known Issues, line 52): "In-process restart requires NCCL < v2.28.3 OR
  >= 2.28.9 due to a segmentation fault issue" (NCCL 2.28.3 to 2.28.8 crash);
- v0.6.0 docs/source/release-notes.md "Deprecations & Removals": `--ft-restart-policy=min-healthy` is removed, only
  `any-failed` remains (line 61; 0.7.0's ft_launcher rejects the value: launcher.py `--ft-restart-policy` choices);
  in-process restart is deprecated (line 64) but works: k8s/nvrx_spec.py InProcessRestart is an explicit option.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version


@dataclass(frozen=True)
class NvrxSupport:
    python: SpecifierSet
    inprocess_nccl_min: Version
    # Inclusive: every NCCL release in it crashes with in-process restart.
    inprocess_nccl_bad: tuple[Version, Version]
    # From this NVRx release on, min-healthy is gone (and in-process restart deprecated).
    min_healthy_removed_from: Version
    source: str

    def problems(self, *, nvrx: str, python: str, nccl: str | None, inprocess: bool, min_healthy: bool) -> list[str]:
        """What is wrong with NVRx `nvrx` on this Python and NCCL, for a job with or without in-process restart."""
        found = []
        version = Version(nvrx)
        if Version(f"{python}.0") not in self.python:
            found.append(f"NVRx {nvrx} supports Python {self.python}, the image has Python {python}")
        if min_healthy and version >= self.min_healthy_removed_from:
            found.append(
                f"NVRx {nvrx} removed --ft-restart-policy=min-healthy (from {self.min_healthy_removed_from}; its "
                "ft_launcher exits 2 on it): drop the flag, any-failed is the only policy"
            )
        if inprocess:
            low, high = self.inprocess_nccl_bad
            if nccl is None:
                found.append(
                    "the image's NCCL version is not recorded (runtime.nccl in k8s/images.lock.json): in-process "
                    f"restart needs NCCL >= {self.inprocess_nccl_min} and not {low} to {high}"
                )
            elif low <= Version(nccl) <= high:
                found.append(
                    f"NCCL {nccl} crashes with NVRx in-process restart (NCCL {low} to {high}; NVRx needs < {low} "
                    f"or >= {high.major}.{high.minor}.{high.micro + 1}): use an image with another NCCL or turn "
                    "nvrx.inprocess off"
                )
            elif Version(nccl) < self.inprocess_nccl_min:
                found.append(f"NCCL {nccl} is older than the {self.inprocess_nccl_min} NVRx in-process restart needs")
        return found


NVRX_SUPPORT = NvrxSupport(
    python=SpecifierSet(">=3.10,<3.13"),
    inprocess_nccl_min=Version("2.26.2"),
    inprocess_nccl_bad=(Version("2.28.3"), Version("2.28.8")),
    min_healthy_removed_from=Version("0.6.0"),
    source="NVIDIA/nvidia-resiliency-ext README.md Platform Support (v0.4.1, v0.6.0) and "
    "docs/source/release-notes.md (v0.5.0 Known Issues, v0.6.0 Deprecations & Removals)",
)
NVRX_DISTRIBUTION = "nvidia-resiliency-ext"
