from __future__ import annotations

import pytest

from agent.fakenvml_inventory import InventoryError, load_inventory, parse_inventory
from tests.agent.helpers import A100_MIG, ALL_INVENTORIES, H100, MIXED, T4


def _gpu(**overrides: object) -> dict[str, object]:
    gpu: dict[str, object] = {
        "uuid": "GPU-00000000-0000-4000-8000-000000000001",
        "name": "Tesla T4",
        "memory": "15Gi",
        "busId": "00000000:3B:00.0",
    }
    gpu.update(overrides)
    return gpu


@pytest.mark.parametrize("path", ALL_INVENTORIES)
def test_every_example_inventory_loads(path: str) -> None:
    inventory = load_inventory(path)
    assert inventory.gpus
    assert all(g.uuid.startswith("GPU-") for g in inventory.gpus)


def test_example_inventories_describe_the_machines_their_names_promise() -> None:
    h100, t4, a100, mixed = (load_inventory(p) for p in (H100, T4, A100_MIG, MIXED))
    assert len(h100.gpus) == 8 and all(sum(link.links for link in g.nvlinks) == 18 for g in h100.gpus)
    assert len(t4.gpus) == 4 and not any(g.nvlinks for g in t4.gpus)
    assert all(g.mig_enabled for g in a100.gpus)
    assert [g.mig_enabled for g in mixed.gpus] == [True, False, None]


def test_memory_and_versions_accept_quantities_and_dotted_forms() -> None:
    inventory = parse_inventory({"cudaDriverVersion": "12.4", "gpus": [_gpu(memory="15360Mi")]})
    assert inventory.gpus[0].memory_bytes == 15360 * 2**20
    assert inventory.cuda_driver_version == 12040


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        (_gpu(memroy="1Gi"), "gpus[0]: unknown field 'memroy'"),
        (_gpu(busId="18:00.0"), "gpus[0].busId: '18:00.0' is not a PCI bus id"),
        (_gpu(memory="lots"), "gpus[0].memory: 'lots' is not a quantity"),
        (_gpu(uuid="8f2b"), "gpus[0].uuid: '8f2b' does not start with 'GPU-'"),
        (_gpu(mig={"mode": "enabled", "instances": [{"uuid": "MIG-1", "profile": "big"}]}), "is not a MIG profile"),
        (_gpu(utilization=140), "gpus[0].utilization: 140 is not a percentage"),
    ],
)
def test_a_bad_gpu_field_is_named_with_its_value_and_fix(gpu: dict[str, object], message: str) -> None:
    with pytest.raises(InventoryError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        parse_inventory({"gpus": [gpu]})


def test_two_gpus_with_one_uuid_are_refused() -> None:
    with pytest.raises(InventoryError, match=r"gpus\[1\]\.uuid: .* is also used by gpus\[0\]"):
        parse_inventory({"gpus": [_gpu(), _gpu(busId="00000000:5E:00.0", minor=1)]})


def test_an_event_on_a_gpu_that_does_not_exist_is_refused() -> None:
    with pytest.raises(InventoryError, match=r"events\[0\]\.gpu: 3 names no GPU"):
        parse_inventory({"gpus": [_gpu()], "events": [{"gpu": 3, "xid": 48}]})


def test_an_unknown_init_outcome_is_refused_with_the_known_ones() -> None:
    with pytest.raises(InventoryError, match="LibraryNotFound"):
        parse_inventory({"gpus": [], "init": "Broken"})


def test_a_missing_inventory_file_says_which_flag_to_fix(tmp_path: object) -> None:
    with pytest.raises(InventoryError, match="--fake-nvml"):
        load_inventory("/nonexistent/inventory.yaml")
