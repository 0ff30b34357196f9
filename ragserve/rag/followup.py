"""Follow-up questions: what to retrieve with when the newest user turn refers to earlier ones.

"How do I set it up?" says nothing about *what* to set up: its embedding is close to no document,
and its content words match every setup guide. The earlier user turns name the subject, but joined
whole to the question they outweigh it: after "What is Flask?", the join "What is Flask? How do I
set it up?" is mostly a question about what Flask is, and finds the overview again.

So the retrieval query of a follow-up is the newest turn plus the *salient terms* of the earlier
user turns (``followup_query``): their code identifiers and names, then their other content words,
newest earlier turn first, a few of them (``FOLLOWUP_TERMS``), never their whole text. Only a turn
that refers back gets them (``refers_back``): one with a pronoun that points at something said
before ("it", "them", "its", "this", "one"), one that continues an earlier question ("And on
Windows?", "What about the default?") or one too short to have a subject of its own ("Why?"). A
turn that names its own subject and does not refer back is a new topic and is retrieved alone: the
old topic must not pull its sources back in. Deterministic, no model call, linear in what it reads
(at most ``MAX_TURN_CHARS`` of each turn, the ``MAX_PREVIOUS_TURNS`` newest earlier turns). It reads
English: a turn in another language (or script) finds no English pronoun or continuation, and is
retrieved alone. A rewrite by the generator (``query_rewrite: llm``) is the optional, costlier
alternative; ``rewrite_messages`` is its prompt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ragserve.api.messages import message_text
from ragserve.rag.evidence import QUESTION_WORDS
from ragserve.store.lexical import STOPWORDS

REWRITE_INSTRUCTIONS = (
    "Rewrite the user's last question as one standalone question that can be understood without the "
    "conversation: replace pronouns and references with what they refer to. Reply with the question only."
)
#: What the rewrite sees of the conversation: the newest messages, each cut to this many characters.
REWRITE_MESSAGES = 6
REWRITE_CHARS = 600
REWRITE_MAX_TOKENS = 64

#: How many salient terms of earlier turns a follow-up's retrieval query gets (the setting
#: ``followup_terms`` has its own default; this is the pure function's).
FOLLOWUP_TERMS = 4
#: What is read of each turn: a follow-up that refers back is short, and what names a subject is
#: in the first sentences of a turn; the rest of a megabyte turn is never scanned.
MAX_TURN_CHARS = 2000
#: A newest turn longer than this names its own subject (and is retrieved alone).
MAX_REFERRING_CHARS = 400
#: The earlier user turns read for terms, newest first.
MAX_PREVIOUS_TURNS = 4
#: A term longer than this is not a word (a run of a script written without spaces, a hash).
MAX_TERM_CHARS = 40


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Pronouns and determiners that point back at something said before. "that" is one only where it
# does not introduce a clause ("make sure that ..."): see ``_CLAUSE_THAT``.
_REFERRING = _words(
    "it its it's itself they them their theirs themselves this these those that one ones he him his she her"
)
# Words after which "that" starts a clause rather than pointing back.
_CLAUSE_THAT = _words(
    "sure so such know think mean means say says said ensure check given now than possible true"
    " way fact case error is are was were"
)
# A copula after which "that" is a pronoun when it asks ("Is that supported?", "Why is that slow?"),
# a clause when it states ("the problem is that ...").
_COPULAS = _words("is are was were")
_WH = _words("what why how where when which who whose")
# What follows a "this" or "these" that points ahead, at what the turn quotes ("this error: ...",
# "What does this code do: ..."): at most two words, then a colon.
_AHEAD = re.compile(r"(?: [\w.\-']+){0,2} ?:")
# How a turn that continues an earlier question starts ("And on Windows?", "What about ...?").
_CONTINUATIONS = (
    "and ",
    "or ",
    "but ",
    "also ",
    "then ",
    "what about ",
    "how about ",
    "what if ",
    "same ",
    "and?",
    "why?",
    "how?",
)
# A comma after a turn's first word ("And, on Windows?", "Also, what about ..."): read as a space.
_LEADING_COMMA = re.compile(r"^(\w+),")
# A turn that asks what its one word is ("What are blueprints?", "what is celery?", "What's a
# virtualenv?") names a new subject, capitalised or not; "What is the default?" asks about the old one.
_DEFINITION = re.compile(r"(?:what|who)(?:'s| is| are)(?: an?)? ([\w.\-']+) ?[?.!]*")
# Verbs and nouns that say what is asked, not what about: never salient.
_GENERIC = _words(
    "set setup run runs running start configure configured install installed put add apply call"
    " thing stuff something anything way work do does"
)
# The last code point of the Latin script's blocks (Basic Latin to Latin Extended-B).
_LATIN_END = 0x24F
# A word of a turn: letters, digits, underscores, joined by "." or "-" ("app.config", "class-based").
_TOKEN = re.compile(r"\w+(?:[.\-'\u2019]\w+)*")
# What a contraction ends with ("I'm", "doesn't", "we'll"): it is no content word (a possessive's
# "s" is: "Flask's").
_CONTRACTED = _words("m ve ll d re t")


def previous_user_turns(history: Sequence[dict[str, Any]]) -> list[str]:
    """The texts of the earlier user turns, newest first."""
    return [t for m in reversed(history) if m.get("role") == "user" and (t := message_text(m).strip())]


def _content(word: str, generic: frozenset[str] = _GENERIC) -> bool:
    """Whether ``word`` says what a turn is about: not a stopword, not a word of how a question
    is asked (``QUESTION_WORDS``), not one of ``generic``, not a number or a letter."""
    w = word.lower().replace("\u2019", "'")
    if ("'" in w and w.rsplit("'", 1)[1] in _CONTRACTED) or (w.endswith("'s") and w[:-2] in STOPWORDS):
        return False  # "doesn't", "I'm"; "what's", "that's"
    return len(w) > 1 and w not in STOPWORDS and w not in QUESTION_WORDS and w not in generic and not w.isdigit()


def _latin(word: str) -> bool:
    """Whether ``word`` has a letter and is written in the Latin script (accents included): a
    term of another script is left out, so a conversation in it degrades to the newest turn alone
    rather than carrying a run of characters this reading cannot split into words."""
    return any(ch.isalpha() for ch in word) and all(ord(ch) <= _LATIN_END for ch in word if ch.isalpha())


def refers_back(query: str) -> bool:
    """Whether the newest turn ``query`` needs an earlier turn to say what it is about: it has a
    pronoun that points back ("How do I set it up?"), it continues an earlier question ("And on
    Windows?", "What about the default?"), or it has at most one content word of its own and that
    is no name ("Why?", "Example?", but not "What is Gunicorn?") nor what the turn asks the meaning
    of ("What are blueprints?", "what is celery?"). "one" before a content word is a number ("more
    than one worker"), and "this" before a colon points at what follows ("I get this error:
    ..."), not back. A turn longer than ``MAX_REFERRING_CHARS`` names its own
    subject."""
    text = query.strip()
    if len(text) > MAX_REFERRING_CHARS:
        return False
    lower = " ".join(text.lower().replace("\u2019", "'").split())
    if _LEADING_COMMA.sub(r"\1", lower, count=1).startswith(_CONTINUATIONS):
        return True
    found = list(_TOKEN.finditer(lower))
    words = [m.group() for m in found]
    for i, w in enumerate(words):
        if w not in _REFERRING or (w == "that" and i > 0 and _opens_clause(words, i)):
            continue
        if w in ("this", "these") and _AHEAD.match(lower, found[i].end()):
            continue  # "I get this error: ...": the turn says what it is
        if w == "one" and i + 1 < len(words) and _content(words[i + 1], frozenset()):
            continue  # a number before its noun ("more than one worker"), not "which one"
        return True
    if not any(ch.isalpha() for ch in text):
        return False  # punctuation, digits: nothing to continue
    if not all(w.isascii() for w in words) or sum(_content(w, frozenset()) for w in words) > 1:
        return False
    if (m := _DEFINITION.fullmatch(lower)) and _content(m.group(1), frozenset()):
        return False  # "What are blueprints?": it asks what its word is
    return not _salience(text, names_only=True)  # "What is Gunicorn?": one word, and a name


def _opens_clause(words: list[str], i: int) -> bool:
    """Whether ``words[i]``, a "that" after another word, opens a clause ("make sure that ...")
    rather than points back: not after a copula that starts a question ("Is that safe?", "What is
    that error?")."""
    before = words[i - 1]
    if before not in _CLAUSE_THAT:
        return False
    return not (before in _COPULAS and (i == 1 or words[i - 2] in _WH))


def _salience(text: str, names_only: bool = False) -> list[str]:
    """The salient terms of one earlier turn, best first, each once: code identifiers
    (``app.config``, ``MAX_CONTENT_LENGTH``, ``as_view``), then names (a capital inside, an
    acronym, a capitalised word that does not start a sentence), then (unless ``names_only``) the
    other content words, each group in the order written. Read from its first ``MAX_TURN_CHARS``."""
    text = text[:MAX_TURN_CHARS]
    code: list[str] = []
    named: list[str] = []
    other: list[str] = []
    for m in _TOKEN.finditer(text):
        w = m.group().strip("'\u2019-.")
        if not w or len(w) > MAX_TERM_CHARS or not _content(w) or not _latin(w):
            continue
        if "." in w and all(len(part) == 1 for part in w.split(".")):
            continue  # an abbreviation ("e.g", "i.e", "U.S"), not a code identifier
        before = text[max(0, m.start() - 3) : m.start()].rstrip()
        starts = not before or before[-1] in ".?!:;\n\"'(`*"
        if "_" in w or "." in w or (m.end() < len(text) and text[m.end()] == "("):
            code.append(w)
        elif (w.isupper() and len(w) > 1) or any(c.isupper() for c in w[1:]) or (w[0].isupper() and not starts):
            named.append(w)
        else:
            other.append(w)
    seen: set[str] = set()
    out = []
    for w in (*code, *named, *([] if names_only else other)):
        if w.lower() not in seen:
            seen.add(w.lower())
            out.append(w)
    return out


def _newest_assistant_text(history: Sequence[dict[str, Any]]) -> str:
    for m in reversed(history):
        if m.get("role") == "assistant":
            return message_text(m)
    return ""


def salient_terms(query: str, history: Sequence[dict[str, Any]], max_terms: int = FOLLOWUP_TERMS) -> list[str]:
    """What a follow-up ``query`` is about, from the conversation before it (``history``): up to
    ``max_terms`` salient terms (``_salience``) of the earlier user turns, newest turn's first (the
    ``MAX_PREVIOUS_TURNS`` newest), then up to half as many code identifiers and names of the newest
    assistant turn (what "it" may point at when the answer named it: "Use Waitress." "How do I
    install it?"; its other words are the model's, not the user's subject). Words ``query`` already
    has are left out."""
    have = {w.lower() for w in _TOKEN.findall(query[:MAX_TURN_CHARS])}

    def pick(words: list[str], room: int, out: list[str]) -> None:
        for w in words:
            if room <= 0:
                return
            if w.lower() not in have:
                have.add(w.lower())
                out.append(w)
                room -= 1

    terms: list[str] = []
    for turn in previous_user_turns(history)[:MAX_PREVIOUS_TURNS]:
        pick(_salience(turn), max_terms - len(terms), terms)
    if max_terms > 0:
        pick(_salience(_newest_assistant_text(history), names_only=True), max(1, max_terms // 2), terms)
    return terms


def followup_query(query: str, history: Sequence[dict[str, Any]], max_terms: int = FOLLOWUP_TERMS) -> str | None:
    """The retrieval query of a follow-up: ``query`` (the newest user turn) followed, in
    parentheses, by the salient terms of the conversation before it (``salient_terms``), when it
    ``refers_back`` and there are some; None when it stands alone (a first question, a new topic)
    or nothing is to add. "How do I set it up?" after "What is Flask?" is "How do I set it up?
    (Flask ...)": the question's own words keep its intent, the terms say what "it" is."""
    if max_terms <= 0 or not refers_back(query):
        return None
    terms = salient_terms(query, history, max_terms)
    if not terms:
        return None
    return f"{query.strip()} ({' '.join(terms)})"


def rewrite_messages(history: Sequence[dict[str, Any]], query: str) -> list[dict[str, str]]:
    """The prompt asking the generator for a standalone version of ``query``."""
    lines = []
    for m in list(history)[-REWRITE_MESSAGES:]:
        if m.get("role") in ("user", "assistant"):
            text = message_text(m).strip()
            if text:
                lines.append(f"{m['role'].capitalize()}: {text[:REWRITE_CHARS]}")
    transcript = "\n".join(lines)
    return [
        {"role": "system", "content": REWRITE_INSTRUCTIONS},
        {
            "role": "user",
            "content": f"Conversation:\n{transcript}\n\nLast question: {query[:REWRITE_CHARS]}\n\nStandalone question:",
        },
    ]
