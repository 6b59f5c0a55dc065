"""The node's continuous attestation loop against real join services (real gRPC over TLS, real swtpm): it attests at
the first endpoint that answers, keeps going after a refusal, and logs one line per round without a secret."""

from __future__ import annotations

import io
import json
import time

import yaml
from join_harness import join_with_client

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.log import StructuredLog
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket import attest, boot

INTERVAL = 0.3


def _config(tmp_path, lab, endpoints) -> boot.BootConfig:
    ca = tmp_path / "cluster-ca.crt"
    ca.write_bytes(lab.ca_pem)
    document = {
        "endpoints": endpoints,
        "cluster_ca_file": str(ca),
        "tcti": lab.swtpm.tcti,
        "state_disk": {"device": str(tmp_path / "disk.img")},
        "timeout": 5,
    }
    path = tmp_path / "join.yml"
    path.write_text(yaml.safe_dump(document))
    path.chmod(0o600)
    return boot.load_config(str(path))


def _joined(join_lab):
    service = join_lab.start(attestation_interval=INTERVAL, attestation_grace=3600.0, worker_processes=0)
    join_with_client(join_lab, service)
    with issuer.Tpm(join_lab.swtpm.tcti) as tpm:
        tpm.pcr_event(15, service.issuer.cluster_id)
    time.sleep(INTERVAL)
    return service


def test_the_loop_attests_every_interval_past_a_dead_endpoint_and_goes_on_after_a_refusal(join_lab, tmp_path):
    service = _joined(join_lab)
    stream = io.StringIO()
    config = _config(tmp_path, join_lab, ["127.0.0.1:1", service.endpoint])
    results = attest.run(config, StructuredLog(stream), interval=INTERVAL, jitter=0.1, rounds=2)
    assert results == ["passed", "passed"]
    with issuer.Tpm(join_lab.swtpm.tcti) as tpm:
        tpm.pcr_event(8, b"a changed boot component")
    time.sleep(INTERVAL)
    assert attest.run(config, StructuredLog(stream), interval=INTERVAL, rounds=2) == ["refused", "refused"]
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["result"] for line in lines] == ["passed", "passed", "refused", "refused"]
    assert lines[2]["reason"] == "pcr-policy" and lines[0]["endpoint"] == service.endpoint
    assert join_lab.ca_pem.decode().splitlines()[1] not in stream.getvalue()


def test_no_endpoint_answering_is_reported_as_unreachable(join_lab, tmp_path):
    join_lab.write_policy()
    stream = io.StringIO()
    config = _config(tmp_path, join_lab, ["127.0.0.1:1"])
    assert attest.attest_round(config, StructuredLog(stream)) == "unreachable"
    assert json.loads(stream.getvalue())["result"] == "unreachable"


def test_the_delay_is_jittered_within_its_bounds():
    assert attest.next_delay(60, 0.1, lambda: 0.0) == 54.0
    assert attest.next_delay(60, 0.1, lambda: 1.0) == 66.0
    assert attest.next_delay(60, 0.0, lambda: 0.7) == 60.0
