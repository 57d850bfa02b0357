"""The agent's exceptions. Each says what is wrong and what to do about it."""

from __future__ import annotations


class AgentError(Exception):
    """Base of the agent's own errors."""


class ConfigError(AgentError, ValueError):
    """A flag or config-file value the agent cannot use."""


class KubeAPIError(AgentError):
    """A Kubernetes API call failed; `status` is the HTTP status, 0 when the server was not reached."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class SchedulerUnavailable(AgentError):
    """The scheduler service did not take a ReportDevices call."""


class RuntimeUnavailable(AgentError):
    """The container runtime's CRI endpoint did not answer a call."""
