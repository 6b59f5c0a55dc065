"""The API double as a systemd service (lab nodes), checked through the systemctl seam."""

from __future__ import annotations

import subprocess
import sys

from k8s_doubles_harness import BIN
from k8sdoubles import kubeadm

UNIT = "kube-apiserver-double"


class FakeSystemd:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.active = False

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        self.calls.append(args)
        if args[:2] == ("enable", "--now"):
            self.active = True
        elif args[:2] == ("disable", "--now") or args[:1] == ("stop",):
            self.active = False
        code = 3 if args[0] == "is-active" and not self.active else 0
        return subprocess.CompletedProcess(["systemctl", *args], code, "", "")


def test_systemd_mode_installs_an_enabled_unit_and_reset_removes_it(monkeypatch, tmp_path):
    systemd = FakeSystemd()
    monkeypatch.setenv("K8S_DOUBLES_ROOT", str(tmp_path))
    monkeypatch.delenv("K8S_DOUBLES_APISERVER_BIND_ADDRESS", raising=False)
    monkeypatch.setattr(kubeadm, "use_systemd", lambda: True)
    monkeypatch.setattr(kubeadm, "_systemctl", systemd)

    kubeadm.start_apiserver("10.0.0.1", 6443, "/etc/kubernetes/pki", "10.96.0.0/12")
    unit_file = tmp_path / "etc/systemd/system/kube-apiserver-double.service"
    unit = unit_file.read_text()
    assert f"ExecStart={sys.executable} {BIN.parent}/k8sdoubles/run.py kube-apiserver --advertise-address=10.0.0.1 --secure-port=6443 " in unit
    assert "Restart=always\n" in unit and "WantedBy=multi-user.target\n" in unit
    assert systemd.calls[-2:] == [("daemon-reload",), ("enable", "--now", f"{UNIT}.service")]

    systemd.calls.clear()
    kubeadm.start_apiserver("10.0.0.1", 6443, "/etc/kubernetes/pki", "10.96.0.0/12")
    assert systemd.calls == [("is-active", "--quiet", UNIT)], "a running unit is left alone"

    assert kubeadm.stop_apiserver() is True
    assert ("disable", "--now", f"{UNIT}.service") in systemd.calls
    assert not unit_file.exists()
    assert kubeadm.stop_apiserver() is False
