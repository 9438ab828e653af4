"""The IR: types, expressions in A-normal form, IRModule, the op registry, text printer
and parser, structural equality/hash, and a builder."""
from .types import TensorType, TupleType, FuncType, Type, NUMPY_DTYPES
from .op import Op, AttrSpec, register_op, get_op, list_ops, OP_REGISTRY
from .expr import (Expr, Var, Constant, GlobalVar, ExternFunc, Tuple, TupleGetItem, Call, vars_read, substitute_vars,
                   Binding, Function, const)
from .module import IRModule
from .builder import FunctionBuilder
from .printer import print_module, print_function, print_expr
from .parser import parse_module, parse_function
from .structural import structural_equal, assert_structural_equal, structural_hash

parse = parse_module
