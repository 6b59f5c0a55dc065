# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""drill_renew's hands on a lab control plane: this file is piped to the node venv's Python, with one command.

report FILES...   JSON {file: notAfter (ISO)} of certificates and kubeconfigs (their client certificate)
served            JSON: whether the API server (6443) and the join service (9290) serve the certificates on disk
expire FILES...   re-sign each certificate (and each kubeconfig's) as it is, but expired yesterday, with the CA on
                  the node that issued it: what a year's power-off leaves behind, without touching any clock
restart PODS...   restart static pods the way the kubelet does (manifest moved away until the port closes, then back)
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import socket
import ssl
import sys
import time

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

PKI = "/etc/kubernetes/pki"
CAS = ("ca", "etcd/ca", "front-proxy-ca")
PORTS = {"etcd": 2381, "kube-apiserver": 6443, "kube-controller-manager": 10257, "kube-scheduler": 10259}


def _certificate(path: str) -> tuple[x509.Certificate, dict | None]:
    with open(path, "rb") as handle:
        content = handle.read()
    if path.endswith(".conf"):
        config = yaml.safe_load(content)
        pem = base64.b64decode(config["users"][0]["user"]["client-certificate-data"])
        return x509.load_pem_x509_certificates(pem)[0], config
    return x509.load_pem_x509_certificates(content)[0], None


def report(paths: list[str]) -> dict:
    return {path: _certificate(path)[0].not_valid_after_utc.isoformat() for path in paths if os.path.exists(path)}


def served() -> dict:
    result = {}
    for name, port, path in (
        ("apiserver", 6443, f"{PKI}/apiserver.crt"),
        ("joinservice", 9290, "/etc/confidential-kubernetes/joinservice.crt"),
    ):
        pem = ssl.get_server_certificate(("127.0.0.1", port), timeout=10)
        result[name] = x509.load_pem_x509_certificate(pem.encode()) == _certificate(path)[0]
    return result


def expire(paths: list[str]) -> None:
    now = datetime.datetime.now(datetime.timezone.utc)
    authorities = {}
    for name in CAS:
        with open(f"{PKI}/{name}.crt", "rb") as cert, open(f"{PKI}/{name}.key", "rb") as key:
            ca = x509.load_pem_x509_certificate(cert.read())
            authorities[ca.subject] = (ca, serialization.load_pem_private_key(key.read(), password=None))
    for path in paths:
        current, config = _certificate(path)
        ca, ca_key = authorities[current.issuer]
        builder = (
            x509.CertificateBuilder()
            .subject_name(current.subject)
            .issuer_name(ca.subject)
            .public_key(current.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=366))
            .not_valid_after(now - datetime.timedelta(days=1))
        )
        for extension in current.extensions:
            if extension.oid != x509.oid.ExtensionOID.AUTHORITY_KEY_IDENTIFIER:
                builder = builder.add_extension(extension.value, extension.critical)
        pem = builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
        if config is None:
            content = pem
        else:
            config["users"][0]["user"]["client-certificate-data"] = base64.b64encode(pem).decode()
            content = yaml.safe_dump(config).encode()
        with open(path + ".expired", "wb") as handle:
            handle.write(content)
        os.chmod(path + ".expired", os.stat(path).st_mode & 0o777)
        os.replace(path + ".expired", path)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def restart(pods: list[str]) -> None:
    for pod in pods:
        manifest, aside = f"/etc/kubernetes/manifests/{pod}.yaml", f"/etc/kubernetes/{pod}.yaml.drill"
        os.replace(manifest, aside)
        deadline = time.monotonic() + 120
        while _listening(PORTS[pod]):
            if time.monotonic() > deadline:
                os.replace(aside, manifest)
                raise SystemExit(f"{pod} still listens on {PORTS[pod]} two minutes after its manifest was moved away")
            time.sleep(1)
        os.replace(aside, manifest)


def main() -> None:
    command, args = sys.argv[1], sys.argv[2:]
    if command == "report":
        print(json.dumps(report(args)))
    elif command == "served":
        print(json.dumps(served()))
    elif command == "expire":
        expire(args)
    elif command == "restart":
        restart(args)
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
