"""The confidential-kubernetes lab: nspawn nodes with swtpm on one machine."""

from __future__ import annotations


class LabError(Exception):
    """An expected failure of the lab, reported as one line without a traceback."""
