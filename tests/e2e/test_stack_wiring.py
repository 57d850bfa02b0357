"""The local stack is wired as a node is: the proxy gets the shipped hook registration."""

from __future__ import annotations

import copy

import pytest
import yaml

from hack.localup.stack import HOOK_REGISTRATION
from tests.e2e.conftest import Stacks
from tests.localup.manifests import REPO

pytestmark = [pytest.mark.containerd, pytest.mark.slow]


def test_the_stack_registers_the_agent_hook_as_shipped_with_only_the_endpoint_changed(stacks: Stacks) -> None:
    stack = stacks.get("hami-core")
    shipped = yaml.safe_load((REPO / HOOK_REGISTRATION).read_text())
    with open(stack.paths.hook_registration) as f:
        written = yaml.safe_load(f)
    expected = copy.deepcopy(shipped)
    for hook in expected["hooks"]:
        hook["endpoint"] = stack.agent_address
    assert written == expected
