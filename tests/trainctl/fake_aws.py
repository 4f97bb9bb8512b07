"""Loopback AWS endpoints for the `trainctl preflight` tests: moto in server mode, and stubs for what it lacks.

moto 5.2.5 (server mode) answers EC2's DescribeInstanceTypeOfferings and DescribeInstanceTypes
from its own copy of AWS's data, and DescribeVpcs, DescribeSubnets (AvailableIpAddressCount
included) and DescribeInstances for what a test creates. It does not have:

- ec2:DescribeCapacityReservations (moto keeps no capacity reservations), and no way to change
  the data behind DescribeInstanceTypes: `Ec2Front` speaks EC2's query/XML protocol, answers
  those two actions itself for the ids and types a test gives it, and forwards every other
  request to moto byte for byte.
- servicequotas:GetServiceQuota for the ec2 service code (moto knows only fixed "vpc" defaults):
  `FakeServiceQuotas`, JSON 1.1 with X-Amz-Target.
- eks:DescribeClusterVersions and eks:DescribeAddonVersions: `FakeEks`, REST-JSON; it also answers
  eks:DescribeCluster and eks:DescribeNodegroup for what a test gives it (the tests' EKS endpoint
  is this stub).
- cloudformation:ListStackResources, DescribeStacks and GetTemplate of stacks holding an EKS cluster or an
  FSx file system: `FakeCloudFormation`, query/XML. moto 5.2.5's CreateStack answers 500 on this app's
  templates (Fn::GetAtt of an EKS cluster attribute: its parser finds no model for AWS::EKS::Cluster,
  `'NoneType' object has no attribute 'has_cfn_attr'`), so moto cannot hold a deployed Platform stack. For a
  stack that does not exist moto answers as the stub does (ValidationError "Stack with id X does not exist"), but
  its first CloudFormation call takes 1.8 s (loading its backend; measured on this machine), the stub's milliseconds.

Each stub is a stdlib ThreadingHTTPServer on 127.0.0.1, port 0, in a thread; `calls` records
the actions it answered, so a test can tell that a request really reached it.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import urllib.request
from collections.abc import Mapping, Sequence
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit
from xml.etree import ElementTree

import botocore.session
from moto.server import ThreadedMotoServer

from tests.trainctl.loopback import ServerThread

Reply = tuple[int, dict[str, str], bytes]

EC2_NAMESPACE = "http://ec2.amazonaws.com/doc/2016-11-15/"


class MotoServer:
    """moto's whole server on 127.0.0.1:<free port>, reset between tests with its /moto-api/reset."""

    def __init__(self) -> None:
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)

    def start(self) -> MotoServer:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request on stderr
        # moto builds each region's EC2 backend again after every reset, with ~15,000 default AMIs (and a volume
        # and snapshot each): about a second per test. No test here reads an AMI; the server runs in this process.
        os.environ["MOTO_EC2_LOAD_DEFAULT_AMIS"] = "false"
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        return self

    def reset(self) -> None:
        request = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200

    def stop(self) -> None:
        self._server.stop()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        status, headers, payload = self.server.owner.handle(self.command, self.path, dict(self.headers), body)
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _serve  # noqa: N815 (http.server's names)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, owner: LoopbackStub) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.owner = owner


class LoopbackStub:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self._loop = ServerThread(_Server(self), type(self).__name__)

    @property
    def url(self) -> str:
        return self._loop.url

    def start(self) -> LoopbackStub:
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop()

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Reply:
        raise NotImplementedError


# --- Service Quotas: JSON 1.1 ------------------------------------------------------------------


class FakeServiceQuotas(LoopbackStub):
    """`applied`: QuotaCode -> the account's value; `defaults`: answered by GetAWSDefaultServiceQuota
    (GetServiceQuota then says NoSuchResourceException, as for a quota never changed); `denied`:
    every call is AccessDeniedException."""

    NAMES: Mapping[str, str] = {
        "L-417A185B": "Running On-Demand P instances",
        "L-DB2E81BA": "Running On-Demand G and VT instances",
    }

    def __init__(
        self, applied: Mapping[str, float], *, defaults: Mapping[str, float] | None = None, denied: bool = False
    ) -> None:
        super().__init__()
        self.applied = dict(applied)
        self.defaults = dict(defaults or {})
        self.denied = denied

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Reply:
        target = headers.get("X-Amz-Target", "")
        service, _, action = target.partition(".")
        assert method == "POST", method
        assert service == "ServiceQuotasV20190624", target
        assert headers.get("Content-Type") == "application/x-amz-json-1.1"
        params = json.loads(body)
        self.calls.append(f"{action} {params.get('QuotaCode')}")
        if self.denied:
            return self._error("AccessDeniedException", "User is not authorized to perform servicequotas:" + action)
        code = params["QuotaCode"]
        table = self.applied if action == "GetServiceQuota" else self.defaults
        if params.get("ServiceCode") != "ec2" or code not in table:
            return self._error("NoSuchResourceException", f"The request failed because the quota {code} is unknown.")
        quota = {
            "ServiceCode": "ec2",
            "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
            "QuotaArn": f"arn:aws:servicequotas:us-east-2:123456789012:ec2/{code}",
            "QuotaCode": code,
            "QuotaName": self.NAMES.get(code, code),
            "Value": table[code],
            "Unit": "None",
            "Adjustable": True,
            "GlobalQuota": False,
        }
        return 200, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps({"Quota": quota}).encode()

    @staticmethod
    def _error(kind: str, message: str) -> Reply:
        document = {"__type": kind, "message": message}
        return 400, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps(document).encode()


# --- EKS: REST-JSON ---------------------------------------------------------------------------


def cluster_version(
    version: str,
    status: str = "STANDARD_SUPPORT",
    *,
    end_of_standard: datetime | None = None,
    end_of_extended: datetime | None = None,
) -> dict[str, Any]:
    """One entry of DescribeClusterVersions, as EKS writes it (timestamps as epoch seconds)."""
    entry: dict[str, Any] = {
        "clusterVersion": version,
        "clusterType": "eks",
        "defaultPlatformVersion": "eks.1",
        "defaultVersion": False,
        "versionStatus": status,
        "status": status.lower().replace("_", "-"),
        "kubernetesPatchVersion": f"{version}.0",
    }
    if end_of_standard is not None:
        entry["endOfStandardSupportDate"] = end_of_standard.timestamp()
    if end_of_extended is not None:
        entry["endOfExtendedSupportDate"] = end_of_extended.timestamp()
    return entry


class FakeEks(LoopbackStub):
    """`versions`: the entries DescribeClusterVersions knows; `addons`: (add-on, Kubernetes version) ->
    the add-on versions offered for it; `denied`: every call is AccessDeniedException."""

    def __init__(
        self,
        versions: Sequence[Mapping[str, Any]],
        addons: Mapping[tuple[str, str], Sequence[str]],
        *,
        denied: bool = False,
        clusters: Mapping[str, Mapping[str, Any]] | None = None,
        nodegroups: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
    ) -> None:
        """`clusters`: name -> the cluster DescribeCluster returns (none: ResourceNotFoundException);
        `nodegroups`: (cluster, node group) -> what DescribeNodegroup returns."""
        super().__init__()
        self.versions = list(versions)
        self.addons = dict(addons)
        self.denied = denied
        self.clusters = dict(clusters or {})
        self.nodegroups = dict(nodegroups or {})

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Reply:
        url = urlsplit(path)
        query = parse_qs(url.query)
        assert method == "GET", (method, path)
        self.calls.append(f"{url.path} {url.query}")
        if self.denied:
            return self._error(403, "AccessDeniedException", f"not authorized to call {url.path}")
        if url.path == "/cluster-versions":
            wanted = set(query.get("clusterVersions", []))
            found = [v for v in self.versions if not wanted or v["clusterVersion"] in wanted]
            return self._json({"clusterVersions": found})
        if url.path == "/addons/supported-versions":
            name = query["addonName"][0]
            kubernetes = query["kubernetesVersion"][0]
            offered = self.addons.get((name, kubernetes), [])
            addons = (
                [
                    {
                        "addonName": name,
                        "type": "networking",
                        "owner": "aws",
                        "publisher": "eks",
                        "addonVersions": [
                            {
                                "addonVersion": version,
                                "architecture": ["amd64", "arm64"],
                                "computeTypes": ["ec2"],
                                "compatibilities": [
                                    {"clusterVersion": kubernetes, "platformVersions": ["*"], "defaultVersion": i == 0}
                                ],
                                "requiresConfiguration": False,
                            }
                            for i, version in enumerate(offered)
                        ],
                    }
                ]
                if offered
                else []
            )
            return self._json({"addons": addons})
        if url.path.startswith("/clusters/") and "/node-groups/" in url.path:
            cluster, _, nodegroup = url.path.removeprefix("/clusters/").partition("/node-groups/")
            if (cluster, nodegroup) not in self.nodegroups:
                return self._error(404, "ResourceNotFoundException", f"No node group found for name: {nodegroup}.")
            return self._json({"nodegroup": self.nodegroups[(cluster, nodegroup)]})
        if url.path.startswith("/clusters/"):
            name = url.path.removeprefix("/clusters/")
            if name not in self.clusters:
                return self._error(404, "ResourceNotFoundException", f"No cluster found for name: {name}.")
            return self._json({"cluster": self.clusters[name]})
        return self._error(404, "NotFoundException", f"no route {url.path}")

    @staticmethod
    def _json(document: Mapping[str, Any]) -> Reply:
        return 200, {"Content-Type": "application/json"}, json.dumps(document).encode()

    @staticmethod
    def _error(status: int, kind: str, message: str) -> Reply:
        headers = {"Content-Type": "application/json", "x-amzn-ErrorType": kind}
        return status, headers, json.dumps({"message": message}).encode()


# --- EC2: query/XML, in front of moto ----------------------------------------------------------

_EC2 = botocore.session.get_session().get_service_model("ec2")


def _xml(shape: Any, value: Any, tag: str) -> ElementTree.Element:
    element = ElementTree.Element(tag)
    if shape.type_name == "structure":
        for name, member in shape.members.items():
            if name in value:
                element.append(_xml(member, value[name], member.serialization.get("name", name)))
    elif shape.type_name == "list":
        for item in value:
            element.append(_xml(shape.member, item, shape.member.serialization.get("name", "item")))
    elif shape.type_name == "boolean":
        element.text = "true" if value else "false"
    elif shape.type_name == "timestamp":
        element.text = value.strftime("%Y-%m-%dT%H:%M:%S.000Z") if isinstance(value, datetime) else str(value)
    else:
        element.text = str(value)
    return element


def ec2_response(operation: str, output: Mapping[str, Any]) -> bytes:
    """The XML EC2 returns for `operation`, built from boto3-shaped `output` with botocore's model."""
    shape = _EC2.operation_model(operation).output_shape
    root = _xml(shape, output, f"{operation}Response")
    root.set("xmlns", EC2_NAMESPACE)
    request_id = ElementTree.Element("requestId")
    request_id.text = "00000000-0000-4000-8000-000000000000"
    root.insert(0, request_id)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(root)


def ec2_error(code: str, message: str) -> Reply:
    body = (
        f"<?xml version='1.0' encoding='UTF-8'?><Response><Errors><Error><Code>{code}</Code>"
        f"<Message>{message}</Message></Error></Errors><RequestID>00000000-0000-4000-8000-000000000001</RequestID>"
        "</Response>"
    ).encode()
    return 400, {"Content-Type": "text/xml"}, body


class Ec2Front(LoopbackStub):
    """EC2 for a test: capacity reservations and replaced instance types here, everything else from moto.

    `reservations`: CapacityReservationId -> the boto3-shaped CapacityReservation;
    `instance_types`: type -> the boto3-shaped InstanceTypeInfo to answer instead of moto's."""

    def __init__(
        self,
        moto_url: str,
        *,
        reservations: Mapping[str, Mapping[str, Any]] | None = None,
        instance_types: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self.moto = urlsplit(moto_url)
        self.reservations = dict(reservations or {})
        self.instance_types = dict(instance_types or {})
        self.forwarded: list[str] = []

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Reply:
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        action = form.get("Action", "")
        if action == "DescribeCapacityReservations":
            self.calls.append(action)
            ids = [v for k, v in sorted(form.items()) if k.startswith("CapacityReservationId.")]
            missing = [i for i in ids if i not in self.reservations]
            if missing:
                return ec2_error(
                    "InvalidCapacityReservationId.NotFound",
                    f"The capacity reservation ID '{missing[0]}' does not exist",
                )
            found = [self.reservations[i] for i in ids] if ids else list(self.reservations.values())
            return 200, {"Content-Type": "text/xml"}, ec2_response(action, {"CapacityReservations": found})
        requested = [v for k, v in sorted(form.items()) if k.startswith("InstanceType.")]
        if action == "DescribeInstanceTypes" and requested and all(t in self.instance_types for t in requested):
            self.calls.append(action)
            infos = [self.instance_types[t] for t in requested]
            return 200, {"Content-Type": "text/xml"}, ec2_response(action, {"InstanceTypes": infos})
        self.forwarded.append(action)
        return self._forward(method, path, headers, body)

    def _forward(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Reply:
        connection = http.client.HTTPConnection(self.moto.hostname or "127.0.0.1", self.moto.port, timeout=30)
        try:
            skip = {"host", "content-length", "connection"}
            sent = {k: v for k, v in headers.items() if k.lower() not in skip}
            connection.request(method, path, body=body, headers=sent)
            response = connection.getresponse()
            payload = response.read()
            kept = {k: v for k, v in response.getheaders() if k.lower() not in {"content-length", "transfer-encoding"}}
            return response.status, kept, payload
        finally:
            connection.close()


# --- CloudFormation: query/XML ------------------------------------------------------------------

CLOUDFORMATION_NAMESPACE = "http://cloudformation.amazonaws.com/doc/2010-05-15/"
_CLOUDFORMATION = botocore.session.get_session().get_service_model("cloudformation")


def _query_xml(shape: Any, value: Any, tag: str) -> ElementTree.Element:
    """Like _xml, for the query protocol of services other than EC2: list items are <member>."""
    element = ElementTree.Element(tag)
    if shape.type_name == "structure":
        for name, member in shape.members.items():
            if name in value:
                element.append(_query_xml(member, value[name], member.serialization.get("name", name)))
    elif shape.type_name == "list":
        for item in value:
            element.append(_query_xml(shape.member, item, shape.member.serialization.get("name", "member")))
    else:
        element.text = _xml(shape, value, tag).text
    return element


def stack_resource(
    logical_id: str, resource_type: str, physical_id: str, status: str = "CREATE_COMPLETE"
) -> dict[str, Any]:
    """One StackResourceSummary, as ListStackResources returns it."""
    return {
        "LogicalResourceId": logical_id,
        "PhysicalResourceId": physical_id,
        "ResourceType": resource_type,
        "LastUpdatedTimestamp": datetime(2026, 1, 5, 12, 0),
        "ResourceStatus": status,
    }


class FakeCloudFormation(LoopbackStub):
    """`stacks`: stack name -> its StackResourceSummaries; `templates`: stack name -> the template it holds
    (DescribeStacks, GetTemplate); `statuses`: stack name -> its StackStatus (default UPDATE_COMPLETE); any
    other name is ValidationError "does not exist", as CloudFormation answers for a stack that was never
    created or was deleted. `denied`: every call is AccessDenied."""

    def __init__(
        self,
        stacks: Mapping[str, Sequence[Mapping[str, Any]]],
        *,
        templates: Mapping[str, Mapping[str, Any]] | None = None,
        statuses: Mapping[str, str] | None = None,
        denied: bool = False,
    ) -> None:
        super().__init__()
        self.stacks = {name: list(resources) for name, resources in stacks.items()}
        self.templates = dict(templates or {})
        self.statuses = dict(statuses or {})
        self.denied = denied

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Reply:
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        action = form.get("Action", "")
        assert method == "POST", (method, path)
        assert action in ("ListStackResources", "DescribeStacks", "GetTemplate"), action
        stack = form["StackName"]
        self.calls.append(f"{action} {stack}")
        if self.denied:
            return self._error(
                "AccessDenied", f"User: arn:aws:iam::123456789012:user/t is not authorized to perform: {action}"
            )
        known = self.stacks if action == "ListStackResources" else self.templates
        if stack not in known:
            return self._error("ValidationError", f"Stack with id {stack} does not exist")
        if action == "ListStackResources":
            result: dict[str, Any] = {"StackResourceSummaries": self.stacks[stack]}
        elif action == "DescribeStacks":
            described = {
                "StackName": stack,
                "StackId": f"arn:aws:cloudformation:us-west-2:123456789012:stack/{stack}/0000-aa",
                "CreationTime": datetime(2026, 1, 5),
                "StackStatus": self.statuses.get(stack, "UPDATE_COMPLETE"),
            }
            result = {"Stacks": [described]}
        else:
            assert form.get("TemplateStage") == "Original", form
            body_text = json.dumps(self.templates[stack])
            result = {"TemplateBody": body_text, "StagesAvailable": ["Original", "Processed"]}
        shape = _CLOUDFORMATION.operation_model(action).output_shape
        root = ElementTree.Element(f"{action}Response", xmlns=CLOUDFORMATION_NAMESPACE)
        root.append(_query_xml(shape, result, f"{action}Result"))
        metadata = ElementTree.SubElement(root, "ResponseMetadata")
        ElementTree.SubElement(metadata, "RequestId").text = "00000000-0000-4000-8000-000000000002"
        return 200, {"Content-Type": "text/xml"}, ElementTree.tostring(root)

    @staticmethod
    def _error(code: str, message: str) -> Reply:
        root = ElementTree.Element("ErrorResponse", xmlns=CLOUDFORMATION_NAMESPACE)
        error = ElementTree.SubElement(root, "Error")
        ElementTree.SubElement(error, "Type").text = "Sender"
        ElementTree.SubElement(error, "Code").text = code
        ElementTree.SubElement(error, "Message").text = message
        ElementTree.SubElement(root, "RequestId").text = "00000000-0000-4000-8000-000000000003"
        return 400, {"Content-Type": "text/xml"}, ElementTree.tostring(root)


# --- trainctl capacity and scale: reservations that change state, Spot scores, EKS updates ------


class CapacityEc2(Ec2Front):
    """EC2 in front of moto with what `trainctl capacity` adds and moto lacks: CreateCapacityReservation,
    CancelCapacityReservation and GetSpotPlacementScores (DescribeCapacityReservations is Ec2Front's, over
    the reservations made here).

    `create_error`: (code, message) every create answers instead; `created_state`: the State a new
    reservation has, then `settles_to` after `settle_after` describes; `cancel_failures`: how many cancels
    fail (IncorrectState) before one works; `spot_scores`: AvailabilityZoneId -> score."""

    def __init__(
        self,
        moto_url: str,
        *,
        create_error: tuple[str, str] | None = None,
        created_state: str = "active",
        settles_to: str = "active",
        settle_after: int = 1,
        cancel_failures: int = 0,
        spot_scores: Mapping[str, int] | None = None,
        region: str = "us-east-2",
    ) -> None:
        super().__init__(moto_url)
        self.create_error = create_error
        self.created_state = created_state
        self.settles_to = settles_to
        self.settle_after = settle_after
        self.cancel_failures = cancel_failures
        self.spot_scores = dict(spot_scores or {})
        self.region = region
        self.created: list[dict[str, str]] = []
        """The create requests' parameters (InstanceType, AvailabilityZone, InstanceCount, EndDateType, ...)."""
        self.cancelled: list[str] = []
        self._describes: dict[str, int] = {}

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Reply:
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        action = form.get("Action", "")
        if action == "CreateCapacityReservation":
            self.calls.append(action)
            self.created.append(form)
            if self.create_error is not None:
                return ec2_error(*self.create_error)
            rid = f"cr-{len(self.created):017x}"
            self.reservations[rid] = {
                "CapacityReservationId": rid,
                "InstanceType": form["InstanceType"],
                "InstancePlatform": form["InstancePlatform"],
                "AvailabilityZone": form["AvailabilityZone"],
                "TotalInstanceCount": int(form["InstanceCount"]),
                "AvailableInstanceCount": int(form["InstanceCount"]),
                "State": self.created_state,
                "EndDateType": form.get("EndDateType"),
                "InstanceMatchCriteria": form.get("InstanceMatchCriteria"),
                "ReservationType": "default",
            }
            return (
                200,
                {"Content-Type": "text/xml"},
                ec2_response(action, {"CapacityReservation": self.reservations[rid]}),
            )
        if action == "CancelCapacityReservation":
            self.calls.append(action)
            rid = form["CapacityReservationId"]
            if self.cancel_failures > 0:
                self.cancel_failures -= 1
                # A 400 botocore does not retry by itself (a 503 it would), so trainctl's own retry shows.
                return ec2_error(
                    "IncorrectState", f"The capacity reservation '{rid}' is in a state that cannot be cancelled"
                )
            if rid not in self.reservations:
                return ec2_error(
                    "InvalidCapacityReservationId.NotFound", f"The capacity reservation ID '{rid}' does not exist"
                )
            self.reservations[rid] = {**self.reservations[rid], "State": "cancelled"}
            self.cancelled.append(rid)
            return 200, {"Content-Type": "text/xml"}, ec2_response(action, {"Return": True})
        if action == "DescribeCapacityReservations":
            for rid, reservation in self.reservations.items():
                seen = self._describes[rid] = self._describes.get(rid, 0) + 1
                if reservation["State"] == self.created_state != self.settles_to and seen >= self.settle_after:
                    self.reservations[rid] = {**reservation, "State": self.settles_to}
        if action == "GetSpotPlacementScores":
            self.calls.append(action)
            scores = [
                {"Region": self.region, "AvailabilityZoneId": zone_id, "Score": score}
                for zone_id, score in self.spot_scores.items()
            ]
            return 200, {"Content-Type": "text/xml"}, ec2_response(action, {"SpotPlacementScores": scores})
        return super().handle(method, path, headers, body)


class EksFront(Ec2Front):
    """EKS in front of moto (clusters, node groups, UpdateNodegroupConfig), answering what moto lacks:
    DescribeUpdate (GET /clusters/NAME/updates/ID?nodegroupName=), with `statuses` one after another
    (the last repeats) and `errors` on the final answer."""

    def __init__(
        self, moto_url: str, *, statuses: Sequence[str] = ("Successful",), errors: Sequence[Mapping[str, Any]] = ()
    ) -> None:
        super().__init__(moto_url)
        self.statuses = list(statuses)
        self.errors = list(errors)
        self.updates_seen: list[str] = []

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Reply:
        url = urlsplit(path)
        parts = url.path.strip("/").split("/")
        if method == "GET" and len(parts) == 4 and parts[0] == "clusters" and parts[2] == "updates":
            self.calls.append(f"DescribeUpdate {parts[3]} {url.query}")
            self.updates_seen.append(parts[3])
            index = min(len(self.updates_seen) - 1, len(self.statuses) - 1)
            status = self.statuses[index]
            final = index == len(self.statuses) - 1
            update = {
                "id": parts[3],
                "status": status,
                "type": "ConfigUpdate",
                "params": [],
                "createdAt": 1767225600,
                "errors": list(self.errors) if final else [],
            }
            return 200, {"Content-Type": "application/json"}, json.dumps({"update": update}).encode()
        self.forwarded.append(f"{method} {url.path}")
        code, reply_headers, payload = self._forward(method, path, headers, body)
        if method == "POST" and url.path.endswith("/update-config") and code == 200:
            # moto answers Successful at once; EKS answers InProgress and the update runs on.
            document = json.loads(payload)
            document["update"]["status"] = "InProgress"
            payload = json.dumps(document).encode()
        return code, reply_headers, payload
