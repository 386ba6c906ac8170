"""``accelshare admin ...``: keypairs, users, resource policies, scaling groups, GraphQL.

Admins manage the users and keypairs of their domain; policies and scaling groups
need a superadmin.  Slot amounts are ``KEY=VALUE`` (``--slots cpu=4 --slots mem=8g``;
``inf`` = unlimited).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, Protocol, TypeVar

import typer
from rich.table import Table

from accelshare.client.client import AccelshareClient
from accelshare.client.models import ScalingGroupAssociations, UserInfo

from .args import ArgumentError, parse_json_pairs, parse_pairs
from .common import EXIT_USAGE, JsonOption, call_api, console, fail, print_json
from .image import admin_image_app

admin_app = typer.Typer(
    help="Administration: keypairs, users, resource policies, scaling groups, GraphQL.",
    no_args_is_help=True,
)
keypair_app = typer.Typer(help="Keypairs (API credentials) of users.", no_args_is_help=True)
user_app = typer.Typer(help="Users.", no_args_is_help=True)
policy_app = typer.Typer(help="Keypair resource policies (quotas, limits).", no_args_is_help=True)
scaling_group_app = typer.Typer(
    help="Scaling groups (agent pools, scheduler options).", no_args_is_help=True
)
admin_app.add_typer(keypair_app, name="keypair")
admin_app.add_typer(user_app, name="user")
admin_app.add_typer(policy_app, name="policy")
admin_app.add_typer(scaling_group_app, name="sgroup")
admin_app.add_typer(admin_image_app, name="image")

T = TypeVar("T")

SlotsOption = Annotated[
    list[str] | None,
    typer.Option("--slots", help="KEY=VALUE per slot (repeat): --slots cpu=4 --slots mem=8g."),
]


def _slots(values: Sequence[str] | None, option: str = "--slots") -> dict[str, str] | None:
    if not values:
        return None
    try:
        return parse_pairs(values, option, "cpu=4")
    except ArgumentError as e:
        fail(str(e), code=EXIT_USAGE)


class _Row(Protocol):
    def to_json(self) -> dict[str, Any]: ...


def _table(rows: Sequence[_Row], columns: Sequence[str]) -> None:
    """The server's fields by name (``to_json``: amounts as the server wrote them)."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        shown = row.to_json()
        table.add_row(*(_cell(shown.get(c)) for c in columns))
    console().print(table)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value)


_DELETED = {"result": "deleted"}  # what the server answers a delete (kept for --json)


def _show(
    work: Callable[[AccelshareClient], Awaitable[T]],
    as_json: bool,
    message: str,
    document: Callable[[T], Any],
) -> None:
    """Run ``work``; print ``message``, or with --json ``document(result)`` (the shape
    the server answered, as before the SDK's results were typed)."""
    result = call_api(work)
    if as_json:
        print_json(document(result))
    else:
        typer.echo(message)


def _deleted(_result: None) -> dict[str, str]:
    return _DELETED


def _as_user(user: UserInfo) -> dict[str, Any]:
    return {"user": user.to_json()}


def _model(result: _Row) -> dict[str, Any]:
    return result.to_json()


# -- keypairs -----------------------------------------------------------------------------------


@keypair_app.command("list")
def keypair_list(
    user: Annotated[str | None, typer.Option("--user", help="Only this user's (email).")] = None,
    as_json: JsonOption = False,
) -> None:
    """List keypairs (secrets are never shown)."""
    rows = call_api(lambda c: c.admin.list_keypairs(user_email=user))
    if as_json:
        print_json([row.to_json() for row in rows])
        return
    _table(
        rows,
        ("access_key", "user_email", "resource_policy", "is_active", "is_admin", "last_used_at"),
    )


@keypair_app.command("create")
def keypair_create(
    user: Annotated[str, typer.Argument(help="The owner's email.")],
    policy: Annotated[str | None, typer.Option("--policy", help="Resource policy.")] = None,
    is_admin: Annotated[bool, typer.Option("--admin", help="Mark it an admin keypair.")] = False,
    inactive: Annotated[bool, typer.Option("--inactive", help="Create it deactivated.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Create a keypair; its secret key is shown this once."""
    kp = call_api(
        lambda c: c.admin.create_keypair(
            user, resource_policy=policy, is_active=not inactive, is_admin=is_admin
        )
    )
    if as_json:
        print_json(kp.to_json())
        return
    typer.echo(f"Access key: {kp.access_key}")
    typer.echo(f"Secret key: {kp.secret_key}   (shown only now)")


@keypair_app.command("update")
def keypair_update(
    access_key: Annotated[str, typer.Argument(help="The access key.")],
    active: Annotated[
        bool | None, typer.Option("--active/--inactive", help="Activate or deactivate.")
    ] = None,
    is_admin: Annotated[bool | None, typer.Option("--admin/--no-admin", help="Admin flag.")] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="Resource policy.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Change a keypair (only the options given)."""
    _show(
        lambda c: c.admin.update_keypair(
            access_key, is_active=active, is_admin=is_admin, resource_policy=policy
        ),
        as_json,
        f"Keypair {access_key} updated.",
        _model,
    )


@keypair_app.command("delete")
def keypair_delete(
    access_key: Annotated[str, typer.Argument(help="The access key.")], as_json: JsonOption = False
) -> None:
    """Delete a keypair (refused while sessions reference it: deactivate it instead)."""
    _show(
        lambda c: c.admin.delete_keypair(access_key),
        as_json,
        f"Keypair {access_key} deleted.",
        _deleted,
    )


# -- users --------------------------------------------------------------------------------------


@user_app.command("list")
def user_list(
    domain: Annotated[str | None, typer.Option("--domain", help="Only this domain.")] = None,
    as_json: JsonOption = False,
) -> None:
    """List users."""
    rows = call_api(lambda c: c.admin.list_users(domain=domain))
    if as_json:
        print_json([row.to_json() for row in rows])
        return
    _table(rows, ("email", "username", "role", "status", "domain_name", "created_at"))


@user_app.command("create")
def user_create(
    email: Annotated[str, typer.Argument(help="The user's email (the login name).")],
    password: Annotated[
        str,
        typer.Option("--password", prompt=True, hide_input=True, help="At least 8 characters."),
    ],
    role: Annotated[str | None, typer.Option("--role", help="user, admin or superadmin.")] = None,
    username: Annotated[str | None, typer.Option("--username", help="Short login name.")] = None,
    full_name: Annotated[str | None, typer.Option("--full-name", help="Display name.")] = None,
    domain: Annotated[str | None, typer.Option("--domain", help="Default: yours.")] = None,
    group: Annotated[str | None, typer.Option("--group", help="Project to join.")] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="Keypair resource policy.")] = None,
    no_keypair: Annotated[
        bool, typer.Option("--no-keypair", help="Do not create a keypair.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Create a user (and a keypair, whose secret is shown this once)."""
    result = call_api(
        lambda c: c.admin.create_user(
            email,
            password,
            username=username,
            full_name=full_name,
            role=role,
            domain_name=domain,
            group=group,
            resource_policy=policy,
            with_keypair=not no_keypair,
        )
    )
    if as_json:
        print_json(result.to_json())
        return
    typer.echo(f"User {result.user.email} created ({result.user.role}).")
    if result.keypair is not None:
        typer.echo(f"Access key: {result.keypair.access_key}")
        typer.echo(f"Secret key: {result.keypair.secret_key}   (shown only now)")


@user_app.command("update")
def user_update(
    email: Annotated[str, typer.Argument(help="The user's email.")],
    password: Annotated[
        str | None, typer.Option("--password", help="New password (at least 8 characters).")
    ] = None,
    role: Annotated[str | None, typer.Option("--role", help="user, admin or superadmin.")] = None,
    status: Annotated[
        str | None, typer.Option("--status", help="active, inactive or deleted.")
    ] = None,
    full_name: Annotated[str | None, typer.Option("--full-name", help="Display name.")] = None,
    slots: SlotsOption = None,
    as_json: JsonOption = False,
) -> None:
    """Change a user (only the options given; --slots sets the user's quota)."""
    total = _slots(slots)
    _show(
        lambda c: c.admin.update_user(
            email,
            password=password,
            role=role,
            status=status,
            full_name=full_name,
            total_resource_slots=total,
        ),
        as_json,
        f"User {email} updated.",
        _as_user,
    )


@user_app.command("delete")
def user_delete(
    email: Annotated[str, typer.Argument(help="The user's email.")], as_json: JsonOption = False
) -> None:
    """Delete a user (marked deleted; its keypairs are deactivated)."""
    _show(lambda c: c.admin.delete_user(email), as_json, f"User {email} deleted.", _as_user)


# -- resource policies --------------------------------------------------------------------------


def _policy_fields(
    slots: Sequence[str] | None,
    default_for_unspecified: str | None,
    max_sessions: int | None,
    max_pending: int | None,
    pending_slots: Sequence[str] | None,
    idle_timeout: int | None,
) -> dict[str, Any]:
    return {
        "total_resource_slots": _slots(slots),
        "default_for_unspecified": default_for_unspecified.upper()
        if default_for_unspecified
        else None,
        "max_concurrent_sessions": max_sessions,
        "max_pending_session_count": max_pending,
        "max_pending_session_resource_slots": _slots(pending_slots, "--max-pending-slots"),
        "idle_timeout": idle_timeout,
    }


DefaultOption = Annotated[
    str | None,
    typer.Option(
        "--default-for-unspecified", help="LIMITED or UNLIMITED: slots not listed in --slots."
    ),
]
MaxSessionsOption = Annotated[
    int | None, typer.Option("--max-sessions", min=0, help="Concurrent sessions (0 = no limit).")
]
MaxPendingOption = Annotated[
    int | None, typer.Option("--max-pending", min=0, help="Pending sessions (0 = no limit).")
]
PendingSlotsOption = Annotated[
    list[str] | None,
    typer.Option("--max-pending-slots", help="KEY=VALUE: resources all pending sessions may ask."),
]
IdleOption = Annotated[int | None, typer.Option("--idle-timeout", min=0, help="Seconds.")]


@policy_app.command("list")
def policy_list(as_json: JsonOption = False) -> None:
    """List keypair resource policies."""
    rows = call_api(lambda c: c.admin.list_policies())
    if as_json:
        print_json([row.to_json() for row in rows])
        return
    _table(
        rows,
        (
            "name",
            "default_for_unspecified",
            "total_resource_slots",
            "max_concurrent_sessions",
            "max_pending_session_count",
            "idle_timeout",
        ),
    )


@policy_app.command("create")
def policy_create(
    name: Annotated[str, typer.Argument(help="Policy name.")],
    slots: SlotsOption = None,
    default_for_unspecified: DefaultOption = None,
    max_sessions: MaxSessionsOption = None,
    max_pending: MaxPendingOption = None,
    pending_slots: PendingSlotsOption = None,
    idle_timeout: IdleOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a resource policy."""
    fields = _policy_fields(
        slots, default_for_unspecified, max_sessions, max_pending, pending_slots, idle_timeout
    )
    _show(
        lambda c: c.admin.create_policy(name, **fields), as_json, f"Policy {name} created.", _model
    )


@policy_app.command("update")
def policy_update(
    name: Annotated[str, typer.Argument(help="Policy name.")],
    slots: SlotsOption = None,
    default_for_unspecified: DefaultOption = None,
    max_sessions: MaxSessionsOption = None,
    max_pending: MaxPendingOption = None,
    pending_slots: PendingSlotsOption = None,
    idle_timeout: IdleOption = None,
    as_json: JsonOption = False,
) -> None:
    """Change a resource policy (only the options given)."""
    fields = _policy_fields(
        slots, default_for_unspecified, max_sessions, max_pending, pending_slots, idle_timeout
    )
    _show(
        lambda c: c.admin.update_policy(name, **fields), as_json, f"Policy {name} updated.", _model
    )


@policy_app.command("delete")
def policy_delete(
    name: Annotated[str, typer.Argument(help="Policy name.")], as_json: JsonOption = False
) -> None:
    """Delete a resource policy (refused while keypairs use it)."""
    _show(lambda c: c.admin.delete_policy(name), as_json, f"Policy {name} deleted.", _deleted)


# -- scaling groups -----------------------------------------------------------------------------

SchedulerOption = Annotated[
    str | None, typer.Option("--scheduler", help="Pending-queue picker: fifo, lifo or drf.")
]
OptsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--opt",
        help="Scheduler option K=V (JSON values), e.g. --opt pending_timeout=600"
        " --opt agent_selection_strategy=concentrated.",
    ),
]
DescriptionOption = Annotated[str | None, typer.Option("--description", help="Free text.")]
ActiveOption = Annotated[
    bool | None,
    typer.Option("--active/--inactive", help="Inactive groups take no new sessions."),
]
PublicOption = Annotated[
    bool | None, typer.Option("--public/--private", help="Open to every domain's users.")
]
DefaultSlotsOption = Annotated[
    list[str] | None,
    typer.Option("--default-slots", help="KEY=VALUE: what sessions get when they omit cpu/mem."),
]


def _scaling_group_fields(
    description: str | None,
    active: bool | None,
    public: bool | None,
    scheduler: str | None,
    opts: Sequence[str] | None,
    default_slots: Sequence[str] | None,
) -> dict[str, Any]:
    try:
        parsed = parse_json_pairs(opts, "--opt", "pending_timeout=600") if opts else None
    except ArgumentError as e:
        fail(str(e), code=EXIT_USAGE)
    return {
        "description": description,
        "is_active": active,
        "is_public": public,
        "scheduler": scheduler,
        "scheduler_opts": parsed,
        "default_session_slots": _slots(default_slots, "--default-slots"),
    }


@scaling_group_app.command("list")
def scaling_group_list(as_json: JsonOption = False) -> None:
    """List scaling groups."""
    rows = call_api(lambda c: c.admin.list_scaling_groups())
    if as_json:
        print_json([row.to_json() for row in rows])
        return
    _table(rows, ("name", "is_active", "scheduler", "scheduler_opts", "default_session_slots"))


@scaling_group_app.command("create")
def scaling_group_create(
    name: Annotated[str, typer.Argument(help="Scaling group name.")],
    description: DescriptionOption = None,
    active: ActiveOption = None,
    public: PublicOption = None,
    scheduler: SchedulerOption = None,
    opts: OptsOption = None,
    default_slots: DefaultSlotsOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a scaling group (agents join it with [agent] scaling-group)."""
    fields = _scaling_group_fields(description, active, public, scheduler, opts, default_slots)
    _show(
        lambda c: c.admin.create_scaling_group(name, **fields),
        as_json,
        f"Scaling group {name} created.",
        _model,
    )


@scaling_group_app.command("update")
def scaling_group_update(
    name: Annotated[str, typer.Argument(help="Scaling group name.")],
    description: DescriptionOption = None,
    active: ActiveOption = None,
    public: PublicOption = None,
    scheduler: SchedulerOption = None,
    opts: OptsOption = None,
    default_slots: DefaultSlotsOption = None,
    as_json: JsonOption = False,
) -> None:
    """Change a scaling group (only the options given; --opt merges into its options)."""
    fields = _scaling_group_fields(description, active, public, scheduler, opts, default_slots)
    _show(
        lambda c: c.admin.update_scaling_group(name, **fields),
        as_json,
        f"Scaling group {name} updated.",
        _model,
    )


@scaling_group_app.command("delete")
def scaling_group_delete(
    name: Annotated[str, typer.Argument(help="Scaling group name.")], as_json: JsonOption = False
) -> None:
    """Delete a scaling group (refused while agents or sessions reference it)."""
    _show(
        lambda c: c.admin.delete_scaling_group(name),
        as_json,
        f"Scaling group {name} deleted.",
        _deleted,
    )


DomainTarget = Annotated[str | None, typer.Option("--domain", help="A domain's name.")]
GroupTarget = Annotated[str | None, typer.Option("--group", help="A project's (group's) id.")]
KeypairTarget = Annotated[str | None, typer.Option("--access-key", help="An access key.")]


def _one_target(domain: str | None, group: str | None, access_key: str | None) -> None:
    given = [
        o for o, v in (("--domain", domain), ("--group", group), ("--access-key", access_key)) if v
    ]
    if len(given) != 1:
        fail(
            "give exactly one of --domain, --group or --access-key"
            f" (received: {', '.join(given) or 'none'})",
            code=EXIT_USAGE,
        )


def _show_associations(result: ScalingGroupAssociations, as_json: bool, name: str) -> None:
    if as_json:
        print_json(result.to_json())
        return
    typer.echo(f"Scaling group {name} is open to:")
    for label, values in (
        ("domains", result.domains),
        ("projects", result.groups),
        ("keypairs", result.keypairs),
    ):
        typer.echo(f"  {label}: {', '.join(values) or '-'}")


@scaling_group_app.command("associations")
def scaling_group_associations(
    name: Annotated[str, typer.Argument(help="Scaling group name.")], as_json: JsonOption = False
) -> None:
    """Show the domains, projects and keypairs whose sessions may use a scaling group."""
    _show_associations(call_api(lambda c: c.admin.scaling_group_associations(name)), as_json, name)


@scaling_group_app.command("associate")
def scaling_group_associate(
    name: Annotated[str, typer.Argument(help="Scaling group name.")],
    domain: DomainTarget = None,
    group: GroupTarget = None,
    access_key: KeypairTarget = None,
    as_json: JsonOption = False,
) -> None:
    """Open a scaling group to a domain's users, a project or a keypair (one of them)."""
    _one_target(domain, group, access_key)
    result = call_api(
        lambda c: c.admin.associate_scaling_group(
            name, domain=domain, group=group, access_key=access_key
        )
    )
    _show_associations(result, as_json, name)


@scaling_group_app.command("dissociate")
def scaling_group_dissociate(
    name: Annotated[str, typer.Argument(help="Scaling group name.")],
    domain: DomainTarget = None,
    group: GroupTarget = None,
    access_key: KeypairTarget = None,
    as_json: JsonOption = False,
) -> None:
    """Close a scaling group to a domain, a project or a keypair (one of them)."""
    _one_target(domain, group, access_key)
    result = call_api(
        lambda c: c.admin.dissociate_scaling_group(
            name, domain=domain, group=group, access_key=access_key
        )
    )
    _show_associations(result, as_json, name)


# -- GraphQL ------------------------------------------------------------------------------------


@admin_app.command("query")
def query_command(
    query: Annotated[
        str,
        typer.Argument(help="The GraphQL query ('-' reads it from stdin).", show_default=False),
    ],
    variables: Annotated[
        str | None,
        typer.Option("--variables", "-v", help='A JSON object, e.g. \'{"agent_id": "i-dev-01"}\'.'),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Accepted for symmetry: the answer is always JSON."),
    ] = False,
) -> None:
    """Run a GraphQL query at /admin/gql and print the answer as JSON: {"data": {...}}.

    A query with errors prints the whole answer ({"data": ..., "errors": [...]}) and
    exits 1. Example: accelshare admin query 'query ($agent_id: String!) {
    agent(agent_id: $agent_id) { id gpu_alloc_map } }' --variables '{"agent_id":
    "i-dev-01"}'
    """
    del as_json  # the output is JSON either way
    text = sys.stdin.read() if query == "-" else query
    parsed: dict[str, Any] | None = None
    if variables:
        try:
            loaded = json.loads(variables)
        except ValueError as e:
            fail(f"--variables: not valid JSON ({e})", code=EXIT_USAGE)
        if not isinstance(loaded, dict):
            fail(
                '--variables: expected a JSON object such as \'{"agent_id": "i-dev-01"}\'',
                code=EXIT_USAGE,
            )
        parsed = loaded
    data = call_api(lambda c: c.query(text, parsed))
    print_json({"data": data})
