"""What every API command shares: the client, error lines, JSON output, spinners.

Exit codes: 0 success; 1 the server refused or failed (one ``error: ...`` line on
stderr with the server's detail and what to do next); 2 bad arguments found before
anything was sent (one ``error: ...`` line too).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from accelshare.client.client import AccelshareClient
from accelshare.client.config import ClientConfigError, load_client_config
from accelshare.client.errors import APIError, ClientError, ConnectionFailed, GraphQLError

__all__ = [
    "EXIT_FAILED",
    "EXIT_USAGE",
    "JsonOption",
    "call_api",
    "console",
    "fail",
    "print_error",
    "print_json",
    "spinner",
]

T = TypeVar("T")

EXIT_FAILED = 1
EXIT_USAGE = 2

JsonOption = Annotated[
    bool, typer.Option("--json", help="Print JSON instead of tables (for scripts).")
]

_HINTS = {
    401: "check ACCELSHARE_ACCESS_KEY / ACCELSHARE_SECRET_KEY (local cluster: "
    "`source .accelshare/client.env`) and this machine's clock",
    403: "this needs a keypair with a higher role (the local cluster's client.env holds "
    "the superadmin's)",
}


def console() -> Console:
    """stdout; piped output keeps whole lines (ids are long), a terminal uses its width."""
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def print_error(message: str) -> None:
    """One ``error: ...`` line on stderr (red on a terminal; never wrapped)."""
    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"[red]error:[/red] {escape(message)}"
    )


def fail(message: str, *, code: int = EXIT_FAILED) -> NoReturn:
    """One ``error: ...`` line on stderr, then exit with ``code``."""
    print_error(message)
    raise typer.Exit(code)


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))


def describe_api_error(e: APIError, hint: str | None = None) -> str:
    detail = e.detail or e.title
    text = f"{detail} (HTTP {e.status})"
    extra = hint or _HINTS.get(e.status)
    return f"{text}; {extra}" if extra else text


@contextmanager
def spinner(message: str, *, enabled: bool = True) -> Iterator[None]:
    """A spinner on stderr while waiting (only on a terminal)."""
    err = Console(stderr=True)
    if not enabled or not err.is_terminal:
        yield
        return
    with err.status(message):
        yield


def call_api(
    work: Callable[[AccelshareClient], Awaitable[T]],
    *,
    not_found_hint: str | None = None,
) -> T:
    """Run ``work`` with a client configured from the environment; errors become one
    line and a non-zero exit (``not_found_hint`` is added to a 404)."""

    async def run() -> T:
        async with AccelshareClient(load_client_config()) as client:
            return await work(client)

    try:
        return asyncio.run(run())
    except ClientConfigError as e:
        fail(str(e))
    except APIError as e:
        fail(describe_api_error(e, not_found_hint if e.status == 404 else None))
    except GraphQLError as e:
        print_json(e.result)
        fail(f"the GraphQL query failed: {e}")
    except ConnectionFailed as e:
        fail(str(e))
    except ClientError as e:  # pragma: no cover - every subclass is handled above
        fail(str(e))
    except TimeoutError:
        fail("timed out waiting for the manager; see `accelshare session list`")
