"""For scripts that run outside pytest (bench/, tests/load/): tests/unit/conftest.py, loaded once by path (it is not
importable by name). Loading it puts the collection on the import path; it also manufactures swtpm instances."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_CONFTEST = Path(__file__).resolve().parent / "unit" / "conftest.py"


def unit_conftest():
    module = sys.modules.get("ck_unit_conftest")
    if module is None:
        spec = importlib.util.spec_from_file_location("ck_unit_conftest", _CONFTEST)
        module = importlib.util.module_from_spec(spec)
        sys.modules["ck_unit_conftest"] = module
        spec.loader.exec_module(module)
    return module
