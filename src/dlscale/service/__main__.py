"""`python -m dlscale.service --data-dir DIR --port N [...]`: the server without the CLI's
imports (tests and containers start it this way; `dlscale serve` is the documented door)."""

import argparse

from dlscale.errors import UserError
from dlscale.service.app import serve
from dlscale.service.config import ServiceConfig


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m dlscale.service")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--db", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--cpu-slots", type=int, default=1)
    parser.add_argument("--gpu-slots", type=int, default=0)
    parser.add_argument("--allow-remote", action="store_true")
    args = parser.parse_args()
    try:
        config = ServiceConfig(
            data_dir=args.data_dir,
            db_url=args.db,
            cpu_slots=args.cpu_slots,
            gpu_slots=args.gpu_slots,
        )
        serve(config, args.host, args.port, args.allow_remote)
    except UserError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
