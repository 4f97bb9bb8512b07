"""scripts/gpu_bundle.py: the wheels the GPU smoke carries to a machine that reaches no package index.

Nothing here downloads. The build logic runs real `pip download` / `pip install` against small wheels made in the
test (--no-index --find-links); the smoke's own closure is resolved from the committed manifest (each wheel's
Requires-Dist as recorded from its METADATA) against the machine's recorded package list; the real bundle, when
`make gpu-bundle` has left one in .gpu-bundle/, is checked file by file against that manifest (skipped otherwise).
"""

from __future__ import annotations

import ast
import csv
import importlib.util
import io
import json
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import ROOT


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_bundle", ROOT / "scripts/gpu_bundle.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_bundle"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


gb = _load()
REAL_BUNDLE = ROOT / ".gpu-bundle"
COMMITTED: dict[str, Any] = json.loads(gb.COMMITTED_MANIFEST.read_text())


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    requires: tuple[str, ...] = (),
    files: dict[str, bytes] | None = None,
    *,
    tag: str = "py3-none-any",
    executables: tuple[str, ...] = (),
) -> Path:
    """A wheel (pure Python unless `tag` says otherwise) with METADATA, WHEEL and a RECORD that lists every file;
    the members named in `executables` carry mode 755, as a binary such as Ray's raylet does."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = directory / f"{dist}-{tag}.whl"
    metadata_text = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nRequires-Python: >=3.10\n"
    metadata_text += "".join(f"Requires-Dist: {r}\n" for r in requires)
    purelib = "true" if tag == "py3-none-any" else "false"
    wheel_text = f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: {purelib}\nTag: {tag}\n"
    contents = {
        f"{name.replace('-', '_')}/__init__.py": b"",
        **(files or {}),
        f"{dist}.dist-info/METADATA": metadata_text.encode(),
        f"{dist}.dist-info/WHEEL": wheel_text.encode(),
    }
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for member in contents:
        writer.writerow([member, "", ""])
    writer.writerow([f"{dist}.dist-info/RECORD", "", ""])
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, data in contents.items():
            if member in executables:
                info = zipfile.ZipInfo(member)
                info.external_attr = 0o100755 << 16
                archive.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            else:
                archive.writestr(member, data)
        archive.writestr(f"{dist}.dist-info/RECORD", record.getvalue())
    return path


@pytest.fixture
def index(tmp_path: Path) -> Path:
    """A local wheel folder: a root with an extra, a pinned dependency (a newer one beside it), a leaf, wheels
    for other Pythons and platforms that must not be followed, and a requirement the machine meets."""
    src = tmp_path / "index"
    src.mkdir()
    make_wheel(
        src,
        "smokefake-root",
        "1.0",
        (
            "smokefake-dep>=2",
            'smokefake-extra; extra == "x"',
            'smokefake-unasked; extra == "y"',
            'smokefake-old; python_version < "3.10"',
            'smokefake-win; sys_platform == "win32"',
            "torch>=2.3.0",
            "smokefake-bounded>=2",
        ),
        {"smokefake_root/jars/big.bin": b"\0" * 50_000, "smokefake_root/core.py": b"X = 1\n"},
    )
    make_wheel(src, "smokefake-dep", "2.1", ("smokefake-leaf",))
    make_wheel(src, "smokefake-dep", "3.0", ("smokefake-leaf",))
    make_wheel(src, "smokefake-leaf", "1.0")
    make_wheel(src, "smokefake-extra", "1.0", ("numpy",))
    make_wheel(src, "smokefake-bounded", "2.5")
    return src


@pytest.fixture
def machine(tmp_path: Path) -> Path:
    path = tmp_path / "machine.txt"
    path.write_text("# recorded\ntorch 2.11.0+cu130\nnumpy\nsmokefake-bounded\n")
    return path


PINS = {
    "smokefake-dep": Version("2.1"),
    "smokefake-leaf": Version("1.0"),
    "smokefake-extra": Version("1.0"),
    "smokefake-bounded": Version("2.5"),
}


def build_local(dest: Path, index: Path, machine: Path, **kwargs: Any) -> dict[str, Any]:
    result: dict[str, Any] = gb.build(
        dest,
        download=gb.pip_downloader(["--no-index", "--find-links", str(index)]),
        roots=("smokefake-root[x]==1.0",),
        machine_file=machine,
        pins=PINS,
        prune=kwargs.pop("prune", {}),
        tree=kwargs.pop("tree", 1000),
        log=lambda _: None,
        **kwargs,
    )
    return result


@pytest.mark.slow
def test_build_follows_the_metadata_offline_and_carries_only_what_the_machine_lacks(
    tmp_path: Path, index: Path, machine: Path
) -> None:
    dest = tmp_path / "bundle"
    result = build_local(dest, index, machine)
    carried = {(w["name"], w["version"]) for w in result["wheels"]}
    # The pin (2.1), not the newest (3.0); extra x followed, extra y and the other platforms' lines not.
    assert carried == {
        ("smokefake-root", "1.0"),
        ("smokefake-dep", "2.1"),
        ("smokefake-leaf", "1.0"),
        ("smokefake-extra", "1.0"),
    }
    assert sorted(p.name for p in dest.glob("*.whl")) == sorted(w["file"] for w in result["wheels"])
    assert set(result["on_machine"]) == {"torch", "numpy", "smokefake-bounded"}
    # smokefake-bounded>=2 is met by a machine package of unrecorded version: its pin waits in fallback/.
    assert [(f["name"], f["version"], f["file"]) for f in result["fallback"]] == [
        ("smokefake-bounded", "2.5", "fallback/smokefake_bounded-2.5-py3-none-any.whl")
    ]
    assert result["unverified"] == {}
    by_name = {w["name"]: w for w in result["wheels"]}
    assert by_name["smokefake-leaf"]["required_by"] == ["smokefake-dep"]
    assert by_name["smokefake-root"]["extras"] == ["x"]
    assert result["total_bytes"] == sum(p.stat().st_size for p in dest.glob("**/*.whl"))
    assert json.loads((dest / gb.MANIFEST_NAME).read_text()) == result
    assert gb.verify_bundle(dest, result) == []


def test_a_machine_version_that_misses_a_requirement_is_reported(tmp_path: Path, index: Path) -> None:
    old = tmp_path / "old.txt"
    old.write_text("torch 2.1.0\nnumpy\nsmokefake-bounded\n")
    # constraints pin no torch: the build stops and names the requirement and the machine's version.
    with pytest.raises(gb.BundleError, match=r"torch>=2.3.0 \(by smokefake-root\), but the machine has 2.1.0"):
        build_local(tmp_path / "bundle", index, old)


@pytest.mark.slow
def test_pruned_wheels_keep_a_matching_record_and_install_with_pip_target(
    tmp_path: Path, index: Path, machine: Path
) -> None:
    dest = tmp_path / "bundle"
    original = (index / "smokefake_root-1.0-py3-none-any.whl").read_bytes()
    result = build_local(dest, index, machine, prune={"smokefake-root": ("smokefake_root/jars/",)})
    root = next(w for w in result["wheels"] if w["name"] == "smokefake-root")
    assert root["pruned"]["files"] == 1
    assert root["pruned"]["source_size"] == len(original)
    assert root["size"] < len(original) - 100  # 50 kB of zeros left out
    with zipfile.ZipFile(dest / root["file"]) as archive:
        names = archive.namelist()
        record = archive.read("smokefake_root-1.0.dist-info/RECORD").decode()
    assert "smokefake_root/jars/big.bin" not in names
    assert "jars" not in record
    assert "smokefake_root/core.py" in record
    target = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target", str(target),
         *map(str, sorted(dest.glob("*.whl")))],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (target / "smokefake_root/core.py").exists()
    assert not (target / "smokefake_root/jars").exists()


@pytest.mark.slow
def test_a_bundle_over_the_limit_fails_saying_by_how_much(tmp_path: Path, index: Path, machine: Path) -> None:
    with pytest.raises(gb.BundleError, match=r"of the 0\.0 MiB a run may carry: over by .* MiB\. Carry less"):
        build_local(tmp_path / "bundle", index, machine, limit=2000)


# --- the real smoke's bundle ------------------------------------------------------------------------------------


def committed_wheels() -> dict[str, Any]:
    return {w["name"]: gb.Wheel.from_manifest(w) for w in COMMITTED["wheels"]}


def test_the_committed_manifest_is_exactly_the_closure_of_the_smokes_roots() -> None:
    machine = gb.MachinePackages.read()
    resolution = gb.resolve(gb.ROOTS, machine, committed_wheels())
    assert resolution.missing == {}
    assert set(resolution.carried) == {w["name"] for w in COMMITTED["wheels"]}  # nothing carried needlessly
    assert not set(resolution.carried) & set(machine.versions)  # the machine lacks every carried package
    assert COMMITTED["roots"] == list(gb.ROOTS)


def test_the_roots_are_the_projects_pins() -> None:
    # NVRx: the Makefile's NVRX_PIN (installed by NVRX_INSTALL, not from requirements-dev.txt) and the NVRx job's.
    from k8s.nvrx_spec import NvrxFsdpJob

    nvrx = next(root for root in gb.ROOTS if root.startswith("nvidia-resiliency-ext=="))
    assert f"NVRX_PIN := {nvrx}" in (ROOT / "Makefile").read_text().splitlines()
    assert nvrx in NvrxFsdpJob().pip
    requirements = (ROOT / "requirements-dev.txt").read_text()
    assert any(line.startswith("ray[") and line.endswith("]==2.58.0") for line in requirements.splitlines())
    # Every carried wheel at the lock's pin; NVRx, which constraints.txt no longer pins, at the Makefile's.
    pins = {**gb.read_pins(), "nvidia-resiliency-ext": Version(nvrx.split("==")[1])}
    for wheel in COMMITTED["wheels"]:
        assert pins[wheel["name"]] == Version(wheel["version"]), wheel["name"]


def test_the_recorded_machine_list_has_the_documented_python_packages() -> None:
    machine = gb.MachinePackages.read()
    assert machine.versions["torch"] == Version("2.11.0+cu130")
    assert machine.versions["transformers"] == Version("5.17.0")
    for name in ("tokenizers", "safetensors", "numpy", "pyyaml", "accelerate", "packaging"):
        assert name in machine.versions
    assert "ray" not in machine.versions
    assert "nvidia-resiliency-ext" not in machine.versions


def test_bundle_and_tree_fit_in_one_run() -> None:
    summary = gb.check_size(COMMITTED["total_bytes"], gb.tree_bytes())
    assert "of the 64.0 MiB a run may carry" in summary
    assert COMMITTED["total_bytes"] == sum(w["size"] for w in [*COMMITTED["wheels"], *COMMITTED["fallback"]])


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def smoke_third_party_imports() -> set[str]:
    """Top-level third-party modules imported by what the smoke runs, following the project's own modules."""
    entry = ["training/nvrx_fsdp.py", "training/ray_finetune.py", "training/fabric_probe.py", "tests/training/tiny.py",
             "scripts/gpu_bundle.py", "scripts/gpu_smoke_report.py"]  # fmt: skip
    seen: set[Path] = set()
    pending = [ROOT / p for p in entry]
    third_party = {"nvidia_resiliency_ext", "torch"}  # run as modules by the script: the launcher, torchrun
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports(path):
            top = name.split(".")[0]
            local = ROOT / (name.replace(".", "/") + ".py")
            package = ROOT / name.replace(".", "/") / "__init__.py"
            if local.exists() or package.exists():
                pending.append(local if local.exists() else package)
            elif (ROOT / top).is_dir():
                continue  # a project package's __init__ with nothing more to follow
            elif top not in sys.stdlib_module_names:
                third_party.add(top)
    return third_party


def test_every_third_party_import_of_the_smoke_is_on_the_machine_or_carried() -> None:
    distributions = metadata.packages_distributions()
    machine = gb.MachinePackages.read()
    carried = {w["name"] for w in COMMITTED["wheels"]}
    unmet = {}
    for module in sorted(smoke_third_party_imports()):
        names = {canonicalize_name(d) for d in distributions.get(module, [])}
        assert names, f"no installed distribution provides {module}"
        if not names & (carried | set(machine.versions)):
            unmet[module] = names
    assert unmet == {}
    assert {"ray", "nvidia_resiliency_ext", "transformers", "safetensors"} <= smoke_third_party_imports()


def test_check_accepts_this_environment_and_names_what_is_missing(tmp_path: Path) -> None:
    # This virtualenv is the project's lock, which the bundle's pins come from: the committed manifest's wheels
    # and their requirements are all met here.
    assert gb.check_installed(COMMITTED["wheels"]) == []
    broken = {"wheels": [*COMMITTED["wheels"][:1], {**COMMITTED["wheels"][0], "name": "smokefake-absent"}]}
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(broken))
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/gpu_bundle.py"), "check", "--manifest", str(manifest)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    version = COMMITTED["wheels"][0]["version"]
    assert f"smokefake-absent {version} is carried but not importable" in done.stderr


MACHINE_ABI = "cp" + gb.MARKER_ENV["python_version"].replace(".", "")


def check_bundle_for_the_machine(
    bundle: Path, expected: dict[str, Any], roots: tuple[str, ...], machine: Any, site: Path, executable: str
) -> None:
    """A built bundle as the machine needs it: the wheels its manifest lists, byte for byte; the roots' closure
    complete with the machine's packages; each pruned wheel an intact zip without the pruned paths; every wheel
    installed by pip for the machine's Python and platforms, `executable` (in `site`) still executable."""
    assert gb.verify_bundle(bundle, expected) == []
    wheels = gb.wheels_in(bundle)
    assert gb.resolve(roots, machine, wheels).missing == {}
    pruned = [w for w in expected["wheels"] if w["pruned"]]
    assert pruned
    for entry in pruned:
        with zipfile.ZipFile(bundle / entry["file"]) as archive:
            assert archive.testzip() is None
            assert not [n for n in archive.namelist() if n.startswith(tuple(entry["pruned"]["paths"]))]
    platforms = [arg for p in gb.PLATFORMS for arg in ("--platform", p)]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
         "--only-binary=:all:", "--python-version", gb.MARKER_ENV["python_version"], "--implementation", "cp",
         "--abi", MACHINE_ABI, *platforms, "--target", str(site), *map(str, sorted(bundle.glob("*.whl")))],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (site / executable).stat().st_mode & 0o111, f"{executable} lost its executable bits"


@pytest.mark.slow
def test_a_small_bundle_built_here_is_checked_as_the_real_one_is(tmp_path: Path) -> None:
    """The real bundle's checks (next test) on a small bundle built here from local wheels, so they run without
    .gpu-bundle: a root built for the machine's Python and platform (and one for another Python, which must stay
    behind), pruned as Ray's wheel is, holding an executable as Ray's holds raylet."""
    src = tmp_path / "index"
    src.mkdir()
    files = {"smokefake_root/jars/big.bin": b"\0" * 50_000, "smokefake_root/bin/raylet": b"#!/bin/sh\n"}
    # The other Python is this one where it is not the machine's: pip without the machine's flags would take it.
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    other = here if here != MACHINE_ABI else "cp311"
    kept = f"{MACHINE_ABI}-{MACHINE_ABI}-manylinux_2_17_x86_64"
    for tag in (kept, f"{other}-{other}-manylinux_2_17_x86_64"):
        executables = ("smokefake_root/bin/raylet",)
        make_wheel(src, "smokefake-root", "1.0", ("smokefake-leaf",), files, tag=tag, executables=executables)
    make_wheel(src, "smokefake-leaf", "1.0")
    machine = tmp_path / "machine.txt"
    machine.write_text("# recorded\n")
    roots = ("smokefake-root==1.0",)
    dest = tmp_path / "bundle"
    result = gb.build(
        dest,
        download=gb.pip_downloader(["--no-index", "--find-links", str(src)]),
        roots=roots,
        machine_file=machine,
        pins={"smokefake-leaf": Version("1.0")},
        prune={"smokefake-root": ("smokefake_root/jars/",)},
        tree=1000,
        log=lambda _: None,
    )
    assert sorted(w["file"] for w in result["wheels"]) == [
        "smokefake_leaf-1.0-py3-none-any.whl",
        f"smokefake_root-1.0-{kept}.whl",
    ]
    check_bundle_for_the_machine(
        dest, result, roots, gb.MachinePackages.read(machine), tmp_path / "site", "smokefake_root/bin/raylet"
    )


@pytest.mark.gpu_bundle
def test_the_real_bundle_is_the_committed_manifest_and_installs_for_the_machine(tmp_path: Path) -> None:
    assert (REAL_BUNDLE / gb.MANIFEST_NAME).exists(), "no .gpu-bundle/: make gpu-bundle downloads it, then runs this"
    site = tmp_path / "site"
    check_bundle_for_the_machine(
        REAL_BUNDLE, COMMITTED, gb.ROOTS, gb.MachinePackages.read(), site, "ray/core/src/ray/raylet/raylet"
    )


def test_the_committed_manifest_records_each_prune_rule() -> None:
    """What the real bundle's check relies on to know which wheels were pruned (Ray's of ray/jars/)."""
    pruned = {w["name"]: w["pruned"]["paths"] for w in COMMITTED["wheels"] if w["pruned"]}
    assert pruned == {name: list(paths) for name, paths in gb.PRUNE.items()}


@pytest.mark.slow
def test_check_installs_a_fallback_only_where_the_machines_copy_is_too_old(tmp_path: Path, index: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    # What "the machine" has here: smokefake-bounded 1.0 (too old for the carried root's >=2) on a site folder.
    make_wheel(src, "smokefake-bounded", "1.0")
    make_wheel(src, "smokefake-carried", "1.0", ("smokefake-bounded>=2", "smokefake-leaf"))
    make_wheel(src, "smokefake-leaf", "1.0")
    machine_site, bundle_site = tmp_path / "machine-site", tmp_path / "site"
    for target, wheels in (
        (machine_site, ["smokefake_bounded-1.0", "smokefake_leaf-1.0"]),
        (bundle_site, ["smokefake_carried-1.0"]),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target", str(target),
             *(str(src / f"{w}-py3-none-any.whl") for w in wheels)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    bundle = tmp_path / "bundle"
    (bundle / "fallback").mkdir(parents=True)
    spare = index / "smokefake_bounded-2.5-py3-none-any.whl"
    (bundle / "fallback" / spare.name).write_bytes(spare.read_bytes())
    carried = gb.Wheel.read(src / "smokefake_carried-1.0-py3-none-any.whl")
    entry = {"name": carried.name, "version": "1.0", "extras": [], "requires_dist": list(carried.requires_dist)}
    (bundle / "manifest.json").write_text(
        json.dumps({"wheels": [entry], "fallback": [{"name": "smokefake-bounded", "file": f"fallback/{spare.name}"}]})
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{bundle_site}:{machine_site}:{ROOT}"}
    argv = [sys.executable, str(ROOT / "scripts/gpu_bundle.py"), "check", "--manifest", str(bundle / "manifest.json")]
    without = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert without.returncode == 2
    assert "smokefake-carried needs smokefake-bounded>=2: smokefake-bounded 1.0 is installed" in without.stderr
    healed = subprocess.run([*argv, "--site", str(bundle_site)], env=env, capture_output=True, text=True, timeout=120)
    assert healed.returncode == 0, healed.stderr
    assert f"installing the fallback fallback/{spare.name}" in healed.stdout
    assert (bundle_site / "smokefake_bounded-2.5.dist-info").is_dir()
    assert not (bundle_site / "smokefake_leaf-1.0.dist-info").exists()  # only what was too old


def test_the_committed_fallbacks_cover_the_bounded_requirements_of_unrecorded_versions() -> None:
    machine = gb.MachinePackages.read()
    resolution = gb.resolve(gb.ROOTS, machine, committed_wheels())
    bounded = gb.bounded_unrecorded(resolution, machine)
    assert bounded  # Ray and NVRx bound packages the record gives no version of
    assert {f["name"] for f in COMMITTED["fallback"]} | set(COMMITTED["unverified"]) == set(bounded)
    assert all(f["size"] <= gb.FALLBACK_MAX_BYTES for f in COMMITTED["fallback"])


# --- requirements the smoke never imports, and one its imports add ---------------------------------------------


def test_a_requirement_left_behind_is_neither_carried_nor_checked_and_an_added_one_is() -> None:
    def wheel(name: str, requires: tuple[str, ...]) -> Any:
        return gb.Wheel(name, Version("1.0"), f"{name}-1.0-py3-none-any.whl", 1, "0", None, requires)

    wheels = {
        "smokefake-root": wheel("smokefake-root", ("smokefake-service>=1", "smokefake-leaf")),
        "smokefake-leaf": wheel("smokefake-leaf", ()),
    }
    left = {"smokefake-root": {"smokefake-service": gb.LeftBehind("smokefake_service", ("smokefake_root.app",), "x")}}
    added = {"smokefake-root": {"numpy>=99": "generated code"}}
    machine = gb.MachinePackages({"numpy": Version("2.0")})
    plain = gb.resolve(("smokefake-root==1.0",), machine, wheels, left_behind={}, added={})
    assert set(plain.missing) == {"smokefake-service"}
    resolution = gb.resolve(("smokefake-root==1.0",), machine, wheels, left_behind=left, added=added)
    assert set(resolution.missing) == {"numpy"}  # the added bound, which the machine's 2.0 misses
    assert "smokefake-service" not in resolution.required_by
    entry = {"name": "pip", "version": metadata.version("pip"), "extras": [], "requires_dist": ["smokefake-service"]}
    assert [name for name, _ in gb.check_installed([entry])] == ["smokefake-service"]
    assert gb.check_installed([{**entry, "left_behind": {"smokefake-service": "x"}}]) == []
    assert [
        name for name, _ in gb.check_installed([{**entry, "requires_dist": [], "added_requires": ["pip>=999"]}])
    ] == ["pip"]


def test_the_committed_manifest_records_the_tables() -> None:
    entries = {w["name"]: w for w in COMMITTED["wheels"]}
    for name, table in gb.LEFT_BEHIND.items():
        declared = {canonicalize_name(gb.Requirement(r).name) for r in entries[name]["requires_dist"]}
        assert set(table) <= declared, f"{name} no longer requires {set(table) - declared}: the table is stale"
        assert entries[name]["left_behind"] == {req: left.why for req, left in table.items()}
        # None carried for it (pydantic is carried, for Ray alone).
        assert not [w["name"] for w in COMMITTED["wheels"] if w["name"] in table and name in w["required_by"]]
    for name, added in gb.ADDED_REQUIRES.items():
        assert entries[name]["added_requires"] == list(added)


def _nvrx_root() -> Path:
    spec = importlib.util.find_spec("nvidia_resiliency_ext")
    assert spec is not None, "NVRx is not installed here (make install)"
    assert spec.origin is not None
    nvrx = next(root for root in gb.ROOTS if root.startswith("nvidia-resiliency-ext=="))
    assert metadata.version("nvidia-resiliency-ext") == nvrx.split("==")[1], "this venv's NVRx is not the bundle's"
    return Path(spec.origin).parent


def test_each_requirement_left_behind_is_imported_only_by_the_modules_the_table_names() -> None:
    package = _nvrx_root()
    importers: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        module = ".".join(path.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__")
        for name in _imports(path):  # at any depth: inside functions too
            importers.setdefault(name.split(".")[0], set()).add(module)
    for left in gb.LEFT_BEHIND["nvidia-resiliency-ext"].values():
        assert importers.get(left.module, set()) == set(left.imported_by), left.module


def smoke_nvrx_imports() -> list[tuple[str, list[str]]]:
    """(module, names) of every `from nvidia_resiliency_ext... import ...` in the code the smoke runs."""
    found = set()
    for path in sorted((ROOT / "training").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nvidia_resiliency_ext"):
                found.add((node.module or "", tuple(a.name for a in node.names)))
            elif isinstance(node, ast.Import):
                found.update((a.name, ()) for a in node.names if a.name.startswith("nvidia_resiliency_ext"))
    return [(module, list(names)) for module, names in sorted(found)]


BLOCKED_IMPORTS = """
import importlib.abc, json, runpy, sys
blocked, tried = set(json.loads(sys.argv[1])), []

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            frame = sys._getframe(1)
            while frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen_importlib")):
                frame = frame.f_back
            tried.append([name, frame.f_globals.get("__name__")])
            raise ImportError(f"No module named {name!r} (blocked: the bundle does not carry it)")
        return None

sys.meta_path.insert(0, Blocker())
for module, names in json.loads(sys.argv[2]):
    __import__(module, fromlist=names)
sys.argv = ["ft_launcher", "--help"]
try:
    runpy.run_module("nvidia_resiliency_ext.fault_tolerance.launcher", run_name="__main__")
except SystemExit as exit:
    assert exit.code in (0, None), exit.code
print(json.dumps({"tried": tried, "loaded": sorted(m for m in sys.modules if m.split(".")[0] in blocked)}))
"""


@pytest.mark.slow
def test_the_smokes_nvrx_imports_and_ft_launcher_run_without_the_requirements_left_behind() -> None:
    """What the smoke runs of NVRx (ft_launcher, and every NVRx module training/ imports: the in-process Wrapper,
    the async checkpointing) imported, and ft_launcher's --help run, with the modules left behind unimportable."""
    _nvrx_root()
    blocked = sorted(left.module for left in gb.LEFT_BEHIND["nvidia-resiliency-ext"].values())
    modules = smoke_nvrx_imports()
    assert {m for m, _ in modules} >= {
        "nvidia_resiliency_ext",
        "nvidia_resiliency_ext.checkpointing.async_ckpt.core",
        "nvidia_resiliency_ext.fault_tolerance",
        "nvidia_resiliency_ext.inprocess.store",
    }
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORTS, json.dumps(blocked), json.dumps(modules)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["loaded"] == []
    # NVRx itself tries none of them. grpc's __init__ tries grpc_tools, in a try/except ImportError (a shim that
    # exposes it as grpc.tools when it is installed), and runs on without it.
    assert result["tried"] == [["grpc_tools", "grpc"]]


def test_the_added_requirements_are_what_nvrxs_generated_code_checks() -> None:
    """NVRx 0.7.0 declares protobuf>=4.22, but its generated *_pb2 modules, which ft_launcher imports, refuse a
    protobuf runtime older than the protoc that made them; its *_pb2_grpc modules refuse grpcio older than theirs."""
    package = _nvrx_root()
    protoc, grpc_generated = set(), set()
    for path in (package / "shared_utils/proto").glob("*.py"):
        text = path.read_text()
        for line in text.splitlines():
            if line.startswith("# Protobuf Python Version: "):
                protoc.add(Version(line.rsplit(" ", 1)[1]))
            if line.startswith("GRPC_GENERATED_VERSION = "):
                grpc_generated.add(Version(line.split("=")[1].strip().strip("'\"")))
    assert protoc
    assert grpc_generated
    added = {str(canonicalize_name(r.name)): r for r in map(gb.Requirement, gb.ADDED_REQUIRES["nvidia-resiliency-ext"])}
    assert str(added["protobuf"].specifier) == f">={max(protoc)}"
    declared = next(
        gb.Requirement(r) for r in metadata.requires("nvidia-resiliency-ext") or [] if r.startswith("grpcio ")
    )
    assert declared.specifier.contains(max(grpc_generated))
    assert not any(declared.specifier.contains(Version(f"{v.major}.{v.minor - 1}")) for v in grpc_generated)
