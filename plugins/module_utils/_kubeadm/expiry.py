# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""When a node's certificates expire: kubeadm's certificates and kubeconfigs on a control plane (the files
``kubeadm certs check-expiration`` lists, and the CAs), the kubelet's client certificate on every node, and any further
certificate a caller names (the join service's). Reads files only; the clock is the caller's ``now``.
"""

from __future__ import annotations

import base64
import datetime
import os
from dataclasses import dataclass

try:
    import yaml
    from cryptography import x509
except ImportError as exc:  # reported by the certificate_expiry module through missing_required_lib()
    IMPORT_ERROR: ImportError | None = exc
else:
    IMPORT_ERROR = None

# What `kubeadm certs renew all` renews (relative to the Kubernetes directory): certificates, then kubeconfigs.
RENEWABLE_CERTIFICATES = (
    "pki/apiserver.crt",
    "pki/apiserver-kubelet-client.crt",
    "pki/apiserver-etcd-client.crt",
    "pki/front-proxy-client.crt",
    "pki/etcd/server.crt",
    "pki/etcd/peer.crt",
    "pki/etcd/healthcheck-client.crt",
)
RENEWABLE_KUBECONFIGS = ("admin.conf", "controller-manager.conf", "scheduler.conf")
# The CAs (ten years): kubeadm renews none of them; reported, never renewed here.
AUTHORITIES = ("pki/ca.crt", "pki/front-proxy-ca.crt", "pki/etcd/ca.crt")
KUBELET_CLIENT = "/var/lib/kubelet/pki/kubelet-client-current.pem"

OK = "ok"
EXPIRING = "expiring"
EXPIRED = "expired"


class ExpiryError(ValueError):
    """A file that is there cannot be read as what it should be (a certificate, or a kubeconfig with a client one)."""


@dataclass(frozen=True)
class Expiry:
    """One file's certificate and when it stops being valid. ``group``: control_plane, kubelet or other."""

    path: str
    group: str
    renewable: bool
    not_after: datetime.datetime

    def days_left(self, now: datetime.datetime) -> float:
        return (self.not_after - now).total_seconds() / 86400

    def status(self, now: datetime.datetime, threshold: datetime.timedelta) -> str:
        if self.not_after <= now:
            return EXPIRED
        return EXPIRING if self.not_after - now < threshold else OK

    def report(self, now: datetime.datetime, threshold: datetime.timedelta) -> dict:
        return {
            "path": self.path,
            "group": self.group,
            "renewable": self.renewable,
            "not_after": self.not_after.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "days_left": round(self.days_left(now), 2),
            "status": self.status(now, threshold),
        }


def certificate_not_after(pem: bytes, what: str) -> datetime.datetime:
    """The expiry of the first certificate in ``pem`` (a key beside it, as in the kubelet's -current.pem, is ignored)."""
    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise ExpiryError(f"{what} holds no readable PEM certificate ({exc})") from None
    return certificates[0].not_valid_after_utc


def kubeconfig_not_after(text: str, path: str) -> datetime.datetime:
    """The expiry of the client certificate of a kubeconfig's first user, embedded or in a file beside it."""
    try:
        config = yaml.safe_load(text)
        user = config["users"][0]["user"]
    except (yaml.YAMLError, KeyError, IndexError, TypeError) as exc:
        raise ExpiryError(f"{path} is not a kubeconfig with a user ({exc!r})") from None
    if "client-certificate-data" in user:
        try:
            pem = base64.b64decode(user["client-certificate-data"], validate=True)
        except (ValueError, TypeError):
            raise ExpiryError(f"{path}: client-certificate-data is not base64") from None
        return certificate_not_after(pem, path)
    if "client-certificate" in user:
        target = os.path.join(os.path.dirname(path), user["client-certificate"])
        return certificate_not_after(_read(target), f"{target} (the client certificate of {path})")
    raise ExpiryError(f"{path}: its user has no client certificate")


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(1 << 20)


def scan(
    kubernetes_dir: str, control_plane: bool, kubelet_client: str = KUBELET_CLIENT, others: tuple[str, ...] = ()
) -> tuple[list[Expiry], list[str]]:
    """Every expiry found, and the files looked for but absent (a node that has not joined has none of them)."""
    wanted: list[tuple[str, str, bool, bool]] = []  # path, group, renewable, kubeconfig
    if control_plane:
        wanted += [
            (os.path.join(kubernetes_dir, name), "control_plane", True, False) for name in RENEWABLE_CERTIFICATES
        ]
        wanted += [(os.path.join(kubernetes_dir, name), "control_plane", True, True) for name in RENEWABLE_KUBECONFIGS]
        wanted += [(os.path.join(kubernetes_dir, name), "control_plane", False, False) for name in AUTHORITIES]
    wanted.append((kubelet_client, "kubelet", False, False))
    wanted += [(path, "other", False, False) for path in others]
    found, missing = [], []
    for path, group, renewable, kubeconfig in wanted:
        try:
            content = _read(path)
        except FileNotFoundError:
            missing.append(path)
            continue
        except OSError as exc:
            raise ExpiryError(f"cannot read {path}: {exc.strerror}") from None
        not_after = (
            kubeconfig_not_after(content.decode("utf-8", "replace"), path)
            if kubeconfig
            else certificate_not_after(content, path)
        )
        found.append(Expiry(path, group, renewable, not_after))
    return found, missing


def earliest(expiries: list[Expiry], group: str, renewable_only: bool = False) -> Expiry | None:
    candidates = [e for e in expiries if e.group == group and (e.renewable or not renewable_only)]
    return min(candidates, key=lambda e: e.not_after, default=None)


def summary(expiries: list[Expiry], missing: list[str], now: datetime.datetime, threshold: datetime.timedelta) -> dict:
    """The module's result: every file, the earliest per group, and the files expiring or expired."""

    def one(expiry: Expiry | None) -> dict | None:
        return expiry.report(now, threshold) if expiry else None

    return {
        "certificates": [e.report(now, threshold) for e in sorted(expiries, key=lambda e: e.not_after)],
        "missing": missing,
        "control_plane": one(earliest(expiries, "control_plane")),
        "control_plane_renewable": one(earliest(expiries, "control_plane", renewable_only=True)),
        "kubelet": one(earliest(expiries, "kubelet")),
        "expiring": [e.path for e in expiries if e.status(now, threshold) == EXPIRING],
        "expired": [e.path for e in expiries if e.status(now, threshold) == EXPIRED],
        "threshold_days": threshold.total_seconds() / 86400,
    }
