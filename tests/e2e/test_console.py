"""The web console in real headless Chromium (Playwright) against ``accelshare dev up``:
one real agent with the two-GPU mock (2 × 1.0 fGPU), the real manager, real HTTP; and
a second cluster in discrete mode with configs/accelerator/cuda-mock-mig.toml (two whole
GPUs and seven MIG slices of three profiles) for whole-device and MIG bars.

Every wait is Playwright's auto-waiting ``expect`` (or a polled API condition) with a
generous deadline; nothing sleeps.  Each page is screenshotted on every run (so a
broken page still fails loudly in Playwright); the PNGs go to a temporary directory,
or to docs/screenshots/ (linked from README.md) when ACCELSHARE_UPDATE_SCREENSHOTS=1,
so that a plain test run leaves the checkout clean.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy import orm

from accelshare.devcluster import free_port
from accelshare.devcluster.processes import reap_processes_under
from accelshare.manager.bootstrap import AdminCredentials
from accelshare.manager.models import Domain, Group

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
REPO = Path(__file__).resolve().parents[2]
MIG_CONFIG = REPO / "configs" / "accelerator" / "cuda-mock-mig.toml"
DOCS_SCREENSHOTS = REPO / "docs" / "screenshots"
SCREENSHOTS = (
    DOCS_SCREENSHOTS
    if os.environ.get("ACCELSHARE_UPDATE_SCREENSHOTS") == "1"
    else Path(tempfile.gettempdir()) / f"accelshare-screenshots-{os.getpid()}"
)
TIMEOUT_MS = 30_000
# dev up builds jupyter:4 (JupyterLab from the package index) here, once for every run:
# a later run finds it built and registers it at once.
ENV_CACHE = Path(
    os.environ.get("ACCELSHARE_TEST_ENV_CACHE", Path.home() / ".cache" / "accelshare-test" / "envs")
)
JUPYTER_BUILD_TIMEOUT_S = 600.0
USER_EMAIL = "alice@example.com"
USER_PASSWORD = "alice-password-123"
HIDDEN_HOLDER = "another domain's session"

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')"
)
if not CHROMIUM.exists():
    pytest.skip(
        f"{CHROMIUM} is missing (apt-get install chromium); the console tests need it",
        allow_module_level=True,
    )

expect = sync_api.expect
pytestmark = pytest.mark.integration
expect.set_options(timeout=TIMEOUT_MS)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("ACCELSHARE_", "BACKEND_"))}


@contextlib.contextmanager
def logged_in_client(base: str, email: str, password: str) -> Iterator[httpx.Client]:
    """An API client with the console's login cookie and CSRF header."""
    with httpx.Client(base_url=base, timeout=30) as api:
        login = api.post("/auth/login", json={"email": email, "password": password})
        login.raise_for_status()
        api.headers["X-CSRF-Token"] = login.json()["csrf_token"]
        yield api


@dataclass
class Console:
    base: str
    apps: str  # the apps origin (dev up --apps-port): app pages are served there only
    admin: AdminCredentials
    api: httpx.Client  # logged in as the superadmin (cookie + CSRF header)
    data_dir: Path
    log: list[str]  # dev up's output so far (its background environment builds too)

    def live_sessions(self) -> list[dict[str, Any]]:
        response = self.api.get("/sessions")
        response.raise_for_status()
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    def until(self, condition: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while not (value := condition()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.1)  # a poll interval, not a synchronisation
        return value


def _start_dev_up(
    data_dir: Path, port: int, *extra: str
) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "accelshare.client.cli", "dev", "up"),
            *("--data-dir", str(data_dir), "--port", str(port)),
            *("--agents", "1", "--cpus", "8", "--mem", "16g"),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
    )
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        lines.extend(proc.stdout)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 120
    while not any("local cluster is running" in line for line in lines):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("dev up did not start:\n" + "".join(lines))
        time.sleep(0.1)
    return proc, lines


def _running_console(data_dir: Path, *extra: str) -> Iterator[Console]:
    port, apps_port = free_port(), free_port()
    proc, lines = _start_dev_up(
        data_dir, port, "--apps-port", str(apps_port), "--env-cache", str(ENV_CACHE), *extra
    )
    base = f"http://127.0.0.1:{port}"
    try:
        admin = AdminCredentials.from_env_file(data_dir / "admin-credentials.env")
        with logged_in_client(base, admin.email, admin.password) as api:
            created = api.post(
                "/admin/users",
                json={"email": USER_EMAIL, "password": USER_PASSWORD, "role": "user"},
            )
            assert created.status_code == 201, created.text
            yield Console(base, f"http://127.0.0.1:{apps_port}", admin, api, data_dir, lines)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reap_processes_under(data_dir)


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """Fractional mode, two 1.0-fGPU devices (quantum 0.1)."""
    yield from _running_console(tmp_path_factory.mktemp("console") / "state")


@pytest.fixture(scope="module")
def mig_console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """Discrete mode with MIG: cuda.device 2, cuda.device:20g-mig 1, :10g-mig 2, :5g-mig 4."""
    yield from _running_console(
        tmp_path_factory.mktemp("mig-console") / "state",
        *("--mock-config", str(MIG_CONFIG), "--allocation-mode", "discrete"),
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _fresh_page(browser: Any, console: Console) -> Iterator[Any]:
    for session in console.live_sessions():
        console.api.delete(f"/session/{session['sessionId']}", params={"forced": "true"})
    console.until(lambda: not console.live_sessions(), "no live sessions")
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    context.set_default_timeout(TIMEOUT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture
def page(browser: Any, console: Console) -> Iterator[Any]:
    """A fresh browser context (no cookies) on a cluster with no live sessions."""
    yield from _fresh_page(browser, console)


@pytest.fixture
def mig_page(browser: Any, mig_console: Console) -> Iterator[Any]:
    """The same on the MIG cluster."""
    yield from _fresh_page(browser, mig_console)


def shoot(page: Any, name: str) -> None:
    page.evaluate(
        "(t => { if (t) { t.style.transition = 'none'; t.classList.remove('shown'); } })"
        "(document.getElementById('toast'))"
    )
    try:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
    except OSError as e:  # a read-only checkout still runs the tests
        warnings.warn(f"screenshot {name} not written: {e}", stacklevel=2)


def log_in(page: Any, console: Console, email: str, password: str) -> None:
    page.goto(console.base + "/")  # a browser's GET / goes to the console
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
    expect(page.locator("#sessions-live")).to_have_text("Live")


def row(page: Any, name: str) -> Any:
    return page.locator(f'#sessions-body tr[data-session-name="{name}"]')


OTHER_IMAGE = "__other__"  # the picker's "Another image (type its name)…"


def pick_image(dialog: Any, name: str) -> None:
    """Pick ``name`` in the launch dialog's image picker (a catalogue reference), or
    choose "Another image" and type it (an alias, an agent's environment, a typo)."""
    picker = dialog.get_by_label("Image", exact=True)
    values = picker.locator("option").evaluate_all("(els) => els.map((e) => e.value)")
    if name in values and name != OTHER_IMAGE:
        picker.select_option(name)
    else:
        picker.select_option(OTHER_IMAGE)
        dialog.get_by_label("Image name").fill(name)


def launch(
    page: Any,
    name: str,
    gpu: str | None = None,
    *,
    count: int = 1,
    fragmentation: str | None = None,
    screenshot: str | None = None,
    fill: dict[str, str] | None = None,
    check: tuple[str, ...] = (),
    image: str = "python",
) -> None:
    """Launch through the dialog; ``gpu`` goes to "GPU (fGPU)", ``fill`` maps other
    inputs' labels to values, ``check`` names the checkboxes (unique slots) to tick."""
    page.get_by_role("button", name="Launch sessions").click()
    dialog = page.get_by_role("dialog", name="Launch sessions")
    expect(dialog).to_be_visible()
    pick_image(dialog, image)
    dialog.get_by_label("Name (optional)").fill(name)
    dialog.get_by_label("Number of sessions").fill(str(count))
    if gpu is not None:
        dialog.get_by_label("GPU (fGPU)", exact=True).fill(gpu)
    for label, value in (fill or {}).items():
        dialog.get_by_label(label, exact=True).fill(value)
    for label in check:
        dialog.get_by_role("checkbox", name=label, exact=True).check()
    if fragmentation is not None:
        dialog.get_by_text("Advanced resource options").click()
        dialog.get_by_label("Fractional resource fragmentation").select_option(fragmentation)
    if screenshot:
        shoot(page, screenshot)
    dialog.get_by_role("button", name="Launch", exact=True).click()
    expect(dialog).to_be_hidden()


def destroy(page: Any, name: str) -> None:
    page.get_by_role("button", name=f"Destroy {name}").click()
    confirm = page.get_by_role("dialog", name="Destroy session?")
    confirm.get_by_role("button", name="Destroy").click()
    expect(confirm).to_be_hidden()


def status_of(page: Any, name: str) -> Any:
    return row(page, name).locator(".badge")


def test_admin_fractional_bars_pending_queue_and_live_updates(page: Any, console: Console) -> None:
    page.goto(console.base + "/")
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    shoot(page, "login")
    log_in(page, console, console.admin.email, console.admin.password)
    page.evaluate("window.__notReloaded = true")

    # 0.2 + 1.2 fGPU on two 1.0 GPUs: the devices read 0.60 and 0.80 (spec 02/03).
    launch(page, "small", "0.2")
    expect(status_of(page, "small")).to_have_text("RUNNING")
    launch(page, "big", "1.2", fragmentation="allow", screenshot="launch")
    expect(status_of(page, "big")).to_have_text("RUNNING")
    (big,) = [s for s in console.live_sessions() if s["sessionName"] == "big"]
    assert big["resourceOpts"]["allow_fractional_resource_fragmentation"] is True
    expect(row(page, "big").locator('.chip[data-slot="cuda.shares"]')).to_have_text("1.20 fGPU")
    expect(row(page, "small").locator('.chip[data-slot="mem"]')).to_have_text("1 GiB")

    page.get_by_role("link", name="Agents").click()
    agent = page.locator('article.agent[data-agent-id="i-dev-01"]')
    gpus = agent.locator('.device[data-slot="cuda.shares"]')
    expect(gpus).to_have_count(2)
    expect(gpus.locator(".meter-text").filter(has_text="0.60 / 1.00 fGPU")).to_have_count(1)
    expect(gpus.locator(".meter-text").filter(has_text="0.80 / 1.00 fGPU")).to_have_count(1)
    expect(page.locator('.summary-item[data-slot="cuda.shares"] .meter-text')).to_have_text(
        "1.40 / 2.00 fGPU"
    )
    # Who holds each device, and the plugin's live stats per device.
    expect(gpus.locator(".holder-name").filter(has_text="big")).to_have_count(2)
    expect(gpus.locator(".holder-name").filter(has_text="small")).to_have_count(1)
    # ... and how much of the device each holds (0.2 of a 1.0-fGPU device).
    expect(gpus.locator(".holders li").filter(has_text="small")).to_contain_text(
        "0.20 fGPU · 20 % of the device"
    )
    for term in ("Utilisation", "Memory", "Power", "Temperature"):
        expect(gpus.locator("dt").filter(has_text=term)).to_have_count(2)
    shoot(page, "agents")

    # The readings are live: the mock samples new values at every poll (its default
    # smoothing is "none"), and the page shows them as they come, without a reload.
    for term in ("Utilisation", "Memory"):
        reading = gpus.first.locator(".stats div").filter(has_text=term).locator("dd")
        expect(reading).to_have_text(re.compile(r"\d"))
        before = reading.inner_text()
        expect(reading).not_to_have_text(before)
    assert page.evaluate("window.__notReloaded") is True

    page.get_by_role("link", name="Sessions").click()
    destroy(page, "small")
    destroy(page, "big")
    expect(row(page, "small")).to_have_count(0)
    expect(row(page, "big")).to_have_count(0)

    # Three 1-fGPU sessions on 2 fGPU: one waits, with the scheduler's reason...
    launch(page, "trio", "1", count=3)
    expect(status_of(page, "trio-1")).to_have_text("RUNNING")
    expect(status_of(page, "trio-2")).to_have_text("RUNNING")
    expect(status_of(page, "trio-3")).to_have_text("PENDING")
    # ...in the console's terms, the scheduler's own text (device ids) on hover.
    reason = row(page, "trio-3").locator(".reason")
    expect(reason).to_have_text(
        "Needs 1.00 fGPU: GPU 0 and GPU 1 are full (0.00 of 1.00 fGPU free each)."
    )
    expect(reason).to_have_attribute(
        "title", re.compile(r"cuda\.shares needs 1, largest placement 0")
    )
    shoot(page, "sessions")

    # ...and runs as soon as one of the others is destroyed, without a reload.
    destroy(page, "trio-1")
    expect(row(page, "trio-1")).to_have_count(0)
    expect(status_of(page, "trio-3")).to_have_text("RUNNING")
    expect(row(page, "trio-3").locator(".reason")).to_have_count(0)
    assert page.evaluate("window.__notReloaded") is True


def test_plain_user_sees_only_own_sessions_and_no_agents(page: Any, console: Console) -> None:
    theirs = console.api.post(
        "/session",
        json={"image": "python", "name": "admins-own", "config": {"resources": {"cpu": "1"}}},
    )
    assert theirs.status_code == 201, theirs.text

    page.goto(console.base + "/")
    page.get_by_label("Email").fill(USER_EMAIL)
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_have_text("Wrong email or password")
    log_in(page, console, USER_EMAIL, USER_PASSWORD)
    expect(page.locator("#who-role")).to_have_text("user")
    expect(page.get_by_role("link", name="Agents")).to_have_count(0)
    launch(page, "mine", "0.5", fragmentation="forbid")
    expect(status_of(page, "mine")).to_have_text("RUNNING")
    (mine,) = [s for s in console.live_sessions() if s["sessionName"] == "mine"]
    assert mine["resourceOpts"]["allow_fractional_resource_fragmentation"] is False
    expect(row(page, "mine").locator('.chip[data-slot="cuda.shares"]')).to_have_text("0.50 fGPU")
    expect(row(page, "admins-own")).to_have_count(0)
    expect(page.locator("#sessions-body tr")).to_have_count(1)
    shoot(page, "user-sessions")
    page.set_viewport_size({"width": 390, "height": 760})  # a phone: rows become cards
    expect(row(page, "mine").get_by_role("button", name="Destroy mine")).to_be_visible()
    expect(row(page, "mine").locator(".owner-col")).to_be_hidden()  # admins only
    shoot(page, "sessions-phone")

    # The agents page is not offered, even by URL, and the API refuses it.
    page.goto(console.base + "/console/#/agents")
    expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
    expect(page.get_by_role("heading", name="Agents")).to_have_count(0)
    for path in (
        "/agents",
        "/agents/i-dev-01",
        "/agents/i-dev-01/alloc-map",
        "/agents/i-dev-01/stats",
        "/events/agents",
    ):
        assert page.request.get(console.base + path).status == 403, path
    # The admin sees both sessions.
    names = {s["sessionName"] for s in console.live_sessions()}
    assert {"mine", "admins-own"} <= names

    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    expect(page.locator("#login-error")).to_have_text("You are logged out.")
    assert page.request.get(console.base + "/whoami").status == 401


def test_sessions_page_ages_and_logs(page: Any, console: Console) -> None:
    before_s = time.time()
    created = console.api.post(
        "/session",
        json={
            "image": "shell",
            "type": "batch",
            "name": "printer",
            "startupCommand": "echo hello-from-the-console-logs; sleep 600",
            "config": {"resources": {"cpu": "1"}},
        },
    )
    assert created.status_code == 201, created.text
    session_id = created.json()["sessionId"]

    def logged() -> bool:
        answer = console.api.get(f"/session/{session_id}/logs").json()
        return "hello-from-the-console-logs" in answer["result"]["logs"]

    console.until(logged, "the batch session's line in its logs")

    log_in(page, console, console.admin.email, console.admin.password)
    page.evaluate("window.__notReloaded = true")
    expect(status_of(page, "printer")).to_have_text("RUNNING")
    age = row(page, "printer").locator("td.age")
    expect(age).to_have_text(re.compile(r"^\d+s$"))
    first_s = int(age.inner_text()[:-1])
    assert 0 <= first_s <= time.time() - before_s + 2, first_s  # not from another clock
    # The age keeps counting on the page (no reload, no new event for this session).
    expect(age).not_to_have_text(f"{first_s}s")
    later_s = int(age.inner_text()[:-1])
    assert first_s < later_s <= time.time() - before_s + 2, (first_s, later_s)

    page.get_by_role("button", name="Logs of printer").click()
    logs = page.get_by_role("dialog", name="Logs of printer")
    text = logs.get_by_label("Session logs")
    expect(text).to_contain_text("hello-from-the-console-logs")
    expect(text).not_to_contain_text("(no output yet)")
    logs.get_by_role("button", name="Refresh").click()
    expect(text).to_contain_text("hello-from-the-console-logs")
    logs.get_by_role("button", name="Close").click()
    expect(logs).to_be_hidden()
    assert page.evaluate("window.__notReloaded") is True


def history_row(page: Any, name: str) -> Any:
    return page.locator(f'#history-body tr[data-session-name="{name}"]')


def test_history_keeps_ended_sessions_with_reason_and_logs(page: Any, console: Console) -> None:
    """A batch session that printed and exited, one cancelled while pending and the
    admin's own ended session: the user's History page lists the user's two, most
    recent first, with the reason each ended, and opens the logs the agent kept."""

    def create(client: httpx.Client, body: dict[str, Any]) -> str:
        created = client.post("/session", json=body)
        assert created.status_code == 201, created.text
        session_id: str = created.json()["sessionId"]
        return session_id

    def ended(client: httpx.Client, session_id: str) -> bool:
        status = client.get(f"/session/{session_id}").json()["status"]
        return status in ("TERMINATED", "CANCELLED")

    admins = create(
        console.api,
        {"image": "python", "name": "admins-ended", "config": {"resources": {"cpu": "1"}}},
    )
    console.api.delete(f"/session/{admins}", params={"forced": "true"})
    with logged_in_client(console.base, USER_EMAIL, USER_PASSWORD) as user:
        printed = create(
            user,
            {
                "image": "shell",
                "type": "batch",
                "name": "printed-and-exited",
                "startupCommand": "echo hello-from-an-ended-session; exit 3",
                "config": {"resources": {"cpu": "1"}},
            },
        )
        console.until(lambda: ended(user, printed), "the batch session to end")
        waiting = create(
            user,
            {
                "image": "python",
                "name": "never-ran",
                "enqueueOnly": True,
                "waitForAgents": True,  # more than 2 × 1.0 fGPU: no agent could hold it
                "config": {"resources": {"cuda.shares": "9"}},
            },
        )
        assert user.delete(f"/session/{waiting}").json()["status"] == "CANCELLED"

    log_in(page, console, USER_EMAIL, USER_PASSWORD)
    page.get_by_role("link", name="History").click()
    expect(page.get_by_role("heading", name="History")).to_be_visible()
    rows = page.locator("#history-body tr")
    expect(history_row(page, "printed-and-exited")).to_have_count(1)  # the page has loaded
    names = rows.evaluate_all("(els) => els.map((e) => e.dataset.sessionName)")
    assert names[:2] == ["never-ran", "printed-and-exited"], names  # most recent first
    expect(history_row(page, "admins-ended")).to_have_count(0)  # the admin's is not hers
    expect(history_row(page, "never-ran").locator(".badge")).to_have_text("CANCELLED")
    expect(history_row(page, "never-ran").locator(".reason")).to_contain_text(
        f"destroyed by {USER_EMAIL}"
    )
    printed_row = history_row(page, "printed-and-exited")
    expect(printed_row.locator(".reason")).to_contain_text("exit code 3")
    expect(printed_row.locator(".reason")).to_contain_text("result FAILURE")
    expect(page.locator("#history-range")).to_have_text(re.compile(r"^1–\d+ of \d+$"))
    shoot(page, "history")

    page.get_by_role("button", name="Logs of printed-and-exited").click()
    logs = page.get_by_role("dialog", name="Logs of printed-and-exited")
    expect(logs.get_by_label("Session logs")).to_contain_text("hello-from-an-ended-session")
    logs.get_by_role("button", name="Close").click()
    expect(logs).to_be_hidden()

    # The admin's History has everyone's, the admin's own included.
    page.get_by_role("button", name="Log out").click()
    log_in(page, console, console.admin.email, console.admin.password)
    page.goto(console.base + "/console/#/history")
    expect(history_row(page, "admins-ended")).to_have_count(1)
    expect(history_row(page, "printed-and-exited")).to_have_count(1)


def test_history_pages_through_a_long_history(page: Any, console: Console) -> None:
    """More ended sessions than a page holds: Older and Newer move a page at a time."""
    for i in range(22):  # the page holds 20
        created = console.api.post(
            "/session",
            json={
                "image": "python",
                "name": f"paged-{i:02}",
                "enqueueOnly": True,
                "waitForAgents": True,  # queued (no agent could hold it), then cancelled
                "config": {"resources": {"cuda.shares": "9"}},
            },
        )
        assert created.status_code == 201, created.text
        console.api.delete(f"/session/{created.json()['sessionId']}")
    log_in(page, console, console.admin.email, console.admin.password)
    page.get_by_role("link", name="History").click()
    rows = page.locator("#history-body tr")
    expect(rows).to_have_count(20)
    expect(rows.first).to_have_attribute("data-session-name", "paged-21")
    newer = page.get_by_role("button", name="Newer")
    older = page.get_by_role("button", name="Older")
    expect(newer).to_be_disabled()
    older.click()
    expect(page.locator("#history-range")).to_have_text(re.compile(r"^21–"))
    expect(rows.first).to_have_attribute("data-session-name", "paged-01")
    expect(newer).to_be_enabled()
    newer.click()
    expect(rows.first).to_have_attribute("data-session-name", "paged-21")


def add_domain(console: Console, name: str) -> None:
    """A second domain with a `default` project, written into the dev cluster's SQLite
    database, and the `default` scaling group opened to it (as an operator would: a
    scaling group serves only the domains, projects and keypairs it is associated with)."""
    engine = sa.create_engine(
        f"sqlite:///{console.data_dir / 'manager.db'}", connect_args={"timeout": 30}
    )
    try:
        with orm.Session(engine) as db, db.begin():
            db.add(Domain(name=name, description="a second domain for the e2e tests"))
            db.flush()
            db.add(Group(name="default", domain_name=name))
    finally:
        engine.dispose()
    opened = console.api.post("/admin/scaling-groups/default/associations", json={"domain": name})
    assert opened.status_code in (200, 201), opened.text


def kernel_ids(alloc_map: dict[str, Any]) -> set[str]:
    return {k for d in alloc_map["maps"]["cuda"]["devices"] for k in d["kernels"]}


def test_domain_admin_sees_agents_but_not_other_domains_sessions(
    page: Any, console: Console
) -> None:
    add_domain(console, "lab")
    for email, role, domain in (
        ("dana@example.com", "admin", "default"),
        ("leo@lab.example.com", "user", "lab"),
    ):
        created = console.api.post(
            "/admin/users",
            json={"email": email, "password": f"{role}-password-123", "role": role}
            | {"domain_name": domain},
        )
        assert created.status_code == 201, created.text
    # A session of the admin's domain (the superadmin's) and one of another domain.
    ours = console.api.post(
        "/session",
        json={
            "image": "python",
            "name": "ours",
            "config": {"resources": {"cpu": "1", "cuda.shares": "0.3"}},
        },
    )
    assert ours.status_code == 201, ours.text
    with logged_in_client(console.base, "leo@lab.example.com", "user-password-123") as leo:
        theirs = leo.post(
            "/session",
            json={
                "image": "python",
                "name": "lab-secret",
                "config": {"resources": {"cpu": "1", "cuda.shares": "0.5"}},
            },
        )
        assert theirs.status_code == 201, theirs.text
    info = {
        name: console.api.get(f"/session/{answer.json()['sessionId']}").json()
        for name, answer in (("ours", ours), ("theirs", theirs))
    }
    assert info["theirs"]["domainName"] == "lab"
    our_kernel = info["ours"]["kernels"][0]["kernelId"]
    their_kernel = info["theirs"]["kernels"][0]["kernelId"]

    # 201 means accepted; the kernels reach the agent's map when the binds have landed.
    def both_mapped() -> dict[str, Any] | None:
        answer: dict[str, Any] = console.api.get("/agents/i-dev-01/alloc-map").json()
        return answer if kernel_ids(answer) == {our_kernel, their_kernel} else None

    full = console.until(both_mapped, "both kernels in the agent's allocation map")
    assert kernel_ids(full) == {our_kernel, their_kernel}  # the superadmin sees all

    log_in(page, console, "dana@example.com", "admin-password-123")
    expect(page.locator("#who-role")).to_have_text("admin")
    # Sessions: the domain's only, with their owner column.
    expect(status_of(page, "ours")).to_have_text("RUNNING")
    expect(row(page, "lab-secret")).to_have_count(0)
    expect(row(page, "ours").locator(".owner-col")).to_be_visible()

    # Agents: offered to a domain admin; the other domain's kernel is anonymous.
    page.get_by_role("link", name="Agents").click()
    expect(page.get_by_role("heading", name="Agents", exact=True)).to_be_visible()
    expect(page.locator("#agents-live")).to_have_text("Live")
    gpus = page.locator('article.agent[data-agent-id="i-dev-01"] .device[data-slot="cuda.shares"]')
    expect(gpus).to_have_count(2)
    expect(gpus.locator(".holder-name").filter(has_text="ours")).to_have_count(1)
    expect(gpus.locator(".holder-name.hidden-holder")).to_have_text([HIDDEN_HOLDER])
    expect(gpus.locator(".holders li").filter(has_text=HIDDEN_HOLDER)).to_contain_text("0.50 fGPU")
    # The bars still add up: 0.3 + 0.5 over the cluster.
    expect(page.locator('.summary-item[data-slot="cuda.shares"] .meter-text')).to_have_text(
        "0.80 / 2.00 fGPU"
    )
    for secret in ("lab-secret", their_kernel, info["theirs"]["sessionId"]):
        assert secret not in page.content(), secret
    for term in ("Utilisation", "Memory", "Power", "Temperature"):
        expect(gpus.locator("dt").filter(has_text=term)).to_have_count(2)
    shoot(page, "agents-admin")

    # The same through the API with the admin's cookie: read access, nothing of "lab".
    get = page.request.get
    assert get(console.base + "/agents").json()["items"][0]["id"] == "i-dev-01"
    assert get(console.base + "/agents/i-dev-01/stats").json()["agent_id"] == "i-dev-01"
    live = get(console.base + "/agents/i-dev-01/alloc-map").json()
    assert kernel_ids(live) == {our_kernel, "hidden-1"}
    assert get(console.base + "/agents/i-dev-01/alloc-map?form=compat").ok
    detail = get(console.base + "/agents/i-dev-01")
    assert detail.ok
    for secret in ("lab-secret", their_kernel, info["theirs"]["sessionId"]):
        assert secret not in detail.text()
        assert secret not in get(console.base + "/agents").text()


def test_launch_dialog_offers_the_image_catalogue(page: Any, console: Console) -> None:
    """The demo catalogue of `dev up` as a picker: a group per image name, an option per
    version naming its aliases and accelerators, the picked image described under it,
    "Another image" for a name typed by hand, and a session per picked image."""
    log_in(page, console, USER_EMAIL, USER_PASSWORD)
    page.get_by_role("button", name="Launch sessions").click()
    dialog = page.get_by_role("dialog", name="Launch sessions")
    picker = dialog.get_by_label("Image", exact=True)
    expect(picker.locator("optgroup[label=demo-lib] option")).to_have_count(2)
    values = picker.locator("option").evaluate_all("(els) => els.map((e) => e.value)")
    assert {"demo-lib:1.0", "demo-lib:2.0", OTHER_IMAGE} <= set(values), values
    assert any(v.startswith("python:") for v in values), values
    expect(picker).to_have_value(re.compile(r"^python:"))  # the image aliased python
    expect(picker.locator('option[value="demo-lib:2.0"]')).to_have_text(
        "demo-lib:2.0 (demo-lib) · CPU only"
    )
    expect(picker.locator('option[value^="python:"]')).to_contain_text("cuda")
    hint = dialog.locator("#hint-image")
    picker.select_option("demo-lib:1.0")
    expect(hint).to_contain_text("demo-lib:1.0 · A virtualenv with demo-lib 1.0")
    expect(hint).to_contain_text("accelerators: none")
    expect(dialog.get_by_label("Image name")).to_be_hidden()
    pick_image(dialog, "demo-lib")  # an alias, typed
    expect(hint).to_contain_text("demo-lib → demo-lib:2.0")
    pick_image(dialog, "no-such-image")
    expect(hint).to_have_text("Not in the image catalogue: sent as typed.")
    shoot(page, "launch-images")
    dialog.get_by_role("button", name="Cancel").click()

    launch(page, "lib-one", image="demo-lib:1.0")
    launch(page, "lib-latest", image="demo-lib")
    expect(status_of(page, "lib-one")).to_have_text("RUNNING")
    expect(status_of(page, "lib-latest")).to_have_text("RUNNING")
    expect(row(page, "lib-one").locator("td.image")).to_have_text("demo-lib:1.0")
    expect(row(page, "lib-latest").locator("td.image")).to_have_text("demo-lib:2.0")
    destroy(page, "lib-one")
    destroy(page, "lib-latest")


def test_launch_dialog_shows_the_refusal_of_an_unknown_image(page: Any, console: Console) -> None:
    """A name neither in the catalogue nor among the agent's environments is refused by
    the server; the dialog stays open with its reason (focused) and nothing is created."""
    log_in(page, console, USER_EMAIL, USER_PASSWORD)
    page.get_by_role("button", name="Launch sessions").click()
    dialog = page.get_by_role("dialog", name="Launch sessions")
    pick_image(dialog, "pyhton")
    dialog.get_by_label("Number of sessions").fill("3")
    dialog.get_by_role("button", name="Launch", exact=True).click()
    error = dialog.locator("#launch-error")
    expect(error).to_contain_text("0 launched, 3 refused")
    expect(error).to_contain_text("Unknown image 'pyhton'")
    expect(error).to_contain_text("did you mean python")
    expect(error).to_be_focused()
    expect(dialog.locator("#err-image")).to_contain_text("Unknown image 'pyhton'")
    expect(dialog.get_by_label("Image name")).to_have_attribute("aria-invalid", "true")
    shoot(page, "launch-unknown-image")
    assert console.live_sessions() == []
    # corrected, the same dialog launches (the agent's "shell" environment is known too)
    pick_image(dialog, "shell")
    expect(dialog.locator("#err-image")).to_be_hidden()
    dialog.get_by_label("Number of sessions").fill("1")
    dialog.get_by_label("Name (optional)").fill("known-shell")
    dialog.get_by_role("button", name="Launch", exact=True).click()
    expect(dialog).to_be_hidden()
    expect(status_of(page, "known-shell")).to_have_text("RUNNING")


def test_launch_dialog_validates_before_submitting(page: Any, console: Console) -> None:
    log_in(page, console, console.admin.email, console.admin.password)
    page.get_by_role("button", name="Launch sessions").click()
    dialog = page.get_by_role("dialog", name="Launch sessions")
    pick_image(dialog, "")
    dialog.get_by_label("Name (optional)").fill("bad name!")
    dialog.get_by_label("Number of sessions").fill("0")
    dialog.get_by_label("CPU (Core)", exact=True).fill("1.5")
    gpu = dialog.get_by_label("GPU (fGPU)", exact=True)
    gpu.fill("0.25")
    dialog.get_by_role("button", name="Launch", exact=True).click()

    expect(dialog.locator("#err-image")).to_have_text(
        "Pick an image, or type the name of another one."
    )
    expect(dialog.locator("#err-name")).to_contain_text("1–64 letters")
    expect(dialog.locator("#err-count")).to_have_text("Launch between 1 and 10 sessions at once.")
    expect(dialog.locator("#err-res-cpu")).to_have_text("CPU (Core) must be a whole number.")
    expect(dialog.locator("#err-res-cuda-shares")).to_have_text(
        "0.25 fGPU is not a multiple of the quantum 0.1: use 0.2 or 0.3."
    )
    expect(gpu).to_have_attribute("aria-invalid", "true")
    shoot(page, "launch-validation")

    gpu.fill("3")  # more than one agent has (2 × 1.0)
    expect(dialog.locator("#err-res-cuda-shares")).to_have_text(
        "GPU (fGPU): at most 2.00 fGPU fits on one agent."
    )
    gpu.fill("0.3")  # fixed: the message goes away as the value is corrected
    expect(dialog.locator("#err-res-cuda-shares")).to_be_hidden()
    dialog.get_by_label("CPU (Core)", exact=True).fill("0")
    expect(dialog.locator("#err-res-cpu")).to_have_text("CPU (Core) must be more than 0.")
    # The slider and the number are one value, on the quantum's grid.
    slider = dialog.get_by_label("GPU (fGPU) slider")
    expect(slider).to_have_attribute("step", "0.1")
    expect(slider).to_have_attribute("max", "2")
    slider.fill("0.7")
    expect(gpu).to_have_value("0.7")
    expect(dialog).to_be_visible()
    assert console.live_sessions() == []  # nothing was sent


MIG_SLOTS = {"20g": 1, "10g": 2, "5g": 4}  # profile -> slices in cuda-mock-mig.toml
FORM_ROLES = ("textbox", "spinbutton", "slider", "checkbox", "combobox")


def accessible_names(dialog: Any) -> list[str]:
    """The names Chromium computes for every form control of the dialog (its
    accessibility tree, as a screen reader would announce them)."""
    pattern = re.compile(rf'^\s*- ({"|".join(FORM_ROLES)}) "([^"]*)"', re.MULTILINE)
    return [f"{role}: {name}" for role, name in pattern.findall(dialog.aria_snapshot())]


def test_whole_and_mig_devices_labels_chips_and_bars(mig_page: Any, mig_console: Console) -> None:
    page, console = mig_page, mig_console
    log_in(page, console, console.admin.email, console.admin.password)
    page.get_by_role("button", name="Launch sessions").click()
    dialog = page.get_by_role("dialog", name="Launch sessions")
    expect(dialog.get_by_role("checkbox")).to_have_count(len(MIG_SLOTS))

    # Every control has its own accessible name (three "MIG GPU (GPU)" inputs were
    # indistinguishable), and each control of the form is in the accessibility tree.
    dialog.get_by_text("Advanced resource options").click()  # its select too
    names = accessible_names(dialog)
    # (hidden ones aside: the typed image's field shows only for "Another image")
    controls = dialog.locator("input:visible, select:visible").count()
    assert len(names) == controls, (names, controls)
    assert len(set(names)) == len(names), names
    assert all(name.split(": ", 1)[1].strip() for name in names), names
    for profile in MIG_SLOTS:
        assert f"checkbox: MIG GPU {profile} (one slice)" in names, names
    assert "spinbutton: GPU (GPU)" in names, names
    assert "slider: GPU (GPU) slider" in names, names

    # A unique slot is a checkbox (exactly 1 or nothing); whole GPUs are whole numbers.
    whole = dialog.get_by_label("GPU (GPU)", exact=True)
    whole.fill("1.5")
    dialog.get_by_role("button", name="Launch", exact=True).click()
    expect(dialog.locator("#err-res-cuda-device")).to_have_text("GPU (GPU) must be a whole number.")
    whole.fill("3")
    expect(dialog.locator("#err-res-cuda-device")).to_have_text(
        "GPU (GPU): at most 2 GPU fits on one agent."
    )
    slice_box = dialog.get_by_role("checkbox", name="MIG GPU 10g (one slice)")
    expect(slice_box).not_to_be_checked()
    expect(dialog.locator("#hint-res-cuda-device-10g-mig")).to_contain_text("exactly 1")
    dialog.get_by_role("button", name="Cancel").click()
    assert console.live_sessions() == []

    launch(page, "whole", fill={"GPU (GPU)": "1"})
    launch(page, "slice", check=("MIG GPU 10g (one slice)",), screenshot="launch-mig")
    expect(status_of(page, "whole")).to_have_text("RUNNING")
    expect(status_of(page, "slice")).to_have_text("RUNNING")
    requested = {s["sessionName"]: s["requestedSlots"] for s in console.live_sessions()}
    assert requested["slice"]["cuda.device:10g-mig"] == "1"
    assert "cuda.device" not in requested["slice"]
    assert requested["whole"]["cuda.device"] == "1"
    # Chips tell a whole GPU from a MIG slice.
    expect(row(page, "whole").locator('.chip[data-slot="cuda.device"]')).to_have_text("1 GPU")
    expect(row(page, "slice").locator('.chip[data-slot="cuda.device:10g-mig"]')).to_have_text(
        "1 GPU (MIG 10g)"
    )

    page.get_by_role("link", name="Agents").click()
    summary = page.locator("#cluster-summary")
    expect(summary.locator('.summary-item[data-slot="cuda.device"] .meter-text')).to_have_text(
        "1 / 2 GPU"
    )
    for profile, slices in MIG_SLOTS.items():
        item = summary.locator(f'.summary-item[data-slot="cuda.device:{profile}-mig"]')
        expect(item.locator("h3")).to_contain_text(f"MIG GPU {profile}")
        used = 1 if profile == "10g" else 0
        expect(item.locator(".meter-text")).to_have_text(f"{used} / {slices} GPU")
        expect(item.get_by_role("meter")).to_have_attribute("aria-valuenow", str(used))

    agent = page.locator('article.agent[data-agent-id="i-dev-01"]')
    gpus = agent.locator('.device[data-slot="cuda.device"]')
    expect(gpus).to_have_count(2)
    expect(gpus.locator(".meter-text").filter(has_text="1 / 1 GPU")).to_have_count(1)
    expect(gpus.locator(".meter-text").filter(has_text="0 / 1 GPU")).to_have_count(1)
    taken = gpus.filter(has_text="1 / 1 GPU")
    expect(taken.locator(".holder-name")).to_have_text(["whole"])
    expect(taken.locator(".holders li")).to_have_text(["whole 1 GPU"])
    expect(gpus.filter(has_text="0 / 1 GPU").locator(".holders")).to_have_text("free")
    for profile, slices in MIG_SLOTS.items():
        devices = agent.locator(f'.device[data-slot="cuda.device:{profile}-mig"]')
        expect(devices).to_have_count(slices)
        expect(devices.locator(".device-name").filter(has_text=f"MIG-{profile}")).to_have_count(
            slices
        )
        for term in ("Utilisation", "Memory", "Power", "Temperature"):
            expect(devices.locator("dt").filter(has_text=term)).to_have_count(slices)
    tens = agent.locator('.device[data-slot="cuda.device:10g-mig"]')
    expect(tens.locator(".meter-text").filter(has_text="1 / 1 GPU")).to_have_count(1)
    expect(tens.locator(".meter-text").filter(has_text="0 / 1 GPU")).to_have_count(1)
    expect(tens.filter(has_text="1 / 1 GPU").locator(".holders li")).to_have_text(
        ["slice 1 GPU (MIG 10g)"]
    )
    expect(agent.locator('.chip[data-slot="cuda.device:10g-mig"]')).to_have_text(
        "MIG GPU 10g: 1 / 2 GPU"
    )
    shoot(page, "agents-mig")

    # Freeing the slice shows at once on the page.
    page.get_by_role("link", name="Sessions").click()
    destroy(page, "slice")
    page.get_by_role("link", name="Agents").click()
    expect(tens.locator(".meter-text")).to_have_text(["0 / 1 GPU", "0 / 1 GPU"])


FORMAT_CASES = """async () => {
  const f = await import("/console/format.js");
  const details = {
    "cuda.shares": {human_readable_name: "GPU", display_unit: "fGPU", number_format: {binary: false, round_length: 2}},
    mem: {display_unit: "GiB", number_format: {binary: true, round_length: 0}},
    cpu: {display_unit: "Core", number_format: {binary: false, round_length: 0}},
    "cuda.device": {human_readable_name: "GPU", display_unit: "GPU", number_format: {round_length: 0}},
    "cuda.device:10g-mig": {human_readable_name: "MIG GPU", display_unit: "GPU", number_format: {round_length: 0}},
    "x.device:1g-mig": {human_readable_name: "Accel", display_unit: "dev", number_format: {round_length: 0}},
  };
  const l = await import("/console/launch.js");
  const unique = {slot: "cuda.device:10g-mig", label: "MIG GPU 10g", unit: "GPU", unique: true,
                  quantum: null, whole: true, required: false, max: 2, maxText: "2"};
  return {
    shares: f.formatAmount(details, "cuda.shares", "0.5"),
    mem: f.formatAmount(details, "mem", "2147483648"),
    halfGib: f.formatAmount(details, "mem", "1610612736"),
    cpu: f.formatAmount(details, "cpu", "2"),
    unknown: f.formatAmount(details, "tpu.device", "3"),
    onGrid: f.checkQuantum("1.2", "0.1"),
    offGrid: f.checkQuantum("0.25", "0.1"),
    tiny: f.checkQuantum("0.05", "0.1"),
    float: f.checkQuantum("0.3", "0.1"),  // 0.3 / 0.1 is not an integer in floats
    whole: [f.isWholeNumber("2"), f.isWholeNumber("2.0"), f.isWholeNumber("1.5")],
    slots: f.formatSlots(details, {"cuda.shares": "0.2", mem: "1073741824", cpu: "1", x: "0"}),
    age: [f.age("2026-01-01T00:00:00Z", Date.parse("2026-01-01T02:05:09Z"))],
    labels: ["cuda.device", "cuda.device:10g-mig", "x.device:1g-mig", "y.z:a"].map((s) => f.slotLabel(details, s)),
    chips: [f.formatAmount(details, "cuda.device", "1"), f.formatAmount(details, "cuda.device:10g-mig", "1")],
    unique: ["0", "1", "2", "0.5"].map((v) => l.slotProblem(unique, v)),
    pending: [
      {kind: "no-agent", devices: [{agent: "i-1", slot: "cuda.shares", needs: "0.5", devices: [
        {id: "d-a", free: "0", capacity: "1"}, {id: "d-b", free: "0", capacity: "1"}]}]},
      {kind: "no-agent", devices: [
        {agent: "i-1", slot: "cuda.shares", needs: "1.5", devices: [
          {id: "d-a", free: "0.4", capacity: "1"}, {id: "d-b", free: "0", capacity: "1"},
          {id: "d-c", free: "0.8", capacity: "1"}]},
        {agent: "i-2", slot: "cuda.shares", needs: "1.5", devices: [{id: "d-d", free: "0.2", capacity: "1"}]}]},
      {kind: "no-agent", devices: []},
      {kind: "predicate", devices: [{agent: "i-1", slot: "cuda.shares", needs: "1", devices: []}]},
      undefined,
    ].map((scheduler) => f.pendingReason(details, scheduler)),
  };
}"""


def test_slot_formatting_and_quantum_checks(browser: Any, console: Console) -> None:
    """format.js's pure helpers, run where they run: in the browser."""
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(console.base + "/console/")
        result = page.evaluate(FORMAT_CASES)
    finally:
        context.close()
    assert result["shares"] == "0.50 fGPU"
    assert result["mem"] == "2 GiB"
    assert result["halfGib"] == "1.5 GiB"  # rounding would hide half a GiB
    assert result["cpu"] == "2 Core"
    assert result["unknown"] == "3"
    assert result["onGrid"] == {"ok": True}
    assert result["offGrid"] == {"ok": False, "below": "0.2", "above": "0.3"}
    assert result["tiny"] == {"ok": False, "below": "0", "above": "0.1"}
    assert result["float"] == {"ok": True}
    assert result["whole"] == [True, True, False]
    assert [s["text"] for s in result["slots"]] == ["1 Core", "1 GiB", "0.20 fGPU"]
    assert result["age"] == ["2h 5m"]
    assert result["labels"] == ["GPU", "MIG GPU 10g", "Accel MIG 1g", "y.z:a"]
    assert result["chips"] == ["1 GPU", "1 GPU (MIG 10g)"]
    refused = "MIG GPU 10g (GPU) is a whole slice: request exactly 1, or 0 for none."
    assert result["unique"] == ["", "", refused, refused]
    assert result["pending"] == [
        "Needs 0.50 fGPU: GPU 0 and GPU 1 are full (0.00 of 1.00 fGPU free each).",
        "Needs 1.50 fGPU on i-1: GPU 0 has 0.40 of 1.00 fGPU free; GPU 1 is full (0.00 of 1.00"
        " fGPU free); GPU 2 has 0.80 of 1.00 fGPU free. Needs 1.50 fGPU on i-2: GPU 0 has 0.20"
        " of 1.00 fGPU free.",
        None,
        None,
        None,
    ]


def test_terminal_runs_nvidia_smi_in_a_half_gpu_session(page: Any, console: Console) -> None:
    log_in(page, console, USER_EMAIL, USER_PASSWORD)
    launch(page, "half-gpu", "0.5")
    expect(status_of(page, "half-gpu")).to_have_text("RUNNING")
    with page.expect_popup() as popup_info:
        page.get_by_role("link", name="Terminal of half-gpu").click()
    term = popup_info.value
    screen = term.locator(".xterm-rows")
    expect(term.locator("#term-state")).to_have_text("Live")
    term.locator("#term").click()
    term.keyboard.type("nvidia-smi\n")
    # two-fgpu: 0.5 fGPU of a 2 GiB GPU at unit_mem 2 GiB is 1024 MiB.
    expect(screen).to_contain_text("1024MiB")
    expect(screen).to_contain_text("0.50 of 1.00 shares = 1024MiB")
    shoot(term, "terminal")

    # Resize: the pty follows the window (xterm's fit addon -> a resize message).
    term.set_viewport_size({"width": 700, "height": 500})
    term.wait_for_function("window.accelshareTerminal.cols < 90")
    cols, rows = term.evaluate("[window.accelshareTerminal.cols, window.accelshareTerminal.rows]")
    term.keyboard.type("clear; stty size\n")
    expect(screen).to_contain_text(f"{rows} {cols}")

    # Paste goes through xterm's paste path (bracketed paste when the shell asks for it).
    term.evaluate("window.accelshareTerminal.paste('echo pasted-$((6*7))')")
    term.keyboard.press("Enter")
    expect(screen).to_contain_text("pasted-42")

    # The shell ends: the page says so and reconnects to a new shell on request.
    term.keyboard.type("exit\n")
    expect(term.locator("#term-state")).to_have_text("Closed.")
    term.get_by_role("button", name="Reconnect").click()
    expect(term.locator("#term-state")).to_have_text("Live")
    term.locator("#term").click()
    term.keyboard.type("echo again-$((1+1))\n")
    expect(screen).to_contain_text("again-2")
    term.close()


# The kernel's app: http.server on its port ($BACKENDAI_SERVICE_PORT_WEB, the agent's host
# port for it), and probe.html, whose script tries to read the console's API with the
# user's login, from the app's origin and from the console's.
APP_WITH_PROBE = """
import http.server, os, sys
with open("probe.html", "w") as f:
    f.write(sys.argv[1])
port = int(os.environ["BACKENDAI_SERVICE_PORT_WEB"])
http.server.ThreadingHTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler
    ).serve_forever()
"""
PROBE_PAGE = """<!doctype html><title>probe</title><pre id="out">running</pre><script>
async function attempt(url) {
  try {
    const r = await fetch(url, { credentials: "include" });
    return r.status + ":" + (await r.text()).slice(0, 40).replace(/\\s+/g, " ");
  } catch (e) { return "blocked"; }
}
(async () => {
  const here = await attempt("/sessions");
  const console_ = await attempt("CONSOLE/sessions");
  const cookie = document.cookie.includes("accelshare") ? "visible" : "hidden";
  document.getElementById("out").textContent = [here, console_, cookie].join("|");
})();
</script>"""


def _app_answers(base: str, path: str, email: str, password: str) -> bool:
    """The browser's way in httpx: the console's link, the hand-off, the app."""
    with logged_in_client(base, email, password) as user:
        moved = user.get(path, headers={"Sec-Fetch-Mode": "navigate"})
        if moved.status_code != 303:
            return False
    with httpx.Client(timeout=30) as browser:
        return bool(
            browser.get(moved.headers["location"], follow_redirects=True).status_code == 200
        )


def test_app_service_page_through_the_proxy(page: Any, console: Console) -> None:
    probe = PROBE_PAGE.replace("CONSOLE", console.base)
    with logged_in_client(console.base, USER_EMAIL, USER_PASSWORD) as alice:
        created = alice.post(
            "/session",
            json={
                "image": "python",
                "type": "batch",
                "name": "web-app",
                "startupCommand": f"python -c {shlex.quote(APP_WITH_PROBE)} {shlex.quote(probe)}",
                "config": {
                    "resources": {"cpu": "1"},
                    "service_ports": [{"name": "web", "protocol": "http", "port": 8888}],
                },
            },
        )
        assert created.status_code == 201, created.text
        session_id = created.json()["sessionId"]
    app_path = f"/session/{session_id}/apps/web/"
    console.until(
        lambda: _app_answers(console.base, app_path, USER_EMAIL, USER_PASSWORD),
        "the app service to answer through the proxy",
    )
    log_in(page, console, USER_EMAIL, USER_PASSWORD)
    expect(status_of(page, "web-app")).to_have_text("RUNNING")
    with page.expect_popup() as popup_info:
        page.get_by_role("link", name="App web of web-app").click()
    app_page = popup_info.value
    expect(app_page.get_by_role("heading", name="Directory listing for /")).to_be_visible()
    # Handed off to the apps origin, an origin of its own.
    assert app_page.url == f"{console.apps}{app_path}"
    # An app page's script cannot read the console's API with the user's login: the
    # apps origin serves no API (404), the console's origin answers it no CORS, and no
    # cookie is readable by script.
    app_page.goto(f"{console.apps}{app_path}probe.html")
    expect(app_page.locator("#out")).not_to_have_text("running")
    here, from_console, cookie = app_page.locator("#out").inner_text().split("|")
    assert here.startswith("404:"), here
    assert from_console == "blocked", from_console
    assert cookie == "hidden"
    app_page.close()
    # Another browser without the login cookie is refused, on either origin.
    assert httpx.get(f"{console.base}{app_path}").status_code == 401
    assert httpx.get(f"{console.apps}{app_path}").status_code == 401


def test_owner_column_shows_emails_with_the_key_on_hover(page: Any, console: Console) -> None:
    """An admin's Owner column names each owner by e-mail; the access key is its title."""
    with logged_in_client(console.base, USER_EMAIL, USER_PASSWORD) as alice:
        created = alice.post(
            "/session",
            json={"image": "python", "name": "alices", "config": {"resources": {"cpu": "1"}}},
        )
        assert created.status_code == 201, created.text
        alice_key = alice.get("/whoami").json()["access_key"]
    (listed,) = console.live_sessions()
    assert listed["ownerEmail"] == USER_EMAIL
    assert listed["accessKey"] == alice_key

    log_in(page, console, console.admin.email, console.admin.password)
    owner = row(page, "alices").locator(".owner-col")
    expect(owner).to_have_text(USER_EMAIL)
    expect(owner).to_have_attribute("title", re.compile(rf"^{re.escape(alice_key)}\b"))
    assert alice_key not in row(page, "alices").inner_text()
    page.set_viewport_size({"width": 390, "height": 844})
    expect(owner).to_be_visible()
    expect(owner).to_contain_text(USER_EMAIL)
    box = owner.bounding_box()
    assert box is not None
    assert box["x"] + box["width"] <= 390, box

    # The History page names the owner the same way.
    page.get_by_role("button", name="Destroy alices").click()
    page.get_by_role("dialog", name="Destroy session?").get_by_role(
        "button", name="Destroy"
    ).click()
    expect(row(page, "alices")).to_have_count(0)
    page.get_by_role("link", name="History").click()
    ended = history_row(page, "alices").locator(".owner-col")
    expect(ended).to_have_text(USER_EMAIL)
    expect(ended).to_have_attribute("title", re.compile(rf"^{re.escape(alice_key)}\b"))


def test_terminal_titled_by_name_keeps_the_login_and_tells_the_session_ended(
    page: Any, console: Console
) -> None:
    """The terminal tab: titled by the session's name; its brand link goes back to the
    console without the password (a new tab has no CSRF token until it reads it again);
    a session destroyed under it says "the session ended", not a shell's exit."""
    with logged_in_client(console.base, USER_EMAIL, USER_PASSWORD) as alice:
        created = alice.post(
            "/session",
            json={"image": "shell", "name": "ends-under-me", "config": {"resources": {"cpu": "1"}}},
        )
        assert created.status_code == 201, created.text
        session_id = created.json()["sessionId"]
    log_in(page, console, USER_EMAIL, USER_PASSWORD)
    expect(status_of(page, "ends-under-me")).to_have_text("RUNNING")
    with page.expect_popup() as popup_info:
        page.get_by_role("link", name="Terminal of ends-under-me").click()
    term = popup_info.value
    expect(term.locator("#term-state")).to_have_text("Live")
    expect(term).to_have_title("Terminal of ends-under-me · accelshare")
    expect(term.get_by_role("heading", name="Terminal of ends-under-me")).to_be_visible()
    assert session_id[:8] not in term.title()
    term.set_viewport_size({"width": 390, "height": 844})
    heading = term.locator("#term-title")
    expect(heading).to_be_visible()
    box = heading.bounding_box()
    assert box is not None
    assert box["x"] + box["width"] <= 390, box

    # Destroyed from the console: the terminal says the session ended.
    destroy(page, "ends-under-me")
    expect(term.locator("#term-state")).to_have_text("The session ended.")
    screen = term.locator(".xterm-rows")
    expect(screen).to_contain_text("[the session ended]")
    expect(screen).not_to_contain_text("the shell exited")
    expect(term.get_by_role("button", name="Reconnect")).to_be_hidden()
    shoot(term, "terminal-ended-phone")

    # The brand link keeps the console's login, and the tab can change things (CSRF).
    term.get_by_role("link", name="accelshare").click()
    expect(term.get_by_role("heading", name="Sessions")).to_be_visible()
    expect(term.get_by_role("heading", name="Log in")).to_be_hidden()
    expect(term.locator("#who-email")).to_have_text(USER_EMAIL)
    launch(term, "from-the-terminal-tab", "0.1")
    expect(status_of(term, "from-the-terminal-tab")).to_have_text("RUNNING")
    term.close()


def test_terminal_and_app_links_only_for_who_may_enter(page: Any, console: Console) -> None:
    """A domain admin sees the domain's sessions but may not enter them (4403): no
    Terminal link for a user's session, on a desktop or a phone; its own has one."""
    created = console.api.post(
        "/admin/users",
        json={"email": "dora@example.com", "password": "admin-password-123", "role": "admin"},
    )
    assert created.status_code == 201, created.text
    for email, password, name in (
        (USER_EMAIL, USER_PASSWORD, "users-own"),
        ("dora@example.com", "admin-password-123", "doras-own"),
    ):
        with logged_in_client(console.base, email, password) as client:
            answer = client.post(
                "/session",
                json={"image": "python", "name": name, "config": {"resources": {"cpu": "1"}}},
            )
            assert answer.status_code == 201, answer.text

    log_in(page, console, "dora@example.com", "admin-password-123")
    expect(status_of(page, "users-own")).to_have_text("RUNNING")
    expect(status_of(page, "doras-own")).to_have_text("RUNNING")
    expect(page.get_by_role("link", name="Terminal of doras-own")).to_be_visible()
    expect(page.get_by_role("link", name="Terminal of users-own")).to_have_count(0)
    expect(row(page, "users-own").get_by_role("button", name="Destroy users-own")).to_be_enabled()
    page.set_viewport_size({"width": 390, "height": 844})
    expect(page.get_by_role("link", name="Terminal of doras-own")).to_be_visible()
    expect(page.get_by_role("link", name="Terminal of users-own")).to_have_count(0)
    page.get_by_role("button", name="Log out").click()

    # The superadmin may enter anyone's; the user her own.
    log_in(page, console, console.admin.email, console.admin.password)
    expect(page.get_by_role("link", name="Terminal of users-own")).to_be_visible()
    # (not "Log out": that ends every console login of the superadmin, the module's
    # shared API client's included)
    page.context.clear_cookies()
    page.reload()
    log_in(page, console, USER_EMAIL, USER_PASSWORD)
    expect(page.get_by_role("link", name="Terminal of users-own")).to_be_visible()


def test_launch_dialog_resources_fit_a_phone(page: Any, console: Console) -> None:
    """At 390 × 844 the "Resources per session" box stays inside the screen and every
    unit label is shown whole (not cut by the box or squeezed by the slider)."""
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, console, USER_EMAIL, USER_PASSWORD)
    page.get_by_role("button", name="Launch sessions").click()
    dialog = page.get_by_role("dialog", name="Launch sessions")
    expect(dialog).to_be_visible()
    box = page.get_by_role("group", name="Resources per session")
    expect(box).to_be_visible()
    outer = box.bounding_box()
    dialog_box = dialog.bounding_box()
    assert outer is not None
    assert dialog_box is not None
    assert outer["x"] >= 0, outer
    assert outer["x"] + outer["width"] <= 390, outer
    assert outer["x"] + outer["width"] <= dialog_box["x"] + dialog_box["width"], (outer, dialog_box)
    units = box.locator(".unit")
    assert units.count() >= 3  # CPU, memory, GPU
    for i in range(units.count()):
        unit = units.nth(i)
        expect(unit).to_be_visible()
        ub = unit.bounding_box()
        assert ub is not None
        assert ub["x"] + ub["width"] <= outer["x"] + outer["width"], (unit.inner_text(), ub, outer)
        whole = unit.evaluate("(el) => el.scrollWidth <= el.clientWidth && el.clientWidth > 0")
        assert whole, unit.inner_text()
    for number in box.locator('input[type="number"]').all():
        nb = number.bounding_box()
        assert nb is not None
        assert nb["x"] + nb["width"] <= outer["x"] + outer["width"], nb
    shoot(page, "launch-phone")


def test_launch_dialog_disables_accelerators_the_image_cannot_use(
    page: Any, console: Console
) -> None:
    """demo-lib's hint says "accelerators: none": its GPU field is disabled at 0, with
    the reason; another image gives it back.  A refusal of the slot by the server (here
    a catalogue that claimed cuda) names the field as the dialog does, not cuda.shares."""
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, console, USER_EMAIL, USER_PASSWORD)
    page.get_by_role("button", name="Launch sessions").click()
    dialog = page.get_by_role("dialog", name="Launch sessions")
    gpu = dialog.get_by_label("GPU (fGPU)", exact=True)
    slider = dialog.get_by_label("GPU (fGPU) slider")
    gpu.fill("0.5")
    pick_image(dialog, "demo-lib")
    expect(dialog.locator("#hint-image")).to_contain_text("accelerators: none")
    expect(gpu).to_be_disabled()
    expect(slider).to_be_disabled()
    expect(gpu).to_have_value("0")
    note = dialog.locator("#unused-res-cuda-shares")
    expect(note).to_have_text("Not used by demo-lib:2.0 (accelerators: none).")
    expect(gpu).to_have_accessible_description(re.compile("Not used by demo-lib:2.0"))
    expect(dialog.get_by_label("CPU (Core)", exact=True)).to_be_enabled()
    shoot(page, "launch-no-accelerators")
    pick_image(dialog, "python")
    expect(gpu).to_be_enabled()
    expect(gpu).to_have_value("0.5")  # what the user had typed
    expect(note).to_be_hidden()
    pick_image(dialog, "demo-lib")
    dialog.get_by_label("Name (optional)").fill("lib-no-gpu")
    dialog.get_by_role("button", name="Launch", exact=True).click()
    expect(dialog).to_be_hidden()
    (launched,) = [s for s in console.live_sessions() if s["sessionName"] == "lib-no-gpu"]
    assert "cuda.shares" not in launched["requestedSlots"]

    # A catalogue that says otherwise: the server refuses, in the dialog's words.
    def claim_cuda(route: Any) -> None:
        answer = route.fetch()
        body = answer.json()
        for item in body["items"]:
            item["accelerators"] = ["cuda"]
        route.fulfill(response=answer, json=body)

    page.route("**/images", claim_cuda)
    page.get_by_role("button", name="Launch sessions").click()
    pick_image(dialog, "demo-lib")
    expect(dialog.locator("#hint-image")).to_contain_text("accelerators: cuda")
    gpu.fill("0.5")
    dialog.get_by_label("Name (optional)").fill("lib-with-gpu")
    dialog.get_by_role("button", name="Launch", exact=True).click()
    error = dialog.locator("#launch-error")
    expect(error).to_contain_text("0 launched, 1 refused")
    expect(error).to_be_focused()  # a keyboard user lands on the server's reason
    expect(error).to_contain_text("GPU (fGPU)")
    expect(error).not_to_contain_text("cuda.shares")
    expect(dialog.locator("#err-res-cuda-shares")).to_contain_text("drop GPU (fGPU)")
    expect(gpu).to_have_attribute("aria-invalid", "true")
    assert [s["sessionName"] for s in console.live_sessions()] == ["lib-no-gpu"]


def test_keyboard_focus_after_login_destroy_and_refusal(page: Any, console: Console) -> None:
    """The first Tab after the login reaches the skip link; a session destroyed from the
    keyboard hands the focus to the next row's Destroy button, the last one to the
    page's heading (never <body>); on a phone too."""
    for name in ("kb-one", "kb-two"):
        created = console.api.post(
            "/session",
            json={"image": "python", "name": name, "config": {"resources": {"cpu": "1"}}},
        )
        assert created.status_code == 201, created.text
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(console.base + "/")
    page.get_by_label("Email").fill(console.admin.email)
    page.get_by_label("Password").fill(console.admin.password)
    page.get_by_label("Password").press("Enter")
    expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
    expect(status_of(page, "kb-two")).to_have_text("RUNNING")
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()

    def destroy_by_keyboard(name: str) -> None:
        page.get_by_role("button", name=f"Destroy {name}").focus()
        page.keyboard.press("Enter")
        confirm = page.get_by_role("dialog", name="Destroy session?")
        expect(confirm.get_by_role("button", name="Cancel")).to_be_focused()
        page.keyboard.press("Tab")
        expect(confirm.get_by_role("button", name="Destroy")).to_be_focused()
        page.keyboard.press("Enter")
        expect(confirm).to_be_hidden()
        expect(row(page, name)).to_have_count(0)

    destroy_by_keyboard("kb-one")
    expect(page.get_by_role("button", name="Destroy kb-two")).to_be_focused()
    destroy_by_keyboard("kb-two")
    expect(page.get_by_role("heading", name="Sessions")).to_be_focused()
    assert page.evaluate("document.activeElement !== document.body")


# Run in the notebook's kernel (through JupyterLab's API, from the Jupyter page on the apps
# origin): the session's environment, then the bundled example notebook, executed.
KERNEL_CODE = """
import os, nbformat, nbclient
print("mock-devices=" + os.environ.get("BACKENDAI_MOCK_CUDA_DEVICES", "none"))
nb = nbformat.read("train-small-model.ipynb", as_version=4)
nbclient.NotebookClient(nb, timeout=120).execute()
print([o.get("text", "") for c in nb.cells for o in c.get("outputs", [])][-1])
"""
RUN_IN_KERNEL = """async (code) => {
  const xsrf = (document.cookie.split("; ").find((c) => c.startsWith("_xsrf=")) ?? "").slice(6);
  const base = location.pathname.replace(/lab.*$/, "");
  const made = await fetch(base + "api/kernels", {
    method: "POST", headers: { "X-XSRFToken": xsrf, "Content-Type": "application/json" }, body: "{}",
  });
  if (!made.ok) return "kernel: " + made.status + " " + (await made.text());
  const kernel = await made.json();
  const ws = new WebSocket(`${location.origin.replace("http", "ws")}${base}api/kernels/${kernel.id}/channels`);
  const msgId = crypto.randomUUID();
  return await new Promise((resolve) => {
    let out = "";
    ws.onerror = () => resolve("websocket error");
    ws.onmessage = (event) => {
      const msg = JSON.parse(event.data);
      if (msg.parent_header?.msg_id !== msgId) return;
      if (msg.msg_type === "stream") out += msg.content.text;
      if (msg.msg_type === "error") out += msg.content.ename + ": " + msg.content.evalue;
      if (msg.msg_type === "status" && msg.content.execution_state === "idle") resolve(out);
    };
    ws.onopen = () => ws.send(JSON.stringify({
      header: { msg_id: msgId, username: "", session: crypto.randomUUID(), msg_type: "execute_request", version: "5.3" },
      parent_header: {}, metadata: {}, channel: "shell", buffers: [],
      content: { code, silent: false, store_history: false, user_expressions: {}, allow_stdin: false, stop_on_error: true },
    }));
  });
}"""


def _jupyter_image(console: Console) -> dict[str, Any] | None:
    """jupyter:4 once dev up has built and registered it (skips the test when the build
    failed, e.g. no package index reachable)."""
    failed = [line for line in console.log if "environment jupyter:4 left out" in line]
    if failed:
        pytest.skip(f"JupyterLab could not be installed: {failed[0].strip()}")
    answer = console.api.get("/images/jupyter:4")
    return answer.json() if answer.status_code == 200 else None


def test_jupyter_app_from_the_launch_dialog(page: Any, console: Console) -> None:
    """The real JupyterLab (dev up's jupyter:4, pip-installed once into ENV_CACHE): the
    picker shows its Jupyter app, ticked; the session's Jupyter button opens JupyterLab on
    the apps origin with no token; its kernel has the session's GPU environment and runs
    the bundled example notebook to the end."""
    image = console.until(
        lambda: _jupyter_image(console), "dev up to build jupyter:4", JUPYTER_BUILD_TIMEOUT_S
    )
    assert image["labels"]["ai.backend.service-ports"] == "jupyter:http:8888"
    log_in(page, console, USER_EMAIL, USER_PASSWORD)
    page.get_by_role("button", name="Launch sessions").click()
    dialog = page.get_by_role("dialog", name="Launch sessions")
    apps = dialog.get_by_role("group", name="Apps")
    pick_image(dialog, "demo-lib:2.0")
    expect(apps).to_be_hidden()  # demo-lib declares no app
    pick_image(dialog, "jupyter:4")
    expect(apps).to_be_visible()
    jupyter_box = apps.get_by_role("checkbox", name="Jupyter")
    expect(jupyter_box).to_be_checked()
    dialog.get_by_label("Name (optional)").fill("nb")
    dialog.get_by_label("GPU (fGPU)", exact=True).fill("0.5")
    shoot(page, "launch-jupyter")
    dialog.get_by_role("button", name="Launch", exact=True).click()
    expect(dialog).to_be_hidden()
    expect(status_of(page, "nb")).to_have_text("RUNNING", timeout=60_000)
    (session,) = [s for s in console.live_sessions() if s["sessionName"] == "nb"]
    assert [a["name"] for a in session["servicePorts"]] == ["jupyter"]
    button = page.get_by_role("link", name="App jupyter of nb")
    expect(button).to_have_text("Jupyter")
    app_path = f"/session/{session['sessionId']}/apps/jupyter/"
    console.until(
        lambda: _app_answers(console.base, app_path, USER_EMAIL, USER_PASSWORD),
        "JupyterLab to answer through the proxy",
        timeout_s=90,
    )
    with page.expect_popup() as popup_info:
        button.click()
    lab = popup_info.value
    expect(lab).to_have_url(re.compile(re.escape(f"{console.apps}{app_path}") + "lab"))
    expect(lab.get_by_text("train-small-model.ipynb").first).to_be_visible(timeout=60_000)
    shoot(lab, "jupyter-lab")
    output = lab.evaluate(RUN_IN_KERNEL, KERNEL_CODE)
    assert "mock-devices=" in output, output
    assert "mock-devices=none" not in output, output
    assert "training accuracy" in output, output
    lab.close()
    # No token, but never open: another browser without the login is refused.
    assert httpx.get(f"{console.apps}{app_path}lab").status_code == 401
    destroy(page, "nb")
