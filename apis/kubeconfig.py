"""Loading a Kubernetes client config, with one clear line for a kubeconfig that cannot be used.

Shared by every component that talks to the API server (each wraps `KubeconfigError` in its own
error type): which flag or file was used, what is wrong with it, and how to see why.
"""

from __future__ import annotations

import shlex

import yaml
from kubernetes import client, config


class KubeconfigError(ValueError):
    """A kubeconfig (or in-cluster config) that cannot be loaded; the message is one line naming the fix."""


#: What the client's loader raises for a kubeconfig it cannot use: its own ConfigException, a file it
#: cannot read (OSError; bytes that are not UTF-8 give UnicodeDecodeError, a ValueError), text that is
#: not YAML (yaml.YAMLError), and YAML of another shape (a list, a string, a number), which the loader
#: indexes unchecked (TypeError, AttributeError, KeyError, ValueError).
_UNUSABLE_CONFIG = (config.ConfigException, OSError, yaml.YAMLError, TypeError, AttributeError, KeyError, ValueError)


def api_client(kubeconfig: str) -> client.ApiClient:
    """A client for `kubeconfig`, or without one the in-cluster config, then $KUBECONFIG / ~/.kube/config."""
    # Only the loading is guarded: a TypeError from our own code past this point is a bug, not a config.
    try:
        if kubeconfig:
            api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
            return api
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return client.ApiClient(configuration)
    except _UNUSABLE_CONFIG as exc:
        raise KubeconfigError(config_error(kubeconfig, exc)) from exc


def config_error(kubeconfig: str, exc: BaseException) -> str:
    """One line for a kubeconfig that cannot be used: the flag, the file, what is wrong and the fix."""
    # The YAML parser's message spans lines ("in <file>, line 3, column 1"); a log line and a
    # command's error stay one line.
    detail = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, (TypeError, AttributeError, KeyError)):
        # The loader indexed YAML that is not a kubeconfig's mapping (a list, a string, a number).
        detail = f"its YAML does not have a kubeconfig's shape, a mapping of clusters, contexts and users: {detail}"
    if kubeconfig:
        return (
            f"--kubeconfig={kubeconfig!r}: cannot load a Kubernetes client config ({detail}); "
            f"give a valid kubeconfig (`kubectl --kubeconfig {shlex.quote(kubeconfig)} config view` shows what is wrong)"
        )
    return (
        f"no --kubeconfig given, and neither the in-cluster config nor $KUBECONFIG or ~/.kube/config could be "
        f"loaded ({detail}); give a valid kubeconfig with --kubeconfig FILE"
    )
