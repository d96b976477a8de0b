"""The slow deployment checks: real Helm, the chart's npm checks, wheel builds and
`tickgate serve` (marked by folder in tests/conftest.py; fixtures in tests/deploy/conftest.py)."""
