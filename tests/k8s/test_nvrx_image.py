"""images/nvrx/Dockerfile and its build script: one fact each (the pins are NvrxFsdpJob.pip, the base is the lock's
nvrx-train reference, the EFA installer is k8s/ofi_nccl.py's), and the build-time import check names modules that
exist in the pinned NVRx. Nobody can run
docker here: the image itself has never been built in this project's CI."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from k8s.images import ImageLock
from k8s.nvrx_spec import NVRX_IMAGE, NvrxFsdpJob
from tests.conftest import ROOT

DOCKERFILE = ROOT / "images/nvrx/Dockerfile"
BUILD = ROOT / "scripts/build_nvrx_image.sh"


def _instructions() -> list[str]:
    """Dockerfile instructions with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _args() -> dict[str, str]:
    return dict(i.removeprefix("ARG ").split("=", 1) for i in _instructions() if i.startswith("ARG ") and "=" in i)


def test_the_image_installs_exactly_the_jobs_pinned_packages() -> None:
    """NVRx is built from its source tag (no wheel fits the base's glibc 2.34), the rest pip-installed by pin: the
    pair (NVRx at the tag of NVRX_VERSION, the pip line's pins) is NvrxFsdpJob.pip, in its order."""
    (install,) = [i for i in _instructions() if i.startswith("RUN python -m pip install --no-cache-dir transformers")]
    packages = [a for a in shlex.split(install.removeprefix("RUN ")) if "==" in a]
    assert (f"nvidia-resiliency-ext=={_args()['NVRX_VERSION']}", *packages) == NvrxFsdpJob().pip
    (build,) = [i for i in _instructions() if "nvidia-resiliency-ext.git" in i]
    assert 'git clone --depth 1 --branch "v${NVRX_VERSION}"' in build
    assert "STRAGGLER_DET_SKIP_CUPTI_EXT_BUILD=1" in build
    # The wheel built is the tag's version (poetry-dynamic-versioning reads it from the tag) and nothing else.
    assert "nvidia_resiliency_ext-${NVRX_VERSION}-" in build


def test_the_image_upgrades_efa_to_the_installer_the_lock_records() -> None:
    """The base's EFA installer carries an aws-ofi-nccl that leaks on every teardown (k8s/ofi_nccl.py): the image
    installs the installer k8s/ofi_nccl.py names, checksum verified once recorded, and refuses another plugin."""
    from k8s.ofi_nccl import NVRX_IMAGE_EFA_INSTALLER, ofi_nccl_of

    args = _args()
    assert args["EFA_INSTALLER_VERSION"] == NVRX_IMAGE_EFA_INSTALLER
    assert args["AWS_OFI_NCCL_VERSION"] == ofi_nccl_of(NVRX_IMAGE_EFA_INSTALLER)
    (efa,) = [i for i in _instructions() if "efa_installer.sh" in i]
    assert "--skip-kmod --skip-limit-conf --no-verify --disable-ngc" in efa
    assert "sha256sum" in efa


def test_the_pin_guard_uses_a_recorded_value_and_refuses_another(tmp_path: Path) -> None:
    """The EFA tarball's checksum and NVRx's tag commit are pinned the way the base digest is: the build prints
    what it got; once the Dockerfile records it, anything else stops the build."""
    guard = ROOT / "images/nvrx/pin_guard.sh"
    ok = subprocess.run(["sh", str(guard), "thing", "abc", ""], capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0
    assert "thing: abc (not recorded yet" in ok.stderr
    same = subprocess.run(["sh", str(guard), "thing", "abc", "abc"], capture_output=True, text=True, timeout=30)
    assert same.returncode == 0
    other = subprocess.run(["sh", str(guard), "thing", "abd", "abc"], capture_output=True, text=True, timeout=30)
    assert other.returncode == 1
    assert "refusing" in other.stderr
    assert "abc" in other.stderr


def test_the_base_is_the_locks_nvrx_train_reference() -> None:
    instructions = _instructions()
    (arg,) = [i for i in instructions if i.startswith("ARG BASE=")]
    assert arg.removeprefix("ARG BASE=") == ImageLock.load().get(NVRX_IMAGE).reference
    assert "FROM ${BASE}" in instructions


def test_the_build_time_import_check_passes_against_the_pinned_nvrx() -> None:
    (check,) = [i for i in _instructions() if i.startswith('RUN python -c "') and "nvrx imports ok" in i]
    code = shlex.split(check.removeprefix("RUN "))[2]
    for name in ("inprocess import Wrapper", "TorchAsyncCheckpoint", "AsyncCallsQueue", "ft_launcher"):
        assert name in code
    # nvidia-resiliency-ext 0.7.0 is in this environment: the same statement must import here.
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout.strip()) == (0, "nvrx imports ok"), result.stderr


def test_the_build_script_parses_and_pins_through_trainctl() -> None:
    assert subprocess.run(["bash", "-n", str(BUILD)], capture_output=True, text=True).returncode == 0
    text = BUILD.read_text()
    # The same resolver as the CodeBuild project: FROM the digest the lock's tag names here, or no build.
    assert 'from_digest=$(sh "$root/images/nvrx/resolve_base.sh" "$base")' in text
    assert 'docker build --build-arg "BASE=$from_digest"' in text
    assert '--label "org.opencontainers.image.base.digest=${from_digest##*@}"' in text
    assert 'trainctl pin --set "nvrx-train-$env=' in text
    assert 'python3 -m k8s.built_images add "$env" "$account"' in text
    usage = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=30)
    assert (usage.returncode, usage.stderr.strip()) == (2, f"usage: {BUILD} ENV ACCOUNT")


def test_the_built_image_entry_is_added_unpinned_with_the_dockerfile_packages() -> None:
    from infra.spec import ENVIRONMENTS
    from k8s.built_images import built_image, built_reference
    from k8s.images import ImageLock
    from k8s.nvrx_spec import NvrxFsdpJob

    lock = ImageLock.load()
    prod = ENVIRONMENTS["prod"]
    entry = built_image(lock, prod, reference=built_reference(prod, "123456789012"), digest=None)
    assert entry.name == "nvrx-train-prod"
    assert entry.reference.startswith("123456789012.dkr.ecr.us-east-2.amazonaws.com/ml-prod/nvrx-train:nvrx-")
    assert entry.runtime is not None
    base = lock.get(NVRX_IMAGE).runtime
    assert base is not None
    assert (entry.runtime.python, entry.runtime.nccl) == (base.python, base.nccl)
    # What images/nvrx/Dockerfile adds: the EFA installer, its aws-ofi-nccl, and NVRx.
    assert (entry.runtime.efa_installer, entry.runtime.aws_ofi_nccl, entry.runtime.nvrx) == (
        "1.51.0",
        "1.22.0",
        "0.7.0",
    )
    assert {f"{n}=={v}" for n, v in entry.runtime.packages.items()} >= set(NvrxFsdpJob().pip)


# --- the FROM, pinned by digest where the build runs ------------------------------------------------------------------

RESOLVE = ROOT / "images/nvrx/resolve_base.sh"
REPOSITORY = "public.ecr.aws/deep-learning-containers/pytorch"
TAGGED = f"{REPOSITORY}:2.13.0-cu133-amzn2023"
DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32

# A docker CLI for the resolver: `pull` fails when FAKE_PULL_FAILS is set, `image inspect` prints FAKE_REPO_DIGESTS
# (one per line); every call is appended to FAKE_CALLS.
FAKE_DOCKER = """#!/bin/sh
echo "$*" >> "$FAKE_CALLS"
case "$1" in
  pull) [ -z "${FAKE_PULL_FAILS:-}" ] || { echo "pull access denied" >&2; exit 1; }; echo "$3" ;;
  image) printf '%s\\n' $FAKE_REPO_DIGESTS ;;
  *) exit 3 ;;
esac
"""


def _resolve(
    tmp_path: Path, base: str, *, repo_digests: str = "", pull_fails: bool = False
) -> tuple[int, str, str, str]:
    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    calls = tmp_path / "calls"
    calls.write_text("")
    env = {
        "PATH": "/usr/bin:/bin",
        "DOCKER": str(docker),
        "FAKE_CALLS": str(calls),
        "FAKE_REPO_DIGESTS": repo_digests,
        **({"FAKE_PULL_FAILS": "1"} if pull_fails else {}),
    }
    done = subprocess.run(["sh", str(RESOLVE), base], capture_output=True, text=True, env=env, timeout=30)
    return done.returncode, done.stdout.strip(), done.stderr, calls.read_text()


def test_the_base_tag_is_resolved_to_its_digest_where_the_build_runs(tmp_path: Path) -> None:
    # RepoDigests may list the image under other repositories too: the one of the reference is taken.
    digests = f"other.example/x@{OTHER} {REPOSITORY}@{DIGEST}"
    code, out, err, calls = _resolve(tmp_path, TAGGED, repo_digests=digests)
    assert (code, out) == (0, f"{REPOSITORY}@{DIGEST}")
    assert f"pull --quiet {TAGGED}" in calls
    assert DIGEST in err  # the build log records what the tag named


def test_a_pinned_digest_is_used_when_the_tag_still_names_it_and_refused_when_not(tmp_path: Path) -> None:
    same = _resolve(tmp_path, f"{TAGGED}@{DIGEST}", repo_digests=f"{REPOSITORY}@{DIGEST}")
    assert same[:2] == (0, f"{REPOSITORY}@{DIGEST}")
    code, out, err, _ = _resolve(tmp_path, f"{TAGGED}@{OTHER}", repo_digests=f"{REPOSITORY}@{DIGEST}")
    assert (code, out) == (1, "")
    assert f"the lock pins {OTHER}" in err
    assert f"{TAGGED} now names {DIGEST}" in err
    assert "trainctl pin" in err


def test_a_base_that_cannot_be_resolved_is_refused(tmp_path: Path) -> None:
    assert _resolve(tmp_path, TAGGED, pull_fails=True)[:2] == (1, "")
    not_listed = _resolve(tmp_path, TAGGED, repo_digests=f"other.example/x@{DIGEST}")
    assert not_listed[:2] == (1, "")
    assert "no digest" in not_listed[2]
    malformed = _resolve(tmp_path, TAGGED, repo_digests=f"{REPOSITORY}@sha256:abc")
    assert malformed[:2] == (1, "")
    assert _resolve(tmp_path, REPOSITORY)[:2] == (1, "")  # neither a tag nor a digest
    assert _resolve(tmp_path, f"{TAGGED}@md5:00")[:2] == (1, "")
    usage = subprocess.run(["sh", str(RESOLVE)], capture_output=True, text=True, timeout=30)
    assert usage.returncode == 2


def test_a_base_pinned_without_a_tag_is_used_as_it_is(tmp_path: Path) -> None:
    code, out, _, calls = _resolve(tmp_path, f"{REPOSITORY}@{DIGEST}")
    assert (code, out, calls) == (0, f"{REPOSITORY}@{DIGEST}", "")


def test_the_dockerfile_refuses_a_base_that_is_not_a_digest() -> None:
    """A build that skips the resolver (a plain `docker build images/nvrx`, the ARG's default tag) stops before it
    installs anything."""
    instructions = _instructions()
    base_from = instructions.index("FROM ${BASE}")
    assert instructions[base_from + 1] == "ARG BASE"
    guard = instructions[base_from + 2]
    assert guard.startswith("RUN ")
    for base, code in ((TAGGED, 1), (f"{REPOSITORY}@{DIGEST}", 0), (f"{TAGGED}@{DIGEST}", 0)):
        done = subprocess.run(
            ["sh", "-c", guard.removeprefix("RUN ")], env={"BASE": base}, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == code, (base, done.stderr)
    assert "resolve_base.sh" in guard
