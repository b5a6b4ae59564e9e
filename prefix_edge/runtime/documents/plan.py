"""A call's documents and how they reach the model, decided once at the call (prepare.py): the
checked documents (block.py), where they go — the chat template's own documents section, or
the fallback block in the input — and whether each one's KV is composed (compose.py). Every
later step asks the plan, never decides again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .block import check_documents, module, with_documents


@dataclass(frozen=True)
class DocumentPlan:
    items: tuple = ()        # the checked documents: {"title", "text"}
    native: bool = False     # into the template's own documents section (else the fallback block)
    compose: bool = False    # compose_documents: each document's KV computed once, moved into place
    recompute: int = 0       # compose_recompute: a moved document's first tokens computed again

    def __bool__(self) -> bool:
        return bool(self.items)

    @property
    def given(self) -> list | None:
        """The documents as a template's `documents` reads them (native), else None."""
        return list(self.items) if self.native and self.items else None

    @property
    def modules(self) -> tuple[str, ...]:
        """Each document as it stands in the prompt, the text a composition tokenizes on its own."""
        return tuple(d["text"] if self.native else module(d) for d in self.items)

    def around_text(self, text: str) -> str:
        """A text input with the fallback block before it."""
        return with_documents(list(self.items), text, None)[0]

    def into_messages(self, messages: list, task_input: bool) -> list:
        """A conversation with the fallback block in its system message (a task's input: before
        the user's text)."""
        return with_documents(list(self.items), None, messages, task_input)[1]


def plan_documents(value, compose: bool, recompute: int, native: Callable[[list], bool]) -> DocumentPlan:
    """The plan of a call's `documents` option (checked: an OptionError names the field);
    native(items): whether the template's own section takes them."""
    items = check_documents(value)
    if not items:
        return DocumentPlan()
    return DocumentPlan(tuple(items), bool(native(items)), bool(compose), int(recompute))
