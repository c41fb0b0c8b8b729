"""`python -m dlscale.service --data-dir DIR --port N [...]`: the server without the CLI's
imports (tests and containers start it this way; `dlscale serve` is the documented door)."""

import argparse

from dlscale.errors import UserError
from dlscale.service.app import serve
from dlscale.service.config import ServiceConfig
from dlscale.units import parse_bytes


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m dlscale.service")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--db", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--cpu-slots", type=int, default=1)
    parser.add_argument("--gpu-slots", type=int, default=0)
    parser.add_argument("--allow-remote", action="store_true")
    parser.add_argument("--unsafe-single-user", action="store_true")
    parser.add_argument("--memory-per-slot", default=None)
    parser.add_argument("--max-queued-jobs", type=int, default=100)
    parser.add_argument("--executor", default="process")  # or container (service/container.py)
    parser.add_argument("--image", default=None)  # the container executor's image
    args = parser.parse_args()
    try:
        config = ServiceConfig(
            data_dir=args.data_dir,
            db_url=args.db,
            cpu_slots=args.cpu_slots,
            gpu_slots=args.gpu_slots,
            unsafe_single_user=args.unsafe_single_user,
            memory_per_slot_bytes=_bytes(args.memory_per_slot),
            max_queued_jobs=args.max_queued_jobs,
            executor=args.executor,
            image=args.image,
        )
        serve(config, args.host, args.port, args.allow_remote)
    except UserError as exc:
        raise SystemExit(f"error: {exc}") from None


def _bytes(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise SystemExit(f"error: --memory-per-slot: {exc}") from None


if __name__ == "__main__":
    main()
