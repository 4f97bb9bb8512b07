"""The wheels scripts/gpu_smoke.sh needs on the lent GPU machine, which reaches no package index.

    python scripts/gpu_bundle.py build [--dest .gpu-bundle]   download the bundle (on a CPU machine) and its manifest
    python scripts/gpu_bundle.py check [--manifest M]         on the GPU machine, after the install: every carried
                                                              wheel is what Python imports and its requirements hold

The closure is computed offline from the downloaded wheels' own METADATA against the machine's recorded package list
(scripts/gpu_machine_packages.txt): a requirement the machine meets is not carried, one it lacks is downloaded with
--no-deps at the project's pin (constraints.txt) and its requirements followed in turn. Everything sent to the
machine (tracked tree plus bundle) must stay under the lending tool's 64 MiB per run, or `build` fails saying so.
The manifest is written into the bundle and committed as scripts/gpu_bundle_manifest.json, so tests can resolve it
without the wheels.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DEST = ROOT / ".gpu-bundle"
MACHINE_PACKAGES = ROOT / "scripts/gpu_machine_packages.txt"
COMMITTED_MANIFEST = ROOT / "scripts/gpu_bundle_manifest.json"
CONSTRAINTS = ROOT / "constraints.txt"
MANIFEST_NAME = "manifest.json"

# What the smoke imports that the machine lacks, at the project's pins (NVRx: the Makefile's NVRX_PIN, as the NVRx
# job's k8s/nvrx_spec.py; Ray: requirements-dev.txt). Ray's `train` extra is what ray.train needs; `default`
# (dashboard, metrics agent) is not needed by a local ray.init and stays behind.
ROOTS = ("nvidia-resiliency-ext==0.7.0", "ray[train]==2.58.0")


@dataclass(frozen=True)
class LeftBehind:
    """A requirement of a carried wheel that nothing the smoke runs imports."""

    module: str  # the top-level module it provides
    imported_by: tuple[str, ...]  # every module of the wheel that imports it (none: a build-time tool)
    why: str


# Requirements neither carried nor checked on the machine: wheel -> requirement -> why. NVRx 0.7.0 requires its
# optional services' packages unconditionally; the smoke runs ft_launcher, the in-process Wrapper and the async
# checkpointing, which import none of them (ft_launcher starts nvrx-attrsvc only when attribution is configured, and
# then as a process of its own). tests/training/test_gpu_bundle.py checks `imported_by` against the installed NVRx
# and imports what the smoke imports, and runs ft_launcher, with these modules unimportable.
_ATTRSVC = "the attribution service nvrx-attrsvc, which the smoke does not run"
LEFT_BEHIND: dict[str, dict[str, LeftBehind]] = {
    "nvidia-resiliency-ext": {
        "fastapi": LeftBehind("fastapi", ("nvidia_resiliency_ext.services.attrsvc.app",), f"serves {_ATTRSVC}"),
        "uvicorn": LeftBehind("uvicorn", ("nvidia_resiliency_ext.services.attrsvc.app",), f"serves {_ATTRSVC}"),
        "slowapi": LeftBehind("slowapi", ("nvidia_resiliency_ext.services.attrsvc.app",), f"rate-limits {_ATTRSVC}"),
        "pydantic": LeftBehind(
            "pydantic",
            ("nvidia_resiliency_ext.services.attrsvc.app", "nvidia_resiliency_ext.services.attrsvc.config"),
            f"models the requests and settings of {_ATTRSVC} (carried all the same: Ray requires it)",
        ),
        "pydantic-settings": LeftBehind(
            "pydantic_settings", ("nvidia_resiliency_ext.services.attrsvc.config",), f"configures {_ATTRSVC}"
        ),
        "grpcio-tools": LeftBehind(
            "grpc_tools", (), "imported by no module: it compiles NVRx's .proto files when NVRx is built"
        ),
    }
}

# Requirements a carried wheel does not declare but its imports enforce: wheel -> requirement -> why. Carried or
# checked as declared ones are (a machine copy too old gets the fallback).
ADDED_REQUIRES: dict[str, dict[str, str]] = {
    "nvidia-resiliency-ext": {
        "protobuf>=6.31.1": (
            "declared protobuf>=4.22, but its shared_utils/proto/*_pb2.py, which ft_launcher imports, were made by "
            "protoc 6.31.1 and refuse an older protobuf runtime (ValidateProtobufRuntimeVersion)"
        ),
    }
}

# The run tool's limit on what travels per call: tracked and untracked-not-ignored files plus carried paths.
LIMIT_BYTES = 64 * 1024 * 1024

# The machine: Python 3.12.3 (CPython) on x86-64 Linux (scripts/gpu_machine_packages.txt gives the source).
TARGET_PYTHON = "3.12.3"
MARKER_ENV = {
    "python_version": "3.12",
    "python_full_version": TARGET_PYTHON,
    "implementation_name": "cpython",
    "implementation_version": TARGET_PYTHON,
    "platform_python_implementation": "CPython",
    "os_name": "posix",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "platform_release": "",
    "platform_version": "",
}
# pip matches a manylinux_2_N tag only for the N it is given, so every glibc up to the machine's is named.
PLATFORMS = (
    "manylinux1_x86_64",
    "manylinux2010_x86_64",
    "manylinux2014_x86_64",
    *(f"manylinux_2_{n}_x86_64" for n in range(5, 40)),
)

# Paths left out of a wheel the smoke cannot carry whole. Ray 2.58.0's wheel is 78.4 MB, over the limit by itself;
# 32 MB of it is ray/jars/ray_dist.jar, the Java worker. Ray runs without it: ray/_private/services.py (2.58.0)
# starts Java workers only when get_ray_jars_dir() exists and a `java` command is found.
PRUNE: dict[str, tuple[str, ...]] = {"ray": ("ray/jars/",)}


# A requirement with a version bound that the machine meets with a package whose version is not recorded may still
# fail there; for those the bundle holds the project's pin in fallback/, installed only if `check` finds the
# machine's copy too old. Only wheels this small and with no requirements of their own are kept as fallbacks.
FALLBACK_DIR = "fallback"
FALLBACK_MAX_BYTES = 1 << 20


class BundleError(Exception):
    """A bundle that cannot be built or does not hold together; the message says what and what to do."""


# --- what the machine has ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MachinePackages:
    """Canonical name -> version (None: present, version not recorded)."""

    versions: dict[str, Version | None]

    @classmethod
    def read(cls, path: Path = MACHINE_PACKAGES) -> MachinePackages:
        versions: dict[str, Version | None] = {}
        for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            fields = line.split()
            if len(fields) > 2:
                raise BundleError(f"{path}:{number}: {raw!r} is not 'NAME [VERSION]'")
            versions[canonicalize_name(fields[0])] = Version(fields[1]) if len(fields) == 2 else None
        return cls(versions)


# --- wheels ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wheel:
    name: str
    version: Version
    file: str
    size: int
    sha256: str
    requires_python: str | None
    requires_dist: tuple[str, ...]
    pruned: dict[str, Any] | None = None

    @classmethod
    def read(cls, path: Path) -> Wheel:
        name, version, _, _ = parse_wheel_filename(path.name)
        with zipfile.ZipFile(path) as archive:
            metadata_name = next(
                (n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None
            )
            if metadata_name is None:
                raise BundleError(f"{path.name} has no .dist-info/METADATA: not a wheel")
            headers = HeaderParser().parsestr(archive.read(metadata_name).decode("utf-8"))
        return cls(
            name=str(name),
            version=version,
            file=path.name,
            size=path.stat().st_size,
            sha256=sha256_of(path),
            requires_python=headers.get("Requires-Python"),
            requires_dist=tuple(headers.get_all("Requires-Dist") or ()),
        )

    @classmethod
    def from_manifest(cls, entry: dict[str, Any]) -> Wheel:
        return cls(
            name=entry["name"],
            version=Version(entry["version"]),
            file=entry["file"],
            size=entry["size"],
            sha256=entry["sha256"],
            requires_python=entry["requires_python"],
            requires_dist=tuple(entry["requires_dist"]),
            pruned=entry.get("pruned"),
        )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheels_in(directory: Path) -> dict[str, Wheel]:
    found: dict[str, Wheel] = {}
    for path in sorted(directory.glob("*.whl")):
        wheel = Wheel.read(path)
        if wheel.name in found:
            raise BundleError(
                f"{directory} holds two versions of {wheel.name} ({found[wheel.name].file}, {wheel.file}); "
                "pip install --no-deps would install both: delete one"
            )
        found[wheel.name] = wheel
    return found


# --- resolution --------------------------------------------------------------------------------------------------


@dataclass
class Resolution:
    """The roots' closure: what is carried, what the machine provides, what neither has."""

    carried: dict[str, set[str]] = field(default_factory=dict)  # name -> extras asked of it
    left_behind: dict[str, set[str]] = field(default_factory=dict)  # name -> its requirements LEFT_BEHIND
    required_by: dict[str, set[str]] = field(default_factory=dict)
    on_machine: dict[str, list[str]] = field(default_factory=dict)  # name -> the requirements it must meet
    missing: dict[str, list[str]] = field(default_factory=dict)  # name -> why (unmet requirements)

    @property
    def complete(self) -> bool:
        return not self.missing


def applies(requirement: Requirement, extras: Iterable[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**MARKER_ENV, "extra": extra}) for extra in ("", *extras))


def resolve(
    roots: Sequence[str],
    machine: MachinePackages,
    wheels: dict[str, Wheel],
    *,
    left_behind: dict[str, dict[str, LeftBehind]] = LEFT_BEHIND,
    added: dict[str, dict[str, str]] = ADDED_REQUIRES,
) -> Resolution:
    """Follow the roots' Requires-Dist (less `left_behind`, plus `added`) through the wheels at hand; a requirement
    is met by a carried wheel first (it shadows the machine's copy on PYTHONPATH), else by the machine's package
    (its version checked where one is recorded), else it is missing."""
    result = Resolution()
    queue = [(Requirement(root), "the smoke") for root in roots]
    while queue:
        requirement, requirer = queue.pop(0)
        name = canonicalize_name(requirement.name)
        result.required_by.setdefault(name, set()).add(requirer)
        spec = f"{requirement} (by {requirer})"
        wheel = wheels.get(name)
        if wheel is not None:
            if not requirement.specifier.contains(wheel.version, prereleases=True):
                result.missing.setdefault(name, []).append(f"{spec}, but the bundle has {wheel.version}")
                continue
            if wheel.requires_python and not _python_ok(wheel.requires_python):
                result.missing.setdefault(name, []).append(
                    f"{wheel.file} needs Python {wheel.requires_python}, the machine has {TARGET_PYTHON}"
                )
                continue
            followed = result.carried.get(name)
            if followed is None or not set(requirement.extras) <= followed:
                extras = (followed or set()) | set(requirement.extras)
                result.carried[name] = extras
                skipped = left_behind.get(name, {})
                lines = [*wheel.requires_dist, *added.get(name, {})]
                for dep in map(Requirement, lines):
                    if canonicalize_name(dep.name) in skipped:
                        result.left_behind.setdefault(name, set()).add(canonicalize_name(dep.name))
                    elif applies(dep, extras):
                        queue.append((dep, wheel.name))
            continue
        if name in machine.versions:
            version = machine.versions[name]
            if version is not None and not requirement.specifier.contains(version, prereleases=True):
                result.missing.setdefault(name, []).append(f"{spec}, but the machine has {version}")
            else:
                result.on_machine.setdefault(name, []).append(spec)
            continue
        result.missing.setdefault(name, []).append(f"{spec}: not on the machine and not in the bundle")
    # A requirement first met by the machine and later carried (another version was needed) is carried.
    for carried in result.carried:
        result.on_machine.pop(carried, None)
    return result


def _python_ok(requires_python: str) -> bool:
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(requires_python).contains(TARGET_PYTHON, prereleases=True)


# --- building ----------------------------------------------------------------------------------------------------


def read_pins(path: Path = CONSTRAINTS) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonicalize_name(name.split("[", 1)[0])] = Version(version.strip())
    return pins


def pip_download_argv(dest: Path, specs: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    return [
        *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"),
        *("--python-version", MARKER_ENV["python_version"], "--implementation", "cp", "--abi", "cp312"),
        *platforms,
        *extra,
        *("--dest", str(dest)),
        *specs,
    ]


Downloader = Callable[[Path, Sequence[str]], None]


def pip_downloader(extra: Sequence[str] = ()) -> Downloader:
    def download(dest: Path, specs: Sequence[str]) -> None:
        done = subprocess.run(pip_download_argv(dest, specs, extra), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BundleError(f"pip download {' '.join(specs)} failed:\n{done.stderr.strip()[-3000:]}")

    return download


def download_specs(resolution: Resolution, pins: dict[str, Version]) -> list[str]:
    """name==pin for each missing package the project pins and whose pin meets every requirement on it."""
    specs = []
    for name, reasons in sorted(resolution.missing.items()):
        pin = pins.get(name)
        if pin is None:
            raise BundleError(
                f"{name} is needed ({'; '.join(reasons)}) but constraints.txt pins no version of it: pin one there"
            )
        specs.append(f"{name}=={pin}")
    return specs


def prune_wheel(path: Path, prefixes: Sequence[str]) -> dict[str, Any]:
    """Rewrite the wheel without the entries under `prefixes`, its RECORD to match; returns what was removed."""
    source_size, source_sha256 = path.stat().st_size, sha256_of(path)
    removed = 0
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w") as out:
        for info in src.infolist():
            if info.filename.startswith(tuple(prefixes)):
                removed += 1
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                rows = [
                    row
                    for row in csv.reader(io.StringIO(data.decode()))
                    if row and not row[0].startswith(tuple(prefixes))
                ]
                buffer = io.StringIO()
                csv.writer(buffer, lineterminator="\n").writerows(rows)
                data = buffer.getvalue().encode()
            # The original entry's attributes (the executable bits pip restores, the compression) are kept.
            out.writestr(info, data, compress_type=info.compress_type, compresslevel=9)
    if removed == 0:
        tmp.unlink()
        raise BundleError(f"{path.name} has nothing under {', '.join(prefixes)}: the prune rule is stale")
    os.replace(tmp, path)
    return {"paths": list(prefixes), "files": removed, "source_size": source_size, "source_sha256": source_sha256}


def tree_bytes(root: Path = ROOT) -> int:
    """What the run tool sends besides carried paths: tracked files and untracked files git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    total = 0
    for name in {n for n in listed if n}:
        path = root / os.fsdecode(name)
        if path.is_symlink() or path.is_file():
            total += path.lstat().st_size
    return total


def mib(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB"


def check_size(bundle: int, tree: int, limit: int = LIMIT_BYTES) -> str:
    summary = f"bundle {mib(bundle)} + tree {mib(tree)} = {mib(bundle + tree)} of the {mib(limit)} a run may carry"
    if bundle + tree > limit:
        raise BundleError(
            f"{summary}: over by {mib(bundle + tree - limit)}. Carry less: split the bundle over two runs "
            "(one for NVRx, one for Ray) or prune more from the largest wheel (PRUNE in scripts/gpu_bundle.py)"
        )
    return summary


def manifest(
    roots: Sequence[str],
    resolution: Resolution,
    wheels: dict[str, Wheel],
    machine: Path,
    left_behind: dict[str, dict[str, LeftBehind]] = LEFT_BEHIND,
    added: dict[str, dict[str, str]] = ADDED_REQUIRES,
) -> dict[str, Any]:
    carried = [wheels[name] for name in sorted(resolution.carried)]
    for wheel in carried:
        stale = set(left_behind.get(wheel.name, {})) - resolution.left_behind.get(wheel.name, set())
        if stale:
            raise BundleError(f"{wheel.file} no longer requires {', '.join(sorted(stale))}: drop it from LEFT_BEHIND")
    return {
        "roots": list(roots),
        "target": {"python": TARGET_PYTHON, "platforms": list(PLATFORMS)},
        "machine_packages": machine.relative_to(ROOT).as_posix() if machine.is_relative_to(ROOT) else str(machine),
        "wheels": [
            {
                "name": w.name,
                "version": str(w.version),
                "extras": sorted(resolution.carried[w.name]),
                "file": w.file,
                "size": w.size,
                "sha256": w.sha256,
                "requires_python": w.requires_python,
                "requires_dist": list(w.requires_dist),
                "left_behind": {req: left.why for req, left in left_behind.get(w.name, {}).items()},
                "added_requires": list(added.get(w.name, {})),
                "required_by": sorted(resolution.required_by[w.name]),
                "pruned": w.pruned,
            }
            for w in carried
        ],
        "on_machine": {name: reqs for name, reqs in sorted(resolution.on_machine.items())},
        "total_bytes": sum(w.size for w in carried),
    }


def bounded_unrecorded(resolution: Resolution, machine: MachinePackages) -> dict[str, list[str]]:
    """Requirements with a version bound met by a machine package whose version is not recorded."""
    return {
        name: specs
        for name, specs in resolution.on_machine.items()
        if machine.versions.get(name) is None and any(Requirement(s.split(" (by ")[0]).specifier for s in specs)
    }


def fallbacks(
    directory: Path, resolution: Resolution, machine: MachinePackages, pins: dict[str, Version], download: Downloader
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """(the fallback wheels kept, the bounded requirements left to the machine with why)."""
    wanted = bounded_unrecorded(resolution, machine)
    directory.mkdir(parents=True, exist_ok=True)
    unverified: dict[str, str] = {}
    specs = []
    for name, reqs in sorted(wanted.items()):
        pin = pins.get(name)
        if pin is None or not all(Requirement(r.split(" (by ")[0]).specifier.contains(pin, True) for r in reqs):
            unverified[name] = f"checked on the machine only: no pin in constraints.txt meets {'; '.join(reqs)}"
        else:
            specs.append(f"{name}=={pin}")
    if specs:
        download(directory, specs)
    kept = []
    for name, wheel in wheels_in(directory).items():
        own = [r for r in wheel.requires_dist if applies(Requirement(r), ())]
        if wheel.size > FALLBACK_MAX_BYTES or own:
            why = f"{mib(wheel.size)}" if wheel.size > FALLBACK_MAX_BYTES else f"requires {', '.join(own)}"
            unverified[name] = f"checked on the machine only: its fallback {wheel.file} was not kept ({why})"
            (directory / wheel.file).unlink()
            continue
        entry = {"name": name, "version": str(wheel.version), "file": f"{FALLBACK_DIR}/{wheel.file}"}
        kept.append({**entry, "size": wheel.size, "sha256": wheel.sha256, "for": wanted[name]})
    return sorted(kept, key=lambda f: f["name"]), dict(sorted(unverified.items()))


def build(
    dest: Path,
    *,
    download: Downloader,
    roots: Sequence[str] = ROOTS,
    machine_file: Path = MACHINE_PACKAGES,
    pins: dict[str, Version] | None = None,
    prune: dict[str, tuple[str, ...]] = PRUNE,
    tree: int | None = None,
    limit: int = LIMIT_BYTES,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    machine = MachinePackages.read(machine_file)
    pins = read_pins() if pins is None else pins
    dest.mkdir(parents=True, exist_ok=True)
    for stale in [*dest.glob("*.whl"), *dest.glob("*.tmp"), *dest.glob(f"{FALLBACK_DIR}/*.whl")]:
        stale.unlink()
    download(dest, list(roots))
    for _ in range(50):
        resolution = resolve(roots, machine, wheels_in(dest))
        if resolution.complete:
            break
        specs = download_specs(resolution, pins)
        log(f"downloading {' '.join(specs)}")
        download(dest, specs)
    else:
        raise BundleError("the closure did not settle in 50 rounds")
    wheels = wheels_in(dest)
    for name, prefixes in prune.items():
        if name in wheels:
            pruned = prune_wheel(dest / wheels[name].file, prefixes)
            log(f"pruned {wheels[name].file}: {pruned['files']} files under {', '.join(prefixes)}")
            wheels[name] = replace(Wheel.read(dest / wheels[name].file), pruned=pruned)
    result = manifest(roots, resolution, wheels, machine_file)
    result["fallback"], result["unverified"] = fallbacks(dest / FALLBACK_DIR, resolution, machine, pins, download)
    result["total_bytes"] += sum(f["size"] for f in result["fallback"])
    (dest / MANIFEST_NAME).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    log(check_size(result["total_bytes"], tree_bytes() if tree is None else tree, limit))
    return result


# --- checking on the machine -------------------------------------------------------------------------------------


def check_installed(entries: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Problems with the running Python's view of the carried wheels, as (package at fault, message): each must be
    the version carried, and each requirement it has (with the extras asked of it; less those left behind, plus those
    added: the manifest names them) met by what that Python imports."""
    from importlib import metadata

    problems = []
    for entry in entries:
        try:
            seen = metadata.version(entry["name"])
        except metadata.PackageNotFoundError:
            problems.append(
                (entry["name"], f"{entry['name']} {entry['version']} is carried but not importable (install it)")
            )
            continue
        if Version(seen) != Version(entry["version"]):
            problems.append(
                (entry["name"], f"{entry['name']}: Python sees {seen}, the bundle carries {entry['version']}")
            )
        left_behind = entry.get("left_behind", {})
        for line in [*entry["requires_dist"], *entry.get("added_requires", [])]:
            requirement = Requirement(line)
            name = canonicalize_name(requirement.name)
            if name in left_behind or not applies(requirement, entry["extras"]):
                continue
            try:
                have = metadata.version(requirement.name)
            except metadata.PackageNotFoundError:
                problems.append((name, f"{entry['name']} needs {requirement}: not installed"))
                continue
            if not requirement.specifier.contains(have, prereleases=True):
                problems.append((name, f"{entry['name']} needs {requirement}: {requirement.name} {have} is installed"))
    return problems


def check(manifest_path: Path, site: Path | None, log: Callable[[str], None] = print) -> list[str]:
    """check_installed; where a problem is a machine package too old and the bundle holds its fallback, the fallback
    is installed into `site` (pip --no-index --no-deps --target) and the check repeated."""
    import importlib

    document = json.loads(manifest_path.read_text(encoding="utf-8"))
    entries, spare = document["wheels"], {f["name"]: f for f in document.get("fallback", [])}
    problems = check_installed(entries)
    needed = sorted({name for name, _ in problems if name in spare})
    if needed and site is not None:
        for name, message in problems:
            if name in spare:
                log(f"gpu_bundle check: {message}: installing the fallback {spare[name]['file']}")
        files = [str(manifest_path.parent / spare[name]["file"]) for name in needed]
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
             "--upgrade", "--target", str(site), *files],
            check=True,
        )  # fmt: skip
        if str(site) not in sys.path:
            sys.path.insert(0, str(site))
        importlib.invalidate_caches()
        problems = check_installed(entries)
    return [message for _, message in problems]


def verify_bundle(directory: Path, expected: dict[str, Any]) -> list[str]:
    """Differences between the wheels in `directory` and a manifest (files, sizes, sha256)."""
    problems = []
    present = {
        p.relative_to(directory).as_posix()
        for p in [*directory.glob("*.whl"), *directory.glob(f"{FALLBACK_DIR}/*.whl")]
    }
    for entry in [*expected["wheels"], *expected.get("fallback", [])]:
        path = directory / entry["file"]
        if entry["file"] not in present:
            problems.append(f"{entry['file']} is missing from {directory}")
        elif (path.stat().st_size, sha256_of(path)) != (entry["size"], entry["sha256"]):
            problems.append(f"{entry['file']} differs from the manifest (size or sha256)")
    for extra in sorted(present - {e["file"] for e in [*expected["wheels"], *expected.get("fallback", [])]}):
        problems.append(f"{extra} is in {directory} but not in the manifest")
    return problems


# --- command line ------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/gpu_bundle.py", description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build", help="download the bundle and write its manifest (needs the package index)")
    build_cmd.add_argument("--dest", type=Path, default=DEFAULT_DEST, help="git-ignored folder for the wheels")
    build_cmd.add_argument(
        "--no-commit-manifest", action="store_true", help=f"do not copy the manifest to {COMMITTED_MANIFEST.name}"
    )
    check_cmd = sub.add_parser("check", help="on the GPU machine: the carried wheels as the running Python sees them")
    check_cmd.add_argument("--manifest", type=Path, default=DEFAULT_DEST / MANIFEST_NAME)
    check_cmd.add_argument("--site", type=Path, default=None, help="the --target folder: fallbacks go there if needed")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            result = build(args.dest, download=pip_downloader())
            if not args.no_commit_manifest:
                shutil.copyfile(args.dest / MANIFEST_NAME, COMMITTED_MANIFEST)
            print(f"{len(result['wheels'])} wheels in {args.dest}: {', '.join(w['file'] for w in result['wheels'])}")
            return 0
        problems = check(args.manifest, args.site)
        for problem in problems:
            print(f"gpu_bundle check: {problem}", file=sys.stderr)
        if problems:
            return 2
        print("gpu_bundle check: every carried wheel importable at its version, their requirements met")
        return 0
    except (BundleError, OSError, subprocess.CalledProcessError) as exc:
        print(f"gpu_bundle: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
