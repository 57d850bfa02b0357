"""Policies outside the core, found as the core's own are: every `policy_*.py` module here registers one.

`policies.discover("tests.scheduler_core.plugin_policies")` imports them (test_policy_contract.py
does it when it is collected), which is all a new policy needs to be scheduled with, accepted by the
service's config and run through the contract test.
"""
