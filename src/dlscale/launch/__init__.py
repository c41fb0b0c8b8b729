"""Launchers: start N workers (local processes or Ray actors), rendezvous, supervise, reap."""

from dlscale.errors import UserError
from dlscale.launch.base import Launcher


def check_cluster(cluster: str, address: str | None) -> None:
    """One line for an address that would be ignored: only a Ray cluster has one."""
    if address is not None and cluster != "ray":
        raise UserError(
            f"--address {address!r} names a Ray cluster's head, and --cluster is {cluster}: "
            "add --cluster ray, or leave --address out"
        )


def make_launcher(cluster: str = "local", address: str | None = None) -> Launcher:
    """`local` (the default: processes on this machine) or `ray` (actors on a Ray cluster)."""
    check_cluster(cluster, address)
    if cluster == "local":
        from dlscale.launch.local import LocalLauncher

        return LocalLauncher()
    if cluster == "ray":
        from dlscale.launch.ray import RayLauncher

        return RayLauncher(address or "auto")
    raise UserError(f"unknown cluster '{cluster}'; choose local or ray")
