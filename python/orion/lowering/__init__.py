"""From graph IR to MIL: legalization, I/O preparation, checks and MIL program construction."""
