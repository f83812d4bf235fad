"""The Atlas text form: a printer and a parser that invert each other.

For every program ``p`` that verifies, ``parse_program(print_program(p)) == p``: names,
buffer offsets and constants (bit for bit) survive. The form is line-oriented::

    program softmax {
      in @x: f32[64, 1000]
      temp @t0: f32[64, 1] @ 256
      kernel k0 domain [64, 1000] grid 1 {
        %0 = load @x[+0; 1000, 1] : f32[64, 1000]
        %1 = reduce max %0 axes [1] : f32[64, 1]
        store @t0[+0; 1, 0], %1 : f32[64, 1]
      }
    }

Values print as ``%<position>``; the parser numbers instructions itself and accepts any
``%name``. Names that are not identifiers print as JSON strings (``@"a b"``). ``#`` starts a
comment. docs/isa.md has the grammar.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

from hologram.errors import IRError
from hologram.isa import dtypes as dt
from hologram.isa.ir import (
    ALL_OPS,
    BUFFER_KINDS,
    BufferDecl,
    IndexMap,
    Instr,
    Kernel,
    Program,
    encode_const,
)
from hologram.isa.verify import verify as verify_program

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_STRING = r'"(?:[^"\\]|\\.)*"'
_TOKEN = re.compile(rf"""\s*(?:
    (?P<str>{_STRING})
  | (?P<val>%[A-Za-z0-9_.]+)
  | (?P<buf>@(?:[A-Za-z_][A-Za-z0-9_.]*|{_STRING}))
  | (?P<num>[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-](?:inf|nan))
  | (?P<word>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<punct>[\[\],;:={{}}@])
)""", re.X)
_END = re.compile(r"\s*(?:#.*)?\Z")
_DTYPES = {t.name: t for t in dt.ALL}  # no aliases: the text form spells each dtype one way


# --- printer ---------------------------------------------------------------------------
def _name(name: str) -> str:
    return name if _IDENT.fullmatch(name) else json.dumps(name)


def _ints(xs: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(x) for x in xs) + "]"


def _type(dtype: dt.DType, shape: tuple[int, ...]) -> str:
    return dtype.name + _ints(shape)


def _access(program: Program, instr: Instr) -> str:
    index, imap = instr.attrs[:2]
    # Stay printable for the verifier's messages even when the buffer index is bad.
    name = _name(program.buffers[index].name) if 0 <= index < len(program.buffers) else "?"
    return f"@{name}[{imap.offset:+d}; {', '.join(str(s) for s in imap.strides)}]"


def _literal(instr: Instr) -> str:
    value = instr.value
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)  # repr(float) is the shortest text that reads back to the same bits


def print_instr(program: Program, kernel: Kernel, pos: int) -> str:
    """The text of ``kernel.body[pos]`` (no indentation), as :func:`print_program` shows it."""
    instr = kernel.body[pos]
    operands = [f"%{a}" for a in instr.args]
    if instr.op in ("load", "store", "gather", "scatter"):
        operands.insert(0, _access(program, instr))
    elif instr.op == "const":
        operands = [_literal(instr)]
    elif instr.op == "index":
        operands = [str(instr.axis)]
    text = instr.op
    if instr.op == "reduce":
        text += f" {instr.kind}"
    elif instr.op == "scatter" and len(instr.attrs) == 4:
        text += f" {instr.mode}"
    if operands:
        text += " " + ", ".join(operands)
    if instr.op in ("reduce", "contract"):
        text += f" axes {_ints(instr.axes)}"
    if instr.op in ("gather", "scatter") and len(instr.attrs) >= 3 and \
            isinstance(instr.bounds, tuple):
        text += f" in {_ints(instr.bounds)}"
    text += f" : {_type(instr.dtype, instr.shape)}"
    return text if instr.op in ("store", "scatter") else f"%{pos} = {text}"


def print_program(program: Program) -> str:
    """The text form of ``program`` (no trailing newline); :func:`parse_program` inverts it."""
    lines = [f"program {_name(program.name)} {{"]
    for b in program.buffers:
        at = "" if b.offset is None else f" @ {b.offset}"
        lines.append(f"  {b.kind} @{_name(b.name)}: {_type(b.dtype, b.shape)}{at}")
    for k in program.kernels:
        lines.append(f"  kernel {_name(k.name)} domain {_ints(k.domain)} grid {k.grid_rank} {{")
        lines += [f"    {print_instr(program, k, pos)}" for pos in range(len(k.body))]
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines)


# --- parser ----------------------------------------------------------------------------
class _Line:
    """The tokens of one source line, consumed left to right."""

    def __init__(self, number: int, text: str):
        self.number, self.text = number, text
        self.tokens: list[tuple[str, str]] = []
        self.i = 0
        pos = 0
        while not _END.match(text, pos):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise self.fail(f"unexpected character {text[pos:].strip()[:1]!r}")
            self.tokens.append((m.lastgroup, m.group(m.lastgroup)))
            pos = m.end()

    def error(self, expected: str) -> IRError:
        got = repr(self.tokens[self.i][1]) if self.i < len(self.tokens) else "end of line"
        return self.fail(f"expected {expected}, got {got}")

    def fail(self, message: str) -> IRError:
        return IRError(f"line {self.number}: {message}", instr=self.text.strip())

    def peek(self, kind: str | None = None) -> str | None:
        if self.i < len(self.tokens) and kind in (None, self.tokens[self.i][0]):
            return self.tokens[self.i][1]
        return None

    def take(self, kind: str | None, expected: str) -> str:
        token = self.peek(kind)
        if token is None:
            raise self.error(expected)
        self.i += 1
        return token

    def accept(self, word: str) -> bool:
        """Consume the next token if it is ``word``."""
        if self.peek() != word:
            return False
        self.i += 1
        return True

    def keyword(self, word: str) -> None:
        if not self.accept(word):
            raise self.error(repr(word))

    def end(self) -> None:
        if self.i < len(self.tokens):
            raise self.error("end of line")

    def integer(self) -> int:
        token = self.take("num", "an integer")
        try:
            return int(token)
        except ValueError:
            self.i -= 1
            raise self.error("an integer") from None

    def ints(self) -> tuple[int, ...]:
        """Comma-separated integers up to and including the closing ``]``."""
        xs = []
        while not self.accept("]"):
            if xs and not self.accept(","):
                raise self.error("',' or ']'")
            xs.append(self.integer())
        return tuple(xs)

    def name(self) -> str:
        if self.peek("str"):
            return json.loads(self.take("str", "a name"))
        return self.take("word", "a name")

    def tensor_type(self) -> tuple[dt.DType, tuple[int, ...]]:
        name = self.take("word", "a dtype")
        if name not in _DTYPES:
            self.i -= 1
            raise self.error(f"a dtype ({', '.join(_DTYPES)})")
        self.keyword("[")
        return _DTYPES[name], self.ints()


class _Parser:
    def __init__(self, text: str):
        self.lines = iter(line for n, t in enumerate(text.splitlines(), 1)
                          if (line := _Line(n, t)).tokens)
        self.buffers: list[BufferDecl] = []
        self.buffer_index: dict[str, int] = {}
        # Source line of each buffer, and of each kernel's header then its instructions.
        self.buffer_lines: list[_Line] = []
        self.kernel_lines: list[list[_Line]] = []

    def program(self) -> Program:
        head = next(self.lines, None)
        if head is None:
            raise IRError("line 1: expected 'program NAME {', got an empty text")
        head.keyword("program")
        name = head.name()
        head.keyword("{")
        head.end()
        kernels = []
        for line in self.lines:
            if line.accept("}"):
                line.end()
                extra = next(self.lines, None)
                if extra is not None:
                    raise extra.error("nothing after the program's closing '}'")
                return Program(name, tuple(self.buffers), tuple(kernels))
            if line.peek() == "kernel":
                kernels.append(self.kernel(line))
            elif line.peek() in BUFFER_KINDS:
                self.buffer(line)
            else:
                raise line.error(f"a buffer ({', '.join(BUFFER_KINDS)}), 'kernel' or '}}'")
        raise head.fail(f"program {name} is never closed: expected '}}' before the end")

    def buffer(self, line: _Line) -> None:
        kind = line.take("word", "a buffer kind")
        name = self._buffer_name(line)
        line.keyword(":")
        dtype, shape = line.tensor_type()
        offset = line.integer() if line.accept("@") else None
        line.end()
        self.buffer_index.setdefault(name, len(self.buffers))
        self.buffers.append(BufferDecl(name, dtype, shape, kind, offset))
        self.buffer_lines.append(line)

    def kernel(self, head: _Line) -> Kernel:
        head.keyword("kernel")
        name = head.name()
        head.keyword("domain")
        head.keyword("[")
        domain = head.ints()
        grid_rank = head.integer() if head.accept("grid") else 0
        head.keyword("{")
        head.end()
        body: list[Instr] = []
        values: dict[str, int] = {}
        where = [head]
        self.kernel_lines.append(where)
        for line in self.lines:
            if line.accept("}"):
                line.end()
                return Kernel(name, domain, tuple(body), grid_rank)
            if not (line.peek("val") or line.peek() in ("store", "scatter")):
                raise line.error(f"an instruction or the '}}' closing kernel {name} "
                                 f"(opened on line {head.number})")
            body.append(self.instr(line, values, len(body)))
            where.append(line)
        raise head.fail(f"kernel {name} is never closed: expected '}}' before the end")

    def instr(self, line: _Line, values: dict[str, int], pos: int) -> Instr:
        result = line.peek("val")
        if result is not None:
            line.i += 1
            line.keyword("=")
        op = line.take("word", "an opcode")
        if op not in ALL_OPS:
            raise line.fail(f"unknown opcode {op!r}")
        if (op in ("store", "scatter")) != (result is None):
            raise line.fail(f"a {op} has no result" if result else
                            f"{op} needs a result '%N ='")

        def value() -> int:
            token = line.take("val", "an operand %name")
            if token not in values:
                raise line.fail(f"use before definition of {token}")
            return values[token]

        args: list[int] = []
        attrs: tuple = ()
        literal = None
        if op in ("load", "store", "gather", "scatter"):
            mode = line.take("word", "a scatter mode") if op == "scatter" else None
            buffer = self._buffer_name(line)
            if buffer not in self.buffer_index:
                raise line.fail(f"unknown buffer @{buffer}")
            line.keyword("[")
            offset = line.integer()
            line.keyword(";")
            attrs = (self.buffer_index[buffer], IndexMap(offset, line.ints()))
            if op in ("store", "gather", "scatter"):
                line.keyword(",")
                args.append(value())
            if op == "scatter":  # the value, then the element offset
                line.keyword(",")
                args.append(value())
            if op in ("gather", "scatter"):
                line.keyword("in")
                line.keyword("[")
                attrs += (line.ints(),)
            if mode is not None:
                attrs += (mode,)
        elif op == "const":
            literal = line.take(None, "a constant")  # checked once the dtype is known
        elif op == "index":
            attrs = (line.integer(),)
        else:
            kind = line.take("word", "a reduction kind") if op == "reduce" else None
            args.append(value())
            while line.accept(","):
                args.append(value())
            if op in ("reduce", "contract"):
                line.keyword("axes")
                line.keyword("[")
                attrs = (line.ints(),) if kind is None else (kind, line.ints())
        line.keyword(":")
        dtype, shape = line.tensor_type()
        line.end()
        if literal is not None:
            attrs = (_const(line, literal, dtype),)
        if result is not None:
            if result in values:
                raise line.fail(f"{result} is defined twice")
            values[result] = pos
        return Instr(op, dtype, shape, tuple(args), attrs)

    @staticmethod
    def _buffer_name(line: _Line) -> str:
        token = line.take("buf", "a buffer @name")[1:]
        return json.loads(token) if token.startswith('"') else token

    def verify(self, program: Program) -> Program:
        """Verify ``program``, naming the source line at fault on failure."""
        try:
            return verify_program(program)
        except IRError as err:
            error = err
        # The verifier names kernels and positions, not lines. Its checks are monotone (a
        # failing prefix of the program still fails when it grows), so bisect for the
        # shortest failing prefix: its last buffer, kernel header or instruction is at fault.
        steps = self.buffer_lines + [line for lines in self.kernel_lines for line in lines]

        def prefix(n: int) -> Program:
            buffers = program.buffers[:n]
            n -= len(buffers)
            kernels = []
            for k in program.kernels:
                if n <= 0:
                    break
                kernels.append(replace(k, body=k.body[: n - 1]))
                n -= 1 + len(k.body)
            return Program(program.name, buffers, tuple(kernels))

        good, bad = 0, len(steps)
        while bad - good > 1:
            mid = (good + bad) // 2
            try:
                verify_program(prefix(mid))
                good = mid
            except IRError as err:
                bad, error = mid, err
        raise IRError(f"line {steps[bad - 1].number}: {error}") from None


def _const(line: _Line, literal: str, dtype: dt.DType) -> bool | int | str:
    """Encode ``literal`` as a ``dtype`` constant exactly as the builder would."""
    if dtype.is_bool:
        if literal not in ("true", "false"):
            raise line.fail(f"expected true or false for a bool constant, got {literal!r}")
        return encode_const(dtype, literal == "true")
    if dtype.is_int:
        try:
            value = int(literal)
        except ValueError:
            raise line.fail(f"expected an integer constant for {dtype.name}, "
                            f"got {literal!r}") from None
        if not dtype.min <= value <= dtype.max:
            raise line.fail(f"constant {value} is outside the range of {dtype.name}")
        return encode_const(dtype, value)
    try:
        return encode_const(dtype, float(literal))
    except ValueError:
        raise line.fail(f"expected a floating-point constant for {dtype.name}, "
                        f"got {literal!r}") from None


def parse_program(text: str, verify: bool = True) -> Program:
    """Parse the text form back into a :class:`Program` (verified unless ``verify=False``).

    Raises :class:`IRError` naming the line number, the line and what was expected.
    """
    parser = _Parser(text)
    program = parser.program()
    return parser.verify(program) if verify else program
