"""A software prefetch for numba kernels (``llvm.prefetch``).

Graph search touches head vectors in a data-dependent order, so the hardware prefetcher cannot
guess them; announcing the next neighbours' rows before computing their distances overlaps the
memory latency (hnswlib does the same with ``_mm_prefetch``).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def prefetch_row(typingctx, arr, row):
    """Prefetch every cache line of ``arr[row]`` (a C-contiguous 2-D array) for reading."""
    if not (isinstance(arr, types.Array) and arr.ndim == 2 and isinstance(row, types.Integer)):
        return None
    sig = types.void(arr, row)

    def codegen(context, builder, signature, args):
        aryty, rowty = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        zero = context.get_constant(types.intp, 0)
        r = context.cast(builder, args[1], rowty, types.intp)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [r, zero])
        i8p = ir.IntType(8).as_pointer()
        base = builder.bitcast(ptr, i8p)
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        strides = cgutils.unpack_tuple(builder, ary.strides, 2)
        row_bytes = strides[0]
        # one prefetch per 64-byte line of the row
        with cgutils.for_range_slice(builder, zero, row_bytes, context.get_constant(types.intp, 64)) as (off, _):
            addr = builder.gep(base, [off])
            builder.call(fn, [addr, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen
