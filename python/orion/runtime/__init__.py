"""The runtime seam (mirrors ``csrc/runtime/``): which backend runs programs, compiled programs,
the surfaces they read and write, and the dtype names shared by both sides; above them, the pieces
every model's runtime uses: ``packing`` (tensors packed in padded surfaces), ``stage`` (a compiled
program bound to its surfaces) and ``builder`` (the program builder with the on-disk cache)."""
