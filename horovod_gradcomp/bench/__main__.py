"""Command line: ``python -m horovod_gradcomp.bench <command> [options]``.

A command is a module listed in :data:`COMMAND_MODULES` that defines ``COMMAND`` (its
name), ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``. Adding the
``exchange`` or ``pipeline`` benchmark is one new module and one line here. Command
modules are imported to build the parser, so they should defer heavy imports (Horovod,
MPI) to ``run``.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

#: Modules providing the subcommands, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "horovod_gradcomp.bench.codecs_bench",
    "horovod_gradcomp.bench.devtime_bench",
    "horovod_gradcomp.bench.exchange_bench",
    "horovod_gradcomp.bench.pipeline_bench",
    "horovod_gradcomp.bench.overlap_bench",
    "horovod_gradcomp.bench.schemes_bench",
    "horovod_gradcomp.bench.memory_bench",
    "horovod_gradcomp.bench.model_command",
    "horovod_gradcomp.bench.tta_bench",
    "horovod_gradcomp.bench.fsdp_bench",
    "horovod_gradcomp.bench.fsdp_accuracy",
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per command module."""
    parser = argparse.ArgumentParser(prog="python -m horovod_gradcomp.bench",
                                     description="horovod_gradcomp benchmarks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        module = importlib.import_module(module_name)
        cmd = sub.add_parser(module.COMMAND, help=module.HELP, description=module.__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(cmd)
        cmd.set_defaults(run_command=module.run)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), run the command, return its exit status."""
    args = build_parser().parse_args(argv)
    return args.run_command(args)


if __name__ == "__main__":
    sys.exit(main())
