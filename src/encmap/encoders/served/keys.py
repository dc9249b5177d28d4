"""The API key stays out of every message, record and file: read and checked before any request,
and redacted from whatever a server says.

The key is read from the environment variable ``api_key_env`` names, at call time
(:func:`api_key`), and never reaches params, an artifact, a log or the page. Refused before any
request, the key never repeated: a key variable that is not set, not a variable's name (a key
written there), or a key the HTTP layer cannot send (a stray CR, LF or space, a character beyond
Latin-1); a ``base_url`` that holds a key. A refusal holds a status code and a fixed reason:
whatever a server says goes, normalised and :func:`redact`-ed of the key, to stderr only (the
terminal, the job's log: :func:`said`), never into a refusal that reaches failure records,
placeholder artifacts or DVC's cache.
"""

from __future__ import annotations

import os
import re
import sys

from ...validation import EncmapError

#: Characters of the API key in a row that are redacted wherever they appear, in any case and
#: spelling (:func:`redact`). A piece of 8 characters of a random key occurs by chance in an
#: ordinary message about once in 10^12 places (62^8 ~ 2e14), so nothing but the key is hidden;
#: a piece left behind has at most 7 characters (42 bits of a key with 128 or more random bits, no
#: foothold for guessing the rest). The public prefix of OpenAI's project keys is 8 and is hidden too.
KEY_PIECE = 8
#: Characters of a server's words quoted on the terminal and in the job's log (never in an artifact).
QUOTE_CHARS = 2000


def api_key(model: str, spec: dict) -> str:
    """The key, from the environment variable the entry names; an error naming the variable, or
    saying (never repeating it) that ``base_url`` holds a key."""
    from ..variants import base_url_problem

    problem = base_url_problem(spec["base_url"], spec["api_key_env"])  # the entry may come from no params file
    if problem:
        raise EncmapError(f"model {model!r}: base_url {problem}")
    var = spec["api_key_env"]
    check_key_env(model, var)
    key = os.environ.get(var)
    if not key:
        raise EncmapError(f"model {model!r}: the environment variable {var} (api_key_env) that holds its API key is "
                          "not set; export it before the run")
    check_key_form(model, var, key)
    check_key_not_in_url(model, spec, key)
    return key


def check_key_env(model: str, var: str) -> None:
    """``api_key_env`` must be a variable's name; a key written there is refused without repeating it."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", var or ""):
        raise EncmapError(f"model {model!r}: api_key_env is not the name of an environment variable (letters, digits "
                          "and _ only; it may be the key itself, which belongs in that variable: it is not repeated "
                          "here); e.g. api_key_env: OPENAI_API_KEY")


def check_key_form(model: str, var: str, key: str) -> None:
    """A key the HTTP layer cannot send (a stray CR, LF, space or tab from a CRLF .env or a bad paste,
    a character beyond Latin-1 such as an ellipsis) is refused here, naming its variable, before any
    request: the client refuses it locally, and the retries then read as a server that never answered."""
    problems = [what for what, bad in (("a carriage return (a CRLF .env file?)", "\r" in key),
                                       ("a line break", "\n" in key),
                                       ("white space", any(c in key for c in " \t\v\f")),
                                       ("a character an HTTP header cannot carry (beyond Latin-1, e.g. …)",
                                        any(ord(c) > 255 for c in key)),
                                       ("a control character", any(ord(c) < 32 or 127 <= ord(c) < 160
                                                                   for c in key if c not in "\r\n\t\v\f")))
                if bad]
    if problems:
        raise EncmapError(f"model {model!r}: the API key in ${var} is malformed: it holds {', '.join(problems)}; "
                          "fix the variable (the key is not repeated here); nothing was sent")


def check_key_not_in_url(model: str, spec: dict, key: str) -> None:
    """Refuse a ``base_url`` that holds the key (any of the spellings :func:`redact` hides, in its
    path too), without repeating either: the URL reaches every artifact's provenance."""
    if redact(spec["base_url"], key) != spec["base_url"]:
        raise EncmapError(f"model {model!r}: base_url holds the API key (the value of ${spec['api_key_env']}); a "
                          "key belongs only in the environment variable api_key_env names, never in the URL, which "
                          "reaches every artifact's provenance, DVC's cache and the logs (it is not repeated here)")


def _key_spellings(key: str) -> set[str]:
    """Every run of :data:`KEY_PIECE` characters of ``key`` as a server may echo it, lower-cased:
    as is, percent-encoded (each byte, or as ``quote`` / ``quote_plus`` leave it), and the base64
    characters (standard and url-safe) that the run alone decides at each of the 3 alignments a
    longer encoded string (``Basic base64(user:key)``) may give it."""
    import base64
    from urllib.parse import quote, quote_plus

    out: set[str] = set()
    for i in range(len(key) - KEY_PIECE + 1):
        w = key[i:i + KEY_PIECE]
        b = w.encode("utf-8", "surrogatepass")
        out |= {w, quote(w, safe=""), quote_plus(w, safe=""), "".join(f"%{x:02x}" for x in b)}
        for o in range(3):  # after o other bytes: characters ceil(8o/6) to floor(8(o+len)/6) are the run's alone
            core = base64.b64encode(bytes(o) + b).decode()[-(-8 * o // 6):8 * (o + len(b)) // 6]
            out |= {core, core.translate(str.maketrans("+/", "-_"))}
    return {x.lower() for x in out}


def redact(text: str, key: str | None) -> str:
    """``text`` (a server's words, an exception's) with the API key and any bearer token replaced:
    a server may echo the Authorization header ("Incorrect API key provided: Bearer sk-..."), or the
    bare key cut short, upper-cased, percent- or base64-encoded, and a refusal's text goes to logs,
    failure records and DVC's cache. Every run of :data:`KEY_PIECE` or more of the key's characters,
    in any of those spellings and any case, is replaced; a key shorter than that (a local server's
    "EMPTY") only as written."""
    if key:
        text = text.replace(key, "[redacted]")
    if key and len(key) >= KEY_PIECE:
        # Lower-cased character by character, so that positions stay those of text.
        low = "".join(c.lower() if len(c.lower()) == 1 else c for c in text)
        hidden = bytearray(len(text))
        for form in _key_spellings(key):
            at = low.find(form)
            while at >= 0:
                hidden[at:at + len(form)] = b"\1" * len(form)
                at = low.find(form, at + 1)
        if any(hidden):
            text = "".join("[redacted]" if m.group()[0] else text[m.start():m.end()]
                           for m in re.finditer(rb"\x01+|\x00+", bytes(hidden)))
    return re.sub(r"(?i)\bBearer\s+[^\s\"',;]+", "Bearer [redacted]", text)


def normalise(text: str) -> str:
    """A server's words as a reader sees them, before :func:`redact` looks for the key: HTML entities
    (``&#x73;``) and escapes (``\\u0073``, ``\\x73``, ``%73``) decoded, invisible characters (zero-width
    spaces, joiners, direction marks: Unicode's format and control characters but line breaks and tabs)
    dropped."""
    import html
    import unicodedata
    from urllib.parse import unquote

    for _ in range(3):  # an entity of an escape, an escape of an entity: until nothing changes
        was = text
        text = html.unescape(text)
        text = re.sub(r"\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})",
                      lambda m: chr(int(m.group(1) or m.group(2), 16)), text)
        text = unquote(text)
        if text == was:
            break
    return "".join(c for c in text if c in "\n\t" or unicodedata.category(c) not in ("Cf", "Cc", "Co", "Cs", "Zl", "Zp"))


def said(where: str, words: str, key: str | None) -> None:
    """A server's words, normalised, redacted and cut to :data:`QUOTE_CHARS`, on stderr: the terminal
    and the job's log. Never in a refusal's text, which reaches failure records, placeholder
    artifacts, the feature matrix's records and DVC's cache: those hold a status code and a fixed
    reason, however a server spells a key it echoes (hex, base32, reversed...)."""
    print(f"encmap: {where}; the server said: {_quote(normalise(words), QUOTE_CHARS, key)}", file=sys.stderr)


def _quote(text: str, n: int, key: str | None) -> str:
    """The first ``n`` characters of ``text`` with the key redacted first: a copy cut before it is
    redacted keeps the piece of the key before the cut, which no longer matches the key (only so
    much of ``text`` is searched as may hold a spelling of the key that starts before ``n``)."""
    return redact(text[:n + 3 * len((key or "").encode("utf-8", "surrogatepass")) + 16], key)[:n]
