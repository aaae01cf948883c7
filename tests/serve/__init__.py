"""Tests of orion.serve over HTTP."""
