"""From the user's graph to the program's graph, before optimization: whole-graph checks (``check``),
the rewrite into the conservative dialect (``rewrite``) and the I/O names and casts (``io``)."""

from orion.legalize.check import check_fusion_depth
from orion.legalize.io import IOLayout, IOSpec, io_names, prepare_io
from orion.legalize.rewrite import Legalizer, legalize

__all__ = ["IOLayout", "IOSpec", "Legalizer", "check_fusion_depth", "io_names", "legalize", "prepare_io"]
