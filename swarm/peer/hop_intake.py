"""`HopIntake`: where the transport hands this peer's incoming pipeline messages."""

from __future__ import annotations

import logging
import time

import torch

from swarm.net.delivery import Inbound
from swarm.net.message_jitter import MessageJitter
from swarm.peer.activation_watch import ActivationWatch
from swarm.peer.mailbox import Inbox
from swarm.peer.message_padding import MessagePadding
from swarm.wire import HopHeader

logger = logging.getLogger(__name__)


class HopIntake:
    """Transport thread: each pipeline message's delay noted as jitter, its emulated padding stripped, then filed
    for the main loop (the worker is used from one thread only) unless `activations` takes it up; waits while the
    inbox is full, which makes the senders wait."""

    def __init__(self, inbox: Inbox, activations: ActivationWatch, jitter: MessageJitter) -> None:
        self.inbox, self.activations, self.jitter = inbox, activations, jitter
        self.padding: MessagePadding | None = None
        """Strips the emulated padding off received pipeline tensors (`swarm.message_bytes`; None = none)."""

    def __call__(self, sender: str, header: HopHeader, tensor: torch.Tensor) -> None:
        if header.sent_at:
            self.jitter.observe(f"{sender}/{header.direction.name}", time.time() - header.sent_at)
        if self.padding is not None:
            try:
                tensor = self.padding.strip(tensor)
            except ValueError as e:  # the transport checked the shape: not expected
                logger.warning("dropped a %s from %s: %s", header.direction.name.lower(), sender, e)
                return
        if self.activations.take(m := Inbound(sender, header, tensor)):
            self.inbox.put(m)
