# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Kubernetes API as the join service uses it: one client, built once from the service's kubeconfig.

One ``kubernetes`` client (one authenticated urllib3 connection pool) serves every call of the service: bootstrap-token
Secrets, disk-binding ConfigMaps, and the watches on Nodes, certificate signing requests and bindings. No process is
started per call. The client is synchronous, so calls run on a small thread pool of their own and the event loop only
awaits them; watches run in a thread each.

Every call is retried within ``retry_window`` when the API is away (connection refused or reset, timeouts, 429 and 5xx:
an API server restarting), then fails with ``ApiUnavailable`` naming the endpoint. A retried create may meet its own
first attempt: the callers' create-if-absent logic reads what is there and compares, so that is harmless. Responses are
read as JSON without the client's models, and the client's debug logging stays off: it would log request and response
bodies, which carry bootstrap tokens. The client copies a kubeconfig's embedded client key to a 0600 temporary file
(Python's ``ssl`` loads keys from files only), removed when the process exits.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

try:
    import urllib3
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.watch.watch import iter_resp_lines
except ImportError as exc:  # reported by ClusterApi.from_kubeconfig, at the service's start
    KUBERNETES_IMPORT_ERROR: ImportError | None = exc
else:
    KUBERNETES_IMPORT_ERROR = None

from .._kubeadm import scrub

NAMESPACE = "kube-system"
# Seconds to connect, and to wait for an answer.
REQUEST_TIMEOUT = (5.0, 30.0)
# How long one call keeps trying while the API is away (an API server restart takes a few seconds).
RETRY_WINDOW = 20.0
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# A watch is renewed this often (the server ends it), and the client gives up on a silent one a little later.
WATCH_SECONDS = 240
WATCH_BACKOFF_MIN = 0.2
WATCH_BACKOFF_MAX = 5.0

# resource -> (API group class, the client's name for one object, namespaced)
RESOURCES = {
    "secrets": ("CoreV1Api", "secret", True),
    "configmaps": ("CoreV1Api", "config_map", True),
    "nodes": ("CoreV1Api", "node", False),
    "certificatesigningrequests": ("CertificatesV1Api", "certificate_signing_request", False),
    "events": ("CoreV1Api", "event", True),
    "leases": ("CoordinationV1Api", "lease", True),
}


class ApiUnavailable(RuntimeError):
    """The API did not answer within the retry window; the message names the endpoint, the call and the last error."""


class ApiStatusError(RuntimeError):
    """The API answered a call with an error status (404, 409, 403 ...); the message carries the API's words."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _api_words(exc: "ApiException") -> str:
    try:
        words = json.loads(exc.body).get("message", "")
    except (TypeError, ValueError, AttributeError):
        words = ""
    return scrub(str(words or exc.reason or "no message"))[:500]


def _transport_cause(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or exc
    return scrub(f"{type(reason).__name__}: {reason}")[:300]


class ClusterApi:
    """One client for the service's API calls: async CRUD of the objects in ``RESOURCES`` and watched lists of them.

    ``create``/``read``/``replace``/``delete``/``list`` return the API's JSON documents; ``watch`` keeps a list current.
    """

    def __init__(
        self,
        api_client,
        host: str,
        pool_size: int = 16,
        request_timeout: tuple[float, float] = REQUEST_TIMEOUT,
        retry_window: float = RETRY_WINDOW,
    ):
        self.host = host
        self.request_timeout = request_timeout
        self.retry_window = retry_window
        self._client = api_client
        groups = {group for group, _singular, _namespaced in RESOURCES.values()}
        self._groups = {name: getattr(k8s_client, name)(api_client) for name in groups}
        self._executor = ThreadPoolExecutor(max_workers=pool_size, thread_name_prefix="kubeapi")
        self._watches: list[WatchedList] = []
        self._closed = False

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str, pool_size: int = 16, **kwargs) -> "ClusterApi":
        """The client for ``kubeconfig``; RuntimeError naming the file when it is unusable."""
        if KUBERNETES_IMPORT_ERROR is not None:
            raise RuntimeError(
                f"the kubernetes Python client is required for the join service: {KUBERNETES_IMPORT_ERROR}"
            )
        configuration = k8s_client.Configuration()
        try:
            k8s_config.load_kube_config(
                config_file=kubeconfig, client_configuration=configuration, persist_config=False
            )
        except (ConfigException, OSError, ValueError) as exc:
            raise RuntimeError(f"cannot use the kubeconfig {kubeconfig}: {scrub(str(exc))[:300]}") from None
        # Never log bodies (tokens); the caller retries, so urllib3 does not (a retry of its own would hide the cause).
        configuration.debug = False
        configuration.retries = False
        configuration.connection_pool_maxsize = pool_size + 2
        return cls(k8s_client.ApiClient(configuration), configuration.host, pool_size, **kwargs)

    # --- calls ------------------------------------------------------------------------------------------------

    def _method(self, verb: str, resource: str, namespace: str = NAMESPACE) -> tuple[Callable, tuple]:
        resource, _slash, subresource = resource.partition("/")
        group, singular, namespaced = RESOURCES[resource]
        api = self._groups[group]
        singular += f"_{subresource}" if subresource else ""
        if namespaced:
            return getattr(api, f"{verb}_namespaced_{singular}"), (namespace,)
        return getattr(api, f"{verb}_{singular}"), ()

    def call(self, what: str, method: Callable, *args, **kwargs) -> dict:
        """``method`` of the client with the JSON answer as a dict, retried while the API is away (synchronous)."""
        started = time.monotonic()
        delay, attempts, cause = 0.1, 0, ""
        while True:
            attempts += 1
            try:
                data = method(*args, _preload_content=False, _request_timeout=self.request_timeout, **kwargs).data
                break
            except ApiException as exc:
                if exc.status == 0:  # TLS: a wrong CA or certificate does not heal by waiting
                    raise ApiUnavailable(
                        f"the Kubernetes API at {self.host} refused TLS for {what}: {_transport_cause(exc)}"
                    ) from None
                if exc.status not in RETRY_STATUSES:
                    raise ApiStatusError(exc.status, f"{what}: HTTP {exc.status}: {_api_words(exc)}") from None
                cause = f"HTTP {exc.status}: {_api_words(exc)}"
            except urllib3.exceptions.HTTPError as exc:
                cause = _transport_cause(exc)
            elapsed = time.monotonic() - started
            if self._closed or elapsed + delay > self.retry_window:
                raise ApiUnavailable(
                    f"the Kubernetes API at {self.host} did not answer {what} ({cause}; {attempts} attempt(s) in "
                    f"{elapsed:.1f} s)"
                )
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        try:
            return json.loads(data) if data else {}
        except ValueError:
            raise ApiUnavailable(f"the Kubernetes API at {self.host} answered {what} with something not JSON") from None

    async def _run(self, what: str, verb: str, resource: str, *args, namespace: str = NAMESPACE, **kwargs) -> dict:
        method, scope = self._method(verb, resource, namespace)
        call = functools.partial(self.call, what, method, *args, *scope, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def create(self, resource: str, body: dict, namespace: str = NAMESPACE) -> dict:
        name = body["metadata"]["name"]
        return await self._run(
            f"creating {resource} {namespace}/{name}", "create", resource, body=body, namespace=namespace
        )

    async def read(self, resource: str, name: str) -> dict:
        return await self._run(f"reading {resource} {NAMESPACE}/{name}", "read", resource, name)

    async def replace(self, resource: str, name: str, body: dict) -> dict:
        return await self._run(f"replacing {resource} {NAMESPACE}/{name}", "replace", resource, name, body=body)

    async def replace_status(self, resource: str, name: str, body: dict) -> dict:
        """The status subresource (a Node's conditions), compare-and-swap by the body's resourceVersion."""
        return await self._run(
            f"replacing the status of {resource} {name}", "replace", resource + "/status", name, body=body
        )

    async def delete(self, resource: str, name: str) -> bool:
        """Whether it was there (a missing object is no error)."""
        try:
            await self._run(f"deleting {resource} {NAMESPACE}/{name}", "delete", resource, name)
        except ApiStatusError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def list(self, resource: str, **selectors: str) -> list[dict]:
        listing = await self._run(f"listing {resource}", "list", resource, **selectors)
        return listing.get("items") or []

    def watch(
        self,
        resource: str,
        summarize: Callable[[dict], Any],
        on_change: Callable[[], None],
        on_failure: Callable[[str], None] = lambda message: None,
        **selectors: str,
    ) -> "WatchedList":
        """A list of ``resource`` kept current in a thread of its own (started); see ``WatchedList``."""
        method, scope = self._method("list", resource)
        watched = WatchedList(
            self, resource, functools.partial(method, *scope), summarize, on_change, on_failure, selectors
        )
        self._watches.append(watched)
        return watched.start()

    def close(self) -> None:
        self._closed = True
        for watched in self._watches:
            watched.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._client.close()


class WatchedList:
    """Objects of one resource kept current by the API's watch: list, then watch from the list's resourceVersion; a
    watch that ends (the server's timeout, an API server restart) resumes from the last version seen, and one the API
    no longer serves (410 Gone) lists again. ``summarize`` turns an object into what is kept (None: not kept);
    ``on_change`` is called from the watch's thread after each sync and each change, ``on_failure`` once when the API
    cannot be reached (then every ``WATCH_BACKOFF_MAX`` seconds at most it tries again)."""

    def __init__(self, api: ClusterApi, resource: str, list_call, summarize, on_change, on_failure, selectors: dict):
        self._api = api
        self.resource = resource
        self._list_call = list_call
        self._summarize = summarize
        self._on_change = on_change
        self._on_failure = on_failure
        self._selectors = selectors
        self._items: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._response = None
        self._failing, self._delay = False, WATCH_BACKOFF_MIN
        self.synced = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{resource}", daemon=True)

    def start(self) -> "WatchedList":
        self._thread.start()
        return self

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._items)

    def stop(self) -> None:
        self._stopped.set()
        response = self._response
        if response is not None:
            # Unblocks the thread's read of the stream.
            getattr(response, "shutdown", response.close)()

    def _run(self) -> None:
        version = ""
        while not self._stopped.is_set():
            try:
                if not version:
                    version = self._list()
                version = self._follow(version)
            except _Gone:
                version = ""
            except ApiException as exc:
                if exc.status == 410:
                    version = ""
                    continue
                self._failed(exc)
            except (ApiUnavailable, ApiStatusError, urllib3.exceptions.HTTPError, ValueError) as exc:
                self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        """Report the first failure of a streak, then wait (longer each time) before the next attempt."""
        if not self._failing and not self._stopped.is_set():
            self._on_failure(f"watching {self.resource} failed: {_transport_cause(exc)}")
        self._failing = True
        self._stopped.wait(self._delay)
        self._delay = min(self._delay * 2, WATCH_BACKOFF_MAX)

    def _connected(self) -> None:
        self._failing, self._delay = False, WATCH_BACKOFF_MIN

    def _list(self) -> str:
        listing = self._api.call(f"listing {self.resource}", self._list_call, **self._selectors)
        kept = {}
        for item in listing.get("items") or []:
            summary = self._summarize(item)
            if summary is not None:
                kept[item["metadata"]["name"]] = summary
        with self._lock:
            self._items = kept
        self._connected()
        self.synced.set()
        self._on_change()
        return listing["metadata"]["resourceVersion"]

    def _follow(self, version: str) -> str:
        """Apply the watch's events until it ends; the last version seen."""
        response = self._list_call(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _preload_content=False,
            _request_timeout=(self._api.request_timeout[0], WATCH_SECONDS + 30),
            **self._selectors,
        )
        self._response = response
        self._connected()
        try:
            if self._stopped.is_set():
                return version
            for line in iter_resp_lines(response):
                event = json.loads(line)
                kind, item = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if item.get("code") == 410:
                        raise _Gone()
                    raise ValueError(f"watch error {item.get('code')}: {item.get('message')}")
                version = item.get("metadata", {}).get("resourceVersion") or version
                if kind == "BOOKMARK":
                    continue
                self._apply(kind, item)
        finally:
            self._response = None
            response.release_conn()
        return version

    def _apply(self, kind: str, item: dict) -> None:
        name = item["metadata"]["name"]
        summary = None if kind == "DELETED" else self._summarize(item)
        with self._lock:
            before = self._items.get(name)
            if summary is None:
                self._items.pop(name, None)
            else:
                self._items[name] = summary
        if before != summary:
            self._on_change()


class _Gone(Exception):
    """The watch's resourceVersion is too old: list again."""
