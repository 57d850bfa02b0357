"""The pods of examples/pods/, as the API server would hand them to the webhook (defaulted, namespaced)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.webhook.reviews import Pod

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pods"


def example_pods(folder: str) -> list[Pod]:
    """Every Pod in examples/pods/<folder>; the JSON round trip makes them what a decoded body is."""
    out: list[Pod] = []
    for path in sorted((EXAMPLES / folder).iterdir()):
        for document in yaml.safe_load_all(path.read_text()):
            items = document.get("items", []) if document.get("kind") == "List" else [document]
            for item in items:
                if item.get("kind") == "Pod":
                    item = json.loads(json.dumps(item))
                    item["metadata"].setdefault("namespace", "default")
                    item["spec"].setdefault("schedulerName", "default-scheduler")
                    out.append(item)
    return out


INVALID = example_pods("invalid")
VALID = example_pods("valid")
