"""Generation on top of compiled models: streaming text, stop strings."""
