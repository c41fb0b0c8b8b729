"""Launchers: start N workers (local processes or Ray actors), rendezvous, supervise, reap."""

from dlscale.launch.base import Launcher, WorkerContext, WorkerFailed

__all__ = ["Launcher", "WorkerContext", "WorkerFailed", "make_launcher"]


def make_launcher(cluster: str = "local", address: str | None = None) -> Launcher:
    """`local` (the default: processes on this machine) or `ray` (actors on a Ray cluster)."""
    if cluster == "local":
        from dlscale.launch.local import LocalLauncher

        return LocalLauncher()
    if cluster == "ray":
        from dlscale.launch.ray import RayLauncher

        return RayLauncher(address or "auto")
    from dlscale.errors import UserError

    raise UserError(f"unknown cluster '{cluster}'; choose local or ray")
