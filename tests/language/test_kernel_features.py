"""Device features of the kernel language, without a GPU: shared memory,
barriers, atomics, warp shuffles, vector loads/stores, device functions and
printf. Per construct: golden IR (FileCheck-style regexes on spec.ir(), with
the user's line as location), PTX that ptxas accepts for sm_90a and sm_80,
and one test per misuse (mg.CompileError naming the user's line).
"""
import os
import re

import numpy as np
import pytest

import mlirgpu as mg
from support.checks import filecheck, ptxas_accepts
from mlirgpu import block_idx, thread_idx

HERE = os.path.abspath(__file__)
N, M, K = mg.generics("N M K")
T = mg.generics("T")
TILE = 16


def line(marker):
    """The line of this file that ends with `# <marker>`."""
    with open(HERE) as f:
        for number, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# {marker}"):
                return number
    raise LookupError(marker)


def loc(marker):
    """The MLIR location of a marked line, as a regex."""
    return re.escape(f'loc("{HERE}":{line(marker)}:0)')


def ir_of(spec):
    """spec.ir() with every #locN alias replaced by the location it names."""
    text = spec.ir()
    aliases = dict(re.findall(r"^(#loc\d*) = (loc\(.*\))$", text, re.MULTILINE))
    body = re.sub(r"^#loc\d* = loc\(.*\)$", "", text, flags=re.MULTILINE)
    return re.sub(r"loc\((#loc\d*)\)", lambda m: aliases.get(m.group(1), m.group(0)), body)


def compile_error(spec, marker):
    """Tracing `spec` raises CompileError naming the marked line; returns its message."""
    with pytest.raises(mg.CompileError) as info:
        spec.ir()
    message = str(info.value)
    assert f"{HERE}:{line(marker)}:" in message, message
    return message


# ---------------------------------------------------------------------------
# Kernels, one construct each

@mg.kernel
def shared_static(A: mg.memref[N, mg.f32], B: mg.memref[N, mg.f32]):
    s = mg.shared.array(256, mg.f32)  # S-ARRAY
    t = thread_idx.x
    i = block_idx.x * 256 + t
    s[t] = A[i]
    mg.syncthreads()  # S-SYNC
    B[i] = s[255 - t]


@mg.kernel
def shared_two_d(A: mg.memref[N, N, mg.f32]):
    tile = mg.shared.array((TILE, TILE + 1), mg.f32)  # S-2D
    tx, ty = thread_idx.x, thread_idx.y
    tile[ty, tx] = A[ty, tx]
    mg.syncthreads()
    A[tx, ty] = tile[tx, ty]


@mg.kernel
def shared_dynamic_split(A: mg.memref[N, mg.f32], B: mg.memref[N, mg.f32]):
    smem = mg.shared.dynamic(mg.f32)  # S-DYN
    first = smem[0:256]  # S-SLICE1
    second = smem[256:512]  # S-SLICE2
    t = thread_idx.x
    first[t] = A[t]
    second[t] = A[t] * 2.0
    mg.syncthreads()
    B[t] = first[255 - t] + second[t]


@mg.kernel
def shared_dynamic_traced_slice(A: mg.memref[N, mg.f32]):
    smem = mg.shared.dynamic(mg.f32)
    n = block_idx.x * 4
    part = smem[n:n + 8]  # S-DSLICE
    tail = smem[8:]
    t = thread_idx.x
    part[t] = A[t]
    tail[t] = A[t]
    mg.syncthreads()
    A[t] = part[0] + tail[1]


@mg.kernel
def shared_in_a_loop(A: mg.memref[N, mg.f32]):
    acc = mg.constant(0.0, mg.f32)
    t = thread_idx.x
    for k in range(4):
        s = mg.shared.array(128, mg.f32)  # S-LOOP
        s[t] = A[t]
        mg.syncthreads()
        acc += s[127 - t]
    A[t] = acc


@mg.kernel
def atomics(F: mg.memref[N, mg.f32], I: mg.memref[N, mg.i32], U: mg.memref[N, mg.u32],
            D: mg.memref[N, mg.f64], Out: mg.memref[N, mg.f32]):
    t = thread_idx.x
    a = mg.atomic.add(F, t, 1.0)  # A-ADDF
    b = mg.atomic.add(I, (t,), 1)  # A-ADDI
    c = mg.atomic.max(F, 0, a)  # A-MAXF
    d = mg.atomic.max(I, 0, b)  # A-MAXS
    e = mg.atomic.max(U, 0, mg.cast(b, mg.u32))  # A-MAXU
    f = mg.atomic.min(F, 1, c)  # A-MINF
    g = mg.atomic.min(I, 1, d)  # A-MINS
    h = mg.atomic.min(U, 1, e)  # A-MINU
    i = mg.atomic.cas(I, 2, 0, g)  # A-CAS
    j = f
    k = mg.atomic.exchange(U, 2, h)  # A-EXCH
    m = mg.atomic.add(D, t, 0.5)  # A-ADDD
    n = mg.atomic.or_(I, 4, i)  # A-OR
    Out[t] = mg.cast(i + n, mg.f32) + j + mg.cast(k, mg.f32) + mg.cast(m, mg.f32)


@mg.kernel
def shared_atomics(Out: mg.memref[N, mg.i32]):
    counter = mg.shared.array(1, mg.i32)
    t = thread_idx.x
    if t == 0:
        counter[0] = 0
    mg.syncthreads()
    mg.atomic.add(counter, 0, 1)  # A-SHARED
    mg.syncthreads()
    if t == 0:
        Out[block_idx.x] = counter[0]


@mg.kernel
def shuffles(A: mg.memref[N, mg.f32], I: mg.memref[N, mg.i32], D: mg.memref[N, mg.f64]):
    t = thread_idx.x
    x = A[t]
    x += mg.warp.shfl_xor(x, 16)  # W-XOR
    x += mg.warp.shfl_down(x, 1)  # W-DOWN
    x += mg.warp.shfl_up(x, 2)  # W-UP
    y = mg.warp.shfl_idx(I[t], 0)  # W-IDX
    z = mg.warp.shfl_down(D[t], mg.cast(y, mg.u32))  # W-F64
    lane = mg.warp.lane_id()  # W-LANE
    A[t] = x
    I[t] = y + mg.cast(lane, mg.i32)
    D[t] = z


@mg.kernel(generics=(M, N))
def vectors(A: mg.memref[M, N, mg.f32], B: mg.memref[M, N, mg.f32]):
    i = block_idx.x
    j = thread_idx.x * 4
    v = mg.vload(A, (i, j), 4)  # V-LOAD
    w = v * 2.0 + v  # V-ARITH
    w = w.insert(3, v[0])  # V-INSERT
    mg.vstore(B, (i, j), w)  # V-STORE


@mg.kernel
def vectors_two(A: mg.memref[N, mg.f32], H: mg.memref[N, mg.f16]):
    j = thread_idx.x * 2
    v = mg.vload(A, j, 2)  # V2-LOAD
    mg.vstore(A, j, (v[1], v[0]))  # V2-STORE
    h = mg.vload(H, thread_idx.x * 8, 8)  # V8-LOAD
    mg.vstore(H, thread_idx.x * 8, h + h)


@mg.kernel
def vectors_shared(A: mg.memref[N, mg.f32]):
    s = mg.shared.array(512, mg.f32)
    t = thread_idx.x * 4
    mg.vstore(s, t, mg.vload(A, t, 4))  # V-SHARED
    mg.syncthreads()
    mg.vstore(A, t, mg.vload(s, 508 - t, 4))


@mg.func
def axpy(a, x, y):
    return a * x + y  # F-BODY


@mg.func
def quotient_remainder(a, b):
    return a // b, a % b


@mg.func
def store_twice(out, i, value):
    out[i] = value
    out[i + 1] = value


@mg.kernel
def device_functions(A: mg.memref[N, mg.f32], I: mg.memref[N, mg.i32]):
    t = thread_idx.x
    A[t] = axpy(A[t], 2.0, 1.0)  # F-CALL
    I[t] = axpy(I[t], 3, I[t])  # F-CALL-I32
    q, r = quotient_remainder(I[t], 7)  # F-TUPLE
    store_twice(I, t, q + r)  # F-MEMREF
    A[t] = axpy(A[t], 2.0, 1.0)  # F-AGAIN


@mg.func
def row_dot(A, B, i, n):
    acc = mg.constant(0.0, mg.f32)
    for k in range(n):  # FD-LOOP
        if A[i, k] > 0.0:
            acc += A[i, k] * B[k]
    return acc


@mg.func
def stage_in_shared(A, t):
    s = mg.shared.array(64, mg.f32)  # FD-SHARED
    s[t] = A[t]
    mg.syncthreads()
    return s[63 - t]


@mg.kernel
def device_functions_with_control_flow(A: mg.memref[N, N, mg.f32], B: mg.memref[N, mg.f32]):
    t = thread_idx.x
    B[t] = row_dot(A, B, t, N) + stage_in_shared(B, t)


@mg.kernel
def printing(A: mg.memref[N, mg.f32]):
    t = thread_idx.x
    mg.printf("thread %ld: %f %d\n", t, A[t], 7)  # P-PRINTF


# ---------------------------------------------------------------------------
# Golden IR

def test_shared_array_is_a_workgroup_global():
    text = ir_of(shared_static[1024])
    filecheck(text,
              r'memref\.global "private" @__shared : memref<256xf32, #gpu\.address_space<workgroup>> '
              r'\{alignment = 16 : i64\} ' + loc("S-ARRAY"),
              r"gpu\.func @shared_static",
              r"memref\.get_global @__shared : memref<256xf32, #gpu\.address_space<workgroup>> " + loc("S-ARRAY"),
              r"memref\.store %\S+, %0\[%thread_id_x\] : memref<256xf32, #gpu\.address_space<workgroup>>",
              r"gpu\.barrier " + loc("S-SYNC"),
              r"memref\.load %0\[")


def test_shared_array_ptx_uses_shared_space():
    ptx = shared_static[1024].ptx("sm_90a")
    filecheck(ptx, r"\.shared \.align 16 \.b8 __shared\[1024\];", r"st\.shared\.b32", r"bar\.sync\s+0;",
              r"ld\.shared\.b32")


def test_shared_two_dimensional():
    text = ir_of(shared_two_d[16])
    filecheck(text, r"memref\.global \"private\" @__shared : memref<16x17xf32, #gpu\.address_space<workgroup>>",
              r"memref\.store %\S+, %0\[%thread_id_y, %thread_id_x\] : memref<16x17xf32")


def test_shared_dynamic_split_by_slices():
    text = ir_of(shared_dynamic_split[256])
    filecheck(text,
              r"memref\.global @__mg_dynamic_shared : memref<0xi8, #gpu\.address_space<workgroup>> "
              r"\{alignment = 16 : i64\}",
              r"memref\.get_global @__mg_dynamic_shared .* " + loc("S-DYN"),
              r"nvvm\.read\.ptx\.sreg\.dynamic\.smem\.size : i32",
              r"memref\.reinterpret_cast .* to memref<\?xi8, #gpu\.address_space<workgroup>>",
              r"memref\.view .* to memref<\?xf32, #gpu\.address_space<workgroup>> " + loc("S-DYN"),
              r"memref\.subview %view\[0\] \[256\] \[1\] : memref<\?xf32, #gpu\.address_space<workgroup>> to "
              r"memref<256xf32, strided<\[1\]>, #gpu\.address_space<workgroup>> " + loc("S-SLICE1"),
              r"memref\.subview %view\[256\] \[256\] \[1\] : .* to memref<256xf32, strided<\[1\], offset: 256>, "
              r"#gpu\.address_space<workgroup>> " + loc("S-SLICE2"))


def test_shared_dynamic_ptx_is_extern():
    ptx = shared_dynamic_split[256].ptx("sm_90a")
    filecheck(ptx, r"^\.extern \.shared \.align 16 \.b8 __mg_dynamic_shared\[\];", r"st\.shared\.b32",
              r"\[%rd\d+\+1024\]")
    assert "demoted" not in ptx


def test_shared_slice_with_traced_bounds():
    text = ir_of(shared_dynamic_traced_slice[64])
    filecheck(text, r"memref\.subview %view\[%\S+\] \[%\S+\] \[1\] : memref<\?xf32, #gpu\.address_space<workgroup>> "
                    r"to memref<\?xf32, strided<\[1\], offset: \?>, #gpu\.address_space<workgroup>> " + loc("S-DSLICE"),
              r"memref\.dim %view, %\S+")


def test_shared_array_in_a_loop_is_one_array():
    text = ir_of(shared_in_a_loop[128])
    assert text.count("memref.global") == 1
    filecheck(text, r"scf\.for", r"memref\.get_global @__shared .*" + loc("S-LOOP"))


def test_atomics_ir():
    # Relaxed, device scope (CUDA's atomicAdd, ...): llvm.atomicrmw on the element's global pointer.
    text = ir_of(atomics[64])
    rmw = r"llvm\.atomicrmw {} %\S+, %\S+ syncscope\(\"device\"\) monotonic : !llvm\.ptr<1>, {} "
    filecheck(text,
              rmw.format("fadd", "f32") + loc("A-ADDF"),
              rmw.format("add", "i32") + loc("A-ADDI"),
              rmw.format("fmax", "f32") + loc("A-MAXF"),
              rmw.format("max", "i32") + loc("A-MAXS"),
              rmw.format("umax", "i32") + loc("A-MAXU"),
              rmw.format("fmin", "f32") + loc("A-MINF"),
              rmw.format("min", "i32") + loc("A-MINS"),
              rmw.format("umin", "i32") + loc("A-MINU"),
              r"llvm\.cmpxchg %\S+, %\S+, %\S+ syncscope\(\"device\"\) monotonic monotonic : !llvm\.ptr<1>, i32 "
              + loc("A-CAS"),
              rmw.format("xchg", "i32") + loc("A-EXCH"),
              rmw.format("fadd", "f64") + loc("A-ADDD"),
              rmw.format("_or", "i32") + loc("A-OR"))


def test_atomics_ptx():
    ptx = atomics[64].ptx("sm_90a")
    for pattern in (r"atom\.global\.add\.f32", r"atom\.global\.add\.u32", r"atom\.global\.max\.s32",
                    r"atom\.global\.max\.u32", r"atom\.global\.min\.s32", r"atom\.global\.min\.u32",
                    r"atom\.\S*global\.cas\.b32", r"atom\.global\.exch\.b32", r"atom\.global\.add\.f64",
                    r"atom\.global\.or\.b32"):
        assert re.search(pattern, ptx), pattern


def test_atomics_on_shared_memory():
    filecheck(ir_of(shared_atomics[8]), r"llvm\.atomicrmw add %\S+, %\S+ syncscope\(\"device\"\) monotonic : !llvm\.ptr<3>, i32")
    assert re.search(r"atom\.shared\.add\.u32", shared_atomics[8].ptx("sm_90a"))


def test_shuffles_ir():
    # CUDA's full-warp clamp operands: 31, and 0 for up.
    filecheck(ir_of(shuffles[64]),
              r"nvvm\.shfl\.sync  bfly %\S+, %\S+, %c16_i32, %c31_i32 : f32 -> f32 " + loc("W-XOR"),
              r"nvvm\.shfl\.sync  down %\S+, %\S+, %\S+, %\S+ : f32 -> f32 " + loc("W-DOWN"),
              r"nvvm\.shfl\.sync  up %\S+, %\S+, %\S+, %c0_i32 : f32 -> f32 " + loc("W-UP"),
              r"nvvm\.shfl\.sync  idx %\S+, %\S+, %\S+, %\S+ : i32 -> i32 " + loc("W-IDX"),
              r"nvvm\.shfl\.sync  down %\S+, %\S+, %\S+, %\S+ : i32 -> i32 " + loc("W-F64"),
              r"nvvm\.shfl\.sync  down %\S+, %\S+, %\S+, %\S+ : i32 -> i32 " + loc("W-F64"),
              r"gpu\.lane_id " + loc("W-LANE"))


def test_shuffles_ptx():
    ptx = shuffles[64].ptx("sm_90a")
    filecheck(ptx, r"shfl\.sync\.bfly\.b32\s+%r\d+, %r\d+, 16, 31, -1;", r"shfl\.sync\.down\.b32 .*, 1, 31, -1;",
              r"shfl\.sync\.up\.b32 .*, 2, 0, -1;", r"shfl\.sync\.idx\.b32 .*, 0, 31, -1;")
    assert len(re.findall(r"shfl\.sync\.down\.b32", ptx)) == 3  # f32 once, f64 as two halves
    assert "%laneid" in ptx


def test_vectors_ir():
    filecheck(ir_of(vectors[8, 64]),
              r"vector\.load %arg0\[%block_id_x, %\S+\] \{alignment = 16 : i64\} : memref<8x64xf32>, "
              r"vector<4xf32> " + loc("V-LOAD"),
              r"vector\.broadcast %\S+ : f32 to vector<4xf32> " + loc("V-ARITH"),
              r"arith\.mulf %\S+, %\S+ fastmath<contract> : vector<4xf32> " + loc("V-ARITH"),
              r"arith\.addf %\S+, %\S+ fastmath<contract> : vector<4xf32> " + loc("V-ARITH"),
              r"vector\.extract %\S+\[0\] : f32 from vector<4xf32> " + loc("V-INSERT"),
              r"vector\.insert %\S+, %\S+ \[3\] : f32 into vector<4xf32> " + loc("V-INSERT"),
              r"vector\.store %\S+, %arg1\[%block_id_x, %\S+\] \{alignment = 16 : i64\} : memref<8x64xf32>, "
              r"vector<4xf32> " + loc("V-STORE"))


def test_vectors_ptx_is_128_bit():
    ptx = vectors[8, 64].ptx("sm_90a")
    # LLVM 22's NVPTX back end types vector loads by bits (.b32), where older ones wrote .f32
    filecheck(ptx, r"ld\.global\.v4\.(f32|b32)\s", r"st\.global\.v4\.(f32|b32)\s")


def test_vectors_of_two_and_of_eight_halves():
    text = ir_of(vectors_two[64])
    filecheck(text, r"vector\.load .* \{alignment = 8 : i64\} : memref<64xf32>, vector<2xf32> " + loc("V2-LOAD"),
              r"vector\.from_elements %\S+, %\S+ : vector<2xf32> " + loc("V2-STORE"),
              r"vector\.store .* \{alignment = 8 : i64\} : memref<64xf32>, vector<2xf32>",
              r"vector\.load .* \{alignment = 16 : i64\} : memref<64xf16>, vector<8xf16> " + loc("V8-LOAD"))
    ptx = vectors_two[64].ptx("sm_90a")
    filecheck(ptx, r"ld\.global\.v2\.(f32|b32)", r"st\.global\.v2\.(f32|b32)", r"ld\.global\.v4\.b32")


def test_vectors_on_shared_memory():
    filecheck(ir_of(vectors_shared[512]),
              r"vector\.store %\S+, %0\[%\S+\] \{alignment = 16 : i64\} : memref<512xf32, "
              r"#gpu\.address_space<workgroup>>, vector<4xf32> " + loc("V-SHARED"))
    filecheck(vectors_shared[512].ptx("sm_90a"), r"st\.shared\.v4\.b32", r"ld\.shared\.v4\.b32")


def test_device_functions_ir():
    text = ir_of(device_functions[64])
    filecheck(text,
              r"func\.func private @axpy\(%arg0: f32 loc\([^)]*\)\) -> f32 \{",
              r"arith\.constant 2\.000000e\+00 : f32 " + loc("F-BODY"),
              r"arith\.mulf %arg0, %cst fastmath<contract> : f32 " + loc("F-BODY"),
              r"return %\S+ : f32")
    filecheck(text, r"func\.func private @axpy_2\(%arg0: i32 .*, %arg1: i32 .*\) -> i32 \{",
              r"arith\.constant 3 : i32 " + loc("F-BODY"))
    filecheck(text, r"func\.func private @quotient_remainder\(%arg0: i32 .*\) -> \(i32, i32\)",
              r"arith\.divsi", r"arith\.remsi", r"return %\S+, %\S+ : i32, i32")
    filecheck(text, r"func\.func private @store_twice\(%arg0: memref<64xi32> .*, %arg1: index .*, %arg2: i32 .*\) \{",
              r"memref\.store %arg2, %arg0\[%arg1\]")
    filecheck(text, r"gpu\.func @device_functions",
              r"func\.call @axpy\(%\S+\) : \(f32\) -> f32 " + loc("F-CALL"),
              r"func\.call @axpy_2\(%\S+, %\S+\) : \(i32, i32\) -> i32 " + loc("F-CALL-I32"),
              r"%\S+:2 = func\.call @quotient_remainder\(%\S+\) : \(i32\) -> \(i32, i32\) " + loc("F-TUPLE"),
              r"func\.call @store_twice\(%arg1, %thread_id_x, %\S+\) : \(memref<64xi32>, index, i32\) -> \(\) "
              + loc("F-MEMREF"),
              r"func\.call @axpy\(%\S+\) : \(f32\) -> f32 " + loc("F-AGAIN"))
    assert text.count("func.func private @axpy(") == 1  # one specialization per signature


def test_device_function_constants_specialize():
    # axpy(A[t], 2.0, 1.0): the Python numbers are constants of @axpy, which takes one argument;
    # axpy(I[t], 3, I[t]) is another specialization, of two i32 arguments
    text = ir_of(device_functions[64])
    filecheck(text, r"func\.func private @axpy\(%arg0: f32 loc\([^)]*\)\) -> f32")
    filecheck(text, r"func\.func private @axpy_2\(%arg0: i32 loc\([^)]*\), %arg1: i32 loc\([^)]*\)\) -> i32")


def test_device_functions_with_loops_and_shared_memory():
    spec = device_functions_with_control_flow[64]
    text = ir_of(spec)
    filecheck(text, r"func\.func private @row_dot\(%arg0: memref<64x64xf32> [^\n]*-> f32 \{",
              r"scf\.for ", r"scf\.if", r"\} " + loc("FD-LOOP"))
    filecheck(text, r"memref\.global \"private\" @__shared : memref<64xf32, #gpu\.address_space<workgroup>> "
                    r"\{alignment = 16 : i64\} " + loc("FD-SHARED"),
              r"func\.func private @stage_in_shared", r"memref\.get_global @__shared", r"gpu\.barrier")
    filecheck(spec.ptx("sm_90a"), r"\.shared \.align 16 \.b8 __shared\[256\]", r"bar\.sync")


def test_device_functions_ptx():
    ptx = device_functions[64].ptx("sm_90a")
    assert ".entry device_functions" in ptx


def test_printf_ir_and_ptx():
    text = ir_of(printing[32])
    filecheck(text, r"arith\.index_cast %thread_id_x : index to i64 " + loc("P-PRINTF"),
              r"arith\.extf %\S+ : f32 to f64 " + loc("P-PRINTF"),
              r'gpu\.printf "thread %ld: %f %d\\0A", %\S+, %\S+, %\S+ : i64, f64, i32 ' + loc("P-PRINTF"))
    ptx = printing[32].ptx("sm_90a")
    filecheck(ptx, r"\.extern \.func .*vprintf", r"call\.uni \(retval0\), vprintf")


# ---------------------------------------------------------------------------
# ptxas accepts each construct's PTX, for Hopper and Ampere

SPECS = {
    "shared_static": lambda: shared_static[1024], "shared_two_d": lambda: shared_two_d[16],
    "shared_dynamic_split": lambda: shared_dynamic_split[256],
    "shared_dynamic_traced_slice": lambda: shared_dynamic_traced_slice[64],
    "shared_in_a_loop": lambda: shared_in_a_loop[128], "atomics": lambda: atomics[64],
    "shared_atomics": lambda: shared_atomics[8], "shuffles": lambda: shuffles[64],
    "vectors": lambda: vectors[8, 64], "vectors_two": lambda: vectors_two[64],
    "vectors_shared": lambda: vectors_shared[512], "device_functions": lambda: device_functions[64],
    "printing": lambda: printing[32],
    "device_functions_with_control_flow": lambda: device_functions_with_control_flow[64],
}


@pytest.mark.parametrize("chip", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_ptxas_accepts(name, chip, tmp_path):
    spec = SPECS[name]()
    log = ptxas_accepts(spec.ptx(chip), chip, tmp_path)
    assert "out of bound" not in log, log


def test_cubin():
    assert shared_dynamic_split[256].cubin("sm_90a")[:4] == b"\x7fELF"


# ---------------------------------------------------------------------------
# Misuse: CompileError at the user's line

@mg.kernel
def too_much_shared(A: mg.memref[N, mg.f32]):
    a = mg.shared.array((64, 128), mg.f32)  # 32 KB
    b = mg.shared.array(4097, mg.f32)  # E-TOO-MUCH
    a[0, 0] = b[0]


@mg.kernel
def just_enough_shared(A: mg.memref[N, mg.f32]):
    a = mg.shared.array((64, 128), mg.f32)
    b = mg.shared.array(4096, mg.f32)
    a[0, 0] = b[0]


@mg.kernel
def shared_traced_size(A: mg.memref[N, mg.f32]):
    s = mg.shared.array(thread_idx.x, mg.f32)  # E-TRACED-SIZE


@mg.kernel
def shared_bad_size(A: mg.memref[N, mg.f32]):
    s = mg.shared.array((16, 0), mg.f32)  # E-ZERO-SIZE


@mg.kernel
def slice_two_d(A: mg.memref[N, mg.f32]):
    s = mg.shared.array((16, 16), mg.f32)
    t = s[0:4]  # E-SLICE-2D


@mg.kernel
def slice_step(A: mg.memref[N, mg.f32]):
    s = mg.shared.array(64, mg.f32)
    t = s[0:32:2]  # E-SLICE-STEP


@mg.kernel
def slice_out_of_bounds(A: mg.memref[N, mg.f32]):
    s = mg.shared.array(64, mg.f32)
    t = s[32:65]  # E-SLICE-OOB


@mg.kernel
def slice_global(A: mg.memref[N, mg.f32]):
    t = A[0:4]  # E-SLICE-GLOBAL


@mg.kernel
def slice_store(A: mg.memref[N, mg.f32]):
    s = mg.shared.array(64, mg.f32)
    s[0:4] = A[0]  # E-SLICE-STORE


@mg.kernel
def dynamic_len(A: mg.memref[N, mg.f32]):
    s = mg.shared.dynamic(mg.f32)
    n = len(s)  # E-DYN-LEN


@mg.kernel
def atomic_wrong_dtype(A: mg.memref[N, mg.f32], I: mg.memref[N, mg.i32]):
    mg.atomic.add(A, 0, I[0])  # E-ATOMIC-DTYPE


@mg.kernel
def atomic_float_or(A: mg.memref[N, mg.f32]):
    mg.atomic.or_(A, 0, 1.0)  # E-ATOMIC-OR


@mg.kernel
def atomic_cas_float(A: mg.memref[N, mg.f32]):
    mg.atomic.cas(A, 0, 0.0, 1.0)  # E-CAS-FLOAT


@mg.kernel
def atomic_not_memref(A: mg.memref[N, mg.f32]):
    mg.atomic.max(A[0], 0, 1.0)  # E-ATOMIC-TARGET


@mg.kernel
def atomic_rank(A: mg.memref[N, N, mg.f32]):
    mg.atomic.add(A, 0, 1.0)  # E-ATOMIC-RANK


@mg.kernel
def shuffle_f16(A: mg.memref[N, mg.f16]):
    A[0] = mg.warp.shfl_xor(A[0], 1)  # E-SHFL-F16


@mg.kernel
def shuffle_python_value(A: mg.memref[N, mg.f32]):
    A[0] = mg.warp.shfl_down(1.0, 1)  # E-SHFL-PY


@mg.kernel
def shuffle_float_offset(A: mg.memref[N, mg.f32]):
    A[0] = mg.warp.shfl_idx(A[0], A[1])  # E-SHFL-OFFSET


@mg.kernel
def vload_three(A: mg.memref[N, mg.f32]):
    v = mg.vload(A, 0, 3)  # E-VLOAD-3


@mg.kernel
def vload_misaligned(A: mg.memref[N, mg.f32]):
    v = mg.vload(A, 2, 4)  # E-VLOAD-ALIGN


@mg.kernel
def vload_rows(A: mg.memref[N, 6, mg.f32]):
    v = mg.vload(A, (thread_idx.x, 0), 4)  # E-VLOAD-ROWS


@mg.kernel
def vload_too_wide(A: mg.memref[N, mg.f64]):
    v = mg.vload(A, 0, 4)  # E-VLOAD-WIDE


@mg.kernel
def vstore_dtype(A: mg.memref[N, mg.f32], I: mg.memref[N, mg.i32]):
    mg.vstore(I, 0, mg.vload(A, 0, 4))  # E-VSTORE-DTYPE


@mg.kernel
def vector_index(A: mg.memref[N, mg.f32]):
    v = mg.vload(A, 0, 4)
    A[0] = v[4]  # E-VECTOR-INDEX


@mg.kernel
def printf_count(A: mg.memref[N, mg.f32]):
    mg.printf("%f %f\n", A[0])  # E-PRINTF-COUNT


@mg.kernel
def printf_memref(A: mg.memref[N, mg.f32]):
    mg.printf("%f\n", A)  # E-PRINTF-MEMREF


@mg.kernel
def printf_string(A: mg.memref[N, mg.f32]):
    mg.printf("%s\n", A[0])  # E-PRINTF-S


@mg.func
def recurse(x):
    return recurse(x - 1.0)  # E-RECURSE


@mg.kernel
def calls_recursive(A: mg.memref[N, mg.f32]):
    A[0] = recurse(A[0])


@mg.func
def ping(x):
    return pong(x)


@mg.func
def pong(x):
    return ping(x)  # E-MUTUAL


@mg.kernel
def calls_mutual(A: mg.memref[N, mg.f32]):
    A[0] = ping(A[0])


@mg.func
def returns_python_number(x):
    return 1.0  # E-RETURN-PY


@mg.kernel
def calls_returns_python(A: mg.memref[N, mg.f32]):
    A[0] = returns_python_number(A[0])


@mg.func
def bad_body(x):
    return x + "text"  # E-FUNC-BODY


@mg.kernel
def calls_bad_body(A: mg.memref[N, mg.f32]):
    A[0] = bad_body(A[0])


@mg.func
def two_args(x, y):
    return x + y


@mg.kernel
def calls_with_wrong_count(A: mg.memref[N, mg.f32]):
    A[0] = two_args(A[0])  # E-FUNC-ARGS


def plain_python(x):
    return x * 2.0


@mg.kernel
def calls_plain_python(A: mg.memref[N, mg.f32]):
    A[0] = plain_python(A[0])  # E-PLAIN


ERRORS = [
    (too_much_shared, "E-TOO-MUCH", "too much static shared memory.*49156 bytes.*49152"),
    (shared_traced_size, "E-TRACED-SIZE", "Python int sizes"),
    (shared_bad_size, "E-ZERO-SIZE", "positive ints"),
    (slice_two_d, "E-SLICE-2D", "only 1-d shared memory can be sliced"),
    (slice_step, "E-SLICE-STEP", "no step"),
    (slice_out_of_bounds, "E-SLICE-OOB", "out of bounds"),
    (slice_global, "E-SLICE-GLOBAL", "slices of a memref are only supported for 1-d shared memory"),
    (slice_store, "E-SLICE-STORE", "cannot assign to a slice"),
    (dynamic_len, "E-DYN-LEN", "only known at launch"),
    (atomic_wrong_dtype, "E-ATOMIC-DTYPE", "f32 but the value is i32"),
    (atomic_float_or, "E-ATOMIC-OR", "not defined on f32"),
    (atomic_cas_float, "E-CAS-FLOAT", "integers.*not f32"),
    (atomic_not_memref, "E-ATOMIC-TARGET", "takes a memref first"),
    (atomic_rank, "E-ATOMIC-RANK", "takes 2 indices, got 1"),
    (shuffle_f16, "E-SHFL-F16", "not f16"),
    (shuffle_python_value, "E-SHFL-PY", "shuffles a traced value"),
    (shuffle_float_offset, "E-SHFL-OFFSET", "must be an integer, not a f32"),
    (vload_three, "E-VLOAD-3", "must be 2 or 4"),
    (vload_misaligned, "E-VLOAD-ALIGN", "multiple of 4"),
    (vload_rows, "E-VLOAD-ROWS", "rows hold 6"),
    (vload_too_wide, "E-VLOAD-WIDE", "32 bytes"),
    (vstore_dtype, "E-VSTORE-DTYPE", "f32 vector into a i32 memref"),
    (vector_index, "E-VECTOR-INDEX", "out of range"),
    (printf_count, "E-PRINTF-COUNT", "2 conversions but 1 values"),
    (printf_memref, "E-PRINTF-MEMREF", "not a memref"),
    (printf_string, "E-PRINTF-S", "%s"),
    (calls_recursive, "E-RECURSE", "recursive \\(recurse -> recurse\\)"),
    (calls_mutual, "E-MUTUAL", "recursive \\(ping -> pong -> ping\\)"),
    (calls_returns_python, "E-RETURN-PY", "returns a Python number"),
    (calls_bad_body, "E-FUNC-BODY", "unsupported operand"),
    (calls_with_wrong_count, "E-FUNC-ARGS", "missing a required argument"),
    (calls_plain_python, "E-PLAIN", "make it a device function with @mg.func"),
]


@pytest.mark.parametrize("kernel, marker, message", ERRORS, ids=[m for _, m, _ in ERRORS])
def test_misuse_names_the_line(kernel, marker, message):
    text = compile_error(kernel[64], marker)
    assert re.search(message, text), text


def test_shared_limit_is_inclusive():
    just_enough_shared[64].ir()  # 32 KB + 16 KB = 48 KB exactly


def test_device_function_outside_a_kernel():
    with pytest.raises(mg.CompileError, match="can only be called from a kernel"):
        axpy(1.0, 2.0, 3.0)


def test_device_function_is_marked_for_the_tracer():
    assert axpy.__mlirgpu__ is True
    assert axpy.__name__ == "axpy" and axpy.__wrapped__ is not None


def test_shared_outside_a_kernel():
    with pytest.raises(mg.CompileError, match="inside an @mg.kernel"):
        mg.shared.array(16, mg.f32)
    with pytest.raises(mg.CompileError, match="inside an @mg.kernel"):
        mg.syncthreads()


def make_axpy():
    # A kernel made inside a function (a factory, a test): its generic is a closure variable.
    n = mg.generics("n")

    @mg.kernel
    def axpy(a: mg.f32, x: mg.memref[n, mg.f32], y: mg.memref[n, mg.f32]):
        i = mg.block_idx.x * mg.block_dim.x + mg.thread_idx.x
        if i < n:
            y[i] = a * x[i] + y[i]
    return axpy


def test_generics_of_an_enclosing_function(backend):
    axpy = make_axpy()
    for size in (10, 300):
        x, y = np.arange(size, dtype=np.float32), np.ones(size, np.float32)
        axpy(2.0, x, y, grid=(size + 127) // 128, block=128)
        np.testing.assert_array_equal(y, 2 * np.arange(size, dtype=np.float32) + 1)
