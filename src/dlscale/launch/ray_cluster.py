"""Joining a Ray cluster and what every Ray launcher needs from it: reachability, the
token, room for the workers, and the queue their events come back through."""

from __future__ import annotations

import signal
import socket
import threading

from dlscale.errors import UserError, one_line
from dlscale.launch.base import Resources
from dlscale.launch.netbind import interface_addresses
from dlscale.launch.ray_auth import authenticate, forget

CONNECT_TIMEOUT_S = 5.0  # a cluster head that does not accept a TCP connection by then is down


def import_ray():
    try:
        import ray
    except ImportError:
        raise UserError(
            "--cluster ray needs Ray: pip install 'dlscale[ray]' (or ray) on every node"
        ) from None
    return ray


def init_keeping_sigterm(ray, **kwargs) -> None:
    """`ray.init(**kwargs)`, this process's SIGTERM handler left as it was. ray.init installs its
    own (`sys.exit(15)`), which would end a dlscale command by SIGTERM without its cleanup and
    with exit 15 (signals.py: SIGTERM takes Ctrl-C's path): `serve-model` SIGTERMed the moment
    its model first answered exited 15 in a fresh-clone suite, before the command had set its
    handler back."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(**kwargs)
    finally:
        # None: a handler not set from Python, which Python cannot put back.
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)


def leave(ray) -> None:
    """Disconnect what `connect` connected, and the token mode it may have turned on."""
    ray.shutdown()
    forget()


def check_reachable(address: str) -> None:
    """A HOST:PORT address must accept a TCP connection; fail in seconds, not minutes."""
    if address == "auto":
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--address must be 'auto' or HOST:PORT of the Ray head (got '{address}')")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise UserError(
            f"the Ray cluster at {address} does not answer ({exc.strerror or exc}); "
            "is `ray start --head` running there?"
        ) from None


def events_queue(ray):
    """The queue workers send events through, as an actor on the driver's own node: a queue on
    another host would die with that host and take every other worker's events with it."""
    from ray.util.queue import Queue
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    options: dict = {"num_cpus": 0}
    here = own_node(ray)
    if here is not None:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(here["NodeID"], soft=False)
    return Queue(actor_options=options)


def own_node(ray) -> dict | None:
    """The live node this process's host is (an address of one of its interfaces), else the
    head node. Ray's own guess goes by the route to the internet, which a cluster on a private
    network may not have: it then names another node."""
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    mine = {str(address) for _, address in interface_addresses()}
    for node in nodes:
        if node["NodeManagerAddress"] in mine:
            return node
    for node in nodes:
        if "node:__internal_head__" in node.get("Resources", {}):
            return node
    return None


def connect(ray, address: str) -> bool:
    """Join the cluster at `address` unless this process has; whether it joined here."""
    if ray.is_initialized():
        return False
    check_reachable(address)
    authenticate(address)  # a token-authenticated head: its token, or one line why not
    try:
        init_keeping_sigterm(ray, address=address, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as exc:
        forget()
        raise UserError(f"cannot join the Ray cluster at '{address}': {one_line(exc)}") from None
    return True


def check_capacity(ray, resources: list[Resources]) -> None:
    """One line if the cluster has too few CPUs or GPUs for `resources` in all."""
    total = ray.cluster_resources()
    for kind, wanted in (
        ("CPU", [r.cpus for r in resources]),
        ("GPU", [r.gpus for r in resources]),
    ):
        have, need = total.get(kind, 0.0), sum(wanted)
        if need > have:
            users = sum(1 for w in wanted if w)
            raise UserError(
                f"the Ray cluster has {have:g} {kind}s; {users} workers needing {need:g} "
                f"{kind}s in all cannot be placed (add nodes, or lower strategy.workers)"
            )
