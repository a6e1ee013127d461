# SPDX-License-Identifier: MIT
"""What the tests/cli suites share: a check that records a failure and goes on,
so that one run lists every broken convention, not only the first."""

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)
    return cond
