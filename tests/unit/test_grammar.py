"""Custom tools' grammars in the grammar engine's form (edge/grammar.py): Lark and regular expressions to
xgrammar's EBNF, checked by xgrammar itself (the grammar library of TensorRT-LLM, vLLM and the demo models)
on texts the grammar must and must not take, and the refusals that name what does not convert."""

from __future__ import annotations

import pytest

from edge.grammar import GrammarError, lark_to_ebnf, regex_to_ebnf

xgrammar = pytest.importorskip("xgrammar")
from xgrammar.testing import _is_grammar_accept_string as accepts  # noqa: E402

# Codex CLI's `apply_patch` tool (its freeform variant), as the CLI sends it.
APPLY_PATCH = r'''start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?
hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change?
filename: /(.+)/
add_line: "+" /(.*)/ LF -> line
change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF
%import common.LF
'''


def grammar(ebnf: str) -> object:
    return xgrammar.Grammar.from_ebnf(ebnf)


def test_codex_apply_patch_grammar_takes_a_patch_and_refuses_what_is_not_one() -> None:
    compiled = grammar(lark_to_ebnf(APPLY_PATCH))
    patch = ("*** Begin Patch\n*** Add File: hello.txt\n+hello\n+world\n*** Update File: a.py\n@@ def f():\n"
             "-    return 1\n+    return 2\n*** End Patch\n")
    assert accepts(compiled, patch)
    assert accepts(compiled, patch[:-1])  # the last newline is optional
    assert not accepts(compiled, "*** Begin Patch\n*** End Patch\n")  # at least one hunk
    assert not accepts(compiled, '{"input": "*** Begin Patch"}')
    assert not accepts(compiled, "*** Begin Patch\n*** Add File: x\nhello\n*** End Patch\n")  # lines start with +


@pytest.mark.parametrize(("pattern", "good", "bad"), [
    (r"[a-z]+\d{2,}", ["abc12", "x123"], ["abc1", "ABC12"]),
    (r"(ab|c)*x?", ["", "abcab", "cx", "abx"], ["abxx", "xc", "a"]),
    (r"\w+@\S+", ["me@host.org"], ["me@", "@host"]),
    (r"(?:ab){2,3}", ["abab", "ababab"], ["ab", "abababab"]),
    (r"[^\]\-]", ["a"], ["]", "-"]),
    (r"é\t.", ["é\tz"], ["é\t\n"]),
])
def test_regular_expressions_match_the_same_texts(pattern: str, good: list[str], bad: list[str]) -> None:
    compiled = grammar(f"root ::= {regex_to_ebnf(pattern)}\n")
    assert all(accepts(compiled, text) for text in good)
    assert not any(accepts(compiled, text) for text in bad)


def test_lark_templates_aliases_and_terminals_of_terminals_convert() -> None:
    source = '''start: _list{item, ","}
_list{x, sep}: x (sep x)*
?item: WORD -> word | NUMBER
WORD: LCASE_LETTER+
NUMBER: DIGIT+ ("." DIGIT+)?
%import common (LCASE_LETTER, DIGIT)
'''
    compiled = grammar(lark_to_ebnf(source))
    assert accepts(compiled, "abc,12.5,x")
    assert not accepts(compiled, "abc,,x")


@pytest.mark.parametrize(("source", "says"), [
    ("start: foo", "does not parse: Rule 'foo' used but not defined"),
    ('start: "a" (', "does not parse"),
    ('start: "a"i', "flags (i) are not supported"),
    ('start: A\nA: "a"\n%ignore " "', "%ignore is not supported"),
    ("start: X\n%declare X", "%declare is not supported: terminal X"),
    ('start: x\nx: x "a"', "rule x never ends"),
    ('item: "a"', "no `start` rule"),
    ("start: /^a/", "an anchor"),
    ("start: /a(?=b)/", "lookahead or lookbehind"),
    (r"start: /(a)\1/", "a backreference"),
    ("start: /(?s)./", "inline flags"),
    (r"start: /[\Sa]/", "inside a character class"),
])
def test_what_does_not_convert_is_refused_by_name(source: str, says: str) -> None:
    with pytest.raises(GrammarError, match=None) as caught:
        lark_to_ebnf(source)
    assert says in str(caught.value)
