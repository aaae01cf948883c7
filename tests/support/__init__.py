"""Helpers shared by the tests: hand-written MIL, independent numpy references, fixtures."""
