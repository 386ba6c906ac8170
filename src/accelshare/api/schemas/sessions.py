"""The session-creation request as the API reads it (spec 07), and its conversion to
the session service's :class:`~accelshare.manager.services.sessions.spec.SessionRequest`.

``POST /session`` takes spec 07's body; Backend.AI's client sends the same with a few
other spellings (``config.scaling_group``, ``startsAt``, ``clientSessionToken``...),
accepted as aliases.  Unknown fields are ignored (the official client sends more).
The amounts in ``config.resources`` stay as sent: the service parses them against the
known slot types (:func:`~accelshare.manager.services.sessions.spec.resolve_resources`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from accelshare.common.text_input import check_env_name, check_text
from accelshare.manager.services.sessions.spec import (
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    SERVICE_NAME_RE,
    STARTS_AT_FORMS,
    TAG_MAX_LENGTH,
    ServicePort,
    SessionConfig,
    SessionRequest,
    parse_starts_at,
    session_name_problem,
)

from ..problems import InvalidAPIParameters

__all__ = ["CreateSessionBody", "ServicePortBody", "SessionConfigBody"]


def _aliases(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class ServicePortBody(BaseModel):
    """One app service a session offers (``config.service_ports``).

    The request's own; without any (the field absent) the session gets its image's
    declared services (``ai.backend.service-ports``).  They are kept in the session's environment, as
    ``BACKENDAI_SERVICE_PORT_<NAME>=<port>`` (the name upper-cased; this is also how a
    kernel learns its ports).  The agent gives each one a host port of its own from
    ``[container] port-range`` (:mod:`accelshare.agent.ports`: the process runtime's
    kernel listens on it, its variable rewritten; a docker bridge container keeps the
    declared port, published on it), and the manager proxies
    ``/session/{id}/apps/{name}/...`` there (HTTP and WebSocket).
    :func:`~accelshare.manager.services.sessions.spec.service_ports_from_environ` reads them back,
    :func:`~accelshare.manager.services.sessions.spec.app_services` adds the host ports."""

    model_config = ConfigDict(extra="forbid")

    name: str
    protocol: Literal["http"] = "http"
    port: int = Field(ge=1024, le=65535)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not SERVICE_NAME_RE.fullmatch(value):
            raise ValueError(
                "a service name is 1-32 lower-case letters, digits or '_', starting with a letter"
            )
        return value

    @property
    def env_name(self) -> str:
        return self.to_port().env_name

    def to_port(self) -> ServicePort:
        return ServicePort(name=self.name, protocol=self.protocol, port=self.port)


class SessionConfigBody(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    # Any: the amounts are parsed (exactly, or refused by name) by resolve_resources;
    # a narrower type here would let pydantic turn a JSON ``true`` into 1.
    resources: dict[str, Any] = Field(default_factory=dict)
    resource_opts: dict[str, Any] = Field(
        default_factory=dict, validation_alias=_aliases("resource_opts", "resourceOpts")
    )
    scaling_group: str | None = Field(
        default=None, validation_alias=_aliases("scalingGroup", "scaling_group")
    )
    environ: dict[str, str] = Field(default_factory=dict)
    agent_list: list[str] | None = Field(
        default=None, validation_alias=_aliases("agentList", "agent_list")
    )
    # absent (None): the image's declared services; [] for none
    service_ports: list[ServicePortBody] | None = Field(
        default=None,
        max_length=16,
        validation_alias=_aliases("service_ports", "servicePorts"),
    )
    # storage folders: names (``name``, ``name:/path``, ``name:/path:ro``), where each
    # goes (``name -> path``) and per-folder options (``{"permission": "ro"}``)
    mounts: list[str] = Field(default_factory=list, max_length=64)
    mount_map: dict[str, str] = Field(
        default_factory=dict, validation_alias=_aliases("mount_map", "mountMap")
    )
    mount_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, validation_alias=_aliases("mount_options", "mountOptions")
    )

    @field_validator("environ")
    @classmethod
    def _check_environ(cls, value: dict[str, str]) -> dict[str, str]:
        """POSIX names the agent does not set; values without NUL or control characters
        (tabs and line breaks allowed).  :mod:`accelshare.common.text_input`."""
        for name, text in value.items():
            check_env_name(name, field=f"config.environ.{name}")
            check_text(text, field=f"config.environ.{name}", multiline=True)
        return value

    @field_validator("service_ports")
    @classmethod
    def _unique_services(cls, value: list[ServicePortBody] | None) -> list[ServicePortBody] | None:
        if value is None:
            return None
        names: list[object] = [s.name for s in value]
        ports: list[object] = [s.port for s in value]
        for label, seen in (("name", names), ("port", ports)):
            dup = next((x for x in seen if seen.count(x) > 1), None)
            if dup is not None:
                raise ValueError(f"two services with the {label} {dup!r}: each must be unique")
        return value


class CreateSessionBody(BaseModel):
    """``POST /session`` (spec 07; Backend.AI's spellings accepted)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    image: str = Field(min_length=1, max_length=512, validation_alias=_aliases("image", "lang"))
    name: str | None = Field(
        default=None,
        validation_alias=_aliases("name", "sessionName", "clientSessionToken"),
    )
    type: Literal["interactive", "batch"] = Field(
        default="interactive", validation_alias=_aliases("type", "sessionType", "session_type")
    )
    config: SessionConfigBody = Field(default_factory=SessionConfigBody)
    priority: int = Field(default=DEFAULT_PRIORITY, ge=0, le=MAX_PRIORITY)
    # an ISO time or Backend.AI's delays ("20s", "5m", "1h"): read by to_request
    starts_at: datetime | str | None = Field(
        default=None, validation_alias=_aliases("starts_at", "startsAt")
    )
    tag: str | None = Field(default=None, max_length=TAG_MAX_LENGTH)
    dependencies: list[str] = Field(default_factory=list)
    enqueue_only: bool = Field(
        default=False, validation_alias=_aliases("enqueueOnly", "enqueue_only")
    )
    # Keep a session no agent of its scaling group could hold even when empty (it is
    # refused otherwise): it waits, saying so, for an agent that can to join.
    wait_for_agents: bool = Field(
        default=False, validation_alias=_aliases("waitForAgents", "wait_for_agents")
    )
    max_wait_seconds: int = Field(
        default=0, ge=0, le=3600, validation_alias=_aliases("maxWaitSeconds", "max_wait_seconds")
    )
    startup_command: str | None = Field(
        default=None,
        max_length=16384,
        validation_alias=_aliases("startupCommand", "startup_command"),
    )
    group: str | None = Field(default=None, validation_alias=_aliases("group", "groupName"))
    reuse_if_exists: bool = Field(
        default=False, validation_alias=_aliases("reuseIfExists", "reuse_if_exists")
    )
    owner_access_key: str | None = Field(
        default=None, validation_alias=_aliases("owner_access_key", "ownerAccessKey")
    )
    cluster_size: int = Field(default=1, validation_alias=_aliases("cluster_size", "clusterSize"))

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
        problem = session_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("startup_command")
    @classmethod
    def _check_startup_command(cls, value: str | None) -> str | None:
        return None if value is None else check_text(value, field="startupCommand", multiline=True)

    @field_validator("tag")
    @classmethod
    def _check_tag(cls, value: str | None) -> str | None:
        return None if value is None else check_text(value, field="tag")

    @field_validator("cluster_size")
    @classmethod
    def _single_node(cls, value: int) -> int:
        if value != 1:
            raise ValueError("only single-kernel sessions are supported (cluster_size = 1)")
        return value

    def to_request(self) -> SessionRequest:
        """What :meth:`SessionService.create
        <accelshare.manager.services.sessions.SessionService.create>` takes."""
        config = self.config
        starts_at = None
        if self.starts_at is not None:
            try:
                starts_at = parse_starts_at(self.starts_at)
            except ValueError as e:
                raise InvalidAPIParameters(
                    f"Invalid startsAt: {e}; expected {STARTS_AT_FORMS}",
                    field="startsAt",
                    expected=STARTS_AT_FORMS,
                    received=self.starts_at,
                ) from None
        return SessionRequest(
            image=self.image,
            name=self.name,
            type=self.type,
            config=SessionConfig(
                resources=dict(config.resources),
                resource_opts=dict(config.resource_opts),
                scaling_group=config.scaling_group,
                environ=dict(config.environ),
                agent_list=None if config.agent_list is None else tuple(config.agent_list),
                service_ports=(
                    None
                    if config.service_ports is None
                    else tuple(sp.to_port() for sp in config.service_ports)
                ),
            ),
            priority=self.priority,
            starts_at=starts_at,
            dependencies=tuple(self.dependencies),
            enqueue_only=self.enqueue_only,
            wait_for_agents=self.wait_for_agents,
            max_wait_seconds=self.max_wait_seconds,
            startup_command=self.startup_command,
            group=self.group,
            reuse_if_exists=self.reuse_if_exists,
            owner_access_key=self.owner_access_key,
            tag=self.tag,
        )
