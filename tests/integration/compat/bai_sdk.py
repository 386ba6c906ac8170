"""SDK-level calls of the official Backend.AI client, run with ITS Python (3.12).

Not a test module: ``conftest.Bai.sdk`` runs ``python bai_sdk.py ACTION 'JSON params'``
with the client's virtualenv and reads one JSON document from stdout.  The endpoint
and keys come from the ``BACKEND_*`` environment, as for the CLI.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any
from uuid import UUID

from ai.backend.client.config import APIConfig
from ai.backend.client.exceptions import BackendAPIError
from ai.backend.client.request import Request
from ai.backend.client.session import AsyncSession


async def hello(_params: dict[str, Any]) -> Any:
    async with AsyncSession() as session:
        answer = await session.ComputeSession.hello()
        return {"hello": answer, "negotiated": list(session.api_version)}


async def keypair(_params: dict[str, Any]) -> Any:
    async with AsyncSession() as session:
        return await session.KeyPair(session.config.access_key).info()


async def bad_secret(_params: dict[str, Any]) -> Any:
    """A request signed with a wrong secret key: the server's refusal."""
    config = APIConfig(secret_key="0" * 40)
    async with AsyncSession(config=config) as session:
        try:
            await session.KeyPair(config.access_key).info()
        except BackendAPIError as e:
            return {"status": e.status, "data": e.data}
    return {"status": 200}


async def gql(params: dict[str, Any]) -> Any:
    """The query through ``Admin.query`` and, to see the wire, a raw ``/admin/gql`` POST."""
    async with AsyncSession() as session:
        data = await session.Admin.query(params["query"], params.get("variables"))
        request = Request("POST", "/admin/gql")
        request.set_json({"query": params["query"], "variables": params.get("variables") or {}})
        async with request.fetch() as response:
            wire = await response.json()
        return {"data": data, "wire": wire}


async def create(params: dict[str, Any]) -> Any:
    async with AsyncSession() as session:
        created = await session.ComputeSession.get_or_create(
            params["image"],
            name=params["name"],
            resources=params["resources"],
            resource_opts=params.get("resource_opts"),
            enqueue_only=params.get("enqueue_only", False),
        )
        return {"id": str(created.id), "status": created.status, "created": created.created}


async def info(params: dict[str, Any]) -> Any:
    async with AsyncSession() as session:
        return await session.ComputeSession(params["name"]).get_info()


async def logs(params: dict[str, Any]) -> Any:
    async with AsyncSession() as session:
        return await session.ComputeSession(params["name"]).get_logs()


async def destroy(params: dict[str, Any]) -> Any:
    async with AsyncSession() as session:
        return await session.ComputeSession(params["name"]).destroy()


async def update(params: dict[str, Any]) -> Any:
    """``ComputeSession.update()`` (the ``modify_compute_session`` mutation); a refusal's
    message.  The session is named by id: ``update()`` needs one."""
    async with AsyncSession() as session:
        compute = session.ComputeSession.from_session_id(UUID(params["id"]))
        fields = {k: params[k] for k in ("name", "priority") if k in params}
        try:
            return await compute.update(**fields)
        except BackendAPIError as e:
            return {"status": e.status, "data": e.data}


async def agents(params: dict[str, Any]) -> Any:
    async with AsyncSession() as session:
        page = await session.Agent.paginated_list(status="ALIVE")
        detail = await session.Agent.detail(params["agent_id"])
        return {"total": page.total_count, "items": page.items, "detail": detail}


async def execute(params: dict[str, Any]) -> Any:
    """``ComputeSession.execute()`` stepped until the run finishes (each result kept),
    then the refusals' status and body: an unknown run id, and ``params["refusals"]``."""
    async with AsyncSession() as session:
        compute = session.ComputeSession(params["name"])
        results = []
        run_id, mode, code = None, params.get("mode", "query"), params.get("code", "")
        while True:
            result = await compute.execute(run_id, code, mode=mode, opts=params.get("opts"))
            results.append(result)
            if result["status"] == "finished":
                break
            run_id, mode, code = result["runId"], "continue", ""
        refusals = []
        for run_id, mode in params.get("refusals", []):
            try:
                await compute.execute(run_id, "", mode=mode)
                refusals.append({"status": 200})
            except BackendAPIError as e:
                refusals.append({"status": e.status, "data": e.data})
        return {"results": results, "refusals": refusals}


async def invitations(_params: dict[str, Any]) -> Any:
    """``VFolder.invitations()``: the caller's pending folder invitations."""
    async with AsyncSession() as session:
        return (await session.VFolder.invitations())["invitations"]


async def accept(params: dict[str, Any]) -> Any:
    async with AsyncSession() as session:
        return await session.VFolder.accept_invitation(params["inv_id"])


async def sgroup(params: dict[str, Any]) -> Any:
    """``ScalingGroup.<call>(*args)``: the SDK's associations (``associate_domain``,
    ``dissociate_domain``, ``dissociate_all_domain``, ``associate_group``,
    ``dissociate_group``, ``dissociate_all_group``); their ``{ok, msg}``."""
    async with AsyncSession() as session:
        return await getattr(session.ScalingGroup, params["call"])(*params["args"])


ACTIONS = {
    f.__name__: f
    for f in (
        hello,
        keypair,
        bad_secret,
        gql,
        create,
        info,
        logs,
        destroy,
        update,
        agents,
        execute,
        invitations,
        accept,
        sgroup,
    )
}


def main() -> None:
    action, raw = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "{}"
    result = asyncio.run(ACTIONS[action](json.loads(raw)))
    json.dump(result, sys.stdout, default=str)


if __name__ == "__main__":
    main()
