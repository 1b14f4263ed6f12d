"""The store's escape_str (``relyscope.store.escaping``, str.translate) gives what clickhouse-
connect's own per-character function gives, for every string; and a bound parameter holding each
character the library escapes comes back unchanged from a real chDB query."""

from __future__ import annotations

import random

from clickhouse_connect.driver import binding

from relyscope.store import Store
from relyscope.store.escaping import escape_str, library_escape_str

NASTY = ["", "plain-id_0123:abc", "it's", "back\\slash", "`tick`", "tab\there", "new\nline", "\\'",
         "'\\`\t\n", "é ✓ 漢字", "\ud800 lone", "\x00\x01\r\"", "%(x)s {y:String}"]


def test_same_output_as_the_library_on_every_kind_of_string():
    rng = random.Random(7)
    alphabet = "ab'\\`\t\n\r\"%{}é\ud800\x00"
    samples = NASTY + ["".join(rng.choice(alphabet) for _ in range(rng.randrange(30))) for _ in range(2000)]
    for s in samples:
        assert escape_str(s) == library_escape_str(s), s
    # by hand: each of backslash, quote, backquote, tab, newline gets one backslash before it
    assert escape_str("a'b\\c`d\te\nf") == "a\\'b\\\\c\\`d\\\te\\\nf"
    assert binding.escape_str is escape_str  # installed: format_str and format_bind_value use it
    assert binding.format_str("it's") == "'it\\'s'"


def test_bound_strings_come_back_unchanged(tmp_path):
    st = Store(f"chdb://{tmp_path / 'data'}")
    try:
        got = st.query("SELECT %(a)s, %(b)s", {"a": NASTY[8], "b": NASTY[9]})
        assert got[0] == (NASTY[8], NASTY[9])
        ids = ["t'1", "t\\2", "t3"]
        rows = st.query("SELECT arrayJoin(%(ids)s) AS x ORDER BY x", {"ids": ids})
        assert [r[0] for r in rows] == sorted(ids)
    finally:
        st.close()
