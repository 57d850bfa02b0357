"""The agent config reads each of its durations through apis.durations, with that field's bounds."""

from __future__ import annotations

import dataclasses

from agent import config as agent_config


def test_every_duration_field_of_the_agent_config_is_read_as_a_duration() -> None:
    # A field added later without its bounds would be read as text ("30s" kept as a string).
    seconds = {f.name for f in dataclasses.fields(agent_config.AgentConfig) if f.name.endswith("_s")}
    assert seconds == set(agent_config._DURATIONS)
