"""The gossip sidecar: py-libp2p GossipSub in a process of its own, driven by its owner over a private socket.

Started by :class:`swarm.control.gossip.GossipClient`, not by hand::

    python -m swarm.control.gossip_sidecar --identity KEY --fd N --owner-pid PID [--listen-host H --listen-port P]

or forked by a :mod:`swarm.control.sidecar_starter` that has imported py-libp2p already (then its owner is not its
parent, and it watches the owner through a pidfd).

It imports libp2p, so it must never import hivemind, torch or a module that does (the two libp2p stacks register
the same protobuf ``crypto.pb``). The frame format is in :mod:`swarm.control.gossip`. The trio event loop runs in the
main thread. Everything from the pipe and the network is untrusted: a bad frame or message is logged and dropped,
and the sidecar keeps running until its owner closes the pipe, asks it to close, or dies.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.serialization import deserialize_private_key
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service

from swarm.control.gossip import (
    FRAME_HEADER,
    GOSSIP_HEARTBEAT_INTERVAL,
    GOSSIP_MAX_MESSAGES_PER_SECOND,
    MAX_FRAME_BYTES,
    FrameError,
    check_topic,
    decode_frame,
    decode_payload,
    encode_frame,
    frame_field,
)
from swarm.control.message_signatures import MessageSignatures
from swarm.control.message_signatures import install as install_signatures
from swarm.control.signed_record_cache import OwnRecordCache, SignedRecordCache, install_own
from swarm.control.signed_record_cache import install as install_record_cache

logger = logging.getLogger(__name__)

MAX_KEY_FILE_BYTES = 16 * 1024
MAX_CONNECT_TIMEOUT = 120.0
OWNER_POLL_INTERVAL = 0.5
"""How often the sidecar checks that its owner is still there (the pipe alone can outlive the owner if a forked
child of the owner inherited its end)."""
SHUTDOWN_GRACE = 5.0
"""After this long shutting down, the process exits regardless of libp2p tasks still unwinding."""
MAX_EQUIVOCATION_ENTRIES = 8192
"""py-libp2p remembers every message for equivocation checks and never forgets; we trim to this many."""
GOSSIP_DEGREE, GOSSIP_DEGREE_LOW = 6, 4
GOSSIP_DEGREE_HIGH = 64
"""A mesh prunes down to GOSSIP_DEGREE only above this many peers. GossipSub's usual 12 suits a swarm of equals;
ours has a hub: every peer bootstraps from the coordinator's sidecar, and a joiner has no other link until it is
admitted. py-libp2p 0.8 then delivers a message only along mesh links (its lazy IHAVE gossip delivered nothing to
pruned peers in `benchmarks/gossip_fanout.py`), so with 12 a joiner outside the coordinator's mesh waited for its
admission until a re-graft happened to take it in: 1.5-2.5 minutes in 20-peer runs. Control messages are few and
small, so the extra fan-out costs little."""
YAMUX_RELEASE_ON_READ = "0"
"""py-libp2p's yamux (0.8) answers every read with a window update by default, a frame encrypted and written per
message received: 11% of a sidecar's CPU while an 8-peer swarm trained. "0" is go-yamux's rule: the window is
handed back once half of it was read. Set in the sidecar's environment (PY_YAMUX_RELEASE_ON_READ), which py-libp2p
reads at each read."""
GOSSIP_PROTOCOLS = [PROTOCOL_ID_V11, PROTOCOL_ID]
"""GossipSub 1.1 and 1.0, not 1.2: 1.2 adds IDONTWANT, which py-libp2p 0.8 sends to every mesh peer for every
message it receives, however small. Our control messages are small and the mesh is wide (GOSSIP_DEGREE_HIGH), so
that doubled the RPCs on every link: 14% of a sidecar's CPU while an 8-peer swarm trained, to save duplicates
that cost less than the notices."""
GRAFT_FLOOD_SECONDS = 0.0
"""py-libp2p's GRAFT flood check (a GRAFT sooner than this after a PRUNE is punished with another PRUNE), off:
py-libp2p 0.8 also stamps the check's clock when it *receives* a PRUNE, so two peers that pruned each other once
prune each other's every later GRAFT, each PRUNE restarting the other's clock (15 such floods in 40 s of one
`gossip_fanout.py` run, none with the check off). Backoff after a PRUNE is still enforced (`prune_back_off`)."""
MAX_DROP_WARNINGS, DROP_WARNING_WINDOW = 20, 10.0
"""At most this many warnings about dropped network input per window: a peer that floods garbage cannot flood the
log (GossipSub's peer scoring penalises it meanwhile)."""


class _DropLog:
    """Rate-limited warnings about dropped network input."""

    def __init__(self) -> None:
        self.window_start, self.count, self.suppressed = 0.0, 0, 0

    def warning(self, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self.window_start > DROP_WARNING_WINDOW:
            if self.suppressed:
                logger.warning("suppressed %d more warnings about dropped input", self.suppressed)
            self.window_start, self.count, self.suppressed = now, 0, 0
        if self.count < MAX_DROP_WARNINGS:
            self.count += 1
            logger.warning(msg, *args)
        else:
            self.suppressed += 1


_dropped = _DropLog()


class _CheckedPubsub(Pubsub):
    """Pubsub that logs why it drops a message, and that no hostile message or stream can take down.

    :param signatures: the signature check (the one installed into py-libp2p, so a message is verified once)
    """

    def __init__(self, *args: Any, signatures: MessageSignatures, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.signatures = signatures

    async def push_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        try:
            if msg_forwarder != self.my_id and not self._is_msg_seen(msg):
                problem = _signature_problem(msg, self.signatures)
                if problem is not None:
                    _dropped.warning("dropped a message on %s from %s (forwarded by %s): %s", list(msg.topicIDs)[:4],
                                     _origin(msg), msg_forwarder, problem)
                    return
            await super().push_msg(msg_forwarder, msg)
        except Exception as e:
            _dropped.warning("dropped a message forwarded by %s: %s: %s", msg_forwarder, type(e).__name__, e)

    async def stream_handler(self, stream) -> None:
        try:
            await super().stream_handler(stream)
        except Exception as e:  # e.g. protobuf DecodeError on garbage, which py-libp2p does not catch
            peer_id = stream.muxed_conn.peer_id
            _dropped.warning("dropped the pubsub stream of %s: %s: %s", peer_id, type(e).__name__, str(e)[:200])
            with contextlib.suppress(Exception):
                await stream.reset()
            self._handle_dead_peer(peer_id)


def _signature_problem(msg: rpc_pb2.Message, check: MessageSignatures) -> str | None:
    if not msg.signature:
        return "unsigned"
    try:
        valid = check(msg)
    except Exception as e:
        return f"unreadable signing key ({type(e).__name__})"
    return None if valid else "bad signature, or signing key is not the sender's"


def _origin(msg: rpc_pb2.Message) -> str:
    try:
        return ID(msg.from_id).to_base58()
    except Exception:
        return repr(msg.from_id[:48])


class GossipSidecar:
    """Serves the owner's requests and forwards delivered messages to it; one per process."""

    def __init__(self, host, pubsub: _CheckedPubsub, gossipsub: GossipSub, owner: trio.SocketStream,
                 owner_pid: int, owner_gone: Callable[[], bool], nursery: trio.Nursery):
        self.host, self.pubsub, self.gossipsub = host, pubsub, gossipsub
        self.owner, self.owner_pid, self.owner_gone = owner, owner_pid, owner_gone
        self._nursery, self.cancel_scope = nursery, nursery.cancel_scope
        self.my_id = host.get_id()
        self._send_lock = trio.Lock()
        self._buffer = bytearray()
        self._pumps: set[str] = set()

    def maddrs(self) -> list[str]:
        suffix = f"/p2p/{self.my_id.to_base58()}"
        return [str(a) if "/p2p/" in str(a) else str(a) + suffix for a in self.host.get_addrs()]

    async def send(self, fields: dict[str, Any]) -> None:
        data = encode_frame(fields)
        try:
            async with self._send_lock:
                await self.owner.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            logger.info("owner pipe closed while sending: exiting")
            self.cancel_scope.cancel()

    async def serve(self) -> None:
        """Read requests until the pipe closes or the owner asks to close."""
        while True:
            header = await self._read_exactly(FRAME_HEADER.size)
            if header is None:
                logger.info("owner closed the pipe: exiting")
                return
            (length,) = FRAME_HEADER.unpack(header)
            if not 0 < length <= MAX_FRAME_BYTES:
                await self._refuse(None, f"frame length {length} outside 1..{MAX_FRAME_BYTES}: skipped")
                if not await self._skip_exactly(length):
                    return
                continue
            body = await self._read_exactly(length)
            if body is None:
                return
            request_id = None
            try:
                frame = decode_frame(body)
                request_id = frame_field(frame, "id", int)
                op = frame_field(frame, "op", str)
            except FrameError as e:
                await self._refuse(request_id, str(e))
                continue
            if op == "close":
                await self.send({"type": "reply", "id": request_id, "ok": True, "result": None})
                logger.info("owner asked to close: exiting")
                return
            if op == "connect":  # may take seconds: do not hold up other requests
                self._nursery.start_soon(self._handle, op, request_id, frame)
            else:
                await self._handle(op, request_id, frame)

    async def _handle(self, op: str, request_id: int, frame: dict[str, Any]) -> None:
        handler = getattr(self, f"_op_{op}", None)
        if handler is None:
            await self._refuse(request_id, f"unknown op {op!r:.40}")
            return
        try:
            result = await handler(frame)
        except FrameError as e:
            await self._refuse(request_id, str(e))
        except trio.TooSlowError:
            await self._refuse(request_id, f"{op} timed out")
        except Exception as e:
            logger.warning("%s failed: %s: %s", op, type(e).__name__, e)
            await self.send({"type": "reply", "id": request_id, "ok": False, "error": f"{type(e).__name__}: {e}"})
        else:
            await self.send({"type": "reply", "id": request_id, "ok": True, "result": result})

    async def _refuse(self, request_id: int | None, error: str) -> None:
        logger.error("dropped a request from the owner: %s", error)
        if request_id is None:
            await self.send({"type": "error", "error": error})
        else:
            await self.send({"type": "reply", "id": request_id, "ok": False, "error": error})

    async def _op_subscribe(self, frame: dict[str, Any]) -> None:
        topic = check_topic(frame.get("topic"))
        if topic in self._pumps:
            return
        self.pubsub.set_topic_validator(topic, self._payload_validator(topic), False)
        subscription = await self.pubsub.subscribe(topic)
        self._pumps.add(topic)
        self._nursery.start_soon(self._pump, topic, subscription)

    async def _op_unsubscribe(self, frame: dict[str, Any]) -> None:
        topic = check_topic(frame.get("topic"))
        await self.pubsub.unsubscribe(topic)  # closes the subscription channel: its pump ends
        self.pubsub.remove_topic_validator(topic)

    async def _op_publish(self, frame: dict[str, Any]) -> None:
        topic = check_topic(frame.get("topic"))
        payload = frame.get("payload")
        decode_payload(payload)  # the owner checked it too; the sidecar signs nothing unchecked
        await self.pubsub.publish(topic, payload)

    async def _op_connect(self, frame: dict[str, Any]) -> str:
        maddr = frame_field(frame, "maddr", str)
        timeout = min(max(float(frame_field(frame, "timeout", (int, float))), 0.1), MAX_CONNECT_TIMEOUT)
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(maddr))
        except Exception as e:
            raise FrameError(f"bad multiaddr {maddr!r:.120} (needs /p2p/<peer id>): {e}") from None
        with trio.fail_after(timeout):
            await self.host.connect(info)
            await self.pubsub.wait_for_peer(info.peer_id, timeout=timeout)
        logger.info("connected to %s", info.peer_id)
        return info.peer_id.to_base58()

    async def _op_status(self, frame: dict[str, Any]) -> dict[str, Any]:
        topics = {}
        for topic in self.pubsub.topic_ids:
            topics[topic] = {
                "subscribers": sorted(p.to_base58() for p in self.pubsub.peer_topics.get(topic, ())),
                "mesh": sorted(p.to_base58() for p in self.gossipsub.mesh.get(topic, ())),
            }
        return {"peer_id": self.my_id.to_base58(), "maddrs": self.maddrs(),
                "peers": sorted(p.to_base58() for p in self.pubsub.peers), "topics": topics}

    def _payload_validator(self, topic: str):
        def validate(forwarder: ID, msg: rpc_pb2.Message) -> bool:
            try:
                decode_payload(msg.data)
                return True
            except FrameError as e:
                _dropped.warning("dropped a message on %s from %s (forwarded by %s): %s", topic, _origin(msg),
                                 forwarder, e)
                return False

        return validate

    async def _pump(self, topic: str, subscription) -> None:
        try:
            async for msg in subscription:
                if msg.from_id == self.my_id.to_bytes():
                    continue
                await self.send({"type": "message", "topic": topic, "sender": _origin(msg),
                                 "seqno": int.from_bytes(msg.seqno[-8:], "big"), "payload": msg.data})
        finally:
            self._pumps.discard(topic)

    async def watch(self) -> None:
        """Exit when the owner is gone; keep py-libp2p's unbounded equivocation memory bounded."""
        while True:
            await trio.sleep(OWNER_POLL_INTERVAL)
            if self.owner_gone():
                logger.warning("owner %d is gone: exiting", self.owner_pid)
                self.cancel_scope.cancel()
                return
            seen = getattr(self.gossipsub, "equivocation_detection", None)
            if isinstance(seen, dict) and len(seen) > MAX_EQUIVOCATION_ENTRIES:
                for key in list(seen)[: len(seen) - MAX_EQUIVOCATION_ENTRIES // 2]:
                    del seen[key]

    async def _read_exactly(self, n: int) -> bytes | None:
        while len(self._buffer) < n:
            chunk = await self._receive()
            if not chunk:
                return None
            self._buffer += chunk
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    async def _skip_exactly(self, n: int) -> bool:
        while n > 0:
            if not self._buffer:
                chunk = await self._receive()
                if not chunk:
                    return False
                self._buffer += chunk
            taken = min(n, len(self._buffer))
            del self._buffer[:taken]
            n -= taken
        return True

    async def _receive(self) -> bytes:
        try:
            return await self.owner.receive_some(1 << 20)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""


async def _run(args: argparse.Namespace, key_pair: KeyPair, owner_sock: socket.socket,
               owner_gone: Callable[[], bool]) -> None:
    install_record_cache(SignedRecordCache())
    install_own(OwnRecordCache())
    signatures = MessageSignatures()
    install_signatures(signatures)
    # Noise only: py-libp2p's default list also accepts plaintext and secio connections
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    host = new_host(key_pair=key_pair, sec_opt={NOISE_PROTOCOL_ID: noise})
    gossipsub = GossipSub(
        protocols=GOSSIP_PROTOCOLS, degree=GOSSIP_DEGREE,
        degree_low=GOSSIP_DEGREE_LOW, degree_high=args.degree_high, heartbeat_initial_delay=0.1,
        heartbeat_interval=args.heartbeat,
        # py-libp2p's adaptive gossip stretches the heartbeat to 30-60 s when the mesh is below its target
        # degree, which is the normal state of a small swarm: keep the heartbeat we asked for.
        adaptive_gossip_enabled=False, max_messages_per_topic_per_second=GOSSIP_MAX_MESSAGES_PER_SECOND)
    gossipsub.graft_flood_threshold = GRAFT_FLOOD_SECONDS
    pubsub = _CheckedPubsub(host, gossipsub, strict_signing=True, signatures=signatures)
    owner = trio.SocketStream(trio.socket.from_stdlib_socket(owner_sock))
    async with host.run(listen_addrs=[_listen_maddr(args.listen_host, args.listen_port)]):
        async with trio.open_nursery() as nursery:
            async with background_trio_service(pubsub), background_trio_service(gossipsub):
                await pubsub.wait_until_ready()
                sidecar = GossipSidecar(host, pubsub, gossipsub, owner, args.owner_pid, owner_gone, nursery)
                await sidecar.send({"type": "ready", "peer_id": sidecar.my_id.to_base58(),
                                    "maddrs": sidecar.maddrs()})
                logger.info("gossip sidecar %s listening at %s", sidecar.my_id, sidecar.maddrs())
                nursery.start_soon(sidecar.watch)
                try:
                    await sidecar.serve()
                finally:
                    _exit_soon()
                    nursery.cancel_scope.cancel()


def _listen_maddr(host: str, port: int) -> multiaddr.Multiaddr:
    return multiaddr.Multiaddr(f"/{'ip6' if ':' in host else 'ip4'}/{host}/tcp/{port}")


def _exit_soon() -> None:
    timer = threading.Timer(SHUTDOWN_GRACE, os._exit, args=(0,))
    timer.daemon = True
    timer.start()


def _load_key_pair(path: str) -> KeyPair:
    with open(path, "rb") as f:
        blob = f.read(MAX_KEY_FILE_BYTES + 1)
    if len(blob) > MAX_KEY_FILE_BYTES:
        raise ValueError(f"{path}: key file is larger than {MAX_KEY_FILE_BYTES} bytes")
    private_key = deserialize_private_key(blob)
    return KeyPair(private_key, private_key.get_public_key())


def owner_watch(owner_pid: int, owner_pidfd: int | None) -> Callable[[], bool]:
    """Whether the owner is gone: through its pidfd (readable once it exits) for a sidecar forked by a starter, else
    by no longer being this process's parent."""
    if owner_pidfd is None:
        return lambda: os.getppid() != owner_pid
    return lambda: bool(select.select([owner_pidfd], [], [], 0)[0])


def main(argv: list[str] | None = None, *, owner_pidfd: int | None = None) -> int:
    """Run the sidecar; its exit code. `owner_pidfd`: the owner's pidfd, where a starter forked this process (the
    owner is then not its parent)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--identity", required=True, help="key file (libp2p protobuf private key)")
    parser.add_argument("--fd", type=int, required=True, help="inherited socket to the owner")
    parser.add_argument("--owner-pid", type=int, required=True, help="exit when this parent is gone")
    parser.add_argument("--listen-host", default="127.0.0.1")
    parser.add_argument("--listen-port", type=int, default=0, help="0 = pick a free port")
    parser.add_argument("--heartbeat", type=float, default=GOSSIP_HEARTBEAT_INTERVAL, help="seconds")
    parser.add_argument("--degree-high", type=int, default=GOSSIP_DEGREE_HIGH,
                        help="prune a topic's mesh above this many peers (see GOSSIP_DEGREE_HIGH)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if not GOSSIP_DEGREE <= args.degree_high <= 1024:
        parser.error(f"--degree-high must be in [{GOSSIP_DEGREE}, 1024]")
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s gossip-sidecar[%(process)d] %(name)s: %(message)s")
    forbidden = sorted({"hivemind", "torch"} & set(sys.modules))
    if forbidden:  # would clash with libp2p's protobufs, or means the package map started importing heavy code
        logger.error("gossip sidecar must not import %s: keep swarm/__init__.py free of such imports", forbidden)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C goes to the owner, which closes the pipe
    os.environ["PY_YAMUX_RELEASE_ON_READ"] = YAMUX_RELEASE_ON_READ
    owner_gone = owner_watch(args.owner_pid, owner_pidfd)
    if owner_gone():
        logger.error("owner %d is %s: exiting", args.owner_pid,
                     "gone" if owner_pidfd is not None else "not this process's parent")
        return 2
    try:
        key_pair = _load_key_pair(args.identity)
    except Exception as e:
        logger.error("cannot load identity %s: %s: %s", args.identity, type(e).__name__, e)
        return 2
    try:
        owner_sock = socket.socket(fileno=args.fd)
    except OSError as e:
        logger.error("no owner socket on fd %d: %s", args.fd, e)
        return 2
    trio.run(_run, args, key_pair, owner_sock, owner_gone)
    return 0


if __name__ == "__main__":
    sys.exit(main())
