"""The runtime seam (mirrors ``csrc/runtime/``): which backend runs programs, compiled programs,
the surfaces they read and write, and the dtype names shared by both sides."""
