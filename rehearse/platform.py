"""Whether this machine can run rehearsal pods (Linux, util-linux `unshare`, mount/PID/UTS namespaces)."""

from __future__ import annotations

import shutil
import subprocess
import sys

from rehearse.errors import RehearsalError


def check_platform() -> None:
    """RehearsalError unless this machine can make the namespaces a pod needs."""
    if not sys.platform.startswith("linux"):
        raise RehearsalError(f"rehearsal needs Linux namespaces; this is {sys.platform}")
    if shutil.which("unshare") is None:
        raise RehearsalError("rehearsal needs util-linux `unshare` on PATH")
    probe = subprocess.run(
        ["unshare", "--mount", "--uts", "--ipc", "--pid", "--fork", "--kill-child", "--mount-proc", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        raise RehearsalError(
            "cannot create mount/PID/UTS namespaces (run as root, or enable unprivileged user namespaces): "
            + probe.stderr.strip()
        )
