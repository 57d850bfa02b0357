"""The web view in a real browser (headless Chromium driven by Selenium): what a person sees."""

from __future__ import annotations

import json
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from apis import names
from apis.allocation import Allocation, GPUShare
from apis.inventory import MIGInstance
from apis.signing import allocation_annotations
from fgpuctl import ui_sources
from fgpuctl.ui_model import Gathered
from scheduler_plugin.app import SchedulerApp
from scheduler_plugin.config import SchedulerConfig, StateBackend
from tests.kubeapi.server import KubeAPIServer
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import GiB, gpu_node, pod, share_pod, t4_node, whole_pod
from tests.signing_keys import signing_key, write_signing_key
from tests.webview.conftest import Serve

KEY = signing_key("webview-api-key")


def pods_on(driver: Any, node: str, gpu: int, kind: str = "core") -> list[str]:
    from selenium.webdriver.common.by import By

    rects = driver.find_elements(By.CSS_SELECTOR, f"g.gpu[data-node='{node}'][data-gpu='{gpu}'] rect.share.{kind}")
    return sorted(r.get_attribute("data-pod") for r in rects)


def test_each_pod_is_drawn_on_the_gpus_that_hold_it_and_pending_reasons_are_listed(
    seeded_url: str, browser: Any, artifacts: Path
) -> None:
    from selenium.webdriver.common.by import By

    browser.get(seeded_url + "/")
    browser.save_screenshot(str(artifacts / "webview-snapshot.png"))

    assert pods_on(browser, "gpu-a", 0) == ["team-a/train-0", "team-b/infer-1"]
    assert pods_on(browser, "gpu-a", 0, "memory") == ["team-a/train-0", "team-b/infer-1"]
    assert pods_on(browser, "gpu-a", 1) == ["team-a/big-2"]
    assert pods_on(browser, "gpu-b", 0) == ["team-b/infer-3"]
    assert pods_on(browser, "gpu-b", 1) == []
    bad = browser.find_element(By.CSS_SELECTOR, "g.gpu[data-node='gpu-b'][data-gpu='1']")
    assert bad.get_attribute("data-health") == "unhealthy"
    # A share is as wide as its compute: 50% of the bar, and 30% beside it.
    train, infer = (browser.find_element(By.CSS_SELECTOR, f"g.gpu[data-node='gpu-a'][data-gpu='0'] rect.core[data-pod='{p}']")
                    for p in ("team-a/train-0", "team-b/infer-1"))
    assert float(train.get_attribute("width")) == pytest.approx(210.0)
    assert float(infer.get_attribute("width")) == pytest.approx(126.0)

    rows = {r.get_attribute("data-pod"): r for r in browser.find_elements(By.CSS_SELECTOR, "tr.pending-pod")}
    assert sorted(rows) == ["team-c/needs-h100", "team-c/wide-job"]
    reasons = [e.text for e in rows["team-c/wide-job"].find_elements(By.CSS_SELECTOR, ".reason")]
    assert "1 of 2 GPUs healthy, pod needs 2 whole GPUs (GPU 1: unusable)" in reasons
    assert "node has 1 GPU, pod needs 2 whole GPUs" in reasons
    assert "0/3 nodes are available" in rows["team-c/needs-h100"].text

    moves = browser.find_elements(By.CSS_SELECTOR, "#moves li.move")
    assert [m.get_attribute("data-pod") for m in moves] == ["team-b/infer-3"]

    # The attacker-named pod is text, not markup: no <img> was made, and its name shows as written.
    assert browser.find_elements(By.TAG_NAME, "img") == []
    assert pods_on(browser, "gpu-c", 0) == ["evil/<img src=x onerror=alert(1)>"]
    assert "evil/<img src=x onerror=alert(1)>" in browser.find_element(By.ID, "node-gpu-c").text


def test_searching_by_namespace_and_model_works_without_javascript(seeded_url: str, browser_without_js: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser = browser_without_js
    browser.get("data:text/html,<title>before</title><script>document.title='ran'</script>")
    assert browser.title == "before"  # scripts really are off
    browser.get(seeded_url + "/")
    browser.find_element(By.NAME, "ns").send_keys("team-b")
    browser.find_element(By.CSS_SELECTOR, "#search button[type=submit]").click()
    WebDriverWait(browser, 10).until(lambda b: "ns=team-b" in b.current_url and b.execute_script("return document.readyState") == "complete")

    nodes = [n.get_attribute("data-node") for n in browser.find_elements(By.CSS_SELECTOR, "div.node")]
    assert nodes == ["gpu-a", "gpu-b"]
    highlighted = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#node-gpu-a ul.pods li.match")]
    assert highlighted == ["team-b/infer-1"]

    browser.get(seeded_url + "/?model=t4")
    assert [n.get_attribute("data-node") for n in browser.find_elements(By.CSS_SELECTOR, "div.node")] == ["gpu-c"]


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[tuple[SchedulerApp, str]]:
    key = write_signing_key(str(tmp_path / "signing-key"), signing_key("webview-test-key"))
    socket = tmp_path / "sched.sock"
    config = SchedulerConfig(
        state=StateBackend.EMBEDDED, db=str(tmp_path / "state.db"), grpc_listen=f"unix://{socket}", signing_key=key
    )
    app = SchedulerApp(config, timing=cluster.FAST)
    app.start()
    yield app, f"unix://{socket}"
    app.stop(1.0)


def test_a_seeded_scheduler_shows_its_pods_nvlink_groups_mig_and_health(
    scheduler: tuple[SchedulerApp, str], serve: Serve, browser: Any, artifacts: Path
) -> None:
    from selenium.webdriver.common.by import By

    app, address = scheduler
    assert app.service is not None
    h100 = gpu_node("h100-0", gpus=4, unhealthy=(3,))
    mig = MIGInstance(uuid="MIG-h100-0-2-0", profile="3g.40gb", memory_bytes=40 * 1024**3, slices=3)
    h100 = replace(h100, gpus=tuple(replace(g, mig_enabled=True, mig_instances=(mig,)) if g.index == 2 else g for g in h100.gpus))
    app.service.report_devices(h100)
    app.service.report_devices(t4_node("t4-0", gpus=2))
    app.service.bind(share_pod("llm", namespace="ml", core=60, memory="40Gi"), "h100-0")
    app.service.bind(share_pod("web", namespace="shop", core=20, memory="4Gi"), "t4-0")

    browser.get(serve(ui_sources.from_scheduler(address), plan=False) + "/")
    browser.save_screenshot(str(artifacts / "webview-scheduler.png"))

    held = {(n, g): pods_on(browser, n, g) for n, g in (("h100-0", 0), ("h100-0", 1), ("t4-0", 0), ("t4-0", 1))}
    assert sum(v == ["ml/llm"] for v in held.values()) == 1, held
    assert sum(v == ["shop/web"] for v in held.values()) == 1
    node = browser.find_element(By.ID, "node-h100-0")
    assert "NVLink groups {0,1,2,3}" in node.text
    assert browser.find_element(By.CSS_SELECTOR, "g.gpu[data-node='h100-0'][data-gpu='3']").get_attribute("data-health") == "unhealthy"
    assert "unhealthy: Xid79" in node.text
    assert node.find_element(By.CSS_SELECTOR, "g.gpu[data-gpu='2'] g.mig rect.mig-instance title").get_attribute("textContent") == "3g.40gb"
    note = browser.find_element(By.ID, "pending-note").text
    assert "not reachable from --scheduler" in note


def bound(name: str, namespace: str, node: str, gpu: str, *, core: int, memory_gib: int) -> dict[str, Any]:
    """A running pod holding a share of `gpu`, its allocation signed as the scheduler signs it."""
    uid = str(uuid.uuid4())
    share = GPUShare(minor=int(gpu[-2:]), uuid=gpu, core_percent=core, memory_bytes=memory_gib * GiB,
                     memory_ratio_percent=memory_gib * 100 // 80)
    obj = pod(name, namespace=namespace, uid=uid, node_name=node, scheduler_name=names.SCHEDULER_NAME,
              requests={names.GPU_CORE: str(core), names.GPU_MEMORY: f"{memory_gib}Gi"},
              annotations=allocation_annotations(KEY, pod_uid=uid, node_name=node, allocation=Allocation(gpus=(share,))))
    obj["status"] = {"phase": "Running"}
    return obj


def seed_api(api: KubeAPIServer) -> None:
    """Devices and Nodes for two nodes, two bound GPU pods, and pending pods: one fgpu GPU pod the
    scheduler has written a reason on, and two the view leaves out (another scheduler's, a CPU-only one)."""
    cluster.install(api)
    cluster.add_node(api, gpu_node("h100-0", gpus=2, unhealthy=(1,)))
    cluster.add_node(api, t4_node("t4-0", gpus=1))
    cluster.add_pod(api, bound("train", "ml", "h100-0", "GPU-h100-0-00", core=40, memory_gib=20))
    cluster.add_pod(api, bound("web", "shop", "t4-0", "GPU-t4-0-00", core=30, memory_gib=4))
    wide = whole_pod("wide", namespace="ml", gpus=2, scheduler_name=names.SCHEDULER_NAME)
    wide["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": "0/2 nodes are available: no node has 2 healthy GPUs"}]
    cluster.add_pod(api, wide)
    cluster.add_pod(api, whole_pod("elsewhere", namespace="ml", gpus=1))  # the default scheduler's
    cluster.add_pod(api, pod("cpu-only", namespace="ml", requests={"cpu": "1"}, scheduler_name=names.SCHEDULER_NAME))


def test_the_kubeconfig_source_shows_devices_bound_pods_and_pending_reasons_from_the_api(
    kube_api: KubeAPIServer, serve: Serve, browser: Any, artifacts: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    seed_api(kube_api)
    read = ui_sources.from_api(kube_api.kubeconfig_path)
    gate = threading.Event()

    def held() -> Gathered:  # the first sample waits, so the browser sees the page before it
        gate.wait(30)
        return read()

    url = serve(held, wait=False)
    browser.get(url + "/")
    assert "gathering cluster state" in browser.find_element(By.ID, "gathering").text
    gate.set()
    # The page reloads itself (no script) until the sample is in.
    WebDriverWait(browser, 20, poll_frequency=0.2).until(lambda b: b.find_elements(By.CSS_SELECTOR, "div.node"))
    WebDriverWait(browser, 20, poll_frequency=0.2).until(lambda _: cluster_json(url)["defragStatus"]["state"] != "pending")
    browser.get(url + "/")
    browser.save_screenshot(str(artifacts / "webview-kubeconfig.png"))

    doc = cluster_json(url)
    assert doc["ready"] and doc["source"] == f"kubeconfig {kube_api.kubeconfig_path}"
    on_gpu = {(n["name"], g["index"]): [f"{p['namespace']}/{p['name']}" for p in g["pods"]] for n in doc["nodes"] for g in n["gpus"]}
    assert on_gpu == {("h100-0", 0): ["ml/train"], ("h100-0", 1): [], ("t4-0", 0): ["shop/web"]}
    assert [p["name"] for p in doc["pending"]["pods"]] == ["wide"]
    assert doc["defragStatus"]["state"] == "current" and "0 PodDisruptionBudget(s) respected" in doc["defrag"]["notes"]

    assert pods_on(browser, "h100-0", 0) == ["ml/train"] and pods_on(browser, "t4-0", 0) == ["shop/web"]
    assert pods_on(browser, "h100-0", 1) == []
    assert browser.find_element(By.CSS_SELECTOR, "g.gpu[data-node='h100-0'][data-gpu='1']").get_attribute("data-health") == "unhealthy"
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.pending-pod")
    assert [r.get_attribute("data-pod") for r in rows] == ["ml/wide"]
    reasons = sorted(e.text for e in rows[0].find_elements(By.CSS_SELECTOR, ".reason"))
    assert reasons == ["1 of 2 GPUs healthy, pod needs 2 whole GPUs (GPU 1: Xid79)", "node has 1 GPU, pod needs 2 whole GPUs"]
    assert "0/2 nodes are available: no node has 2 healthy GPUs" in rows[0].text  # what the scheduler wrote on the pod
    assert "2 whole GPUs" in rows[0].text
    assert browser.find_element(By.ID, "defrag-status").get_attribute("data-state") == "current"


def cluster_json(url: str) -> Any:
    with urllib.request.urlopen(url + "/cluster.json", timeout=10) as response:
        return json.loads(response.read())
