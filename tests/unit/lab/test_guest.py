"""Tests of the VM nodes' guest image cache (cklab.guest): the manifest, verification and rebuild, without building.

The image's real build (debootstrap, about 3-8 minutes) is `tests/lab/lab guest`; here stand-in files pin that a
corrupt, missing or foreign image is refused, and that ensure_guest rebuilds it then and only then.
"""

from __future__ import annotations

import json
import shutil

import pytest

from cklab import LabError, guest, kubernetes
from cklab.paths import LabPaths


# ---- guest image manifest ---------------------------------------------------------------


def fake_image(paths: LabPaths, key: str) -> guest.GuestLayout:
    """An image dir with small stand-in files and a manifest that records them."""
    layout = guest.GuestLayout(paths, key)
    layout.image_dir.mkdir(parents=True)
    for name in guest.FILES:
        (layout.image_dir / name).write_bytes(f"{name} of the test image\n".encode())
    digests = {name: kubernetes.file_sha256(layout.image_dir / name) for name in guest.FILES}
    layout.manifest.write_text(guest.render_manifest(key, "6.1.0-test-amd64", digests, {"debootstrap": 1.0}))
    return layout


@pytest.fixture
def paths(tmp_path) -> LabPaths:
    return LabPaths(lab_dir=tmp_path / "lab", cache_dir=tmp_path / "cache", repo_root=tmp_path)


@pytest.fixture(autouse=True)
def host_packages_present(monkeypatch):
    """No test here installs Debian packages: the host has what runs a VM."""
    monkeypatch.setattr(guest, "missing_debian_packages", lambda packages: [])


def test_a_matching_image_is_used_without_a_build(paths, monkeypatch):
    fake_image(paths, guest.image_key())
    monkeypatch.setattr(guest, "_build", lambda layout, log: pytest.fail("built although the image matched"))
    lines: list[str] = []
    image = guest.ensure_guest(paths, lines.append)
    assert image.kernel_release == "6.1.0-test-amd64"
    assert image.root_image == paths.cache_dir / "guest" / guest.image_key()[:20] / "root.img"
    assert guest.verify_guest(paths, lines.append) == {}
    assert "verified" in lines[0]


@pytest.mark.parametrize("name", guest.FILES)
def test_a_corrupt_file_is_refused_and_the_image_rebuilt(paths, monkeypatch, name):
    layout = fake_image(paths, guest.image_key())
    with (layout.image_dir / name).open("r+b") as stream:
        stream.write(b"X")
    problems = guest.verify_guest(paths, lambda line: None)
    assert list(problems) == [name]
    assert "but the manifest records" in problems[name]
    rebuilt = []

    def build(layout, log):
        rebuilt.append(layout.key)
        shutil.rmtree(layout.image_dir)
        fake_image(paths, layout.key)

    monkeypatch.setattr(guest, "_build", build)
    lines: list[str] = []
    guest.ensure_guest(paths, lines.append)
    assert rebuilt == [guest.image_key()]
    assert lines[0].startswith(f"guest: {name}: sha256 ")


def test_a_missing_file_is_refused(paths):
    layout = fake_image(paths, guest.image_key())
    (layout.image_dir / "initrd.img").unlink()
    assert guest.verify_guest(paths, lambda line: None) == {"initrd.img": "missing"}


def test_no_manifest_means_not_built(paths):
    problems = guest.verify_guest(paths, lambda line: None)
    assert list(problems) == ["manifest.json"] and "not built yet" in problems["manifest.json"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("not json", "not JSON"),
        (json.dumps({"key": "0" * 64}), "another recipe key"),
        (json.dumps({"key": "KEY", "kernel_release": "6.1", "sha256": {"root.img": "ab"}}), "lacks a sha256"),
    ],
    ids=["not JSON", "another recipe", "a file without its sha256"],
)
def test_a_foreign_or_damaged_manifest_is_refused(text, message):
    key = guest.image_key()
    with pytest.raises(LabError, match=message):
        guest.parse_manifest(text.replace("KEY", key), key)


def test_the_recipe_key_changes_with_the_package_list(monkeypatch):
    before = guest.image_key()
    monkeypatch.setattr(guest, "PACKAGES", (*guest.PACKAGES, "strace"))
    assert guest.image_key() != before


def test_the_build_steps_report_their_failure_as_guest_steps(tmp_path):
    runner = kubernetes.StepRunner(tmp_path / "logs", subject="guest")
    with pytest.raises(LabError, match=r"^guest mkfs step: sh -c exit 2 failed \(exit 2\)"):
        runner.run("mkfs", ["sh", "-c", "exit 2"])


def test_power_commands_get_the_cached_image_only_when_it_verifies(paths, monkeypatch):
    monkeypatch.setattr(guest, "_build", lambda layout, log: pytest.fail("a power command must not build"))
    with pytest.raises(LabError, match="manifest.json: missing .* 'lab up' or 'lab guest' builds it"):
        guest.cached_guest(paths, lambda line: None)
    layout = fake_image(paths, guest.image_key())
    assert guest.cached_guest(paths, lambda line: None).kernel == layout.image_dir / "vmlinuz"
    (layout.image_dir / "vmlinuz").write_bytes(b"another kernel")
    with pytest.raises(LabError, match="vmlinuz: sha256 "):
        guest.cached_guest(paths, lambda line: None)


def test_host_packages_missing_beside_a_cached_image_are_installed(paths, monkeypatch):
    fake_image(paths, guest.image_key())
    monkeypatch.setattr(guest, "missing_debian_packages", lambda packages: ["ovmf"])
    monkeypatch.setattr(guest, "_apt_step", lambda runner: "installed ovmf")
    lines: list[str] = []
    guest.ensure_guest(paths, lines.append)
    assert lines[0] == "guest: apt: installed ovmf"
