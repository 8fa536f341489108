"""What the transport raises when a message is not delivered (re-exported by `swarm.net.transport`).

Apart from the transport so that `swarm.net.stream_routes`, which the transport owns, raises the same errors.
"""

from __future__ import annotations


class TransportError(RuntimeError):
    """A message that could not be delivered: unreachable peer, timeout, or refused by the receiver."""


class PeerUnreachable(TransportError):
    """No stream to the peer could be opened: the message certainly did not arrive (safe to send elsewhere)."""


class MessageRefused(TransportError):
    """The peer answered and refused the message (the reason says why): it is reachable, the message was not
    taken (an epoch it does not know yet, a check it failed)."""
