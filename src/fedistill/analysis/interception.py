"""What crosses the boundary, kept in full: every request and reply of a fleet, and, as ground truth
only, the batches a client's model trained on."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from fedistill.federation.client import ClientLogic
from fedistill.federation.fleet import Fleet, Reply
from fedistill.federation.messages import Message
from fedistill.federation.reply_spec import Expectation

#: Builds the fleet a round runs over from its clients (the in-process transport, for one).
Transport = Callable[[Mapping[int, ClientLogic]], Fleet]


class RecordingFleet(Fleet):
    """Any transport's fleet, keeping every request and reply: what the ledger records, in full.

    It is what an honest-but-curious server holds: it runs the protocol as written over ``inner`` and
    keeps everything it sent and received."""

    def __init__(self, inner: Fleet) -> None:
        super().__init__(inner.ledger)
        self.inner = inner
        self.dropped = inner.dropped  # one record of failures, kept by the transport
        self.exchanges: list[tuple[dict[int, Message], dict[int, Reply]]] = []

    @property
    def clients(self) -> list[int]:
        """The inner fleet's clients."""
        return self.inner.clients

    def send(
        self,
        requests: Mapping[int, Message],
        *,
        step: int | None = None,
        timeout: float | None = None,
        expect: Expectation = None,
    ) -> dict[int, Reply]:
        """The inner fleet's replies, every request and reply kept."""
        self.inner.round = self.round  # the ledger records carry the round the server set here
        replies = self.inner.send(requests, step=step, timeout=timeout, expect=expect)
        self.exchanges.append((dict(requests), dict(replies)))
        return replies

    def exchange(self, message_type: str, client: int) -> tuple[Message, Message]:
        """The first request of ``message_type`` sent to ``client`` and the client's reply to it."""
        for requests, replies in self.exchanges:
            if client in requests and requests[client].type == message_type:
                reply = replies[client]
                if reply.message is None:
                    raise RuntimeError(f"client {client} failed on {message_type}: {reply.error}")
                return requests[client], reply.message
        raise KeyError(f"no {message_type} exchange with client {client}")

    def kinds_sent(self, client: int) -> list[str]:
        """Every kind of array ``client`` sent over all exchanges (not only those an attack reads)."""
        return sorted(
            {
                kind
                for _, replies in self.exchanges
                if client in replies and replies[client].message is not None
                for kind in replies[client].message.arrays
            }
        )


def capture_training_batches(module: nn.Module) -> list[torch.Tensor]:
    """Ground truth only: the inputs ``module`` sees while training (train mode, gradients on)."""
    seen: list[torch.Tensor] = []

    def hook(mod: nn.Module, args: tuple[Any, ...]) -> None:
        if mod.training and torch.is_grad_enabled():
            seen.append(args[0].detach().clone())

    module.register_forward_pre_hook(hook)
    return seen
