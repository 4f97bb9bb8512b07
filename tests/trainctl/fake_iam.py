"""IAM on loopback refusing every call, as IAM answers a caller without iam:GetRole / iam:GetUser.

moto's IAM allows everything, so the "access denied" path of the admin check needs this: IAM's
query protocol, HTTP 403 and an ErrorResponse with code AccessDenied.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import parse_qs
from xml.etree import ElementTree

from tests.trainctl.fake_aws import LoopbackStub, Reply

IAM_NAMESPACE = "https://iam.amazonaws.com/doc/2010-05-08/"


class IamDenied(LoopbackStub):
    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Reply:
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        action = form.get("Action", "")
        self.calls.append(action)
        root = ElementTree.Element("ErrorResponse", xmlns=IAM_NAMESPACE)
        error = ElementTree.SubElement(root, "Error")
        ElementTree.SubElement(error, "Type").text = "Sender"
        ElementTree.SubElement(error, "Code").text = "AccessDenied"
        ElementTree.SubElement(
            error, "Message"
        ).text = f"User: arn:aws:iam::123456789012:user/ci is not authorized to perform: iam:{action}"
        ElementTree.SubElement(root, "RequestId").text = "00000000-0000-4000-8000-000000000004"
        return 403, {"Content-Type": "text/xml"}, ElementTree.tostring(root)
