"""The scheduler's keys: it signs v2 with its private key, switches to a new one without a restart, and reads the key settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from apis import names
from apis.keyfiles import SchedulerKeyFiles, private_pem
from apis.signing import signature_key_id, verify_pod_annotations
from scheduler_plugin import config as config_mod
from scheduler_plugin import main as cli
from scheduler_plugin.backend_embedded import EmbeddedBackend
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.scheduling import SchedulingService
from tests.scheduler_service.builders import gpu_node, share_pod
from tests.signing_keys import signing_key, verifying, write_signing_key, write_verifying_keys

OLD = signing_key("scheduler-rotation-old")
NEW = signing_key("scheduler-rotation-new")


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[EmbeddedBackend]:
    opened = EmbeddedBackend(path=str(tmp_path / "state.db"))
    yield opened
    opened.stop()


def test_the_scheduler_switches_to_a_new_private_key_without_a_restart(tmp_path: Path, backend: EmbeddedBackend) -> None:
    private = write_signing_key(str(tmp_path / "signing-key.pem"), OLD)
    keys = SchedulerKeyFiles(private, verifying_path=write_verifying_keys(str(tmp_path / "pub"), OLD, NEW), min_interval_s=0)
    service = SchedulingService(core_factory=Scheduler, backend=backend, signing_key=keys)
    backend.start(service)
    service.report_devices(gpu_node("n1", gpus=2))
    first, second = share_pod("before", core=50, memory="10Gi"), share_pod("after", core=50, memory="10Gi")
    before = service.bind(first, "n1")

    Path(private).write_bytes(private_pem(NEW))
    after = service.bind(second, "n1")

    assert signature_key_id(before.signature) == OLD.key_id
    assert signature_key_id(after.signature) == NEW.key_id
    node_keys = verifying(OLD, NEW)
    for signed, pod in ((before, first), (after, second)):
        uid = pod["metadata"]["uid"]
        assert verify_pod_annotations(node_keys, pod_uid=uid, node_name="n1", annotations=signed.annotations)


def test_the_scheduler_writes_only_v2_signatures(tmp_path: Path, backend: EmbeddedBackend) -> None:
    keys = SchedulerKeyFiles(write_signing_key(str(tmp_path / "k"), NEW), legacy_path=str(tmp_path / "legacy"))
    (tmp_path / "legacy").write_bytes(b"old-hmac-key\n")
    service = SchedulingService(core_factory=Scheduler, backend=backend, signing_key=keys)
    backend.start(service)
    service.report_devices(gpu_node("n1", gpus=1))

    signed = service.bind(share_pod("p", core=50, memory="10Gi"), "n1")

    assert signed.annotations[names.ALLOCATION_SIGNATURE].startswith(f"v2:{NEW.key_id}:")


def test_the_key_settings_come_from_the_file_and_the_flags_override_them() -> None:
    config = config_mod.from_mapping(
        {"signingKey": "/k/signing-key.pem", "verifyingKeys": "/etc/fgpu/verifying-keys", "legacySigningKey": "/old/key"}
    )
    assert (config.signing_key, config.verifying_keys, config.legacy_signing_key) == (
        "/k/signing-key.pem", "/etc/fgpu/verifying-keys", "/old/key"
    )
    args = cli.build_parser().parse_args(["--verifying-keys", "/v", "--legacy-signing-key", "/l"])
    resolved = cli.resolve_config(args)
    assert (resolved.verifying_keys, resolved.legacy_signing_key) == ("/v", "/l")
    assert (config_mod.SchedulerConfig().verifying_keys, config_mod.SchedulerConfig().legacy_signing_key) == ("", "")


def test_an_old_hmac_key_given_as_the_signing_key_stops_the_start_with_the_upgrade_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "signing-key").write_bytes(b"c2VjcmV0LWhtYWMta2V5\n")

    code = cli.main(
        ["--state", "embedded", "--db", str(tmp_path / "s.db"), "--grpc-listen", "", "--signing-key", str(tmp_path / "signing-key")]
    )

    assert code == 1
    err = capsys.readouterr().err
    assert "is not an Ed25519 private key" in err and "legacySigningKey" in err and "fgpuctl keys generate" in err


def test_a_missing_verifying_keys_path_stops_the_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main([
        "--state", "embedded", "--db", str(tmp_path / "s.db"), "--grpc-listen", "",
        "--signing-key", write_signing_key(str(tmp_path / "k"), NEW), "--verifying-keys", str(tmp_path / "missing"),
    ])

    assert code == 1
    assert f"verifying key file {tmp_path / 'missing'} does not exist" in capsys.readouterr().err


def test_an_idle_scheduler_takes_and_logs_a_rotated_key_without_signing_anything(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from scheduler_plugin.app import SchedulerApp
    from scheduler_plugin.config import SchedulerConfig, StateBackend
    from tests.scheduler_service import cluster
    from tests.waiting import wait_until

    private = write_signing_key(str(tmp_path / "signing-key.pem"), OLD)
    config = SchedulerConfig(state=StateBackend.EMBEDDED, db=str(tmp_path / "state.db"), grpc_listen="", signing_key=private)
    app = SchedulerApp(config, timing=cluster.FAST)
    caplog.set_level("INFO", logger="apis.keyfiles")
    app.start()
    try:
        wait_until(lambda: f"signing with key {OLD.key_id}" in caplog.text, timeout=5)
        # The docs' rotation step waits on this line: with no pod to sign, the watcher must say it.
        Path(private).write_bytes(private_pem(NEW))
        wait_until(lambda: f"signing with key {NEW.key_id}" in caplog.text, timeout=5)
    finally:
        app.stop(1.0)
