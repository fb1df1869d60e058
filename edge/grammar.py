"""Grammars of custom tools (`format: {type: grammar, syntax: lark | regex, definition}`) in the form the
grammar engine takes: the EBNF of xgrammar, which TensorRT-LLM (`ebnf_grammar`), vLLM (`structured_outputs`
`grammar`) and the demo models compile.

A Lark grammar is read by Lark itself (the `lark` package: its own grammar loader, so `%import common.*`,
templates, `?rule`, `_rule`, aliases and priorities mean what they mean in Lark) and compiled to its rules
and terminals; each rule becomes an EBNF rule (immediate left recursion, which Lark writes for `x+`, as a
repetition), each terminal a literal or its regular expression as EBNF (`re`'s own parser reads it). What
cannot become a context-free rule is refused by name (`GrammarError`): `%ignore`, `%declare`, regular
expression flags, anchors, lookaround and backreferences. The language is the one Lark describes, read
character by character: Lark's lexer may split some texts differently, which no generated text relies on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from re import _constants as sre  # the regular-expression parser of Python itself
from re import _parser as sre_parse
from typing import Any

from lark.exceptions import LarkError
from lark.load_grammar import load_grammar

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", '"': '\\"', "\\": "\\\\"}
_CLASS_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "]": "\\]", "\\": "\\\\", "^": "\\^", "-": "\\-"}
# `\d`, `\w`, `\s` (ASCII, as the JSON-ish grammars of tools mean them) and their negations.
_CATEGORIES = {
    sre.CATEGORY_DIGIT: "0-9", sre.CATEGORY_WORD: "a-zA-Z0-9_", sre.CATEGORY_SPACE: " \\t\\n\\r\\f\\v",
}
# What a repetition applies to without parentheses.
_ATOMS = (sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN, sre.CATEGORY, sre.SUBPATTERN, sre.BRANCH)
_NOT_CATEGORIES = {sre.CATEGORY_NOT_DIGIT: sre.CATEGORY_DIGIT, sre.CATEGORY_NOT_WORD: sre.CATEGORY_WORD,
                   sre.CATEGORY_NOT_SPACE: sre.CATEGORY_SPACE}


class GrammarError(ValueError):
    """A grammar that does not parse, or uses what the grammar engine cannot take (the message says which)."""


def lark_to_ebnf(source: str) -> str:
    """The EBNF of a Lark grammar whose start rule is `start`."""
    try:
        grammar, _ = load_grammar(source, "<definition>", None, False)
        terminals, rules, ignore = grammar.compile(["start"], set())
    except LarkError as exc:
        raise GrammarError(f"the Lark grammar does not parse: {_first_line(exc)}") from None
    if ignore:
        raise GrammarError("%ignore is not supported: write the separators into the rules")
    if not any(rule.origin.name == "start" for rule in rules):
        raise GrammarError("the Lark grammar has no `start` rule")
    defined = {terminal.name for terminal in terminals}
    declared = sorted({s.name for rule in rules for s in rule.expansion if s.is_term and s.name not in defined})
    if declared:  # `%declare`d: a terminal a custom lexer would give, with no text of its own
        raise GrammarError(f"%declare is not supported: terminal {declared[0]} has no definition")
    names = _Names()
    lines = [f"root ::= {names.rule('start')}"]
    by_origin: dict[str, list[list[str]]] = {}
    for rule in rules:
        by_origin.setdefault(rule.origin.name, []).append(
            [names.rule(s.name) if not s.is_term else names.terminal(s.name) for s in rule.expansion])
    for origin, expansions in by_origin.items():
        lines.append(f"{names.rule(origin)} ::= {_alternatives(names.rule(origin), expansions)}")
    for terminal in terminals:
        pattern = terminal.pattern
        if pattern.flags:
            raise GrammarError(f"terminal {_shown(terminal.name)}: regular expression flags "
                               f"({''.join(sorted(pattern.flags))}) are not supported")
        body = _literal(pattern.value) if pattern.type == "str" else regex_to_ebnf(
            pattern.value, f"terminal {_shown(terminal.name)}")
        lines.append(f"{names.terminal(terminal.name)} ::= {body}")
    return "\n".join(lines) + "\n"


def regex_to_ebnf(pattern: str, where: str = "the regular expression") -> str:
    """One regular expression as an EBNF expression (the whole text must match it)."""
    try:
        parsed = sre_parse.parse(pattern)
    except re.error as exc:
        raise GrammarError(f"{where} does not parse: {exc}") from None
    if parsed.state.flags & ~(sre.SRE_FLAG_UNICODE | sre.SRE_FLAG_VERBOSE):
        raise GrammarError(f"{where}: inline flags are not supported")
    return _sequence(list(parsed), where)


class _Names:
    """EBNF names for Lark's rules (`r_...`) and terminals (`t_...`): Lark's own names may hold characters
    EBNF does not take, and a rule and a terminal may not share a name."""

    def rule(self, name: str) -> str:
        return "r_" + re.sub(r"[^A-Za-z0-9_]", "_", name)

    def terminal(self, name: str) -> str:
        return "t_" + re.sub(r"[^A-Za-z0-9_]", "_", name)


def _alternatives(name: str, expansions: list[list[str]]) -> str:
    """A rule's expansions; `A: A x | A y | b | c` (immediate left recursion) as `(b | c) (x | y)*`."""
    recursive = [e[1:] for e in expansions if e and e[0] == name]
    base = [e for e in expansions if not e or e[0] != name]
    if not base and recursive:
        raise GrammarError(f"rule {_shown(name[2:])} never ends: every expansion starts with itself")
    choice = " | ".join(" ".join(e) if e else '""' for e in base)
    if not recursive:
        return choice
    tails = " | ".join(" ".join(e) if e else '""' for e in recursive)
    return f"({choice}) ({tails})*"


def _shown(name: str) -> str:
    """A terminal's name as the client wrote it (Lark names anonymous ones `__ANON_n`)."""
    return "(anonymous)" if name.startswith("__ANON") else name


def _literal(text: str) -> str:
    return '"' + "".join(_ESCAPES.get(c, c) if c >= " " or c in _ESCAPES else f"\\x{ord(c):02x}"
                         for c in text) + '"' if text else '""'


def _class_char(code: int) -> str:
    char = chr(code)
    if char in _CLASS_ESCAPES:
        return _CLASS_ESCAPES[char]
    return char if char >= " " else f"\\x{code:02x}"


def _sequence(items: list[tuple[Any, Any]], where: str) -> str:
    """Consecutive literal characters as one string, the rest item by item."""
    parts: list[str] = []
    run = ""
    for op, av in items:
        if op is sre.LITERAL:
            run += chr(av)
            continue
        if run:
            parts.append(_literal(run))
            run = ""
        parts.append(_item(op, av, where))
    if run:
        parts.append(_literal(run))
    return " ".join(parts) if parts else '""'


def _class(items: Iterable[tuple[Any, Any]], where: str) -> str:
    """A character class `[...]` (`IN`), negated when it starts with NEGATE."""
    items = list(items)
    if len(items) == 1 and items[0][0] is sre.CATEGORY and items[0][1] in _NOT_CATEGORIES:  # `\S` alone
        return f"[^{_CATEGORIES[_NOT_CATEGORIES[items[0][1]]]}]"
    negate, body = False, []
    for op, av in items:
        if op is sre.NEGATE:
            negate = True
        elif op is sre.LITERAL:
            body.append(_class_char(av))
        elif op is sre.RANGE:
            body.append(f"{_class_char(av[0])}-{_class_char(av[1])}")
        elif op is sre.CATEGORY and av in _CATEGORIES:
            body.append(_CATEGORIES[av])
        else:
            raise GrammarError(f"{where}: {_feature(op, av)} inside a character class is not supported "
                               "(\\S, \\W and \\D only on their own)")
    return f"[{'^' if negate else ''}{''.join(body)}]"


def _item(op: Any, av: Any, where: str) -> str:
    if op is sre.LITERAL:
        return _literal(chr(av))
    if op is sre.NOT_LITERAL:
        return f"[^{_class_char(av)}]"
    if op is sre.ANY:
        return "[^\\n]"  # `.` without the DOTALL flag, which is refused
    if op is sre.IN:
        return _class(av, where)
    if op is sre.CATEGORY and av in _CATEGORIES:
        return f"[{_CATEGORIES[av]}]"
    if op is sre.CATEGORY and av in _NOT_CATEGORIES:
        return f"[^{_CATEGORIES[_NOT_CATEGORIES[av]]}]"
    if op is sre.SUBPATTERN:
        _group, add_flags, del_flags, pattern = av
        if add_flags or del_flags:
            raise GrammarError(f"{where}: inline flags are not supported")
        return f"({_sequence(list(pattern), where)})"
    if op is sre.BRANCH:
        return "(" + " | ".join(_sequence(list(branch), where) for branch in av[1]) + ")"
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
        low, high, pattern = av
        items = list(pattern)
        inner = _sequence(items, where)
        if len(items) != 1 or items[0][0] not in _ATOMS:
            inner = f"({inner})"
        return inner + _repeat(low, high)
    raise GrammarError(f"{where}: {_feature(op, av)} is not supported")


def _repeat(low: int, high: int) -> str:
    if high >= sre.MAXREPEAT:
        return "*" if low == 0 else "+" if low == 1 else f"{{{low},}}"
    if (low, high) == (0, 1):
        return "?"
    return f"{{{low}}}" if low == high else f"{{{low},{high}}}"


def _feature(op: Any, av: Any) -> str:
    """What a regular expression uses, in words."""
    names = {sre.AT: "an anchor (^, $, \\b, \\A, \\Z)", sre.ASSERT: "lookahead or lookbehind",
             sre.ASSERT_NOT: "negative lookahead or lookbehind", sre.GROUPREF: "a backreference",
             sre.GROUPREF_EXISTS: "a conditional group"}
    return names.get(op, f"{str(op).lower()}")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
