"""A real nginx for the tests, in front of ``responses-cache serve`` processes: the site
configuration is ``docs/nginx/responses-cache.conf`` (what ``docs/deploy.md`` ships), with only its
ports replaced, inside a main configuration that keeps everything in a temporary prefix (no
daemon, its pid, logs and temporary files there, one loopback port)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from responses_cache.testing import free_port

SITE = Path(__file__).resolve().parents[2] / "docs" / "nginx" / "responses-cache.conf"

#: What the tests replace in the shipped site configuration (each occurs exactly once there).
DOC_UPSTREAMS = ("server 127.0.0.1:8001 ", "server 127.0.0.1:8002 ")
DOC_LISTEN = "listen 127.0.0.1:8080;"
DOC_READ_TIMEOUT = "proxy_read_timeout 3600s;"


def nginx_binary() -> str | None:
    """The ``nginx`` executable (Debian's package puts it in ``/usr/sbin``), or None."""
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    return found


def site_config(
    upstream_ports: Sequence[int], port: int, *, read_timeout_s: int | None = None
) -> str:
    """The shipped site configuration with the test's ports (and, for the timeout test, another
    ``proxy_read_timeout``)."""
    text = SITE.read_text()
    replacements: dict[str, str] = {DOC_LISTEN: f"listen 127.0.0.1:{port};"}
    for doc, upstream in zip(DOC_UPSTREAMS, upstream_ports, strict=True):
        replacements[doc] = f"server 127.0.0.1:{upstream} "
    if read_timeout_s is not None:
        replacements[DOC_READ_TIMEOUT] = f"proxy_read_timeout {read_timeout_s}s;"
    for old, new in replacements.items():
        assert text.count(old) == 1, f"{SITE.name} should hold {old!r} once"
        text = text.replace(old, new)
    return text


def _main_config(prefix: Path, site: Path) -> str:
    user = "user root;\n" if os.geteuid() == 0 else ""  # workers may read the private tmp dir
    temps = "".join(
        f"    {name}_temp_path {prefix / name};\n"
        for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return (
        f"daemon off;\n{user}worker_processes 1;\npid {prefix / 'nginx.pid'};\n"
        f"error_log {prefix / 'error.log'} info;\n"
        "events {\n    worker_connections 1024;\n}\n"
        f"http {{\n    access_log {prefix / 'access.log'};\n{temps}    include {site};\n}}\n"
    )


class NginxProcess:
    """``nginx -p PREFIX -c nginx.conf`` in the foreground on a free loopback port, with the shipped
    site configuration in front of ``upstream_ports``; ``.url`` is its base URL."""

    def __init__(
        self,
        binary: str,
        prefix: Path,
        upstream_ports: Sequence[int],
        *,
        read_timeout_s: int | None = None,
    ) -> None:
        prefix.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix
        self.port = free_port()
        site = prefix / "responses-cache.conf"
        site.write_text(site_config(upstream_ports, self.port, read_timeout_s=read_timeout_s))
        conf = prefix / "nginx.conf"
        conf.write_text(_main_config(prefix, site))
        self.proc = subprocess.Popen(
            [binary, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready(15.0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def error_log(self) -> str:
        path = self.prefix / "error.log"
        return path.read_text() if path.exists() else ""

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"nginx did not start:\n{self.error_log()}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Fast shutdown (``SIGTERM``); killed if it has not ended within 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> NginxProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
