from __future__ import annotations

import base64

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import derive
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import (
    RootSecrets,
    RootSecretsError,
)

DOC = {
    "master_key": base64.b64encode(bytes(range(0x40, 0x60))).decode(),
    "master_salt": base64.b64encode(bytes(range(0x60, 0x80))).decode(),
    "measurement_salt": base64.b64encode(bytes(32)).decode(),
}


def test_round_trip_and_derivations():
    secrets = RootSecrets.from_document(DOC, "test")
    assert secrets.to_document() == DOC
    # Row 3 of DESIGN section 2: the measurement secret of this master key and salt.
    assert secrets.measurement_secret().hex() == "4790578891f3fe6cc22cb661ecdc1b7e33121b1287546a52ba33a9136719c213"
    assert secrets.cluster_id() == derive.cluster_id(secrets.measurement_secret(), bytes(32))


def test_repr_shows_no_secret():
    secrets = RootSecrets.from_document(DOC, "test")
    assert DOC["master_key"] not in repr(secrets) and "master_key" not in repr(secrets)


@pytest.mark.parametrize(
    "doc,message",
    [
        ([], "must be a mapping"),
        ({**DOC, "master_key": "%%%"}, "master_key is not base64"),
        ({**DOC, "master_salt": base64.b64encode(b"short").decode()}, "master_salt must be 32 bytes"),
        ({k: v for k, v in DOC.items() if k != "measurement_salt"}, "measurement_salt must be 32 bytes"),
    ],
    ids=["not a mapping", "bad base64", "short salt", "missing field"],
)
def test_malformed_documents_name_the_field_not_the_value(doc, message):
    with pytest.raises(RootSecretsError, match=message) as err:
        RootSecrets.from_document(doc, "secrets file")
    assert DOC["master_key"] not in str(err.value)
