"""The root command group: every error that click/typer catch becomes one line.

Typer prints a usage error (``--priority abc``, ``--max-wait -1``, a missing argument,
an unknown option) as a five-line box with the usage; this group prints the same
message as the CLI's own errors do, one line on stderr, with where to look::

    error: Invalid value for '--priority': 'abc' is not a valid integer; try
    'accelshare session create --help'          (one line; exit code 2)

Help output is plain (``rich_markup_mode=None`` on the app): help texts are shown as
written, so ``[etcd]`` or ``[default: 2g]`` in them are never taken for rich markup.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperGroup

from .common import EXIT_FAILED, print_error

__all__ = ["PROG_NAME", "CliGroup", "usage_error_line"]

PROG_NAME = "accelshare"

# click's exceptions, wherever this typer takes click from (newer typers vendor it as
# typer._click; older ones use the click package).
_errors = importlib.import_module(typer.BadParameter.__module__)
_ABORTS: tuple[type[BaseException], ...] = (typer.Abort, getattr(_errors, "Abort", typer.Abort))


def usage_error_line(error: Any) -> str:
    """``Invalid value for '--priority': ...; try 'accelshare session create --help'``."""
    message = " ".join(error.format_message().split()).rstrip(".")
    path = error.ctx.command_path if error.ctx is not None else PROG_NAME
    return f"{message}; try '{path} --help'"


class CliGroup(TyperGroup):
    """Runs the command line in click's non-standalone mode and reports errors itself."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        prog_name = prog_name or PROG_NAME  # not "python -m accelshare.client.cli"
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        try:
            result = super().main(
                args, prog_name, complete_var, False, windows_expand_args, **extra
            )
        except _errors.NoArgsIsHelpError as e:  # `accelshare session`: its help
            e.show()
            sys.exit(e.exit_code)
        except _errors.UsageError as e:
            print_error(usage_error_line(e))
            sys.exit(e.exit_code)
        except _errors.ClickException as e:
            print_error(" ".join(e.format_message().split()))
            sys.exit(e.exit_code)
        except _ABORTS:
            print_error("aborted")
            sys.exit(EXIT_FAILED)
        # Non-standalone mode returns the code of a typer.Exit (or the command's value).
        sys.exit(result if isinstance(result, int) else 0)
