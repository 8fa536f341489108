"""Connecting to a peer through the addresses its record announces, circuit addresses through a relay included.

p2pd finds a peer it has never met through its own DHT's peer routing, which knows the addresses the peer's daemon
reports, never the circuit addresses a relayed peer holds a reservation for (the daemon's autorelay only announces
those once AutoNAT agrees, and keeps only public relay addresses). The peer's signed record names them, so a
sender that could not open a stream connects through them (`P2P` client ``connect``) and tries once more.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from hivemind.p2p import P2P, PeerID
from multiaddr import Multiaddr

from swarm.constants import CONNECT_TIMEOUT

logger = logging.getLogger(__name__)


async def connect_via_addresses(p2p: P2P, peer_id: str, addresses: Callable[[str], Sequence[str]] | None, *,
                                timeout: float = CONNECT_TIMEOUT) -> bool:
    """Connect `p2p` to `peer_id` through `addresses(peer_id)`; whether a connection is now open."""
    if addresses is None:
        return False
    try:  # the lookup may read the DHT: off the event loop
        found = await asyncio.get_running_loop().run_in_executor(None, addresses, peer_id)
        maddrs = [Multiaddr(a) for a in found]
    except Exception as e:  # a malformed announced address: nothing to dial
        logger.debug("addresses of %s unusable: %s", peer_id, e)
        return False
    if not maddrs:
        return False
    try:
        # hivemind's P2P has no public connect; its daemon client does (ControlClient.connect)
        await asyncio.wait_for(p2p._client.connect(PeerID.from_base58(peer_id), maddrs), timeout)
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise
    except Exception as e:
        logger.debug("connecting to %s through %d announced addresses failed: %s", peer_id, len(maddrs), e)
        return False
    logger.info("connected to %s through its announced addresses", peer_id)
    return True
