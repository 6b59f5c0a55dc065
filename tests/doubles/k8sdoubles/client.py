"""A real TLS client for the API double, configured from a kubeconfig."""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import yaml

from .common import DoubleError, host_path


class ApiStatusError(DoubleError):
    """The server answered with a metav1.Status failure."""

    def __init__(self, code: int, status: dict) -> None:
        self.code = code
        self.status = status
        self.reason = status.get("reason", "")
        super().__init__(status.get("message", f"the server responded with status {code}"))


@dataclass
class Connection:
    server: str
    ca_pem: bytes | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    token: str | None = None
    insecure: bool = False

    @property
    def host_port(self) -> str:
        return urllib.parse.urlsplit(self.server).netloc


def _read_ref(base: Path, ref: str) -> bytes:
    path = Path(ref)
    if not path.is_absolute():
        return (base / path).read_bytes()
    return host_path(ref).read_bytes()


def load_kubeconfig(path: str | os.PathLike[str], context_name: str | None = None) -> tuple[dict, Connection]:
    """Resolve the current context of a kubeconfig into a Connection."""
    file = Path(path)
    try:
        config = yaml.safe_load(file.read_text()) or {}
    except FileNotFoundError:
        raise DoubleError(f"stat {path}: no such file or directory") from None
    except yaml.YAMLError as exc:
        raise DoubleError(f'error loading config file "{path}": {exc}') from None
    context_name = context_name or config.get("current-context")
    contexts = {c["name"]: c.get("context", {}) for c in config.get("contexts") or []}
    if not context_name or context_name not in contexts:
        raise DoubleError(
            f"context was not found for specified context: {context_name}"
            if context_name
            else "invalid configuration: no configuration has been provided"
        )
    context = contexts[context_name]
    clusters = {c["name"]: c.get("cluster", {}) for c in config.get("clusters") or []}
    users = {u["name"]: u.get("user", {}) for u in config.get("users") or []}
    cluster = clusters.get(context.get("cluster"))
    if cluster is None:
        raise DoubleError(
            f"invalid configuration: [context was not found for specified context: {context_name}, cluster has no server defined]"
        )
    user = users.get(context.get("user"), {})
    base = file.parent
    conn = Connection(server=cluster.get("server", ""))
    if not conn.server:
        raise DoubleError("invalid configuration: no server found for cluster")
    if cluster.get("certificate-authority-data"):
        conn.ca_pem = base64.b64decode(cluster["certificate-authority-data"])
    elif cluster.get("certificate-authority"):
        conn.ca_pem = _read_ref(base, cluster["certificate-authority"])
    conn.insecure = bool(cluster.get("insecure-skip-tls-verify"))
    try:
        if user.get("client-certificate-data"):
            conn.cert_pem = base64.b64decode(user["client-certificate-data"])
        elif user.get("client-certificate"):
            conn.cert_pem = _read_ref(base, user["client-certificate"])
        if user.get("client-key-data"):
            conn.key_pem = base64.b64decode(user["client-key-data"])
        elif user.get("client-key"):
            conn.key_pem = _read_ref(base, user["client-key"])
    except OSError as exc:
        raise DoubleError(f"unable to read client-cert/key: {exc}") from None
    conn.token = user.get("token")
    if not conn.token and user.get("tokenFile"):
        conn.token = _read_ref(base, user["tokenFile"]).decode().strip()
    return config, conn


class Client:
    def __init__(self, conn: Connection, timeout: float = 10.0) -> None:
        self.conn = conn
        self.timeout = timeout
        parsed = urllib.parse.urlsplit(conn.server)
        if parsed.scheme != "https":
            raise DoubleError(f"the API server double only speaks https, got {conn.server!r}")
        self.host = parsed.hostname or ""
        self.port = parsed.port or 443
        self.context = self._ssl_context()
        self._connection: http.client.HTTPSConnection | None = None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if self.conn.insecure or self.conn.ca_pem is None:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            context.load_verify_locations(cadata=self.conn.ca_pem.decode())
        if self.conn.cert_pem and self.conn.key_pem:
            # ssl only loads client credentials from files: use a private temp file.
            fd, name = tempfile.mkstemp(prefix="k8s-double-client-")
            try:
                os.write(fd, self.conn.cert_pem + b"\n" + self.conn.key_pem)
                os.close(fd)
                context.load_cert_chain(name)
            finally:
                os.unlink(name)
        return context

    def request(self, method: str, path: str, body: object = None, content_type: str = "application/json") -> object:
        headers = {"Accept": "application/json", "User-Agent": "k8s-doubles"}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        if self.conn.token:
            headers["Authorization"] = f"Bearer {self.conn.token}"
        for attempt in (1, 2):
            reused = self._connection is not None
            if self._connection is None:
                self._connection = http.client.HTTPSConnection(
                    self.host, self.port, timeout=self.timeout, context=self.context
                )
            try:
                self._connection.request(method, path, body=payload, headers=headers)
                response = self._connection.getresponse()
                raw = response.read()
                break
            except ssl.SSLCertVerificationError as exc:
                self.close()
                raise DoubleError(
                    f'Get "{self.conn.server}{path}": tls: failed to verify certificate: {exc.verify_message}'
                ) from None
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                # A kept-alive connection the server has closed is retried once on a fresh one.
                if reused and attempt == 1:
                    continue
                raise DoubleError(
                    f'Get "{self.conn.server}{path}": dial tcp {self.host}:{self.port}: connect: {_errno_text(exc)}'
                ) from None
        if response.getheader("Connection", "").lower() == "close":
            self.close()
        content = response.getheader("Content-Type", "")
        if response.status >= 400:
            if "json" in content:
                status = json.loads(raw)
                if isinstance(status, dict) and status.get("kind") == "Status":
                    raise ApiStatusError(response.status, status)
            raise ApiStatusError(
                response.status,
                {
                    "message": "the server could not find the requested resource",
                    "reason": "NotFound" if response.status == 404 else "",
                    "code": response.status,
                },
            )
        if "json" in content:
            return json.loads(raw)
        return raw.decode()

    def get(self, path: str) -> object:
        return self.request("GET", path)


def _errno_text(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "i/o timeout"
    return str(exc) or type(exc).__name__


def client_from_kubeconfig(path: str | os.PathLike[str], context: str | None = None) -> Client:
    return Client(load_kubeconfig(path, context)[1])


def resource_path(group: str, version: str, plural: str, namespace: str = "", name: str = "") -> str:
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    if namespace:
        prefix += f"/namespaces/{namespace}"
    prefix += f"/{plural}"
    if name:
        prefix += f"/{urllib.parse.quote(name, safe='')}"
    return prefix
