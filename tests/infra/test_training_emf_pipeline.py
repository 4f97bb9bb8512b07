"""Issue 38 (finding 3): the training metrics reach CloudWatch only from the workload namespaces' containers, into
a log group the configuration fixes. The CloudWatch agent listens for no EMF (nothing on port 25888 of a node); the
add-on's Fluent Bit tails the containers of `training` and `ray` only, keeps the lines that are EMF objects of the
MLPlatform/Training namespace and writes them to one group (infra/addons/observability.py).

The configuration is built without a synth (milliseconds); tests/infra/test_observability.py checks that the add-on
in the templates carries it. Fluent Bit is not packaged for this machine, so its classic configuration is read here
with a reader of the format's few rules, the tail input's globs are matched as glob(3) would, and the Lua filter,
the one piece of logic, runs under LuaJIT (Fluent Bit's own Lua), the one lupa bundles."""

from __future__ import annotations

import fnmatch
import json
import re
from typing import Any

import pytest
from lupa.luajit21 import LuaRuntime

from infra.addons.observability import (
    CHART_CUSTOM_PARSERS,
    EMF_JSON_PARSER,
    EMF_LUA_FUNCTION,
    TRAINING_EMF_FILE,
    configuration,
)
from infra.spec import ENVIRONMENTS
from infra.spec.metrics import EMF_SOURCE_NAMESPACES, emf_container_log_paths, emf_log_group
from infra.spec.namespaces import TRAINING_NAMESPACES
from training import emf

CLUSTER = "ml-dev"

Section = tuple[str, dict[str, list[str]]]


def sections(text: str) -> list[Section]:
    """Fluent Bit's classic format: `[NAME]` opens a section, each indented `Key value` line below it sets a
    property (the key is the first word, the value the rest of the line); `#` lines are comments."""
    found: list[Section] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        header = re.fullmatch(r"\[\s*([A-Za-z_]+)\s*\]", line)
        if header:
            found.append((header.group(1).upper(), {}))
            continue
        assert raw[:1].isspace(), f"a property outside an indented section body: {raw!r}"
        assert found, f"a property before any section: {raw!r}"
        key, _, value = line.partition(" ")
        found[-1][1].setdefault(key.lower(), []).append(value.strip())
    return found


def one(props: dict[str, list[str]], key: str) -> str:
    values = props.get(key.lower(), [])
    assert len(values) == 1, (key, values)
    return values[0]


def fluent_bit(cluster: str = CLUSTER) -> dict[str, Any]:
    config: dict[str, Any] = configuration(cluster)["containerLogs"]["fluentBit"]["config"]
    return config


def pipeline(cluster: str = CLUSTER) -> list[Section]:
    return sections(fluent_bit(cluster)["extraFiles"][TRAINING_EMF_FILE])


# --- the agent -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cluster", [e.cluster.name for e in ENVIRONMENTS.values()])
def test_the_agent_listens_for_no_emf(cluster: str) -> None:
    """With `logs.metrics_collected.emf` the agent listens on 25888 on every node's IP (host network) and writes a
    line to the group the line names; without it there is no listener and no such pipeline."""
    config = configuration(cluster)
    collected = config["agent"]["config"]["logs"]["metrics_collected"]
    assert "emf" not in collected
    assert set(collected) == {"kubernetes"}
    assert "25888" not in json.dumps(config)


# --- what Fluent Bit reads -------------------------------------------------------------------------------------------


def test_only_the_chart_files_and_ours_are_configured() -> None:
    """extraFiles is a map the add-on merges with the chart's: the chart's application, dataplane and host files stay
    as the chart writes them, ours is added beside them."""
    config = fluent_bit()
    assert set(config["extraFiles"]) == {TRAINING_EMF_FILE}
    assert set(config) == {"extraFiles", "customParsers"}


def test_the_input_tails_the_workload_namespaces_containers_only() -> None:
    inputs = [props for name, props in pipeline() if name == "INPUT"]
    assert len(inputs) == 1
    (tail,) = inputs
    assert one(tail, "Name") == "tail"
    paths = [p.strip() for p in one(tail, "Path").split(",")]
    assert paths == list(emf_container_log_paths())
    assert "exclude_path" not in tail
    assert EMF_SOURCE_NAMESPACES == tuple(sorted(ns.name for ns in TRAINING_NAMESPACES)) == ("ray", "training")


# The kubelet's name for a container's log: <pod>_<namespace>_<container>-<container id>.log in /var/log/containers
# (kubelet kuberuntime_logs / the CRI's container log path). Pod, namespace and container names are DNS labels or
# subdomains: none holds an underscore, so the namespace is the field between the first two.
CONTAINER_ID = "0123456789abcdef" * 4


def log_file(pod: str, namespace: str, container: str) -> str:
    return f"/var/log/containers/{pod}_{namespace}_{container}-{CONTAINER_ID}.log"


def read_by_the_input(path: str) -> bool:
    # glob(3) as the tail input uses it: `*` matches within one path component, as fnmatch does on these paths
    # (all in one directory, the pattern's directory the same).
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in emf_container_log_paths())


@pytest.mark.parametrize(
    ("pod", "namespace", "container", "read"),
    [
        ("nvrx-fsdp-0-abcde", "training", "trainer", True),
        ("qwen-finetune-gpu-worker-x7k2p", "ray", "ray-worker", True),
        ("training-raycluster-head-9f8d7", "ray", "ray-head", True),
        # Another namespace, whatever its pods and containers are called.
        ("training", "default", "training", False),
        ("ray", "default", "ray", False),
        ("x-training", "attacker", "ray-worker", False),
        ("emf-forger", "kube-system", "training", False),
        ("cloudwatch-agent-abcde", "amazon-cloudwatch", "cloudwatch-agent", False),
        ("controller-0", "fabric-gate-system", "controller", False),
        ("kuberay-operator-1", "kuberay-system", "kuberay-operator", False),
        # Namespaces that merely contain or extend the names.
        ("p", "training-x", "c", False),
        ("p", "x-training", "c", False),
        ("p", "ray-system", "c", False),
        ("p", "xray", "c", False),
    ],
)
def test_which_container_logs_the_input_reads(pod: str, namespace: str, container: str, read: bool) -> None:
    assert read_by_the_input(log_file(pod, namespace, container)) is read


# --- what it keeps and where it writes -------------------------------------------------------------------------------


def test_every_section_handles_only_its_own_tag() -> None:
    """Filters and outputs run on the records whose tag their Match names: ours never see the application pipeline's
    records and the chart's (application.*, dataplane.*, host.*) never see ours."""
    found = pipeline()
    (tag,) = [one(props, "Tag") for name, props in found if name == "INPUT"]
    assert tag.endswith(".*")
    assert not tag.startswith(("application", "dataplane", "host"))
    for name, props in found:
        if name != "INPUT":
            assert one(props, "Match") == tag, (name, props)


def test_lines_are_decoded_as_json_then_checked_by_the_lua_filter_then_written_to_the_fixed_group() -> None:
    found = pipeline()
    assert [(name, one(props, "Name")) for name, props in found] == [
        ("INPUT", "tail"),
        ("FILTER", "parser"),
        ("FILTER", "lua"),
        ("OUTPUT", "cloudwatch_logs"),
    ]
    parser, lua, output = (props for _, props in found[1:])
    assert one(parser, "Key_Name") == "log"
    assert one(parser, "Parser") == EMF_JSON_PARSER
    # Reserve_Data off (the default): the decoded object replaces the record, nothing of the envelope is kept.
    assert parser.get("reserve_data", ["Off"]) == ["Off"]
    assert one(lua, "call") == EMF_LUA_FUNCTION
    assert f"function {EMF_LUA_FUNCTION}(" in one(lua, "code")
    # The group is the configuration's: no template that would read it from the record, no key that would send a
    # field instead of the whole object, the header that asks CloudWatch to extract the metrics.
    assert one(output, "log_group_name") == emf_log_group(CLUSTER)
    assert one(output, "log_format") == "json/emf"
    for key in ("log_group_template", "log_stream_template", "log_key", "log_retention_days", "role_arn"):
        assert key not in output, key
    assert one(output, "region") == "${AWS_REGION}"


def test_the_json_parser_is_defined_beside_the_charts_own() -> None:
    parsers = sections(fluent_bit()["customParsers"])
    named = {one(props, "Name"): props for name, props in parsers if name == "PARSER"}
    assert one(named[EMF_JSON_PARSER], "Format") == "json"
    assert set(named[EMF_JSON_PARSER]) == {"name", "format"}, "no time key: the record keeps the container's time"
    # customParsers is one string that replaces the chart's: the chart's three parsers are kept as it writes them.
    assert fluent_bit()["customParsers"].startswith(CHART_CUSTOM_PARSERS)
    assert set(named) == {"syslog", "container_firstline", "cwagent_firstline", EMF_JSON_PARSER}


def test_the_group_is_the_clusters_own_and_no_other_clusters() -> None:
    groups = {emf_log_group(e.cluster.name) for e in ENVIRONMENTS.values()}
    assert len(groups) == len(ENVIRONMENTS)
    for environment in ENVIRONMENTS.values():
        assert environment.cluster.name in emf_log_group(environment.cluster.name)


def test_the_lua_code_survives_the_chart_and_the_classic_format() -> None:
    """The chart renders each extraFiles value with `tpl` (templates/linux/fluent-bit-configmap.yaml): no `{{`; the
    classic format reads one line per property and skips lines that start with `#`."""
    text = fluent_bit()["extraFiles"][TRAINING_EMF_FILE]
    assert "{{" not in text
    assert "}}" not in text
    (code,) = [one(props, "code") for name, props in pipeline() if name == "FILTER" and one(props, "Name") == "lua"]
    assert "#" not in code, "no length operator: a `#` could start a comment line of the classic format"
    assert "--" not in code, "no Lua comment: on one line it would swallow the rest of the code"


# --- the Lua filter, run ---------------------------------------------------------------------------------------------


def lua_value(value: Any) -> str:
    """A Lua constructor for a decoded JSON value, as Fluent Bit hands a record to the filter (flb_lua.c
    flb_lua_pushmpack: maps and arrays become tables, null becomes nil)."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        assert value.isascii()
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, list):
        return "{" + ", ".join(f"[{i}] = {lua_value(v)}" for i, v in enumerate(value, start=1)) + "}"
    assert isinstance(value, dict), value
    return "{" + ", ".join(f"[{lua_value(k)}] = {lua_value(v)}" for k, v in value.items()) + "}"


def run_filter(records: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any] | None]]:
    """Each record through the configured filter: (its return code, the record it returns as JSON-ish data)."""
    (code,) = [one(props, "code") for name, props in pipeline() if name == "FILTER" and one(props, "Name") == "lua"]
    dump = (
        "local function dump(v) "
        'if type(v) == "table" then local parts = {} '
        'for k, x in pairs(v) do parts[#parts + 1] = string.format("%q", tostring(k)) .. ":" .. dump(x) end '
        'return "{" .. table.concat(parts, ",") .. "}" '
        'elseif type(v) == "string" then return string.format("%q", v) '
        'elseif v == nil then return "null" else return tostring(v) end end '
    )
    calls = "".join(
        f"do local c, t, r = {EMF_LUA_FUNCTION}('training-emf.x', 1.5, {lua_value(record)}) "
        'out[#out + 1] = c .. " " .. dump(r) .. "\\n" end '
        for record in records
    )
    output = LuaRuntime().execute(f"local out = {{}} {code} {dump} {calls} return table.concat(out)")
    results: list[tuple[int, dict[str, Any] | None]] = []
    for line in str(output).splitlines():
        rc, _, body = line.partition(" ")
        # Lua's %q escapes are JSON's for these ASCII strings; every table comes back as an object.
        results.append((int(rc), json.loads(body) if body != "null" else None))
    return results


def throughput() -> dict[str, Any]:
    identity = emf.JobIdentity(job_name="nvrx-fsdp", model="Qwen2.5-1.5B", instance_type="p5.48xlarge", node_count=2)
    return emf.throughput(identity, step=7, step_time_s=0.5, tokens=4096, world_size=16)


def with_directives(*namespaces: str | None) -> dict[str, Any]:
    doc = throughput()
    template = doc["_aws"]["CloudWatchMetrics"][0]
    doc["_aws"]["CloudWatchMetrics"] = [
        {k: v for k, v in {**template, "Namespace": ns}.items() if v is not None} for ns in namespaces
    ]
    return doc


KEEP, DROP = 2, -1

CASES: list[tuple[str, dict[str, Any], int]] = [
    ("a training line", throughput(), KEEP),
    (
        "a restart line",
        emf.restart(
            emf.JobIdentity(job_name="j", model="m", instance_type="p5.48xlarge", node_count=2),
            restart_count=1,
            iteration=0,
        ),
        KEEP,
    ),
    ("a line the json parser left alone (not JSON)", {"log": "step 7 loss 2.1", "stream": "stdout"}, DROP),
    ("JSON without _aws", {"level": "info", "msg": "hello"}, DROP),
    ("_aws not an object", {"_aws": "x", "TokensPerSecond": 1}, DROP),
    ("no directives", {"_aws": {"Timestamp": 1}}, DROP),
    ("an empty directive list", with_directives(), DROP),
    ("another namespace", with_directives("ContainerInsights"), DROP),
    ("one foreign directive among ours", with_directives(emf.NAMESPACE, "ContainerInsights"), DROP),
    ("a directive without a namespace", with_directives(None), DROP),
    ("a namespace that extends ours", with_directives(emf.NAMESPACE + "X"), DROP),
    (
        "directives as an object",
        {**throughput(), "_aws": {**throughput()["_aws"], "CloudWatchMetrics": {"a": {"Namespace": emf.NAMESPACE}}}},
        DROP,
    ),
    (
        "a null directive before one of ours (JSON null reaches Lua as nil: a hole in the list)",
        {
            **throughput(),
            "_aws": {**throughput()["_aws"], "CloudWatchMetrics": [None, *throughput()["_aws"]["CloudWatchMetrics"]]},
        },
        DROP,
    ),
    ("two directives of ours", with_directives(emf.NAMESPACE, emf.NAMESPACE), KEEP),
]


def test_the_lua_filter_keeps_only_training_emf_objects() -> None:
    results = run_filter([record for _, record, _ in CASES])
    assert [(name, rc) for (name, _, _), (rc, _) in zip(CASES, results, strict=True)] == [
        (name, expected) for name, _, expected in CASES
    ]


def test_the_lua_filter_removes_any_destination_the_line_names() -> None:
    """CloudWatch Logs ignores these in an event it is given, but the event keeps no sign of a destination other than
    the one configured."""
    doc = throughput()
    doc["_aws"] = {**doc["_aws"], "LogGroupName": "/aws/eks/ml-dev/cluster", "LogStreamName": "kube-apiserver-audit"}
    doc["log_group_name"], doc["log_stream_name"] = "/aws/eks/ml-dev/cluster", "x"
    ((rc, kept),) = run_filter([doc])
    assert rc == KEEP
    assert kept is not None
    for field in ("LogGroupName", "LogStreamName"):
        assert field not in kept["_aws"]
    for field in ("log_group_name", "log_stream_name"):
        assert field not in kept
    assert kept["TokensPerSecond"] == doc["TokensPerSecond"]
