"""run.json's `ps` section: the servers' statistics, summed and per server."""

from __future__ import annotations

from collections import Counter

from dlscale.jobspec import PsStrategy


def ps_sections(strategy: PsStrategy, servers: list[dict], shards: list[list[int]]) -> dict:
    """{'ps': ...} once the servers have reported (at the end of training), else {}."""
    if not servers:
        return {}
    staleness: Counter[int] = Counter()
    for server in servers:
        staleness.update({int(k): v for k, v in server["staleness"].items()})
    updates = sum(s["updates"] for s in servers)
    server_wall = max(s["wall_s"] for s in servers)
    pushes = sum(staleness.values())
    return {
        "ps": {
            "mode": strategy.mode,
            "workers": strategy.workers,
            "servers": strategy.servers,
            "data_plane": servers[0]["data_plane"],
            "updates": updates,
            "updates_per_s": updates / server_wall if server_wall else 0.0,
            "bytes_per_s": sum(s["bytes_per_s"] for s in servers),
            "staleness_histogram": {str(k): v for k, v in sorted(staleness.items())},
            "mean_staleness": sum(k * v for k, v in staleness.items()) / pushes if pushes else 0.0,
            "max_staleness": max(staleness) if staleness else 0,
            # How far the fastest worker got ahead of the slowest (pushes, or averaging rounds).
            "max_clock_gap": max(s["max_clock_gap"] for s in servers),
            "dropped_workers": sorted({w for s in servers for w in s["dropped_workers"]}),
            "per_server": [
                {
                    "shard": s["shard"],
                    "host": s.get("host"),  # where the server ran, by name and address
                    "address": s.get("address"),
                    "tensors": len(indices),
                    "elements": s["elements"],
                    "updates": s["updates"],
                    "updates_per_s": s["updates_per_s"],
                    "bytes_in": s["bytes_in"],
                    "bytes_out": s["bytes_out"],
                    "bytes_per_s": s["bytes_per_s"],
                    "staleness_wait_s": s["staleness_wait_s"],
                    "peak_memory_bytes": s["peak_memory_bytes"],
                }
                for s, indices in zip(servers, shards, strict=True)
            ],
        }
    }
