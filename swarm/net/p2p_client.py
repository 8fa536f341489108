"""`own_p2p`: a p2pd client of a node's daemon for one event loop alone.

hivemind's ``DHT.replicate_p2p`` caches one client per process, bound to the event loop of whoever asked first.
Two components on two event loops that both ask (a peer's transport and, on a public peer, the relay's forwarder)
then share it: the streams of one are served on the other's loop, where a message handed to a queue of the first
wakes nothing (it was acknowledged, then sat until some unrelated event woke that loop: 50-60 s stalls of public
peers' iterations), and either one's shutdown ends the other's client. Each component takes its own instead.
"""

from __future__ import annotations

import asyncio

from hivemind import DHT
from hivemind.p2p import P2P


async def own_p2p(dht: DHT) -> P2P:
    """A new client of `dht`'s p2p daemon (same peer id) for the running event loop; the caller shuts it down."""
    maddr = await asyncio.get_running_loop().run_in_executor(
        None, dht.run_coroutine, DHT._get_p2p_daemon_listen_maddr)  # how replicate_p2p finds the daemon
    return await P2P.replicate(maddr)
