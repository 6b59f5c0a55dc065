#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: attestation_nonce
short_description: Draw a single-use, expiring verifier nonce on the controller
version_added: 0.1.0
description:
  - Draws 32 random bytes and records them in the controller's nonce ledger (a 0600 file of fixed-size text records,
    shared by parallel tasks under a lock), so that M(confidential.kubernetes.verify_evidence) can refuse a stale or
    replayed nonce.
  - The ledger remembers at most 10,000 nonces issued within two lifetimes; beyond that the task fails until some expire.
  - Runs on the controller only.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.action
attributes:
  check_mode:
    support: full
    details:
      - Nonces are drawn in check mode too, so that a checked play can still verify evidence.
  diff_mode:
    support: N/A
  idempotent:
    support: full
    details:
      - The ledger is bookkeeping of the verifier; the task always reports no change.
options:
  nonce_ledger:
    description: Path of the nonce ledger on the controller.
    type: path
    default: ~/.cache/confidential-kubernetes/nonce-ledger
  nonce_ttl:
    description: Lifetime of the nonce in seconds.
    type: float
    default: 60
seealso:
  - module: confidential.kubernetes.verify_evidence
"""

EXAMPLES = r"""
- name: Draw a nonce
  confidential.kubernetes.attestation_nonce:
  register: attestation_nonce

- name: Draw a nonce in a ledger beside the inventory that lives 30 seconds
  confidential.kubernetes.attestation_nonce:
    nonce_ledger: "{{ inventory_dir }}/secrets/nonce-ledger.json"
    nonce_ttl: 30
  register: attestation_nonce
"""

RETURN = r"""
nonce:
  description: The nonce, 64 hex characters.
  returned: success
  type: str
  sample: 9f2c4e1ab3d5f7081a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7081
expires_in:
  description: Seconds until the nonce expires.
  returned: success
  type: float
  sample: 60.0
"""
