"""Conversation banks (docs/protocol.md §16): multi-turn chats frozen with a manifest, as prefix banks are.

One JSON object per line: an id, the chat template it was generated under (`template`, a path relative to
the bank, whose sha256 the manifest records) and its turns. Each turn holds a fixed user message, the answer
key where there is one, and the assistant turn the model generated live under that template: its token ids
(content, then the closer) and their decoded text. A conversation is named like the prefix bank's row it
begins with (its first user turn is that row's problem), so a family run on bank rows finds it by id.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from replaytests.errors import BankError
from replaytests.files import dumps, jsonl_objects, read_text, sha256_file, write_set
from replaytests.inputs.bank import manifest_path

SCHEMA = "replaytests.conversations/1"
MANIFEST_SCHEMA = "replaytests.conversations-manifest/1"
SUFFIX = ".conversations.jsonl"  # beside the prefix bank: tiny.jsonl -> tiny.conversations.jsonl


@dataclass(frozen=True)
class Turn:
    user: str
    expected_answer: str | None
    assistant_ids: tuple[int, ...]  # the assistant turn as generated: its content ids, then the closer
    assistant: str  # the content ids decoded (what a client keeps and sends back as text)


@dataclass(frozen=True)
class Conversation:
    id: str
    template: str  # the chat template's path, relative to the bank
    turns: tuple[Turn, ...]
    line: int = field(default=0, compare=False)  # its line in the bank (0: not read from one)

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "id": self.id, "template": self.template,
                "turns": [{"user": t.user, "expected_answer": t.expected_answer,
                           "assistant_ids": list(t.assistant_ids), "assistant": t.assistant} for t in self.turns]}


def path_for(bank: Path) -> Path:
    """The conversation bank beside a prefix bank."""
    return bank.with_name(bank.name.removesuffix(".jsonl") + SUFFIX)


def _field(obj: dict, key: str, kind: type | tuple, where: str):
    if key not in obj:
        raise BankError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise BankError(f"{where}: field {key!r} has type {type(value).__name__}, expected "
                        f"{getattr(kind, '__name__', 'a string or null')}")
    return value


def _turn(obj: object, where: str, vocab_size: int, cap: int) -> Turn:
    if not isinstance(obj, dict):
        raise BankError(f"{where}: expected an object, got {type(obj).__name__}")
    user = _field(obj, "user", str, where)
    expected = _field(obj, "expected_answer", (str, type(None)), where)
    ids = _field(obj, "assistant_ids", list, where)
    if not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise BankError(f"{where}: field 'assistant_ids' must be a non-empty list of integers")
    if outside := [t for t in ids if not 0 <= t < vocab_size]:
        raise BankError(f"{where}: field 'assistant_ids' holds ids {outside[:5]} outside the vocabulary "
                        f"[0, {vocab_size})")
    if len(ids) - 1 > cap:
        raise BankError(f"{where}: field 'assistant_ids' has {len(ids) - 1} content tokens, more than the cap "
                        f"({cap})")
    return Turn(user, expected, tuple(ids), _field(obj, "assistant", str, where))


def read_conversations(path: Path, vocab_size: int, cap: int, min_turns: int = 1) -> list[Conversation]:
    """Every conversation, checked: fields and their types, at least `min_turns` turns, assistant turns within
    the cap and inside the vocabulary, unique ids; an error names the file, line and field."""
    out, seen = [], set()
    for number, obj in jsonl_objects(path, read_text(path, "conversation bank", BankError), BankError):
        where = f"{path}:{number}"
        if obj.get("schema") != SCHEMA:
            raise BankError(f"{where}: field 'schema' is {obj.get('schema')!r}, expected {SCHEMA!r}")
        conversation_id = _field(obj, "id", str, where)
        where = f"{where} (conversation {conversation_id})"
        turns = _field(obj, "turns", list, where)
        if len(turns) < min_turns:
            raise BankError(f"{where}: field 'turns' holds {len(turns)} turns, expected at least {min_turns}")
        parsed = tuple(_turn(t, f"{where}: turns[{i}]", vocab_size, cap) for i, t in enumerate(turns))
        if conversation_id in seen:
            raise BankError(f"{where}: duplicate conversation id {conversation_id!r}")
        seen.add(conversation_id)
        out.append(Conversation(conversation_id, _field(obj, "template", str, where), parsed, number))
    if not out:
        raise BankError(f"{path}: no conversations")
    return out


def template_path(bank: Path, conversation: Conversation) -> Path:
    return (bank.parent / conversation.template).resolve()


def read_template(bank: Path, conversation: Conversation) -> str:
    """A conversation's chat template, read and parsed as Jinja (a syntax error is one line naming the bank's
    line and the template's)."""
    import jinja2

    where = f"{bank}:{conversation.line} (conversation {conversation.id}): field 'template'"
    path = template_path(bank, conversation)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BankError(f"{where} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise BankError(f"{where} {path}:{exc.lineno}: not a Jinja template: {exc.message}") from None
    return text


def write_conversations(path: Path, conversations: list[Conversation], manifest: dict) -> None:
    """The bank and its manifest as one pair (neither replaces what was there unless both are written); the
    manifest gains the bank's sha256, its counts and the template's sha256."""
    text = "".join(dumps(c.to_json(), sort_keys=True) + "\n" for c in conversations)
    templates = sorted({c.template for c in conversations})
    manifest = {"schema": MANIFEST_SCHEMA, "bank": path.name,
                "bank_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "conversations": len(conversations),
                "turns": {"min": min(len(c.turns) for c in conversations),
                          "max": max(len(c.turns) for c in conversations)},
                "templates": {name: sha256_file(path.parent / name, "chat template", BankError) for name in templates},
                **manifest}
    write_set({path: text, manifest_path(path): dumps(manifest, indent=2, sort_keys=True) + "\n"})
