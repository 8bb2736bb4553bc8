"""Real proxies in front of ``responses-cache serve`` processes, for the tests behind a proxy
(``tests/store/test_behind_a_proxy.py``) and the rolling-restart load run (:mod:`.rolling_restart`),
each configured as ``docs/deploy.md`` ships it with only its ports replaced:

* nginx: the site configuration ``docs/nginx/responses-cache.conf``, inside a main configuration
  that keeps everything in a temporary prefix (no daemon, its pid, logs and temporary files there,
  one loopback port);
* HAProxy: ``docs/haproxy/responses-cache.cfg``, whole."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from responses_cache.testing import free_port, wait_listening

DOCS = Path(__file__).resolve().parents[2] / "docs"
SITE = DOCS / "nginx" / "responses-cache.conf"
HAPROXY_CONFIG = DOCS / "haproxy" / "responses-cache.cfg"

#: What the tests replace in the shipped site configuration (each occurs exactly once there).
DOC_UPSTREAMS = ("server 127.0.0.1:8001 ", "server 127.0.0.1:8002 ")
DOC_LISTEN = "listen 127.0.0.1:8080;"
DOC_READ_TIMEOUT = "proxy_read_timeout 3600s;"


#: What the tests replace in the shipped HAProxy configuration (each occurs exactly once there).
DOC_HAPROXY_SERVERS = ("server serve1 127.0.0.1:8001\n", "server serve2 127.0.0.1:8002\n")
DOC_HAPROXY_BIND = "bind 127.0.0.1:8080"


def binary(name: str) -> str | None:
    """The ``name`` executable (Debian's packages put nginx and haproxy in ``/usr/sbin``), or None."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")


def nginx_binary() -> str | None:
    return binary("nginx")


def _replaced(path: Path, replacements: dict[str, str]) -> str:
    text = path.read_text()
    for old, new in replacements.items():
        assert text.count(old) == 1, f"{path.name} should hold {old!r} once"
        text = text.replace(old, new)
    return text


def site_config(
    upstream_ports: Sequence[int], port: int, *, read_timeout_s: int | None = None
) -> str:
    """The shipped site configuration with the test's ports (a third process and more: more
    ``server`` lines like the second) and, for the timeout test, another ``proxy_read_timeout``."""
    if len(upstream_ports) < len(DOC_UPSTREAMS):
        raise ValueError(f"the shipped configuration names {len(DOC_UPSTREAMS)} processes at least")
    first, *rest = upstream_ports
    last_line = next(line for line in SITE.read_text().splitlines(keepends=True) if DOC_UPSTREAMS[1] in line)
    replacements: dict[str, str] = {
        DOC_LISTEN: f"listen 127.0.0.1:{port};",
        DOC_UPSTREAMS[0]: f"server 127.0.0.1:{first} ",
        last_line: "".join(last_line.replace(DOC_UPSTREAMS[1], f"server 127.0.0.1:{p} ") for p in rest),
    }
    if read_timeout_s is not None:
        replacements[DOC_READ_TIMEOUT] = f"proxy_read_timeout {read_timeout_s}s;"
    return _replaced(SITE, replacements)


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


P = TypeVar("P", bound="ProxyProcess")


class ProxyProcess:
    """A proxy in the foreground on a free loopback port (``.url``), stopped with ``SIGTERM``."""

    name = "proxy"
    #: How long the proxy takes to see a backend's readiness change (its health checks); a
    #: rolling restart stops the next process only that long after the previous one is ready.
    settle_s = 0.0

    def __init__(self, argv: Sequence[str], port: int, log: Path) -> None:
        self.port, self.log = port, log
        self.proc = subprocess.Popen(list(argv), stdout=log.open("ab"), stderr=subprocess.STDOUT)
        self._wait_ready(15.0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def error_log(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def _wait_ready(self, timeout: float) -> None:
        if not wait_listening(self.proc, "127.0.0.1", self.port, timeout):
            self.stop()
            raise RuntimeError(f"{self.name} did not start:\n{self.error_log()}")

    def stop(self) -> None:
        """Fast shutdown (``SIGTERM``); killed if it has not ended within 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self: P) -> P:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class NginxProcess(ProxyProcess):
    """``nginx -p PREFIX -c nginx.conf`` with the shipped site configuration in front of
    ``upstream_ports``."""

    name = "nginx"

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
        port = free_port()
        site = prefix / "responses-cache.conf"
        site.write_text(site_config(upstream_ports, port, read_timeout_s=read_timeout_s))
        conf = prefix / "nginx.conf"
        conf.write_text(_main_config(prefix, site))
        argv = [binary, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")]
        super().__init__(argv, port, prefix / "error.log")


class HAProxyProcess(ProxyProcess):
    """``haproxy -db -f responses-cache.cfg``: the shipped configuration in front of
    ``upstream_ports``."""

    name = "haproxy"
    settle_s = 1.5  # the shipped config checks /readyz every second (rise 1, fall 1)

    def __init__(self, binary: str, prefix: Path, upstream_ports: Sequence[int]) -> None:
        prefix.mkdir(parents=True, exist_ok=True)
        port = free_port()
        replacements = {DOC_HAPROXY_BIND: f"bind 127.0.0.1:{port}"}
        for doc, upstream in zip(DOC_HAPROXY_SERVERS, upstream_ports, strict=True):
            replacements[doc] = doc.replace(doc.split()[-1], f"127.0.0.1:{upstream}")
        conf = prefix / "haproxy.cfg"
        conf.write_text(_replaced(HAPROXY_CONFIG, replacements))
        super().__init__([binary, "-db", "-f", str(conf)], port, prefix / "haproxy.log")
