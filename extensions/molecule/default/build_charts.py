"""Builds the scenario's chart archives (tests/helm_charts.py) and a values file with a secret in it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))

from helm_charts import make_chart  # noqa: E402

SCHEMA = '{"type": "object", "required": ["greeting"], "properties": {"greeting": {"type": "string", "pattern": "^[a-z ]+$"}}}'


def main() -> None:
    directory = Path(sys.argv[1])
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for version, hook in (("1.0.0", False), ("1.1.0", False), ("1.3.0", False), ("1.1.1", True), ("1.1.2", True)):
        make_chart(directory, version=version, hook=hook, schema=SCHEMA, secret=True)
    (directory / "secret-values.yaml").write_text("password: lab-s3cret-value\n")
    (directory / "secret-values.yaml").chmod(0o600)


main()
