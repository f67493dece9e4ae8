"""A real-browser check of an HTML report: does every image load, are the tables there, does the
page log errors? Also takes a full-page screenshot.

    python -m reports.browser REPORT_DIR_OR_HTML [--screenshot PATH] [--timeout S]

A headless Chromium (Debian's chromium-headless-shell; chromium works too) is driven over the
Chrome DevTools Protocol on --remote-debugging-pipe: the browser reads NUL-terminated JSON commands
on its fd 3 and writes NUL-terminated JSON replies and events on its fd 4. The page is opened from
a file:// URL and nothing reaches the network. Each check runs its own browser, with a fresh
profile folder that is removed afterwards; the browser's whole process group is killed on every
way out, and every wait on the pipe is bounded by the check's deadline.

Standard library only. The command's exit status: 0 when every image loaded, the page has at least
one table and logged no error; 1 otherwise (or when the check itself failed); 2 when no browser is
installed.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import pathlib
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from reports import files

PACKAGE = "chromium-headless-shell"
# Looked up on PATH in this order; KOLO_BROWSER, when set, names the executable instead.
CANDIDATES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome", "chrome")
WINDOW = (1280, 1024)  # CSS pixels; the screenshot keeps the width and grows to the page's height
MAX_SCREENSHOT_HEIGHT = 16000
STDERR_TAIL = 2000  # characters of the browser's stderr quoted in an error

# The page's facts, as one JSON-able value. An image's src is the attribute as the page wrote it.
FACTS_JS = """(() => ({
  title: document.title,
  href: location.href,
  images: Array.from(document.images, i =>
    [i.getAttribute('src') || i.currentSrc, i.complete && i.naturalWidth > 0,
     i.naturalWidth, i.naturalHeight]),
  tables: document.getElementsByTagName('table').length,
  rows: document.getElementsByTagName('tr').length,
}))()"""


class BrowserError(Exception):
    """The check could not be made; the message names what failed (a start, a timeout, a command)."""


@dataclass
class BrowserCheck:
    title: str
    images: list[tuple[str, bool, int, int]]  # (src, loaded, natural width, natural height)
    tables: int  # <table> elements
    table_rows: int  # <tr> elements, all tables together
    broken: list[str]  # srcs of the images that did not load
    console_errors: list[str] = field(default_factory=list)  # exceptions, error log entries
    screenshot: str | None = None  # the PNG written, if one was asked for

    @property
    def ok(self) -> bool:
        return not self.broken and self.tables > 0 and not self.console_errors


def find_browser() -> str | None:
    """The browser executable: $KOLO_BROWSER if set, else the first of CANDIDATES on PATH."""
    override = os.environ.get("KOLO_BROWSER")
    if override:
        return shutil.which(override)
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def why_missing() -> str:
    """Why find_browser() found nothing, and what to install."""
    override = os.environ.get("KOLO_BROWSER")
    if override:
        return f"KOLO_BROWSER={override} is not an executable (unset it to look for {PACKAGE})"
    return (
        f"no headless Chromium found (looked for {', '.join(CANDIDATES)} on PATH); "
        f"install it: apt-get install --no-install-recommends {PACKAGE} (scripts/bootstrap does)"
    )


def check_report(html_path: str, screenshot_path: str | None = None, timeout_s: float = 60) -> BrowserCheck:
    """Opens HTML_PATH in a headless browser, waits for its load event (images included) and
    returns what the page holds; writes a full-page PNG to SCREENSHOT_PATH when given. The whole
    check, start to close, is bounded by TIMEOUT_S. Raises BrowserError when no browser is
    installed, the file does not exist, the browser fails, or the time runs out."""
    path = pathlib.Path(html_path).resolve()
    if not path.is_file():
        raise BrowserError(f"{html_path}: no such file")
    executable = find_browser()
    if executable is None:
        raise BrowserError(why_missing())
    with _Browser(executable, time.monotonic() + timeout_s, timeout_s) as browser:
        return browser.check(path.as_uri(), screenshot_path)


class _Browser:
    """One browser process and its DevTools pipe. Use as a context manager: leaving it always ends
    the process group and removes the profile folder."""

    def __init__(self, executable: str, deadline: float, timeout_s: float):
        self.deadline = deadline
        self.timeout_s = timeout_s
        self.next_id = 0
        self.events: list[dict] = []
        self.console_errors: list[str] = []
        self.buffer = b""
        self.base = tempfile.mkdtemp(prefix="kolo-browser-")
        self.profile = os.path.join(self.base, "profile")
        self.stderr_path = os.path.join(self.base, "stderr.log")
        self.proc: subprocess.Popen | None = None
        self.to_browser = self.from_browser = -1
        try:
            self._start(executable)
        except BaseException:
            self._finish()
            raise

    def _start(self, executable: str) -> None:
        args = [
            executable,
            "--headless",  # chromium-headless-shell is headless anyway; chromium needs it
            "--remote-debugging-pipe",
            f"--user-data-dir={self.profile}",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-gpu",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-default-apps",
            "--disable-sync",
            # Containers often mount a small /dev/shm, which crashes renderers of long pages.
            "--disable-dev-shm-usage",
            "--mute-audio",
            "--hide-scrollbars",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
        ]
        if os.geteuid() == 0:
            # Chromium refuses to run as root with its sandbox on (the setuid and user-namespace
            # sandboxes are not meant for root). The page is our own local report, so running it
            # unsandboxed is acceptable there; as any other user the sandbox stays on.
            args.append("--no-sandbox")
        args.append("about:blank")
        # fd 3: commands to the browser (it reads); fd 4: replies and events (it writes).
        cmd_read, self.to_browser = os.pipe()
        self.from_browser, reply_write = os.pipe()

        def onto_3_and_4() -> None:
            # In the child, after fork: move both ends above 9 first (close-on-exec), so neither
            # dup2 below can overwrite the other end when the pipe happened to get fd 3 or 4.
            # dup2's copies are inheritable; every fd Python opened is not (PEP 446), so they are
            # what the browser inherits besides its standard streams.
            high_read = fcntl.fcntl(cmd_read, fcntl.F_DUPFD_CLOEXEC, 10)
            high_write = fcntl.fcntl(reply_write, fcntl.F_DUPFD_CLOEXEC, 10)
            os.dup2(high_read, 3)
            os.dup2(high_write, 4)

        try:
            with open(self.stderr_path, "wb") as stderr:
                # close_fds would close 3 and 4 after preexec_fn, and pass_fds=(3, 4) needs both
                # open in this process, which a caller's open files may prevent: neither is used.
                self.proc = subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=stderr,
                    stderr=stderr,
                    close_fds=False,
                    preexec_fn=onto_3_and_4,
                    start_new_session=True,  # its own process group, so one killpg ends it all
                )
        except OSError as e:
            raise BrowserError(f"could not start {executable}: {e}") from e
        finally:
            os.close(cmd_read)
            os.close(reply_write)
        os.set_blocking(self.to_browser, False)
        os.set_blocking(self.from_browser, False)

    def __enter__(self) -> _Browser:
        return self

    def __exit__(self, *exc) -> None:
        self._finish()

    # --- the protocol -------------------------------------------------------------------------

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Sends one command and returns its result; events read meanwhile are kept."""
        self.next_id += 1
        msg_id = self.next_id
        message = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self._write(json.dumps(message).encode() + b"\0", method)
        while True:
            reply = self._read(f"the reply to {method}")
            if reply.get("id") == msg_id:
                if "error" in reply:
                    error = reply["error"]
                    raise BrowserError(f"{method} failed: {error.get('message')} ({error.get('code')})")
                return reply.get("result", {})
            if "method" in reply:
                self._event(reply)

    def wait_event(self, method: str, session: str) -> dict:
        """Returns the first event METHOD of SESSION not yet waited for."""
        while True:
            for i, event in enumerate(self.events):
                if event["method"] == method and event.get("sessionId") == session:
                    return self.events.pop(i)
            message = self._read(f"{method}")
            if "method" in message:
                self._event(message)

    def _event(self, event: dict) -> None:
        params = event.get("params", {})
        method = event["method"]
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            description = details.get("exception", {}).get("description") or details.get("text", "")
            self.console_errors.append(f"exception: {description}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            where = f" ({entry['url']})" if entry.get("url") else ""
            self.console_errors.append(f"{entry.get('source', 'log')}: {entry.get('text', '')}{where}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            words = [str(a.get("value", a.get("description", ""))) for a in params.get("args", [])]
            self.console_errors.append("console.error: " + " ".join(words))
        self.events.append(event)

    def _remaining(self, what: str) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise BrowserError(f"timed out after {self.timeout_s:g} s waiting for {what}")
        return left

    def _write(self, data: bytes, what: str) -> None:
        while data:
            left = self._remaining(f"the browser to read {what}")
            _, ready, _ = select.select([], [self.to_browser], [], left)
            if ready:
                try:
                    data = data[os.write(self.to_browser, data) :]
                except BrokenPipeError:
                    raise self._exited(f"sending {what}") from None

    def _read(self, what: str) -> dict:
        """The next message from the browser, waiting no later than the deadline."""
        while b"\0" not in self.buffer:
            ready, _, _ = select.select([self.from_browser], [], [], self._remaining(what))
            if not ready:
                continue
            chunk = os.read(self.from_browser, 1 << 20)
            if not chunk:
                raise self._exited(f"waiting for {what}")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        try:
            return json.loads(raw)
        except ValueError as e:
            raise BrowserError(f"the browser sent a message that is not JSON ({e}): {raw[:200]!r}") from e

    def _exited(self, doing: str) -> BrowserError:
        status = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            status = self.proc.wait(timeout=max(0.1, min(5.0, self.deadline - time.monotonic())))
        how = f"exited with status {status}" if status is not None else "closed its pipe"
        return BrowserError(f"the browser {how} while {doing}; its stderr ends:\n{self.stderr_tail()}")

    def stderr_tail(self) -> str:
        try:
            data = files.read_bytes(self.stderr_path, "the browser's stderr", files.RECORD_LIMIT)
        except OSError:
            return "(none)"
        return data.decode("utf-8", errors="replace")[-STDERR_TAIL:].strip() or "(empty)"

    # --- the check ----------------------------------------------------------------------------

    def check(self, url: str, screenshot_path: str | None) -> BrowserCheck:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=session)
        width, height = WINDOW
        self._viewport(width, height, session)
        self.events.clear()  # nothing before the navigation counts, about:blank's load included
        navigation = self.send("Page.navigate", {"url": url}, session)
        if navigation.get("errorText"):
            raise BrowserError(f"could not open {url}: {navigation['errorText']}")
        self.wait_event("Page.loadEventFired", session)
        facts = self.evaluate(FACTS_JS, session)
        if facts["href"] != url:
            raise BrowserError(f"the page loaded is {facts['href']}, not {url}")
        shot = None
        if screenshot_path:
            shot = self.screenshot(screenshot_path, width, session)
        with contextlib.suppress(BrowserError):
            # Errors logged late (after the load event) still count; let them arrive.
            self.evaluate("0", session)
        images = [(str(s), bool(ok), int(w), int(h)) for s, ok, w, h in facts["images"]]
        return BrowserCheck(
            title=facts["title"],
            images=images,
            tables=facts["tables"],
            table_rows=facts["rows"],
            broken=[src for src, ok, _, _ in images if not ok],
            console_errors=list(self.console_errors),
            screenshot=shot,
        )

    def evaluate(self, expression: str, session: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise BrowserError(f"evaluating the page's facts failed: {text}")
        return result["result"].get("value")

    def _viewport(self, width: int, height: int, session: str) -> None:
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self.send("Emulation.setDeviceMetricsOverride", metrics, session)

    def screenshot(self, path: str, width: int, session: str) -> str:
        size = self.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
        height = max(1, min(MAX_SCREENSHOT_HEIGHT, int(size["height"] + 0.999)))
        width = max(width, int(size["width"] + 0.999))
        self._viewport(width, height, session)
        clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
        params = {"format": "png", "captureBeyondViewport": True, "clip": clip}
        data = base64.b64decode(self.send("Page.captureScreenshot", params, session)["data"])
        out = pathlib.Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        return str(out)

    # --- the end ------------------------------------------------------------------------------

    def _finish(self) -> None:
        """Closes the browser politely if it is still talking, then kills whatever is left of its
        process group, closes the pipe and removes the profile folder. Never raises."""
        proc = self.proc
        if proc is not None and proc.poll() is None and self.to_browser >= 0:
            # Browser.close gets at most 2 s (and never past the deadline + 2 s) to end it.
            self.deadline = min(self.deadline, time.monotonic()) + 2
            with contextlib.suppress(BrowserError, OSError, ValueError):
                self.send("Browser.close")
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # helpers (renderer, zygote) outlive the leader
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        _kill_holders(self.profile)
        for fd in (self.to_browser, self.from_browser):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.to_browser = self.from_browser = -1
        shutil.rmtree(self.base, ignore_errors=True)


def _kill_holders(profile: str) -> None:
    """Kills any process whose command line names PROFILE (unique to one check): a helper that
    left the process group would otherwise survive it."""
    needle = profile.encode()
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in files.read_bytes(entry / "cmdline", "process command line", files.PROC_LIMIT):
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def _html_of(target: str) -> str:
    """TARGET itself when it is a file, else index.html in it or in its report/ folder."""
    if os.path.isdir(target):
        for candidate in (os.path.join(target, "index.html"), os.path.join(target, "report", "index.html")):
            if os.path.isfile(candidate):
                return candidate
        return os.path.join(target, "index.html")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reports.browser", description="Checks an HTML report in a headless browser."
    )
    parser.add_argument("target", help="the report's index.html, its folder, or the sweep folder")
    parser.add_argument("--screenshot", help="write a full-page PNG here")
    parser.add_argument("--timeout", type=float, default=60, help="seconds for the whole check (60)")
    args = parser.parse_args(argv)
    if find_browser() is None:
        print(f"browser: {why_missing()}", file=sys.stderr)
        return 2
    try:
        result = check_report(_html_of(args.target), args.screenshot, args.timeout)
    except BrowserError as e:
        print(f"browser: {e}", file=sys.stderr)
        return 1
    for src in result.broken:
        print(f"broken image: {src}")
    for error in result.console_errors:
        print(f"console error: {error}")
    loaded = len(result.images) - len(result.broken)
    shot = f"screenshot {result.screenshot}" if result.screenshot else "no screenshot"
    print(
        f"{loaded} of {len(result.images)} images loaded, {result.tables} tables "
        f"({result.table_rows} rows), {len(result.console_errors)} console errors; {shot}"
    )
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
