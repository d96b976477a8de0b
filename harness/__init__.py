"""The test and benchmark harness: what tests/ and bench/ share to drive real Tickgate.

Shipped in the sdist, never in the wheel (the wheel packages `service*` only).
"""
