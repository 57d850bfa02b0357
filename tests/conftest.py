"""Shared pytest setup. Topic folders keep their own fixtures in their own conftest.py."""

pytest_plugins = ["tests.kubeapi.fixture"]
