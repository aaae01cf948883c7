"""Compiler-test helpers: the dialect evaluator, numpy references and the coremltools schema replay."""
