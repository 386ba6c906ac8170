"""The hollow agent's RPC app (the scheduler benchmark's and the component tests' fake
agent): the cluster secret is required everywhere but ``/metrics``, and every agent
answers for itself although all share the same endpoint functions."""

from __future__ import annotations

import httpx

from accelshare.protocol import CLUSTER_SECRET_HEADER
from accelshare_testkit.hollow_agent import HollowAgent, HollowSpec

SECRET = "hollow-test-secret"


def client(agent: HollowAgent, secret: str | None) -> httpx.AsyncClient:
    headers = {CLUSTER_SECRET_HEADER: secret} if secret is not None else {}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=agent.app), base_url="http://a", headers=headers
    )


async def test_the_secret_is_required_and_each_agent_answers_for_itself() -> None:
    one = HollowAgent(HollowSpec("i-one"), cluster_secret=SECRET)
    two = HollowAgent(HollowSpec("i-two"), cluster_secret=SECRET)
    for secret in (None, "wrong"):
        async with client(one, secret) as c:
            refused = await c.get("/v1/health")
        assert refused.status_code == 401
        assert refused.json()["detail"] == "missing or wrong cluster secret"
    async with client(one, SECRET) as c1, client(two, SECRET) as c2:
        assert (await c1.get("/v1/health")).json() == {"status": "ok", "agent_id": "i-one"}
        assert (await c2.get("/v1/health")).json() == {"status": "ok", "agent_id": "i-two"}
        assert (await c2.get("/v1/kernels")).json() == {"kernels": []}
    async with client(one, None) as c:
        assert (await c.get("/metrics")).status_code == 404  # past the check: no such route
