"""Which network interface a worker's collectives use, and whether the hosts reach each other.

gloo and NCCL pick the address they announce to their peers from the host name unless told
which interface to use; on a stock Debian host the name resolves to 127.0.1.1, so the peers on
other hosts are told to connect to a loopback address and time out a minute later. A worker
placed by Ray knows the address its node joined the cluster with: the interface holding it is
the one every peer can reach. `bind_to` names it in `GLOO_SOCKET_IFNAME` and
`NCCL_SOCKET_IFNAME`, unless the user set them.

Before training, `probe_listen` and `probe_reach` check that each host accepts a TCP
connection from every other, so that a firewall or a wrong address fails in seconds with both
addresses and the port named, not with gloo's timeout.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import struct
from pathlib import Path

try:
    import fcntl
except ImportError:  # not a POSIX system: no interface is found, and nothing is bound
    fcntl = None

IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
REACH_TIMEOUT_S = 3.0
SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def interface_for(address: str) -> str | None:
    """The name of the network interface that holds `address`, or None if none does here."""
    try:
        wanted = ipaddress.ip_address(address)
    except ValueError:
        return None
    for name, held in interface_addresses():
        if held == wanted:
            return name
    return None


def interface_addresses() -> list[tuple[str, ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    """(interface, address) for every address this host holds (Linux: IPv4 from the kernel's
    SIOCGIFADDR, IPv6 from /proc/net/if_inet6; elsewhere none)."""
    found = []
    with (
        contextlib.suppress(OSError, AttributeError),
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe,
    ):
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            with contextlib.suppress(OSError):
                answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
                found.append((name, ipaddress.IPv4Address(answer[20:24])))
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            fields = line.split()
            if len(fields) == 6:
                found.append((fields[5], ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
    return found


def bind_to(address: str, environ: dict | None = None) -> dict[str, str]:
    """Point gloo and NCCL at the interface holding `address`; a variable already set (the
    user's own choice) is kept. Returns the variables in force, for the run record."""
    environ = os.environ if environ is None else environ
    interface = interface_for(address)
    if interface is not None:
        for variable in IFNAME_VARIABLES:
            environ.setdefault(variable, interface)
    return {v: environ[v] for v in IFNAME_VARIABLES if v in environ}


class Listener:
    """A TCP socket listening on `address` (any free port) for the reachability probe: the
    kernel completes a peer's connection without anyone calling accept."""

    def __init__(self, address: str):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.bind((address, 0))
        self.socket.listen(64)
        self.port = self.socket.getsockname()[1]

    def close(self) -> None:
        self.socket.close()


def reach(address: str, port: int, timeout: float = REACH_TIMEOUT_S) -> str | None:
    """None if `address:port` accepts a TCP connection within `timeout`, else why not."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return None
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)
