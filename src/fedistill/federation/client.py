"""Client logic: the site-side half of an algorithm. It owns private data and local models.

A client answers typed requests. Subclasses mark handler methods with `@handles("train")`; the
base class dispatches by message type and refuses types it does not know.

Clients that live in one process may also answer some requests together (`together_key`,
`handle_together`): one batched computation for many clients, each answer still its own message.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, ClassVar

from fedistill.errors import FederationError
from fedistill.federation.messages import Message, is_message_type

Handler = Callable[[Any, Message], Message]


def handles(message_type: str, *, read_only: bool = False) -> Callable[[Handler], Handler]:
    """Mark a handler; `read_only=True` promises it leaves `state_dict()` unchanged, so a transport
    that persists client state between messages (Flower deployment) can skip the write. A type no message
    may have is refused here, where it is written, not when the first request fails mid-run."""
    if not is_message_type(message_type):
        raise FederationError(
            f"@handles({message_type!r}): a message type is 'train', 'evaluate' or 'query', optionally "
            "followed by '.<action>' ('query.logits')"
        )

    def mark(method: Handler) -> Handler:
        method.__handles__ = message_type  # type: ignore[attr-defined]
        method.__read_only__ = read_only  # type: ignore[attr-defined]
        return method

    return mark


class ClientLogic:
    """Dispatches messages to handler methods. State for checkpoints goes through state_dict()."""

    _handlers: ClassVar[dict[str, str]] = {}
    _read_only: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        handlers, read_only = {}, set()
        for klass in reversed(cls.__mro__):
            for name, member in vars(klass).items():
                message_type = getattr(member, "__handles__", None)
                if message_type is not None:
                    handlers[message_type] = name
                    read_only.discard(message_type)
                    if getattr(member, "__read_only__", False):
                        read_only.add(message_type)
        cls._handlers, cls._read_only = handlers, frozenset(read_only)

    def changes_state(self, message_type: str) -> bool:
        """False for handlers marked read-only: their answer leaves `state_dict()` as it was."""
        return message_type not in self._read_only

    def handle(self, message: Message) -> Message:
        """Answer `message` with the handler marked for its type; FederationError for any other."""
        name = self._handlers.get(message.type)
        if name is None:
            raise FederationError(
                f"{type(self).__name__} does not handle {message.type!r}; it handles {sorted(self._handlers)}"
            )
        return getattr(self, name)(message)

    def together_key(self, message: Message) -> Hashable | None:
        """A key under which a transport holding many clients of this class in one process may answer
        `message` together with theirs (`handle_together`): the requests of equal keys, one per client, go
        in one call. None (the default): this client answers alone."""
        return None

    @classmethod
    def handle_together(cls, clients: Sequence[ClientLogic], messages: Sequence[Message]) -> list[Message]:
        """Answer `messages[i]` as `clients[i]` would alone, for requests of one `together_key`: the same
        messages up to float rounding, each client's state updated as its own `handle` would."""
        raise FederationError(f"{cls.__name__} answers every request alone")

    def state_dict(self) -> dict[str, Any]:
        """Local state to checkpoint on the client's own disk (never sent). Empty for stateless clients."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict()` returned; a stateless client refuses any state."""
        if state:
            raise FederationError(f"{type(self).__name__} keeps no state but a checkpoint holds some")
