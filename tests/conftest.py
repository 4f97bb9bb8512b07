"""Shared fixtures: the app is synthesized once (make test: python -m gates.synth, CDK_SYNTH_OUT; otherwise once per
session, per xdist worker) and every test reads its cloud assembly.

Tiers (docs/testing.md): `make test-fast` deselects the markers of tests/tiers.py OUT_OF_FAST; `make test` runs the
rest on both cores with `--dist loadgroup` and the CI rehearsals (tiers.CI_REHEARSALS) in a pytest of their own beside
it. The grouping below keeps what a session or a module builds once on one worker: the NVRx runs shared by two
modules in one group, the rehearsals in another where one run holds them (serial: the loopback fallback puts every
run's pods on 127.10.0.0/16), and every other module is its own group so its module-scoped fixtures (a local Ray
cluster, a gloo process group) start once. The modules that read the app's synth are one group (`cdk`): one worker
synthesizes it where make test has not (measured in the commit that made it so). The groups reach xdist's
scheduler through tests/xdist_groups.py (pytest 9.2 drops xdist's own way). The heavy groups are ordered first so a
worker starts on each at once (pass `--no-loadscope-reorder`, which keeps this order instead of xdist's sort by test
count).

aws-cdk-lib (jsii starting Node) is imported by the fixtures that synthesize, not at collection, so
a run that selects no CDK test never pays for it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests import tiers, xdist_groups

if TYPE_CHECKING:
    from aws_cdk.assertions import Template

    from tests.trainctl.fake_aws import MotoServer

ROOT = Path(__file__).resolve().parent.parent

# Fixtures whose value one worker builds once; a test using one joins that group.
NVRX_RUN_FIXTURES = frozenset(
    {"nvrx_reference", "nvrx_sigkill", "nvrx_exception", "nvrx_hang", "nvrx_kill_during_save"}
)
# Longest first: a worker takes the next group when it is nearly out of work.
HEAVY_GROUPS = ("rehearsal", "nvrx-runs", "cdk")


def heavy_group_of(item: pytest.Item) -> str | None:
    fixtures = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("rehearsal"):
        return "rehearsal"
    if fixtures & NVRX_RUN_FIXTURES:
        return "nvrx-runs"
    if "cdk_out" in fixtures:
        return "cdk"
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist appends the group to each test id, and before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers.classify(items)  # the `training` marker, from the fixtures and helpers a test uses (tests/tiers.py)
    tiers.mark_full_rehearsals(items)  # `full_rehearsal`: a rehearsal outside tiers.CI_REHEARSALS
    # A module goes whole to the first heavy group one of its tests needs (its module fixtures then
    # start once); any other module is a group of its own.
    module_group: dict[str, str] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        heavy = heavy_group_of(item)
        if heavy and module_group.get(module) not in HEAVY_GROUPS:
            module_group[module] = heavy
        module_group.setdefault(module, module)
    groups = {item.nodeid: module_group[item.nodeid.split("::", 1)[0]] for item in items}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    xdist_groups.record(config, groups)  # what the scheduler reads (tests/xdist_groups.py: xdist's own is lost)
    rank = {name: index for index, name in enumerate(HEAVY_GROUPS)}
    items.sort(key=lambda item: rank.get(groups[item.nodeid], len(rank)))  # stable: files keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    xdist_groups.configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadgroup":
        return None
    return xdist_groups.make_scheduler(config, log)


def cdk_json_context() -> dict[str, Any]:
    """The feature flags of cdk.json, so tests synthesize exactly what `cdk synth` does."""
    context: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text())["context"]
    return context


# make test synthesizes the app once (python -m gates.synth) and names the assembly here; the gates read the same.
SHARED_SYNTH = "CDK_SYNTH_OUT"


@pytest.fixture(scope="session")
def cdk_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The app's cloud assembly: make test's one synth where CDK_SYNTH_OUT names it, else this session's own."""
    shared = os.environ.get(SHARED_SYNTH)
    if shared:
        path = Path(shared)
        assert (path / "manifest.json").is_file(), f"{SHARED_SYNTH}={shared}: no cloud assembly (python -m gates.synth)"
        return path
    from app import create_app

    out = tmp_path_factory.mktemp("cdk.out")
    app, _ = create_app(context=cdk_json_context(), environ={}, outdir=str(out))
    app.synth()
    return out


@dataclass(frozen=True)
class StackArtifact:
    """One stack of the cloud assembly: its id in the stage (Platform, Gpu-g6...), CloudFormation name, template and
    the ids of the stacks it depends on."""

    id: str
    name: str
    template: dict[str, Any]
    dependencies: tuple[str, ...]


@pytest.fixture(scope="session")
def assembly(cdk_out: Path) -> dict[str, dict[str, StackArtifact]]:
    """Environment -> stack id -> the stack as the cloud assembly records it (manifest.json of each stage)."""
    found: dict[str, dict[str, StackArtifact]] = {}
    root = json.loads((cdk_out / "manifest.json").read_text())
    for artifact in root["artifacts"].values():
        if artifact["type"] != "cdk:cloud-assembly":
            continue
        directory = cdk_out / artifact["properties"]["directoryName"]
        stage = json.loads((directory / "manifest.json").read_text())["artifacts"]
        stacks = {k: a for k, a in stage.items() if a["type"] == "aws:cloudformation:stack"}
        ids = {k: a["displayName"].rsplit("/", 1)[1] for k, a in stacks.items()}
        environment = next(iter(stacks.values()))["displayName"].split("/", 1)[0]
        found[environment] = {
            ids[k]: StackArtifact(
                id=ids[k],
                name=a["properties"]["stackName"],
                template=json.loads((directory / a["properties"]["templateFile"]).read_text()),
                dependencies=tuple(ids[d] for d in a.get("dependencies", []) if d in ids),
            )
            for k, a in stacks.items()
        }
    return found


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Manifests of every environment, synthesized once (as `make synth` writes them)."""
    from k8s.check_lock import check_lock
    from k8s.images import ImageLock
    from k8s.main import synth_all

    out = tmp_path_factory.mktemp("dist")
    synth_all(out, check_lock(ImageLock.load()))
    return out


@pytest.fixture(scope="session")
def stack_templates(assembly: dict[str, dict[str, StackArtifact]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Raw template JSON per environment and stack id (Images, Platform, Storage, Gpu-<group>)."""
    return {name: {stack.id: stack.template for stack in stacks.values()} for name, stacks in assembly.items()}


@pytest.fixture(scope="session")
def templates(stack_templates: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Template]:
    """The Platform stack of each environment (network, cluster, add-ons)."""
    from aws_cdk.assertions import Template

    return {name: Template.from_json(stacks["Platform"]) for name, stacks in stack_templates.items()}


@pytest.fixture(scope="session")
def resources(stack_templates: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Every stack of an environment merged into one template JSON, for assertions that walk all of
    an environment's resources (logical ids are unique across its stacks; Outputs are Platform's)."""
    return {name: merged(stacks) for name, stacks in stack_templates.items()}


def merged(stacks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    for stack in stacks.values():
        clash = resources.keys() & stack["Resources"].keys()
        assert not clash, f"logical ids in two stacks: {sorted(clash)}"
        resources.update(stack["Resources"])
    return {**stacks["Platform"], "Resources": resources}


# moto and fake AWS keys, for every test that calls AWS (trainctl, the image build's Lambda handlers).
@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    """moto in server mode on loopback, one per test module."""
    from tests.trainctl.fake_aws import MotoServer

    server = MotoServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fake_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake keys only; nothing from the caller's AWS setup (profiles, endpoints, instance role) leaks in."""
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_EC2",
        "AWS_ENDPOINT_URL_EKS",
        "AWS_ENDPOINT_URL_SERVICE_QUOTAS",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))


@pytest.fixture(params=["dev", "prod"])
def env_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


_GUARD: tiers.TrainingProcessGuard | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _GUARD
    if _GUARD is None:  # an audit hook cannot be removed: one per process
        _GUARD = tiers.TrainingProcessGuard()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    if _GUARD is not None:
        _GUARD.started.clear()
        _GUARD.watching = True
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    result = yield
    if _GUARD is not None:
        _GUARD.watching = False
        problem = _GUARD.verdict(item)
        if problem:
            pytest.fail(problem, pytrace=False)
    return result
