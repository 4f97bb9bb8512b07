"""Pod addresses for a rehearsal: a private bridge network, or distinct loopback addresses.

Bridge (the default where the machine allows it): one "hub" network namespace, created for the
run and holding a Linux bridge with GATEWAY, and one veth pair per pod whose pod end is `eth0` in
the pod's own network namespace, created there directly (`ip link add ... peer name eth0 netns PID`).
Nothing is created in the host's network namespace, the hub does not forward (a new namespace
starts with ip_forward=0) and has no route anywhere else, so no packet leaves these namespaces.
Pods get a default route via the bridge address because Ray finds its node IP by routing (a UDP
`connect` that sends nothing), as on a real cluster.

Loopback (fallback where namespaces or bridges cannot be made): every pod runs in the host's
network namespace with its own 127.0.0.0/8 address in its /etc/hosts; pods then share ports,
which the report states.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import subprocess
import threading
import time
from typing import Protocol

SUBNET = ipaddress.IPv4Network("10.244.0.0/16")
GATEWAY = SUBNET.network_address + 1
BRIDGE = "rh0"
CLONE_NEWNET = 0x40000000


class NetworkError(RuntimeError):
    pass


class Network(Protocol):
    kind: str
    isolated: bool

    def allocate(self) -> str: ...

    def pod_config(self, address: str) -> dict[str, object] | None: ...

    def attach(self, namespace_pid: int) -> None: ...

    def listen(self) -> tuple[socket.socket, str]:
        """A listening TCP socket the pods can reach (the rehearsal's API server), and the address they use."""
        ...

    def close(self) -> None: ...


def _run(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {result.stderr.strip() or result.returncode}")


class BridgeNetwork:
    kind = "bridge"
    isolated = True

    def __init__(self) -> None:
        self._next = int(GATEWAY) + 1
        self._links = 0
        self._hub = subprocess.Popen(["unshare", "--net", "--", "sleep", "infinity"])
        own = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        while True:
            try:
                if os.readlink(f"/proc/{self._hub.pid}/ns/net") != own:
                    break
            except FileNotFoundError:
                pass
            if self._hub.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise NetworkError("could not create the hub network namespace (unshare --net)")
            time.sleep(0.01)
        try:
            self._hub_ip("link", "add", BRIDGE, "type", "bridge")
            self._hub_ip("addr", "add", f"{GATEWAY}/{SUBNET.prefixlen}", "dev", BRIDGE)
            self._hub_ip("link", "set", BRIDGE, "up")
        except NetworkError:
            self.close()
            raise

    def _hub_ip(self, *args: str) -> None:
        _run(["nsenter", f"--net=/proc/{self._hub.pid}/ns/net", "ip", *args])

    def allocate(self) -> str:
        address = ipaddress.IPv4Address(self._next)
        if address not in SUBNET or address == SUBNET.broadcast_address:
            raise NetworkError(f"out of pod addresses in {SUBNET}")
        self._next += 1
        return str(address)

    def pod_config(self, address: str) -> dict[str, object]:
        return {"address": address, "prefix": SUBNET.prefixlen, "gateway": str(GATEWAY)}

    def attach(self, namespace_pid: int) -> None:
        """A veth pair: one end on the bridge in the hub, `eth0` in the pod's network namespace."""
        self._links += 1
        link = f"rhv{self._links}"
        self._hub_ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", str(namespace_pid))
        self._hub_ip("link", "set", link, "master", BRIDGE)
        self._hub_ip("link", "set", link, "up")

    def listen(self) -> tuple[socket.socket, str]:
        """A socket on the gateway address inside the hub: made by a thread that joins the hub's network namespace
        (setns(2) moves only the calling thread; a socket stays in the namespace it was made in)."""
        made: list[socket.socket | BaseException] = []

        def make() -> None:
            libc = ctypes.CDLL(None, use_errno=True)
            hub = os.open(f"/proc/{self._hub.pid}/ns/net", os.O_RDONLY)
            try:
                if libc.setns(hub, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns into the hub network namespace")
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.bind((str(GATEWAY), 0))
                sock.listen(64)
                made.append(sock)
            except BaseException as exc:  # handed to the caller
                made.append(exc)
            finally:
                os.close(hub)

        # The thread ends in the hub's namespace and is gone; no other thread ever left the host's.
        thread = threading.Thread(target=make, name="hub-listen")
        thread.start()
        thread.join()
        result = made[0]
        if isinstance(result, BaseException):
            raise NetworkError(f"could not listen in the hub network namespace: {result}")
        return result, str(GATEWAY)

    def close(self) -> None:
        if self._hub.poll() is None:
            self._hub.kill()
        self._hub.wait()


class LoopbackNetwork:
    kind = "loopback"
    isolated = False

    def __init__(self) -> None:
        self._next = int(ipaddress.IPv4Address("127.10.0.1"))

    def allocate(self) -> str:
        address = str(ipaddress.IPv4Address(self._next))
        self._next += 1
        return address

    def pod_config(self, address: str) -> None:
        return None

    def attach(self, namespace_pid: int) -> None:
        return None

    def listen(self) -> tuple[socket.socket, str]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        return sock, "127.0.0.1"

    def close(self) -> None:
        return None


def open_network(*, loopback: bool = False) -> tuple[Network, str | None]:
    """The bridge network, or the loopback fallback and the reason the bridge could not be made (`loopback`:
    the fallback on purpose, to rehearse it where the bridge works)."""
    if loopback:
        return LoopbackNetwork(), "pods share the host network on 127.10.0.0/16 (loopback network chosen)"
    try:
        return BridgeNetwork(), None
    except (NetworkError, OSError) as exc:
        return LoopbackNetwork(), f"no private pod network ({exc}); pods share the host network on 127.10.0.0/16"
