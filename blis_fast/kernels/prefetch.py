"""A software prefetch hint for kernels: ``prefetch(array, index)``.

``index`` is an integer or a tuple of up to ``array.ndim`` integers (a leading sub-index names
the first element of that row). The call compiles to LLVM's ``llvm.prefetch`` (read, keep in
all cache levels): it never faults, changes no value and costs one instruction, so a kernel can
ask for a cache line it will need soon (the next free block's record, a hash-table slot) and do
other work while it arrives. No bounds check: an index past the end is a harmless no-op hint.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I32 = ir.IntType(32)


@intrinsic
def prefetch(typingctx, arr, index):
    """Hint that ``arr[index]`` will be read soon (typing half of the intrinsic)."""
    if not isinstance(arr, types.Array):
        return None
    n_idx = len(index) if isinstance(index, types.BaseTuple) else 1
    if n_idx > arr.ndim:
        return None

    def codegen(context, builder, sig, args):
        """Emit ``llvm.prefetch`` on the address of the indexed element."""
        aryty, idxty = sig.args
        ary = context.make_array(aryty)(context, builder, args[0])
        if isinstance(idxty, types.BaseTuple):
            raw = cgutils.unpack_tuple(builder, args[1], n_idx)
            inds = [context.cast(builder, v, t, types.intp) for v, t in zip(raw, idxty, strict=True)]
        else:
            inds = [context.cast(builder, args[1], idxty, types.intp)]
        shape = cgutils.unpack_tuple(builder, ary.shape, aryty.ndim)[:n_idx]
        strides = cgutils.unpack_tuple(builder, ary.strides, aryty.ndim)[:n_idx]
        ptr = cgutils.get_item_pointer2(context, builder, data=ary.data, shape=shape,
                                        strides=strides, layout="A", inds=inds,
                                        wraparound=False, boundscheck=False)
        byte_ptr = builder.bitcast(ptr, ir.IntType(8).as_pointer())
        fnty = ir.FunctionType(ir.VoidType(), [byte_ptr.type, _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [byte_ptr, _I32(0), _I32(3), _I32(1)])
        return context.get_dummy_value()

    return types.none(arr, index), codegen
