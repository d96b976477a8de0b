"""Tickgate's benchmark harness: `python -m bench [--smoke] [--scenario NAME ...]`.

See bench/README.md. Speed is measured here and never asserted in the test suite.
"""
