"""What the security suites share: the unit tests' swtpm fixtures and join harness, usable from scripts too."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JOIN_TESTS = REPO / "tests" / "unit" / "plugins" / "module_utils" / "_join"


def unit_conftest():
    """tests/unit/conftest.py as a module (it also puts the collection on sys.path): ManufacturedTpm, SwtpmInstance, fixtures."""
    module = sys.modules.get("ck_unit_conftest")
    if module is None:
        spec = importlib.util.spec_from_file_location("ck_unit_conftest", REPO / "tests" / "unit" / "conftest.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["ck_unit_conftest"] = module
        spec.loader.exec_module(module)
    if str(JOIN_TESTS) not in sys.path:
        sys.path.insert(0, str(JOIN_TESTS))
    return module


class ManufacturedTpms:
    """Trusted ('lab', 'lab2') and untrusted ('other') TPM states with EK certificates, for scripts outside pytest."""

    def __init__(self, names: tuple[str, ...] = ("lab", "lab2", "other")):
        conftest = unit_conftest()
        self.dir = Path(tempfile.mkdtemp(prefix="ck-security-"))
        trusted, other = self.dir / "ca-trusted", self.dir / "ca-other"
        self.tpms = {
            name: conftest.ManufacturedTpm(self.dir / f"tpm-{name}", ca)
            for name, ca in (("lab", trusted), ("lab2", trusted), ("other", other))
            if name in names
        }
        self._instance_type = conftest.SwtpmInstance

    def start(self, name: str = "lab"):
        return self._instance_type(self.tpms[name])
