"""Two or three hosts on one machine: network namespaces joined by a switch, each host with a
host name of its own, an optionally rate-shaped link, and a Ray node on each.

Each host is a network namespace (`ip netns`) holding one end of a veth pair named `dl0` with
the address 10.77.0.(i+1)/24; the other ends hang on a bridge inside a namespace of their own
(the switch). Nothing is routed out: traffic stays in the namespaces made here. Every command
a host runs goes through `unshare --uts --mount`: a host name of its own (host-a, host-b, ...),
and an /etc/hosts that maps that name to 127.0.1.1, as a stock Debian host does (which is what
makes gloo pick a loopback address unless told which interface to use). `tc qdisc ... tbf`
shapes each host's outgoing rate when `rate` is given (netem is not in this kernel).

Everything is removed on exit, also when a test fails: the Ray processes (their process groups,
then every process left in a namespace), the namespaces and with them their veths.

    with Testbed(hosts=2, rate="200mbit") as bed:
        bed.start_ray()
        bed.run(0, ["dlscale", "train", ...])   # on host-a
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

SUBNET = "10.77.0"
IFNAME = "dl0"
RAY_PORT = 6379
# Every port a Ray node listens on, fixed (Ray picks most at random otherwise), so that a
# firewall can let Ray through and keep everything else out: "Two machines" in docs/cluster.md
# lists them.
RAY_NODE_PORTS = [
    "--node-manager-port=6380",
    "--object-manager-port=6381",
    "--dashboard-agent-grpc-port=6382",
    "--dashboard-agent-listen-port=6383",
    "--runtime-env-agent-port=6384",
    "--metrics-export-port=6385",
    "--min-worker-port=10002",
    "--max-worker-port=10999",
]
RAY_PORTS = "6379:6385,10001:10999"  # the same, for iptables --dports


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


def why_not_here() -> str | None:
    """None where this machine can build the testbed, else the reason it cannot."""
    if os.geteuid() != 0:
        return "the two-host testbed needs root (network namespaces)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"the two-host testbed needs '{tool}' (iproute2, util-linux)"
    probe = f"dlprobe{uuid.uuid4().hex[:6]}"
    made = _sh("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"this machine forbids network namespaces: {made.stderr.strip()}"
    _sh("ip", "netns", "delete", probe, check=False)
    return None


class Host:
    def __init__(self, bed: Testbed, index: int):
        self.index = index
        self.name = f"host-{chr(ord('a') + index)}"
        self.netns = f"{bed.tag}{chr(ord('a') + index)}"
        self.address = f"{SUBNET}.{index + 1}"
        self.hosts_file = bed.root / f"{self.name}.hosts"
        self.hosts_file.write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{self.name}\n")
        self.disk = bed.root / f"disk-{self.name}"  # seen by this host alone, at bed.local
        self.disk.mkdir()
        self.local = bed.local

    def prefix(self) -> list[str]:
        """A command run as this host: its network, host name, /etc/hosts and local disk."""
        inner = (
            f"mount --bind {self.hosts_file} /etc/hosts && "
            f"mount --bind {self.disk} {self.local} && hostname {self.name} && "
            'exec "$0" "$@"'
        )
        unshare = ["unshare", "--uts", "--mount", "--propagation", "private"]
        return ["ip", "netns", "exec", self.netns, *unshare, "sh", "-c", inner]


class Testbed:
    def __init__(self, hosts: int = 2, rate: str | None = None, cpus_per_host: int = 2):
        self.count, self.rate, self.cpus = hosts, rate, cpus_per_host
        self.tag = f"dl{uuid.uuid4().hex[:5]}"
        self.switch = f"{self.tag}sw"
        self.root = Path(tempfile.mkdtemp(prefix="dlscale-testbed-"))
        self.local = self.root / "local"  # each host's own local disk (a folder of its own)
        self.local.mkdir()
        self.hosts: list[Host] = []
        self.ray: list[subprocess.Popen] = []

    # ------------------------------------------------------------------ network

    def __enter__(self) -> Testbed:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _build(self) -> None:
        _sh("ip", "netns", "add", self.switch)
        sw = ["ip", "netns", "exec", self.switch]
        _sh(*sw, "ip", "link", "add", "br0", "type", "bridge")
        _sh(*sw, "ip", "link", "set", "br0", "up")
        for index in range(self.count):
            host = Host(self, index)
            self.hosts.append(host)
            _sh("ip", "netns", "add", host.netns)
            outer, inner = f"{self.tag}p{index}", f"{self.tag}h{index}"
            _sh("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
            _sh("ip", "link", "set", outer, "netns", self.switch)
            _sh("ip", "link", "set", inner, "netns", host.netns)
            _sh(*sw, "ip", "link", "set", outer, "master", "br0")
            _sh(*sw, "ip", "link", "set", outer, "up")
            ns = ["ip", "netns", "exec", host.netns]
            _sh(*ns, "ip", "link", "set", inner, "name", IFNAME)
            _sh(*ns, "ip", "addr", "add", f"{host.address}/24", "dev", IFNAME)
            _sh(*ns, "ip", "link", "set", IFNAME, "up")
            _sh(*ns, "ip", "link", "set", "lo", "up")
            if self.rate:
                self.shape(index, self.rate)

    def shape(self, index: int, rate: str | None) -> None:
        """Host `index` sends at most `rate` (tc's units: 100mbit, 1gbit; None: unshaped)."""
        ns = ["ip", "netns", "exec", self.hosts[index].netns]
        if rate is None:
            _sh(*ns, "tc", "qdisc", "del", "dev", IFNAME, "root", check=False)
            return
        tbf = ["tbf", "rate", rate, "burst", "256kb", "latency", "50ms"]
        _sh(*ns, "tc", "qdisc", "replace", "dev", IFNAME, "root", *tbf)

    def firewall(self, index: int, closed: bool) -> None:
        """Host `index` drops every incoming TCP connection except Ray's own ports (or, with
        `closed` False, accepts everything again)."""
        ns = ["ip", "netns", "exec", self.hosts[index].netns, "iptables"]
        _sh(*ns, "-F", "INPUT")
        if closed:
            ray_ports = ["-m", "multiport", "--dports", RAY_PORTS]
            _sh(*ns, "-A", "INPUT", "-i", IFNAME, "-p", "tcp", *ray_ports, "-j", "ACCEPT")
            _sh(*ns, "-A", "INPUT", "-i", IFNAME, "-p", "tcp", "--syn", "-j", "DROP")

    def link(self, index: int, up: bool) -> None:
        """Unplug (or plug back) host `index`'s cable."""
        ns = ["ip", "netns", "exec", self.hosts[index].netns]
        _sh(*ns, "ip", "link", "set", IFNAME, "up" if up else "down")

    # ------------------------------------------------------------------ processes

    def command(self, index: int, argv: list[str]) -> list[str]:
        return [*self.hosts[index].prefix(), *argv]

    def popen(self, index: int, argv: list[str], **kwargs) -> subprocess.Popen:
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(self.command(index, argv), **kwargs)

    def run(self, index: int, argv: list[str], timeout: float = 600, **kwargs):
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(index, argv), timeout=timeout, **kwargs)

    @property
    def address(self) -> str:
        """The Ray head's address, as a user passes it to --address."""
        return f"{self.hosts[0].address}:{RAY_PORT}"

    def start_ray(self, ray: str, env: dict | None = None, timeout: float = 90) -> None:
        """A Ray head on host-a and a worker node on every other host, each with `cpus` CPUs."""
        self.ray_bin, self.ray_env = ray, {**os.environ, **(env or {})}
        for host in self.hosts:
            self.ray.append(self._start_node(host))
            if host.index == 0:
                self._wait_for_head(timeout)
        self._wait_for_nodes(timeout)

    def restart_ray(self, index: int, timeout: float = 90) -> None:
        """Host `index`'s Ray node started again (after a fault ended it), joined once more."""
        self.kill_ray(index)
        self.kill_all(index)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.ray[index].wait(timeout=15)
        self.ray[index] = self._start_node(self.hosts[index])
        self._wait_for_nodes(timeout)

    def _start_node(self, host: Host) -> subprocess.Popen:
        common = ["--num-cpus", str(self.cpus), "--disable-usage-stats", "--block"]
        role = (
            ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"]
            if host.index == 0
            else [f"--address={self.address}"]
        )
        log = open(self.root / f"ray-{host.name}.log", "a")  # noqa: SIM115
        where = [f"--node-ip-address={host.address}", f"--temp-dir={self.root / host.name}"]
        argv = [self.ray_bin, "start", *role, *where, *common, *RAY_NODE_PORTS]
        return self.popen(host.index, argv, stdout=log, stderr=log, env=self.ray_env)

    def _wait_for_head(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            target = f"/dev/tcp/{self.hosts[0].address}/{RAY_PORT}"
            probe = self.run(0, ["bash", "-c", f"exec 3<>{target}"])
            if probe.returncode == 0:
                return
            if self.ray[0].poll() is not None:
                break
            time.sleep(0.5)
        raise RuntimeError(f"the Ray head did not start: {self.log(0)[-2000:]}")

    def alive(self) -> list[str] | None:
        """The addresses of the live Ray nodes, as the head knows them (None: no answer)."""
        python, env = str(Path(self.ray_bin).with_name("python")), self.ray_env
        listing = (
            "import ray; ray.init(address='auto', logging_level='ERROR'); "
            "print(*sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']))"
        )
        found = self.run(0, [python, "-c", listing], env={**env, "RAY_ADDRESS": self.address})
        lines = found.stdout.strip().splitlines()
        return lines[-1].split() if found.returncode == 0 and lines else None

    def _wait_for_nodes(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.alive() == sorted(host.address for host in self.hosts):
                return
            if any(proc.poll() is not None for proc in self.ray):
                break
            time.sleep(1)
        logs = "".join(self.log(i)[-1500:] for i in range(self.count))
        raise RuntimeError(f"{self.count} Ray nodes did not join: {logs}")

    def log(self, index: int) -> str:
        path = self.root / f"ray-{self.hosts[index].name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill_ray(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Kill host `index`'s Ray node (its raylet and everything under it)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.ray[index].pid, sig)

    def kill_all(self, index: int) -> None:
        """Every process host `index` runs, killed (all of them live in its namespace)."""
        for _ in range(5):
            pids = self.pids(index)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)

    def pids(self, index: int) -> list[int]:
        found = _sh("ip", "netns", "pids", self.hosts[index].netns, check=False)
        return [int(p) for p in found.stdout.split()]

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        for proc in self.ray:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.ray:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
        for host in self.hosts:  # whatever a host still runs (Ray's workers, a driver)
            self.kill_all(host.index)
        for proc in self.ray:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        for host in self.hosts:
            _sh("ip", "netns", "delete", host.netns, check=False)
        _sh("ip", "netns", "delete", self.switch, check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What of this testbed still exists (namespaces, processes): empty after close()."""
        names = _sh("ip", "netns", "list", check=False).stdout
        return [line.split()[0] for line in names.splitlines() if line.startswith(self.tag)]
