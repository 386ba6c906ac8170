"""The image catalogue through the API: admin add/alias/remove, ``GET /images`` for
users, GraphQL ``images``, alias resolution at session creation, accelerator-support
refusal, minimum resources, and placement only on agents that have the image."""

from __future__ import annotations

from typing import Any

import httpx

from .cluster import Cluster


async def make_user(cluster: Cluster, email: str) -> httpx.AsyncClient:
    response = await cluster.admin.post(
        "/admin/users", json={"email": email, "password": "long enough password"}
    )
    assert response.status_code == 201, response.text
    keypair = response.json()["keypair"]
    return cluster.client(keypair["access_key"], keypair["secret_key"])


async def add_image(cluster: Cluster, **body: Any) -> dict[str, Any]:
    response = await cluster.admin.post("/admin/images", json=body)
    assert response.status_code == 201, response.text
    image: dict[str, Any] = response.json()
    return image


async def test_catalogue_admin_and_user_views(cluster: Cluster) -> None:
    added = await add_image(
        cluster,
        ref="python:3.11",
        aliases=["python"],
        min_slots={"cpu": "1", "mem": "512m"},
        description="Python 3.11",
    )
    assert added["aliases"] == ["python"]
    assert added["min_slots"] == {"cpu": "1", "mem": str(512 << 20)}
    await add_image(cluster, ref="pytorch:1.5", accelerators=["cuda"], runtime="docker")

    again = await cluster.admin.post("/admin/images", json={"ref": "python:3.11"})
    assert again.status_code == 409, again.text
    bad = await cluster.admin.post("/admin/images", json={"ref": "x:1", "min_slots": {"cpu": "a"}})
    assert bad.status_code == 400, bad.text
    assert bad.json()["field"] == "min_slots.cpu"

    user = await make_user(cluster, "img-user@example.com")
    listed = (await user.get("/images")).json()["items"]
    assert [i["ref"] for i in listed] == ["python:3.11", "pytorch:1.5"]
    assert (await user.get("/images/python")).json()["ref"] == "python:3.11"  # by alias
    assert (await user.post("/admin/images", json={"ref": "y:1"})).status_code == 403

    moved = await cluster.admin.put("/admin/image-aliases/torch", json={"target": "pytorch:1.5"})
    assert moved.status_code == 200, moved.text
    assert moved.json()["aliases"] == ["torch"]
    body = await cluster.gql("{ images { ref aliases runtime accelerators min_slots } }")
    by_ref = {i["ref"]: i for i in body["data"]["images"]}
    assert by_ref["pytorch:1.5"]["aliases"] == ["torch"]
    assert by_ref["pytorch:1.5"]["accelerators"] == ["cuda"]
    assert by_ref["python:3.11"]["runtime"] == "process"

    # Backend.AI's filter / order expressions over the catalogue
    q = "query ($f: String, $o: String) { images(filter: $f, order: $o) { ref } }"
    refs = await cluster.gql(q, {"f": 'runtime == "docker"', "o": None})
    assert [i["ref"] for i in refs["data"]["images"]] == ["pytorch:1.5"], refs
    refs = await cluster.gql(q, {"f": 'name ilike "PY%" & tag != "1.5"', "o": "-reference"})
    assert [i["ref"] for i in refs["data"]["images"]] == ["python:3.11"], refs
    refs = await cluster.gql(q, {"f": None, "o": "-reference"})
    assert [i["ref"] for i in refs["data"]["images"]] == ["pytorch:1.5", "python:3.11"], refs
    answer = await cluster.admin.post(
        "/admin/gql", json={"query": q, "variables": {"f": 'digest == "x"', "o": None}}
    )
    bad = answer.json()
    assert "digest" in bad["errors"][0]["message"], bad
    assert "column 1" in bad["errors"][0]["message"], bad

    removed = await cluster.admin.delete("/admin/images/torch")
    assert removed.json() == {"result": "deleted", "ref": "pytorch:1.5"}, removed.text
    assert (await user.get("/images/torch")).status_code == 404
    await user.aclose()


async def test_alias_resolves_and_only_agents_with_the_image_run_it(cluster: Cluster) -> None:
    bare = await cluster.add_agent("i-bare")
    demo = await cluster.add_agent("i-demo")
    demo.images = ["python:3.11", "demo-lib:2.0"]
    await demo.heartbeat()
    await bare.heartbeat()
    await add_image(cluster, ref="python:3.11", aliases=["python"])
    await add_image(cluster, ref="demo-lib:1.0")  # no agent has it

    for i in range(2):  # dispersed would put the second on i-bare without the image rule
        made = await cluster.create({"cpu": 1}, image="python", name=f"py{i}", maxWaitSeconds=10)
        assert made.status_code == 201, made.text
        session = await cluster.session(f"py{i}")
        assert session["status"] == "RUNNING", session["statusInfo"]
        assert session["image"] == "python:3.11"  # the alias resolved
        assert {k["agentId"] for k in session["kernels"]} == {"i-demo"}

    # no agent of the group has it: refused at once with each agent's reason (no hang)
    missing = await cluster.create({"cpu": 1}, image="demo-lib:1.0", name="old")
    assert missing.status_code == 400, missing.text
    problem = missing.json()
    assert problem["field"] == "image"
    assert problem["detail"] == (
        "No agent in scaling group default can run image demo-lib:1.0:"
        " i-bare does not have image demo-lib:1.0 (no such environment configured);"
        " i-demo does not have image demo-lib:1.0 (no such environment configured)"
    )

    # an agent that has it but is full: PENDING, and `why` names the agents and reasons
    bare.images = ["demo-lib:1.0"]
    await bare.heartbeat()
    big = await cluster.create({"cpu": 8}, image="demo-lib:1.0", name="big", maxWaitSeconds=10)
    assert big.json()["status"] == "RUNNING", big.text
    waiting = await cluster.create({"cpu": 1}, image="demo-lib:1.0", name="old")
    assert waiting.status_code == 201, waiting.text
    session = await cluster.session("old")
    assert session["status"] == "PENDING"
    why = str((await cluster.admin.get("/session/old/why")).json())
    assert "i-demo: does not have image demo-lib:1.0" in why, why
    assert "i-bare: cpu" in why, why
    await cluster.admin.delete("/session/big")  # frees i-bare: the waiting one starts there
    session = await cluster.wait_status("old", "RUNNING")
    assert {k["agentId"] for k in session["kernels"]} == {"i-bare"}

    # a name neither in the catalogue nor reported by an agent: refused, close names listed
    unknown = await cluster.create({"cpu": 1}, image="shell", name="sh")
    assert unknown.status_code == 400, unknown.text
    problem = unknown.json()
    assert (problem["field"], problem["received"]) == ("image", "shell"), problem
    assert problem["detail"].startswith(
        "Unknown image 'shell': not in the image catalogue and no agent of scaling group"
        " default reports it; known images: demo-lib:1.0, demo-lib:2.0, python, python:3.11"
    ), problem
    typo = (await cluster.create({"cpu": 1}, image="pyhton:3.11", name="typo")).json()
    assert typo["closeNames"] == ["python:3.11", "python"], typo
    assert typo["detail"].endswith("did you mean python:3.11, python?"), typo
    # reported by an agent (a process environment outside the catalogue): accepted
    demo.images = [*demo.images, "shell"]
    await demo.heartbeat()
    reported = await cluster.create({"cpu": 1}, image="shell", name="sh", maxWaitSeconds=10)
    assert reported.json()["status"] == "RUNNING", reported.text


async def test_accelerator_support_and_minimum_resources(cluster: Cluster) -> None:
    await cluster.add_agent("i-node01")
    await add_image(
        cluster, ref="python:3.11", aliases=["python"], min_slots={"cpu": "2", "mem": "2g"}
    )
    await add_image(cluster, ref="pytorch:1.5", accelerators=["cuda"])
    cluster.agents["i-node01"].images = ["python:3.11", "pytorch:1.5"]
    await cluster.agents["i-node01"].heartbeat()

    refused = await cluster.create({"cpu": 2, "cuda.shares": "0.5"}, image="python")
    assert refused.status_code == 400, refused.text
    problem = refused.json()
    assert problem["field"] == "config.resources.cuda.shares"
    assert "Image python:3.11 does not support cuda" in problem["detail"]

    gpu = await cluster.create({"cuda.shares": "0.5"}, image="pytorch:1.5", maxWaitSeconds=10)
    assert gpu.json()["status"] == "RUNNING", gpu.text

    low = await cluster.create({"cpu": 1}, image="python")
    assert low.status_code == 400, low.text
    assert low.json()["field"] == "config.resources.cpu"
    assert low.json()["expected"] == ">= 2"
    assert "below the minimum of image python:3.11" in low.json()["detail"]

    raised = await cluster.create({}, image="python", name="raised", maxWaitSeconds=10)
    assert raised.status_code == 201, raised.text
    session = await cluster.session("raised")
    assert session["requestedSlots"]["cpu"] == "2", session["requestedSlots"]  # default 1
    assert session["requestedSlots"]["mem"] == str(2 << 30), session["requestedSlots"]


async def test_docker_image_absent_from_the_engine_goes_through_pulling(cluster: Cluster) -> None:
    """A docker agent whose engine lacks the image gets the session anyway (it pulls):
    the session passes PULLING -> PREPARED; with the image present it does not pull.
    A process image never lands on a docker agent."""
    engine = await cluster.add_agent("i-docker")
    engine.runtime = "docker"
    engine.images = ["lablup/python:3.11"]
    await engine.heartbeat()
    await add_image(cluster, ref="lablup/python:3.11", runtime="docker")
    await add_image(cluster, ref="lablup/pytorch:1.5", runtime="docker", accelerators=["cuda"])
    await add_image(cluster, ref="demo-lib:1.0")

    def path(session: dict[str, Any]) -> list[str]:
        return [h["to"] for h in session["statusHistory"]]

    pulled = await cluster.create(
        {"cuda.shares": "0.5"}, image="lablup/pytorch:1.5", name="pulled", maxWaitSeconds=10
    )
    assert pulled.json()["status"] == "RUNNING", pulled.text
    history = path(await cluster.session("pulled"))
    assert history[:4] == ["PENDING", "SCHEDULED", "PULLING", "PREPARED"], history
    present = await cluster.create(
        {}, image="lablup/python:3.11", name="present", maxWaitSeconds=10
    )
    assert present.json()["status"] == "RUNNING", present.text
    assert "PULLING" not in path(await cluster.session("present"))

    process = await cluster.create({}, image="demo-lib:1.0", name="process")
    assert process.status_code == 400, process.text
    assert process.json()["detail"].endswith(
        "i-docker runs docker kernels; image demo-lib:1.0 needs the process runtime"
    )


async def test_unknown_names_without_anything_to_judge_by(cluster: Cluster) -> None:
    """No catalogue and no agent reporting images (no agent yet, or agents that report
    none): a name is accepted and waits or runs as before.  A catalogue alone judges."""
    early = await cluster.create({"cpu": 1}, image="anything:1", name="early", enqueueOnly=True)
    assert early.status_code == 201, early.text
    assert early.json()["status"] == "PENDING"
    await cluster.add_agent("i-node01")  # a hollow agent reports no images
    ran = await cluster.create({"cpu": 1}, image="other:2", name="ran", maxWaitSeconds=10)
    assert ran.json()["status"] == "RUNNING", ran.text

    await add_image(cluster, ref="python:3.11", aliases=["python"])
    refused = await cluster.create({"cpu": 1}, image="other:2", name="refused")
    assert refused.status_code == 400, refused.text
    assert refused.json()["received"] == "other:2"
    assert "known images: python, python:3.11" in refused.json()["detail"]


async def test_a_docker_agent_takes_unknown_names_to_pull(cluster: Cluster) -> None:
    engine = await cluster.add_agent("i-docker")
    engine.runtime = "docker"
    engine.images = ["lablup/python:3.11"]
    await engine.heartbeat()
    pulled = await cluster.create({}, image="lablup/other:1.0", name="pulled", maxWaitSeconds=10)
    assert pulled.json()["status"] == "RUNNING", pulled.text


async def test_a_session_gets_the_apps_its_image_declares_unless_it_names_its_own(
    cluster: Cluster,
) -> None:
    """An image's ``ai.backend.service-ports`` label gives a session that names no app
    services (the official client's ``session create``) those services; a request's own
    ``service_ports`` (``[]``: none) or ``BACKENDAI_SERVICE_PORT_*`` variables win."""
    agent = await cluster.add_agent("i-node01")
    agent.images = ["lab:1", "plain:1"]
    await agent.heartbeat()
    label = "jupyter:http:8888, ssh:tcp:2200,web:http:8080,Bad:http:1,dup:http:8080"
    await add_image(cluster, ref="lab:1", labels={"ai.backend.service-ports": label})
    await add_image(cluster, ref="plain:1")

    async def apps(name: str, **config: Any) -> list[tuple[str, int]]:
        made = await cluster.admin.post(
            "/session",
            json={"image": name.split("-", maxsplit=1)[0] + ":1", "name": name,
                  "config": {"resources": {"cpu": 1}, **config}},
        )  # fmt: skip
        assert made.status_code == 201, made.text
        return [(s["name"], s["port"]) for s in (await cluster.session(name))["servicePorts"]]

    assert await apps("lab-default") == [("jupyter", 8888), ("web", 8080)]
    assert await apps("lab-none", service_ports=[]) == []
    own = [{"name": "tb", "protocol": "http", "port": 6006}]
    assert await apps("lab-own", service_ports=own) == [("tb", 6006)]
    env = {"BACKENDAI_SERVICE_PORT_NOTE": "9000"}
    assert await apps("lab-env", environ=env) == [("note", 9000)]
    assert await apps("plain-default") == []
