"""Structure-aware mutations of evidence documents, measurement policies and join requests.

Every mutation takes the document apart (JSON, YAML or protobuf), changes one thing the way an
attacker or a broken node would, and puts it back together, so that most inputs get past the
first parser and reach the checks behind it. Byte-level mutations (libFuzzer's own, bit flips,
truncation) keep the parsers themselves honest.
"""

from __future__ import annotations

import base64
import json
import random

import yaml

UNICODE = [
    "\u0000",
    "\ud800",
    "\udfff",
    "\u202e",
    "\ufeff",
    "\u00e9",
    "\U0001d518",
    "\uff21\uff21==",
    "\u0663",
    "\u00b2",
    "\u0130",
    "\u212a",
    "\n",
    "\t",
    " ",
    "\u2028",
    "\U0010ffff",
    "\x7f",
    "\\",
    '"',
    "\u00a0",
]
SCALARS = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2,
    23,
    24,
    2**31,
    2**64,
    -(2**63),
    0.5,
    -0.0,
    1e308,
    float("inf"),
    float("nan"),
    "",
    "0",
    "15",
    "23",
    "24",
    "-1",
    "00",
    "1 ",
    "tpm",
    "sha256",
    "sha1",
    "AA==",
    "AAAA",
    "=",
    "====",
    "true",
    "null",
]


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _paths(node, prefix=()):
    """Every (container path, key) in a JSON-like tree, the root's children included."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield prefix, key
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield prefix, index
            yield from _paths(value, prefix + (index,))


def _at(node, path):
    for key in path:
        node = node[key]
    return node


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 2 else 4)
    if kind <= 1:
        return rng.choice(SCALARS)
    if kind == 2:
        return "".join(rng.choice(UNICODE + ["A", "b", "0", "+", "/"]) for unused in range(rng.randrange(1, 12)))
    if kind == 3:
        return rng.choice(
            [_b64(rng.randbytes(rng.choice([1, 20, 31, 32, 33, 48, 64, 100]))), "AAAA" * rng.randrange(1, 40)]
        )
    if kind == 4:
        return [_random_value(rng, depth + 1) for unused in range(rng.randrange(0, 4))]
    return {
        rng.choice(["0", "15", "sha256", "x", "", "allowed", "expected", "warnOnly"]): _random_value(rng, depth + 1)
        for unused in range(rng.randrange(0, 4))
    }


def _huge(rng: random.Random, limit: int):
    """A value far larger than any genuine one; ``limit`` bounds its size in characters, and one in ten is beyond any limit."""
    if rng.random() < 0.1:
        return "A" * rng.randrange(300_000, 400_000)
    return rng.choice(
        [
            10 ** rng.randrange(20, 4200),
            -(10 ** rng.randrange(20, 400)),
            1e308,
            "A" * rng.randrange(1000, limit),
            "\u00e9" * rng.randrange(100, limit // 8),
            [0] * rng.randrange(100, limit // 3),
            {str(i): "AA==" for i in range(rng.randrange(50, limit // 12))},
        ]
    )


def _base64_garbage(rng: random.Random, original: object) -> str:
    raw = rng.randbytes(rng.randrange(0, 80))
    text = _b64(raw)
    choice = rng.randrange(8)
    if choice == 0:
        return text.rstrip("=")  # padding missing
    if choice == 1:
        return base64.urlsafe_b64encode(raw + b"\xfb\xff").decode()  # '-' and '_'
    if choice == 2:
        return text[: len(text) // 2] + "\n" + text[len(text) // 2 :]
    if choice == 3:
        return text + "===="
    if choice == 4:
        return " " + text
    if choice == 5 and isinstance(original, str) and original:
        cut = rng.randrange(len(original))
        return original[:cut] + rng.choice("!*.~=%") + original[cut + 1 :]
    if choice == 6:
        return "data:;base64," + text
    return text


def _inner(rng: random.Random, value: str) -> str | None:
    """Decode a base64 value, mutate the bytes (TPM length fields, tags, truncation), encode again."""
    try:
        raw = bytearray(base64.b64decode(value, validate=True))
    except (ValueError, TypeError):
        return None
    if not raw:
        return None
    for unused in range(rng.randrange(1, 4)):
        op = rng.randrange(6)
        i = rng.randrange(len(raw)) if raw else 0
        if op == 0 and raw:
            raw[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            del raw[rng.randrange(len(raw) + 1) :]
        elif op == 2 and len(raw) > 2:
            raw[i : i + 2] = rng.choice([b"\xff\xff", b"\x00\x00", b"\x00\x01", b"\x10\x00", b"\x00\x20"])
        elif op == 3:
            raw[i:i] = rng.randbytes(rng.randrange(1, 64))
        elif op == 4 and raw:
            raw[i] = rng.choice([0, 0xFF, 0x80, 0x7F, 0x01])
        else:
            raw += raw[: rng.randrange(1, 64)]
    return _b64(bytes(raw))


def _nest(rng: random.Random, value, limit: int) -> str:
    depth = min(limit, rng.choice([8, 64, 500, 990, 1200, 5000, 50_000]))
    inner = json.dumps(value)
    if rng.random() < 0.5:
        return "[" * depth + inner + "]" * depth
    return '{"a":' * depth + inner + "}" * depth


_PLACEHOLDER = "\u0000ck-fuzz\u0000"


def _dump(doc, rng: random.Random, raw: dict[str, str] | None = None) -> bytes:
    """JSON text; ``raw`` replaces placeholders with text json.dumps cannot write (duplicate keys, deep nesting)."""
    text = json.dumps(doc, ensure_ascii=rng.random() < 0.7)
    for placeholder, replacement in (raw or {}).items():
        text = text.replace(json.dumps(placeholder), replacement, 1)
    return text.encode("utf-8", "surrogatepass")


def mutate_tree(
    doc, rng: random.Random, splice_from: list | None = None, huge_limit: int = 300_000, max_depth: int = 50_000
) -> bytes:
    """One structural mutation of a parsed JSON document; returns the serialised result."""
    places = list(_paths(doc))
    raw: dict[str, str] = {}
    if not places:
        return _dump(_random_value(rng), rng)
    path, key = rng.choice(places)
    parent = _at(doc, path)
    value = parent[key]
    op = rng.randrange(11)
    if op == 0:  # field deletion
        del parent[key]
    elif op == 1 and isinstance(parent, dict):  # duplicated field: JSON keeps the last, other parsers the first
        parent[_PLACEHOLDER] = _random_value(rng) if rng.random() < 0.5 else value
        raw[_PLACEHOLDER] = json.dumps(key)
    elif op == 2:  # type swap
        parent[key] = _random_value(rng)
    elif op == 3:  # huge value
        if rng.random() < 0.2:  # an integer longer than Python converts by default (4300 digits)
            marker = f"{_PLACEHOLDER}big"
            parent[key] = marker
            raw[marker] = "9" * rng.randrange(4000, 20_000)
        else:
            parent[key] = _huge(rng, huge_limit)
    elif op == 4:  # unicode in a value or a key
        text = rng.choice(UNICODE) * rng.randrange(1, 4)
        if isinstance(parent, dict) and rng.random() < 0.4:
            parent[str(key) + text] = parent.pop(key)
        elif isinstance(value, str) and value:
            cut = rng.randrange(len(value) + 1)
            parent[key] = value[:cut] + text + value[cut:]
        else:
            parent[key] = text
    elif op == 5:
        parent[key] = _base64_garbage(rng, value)
    elif op in (6, 7) and isinstance(value, str):
        parent[key] = _inner(rng, value) or _base64_garbage(rng, value)
    elif op == 8:  # nested depth
        marker = f"{_PLACEHOLDER}{len(raw)}"
        parent[key] = marker
        raw[marker] = _nest(rng, value, max_depth)
    elif op == 9 and splice_from:  # a part of another genuine document
        donor = rng.choice(splice_from)
        donor_places = list(_paths(donor))
        if donor_places:
            donor_path, donor_key = rng.choice(donor_places)
            parent[key] = json.loads(json.dumps(_at(donor, donor_path)[donor_key]))
    elif isinstance(parent, dict):  # an extra field
        parent[rng.choice(["extra", "Version", "pcrs ", "version\u0000", str(rng.randrange(30)), "__proto__"])] = (
            _random_value(rng)
        )
    else:
        parent.append(_random_value(rng))
    return _dump(doc, rng, raw)


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    raw = bytearray(data)
    op = rng.randrange(5)
    if not raw or op == 0:
        raw += rng.randbytes(rng.randrange(1, 16))
    elif op == 1:
        for unused in range(rng.randrange(1, 8)):
            i = rng.randrange(len(raw))
            raw[i] ^= 1 << rng.randrange(8)
    elif op == 2:
        del raw[rng.randrange(len(raw)) :]
    elif op == 3:
        i = rng.randrange(len(raw))
        raw[i:i] = rng.choice(
            [b"\x00", b"\xff", b"\xc3", b"\xed\xa0\x80", b'"', b"\\u", b",", b"]", b"}", b"\xef\xbb\xbf"]
        )
    else:
        i = rng.randrange(len(raw))
        j = rng.randrange(i, min(len(raw), i + 64) + 1)
        raw[i:i] = raw[i:j]
    return bytes(raw)


def mutate_json(data: bytes, rng: random.Random, splice_from: list | None = None) -> bytes:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        doc = None
    if doc is None or rng.random() < 0.15:
        return mutate_bytes(data, rng)
    result = mutate_tree(doc, rng, splice_from)
    if rng.random() < 0.1:
        result = mutate_bytes(result, rng)
    return result


YAML_TRICKS = [
    "a: &a [1, 2]\nb: [*a, *a, *a, *a]\n" * 3,
    "!!python/object/apply:os.system ['true']\n",
    "version: 1\npcrs:\n  <<: {4: {allowed: ['" + "00" * 32 + "']}}\n",
    "version: 1\npcrs: !!set {4: null}\n",
    "version: 1\npcrs:\n  4: {allowed: !!binary AAAA}\n",
    "4: {expected: 2001-01-01}\n",
    "? [1, 2]\n: x\n",
    "version: 0x1\npcrs: {0o4: {allowed: ['" + "00" * 32 + "']}}\n",
    "%YAML 1.1\n---\nversion: 1\n...\n---\nversion: 2\n",
    "4: {expected: '" + "00" * 32 + "', warnOnly: yes}\n",
    "15: {expected: ~}\n",
    "\t4: x\n",
]


def mutate_policy(data: bytes, rng: random.Random, splice_from: list | None = None) -> bytes:
    choice = rng.random()
    if choice < 0.05:
        return rng.choice(YAML_TRICKS).encode()
    try:
        doc = yaml.safe_load(data)
    except (yaml.YAMLError, ValueError, RecursionError):
        doc = None
    if not isinstance(doc, (dict, list)) or choice < 0.2:
        return mutate_bytes(data, rng)
    # PyYAML is pure Python and slow on deep flow nesting (1.2 s for 900 levels): huge and deep stay smaller here.
    mutated = mutate_tree(doc, rng, splice_from, huge_limit=4_000, max_depth=200)
    if rng.random() < 0.4:
        try:
            # The same document as YAML (block style), which takes a different path through the loader.
            return yaml.safe_dump(json.loads(mutated), allow_unicode=rng.random() < 0.5).encode(
                "utf-8", "surrogatepass"
            )
        except (ValueError, RecursionError, yaml.YAMLError, UnicodeError):
            pass
    return mutated
