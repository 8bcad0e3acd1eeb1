"""Headless Chromium (Debian's `chromium`, installed by `make test-tools`) driven over the
DevTools protocol on a pipe (`--remote-debugging-pipe`: commands on its fd 3, answers
on its fd 4, each a JSON message ended by a NUL byte), so a test can set the window
width, load a page, read the laid-out DOM and take a screenshot, with nothing to install
from the registries beyond the browser. A missing browser fails, it never skips.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--hide-scrollbars", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic")


def _high(fd: int) -> int:
    """``fd`` moved to 10 or above, so that the child's dup2 to 3 and 4 never collides."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


class Chromium:
    def __init__(self, profile: Path, timeout: float = 60.0) -> None:
        binary = shutil.which("chromium")
        assert binary, "chromium is not installed: `make test-tools` installs it (Debian)"
        self.timeout = timeout
        to_chrome_r, self._to_chrome = map(_high, os.pipe())
        self._from_chrome, from_chrome_w = map(_high, os.pipe())

        def wire() -> None:  # in the child, before exec
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.proc = subprocess.Popen(
            [binary, *FLAGS, "--remote-debugging-pipe", f"--user-data-dir={profile}",
             "about:blank"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, pass_fds=(3, 4), preexec_fn=wire)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.session: str | None = None

    def call(self, method: str, params: dict[str, Any] | None = None,
             session: bool = True) -> dict[str, Any]:
        """Send one command and wait for its answer (events in between are dropped)."""
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        while True:
            got = self._next()
            if got.get("id") == self._id:
                assert "error" not in got, (method, got["error"])
                return dict(got.get("result", {}))

    def wait_event(self, method: str) -> dict[str, Any]:
        while True:
            got = self._next()
            if got.get("method") == method:
                return got

    def _next(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            assert left > 0, "chromium did not answer in time"
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 20)
                assert chunk, f"chromium went away (exit {self.proc.poll()})"
                self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return dict(json.loads(raw))

    def open(self, url: str, width: int, height: int = 900) -> None:
        """A tab of ``width`` CSS pixels with ``url`` loaded."""
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)
        self.session = self.call("Target.attachToTarget", {
            "targetId": target["targetId"], "flatten": True}, session=False)["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        self.call("Page.enable")
        self.call("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        found = self.call("Runtime.evaluate", {"expression": expression,
                                               "returnByValue": True})
        assert "exceptionDetails" not in found, found
        return found["result"].get("value")

    def screenshot(self, path: Path) -> None:
        """The whole page, however long, as PNG."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        shot = self.call("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"],
                     "scale": 1}})
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        with contextlib.suppress(AssertionError, OSError):
            self.call("Browser.close", session=False)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self._to_chrome)
        os.close(self._from_chrome)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
