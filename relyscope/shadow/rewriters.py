"""Prompt rewriters for the ``prompt`` perturbation family (metrics.md §4 "prompt").

A prompt replay runs the task with a semantically equivalent rewrite of its user input;
:func:`prompt_variants` makes the J rewrites (default J = 5) of one input. Two rewriters share the
:class:`PromptRewriter` interface:

- :class:`RuleRewriter` (built in, the default): deterministic, seeded, no network. Strengths:

  ``mild``
      synonym swaps from a small built-in table (each eligible word with probability 1/2, at least
      one), case kept (``Find`` -> ``Locate``).
  ``medium``
      clause reordering (``If X, Y.`` <-> ``Y if X.`` for if/when/once/after/before/because/
      since/unless/while — never after verbs like *check* or *ask* where ``if`` means *whether* —
      and ``Please X.`` <-> ``X, please.``; each reorderable sentence with probability 1/2, at
      least one), then ``mild``.
  ``strong``
      ``medium``, then a persona / politeness frame around the text (a sentence before it and,
      when the text ends with ``.``/``!``/``?``, sometimes one after it).
  ``naturalistic``
      (applied to the original, not on top of the others) abbreviations from a table
      (``please`` -> ``pls``, ``you`` -> ``u``, ``thanks`` -> ``thx`` …, each occurrence with
      probability 0.6), keyboard-neighbour typos (one character edit — QWERTY-neighbour
      substitution, adjacent transposition, deletion or doubling, never the first letter — in
      ``max(1, n_words // 8)`` words of three or more letters), and with probability 1/2 each a
      lower-cased first letter and a dropped final period. Each word changes at most once, so the
      Levenshtein distance to the input is at most the abbreviated characters + 2 per typo + 2.

- :class:`LLMRewriter`: an OpenAI-compatible chat-completions endpoint (off by default), with a
  per-cycle call budget and its token use and cost counted.

Protected tokens are never altered by the rule rewriter (and an LLM rewrite that alters them is
rejected): numbers and ids (any token holding a digit, ``_`` or ``-``), email addresses, URLs,
quoted strings (``"…"``, ``'…'``, ``“…”``) and code spans (`` `…` ``, fenced blocks). They keep
their exact text and count; clause reordering may move a whole clause with the tokens in it.
:func:`protected_tokens` lists them.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

import httpx

__all__ = [
    "LLMRewriter",
    "PROMPT_STRENGTHS",
    "PromptRewriter",
    "RewriteBudgetExceeded",
    "RewriteError",
    "RewriteRejected",
    "RewriteUnavailable",
    "RewriteUsage",
    "RuleRewriter",
    "prompt_variants",
    "protected_tokens",
]

PROMPT_STRENGTHS: Final[tuple[str, ...]] = ("mild", "medium", "strong", "naturalistic")


class RewriteError(Exception):
    """Base of the errors a rewriter raises."""


class RewriteBudgetExceeded(RewriteError):
    """The LLM rewriter's per-cycle call budget is used up; call ``new_cycle()`` for the next cycle."""


class RewriteUnavailable(RewriteError):
    """The LLM endpoint could not give a rewrite (network error, timeout, non-200 answer, malformed
    reply); the message says why. Retryable in a later cycle."""


class RewriteRejected(RewriteError):
    """The LLM answered, but its rewrite is unusable (empty, or it altered protected tokens)."""


@runtime_checkable
class PromptRewriter(Protocol):
    """Rewrites one user input into a semantically equivalent one."""

    def rewrite(self, text: str, *, seed: int, strength: str) -> str:
        """The rewrite of ``text`` at ``strength`` (one of :data:`PROMPT_STRENGTHS`) for ``seed``.

        Raises:
            ValueError: unknown strength. :class:`RewriteError` subclasses for rewriter failures.
        """
        ...


# ---------------------------------------------------------------------------- protected tokens

_PUA_BASE: Final = 0xF0000  # Supplementary Private Use Area-A: placeholders for protected spans
_PUA_MAX: Final = 0xFFFFD - _PUA_BASE
_SPAN_RE: Final = re.compile(
    r"```.*?```"                                           # fenced code
    r"|`[^`\n]+`"                                          # inline code
    r'|"[^"\n]*"|“[^”\n]*”'                                # double-quoted strings
    r"|(?<!\w)'[^'\n]+'(?!\w)"                             # single-quoted strings (not apostrophes)
    r"|(?:https?://|ftp://|www\.)[^\s<>\"'`]*[^\s<>\"'`.,;:!?)\]}]"  # URLs, trailing punctuation left out
    r"|(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+"           # email addresses (from a word start: linear)
    r"|[\U000F0000-\U0010FFFF]",                           # our placeholder range, if already in the text
    re.DOTALL,
)
_CHUNK_RE: Final = re.compile(r"[^\s\U000F0000-\U0010FFFF]+")
_LEAD: Final = "([{<\"'“‘¿¡"
_TRAIL: Final = ".,;:!?)]}>\"'”’…"
_IDLIKE: Final = re.compile(r"[\d_-]")


def _mask(text: str) -> tuple[str, list[str]] | None:
    """``text`` with every protected span replaced by one placeholder character, and the spans in
    placeholder order; None if there are too many spans to mask."""
    spans: list[str] = []

    def hold(s: str) -> str:
        spans.append(s)
        return chr(_PUA_BASE + len(spans) - 1)

    masked = _SPAN_RE.sub(lambda m: hold(m.group()), text)
    out: list[str] = []
    pos = 0
    for m in _CHUNK_RE.finditer(masked):
        chunk = m.group()
        start, end = 0, len(chunk)
        while start < end and chunk[start] in _LEAD:
            start += 1
        while end > start and chunk[end - 1] in _TRAIL:
            end -= 1
        core = chunk[start:end]
        if core and _IDLIKE.search(core):
            out.append(masked[pos:m.start() + start])
            out.append(hold(core))
            pos = m.start() + end
    out.append(masked[pos:])
    if len(spans) > _PUA_MAX:
        return None
    return "".join(out), spans


def _unmask(masked: str, spans: list[str]) -> str:
    return re.sub(r"[\U000F0000-\U000FFFFD]", lambda m: spans[ord(m.group()) - _PUA_BASE], masked)


def protected_tokens(text: str) -> list[str]:
    """The protected tokens of ``text`` in order of appearance: code spans, quoted strings, URLs,
    email addresses, then any other whitespace-separated token (leading/trailing punctuation
    stripped) holding a digit, ``_`` or ``-``."""
    masked = _mask(text)
    if masked is None:
        return [text]
    return masked[1]


# ---------------------------------------------------------------------------- rule tables

# Directional: a swap must fit every use of the word (``issue`` -> ``problem`` would break
# "issue a refund", so only ``problem`` -> ``issue``).
_SYNONYMS: Final[dict[str, tuple[str, ...]]] = {
    "find": ("locate",), "locate": ("find",), "check": ("verify",), "verify": ("check",),
    "buy": ("purchase",), "bought": ("purchased",), "purchased": ("bought",),
    "problem": ("issue",), "problems": ("issues",), "quickly": ("promptly", "fast"), "quick": ("fast",),
    "big": ("large",), "large": ("big",), "cheap": ("inexpensive",), "fix": ("repair",),
    "choose": ("select",), "select": ("choose",), "maybe": ("perhaps",), "perhaps": ("maybe",),
    "delivery": ("shipment",), "shipment": ("delivery",), "customer": ("client",), "client": ("customer",),
    "wrong": ("incorrect",), "incorrect": ("wrong",), "broken": ("damaged",), "damaged": ("broken",),
    "please": ("kindly",), "also": ("additionally",), "item": ("product",), "items": ("products",),
    "product": ("item",), "products": ("items",), "immediately": ("right away",), "receive": ("get",),
    "received": ("got",), "hi": ("hello",), "hello": ("hi",), "thanks": ("thank you",),
    "reservation": ("booking",), "booking": ("reservation",), "assist": ("help",), "require": ("need",),
    "obtain": ("get",), "display": ("show",), "modify": ("change",), "currently": ("right now",),
    "approximately": ("about",), "additional": ("extra",),
}

_ABBREVIATIONS: Final[dict[str, str]] = {
    "please": "pls", "thanks": "thx", "thank you": "ty", "you": "u", "your": "ur", "are": "r",
    "because": "bc", "about": "abt", "information": "info", "tomorrow": "tmrw", "message": "msg",
    "people": "ppl", "probably": "prob", "something": "smth", "without": "w/o",
    "as soon as possible": "asap", "by the way": "btw", "okay": "ok", "really": "rly",
    "though": "tho", "through": "thru", "minutes": "mins", "seconds": "secs", "account": "acct",
    "address": "addr", "quantity": "qty", "before": "bfr", "regards": "rgds", "know": "kno",
}
_ABBREV_RE: Final = re.compile(
    r"(?<![\w'])(" + "|".join(sorted((re.escape(k) for k in _ABBREVIATIONS), key=len, reverse=True)) + r")(?![\w'])",
    re.IGNORECASE,
)

_NEIGHBOURS: Final[dict[str, str]] = {
    "q": "wa", "w": "qeas", "e": "wrsd", "r": "etdf", "t": "ryfg", "y": "tugh", "u": "yihj",
    "i": "uojk", "o": "ipkl", "p": "ol", "a": "qwsz", "s": "awedxz", "d": "serfcx", "f": "drtgvc",
    "g": "ftyhbv", "h": "gyujnb", "j": "huikmn", "k": "jiolm", "l": "kop", "z": "asx", "x": "zsdc",
    "c": "xdfv", "v": "cfgb", "b": "vghn", "n": "bhjm", "m": "njk",
}

# A leading "If X, Y" clause can always move back; moving a trailing one to the front is done only
# for the subordinators below, whose trailing use is reliably adverbial ("when"/"while"/"once"
# trail as relative or noun uses too: "the date when…", "for a while").
_SUBORDINATORS: Final = ("if", "when", "once", "after", "before", "because", "since", "unless", "while")
_BACK_SUBORDINATORS: Final = ("if", "because", "unless", "before", "after")
# after these, "if" introduces an object clause ("check if it shipped" = whether) or a fixed
# phrase ("even if", "as if"): never move
_NO_MOVE_AFTER: Final = frozenset({
    "check", "see", "know", "ask", "tell", "wonder", "verify", "confirm", "determine", "me", "us",
    "sure", "out", "whether", "decide", "show", "find", "say", "remember", "understand", "learn",
    "even", "as", "only", "what", "day", "week", "month", "year", "time", "minutes", "hours", "days"})
# sentence-initial words safe to lower-case when a clause moves in front of them
_LOWERABLE: Final = frozenset({
    "please", "kindly", "refund", "cancel", "find", "locate", "check", "verify", "show", "display",
    "send", "tell", "book", "call", "give", "get", "fetch", "make", "help", "assist", "update",
    "change", "modify", "look", "ship", "add", "remove", "create", "delete", "list", "let",
    "notify", "email", "reply", "respond", "buy", "purchase", "order", "pay", "move", "open",
    "close", "reset", "set", "use", "try", "stop", "start", "begin", "keep", "mark", "escalate",
    "the", "a", "an", "my", "your", "our", "their", "it", "its", "we", "you", "they", "he", "she",
    "this", "that", "these", "those", "there", "can", "could", "would", "will", "should", "do",
    "don't", "just", "also", "then", "issue", "contact", "return", "replace", "apply", "schedule"})

_FRAMES: Final[tuple[tuple[str, str], ...]] = (
    ("Hi there! ", " Thanks a lot for your help."),
    ("Hello, I'm a customer and I could really use a hand. ", ""),
    ("As a busy small business owner, I would appreciate your help with the following. ", ""),
    ("Could you please help me with something? ", " Thank you!"),
    ("I'm in a bit of a hurry, so I would be grateful for a quick answer. ", ""),
    ("Good morning! I hope you can help me. ", " Many thanks."),
    ("I have been a loyal customer for years and I need your assistance. ", " I really appreciate it."),
    ("Sorry to bother you, but I have a request. ", " Thanks in advance!"),
)

_WORD_RE: Final = re.compile(r"(?<![\w'])[A-Za-z]+(?:'[A-Za-z]+)?(?![\w'])")
_PHRASE_SYN_RE: Final = re.compile(
    r"(?<![\w'])(" + "|".join(sorted((re.escape(w) for w in _SYNONYMS), key=len, reverse=True)) + r")(?![\w'])",
    re.IGNORECASE,
)


def _match_case(template: str, word: str) -> str:
    if len(template) > 1 and template.isupper():
        return word.upper()
    if template[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


def _rng(*parts: Any) -> random.Random:
    material = json.dumps(["relyscope.shadow.rewriters", *parts], separators=(",", ":"), ensure_ascii=True)
    return random.Random(int.from_bytes(hashlib.blake2b(material.encode(), digest_size=16).digest(), "big"))


def _pick_some(n: int, rng: random.Random, p: float = 0.5) -> set[int]:
    """Indices of ``range(n)`` each kept with probability ``p``, at least one when n > 0."""
    chosen = {i for i in range(n) if rng.random() < p}
    if n and not chosen:
        chosen.add(rng.randrange(n))
    return chosen


def _synonym_swaps(masked: str, rng: random.Random) -> str:
    matches = list(_PHRASE_SYN_RE.finditer(masked))
    chosen = _pick_some(len(matches), rng)
    out, pos = [], 0
    for i, m in enumerate(matches):
        if i in chosen:
            word = m.group()
            alt = rng.choice(_SYNONYMS[word.lower()])
            out += [masked[pos:m.start()], _match_case(word, alt)]
            pos = m.end()
    out.append(masked[pos:])
    return "".join(out)


def _cap_first(s: str) -> str:
    for i, c in enumerate(s):
        if c.isalpha():
            return s[:i] + c.upper() + s[i + 1:] if i == 0 else s
        if not c.isspace():
            return s
    return s


def _lower_first(s: str) -> str:
    m = re.match(r"[A-Za-z]+(?:'[A-Za-z]+)?", s)
    if m and m.group().lower() in _LOWERABLE and not m.group().isupper():
        return s[0].lower() + s[1:]
    if m and m.group() == "A":
        return "a" + s[1:]
    return s


_SUB_ALT: Final = "|".join(_SUBORDINATORS)
_FRONT_RE: Final = re.compile(rf"({_SUB_ALT})\s+([^,;:]+?),\s+([^,;:]+?)([.!?]*)", re.IGNORECASE)
_BACK_RE: Final = re.compile(rf"\s+({'|'.join(_BACK_SUBORDINATORS)})\s+", re.IGNORECASE)
_PLEASE_FRONT_RE: Final = re.compile(r"(Please),?\s+([^,;:?]+?)([.!]*)")
_PLEASE_BACK_RE: Final = re.compile(r"([^,;:?]+?),\s+please([.!]*)", re.IGNORECASE)


def _clause_options(sentence: str) -> list[str]:
    """Reordered versions of one sentence (no surrounding whitespace)."""
    opts: list[str] = []
    if m := _FRONT_RE.fullmatch(sentence):
        sub, cond, main, punct = m.groups()
        if sub[0].isupper() and "?" not in punct:
            opts.append(f"{_cap_first(main)} {sub.lower()} {cond}{punct}")
    body, punct = re.fullmatch(r"(.*?)([.!?]*)", sentence, re.DOTALL).groups()
    if "?" not in punct and "," not in body and ";" not in body and ":" not in body:
        for m in _BACK_RE.finditer(body):
            main, sub, cond = body[: m.start()], m.group(1), body[m.end():]
            words = main.split()
            short = sub.lower() in ("before", "after") and len(cond.split()) < 2  # "the day before yesterday"
            if len(words) >= 2 and words[-1].lower() not in _NO_MOVE_AFTER and cond.strip() and not short:
                opts.append(f"{sub[0].upper()}{sub[1:].lower()} {cond}, {_lower_first(main)}{punct}")
                break
    if m := _PLEASE_FRONT_RE.fullmatch(sentence):
        _, rest, punct = m.groups()
        opts.append(f"{_cap_first(rest)}, please{punct}")
    if m := _PLEASE_BACK_RE.fullmatch(sentence):
        rest, punct = m.groups()
        opts.append(f"Please {_lower_first(rest)}{punct}")
    return [o for o in opts if o != sentence]


def _reorder_clauses(masked: str, rng: random.Random) -> str:
    parts = re.split(r"((?<=[.!?])\s+|\n+)", masked)
    candidates = []
    for i in range(0, len(parts), 2):
        core = parts[i].strip()
        if core and (opts := _clause_options(core)):
            candidates.append((i, opts))
    for k in _pick_some(len(candidates), rng):
        i, opts = candidates[k]
        lead = parts[i][: len(parts[i]) - len(parts[i].lstrip())]
        trail = parts[i][len(parts[i].rstrip()):]
        parts[i] = lead + rng.choice(opts) + trail
    return "".join(parts)


def _frame(masked: str, rng: random.Random) -> str:
    prefix, suffix = rng.choice(_FRAMES)
    body = masked.strip()
    out = prefix + body
    if suffix and body[-1:] in ".!?" and "thank" not in body[-40:].lower():
        out += suffix
    return out


def _typo(word: str, rng: random.Random) -> str:
    i = rng.randrange(1, len(word))
    c = word[i]
    kind = rng.choice(("neighbour", "swap", "drop", "double"))
    if kind == "neighbour" and c.lower() in _NEIGHBOURS:
        n = rng.choice(_NEIGHBOURS[c.lower()])
        return word[:i] + (n.upper() if c.isupper() else n) + word[i + 1:]
    if kind == "swap" and i + 1 < len(word) and word[i + 1] != c:
        return word[:i] + word[i + 1] + c + word[i + 2:]
    if kind == "swap" and word[i - 1] != c and i - 1 >= 1:
        return word[: i - 1] + c + word[i - 1] + word[i + 1:]
    if kind == "drop" or not c.isalpha():
        return word[:i] + word[i + 1:]
    return word[:i] + c + c + word[i + 1:]


def _naturalistic(masked: str, rng: random.Random) -> str:
    # abbreviations first; the words they touch are then out of reach for typos
    touched: list[tuple[int, int]] = []
    out, pos = [], 0
    for m in _ABBREV_RE.finditer(masked):
        if rng.random() < 0.6:
            abbr = _match_case(m.group(), _ABBREVIATIONS[m.group().lower()])
            out += [masked[pos:m.start()], abbr]
            start = sum(len(x) for x in out) - len(abbr)
            touched.append((start, start + len(abbr)))
            pos = m.end()
    out.append(masked[pos:])
    text = "".join(out)
    words = [m for m in _WORD_RE.finditer(text)
             if len(m.group()) >= 3 and "'" not in m.group()
             and not any(a < m.end() and m.start() < b for a, b in touched)]
    n_words = len(_WORD_RE.findall(text))
    if words:
        n_typos = min(len(words), max(1, n_words // 8))
        picks = sorted(rng.sample(range(len(words)), n_typos), reverse=True)
        for k in picks:
            m = words[k]
            text = text[: m.start()] + _typo(m.group(), rng) + text[m.end():]
    first = re.match(r"\s*([A-Z][A-Za-z]*)", text)
    can_lower = bool(first) and first.group(1) != "I" and not (len(first.group(1)) > 1 and first.group(1).isupper())
    can_drop = re.search(r"[A-Za-z\U000F0000-\U000FFFFD]\.$", text) is not None
    lower, drop = rng.random() < 0.5, rng.random() < 0.5
    if text == masked and not (lower and can_lower) and not (drop and can_drop):
        # nothing changed yet (only short words): make sure at least one casual edit happens
        lower, drop = can_lower, not can_lower
    if lower and can_lower:
        j = first.start(1)
        text = text[:j] + text[j].lower() + text[j + 1:]
    if drop and can_drop:
        text = text[:-1]
    return text


def _check_args(text: str, seed: int, strength: str) -> None:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if strength not in PROMPT_STRENGTHS:
        raise ValueError(f"unknown prompt strength {strength!r}; expected one of {list(PROMPT_STRENGTHS)}")


class RuleRewriter:
    """The built-in deterministic rule-based rewriter (strengths in the module docstring).

    Pure: same ``text``, ``seed`` and ``strength`` give the same rewrite; no I/O; safe from any
    thread. A text with nothing rewritable (only protected tokens, or empty) comes back unchanged.
    """

    def rewrite(self, text: str, *, seed: int, strength: str) -> str:
        """The rewrite of ``text``.

        Raises:
            ValueError: unknown ``strength``. TypeError: ``text`` not a str or ``seed`` not an int.
        """
        _check_args(text, seed, strength)
        masked_spans = _mask(text)
        if masked_spans is None or not text.strip():
            return text
        masked, spans = masked_spans
        rng = _rng(seed, strength, text)
        if strength == "naturalistic":
            out = _naturalistic(masked, rng)
        else:
            out = masked
            if strength in ("medium", "strong"):
                out = _reorder_clauses(out, rng)
            out = _synonym_swaps(out, rng)
            if strength == "strong":
                out = _frame(out, rng)
        return _unmask(out, spans)


# ---------------------------------------------------------------------------- LLM rewriter

_LLM_INSTRUCTIONS: Final[dict[str, str]] = {
    "mild": "Paraphrase the user's message lightly: replace a few words with synonyms and keep the sentence structure.",
    "medium": "Paraphrase the user's message: reorder its clauses and use synonyms.",
    "strong": "Rewrite the user's message the way a different person would ask it, adding a persona or "
              "politeness framing, while keeping every request and fact.",
    "naturalistic": "Rewrite the user's message as a hurried person typing on a phone would: casual tone, "
                    "a few typos and common abbreviations.",
}
_LLM_RULES: Final = (
    "The rewrite must ask for exactly the same thing as the original. Keep numbers, identifiers, "
    "email addresses, URLs, quoted strings and code spans exactly as written. "
    "Answer with the rewritten message only."
)


@dataclass(frozen=True, slots=True)
class RewriteUsage:
    """Usage of an :class:`LLMRewriter` in one cycle.

    Attributes:
        calls: requests sent (successful or not); the budget counts these.
        failed_calls: requests that gave no usable reply (network error, timeout, non-200,
            malformed reply).
        input_tokens / output_tokens: sums of ``usage.prompt_tokens`` / ``usage.completion_tokens``
            over answered calls; None (unknown) once an answered call carried no usage. Failed calls
            add no tokens.
        cost_usd: from the tokens and the configured prices per 1k tokens; None when a price is
            not configured or the tokens are unknown — never 0 for unknown.
    """

    calls: int
    failed_calls: int
    input_tokens: int | None
    output_tokens: int | None
    cost_usd: float | None


def _check_price(name: str, v: float | None) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0 (USD per 1k tokens) or None, got {v!r}")
    return float(v)


class LLMRewriter:
    """Rewrites through an OpenAI-compatible ``POST {base_url}/chat/completions`` (httpx).

    Args:
        base_url: API root including any version prefix, e.g. ``http://127.0.0.1:8000/v1``.
        model: model name sent as ``model``.
        api_key: sent as ``Authorization: Bearer …`` when given.
        max_calls_per_cycle: requests allowed per cycle (>= 0); past it :meth:`rewrite` raises
            :class:`RewriteBudgetExceeded` without sending anything. :meth:`new_cycle` resets.
        timeout_s: seconds for the whole request (connect, write, read) (> 0).
        price_per_1k_input_tokens / price_per_1k_output_tokens: USD per 1000 prompt / completion
            tokens; with either missing, ``cost_usd`` is None (unknown).
        temperature: sampling temperature sent with each request.

    Each request carries the system instruction for the strength, the text as the user message,
    ``temperature`` and ``seed`` (honoured by endpoints that support it). No retries: a failure
    raises :class:`RewriteUnavailable` and the caller decides. Counters are per cycle and
    thread-safe; close the HTTP client with :meth:`close` (or use the instance as a context manager).

    Raises:
        ValueError: invalid arguments.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        max_calls_per_cycle: int = 20,
        timeout_s: float = 10,
        price_per_1k_input_tokens: float | None = None,
        price_per_1k_output_tokens: float | None = None,
        temperature: float = 0.7,
    ) -> None:
        if not isinstance(base_url, str) or not re.match(r"https?://[^/\s]+", base_url):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ValueError("model must be a non-empty string")
        if isinstance(max_calls_per_cycle, bool) or not isinstance(max_calls_per_cycle, int) or max_calls_per_cycle < 0:
            raise ValueError(f"max_calls_per_cycle must be an int >= 0, got {max_calls_per_cycle!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                or not math.isfinite(timeout_s) or timeout_s <= 0:
            raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
            raise ValueError(f"temperature must be in [0, 2], got {temperature!r}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.max_calls_per_cycle = max_calls_per_cycle
        self.timeout_s = float(timeout_s)
        self.temperature = float(temperature)
        self._price_in = _check_price("price_per_1k_input_tokens", price_per_1k_input_tokens)
        self._price_out = _check_price("price_per_1k_output_tokens", price_per_1k_output_tokens)
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(timeout=self.timeout_s, headers=headers)
        self._lock = threading.Lock()
        self._calls = 0
        self._failed = 0
        self._in: int | None = 0
        self._out: int | None = 0

    # counters ---------------------------------------------------------------------------------

    def usage(self) -> RewriteUsage:
        """Snapshot of the current cycle's usage."""
        with self._lock:
            return self._usage_locked()

    def _usage_locked(self) -> RewriteUsage:
        cost = None
        if self._price_in is not None and self._price_out is not None and self._in is not None \
                and self._out is not None:
            cost = self._in / 1000 * self._price_in + self._out / 1000 * self._price_out
        return RewriteUsage(self._calls, self._failed, self._in, self._out, cost)

    @property
    def calls(self) -> int:
        """Requests sent in the current cycle."""
        return self.usage().calls

    @property
    def input_tokens(self) -> int | None:
        """Prompt tokens of the current cycle, or None when unknown."""
        return self.usage().input_tokens

    @property
    def output_tokens(self) -> int | None:
        """Completion tokens of the current cycle, or None when unknown."""
        return self.usage().output_tokens

    @property
    def cost_usd(self) -> float | None:
        """Cost of the current cycle in USD, or None when unknown."""
        return self.usage().cost_usd

    def new_cycle(self) -> RewriteUsage:
        """Start a new cycle: reset the budget and counters; returns the usage of the cycle that ended."""
        with self._lock:
            ended = self._usage_locked()
            self._calls, self._failed, self._in, self._out = 0, 0, 0, 0
            return ended

    # lifecycle ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the HTTP client. Safe to call twice."""
        self._client.close()

    def __enter__(self) -> LLMRewriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # rewriting ----------------------------------------------------------------------------------

    def request_body(self, text: str, *, seed: int, strength: str) -> dict[str, Any]:
        """The chat-completions request body for one rewrite."""
        _check_args(text, seed, strength)
        return {
            "model": self.model,
            "messages": [
                {"role": "system", "content": f"{_LLM_INSTRUCTIONS[strength]} {_LLM_RULES}"},
                {"role": "user", "content": text},
            ],
            "temperature": self.temperature,
            "seed": seed,
            "n": 1,
        }

    def rewrite(self, text: str, *, seed: int, strength: str) -> str:
        """One rewrite from the endpoint.

        Raises:
            ValueError / TypeError: bad arguments (nothing sent).
            RewriteBudgetExceeded: the cycle's budget is used up (nothing sent).
            RewriteUnavailable: network error, timeout, non-200 answer or malformed reply.
            RewriteRejected: an empty rewrite, or one that altered protected tokens.
        """
        body = self.request_body(text, seed=seed, strength=strength)
        with self._lock:
            if self._calls >= self.max_calls_per_cycle:
                raise RewriteBudgetExceeded(
                    f"LLM rewriter budget of {self.max_calls_per_cycle} calls per cycle is used up")
            self._calls += 1
        try:
            resp = self._client.post(self.url, json=body)
        except httpx.HTTPError as exc:
            self._fail()
            raise RewriteUnavailable(f"POST {self.url} failed: {type(exc).__name__}: {exc}") from exc
        if resp.status_code != 200:
            self._fail()
            raise RewriteUnavailable(f"POST {self.url} answered HTTP {resp.status_code}: {resp.text[:200]!r}")
        try:
            reply = resp.json()
            content = reply["choices"][0]["message"]["content"]
            if not isinstance(content, str):
                raise TypeError("content is not a string")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            self._fail()
            raise RewriteUnavailable(f"POST {self.url} gave a malformed chat-completions reply: {exc!r}") from exc
        self._count_usage(reply.get("usage") if isinstance(reply, dict) else None)
        out = content.strip()
        if len(out) >= 2 and out[0] == out[-1] == '"' and not text.lstrip().startswith('"'):
            out = out[1:-1].strip()
        if not out:
            raise RewriteRejected("the LLM returned an empty rewrite")
        before, after = Counter(protected_tokens(text)), Counter(protected_tokens(out))
        if before != after:
            raise RewriteRejected(f"the LLM rewrite altered protected tokens: lost {sorted(before - after)}, "
                                  f"added {sorted(after - before)}")
        return out

    def _fail(self) -> None:
        with self._lock:
            self._failed += 1

    def _count_usage(self, usage: Any) -> None:
        def tokens(key: str) -> int | None:
            v = usage.get(key) if isinstance(usage, dict) else None
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

        t_in, t_out = tokens("prompt_tokens"), tokens("completion_tokens")
        with self._lock:
            self._in = None if self._in is None or t_in is None else self._in + t_in
            self._out = None if self._out is None or t_out is None else self._out + t_out


# ---------------------------------------------------------------------------- variants


def _child_seed(seed: int, i: int) -> int:
    material = json.dumps(["relyscope.shadow.prompt_variants", seed, i], separators=(",", ":"))
    return int.from_bytes(hashlib.blake2b(material.encode(), digest_size=8).digest(), "big") >> 1


def prompt_variants(
    text: str,
    *,
    j: int = 5,
    seed: int,
    strength: str,
    rewriter: PromptRewriter,
    max_attempts: int | None = None,
) -> list[str]:
    """``j`` rewrites of ``text`` (metrics.md §4: J = 5 by default), distinct where possible.

    Attempt ``i`` asks ``rewriter`` with a seed derived from ``(seed, i)`` (BLAKE2b, 63 bits),
    keeping rewrites that differ from ``text`` and from the ones already kept, for at most
    ``max_attempts`` attempts (default ``3 * j``). If fewer than ``j`` distinct rewrites turn up,
    the kept ones are repeated in order; if none differs from ``text`` (nothing rewritable), the
    list holds ``text`` ``j`` times.

    Returns:
        a list of exactly ``j`` strings.

    Raises:
        ValueError: ``j`` < 1, ``max_attempts`` < 1, unknown strength.
        RewriteError: whatever ``rewriter`` raises (e.g. :class:`RewriteBudgetExceeded`).
    """
    if isinstance(j, bool) or not isinstance(j, int) or j < 1:
        raise ValueError(f"j must be an int >= 1, got {j!r}")
    attempts = 3 * j if max_attempts is None else max_attempts
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
    _check_args(text, seed, strength)
    kept: list[str] = []
    for i in range(attempts):
        if len(kept) == j:
            break
        out = rewriter.rewrite(text, seed=_child_seed(seed, i), strength=strength)
        if out != text and out not in kept:
            kept.append(out)
    if not kept:
        return [text] * j
    return [kept[i % len(kept)] for i in range(j)]
