"""Kubernetes' syntax for label keys and values, for configs that select pods by label.

A key is an optional prefix (a DNS subdomain, at most 253 characters) and "/", then a name of at
most 63 characters: letters, digits, '-', '_' and '.', starting and ending with a letter or digit.
A value is empty or has a name's form. The API server refuses any other label, so a selector
naming one matches nothing, silently; configs refuse it instead (`problem_with_key`, `problem_with_value`).
"""

from __future__ import annotations

import re

NAME_MAX = 63
PREFIX_MAX = 253
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", re.ASCII)
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII)


def problem_with_key(key: str) -> str:
    """"" for a valid label key; otherwise what is wrong with it, for a message."""
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return "the prefix before '/' is empty"
    if "/" in prefix:
        return "a key has at most one '/'"
    if prefix and (len(prefix) > PREFIX_MAX or _SUBDOMAIN.fullmatch(prefix) is None):
        return (f"the prefix {prefix!r} is not a DNS subdomain (lowercase letters, digits, '-' and '.', "
                f"at most {PREFIX_MAX})")
    if not name:
        return "the name after the prefix is empty" if slash else "the key is empty"
    if len(name) > NAME_MAX or _NAME.fullmatch(name) is None:
        return (f"the name {name!r} is not a label name (letters, digits, '-', '_' and '.', starting and ending "
                f"with a letter or digit, at most {NAME_MAX})")
    return ""


def problem_with_value(value: str) -> str:
    """"" for a valid label value (the empty value included); otherwise what is wrong with it."""
    if value and (len(value) > NAME_MAX or _NAME.fullmatch(value) is None):
        return (f"a label value has letters, digits, '-', '_' and '.', starts and ends with a letter or digit, "
                f"and is at most {NAME_MAX} long (or empty)")
    return ""
