"""The verifier rejects each class of ill-formed program with a message naming the
kernel, the instruction and the reason."""

from dataclasses import replace

import pytest

from hologram.errors import IRError
from hologram.isa import dtypes as dt
from hologram.isa.builder import ProgramBuilder
from hologram.isa.ir import BufferDecl, IndexMap, Instr, Kernel, Program, encode_const
from hologram.isa.verify import verify

F32 = dt.float32


def _program(*body: Instr, domain=(4,), buffers=None) -> Program:
    buffers = buffers or (BufferDecl("x", F32, (4,), "in"), BufferDecl("y", F32, (4,), "out"))
    return Program("p", tuple(buffers), (Kernel("k0", domain, tuple(body)),))


UNIT = IndexMap(0, (1,))
LOAD = Instr("load", F32, (4,), (), (0, UNIT))


def _store(arg: int, shape=(4,), imap=UNIT, buffer=1) -> Instr:
    return Instr("store", F32, shape, (arg,), (buffer, imap))


def _rejects(program: Program, *fragments: str) -> IRError:
    with pytest.raises(IRError) as info:
        verify(program)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return info.value


def test_valid_program_passes():
    p = _program(LOAD, Instr("exp", F32, (4,), (0,)), _store(1))
    assert verify(p) is p


def test_type_mismatch():
    i32 = Instr("const", dt.int32, (1,), (), (encode_const(dt.int32, 1),))
    p = _program(LOAD, i32, Instr("add", F32, (4,), (0, 1)), _store(2))
    err = _rejects(p, "kernel k0, instruction %2", "add", "dtypes must match", "i32")
    assert err.instr is not None and "add" in err.instr


def test_declared_result_type_wrong():
    _rejects(_program(LOAD, Instr("exp", dt.float64, (4,), (0,)), _store(1)),
             "declared result dtype f64")
    _rejects(_program(LOAD, Instr("lt", F32, (4,), (0, 0)), _store(1)), "rule gives bool")


def test_float_only_and_int_only_ops():
    ld = Instr("load", dt.int32, (4,), (), (0, IndexMap(0, (1,))))
    bufs = (BufferDecl("x", dt.int32, (4,)), BufferDecl("y", dt.int32, (4,), "out"))
    _rejects(_program(ld, Instr("exp", dt.int32, (4,), (0,)), buffers=bufs),
             "needs a floating-point operand")
    _rejects(_program(LOAD, Instr("and", F32, (4,), (0, 0)), _store(1)),
             "needs bool or integer operands")


def test_use_before_definition_and_store_as_operand():
    _rejects(_program(Instr("exp", F32, (4,), (1,)), LOAD), "used before it is defined")
    _rejects(_program(LOAD, _store(0), Instr("exp", F32, (4,), (1,))), "is a store")


def test_shape_errors():
    _rejects(_program(Instr("load", F32, (3,), (), (0, IndexMap(0, (1,)))), _store(0)),
             "does not fit domain")
    _rejects(_program(Instr("load", F32, (4, 1), (), (0, IndexMap(0, (1, 0))))),
             "does not fit domain")
    bad_shape = Instr("exp", F32, (1,), (0,))
    _rejects(_program(LOAD, bad_shape, _store(1)), "operands give f32[4]")
    _rejects(_program(LOAD, Instr("exp", F32, (4,), (0,)), _store(1, shape=(1,))),
             "does not broadcast to the store's shape")


def test_axis_errors():
    x = Instr("load", F32, (4, 8), (), (0, IndexMap(0, (8, 1))))
    bufs = (BufferDecl("x", F32, (4, 8)), BufferDecl("y", F32, (4,), "out"))

    def reduce(axes, grid_rank=0, kind="sum"):
        body = (x, Instr("reduce", F32, (4, 1), (0,), (kind, axes)))
        return Program("p", bufs, (Kernel("k0", (4, 8), body, grid_rank),))

    _rejects(reduce((2,)), "out of range")
    _rejects(reduce((1, 1)), "sorted and distinct")
    _rejects(reduce(()), "non-empty tuple")
    _rejects(reduce((1,), kind="mean"), "unknown reduction 'mean'")
    _rejects(reduce((0,), grid_rank=1), "loop dimensions", "parallel grid")
    empty = Program("p", bufs, (Kernel("k0", (4, 0), (
        Instr("load", F32, (4, 0), (), (0, IndexMap(0, (8, 1)))),
        Instr("reduce", dt.int64, (4, 1), (0,), ("argmax", (1,))),
    )),))
    _rejects(empty, "argmax/argmin over an empty axis")


def test_bad_index_maps():
    out_of_bounds = Instr("load", F32, (4,), (), (0, IndexMap(1, (1,))))
    _rejects(_program(out_of_bounds, _store(0)), "out of bounds", "elements 1..4")
    negative = Instr("load", F32, (4,), (), (0, IndexMap(0, (-1,))))
    _rejects(_program(negative, _store(0)), "out of bounds", "elements -3..0")
    _rejects(_program(Instr("load", F32, (4,), (), (0, IndexMap(0, (1, 1)))), _store(0)),
             "2 strides", "rank 1")
    _rejects(_program(Instr("load", F32, (4,), (), (7, IndexMap(0, (1,))))),
             "unknown buffer #7")
    _rejects(_program(LOAD, _store(0, imap=IndexMap(0, (0,)))),
             "writes one element more than once")
    _rejects(_program(LOAD, _store(0, buffer=0)), "store to input buffer x")
    wrong_dtype = Instr("load", dt.float64, (4,), (), (0, IndexMap(0, (1,))))
    _rejects(_program(wrong_dtype), "buffer is f32, instruction is f64")


def test_read_write_aliasing():
    bufs = (BufferDecl("x", F32, (8,), "inout"),)
    shifted = Instr("load", F32, (4,), (), (0, IndexMap(1, (1,))))
    p = _program(shifted, _store(0, buffer=0), buffers=bufs)
    _rejects(p, "reads and writes x")
    # Point-to-point read-modify-write (x += 1) is allowed.
    same = Instr("load", F32, (4,), (), (0, IndexMap(0, (1,))))
    verify(_program(same, Instr("neg", F32, (4,), (0,)), _store(1, buffer=0), buffers=bufs))


def test_constants_must_be_encoded():
    _rejects(_program(Instr("const", F32, (1,), (), (1.5,))), "not an encoded f32")
    _rejects(_program(Instr("const", dt.int8, (1,), (), (300,))), "not an encoded i8")
    _rejects(_program(Instr("const", dt.bool_, (1,), (), (1,))), "not an encoded bool")


def test_program_level_errors():
    _rejects(Program("p", (BufferDecl("x", F32, (4,), "weird"),)), "kind 'weird'")
    _rejects(Program("p", (BufferDecl("x", F32, (4,)), BufferDecl("x", F32, (4,)))),
             "declared twice")
    _rejects(Program("p", (BufferDecl("x", F32, (4,), "in", offset=0),)),
             "only temporaries have an arena offset")
    k = Kernel("k0", (4,), (LOAD, _store(0)))
    two = Program("p", (BufferDecl("x", F32, (4,)), BufferDecl("y", F32, (4,), "out")), (k, k))
    _rejects(two, "kernel name k0 is declared twice")
    _rejects(Program("p", (), (Kernel("k0", (-1,), ()),)), "non-negative")
    _rejects(Program("p", (), (Kernel("k0", (4,), (), grid_rank=2),)), "grid_rank 2")
    with pytest.raises(IRError, match="expected a Program"):
        verify("program")


def test_arena_overlap_of_live_temporaries():
    b = ProgramBuilder("arena")
    x = b.input("x", F32, (4,))
    t1, t2 = b.temp("t1", F32, (4,)), b.temp("t2", F32, (4,))
    y = b.output("y", F32, (4,))
    k = b.kernel((4,))
    k.store(t1, k.load(x))
    k = b.kernel((4,))
    k.store(t2, k.exp(k.load(t1)))
    k = b.kernel((4,))
    k.store(y, k.add(k.load(t1), k.load(t2)))
    p = b.build()
    placed = replace(p, buffers=tuple(replace(buf, offset=0) if buf.kind == "temp" else buf
                                      for buf in p.buffers))
    _rejects(placed, "share arena bytes while both are live")


def test_builder_reports_errors_at_the_call():
    b = ProgramBuilder()
    x = b.input("x", F32, (4,))
    k = b.kernel((4,))
    v = k.load(x)
    with pytest.raises(IRError, match=r"kernel k0: .*exp"):
        k.exp(k.cast(v, "i32"))
    with pytest.raises(IRError, match="rank"):
        b.kernel((4, 4)).load(x)
