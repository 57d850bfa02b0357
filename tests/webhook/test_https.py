"""fgpu-webhook over real HTTPS, as the API server calls it: the chain checked against the caBundle."""

from __future__ import annotations

import copy
import socket
import ssl
import threading

import jsonpatch
import pytest

from apis import names
from tests.webhook.client import Client, ca_context
from tests.webhook.conftest import Served
from tests.webhook.examples import INVALID
from tests.webhook.pki import SERVICE_DNS, make_ca
from tests.webhook.reviews import pod, review
from webhook import review as envelope

SHARE = {names.GPU_CORE: "50", names.GPU_MEMORY_RATIO: "50"}


def test_a_gpu_pod_created_without_a_scheduler_is_admitted_with_fgpu_scheduler(served: Served) -> None:
    created = pod(resources=SHARE, annotations={names.DEVICE_ALLOCATED: '{"gpu":[]}', "keep": "me"})
    client = served.client()
    answer = client.post("/mutate", review(created))
    response = answer["response"]
    assert response["allowed"] is True
    stored = jsonpatch.apply_patch(created, envelope.decode_patch(response["patch"]))
    expected = copy.deepcopy(created)
    expected["spec"]["schedulerName"] = names.SCHEDULER_NAME
    expected["metadata"]["annotations"] = {"keep": "me"}
    assert stored == expected
    assert len(response["warnings"]) == 2
    # ... and the validating webhook, called next with the patched pod, lets it through.
    assert client.post("/validate", review(stored))["response"]["allowed"] is True


def test_a_bad_gpu_request_is_refused_with_the_validate_message(served: Served) -> None:
    client = served.client()
    for bad in INVALID:
        response = client.post("/validate", review(bad))["response"]
        assert response["allowed"] is False, bad["metadata"]["name"]
        assert response["status"]["code"] == 403
        assert response["status"]["message"].startswith(("container ", "init container ", "containers "))


def test_dry_run_and_update_with_old_object_over_https(served: Served) -> None:
    client = served.client()
    p = pod(resources=SHARE)
    real = client.post("/mutate", review(p))["response"]
    dry = client.post("/mutate", review(p, dry_run=True))["response"]
    assert real["patch"] == dry["patch"]
    running = pod(resources=SHARE, scheduler=names.SCHEDULER_NAME, name="train-0")
    relabelled = copy.deepcopy(running)
    relabelled["metadata"]["labels"]["stage"] = "2"
    for path in ("/mutate", "/validate"):
        response = client.post(path, review(relabelled, operation="UPDATE", old=running))["response"]
        assert set(response) == {"uid", "allowed"} and response["allowed"] is True


def test_one_keep_alive_connection_serves_many_reviews(served: Served) -> None:
    client = served.client()
    uids = set()
    for _ in range(50):
        sent = review(pod(resources=SHARE))
        uids.add(client.post("/mutate", sent)["response"]["uid"])
    assert len(uids) == 50


def test_health_over_https(served: Served) -> None:
    answer = served.client().request("GET", "/healthz")
    assert (answer.status, answer.body) == (200, b"ok")


def test_the_server_presents_a_chain_the_ca_bundle_verifies_for_the_service_name(served: Served) -> None:
    answer = served.client().request("GET", "/healthz")
    assert answer.peer.serial_number == served.serving.serial
    assert answer.peer.issuer == served.ca.cert.subject


def test_a_client_trusting_another_ca_refuses_the_server(served: Served) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer certificate"):
        served.client(ca_bundle=make_ca("someone else").pem).request("GET", "/healthz")


def test_a_client_dialling_another_name_refuses_the_server(served: Served) -> None:
    client = Client(served.port, served.ca.pem, server_name="fgpu-webhook.other-namespace.svc")
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        client.request("GET", "/healthz")
    client.close()


def test_alpn_settles_on_http_1_1(served: Served) -> None:
    context = ca_context(served.ca.pem)
    context.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=SERVICE_DNS) as tls:
        assert tls.selected_alpn_protocol() == "http/1.1"
        assert tls.version() in ("TLSv1.2", "TLSv1.3")


def test_concurrent_clients_each_get_their_own_answer(served: Served) -> None:
    failures: list[str] = []

    def one_client(index: int) -> None:
        client = served.client()
        try:
            for j in range(10):
                namespace = f"ns-{index}-{j}"
                sent = review(pod(resources=SHARE, namespace=namespace))
                response = client.post("/mutate", sent)["response"]
                if response["uid"] != sent["request"]["uid"] or "patch" not in response:
                    failures.append(f"{index}/{j}: {response}")
        except Exception as exc:  # reported below, with the others
            failures.append(f"{index}: {exc!r}")
        finally:
            client.close()

    threads = [threading.Thread(target=one_client, args=(i,)) for i in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
