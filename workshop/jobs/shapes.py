"""Every constraint SageMaker's service model puts on a request, checked offline.

botocore's own `ParamValidator` checks required members, types and minimums only: a request it
passes can still be refused by the service for a tag value with a `&`, a 64-character job name, a
41st metric definition or an environment variable named `1X`. `check_request` walks a request along
the operation's input shape in botocore's bundled SageMaker model (the model the service's own
validation is generated from) and checks all of it: required members, types, string lengths, list
and map sizes, number ranges, enums and patterns, in nested structures, lists and maps. It knows no
operation by name: CreateTrainingJob and CreateHyperParameterTuningJob (what the workshop sends) and
any other input shape of the model.

Patterns are read as the service reads them: Java regular expressions matched against the whole
value (a job name `a_b` is refused although the pattern matches its first letter: the service
quoted `^[a-zA-Z0-9](-*[a-zA-Z0-9])*` refusing `health_and_personal_care_...`,
sagemaker-python-sdk#384). `java_regex` translates one into Python's `re` where the two differ:
`\\p{L}`-style Unicode categories and `\\p{Alnum}`-style POSIX classes (which `re` lacks) become
explicit character ranges (from Python's Unicode database, `unicodedata.unidata_version`, which may
be a version away from the service's Java); `.` matches no Java line terminator (`\\n`, `\\r`,
U+0085, U+2028, U+2029: a hyperparameter with a line break fails `.*`); `\\d`, `\\w`, `\\s`, `\\b` are
ASCII as in Java (Python's are Unicode); `$` and `\\Z` allow Java's final line terminators; a
surrogate pair `\\uD800\\uDC00` is the one code point it stands for. What it cannot translate
(class intersections `&&`, nested classes, Unicode scripts and blocks, inline flags) raises
`JavaPatternError`, and `check_request` reports that member as not checked, never as passing.
Lengths count code points, as botocore's minimum check does.

`Violation.service_text` and `service_message` word a failure as the service's ValidationException
does ("1 validation error detected: Value 'a_b' at 'trainingJobName' failed to satisfy constraint:
Member must satisfy regular expression pattern: ..."; members in lower camel case, list items as
`tags.3.member.value`, counted from 1), the form users quote from SageMaker and other AWS services.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Java's line terminators (java.util.regex.Pattern): `.` matches none of them, `$` may stand before one.
_LINE_TERMINATORS = "\n\r\u0085\u2028\u2029"


_MAX_CODE_POINT = 0x10FFFF


Ranges = tuple[tuple[int, int], ...]


class JavaPatternError(ValueError):
    """A construct of a Java pattern that `java_regex` cannot express in Python's `re`."""


# --------------------------------------------------------------------------- Java patterns


@functools.lru_cache(maxsize=1)
def _categories() -> dict[str, Ranges]:
    """Unicode general category (two letters) -> its code point ranges, from Python's database."""
    found: dict[str, list[tuple[int, int]]] = {}
    category = unicodedata.category
    start, current = 0, category("\0")
    for cp in range(1, _MAX_CODE_POINT + 1):
        this = category(chr(cp))
        if this != current:
            found.setdefault(current, []).append((start, cp - 1))
            start, current = cp, this
    found.setdefault(current, []).append((start, _MAX_CODE_POINT))
    return {name: tuple(ranges) for name, ranges in found.items()}


def _chars(text: str) -> Ranges:
    return tuple((ord(c), ord(c)) for c in text)


# Java's POSIX classes are US-ASCII only (without UNICODE_CHARACTER_CLASS).
_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
_POSIX: dict[str, Ranges] = {
    "Lower": ((0x61, 0x7A),), "Upper": ((0x41, 0x5A),), "ASCII": ((0x00, 0x7F),),
    "Alpha": ((0x41, 0x5A), (0x61, 0x7A)), "Digit": ((0x30, 0x39),),
    "Alnum": ((0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A)), "Punct": _chars(_PUNCT),
    "Graph": ((0x21, 0x7E),), "Print": ((0x20, 0x7E),), "Blank": _chars(" \t"),
    "Cntrl": ((0x00, 0x1F), (0x7F, 0x7F)), "XDigit": ((0x30, 0x39), (0x41, 0x46), (0x61, 0x66)),
    "Space": _chars(" \t\n\x0b\f\r"),
}


# Java's predefined classes (ASCII, as Java has them without UNICODE_CHARACTER_CLASS); the upper-case
# letter is the complement.
_PREDEFINED: dict[str, Ranges] = {
    "d": ((0x30, 0x39),),
    "w": ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
    "s": _chars(" \t\n\x0b\f\r"),
    "h": _chars(" \t\xa0\u1680\u180e\u202f\u205f\u3000") + ((0x2000, 0x200A),),
    "v": _chars("\n\x0b\f\r\x85\u2028\u2029"),
}


def _merge(ranges: Iterable[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if out and low <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], high))
        else:
            out.append((low, high))
    return tuple(out)


def _complement(ranges: Ranges) -> Ranges:
    out, next_low = [], 0
    for low, high in _merge(ranges):
        if low > next_low:
            out.append((next_low, low - 1))
        next_low = high + 1
    if next_low <= _MAX_CODE_POINT:
        out.append((next_low, _MAX_CODE_POINT))
    return tuple(out)


def _property(name: str) -> Ranges:
    """The ranges of Java's `\\p{name}`: a general category (`L`, `Lu`, `IsL`, `gc=L`, ...) or a
    POSIX class (`Alnum`, ...)."""
    if name in _POSIX:
        return _POSIX[name]
    bare = name
    for prefix in ("general_category=", "gc=", "Is"):
        if bare.startswith(prefix):
            bare = bare[len(prefix):]
            break
    categories = _categories()
    if bare == "LC":
        return _merge(r for c in ("Lu", "Ll", "Lt") for r in categories.get(c, ()))
    if bare == "LD":
        return _merge(r for c, rs in categories.items() if c[0] == "L" or c == "Nd" for r in rs)
    if len(bare) == 1 and bare in "LMNPSZC":
        return _merge(r for c, rs in categories.items() if c[0] == bare for r in rs)
    if len(bare) == 2 and bare[0] in "LMNPSZC":
        if bare not in categories and bare not in {"Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl",
                                                   "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc",
                                                   "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn"}:
            raise JavaPatternError(f"unknown Unicode category \\p{{{name}}}")
        return categories.get(bare, ())
    raise JavaPatternError(f"\\p{{{name}}} (a Unicode script, block or Java property) is not translated")


def _emit_class(ranges: Ranges, negated: bool = False) -> str:
    ranges = _merge(ranges)
    if not ranges:
        return r"[\x00-\U0010FFFF]" if negated else "(?!)"
    body = "".join(f"\\U{low:08X}" if low == high else f"\\U{low:08X}-\\U{high:08X}" for low, high in ranges)
    return f"[{'^' if negated else ''}{body}]"


class _Reader:
    """A cursor over a Java pattern."""

    def __init__(self, pattern: str):
        self.text, self.i = pattern, 0

    def more(self) -> bool:
        return self.i < len(self.text)

    def peek(self, n: int = 1) -> str:
        return self.text[self.i:self.i + n]

    def take(self, n: int = 1) -> str:
        out = self.text[self.i:self.i + n]
        if len(out) < n:
            raise JavaPatternError("the pattern ends inside an escape or a class")
        self.i += n
        return out

    def hex_digits(self, n: int) -> int:
        digits = self.take(n)
        if not re.fullmatch(f"[0-9a-fA-F]{{{n}}}", digits):
            raise JavaPatternError(f"bad hexadecimal escape {digits!r}")
        return int(digits, 16)


def _escape(reader: _Reader) -> tuple[str, Any]:
    """The escape after a backslash: ("char", code point), ("set", (ranges, negated)), or
    ("raw", Python pattern text) for what only makes sense outside a class."""
    letter = reader.take()
    if letter in "pP":
        if reader.peek() == "{":
            reader.take()
            end = reader.text.find("}", reader.i)
            if end < 0:
                raise JavaPatternError("unclosed \\p{")
            name, reader.i = reader.text[reader.i:end], end + 1
        else:
            name = reader.take()
        return "set", (_property(name), letter == "P")
    if letter.lower() in _PREDEFINED:
        return "set", (_PREDEFINED[letter.lower()], letter.isupper())
    simple = {"t": 0x09, "n": 0x0A, "r": 0x0D, "f": 0x0C, "a": 0x07, "e": 0x1B}
    if letter in simple:
        return "char", simple[letter]
    if letter == "x":
        if reader.peek() == "{":
            reader.take()
            end = reader.text.find("}", reader.i)
            if end < 0:
                raise JavaPatternError("unclosed \\x{")
            value, reader.i = int(reader.text[reader.i:end], 16), end + 1
            return "char", value
        return "char", reader.hex_digits(2)
    if letter == "u":
        unit = reader.hex_digits(4)
        # A surrogate pair written as two escapes is the one code point it encodes (Java's UTF-16).
        if 0xD800 <= unit <= 0xDBFF and reader.peek(2) == "\\u":
            save = reader.i
            reader.take(2)
            low = reader.hex_digits(4)
            if 0xDC00 <= low <= 0xDFFF:
                return "char", 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
            reader.i = save
        return "char", unit
    if letter == "0":
        digits = ""
        while len(digits) < 3 and reader.peek() and reader.peek() in "01234567" and int(digits + reader.peek(), 8) <= 0o377:
            digits += reader.take()
        if not digits:
            raise JavaPatternError("\\0 needs an octal value")
        return "char", int(digits, 8)
    if letter == "c":
        return "char", ord(reader.take()) ^ 64
    word = r"[A-Za-z0-9_]"
    raw = {
        "b": rf"(?:(?<={word})(?!{word})|(?<!{word})(?={word}))",
        "B": rf"(?:(?<={word})(?={word})|(?<!{word})(?!{word}))",
        "A": r"\A", "z": r"\Z", "Z": rf"(?=(?:\r\n|[{_LINE_TERMINATORS}])?\Z)",
        "R": r"(?:\r\n|[\n\x0b\f\r\x85\u2028\u2029])",
    }
    if letter in raw:
        return "raw", raw[letter]
    if letter.isdigit():
        return "raw", "\\" + letter
    if letter == "k" and reader.peek() == "<":
        end = reader.text.find(">", reader.i)
        name, reader.i = reader.text[reader.i + 1:end], end + 1
        return "raw", f"(?P={name})"
    if letter == "Q":
        end = reader.text.find("\\E", reader.i)
        end = len(reader.text) if end < 0 else end
        quoted, reader.i = reader.text[reader.i:end], min(len(reader.text), end + 2)
        return "raw", re.escape(quoted)
    if letter.isalpha():
        raise JavaPatternError(f"the escape \\{letter} is not translated")
    return "char", ord(letter)  # an escaped symbol is itself


def _class(reader: _Reader) -> str:
    """A Java character class, from after its `[`, as a Python class of explicit ranges."""
    negated = reader.peek() == "^"
    if negated:
        reader.take()
    items: list[tuple[int, int]] = []
    first = True
    while True:
        if not reader.more():
            raise JavaPatternError("unclosed character class")
        c = reader.take()
        if c == "]" and not first:
            break
        if c == "]" or c == "[":
            raise JavaPatternError("nested or empty character classes (Java's unions) are not translated")
        if c == "&" and reader.peek() == "&":
            raise JavaPatternError("class intersections (&&) are not translated")
        first = False
        if c == "\\":
            kind, value = _escape(reader)
            if kind == "set":
                ranges, negate = value
                items.extend(_complement(ranges) if negate else ranges)
                continue
            if kind == "raw":
                raise JavaPatternError("a boundary or group escape inside a character class")
            low = value
        else:
            low = ord(c)
        if reader.peek() == "-" and len(reader.peek(2)) == 2 and reader.peek(2) != "-]":  # a range; "-]": a literal -
            reader.take()
            end = reader.take()
            if end == "\\":
                kind, high = _escape(reader)
                if kind != "char":
                    raise JavaPatternError("a range must end at a character")
            elif end == "[":
                raise JavaPatternError("nested character classes are not translated")
            else:
                high = ord(end)
            if high < low:
                raise JavaPatternError(f"the range {chr(low)!r}-{chr(high)!r} is backwards")
            items.append((low, high))
        else:
            items.append((low, low))
    return _emit_class(tuple(items), negated)


@functools.lru_cache(maxsize=512)
def java_regex(pattern: str) -> re.Pattern[str]:
    """`pattern` (a Java regular expression, as the service model writes them) as a compiled
    Python pattern with the same meaning; use it with `fullmatch`, as the service matches the
    whole value. Raises JavaPatternError for what it cannot translate (see the module docstring)."""
    reader, out = _Reader(pattern), []
    while reader.more():
        c = reader.take()
        if c == "\\":
            kind, value = _escape(reader)
            if kind == "char":
                out.append(f"\\U{value:08X}")
            elif kind == "set":
                ranges, negated = value
                out.append(_emit_class(ranges, negated))
            else:
                out.append(value)
        elif c == "[":
            out.append(_class(reader))
        elif c == ".":
            out.append(f"[^{_LINE_TERMINATORS}]")
        elif c == "$":
            out.append(rf"(?=(?:\r\n|[{_LINE_TERMINATORS}])?\Z)")
        elif c == "(" and reader.peek() == "?":
            group = reader.text[reader.i:reader.i + 3]
            if group.startswith("?<") and group not in ("?<=", "?<!"):
                reader.take(2)
                out.append("(?P<")
            elif group[:2] in ("?:", "?=", "?!", "?>") or group in ("?<=", "?<!"):
                out.append("(")
            else:
                raise JavaPatternError(f"the group ({group}... (inline flags) is not translated")
        else:
            out.append(c)
    try:
        return re.compile("".join(out))
    except re.error as exc:
        raise JavaPatternError(f"Python's re cannot compile the translation: {exc}") from None


# --------------------------------------------------------------------------- the model


@functools.lru_cache(maxsize=1)
def service_model() -> Any:
    import botocore.session

    return botocore.session.get_session().get_service_model("sagemaker")


def model_source() -> str:
    import botocore

    return f"botocore {botocore.__version__}'s SageMaker service model"


def _lower_first(name: str) -> str:
    return name[:1].lower() + name[1:]


def _coral(value: Any) -> str:
    """A value as the service prints it in a ValidationException (Java's toString)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}={_coral(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_coral(v) for v in value) + "]"
    return str(value)


@dataclass(frozen=True)
class Violation:
    """One constraint of the model that a request breaks.

    `path`: the member as botocore names it (`Tags[2].Value`, `Environment['1X']`; a map's key:
    `Environment key '1X'`); `where`: as the service does (`tags.3.member.value`, `environment`);
    `rule`: the service's words (`Member must have length less than or equal to 256`); `value`: the
    member's value (None: absent). A list's or map's items are reported by the service once per list
    or map (`group`: "Member", "Map keys" or "Map value"), with the container's value (`shown`)."""

    path: str
    where: str
    rule: str
    value: Any = None
    group: str = ""
    shown: Any = None
    model_rule: str = ""  # the constraint as the model states it ("max 256", "pattern ...")

    def service_text(self) -> str:
        """This violation as one clause of the service's message (the group's, for an item)."""
        value = self.shown if self.group else self.value
        head = "Value null" if value is None else f"Value '{_coral(value)}'"
        rule = f"{self.group} must satisfy constraint: [{self.rule}]" if self.group else self.rule
        return f"{head} at '{self.where}' failed to satisfy constraint: {rule}"


@dataclass
class Report:
    """What `check_request` found: the violations, and the members whose pattern could not be
    checked (path, pattern, why)."""

    violations: list[Violation] = field(default_factory=list)
    unchecked: list[tuple[str, str, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.violations)


def service_message(violations: Sequence[Violation]) -> str:
    """The ValidationException's message for `violations`, as the service words it: one clause
    per member and rule, the items of a list or map folded into one clause per container that
    lists the rules they break."""
    order: list[Violation | tuple[str, str]] = []
    rules: dict[tuple[str, str], list[str]] = {}
    first: dict[tuple[str, str], Violation] = {}
    for v in violations:
        if not v.group:
            order.append(v)
            continue
        key = (v.where, v.group)
        if key not in rules:
            order.append(key)
            rules[key], first[key] = [], v
        if v.rule not in rules[key]:
            rules[key].append(v.rule)
    clauses = [
        item.service_text() if isinstance(item, Violation)
        else Violation(first[item].path, first[item].where, ", ".join(rules[item]), group=first[item].group,
                       shown=first[item].shown).service_text()
        for item in order
    ]
    count = len(clauses)
    return f"{count} validation error{'s' if count != 1 else ''} detected: " + "; ".join(clauses)


def _scalar_rules(value: Any, shape: Any, report: Report, path: str) -> list[tuple[str, str]]:
    """(service rule, model rule) for each constraint of a scalar shape that `value` breaks."""
    kind, meta = shape.type_name, shape.metadata
    broken: list[tuple[str, str]] = []
    if kind == "string":
        if not isinstance(value, str):
            return [("Member must be a string", "type string")]
        size = len(value)
        if "max" in meta and size > meta["max"]:
            broken.append((f"Member must have length less than or equal to {meta['max']}", f"max length {meta['max']}"))
        if "min" in meta and size < meta["min"]:
            broken.append((f"Member must have length greater than or equal to {meta['min']}", f"min length {meta['min']}"))
        if shape.enum and value not in shape.enum:
            broken.append((f"Member must satisfy enum value set: [{', '.join(shape.enum)}]",
                           f"one of {len(shape.enum)} values"))
        pattern = meta.get("pattern")
        if pattern is not None:
            try:
                matched = java_regex(pattern).fullmatch(value) is not None
            except JavaPatternError as exc:
                report.unchecked.append((path, pattern, str(exc)))
            else:
                if not matched:
                    broken.append((f"Member must satisfy regular expression pattern: {pattern}", f"pattern {pattern}"))
        return broken
    if kind in ("integer", "long", "float", "double"):
        types = (int,) if kind in ("integer", "long") else (int, float)
        if isinstance(value, bool) or not isinstance(value, types):
            return [(f"Member must be a{'n' if kind[0] in 'aeiou' else ''} {kind}", f"type {kind}")]
        if "max" in meta and value > meta["max"]:
            broken.append((f"Member must have value less than or equal to {meta['max']}", f"max {meta['max']}"))
        if "min" in meta and value < meta["min"]:
            broken.append((f"Member must have value greater than or equal to {meta['min']}", f"min {meta['min']}"))
        return broken
    if kind == "boolean" and not isinstance(value, bool):
        return [("Member must be a boolean", "type boolean")]
    return broken  # timestamps, blobs: not in the requests the workshop sends; botocore checks their types


def _size_rules(size: int, meta: Mapping[str, Any]) -> list[tuple[str, str]]:
    broken = []
    if "max" in meta and size > meta["max"]:
        broken.append((f"Member must have length less than or equal to {meta['max']}", f"at most {meta['max']} items"))
    if "min" in meta and size < meta["min"]:
        broken.append((f"Member must have length greater than or equal to {meta['min']}", f"at least {meta['min']} items"))
    return broken


def _walk(value: Any, shape: Any, path: str, where: str, report: Report) -> None:
    add = report.violations.append
    kind = shape.type_name
    if kind == "structure":
        if not isinstance(value, Mapping):
            add(Violation(path, where, "Member must be a structure", value, model_rule="type structure"))
            return
        for name in shape.metadata.get("required", []):
            if value.get(name) is None:
                add(Violation(f"{path}.{name}" if path else name, f"{where}.{_lower_first(name)}" if where
                              else _lower_first(name), "Member must not be null", None, model_rule="required"))
        present = [name for name, item in value.items() if item is not None]
        if shape.is_tagged_union and len(present) != 1:
            add(Violation(path, where, f"Exactly one of {', '.join(shape.members)} must be set", value,
                          model_rule="union"))
        for name in present:
            member_path = f"{path}.{name}" if path else name
            if name not in shape.members:
                add(Violation(member_path, f"{where}.{_lower_first(name)}" if where else _lower_first(name),
                              f"{name} is not a member of {shape.name} (members: {', '.join(shape.members)})",
                              value[name], model_rule="unknown member"))
                continue
            _walk(value[name], shape.members[name], member_path,
                  f"{where}.{_lower_first(name)}" if where else _lower_first(name), report)
        return
    if kind == "list":
        if not isinstance(value, (list, tuple)):
            add(Violation(path, where, "Member must be a list", value, model_rule="type list"))
            return
        for rule, model_rule in _size_rules(len(value), shape.metadata):
            add(Violation(path, where, rule, list(value), model_rule=model_rule))
        member = shape.member
        for i, item in enumerate(value):
            if member.type_name in ("structure", "list", "map"):
                _walk(item, member, f"{path}[{i}]", f"{where}.{i + 1}.member", report)
                continue
            for rule, model_rule in _scalar_rules(item, member, report, f"{path}[{i}]"):
                add(Violation(f"{path}[{i}]", where, rule, item, group="Member", shown=list(value),
                              model_rule=model_rule))
        return
    if kind == "map":
        if not isinstance(value, Mapping):
            add(Violation(path, where, "Member must be a map", value, model_rule="type map"))
            return
        for rule, model_rule in _size_rules(len(value), shape.metadata):
            add(Violation(path, where, rule, dict(value), model_rule=model_rule))
        for key, item in value.items():
            for rule, model_rule in _scalar_rules(key, shape.key, report, f"{path} key {key!r}"):
                add(Violation(f"{path} key {key!r}", where, rule, key, group="Map keys", shown=dict(value),
                              model_rule=model_rule))
            item_path = f"{path}[{key!r}]"
            if shape.value.type_name in ("structure", "list", "map"):
                _walk(item, shape.value, item_path, f"{where}.{key}", report)
                continue
            for rule, model_rule in _scalar_rules(item, shape.value, report, item_path):
                add(Violation(item_path, where, rule, item, group="Map value", shown=dict(value),
                              model_rule=model_rule))
        return
    for rule, model_rule in _scalar_rules(value, shape, report, path):
        add(Violation(path, where, rule, value, model_rule=model_rule))


def input_shape(operation: str, member: str = "") -> Any:
    """The input shape of `operation`, or of its member at the dotted `member` path
    (e.g. "AlgorithmSpecification.MetricDefinitions")."""
    shape = service_model().operation_model(operation).input_shape
    for name in filter(None, member.split(".")):
        shape = shape.members[name]
    return shape


def check_request(operation: str, params: Mapping[str, Any]) -> Report:
    """Every violation of `operation`'s input shape in the request `params` (as boto3 takes them)."""
    report = Report()
    _walk(params, input_shape(operation), "", "", report)
    return report


def check_members(operation: str, members: Mapping[str, Any]) -> Report:
    """`check_request` for parts of a request: dotted member path -> its value (None: left out),
    e.g. {"Tags": [...], "CheckpointConfig.S3Uri": "s3://..."}."""
    report = Report()
    for member, value in members.items():
        if value is not None:
            where = ".".join(_lower_first(name) for name in member.split("."))
            _walk(value, input_shape(operation, member), member, where, report)
    return report


def patterns(operation: str) -> dict[str, str]:
    """Every pattern of the shapes `operation`'s input can reach: shape name -> pattern."""
    found: dict[str, str] = {}
    seen: set[str] = set()

    def visit(shape: Any) -> None:
        if shape.name in seen:
            return
        seen.add(shape.name)
        if "pattern" in shape.metadata:
            found[shape.name] = shape.metadata["pattern"]
        if shape.type_name == "structure":
            for member in shape.members.values():
                visit(member)
        elif shape.type_name == "list":
            visit(shape.member)
        elif shape.type_name == "map":
            visit(shape.key)
            visit(shape.value)

    visit(input_shape(operation))
    return found
