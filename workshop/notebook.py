"""What the notebooks show of a lab's script: the lines that make it distributed.

Each lab's script marks its distributed lines with a tag comment (`# DDP: ...`, `# Horovod: ...`;
the script's docstring names its tag). A tag sits either at the end of the code line it explains
or on a comment line of its own above the code. Printing only the tagged lines would show, for
the second kind, a comment without its code: `# DDP: join the process group` but not
`dist.init_process_group(...)`. So for each tag this module finds, with `ast`, the whole
statement it belongs to, even one that spans several lines:

- a tag at the end of a code line: the statement on that line, in full (a tag on the header of
  a compound statement, `with strategy.scope():  # PS: ...`, shows its whole block);
- a tag on a comment line: that comment (with the comment lines that continue it) and the whole
  statement that follows it.

    print(distributed_lines(lab.entry_path, "DDP"))
"""

from __future__ import annotations

import ast
import io
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path

# The fields of a compound statement that hold its body, not its header.
_BODY_FIELDS = {"body", "orelse", "finalbody", "handlers", "cases"}


@dataclass(frozen=True)
class Tagged:
    """One tag comment and the lines that show it in full (1-based line numbers)."""

    tag_line: int  # the line that carries the tag comment
    comment_lines: tuple[int, ...]  # the tag's comment block when it stands on its own lines, else ()
    code_lines: tuple[int, ...]  # the statement it explains

    @property
    def lines(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.comment_lines) | set(self.code_lines)))


def _marker(tag: str) -> str:
    """"DDP", "DDP:" or "# DDP:" -> "# DDP:"."""
    return "# " + tag.strip().removeprefix("#").strip().removesuffix(":") + ":"


def _comments(source: str) -> dict[int, tuple[int, str]]:
    """Line -> (column, text) of every real comment (not `#` inside a string)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {tok.start[0]: (tok.start[1], tok.string) for tok in tokens if tok.type == tokenize.COMMENT}


def _header_end(node: ast.stmt) -> int:
    """The last line of a statement's header (`with a(\\n b):` -> b's line); a simple statement's last line."""
    if not any(field in _BODY_FIELDS for field, _ in ast.iter_fields(node)):
        return node.end_lineno
    end = node.lineno
    for field, value in ast.iter_fields(node):
        if field in _BODY_FIELDS or field == "decorator_list":
            continue
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, ast.AST) and getattr(child, "end_lineno", None):
                end = max(end, child.end_lineno)
    return end


def find_tagged(source: str, tag: str) -> list[Tagged]:
    """Every `# TAG:` comment in `source`, with the statement it explains."""
    marker = _marker(tag)
    lines = source.splitlines()
    comments = _comments(source)
    statements = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.stmt)]

    def own_line(number: int) -> bool:  # a comment alone on its line
        column, _ = comments.get(number, (None, ""))
        return column is not None and not lines[number - 1][:column].strip()

    found = []
    for number, (column, text) in sorted(comments.items()):
        if not text.startswith(marker):
            continue
        if own_line(number):
            # The comment block (this line and the comment lines that continue it, up to the next
            # tag), then the whole statement on the first line of code after it.
            block = [number]
            while block[-1] < len(lines) and own_line(block[-1] + 1) and not comments[block[-1] + 1][1].startswith(marker):
                block.append(block[-1] + 1)
            following = [s for s in statements if s.lineno > block[-1]]
            code: tuple[int, ...] = ()
            if following:
                first = min(s.lineno for s in following)
                # Outermost statement starting there (a compound statement includes its body).
                node = max((s for s in following if s.lineno == first), key=lambda s: s.end_lineno)
                # None if the code dedents (the comment ends a block): the next statement is
                # not what it explains, and the tests report a tag without code.
                if node.col_offset >= column:
                    code = tuple(range(node.lineno, node.end_lineno + 1))
            found.append(Tagged(number, tuple(block), code))
        else:
            # The innermost statement whose header holds this line (`x = f(  # TAG:` -> the whole
            # assignment; `with scope():  # TAG:` -> the `with` block), shown in full.
            holders = [s for s in statements if s.lineno <= number <= _header_end(s)]
            if holders:
                node = min(holders, key=lambda s: _header_end(s) - s.lineno)
                code = tuple(range(node.lineno, node.end_lineno + 1))
            else:  # e.g. an `else:` line: show it alone
                code = (number,)
            found.append(Tagged(number, (), code))
    return found


def distributed_lines(script_path: str | Path, tag: str) -> str:
    """The lines of `script_path` that carry `tag` (e.g. "DDP"), each with the whole statement
    it explains, numbered as in the file. Runs of consecutive lines are dedented together; the
    numbers' jumps show where one run ends (no blank line between runs: lab 4's listing is 25 lines, not 41)."""
    path = Path(script_path)
    source = path.read_text()
    lines = source.splitlines()
    tagged = find_tagged(source, tag)
    shown = sorted({n for t in tagged for n in t.lines})
    runs: list[list[int]] = []
    for number in shown:
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    header = f"{path.name}: {len(tagged)} `{_marker(tag)}` comments, each with the statement it explains"
    blocks = []
    for run in runs:
        text = textwrap.dedent("\n".join(lines[n - 1] for n in run)).splitlines()
        blocks.append("\n".join(f"{n:4d}  {line}".rstrip() for n, line in zip(run, text, strict=True)))
    return header + "\n\n" + "\n".join(blocks)
