"""The console's Data page and mount picker in real headless Chromium (Playwright) against
``accelshare dev up`` with its storage proxy: folders, a tus upload from the browser
straight to the proxy (another origin: its ``cors-origins``), downloads, sharing with a
second user, the trash, and a folder mounted from the launch dialog and read inside the
session's terminal.  The cluster and the helpers are test_console.py's."""

from __future__ import annotations

import hashlib
import io
import os
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from test_console import (
    USER_EMAIL,
    USER_PASSWORD,
    Console,
    browser,  # noqa: F401  (a fixture)
    console,  # noqa: F401  (a fixture)
    expect,
    log_in,
    logged_in_client,
    page,  # noqa: F401  (a fixture)
    row,
    shoot,
    status_of,
)

pytestmark = pytest.mark.integration

BOB_EMAIL = "bob@example.com"
BOB_PASSWORD = "bob-password-123"
BIG = 20 * 2**20  # three PATCHes of 8 MiB: progress is seen between them


@pytest.fixture(scope="module")
def bob(console: Console) -> str:  # noqa: F811
    created = console.api.post(
        "/admin/users", json={"email": BOB_EMAIL, "password": BOB_PASSWORD, "role": "user"}
    )
    assert created.status_code == 201, created.text
    return BOB_EMAIL


def open_data(page: Any) -> None:  # noqa: F811
    page.get_by_role("link", name="Data", exact=True).click()
    expect(page.get_by_role("heading", name="Data", exact=True)).to_be_visible()


def folder_row(page: Any, name: str) -> Any:  # noqa: F811
    return page.locator(f'#folders-body tr[data-folder="{name}"]')


def file_row(page: Any, name: str) -> Any:  # noqa: F811
    return page.locator(f'#files-body tr[data-file="{name}"]')


def create_folder(page: Any, name: str) -> None:  # noqa: F811
    page.get_by_label("New folder").fill(name)
    page.get_by_role("button", name="Create", exact=True).click()


def answer_ask(page: Any, title: str, value: str) -> None:  # noqa: F811
    dialog = page.get_by_role("dialog", name=title)
    expect(dialog).to_be_visible()
    dialog.get_by_role("textbox").fill(value)
    dialog.get_by_role("button", name="OK").click()
    expect(dialog).to_be_hidden()


def confirm(page: Any, title: str) -> None:  # noqa: F811
    dialog = page.get_by_role("dialog", name=title)
    expect(dialog).to_be_visible()
    dialog.locator("#data-confirm-ok").click()
    expect(dialog).to_be_hidden()


# Every text the upload's status line showed, in order (a MutationObserver: nothing missed).
WATCH_UPLOADS = """() => {
  window.__uploadTexts = [];
  new MutationObserver(() => {
    for (const el of document.querySelectorAll('#uploads .upload-text')) {
      const t = el.textContent;
      if (window.__uploadTexts[window.__uploadTexts.length - 1] !== t) window.__uploadTexts.push(t);
    }
  }).observe(document.getElementById('data-root'), {subtree: true, childList: true, characterData: true});
}"""


def test_folder_upload_download_share_mount_and_trash(
    page: Any,  # noqa: F811
    browser: Any,  # noqa: F811
    console: Console,  # noqa: F811
    bob: str,
    tmp_path: Path,
) -> None:
    log_in(page, console, USER_EMAIL, USER_PASSWORD)
    open_data(page)
    expect(page.locator("#folders-empty")).to_have_text("No folders yet: create one above.")

    # create; the same name again is refused, plainly
    create_folder(page, "projdata")
    expect(folder_row(page, "projdata")).to_be_visible()
    expect(folder_row(page, "projdata").locator(".kind")).to_have_text("Yours")
    create_folder(page, "projdata")
    expect(page.locator("#folders-error")).to_contain_text("Could not create projdata:")
    expect(page.locator("#folders-error")).to_contain_text(
        "A folder named 'projdata' already exists"
    )

    # the file browser: upload 20 MiB with tus from the browser, with progress
    folder_row(page, "projdata").get_by_role("link", name="Open projdata").click()
    expect(page.get_by_role("heading", name="projdata")).to_be_visible()
    expect(page.locator("#files-empty")).to_be_visible()
    expect(page.locator("#browser-usage")).to_contain_text("0 B used (no size limit)")
    expect(page.locator("#upload-label")).to_be_visible()
    payload = os.urandom(BIG)
    page.evaluate(WATCH_UPLOADS)
    page.locator("#upload-input").set_input_files(
        {"name": "big.bin", "mimeType": "application/octet-stream", "buffer": payload}
    )
    upload = page.locator('#uploads li[data-upload="big.bin"]')
    expect(upload).to_have_attribute("data-state", "done", timeout=60_000)
    expect(upload.locator("progress")).to_have_attribute("value", str(BIG))
    texts: list[str] = page.evaluate("window.__uploadTexts")
    between = [t for t in texts if "%)" in t and "(0%)" not in t and "(100%)" not in t]
    assert between, f"no progress between 0 and 100%: {texts}"
    assert texts[-1] == "big.bin: uploaded (20 MiB)"
    expect(file_row(page, "big.bin").locator(".size")).to_have_text("20 MiB")
    # the listing's mtime is POSIX seconds: shown as today's date, not 1970's
    expect(file_row(page, "big.bin").locator(".mtime")).to_contain_text(
        str(time.localtime().tm_year)
    )
    expect(page.locator("#browser-usage")).to_contain_text("20 MiB used")
    on_disk = list((console.data_dir / "storage" / "volume1").rglob("big.bin"))
    assert len(on_disk) == 1
    assert on_disk[0].read_bytes() == payload

    # download: a plain link to the proxy's token URL; the bytes are the same
    with page.expect_download() as download_info:
        file_row(page, "big.bin").get_by_role("button", name="Download big.bin").click()
    got = Path(download_info.value.path()).read_bytes()
    assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()

    # a sub-folder, entered and left; a file moved into it
    page.get_by_role("button", name="New folder").click()
    answer_ask(page, "New folder", "results")
    file_row(page, "results").get_by_role("button", name="Enter results").click()
    expect(page.locator(".crumbs")).to_contain_text("Folders › projdata › results")
    expect(page.locator("#files-empty")).to_be_visible()
    page.locator("#upload-input").set_input_files(
        {"name": "note.txt", "mimeType": "text/plain", "buffer": b"hello from the browser\n"}
    )
    expect(file_row(page, "note.txt")).to_be_visible()
    file_row(page, "note.txt").get_by_role("button", name="Rename note.txt").click()
    answer_ask(page, "Rename note.txt", "hello.txt")
    expect(file_row(page, "hello.txt")).to_be_visible()
    expect(file_row(page, "note.txt")).to_have_count(0)
    page.locator(".crumbs").get_by_role("link", name="projdata").click()
    expect(file_row(page, "results")).to_be_visible()
    shoot(page, "data-browser")

    # the whole folder as a zip
    with page.expect_download() as zip_info:
        page.get_by_role("button", name="Download all as zip").click()
    archive = zipfile.ZipFile(io.BytesIO(Path(zip_info.value.path()).read_bytes()))
    names = set(archive.namelist())
    assert "big.bin" in names
    assert "results/hello.txt" in names
    assert archive.read("results/hello.txt") == b"hello from the browser\n"

    # share: invite bob read-only; bob accepts in his own browser and sees the files
    page.get_by_label("Invite users (e-mail)").fill(BOB_EMAIL)
    page.get_by_label("Permission").select_option("ro")
    page.get_by_role("button", name="Invite", exact=True).click()
    expect(page.locator("#share-status")).to_have_text(f"Invited {BOB_EMAIL}.")
    bob_context = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        theirs = bob_context.new_page()
        log_in(theirs, console, BOB_EMAIL, BOB_PASSWORD)
        open_data(theirs)
        invitation = theirs.locator("#invitations-list li")
        expect(invitation).to_contain_text(f"{USER_EMAIL} invites you to projdata (ro)")
        shoot(theirs, "data-invitation")
        invitation.get_by_role("button", name="Accept projdata").click()
        expect(theirs.locator("#invitations-card")).to_be_hidden()
        expect(folder_row(theirs, "projdata").locator(".kind")).to_have_text(
            f"Shared by {USER_EMAIL}"
        )
        expect(folder_row(theirs, "projdata").locator(".perm")).to_have_text("ro")
        folder_row(theirs, "projdata").get_by_role("link", name="Open projdata").click()
        expect(file_row(theirs, "big.bin")).to_be_visible()
        expect(theirs.locator("#upload-label")).to_be_hidden()  # read-only: no upload
        expect(
            file_row(theirs, "big.bin").get_by_role("button", name="Delete big.bin")
        ).to_have_count(0)
        expect(theirs.locator("#share-card")).to_contain_text("You have read-only access")
    finally:
        bob_context.close()

    # mount it from the launch dialog (read-only, at a path of our own)
    page.get_by_role("link", name="Sessions").click()
    page.get_by_role("button", name="Launch sessions").click()
    dialog = page.get_by_role("dialog", name="Launch sessions")
    mount = dialog.locator('.mount-row[data-folder="projdata"]')
    mount.get_by_role("checkbox", name="projdata").check()
    mount.get_by_label("Mount path of projdata").fill("../escape")
    dialog.get_by_role("button", name="Launch", exact=True).click()
    expect(dialog.locator("#err-mounts")).to_have_text(
        "projdata: A mount path cannot contain '..'."
    )
    expect(dialog).to_be_visible()
    mount.get_by_label("Mount path of projdata").fill("/home/work/in")
    expect(dialog.locator("#err-mounts")).to_be_hidden()  # follows the correction
    mount.get_by_label("Access to projdata").select_option("ro")
    dialog.get_by_label("Name (optional)").fill("with-data")
    shoot(page, "launch-mounts")
    dialog.get_by_role("button", name="Launch", exact=True).click()
    expect(dialog).to_be_hidden()
    expect(status_of(page, "with-data")).to_have_text("RUNNING")
    expect(row(page, "with-data").locator(".mounts-list")).to_have_text(
        "projdata → /home/work/in (read-only)"
    )
    (session,) = [s for s in console.live_sessions() if s["sessionName"] == "with-data"]
    assert [(m["name"], m["kernel_path"], m["read_only"]) for m in session["mounts"]] == [
        ("projdata", "/home/work/in", True)
    ]
    with page.expect_popup() as popup_info:
        page.get_by_role("link", name="Terminal of with-data").click()
    term = popup_info.value
    expect(term.locator("#term-state")).to_have_text("Live")
    term.locator("#term").click()
    # the process runtime's /home/work is the kernel's home folder (docs/agent-runtimes.md)
    term.keyboard.type("wc -c < ~/in/big.bin; cat ~/in/results/hello.txt\n")
    screen = term.locator(".xterm-rows")
    expect(screen).to_contain_text(str(BIG))
    expect(screen).to_contain_text("hello from the browser")
    term.keyboard.type("touch ~/in/new.txt\n")
    expect(screen).to_contain_text("Read-only file system")
    term.close()

    # deleting a folder mounted in a running session is refused, naming the session
    open_data(page)
    expect(folder_row(page, "projdata").locator(".used")).to_have_text("20 MiB · 2 files")
    folder_row(page, "projdata").get_by_role("button", name="Delete projdata").click()
    confirm(page, "Delete projdata?")
    expect(page.locator("#folders-error")).to_contain_text("with-data")
    page.get_by_role("link", name="Sessions").click()
    page.get_by_role("button", name="Destroy with-data").click()
    page.get_by_role("dialog", name="Destroy session?").get_by_role(
        "button", name="Destroy"
    ).click()
    console.until(lambda: not console.live_sessions(), "the session ended")

    # now to the trash, restored, to the trash again, purged
    open_data(page)
    folder_row(page, "projdata").get_by_role("button", name="Delete projdata").click()
    confirm(page, "Delete projdata?")
    expect(folder_row(page, "projdata")).to_have_count(0)
    page.get_by_role("button", name="Trash").click()
    expect(folder_row(page, "projdata")).to_be_visible()
    shoot(page, "data-trash")
    folder_row(page, "projdata").get_by_role("button", name="Restore projdata").click()
    expect(page.locator("#folders-empty")).to_have_text("The trash is empty.")
    page.get_by_role("button", name="Folders", exact=True).click()
    expect(folder_row(page, "projdata")).to_be_visible()
    folder_row(page, "projdata").get_by_role("button", name="Delete projdata").click()
    confirm(page, "Delete projdata?")
    page.get_by_role("button", name="Trash").click()
    folder_row(page, "projdata").get_by_role("button", name="Purge projdata").click()
    confirm(page, "Purge projdata?")
    expect(page.locator("#folders-empty")).to_have_text("The trash is empty.")
    with logged_in_client(console.base, USER_EMAIL, USER_PASSWORD) as api:
        assert [f["name"] for f in api.get("/folders").json()] == []


def test_the_folder_list_and_the_file_browser_screenshot(
    page: Any,  # noqa: F811
    console: Console,  # noqa: F811
) -> None:
    """Two folders with files: the list page as users see it (and in docs/screenshots)."""
    with logged_in_client(console.base, USER_EMAIL, USER_PASSWORD) as api:
        for name in ("datasets", "checkpoints"):
            assert api.post("/folders", json={"name": name}).status_code == 201
    log_in(page, console, USER_EMAIL, USER_PASSWORD)
    open_data(page)
    expect(folder_row(page, "datasets")).to_be_visible()
    expect(folder_row(page, "checkpoints")).to_be_visible()
    expect(folder_row(page, "datasets").locator(".used")).to_have_text("0 B · 0 files")
    shoot(page, "data")


PAGING = 230  # files in one folder: three pages of 100


def test_a_big_folder_pages(page: Any, console: Console) -> None:  # noqa: F811
    with logged_in_client(console.base, USER_EMAIL, USER_PASSWORD) as api:
        assert api.post("/folders", json={"name": "many"}).status_code == 201
        info = api.get("/folders/many").json()
    folder = next((console.data_dir / "storage" / "volume1").rglob(info["id"]))
    for i in range(PAGING):
        (folder / f"f{i:04d}.txt").write_text(str(i))
    log_in(page, console, USER_EMAIL, USER_PASSWORD)
    page.goto(console.base + "/console/#/data/many")
    expect(page.locator("#files-range")).to_have_text(f"1–100 of {PAGING}")
    expect(page.locator("#files-body tr")).to_have_count(100)
    expect(file_row(page, "f0000.txt")).to_be_visible()
    page.get_by_role("button", name="Next").click()
    page.get_by_role("button", name="Next").click()
    expect(page.locator("#files-range")).to_have_text(f"201–{PAGING} of {PAGING}")
    expect(page.locator("#files-body tr")).to_have_count(PAGING - 200)
    expect(file_row(page, f"f{PAGING - 1:04d}.txt")).to_be_visible()
    expect(page.get_by_role("button", name="Next")).to_be_disabled()

    # delete one file, move another into a new sub-folder
    page.get_by_role("button", name="Previous").click()
    page.get_by_role("button", name="Previous").click()
    file_row(page, "f0000.txt").get_by_role("button", name="Delete f0000.txt").click()
    confirm(page, "Delete f0000.txt?")
    expect(file_row(page, "f0000.txt")).to_have_count(0)
    expect(page.locator("#files-range")).to_have_text(f"1–100 of {PAGING - 1}")
    page.get_by_role("button", name="New folder").click()
    answer_ask(page, "New folder", "old")
    expect(file_row(page, "old")).to_be_visible()
    file_row(page, "f0001.txt").get_by_role("button", name="Move f0001.txt").click()
    answer_ask(page, "Move f0001.txt", "old/f0001.txt")
    expect(file_row(page, "f0001.txt")).to_have_count(0)
    assert not (folder / "f0000.txt").exists()
    assert (folder / "old" / "f0001.txt").read_text() == "1"


TRANSFER_CASES = """async () => {
  const t = await import("/console/transfer.js");
  return {
    bytes: [0, 512, 1536, 20 * 2 ** 20, 3 * 2 ** 30].map(t.formatBytes),
    join: [t.joinPath("", "a"), t.joinPath("a/b", "c"), t.joinPath(".", "x/y"), t.joinPath("a/", "/b")],
    parent: [t.parentPath("a/b/c"), t.parentPath("c")],
    none: t.mountFields([]),
    fields: t.mountFields([
      {name: "data", path: "", readOnly: false},
      {name: "models", path: "/opt/models", readOnly: true},
    ]),
    problems: ["", "/home/work/in", "../x", "/home/work", "/a b"].map(t.mountPathProblem),
  };
}"""


def test_transfer_helpers(browser: Any, console: Console) -> None:  # noqa: F811
    """transfer.js's pure helpers, run where they run: in the browser."""
    context = browser.new_context()
    try:
        helper_page = context.new_page()
        helper_page.goto(console.base + "/console/")
        result = helper_page.evaluate(TRANSFER_CASES)
    finally:
        context.close()
    assert result["bytes"] == ["0 B", "512 B", "1.5 KiB", "20 MiB", "3 GiB"]
    assert result["join"] == ["a", "a/b/c", "x/y", "a/b"]
    assert result["parent"] == ["a/b", ""]
    assert result["none"] == {}
    # exactly the create request's fields as api/sessions.py reads them
    assert result["fields"] == {
        "mounts": ["data", "models"],
        "mount_map": {"models": "/opt/models"},
        "mount_options": {"models": {"permission": "ro"}},
    }
    assert result["problems"] == [
        "",
        "",
        "A mount path cannot contain '..'.",
        "Choose a path below /home/work, or another absolute path.",
        "A mount path cannot contain spaces.",
    ]


def test_an_upload_over_the_quota_is_refused_plainly(page: Any, console: Console) -> None:  # noqa: F811
    """carol's policy allows 1 MiB per folder: a 2 MiB upload is refused, with the reason
    on the upload's line and above the list, and nothing is left in the folder."""
    policy = console.api.post(
        "/admin/resource-policies", json={"name": "small-folders", "max_vfolder_size": 2**20}
    )
    assert policy.status_code in (200, 201), policy.text
    carol = console.api.post(
        "/admin/users",
        json={
            "email": "carol@example.com",
            "password": "carol-password-123",
            "role": "user",
            "resource_policy": "small-folders",
        },
    )
    assert carol.status_code == 201, carol.text
    log_in(page, console, "carol@example.com", "carol-password-123")
    open_data(page)
    create_folder(page, "tiny")
    expect(folder_row(page, "tiny").locator(".quota")).to_have_text("1 MiB")
    folder_row(page, "tiny").get_by_role("link", name="Open tiny").click()
    expect(page.locator("#browser-usage")).to_contain_text("0 B used of 1 MiB")
    page.locator("#upload-input").set_input_files(
        {"name": "two.bin", "mimeType": "application/octet-stream", "buffer": b"x" * 2**21}
    )
    upload = page.locator('#uploads li[data-upload="two.bin"]')
    expect(upload).to_have_attribute("data-state", "failed")
    expect(upload).to_contain_text("quota")
    expect(page.locator("#browser-error")).to_contain_text("Could not upload two.bin:")
    expect(page.locator("#files-empty")).to_be_visible()
