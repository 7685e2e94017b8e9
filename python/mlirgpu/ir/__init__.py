"""MLIR IR from Python, over MLIR's C API (the C extension does the work).

Every object keeps alive what owns its handle: a Type or Attribute its
Context, an Operation the operation (or module) it is nested in. Erasing an
operation, or running a pass over it, invalidates the wrappers of what it may
have freed; using one raises ``mlirgpu.InvalidObjectError``.
"""
from .._mlirgpu import (DYNAMIC, Attribute, Block, Context, InsertionPoint, Location, Module,
                       Operation, Region, Type, Value)

__all__ = ["Attribute", "Block", "Context", "DYNAMIC", "InsertionPoint", "Location", "Module",
           "Operation", "Region", "Type", "Value"]
