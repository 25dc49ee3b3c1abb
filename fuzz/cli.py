"""`maskfuzz` command line: one module per subcommand under `fuzz/commands/`.

Each command module exposes `register(subparsers)` (adds its parser and sets `func`) and its
`func(args) -> int` returns the exit code: 0 clean, 1 findings / failures, 2 usage or set-up error.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("fuzz", "targets", "replay", "bisect", "repro", "validate", "report")


class UsageError(Exception):
    """A usage or set-up error: the message says what is wrong and what to do (exit code 2)."""


def require_device(device: str, available: bool | None = None) -> None:
    """UsageError when `device` is a CUDA device and torch sees none: running anyway would blame
    every target for the missing GPU (or skip everything and look like a pass)."""
    if not device.startswith("cuda"):
        if device != "cpu":
            raise UsageError(f"--device {device!r}: expected cpu or cuda (cuda:N)")
        return
    import torch

    if available is None:
        available = torch.cuda.is_available()
    if not available:
        raise UsageError(
            f"--device {device}: torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False); "
            "run on a GPU machine with a CUDA build of torch, or use --device cpu"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="maskfuzz",
        description="Differential fuzzing of masked GAE advantage estimation in RL frameworks.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"maskfuzz.fuzz.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"maskfuzz.fuzz.commands.{name}":
                raise
            continue  # not built yet
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"maskfuzz {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
