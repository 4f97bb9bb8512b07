"""aws-ofi-nccl (the NCCL net plugin over EFA) and the EFA installer that carries it: which versions leak host memory
on every communicator teardown, and which installer brings which plugin. The runtime-packages gate
(gates/runtime_packages.py) refuses a restarting job on a leaking plugin from the lock's facts (k8s/images.lock.json);
the pods check the plugin they actually load (training/pod_checks.py, with the threshold passed from here).

Sources:
- aws/aws-ofi-nccl RELEASENOTES.md at tag v1.21.0 (2026-08), "Bug Fixes and Improvements": "Fixed a memory leak of
  the RDMA receive-buffer registration context that recurred on every communicator teardown and could exhaust host
  memory". Every ft_launcher restart (new worker processes) and every in-process restart (communicators destroyed
  and re-created in the same process) tears communicators down, so a restarting job on < 1.21.0 piles the leak up.
- The EFA installer's plugin, EC2 User Guide "Elastic Fabric Adapter release notes" (efa-changelog): 1.51.0
  (October 22, 2026) "Upgrade to Amazon OFI NCCL Plugin 1.22.0"; 1.50.0 (August 21, 2026) "... 1.21.1". 1.49.0 ->
  1.20.0: the Ray Train DLC changelog v1.1 (2026-09-01: "Upgraded EFA from 1.47.0 to 1.49.0 (aws-ofi-nccl 1.20.0)").
  1.47.0 -> 1.18.0: recorded before from the same release notes (the row was not re-read here).
"""

from __future__ import annotations

from packaging.version import Version

# The first aws-ofi-nccl without the per-teardown leak, and the first EFA installer that carries one (1.50.0: 1.21.1).
LEAK_FIXED = Version("1.21.0")
LEAK_FIXED_INSTALLER = Version("1.50.0")
LEAK_SOURCE = "aws/aws-ofi-nccl RELEASENOTES.md v1.21.0, Bug Fixes: the receive-buffer registration leak per teardown"

EFA_INSTALLER_OFI_NCCL: dict[str, str] = {
    "1.47.0": "1.18.0",
    "1.49.0": "1.20.0",
    "1.50.0": "1.21.1",
    "1.51.0": "1.22.0",
}

# What images/nvrx/Dockerfile installs over the base's EFA (tests/k8s/test_nvrx_image.py holds its ARGs to these).
NVRX_IMAGE_EFA_INSTALLER = "1.51.0"

# The job's restart mechanisms, as the gate and the pods name them.
FT_LAUNCHER = "ft_launcher"
INPROCESS = "inprocess"


def ofi_nccl_of(installer: str) -> str | None:
    """The aws-ofi-nccl an EFA installer release carries; None: not recorded here."""
    return EFA_INSTALLER_OFI_NCCL.get(installer)


def restart_mechanisms(*, max_restarts: int, inprocess: bool) -> tuple[str, ...]:
    """Which restart mechanisms tear communicators down in this job: ft_launcher with restarts left, in-process."""
    return (*((FT_LAUNCHER,) if max_restarts > 0 else ()), *((INPROCESS,) if inprocess else ()))


def fix(image: str) -> str:
    return (
        f"run an image with aws-ofi-nccl >= {LEAK_FIXED} (EFA installer >= {LEAK_FIXED_INSTALLER}): the environment's "
        f"built image (images/nvrx/Dockerfile installs EFA installer {NVRX_IMAGE_EFA_INSTALLER}, aws-ofi-nccl "
        f"{ofi_nccl_of(NVRX_IMAGE_EFA_INSTALLER)}; rebuild it if {image} predates that), or turn the restarts off"
    )


def restart_problems(*, image: str, aws_ofi_nccl: str | None, mechanisms: tuple[str, ...]) -> list[str]:
    """What is wrong with restarting (`mechanisms`) on image `image` whose plugin is `aws_ofi_nccl`."""
    if not mechanisms:
        return []
    using = " and ".join(mechanisms)
    if aws_ofi_nccl is None:
        return [
            f"the image's aws-ofi-nccl version is not recorded (runtime.aws_ofi_nccl in k8s/images.lock.json): "
            f"{using} restarts tear NCCL communicators down, which leak host memory on aws-ofi-nccl < {LEAK_FIXED} "
            f"({LEAK_SOURCE}); record it, or {fix(image)}"
        ]
    if Version(aws_ofi_nccl) < LEAK_FIXED:
        return [
            f"aws-ofi-nccl {aws_ofi_nccl} leaks host memory on every communicator teardown, which each {using} "
            f"restart does ({LEAK_SOURCE}): {fix(image)}"
        ]
    return []
