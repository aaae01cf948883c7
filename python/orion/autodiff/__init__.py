"""Reverse-mode differentiation of Orion graphs: :func:`backward` turns a forward graph into a gradient graph
built from registry ops (each op's ``OpDef.grad`` rule, see :mod:`orion.autodiff.context`), which the
compiler lowers like any graph. :mod:`orion.autodiff.partition` decides what of a training step runs as
ANE programs and what on the CPU."""

from orion.autodiff import numpy_eval
from orion.autodiff.context import GradContext, GradientError
from orion.autodiff.transform import backward, differentiable_ops, grad_name

__all__ = ["GradContext", "GradientError", "backward", "differentiable_ops", "grad_name", "numpy_eval"]
