"""GossipClient: the owner's end of the gossip control plane (schedules, membership and failure events).

py-libp2p's GossipSub and hivemind cannot live in one Python process (both register protobuf ``crypto.pb``), so
GossipSub runs in a process of its own, :mod:`swarm.control.gossip_sidecar`, one per peer or coordinator. This module
starts it (or has the host's :mod:`swarm.control.sidecar_starter` fork it), talks to it over a private socketpair and
stops it by its own pid. It imports neither libp2p nor hivemind.

Every frame on the pipe, both ways, is a 4-byte big-endian length N (1 <= N <= MAX_FRAME_BYTES) followed by N
bytes of one msgpack map with these explicit fields:

owner -> sidecar (each request carries an int ``id`` that its reply echoes)::

    {"op": "subscribe" | "unsubscribe", "id": int, "topic": str}
    {"op": "publish", "id": int, "topic": str, "payload": bytes}   payload: a msgpack map, <= MAX_PAYLOAD_BYTES
    {"op": "connect", "id": int, "maddr": str, "timeout": float}   maddr ends in /p2p/<peer id>
    {"op": "status", "id": int}
    {"op": "close", "id": int}

sidecar -> owner::

    {"type": "ready", "peer_id": str, "maddrs": [str]}              once, when it listens
    {"type": "reply", "id": int, "ok": bool, "result": any, "error": str}
    {"type": "message", "topic": str, "sender": str, "seqno": int, "payload": bytes}
    {"type": "error", "error": str}                                 a request it could not even read

``sender`` is the base58 peer id of the publisher, whose GossipSub signature the sidecar has checked; own
messages are not echoed back.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import queue
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import msgpack

from swarm.constants import CONNECT_TIMEOUT, LOOPBACK_HOST, MAX_ADDRESS_CHARS
from swarm.control.sidecar_starter import SIDECAR_STARTER_ENV, ForkedSidecar, SidecarStarterError, fork_sidecar

logger = logging.getLogger(__name__)

MAX_PAYLOAD_BYTES = 512 * 1024
"""Largest msgpack payload of one gossip message (py-libp2p refuses pubsub RPCs over 1 MiB, signature included)."""
MAX_FRAME_BYTES = MAX_PAYLOAD_BYTES + 64 * 1024
"""Largest frame on the owner <-> sidecar pipe: a payload plus its fields."""
MAX_TOPIC_CHARS = 256
MAX_QUEUED_MESSAGES = 4096
"""Received messages waiting for the owner; beyond this new ones are dropped with a warning."""
GOSSIP_HEARTBEAT_INTERVAL = 0.5
"""GossipSub heartbeat (mesh repair, IHAVE gossip); py-libp2p's default of 120 s would leave a new mesh empty."""
GOSSIP_MAX_MESSAGES_PER_SECOND = 100
"""Per topic and per forwarding peer; py-libp2p's default of 10 would drop membership events in a busy swarm."""
START_TIMEOUT = 120.0
"""Seconds the sidecar may take to listen. It imports py-libp2p (~2 CPU-s): 20 peer trees starting 3 s apart on 2
cores kept some sidecars past 30 s, and a peer that starts slowly on a loaded host is better than one that exits."""
BOOTSTRAP_ROUNDS = 3
"""Rounds of tries over the bootstrap peers (a loaded bootstrap peer may time one connection out), 2 s apart."""
REQUEST_TIMEOUT = 10.0
CLOSE_TIMEOUT = 5.0

FRAME_HEADER = struct.Struct("!I")
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class FrameError(ValueError):
    """A frame, topic or payload that breaks the format above: logged and dropped, never fatal."""


class GossipError(RuntimeError):
    """The sidecar refused a request, or is not running."""


@dataclass(frozen=True)
class GossipInfo:
    """Where the sidecar listens: its peer id (the same as in hivemind's p2pd) and multiaddrs with /p2p/<id>."""

    peer_id: str
    maddrs: tuple[str, ...]


@dataclass(frozen=True)
class GossipMessage:
    """One delivered message; ``sender`` is the publisher's peer id, checked against its signature."""

    topic: str
    sender: str
    seqno: int
    payload: dict[str, Any]


def schedule_topic(run_id: str) -> str:
    """Topic of the signed schedules of a run."""
    return check_topic(f"skippipe/{run_id}/schedule")


def membership_topic(run_id: str) -> str:
    """Topic of joins, leaves and failure notices of a run."""
    return check_topic(f"skippipe/{run_id}/membership")


def progress_topic(run_id: str) -> str:
    """Topic of the data holders' per-iteration reports (loss, tokens, timing)."""
    return check_topic(f"skippipe/{run_id}/progress")


def check_topic(topic: object) -> str:
    if not isinstance(topic, str) or not 0 < len(topic) <= MAX_TOPIC_CHARS or not topic.isprintable():
        raise FrameError(f"topic must be a printable str of 1..{MAX_TOPIC_CHARS} characters, got {topic!r:.80}")
    return topic


def encode_payload(payload: dict[str, Any]) -> bytes:
    """msgpack-encode a payload dict; raises :class:`FrameError` if it is not a str-keyed dict or too large."""
    if not isinstance(payload, dict) or not all(isinstance(key, str) for key in payload):
        raise FrameError("payload must be a dict with str keys")
    try:
        data = msgpack.packb(payload, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise FrameError(f"payload cannot be msgpack-encoded: {e}") from None
    if len(data) > MAX_PAYLOAD_BYTES:
        raise FrameError(f"payload is {len(data)} bytes, more than MAX_PAYLOAD_BYTES={MAX_PAYLOAD_BYTES}")
    return data


def decode_payload(data: object) -> dict[str, Any]:
    """Decode an untrusted payload; raises :class:`FrameError` unless it is a msgpack map with str keys."""
    if not isinstance(data, bytes):
        raise FrameError(f"payload must be bytes, got {type(data).__name__}")
    if len(data) > MAX_PAYLOAD_BYTES:
        raise FrameError(f"payload is {len(data)} bytes, more than MAX_PAYLOAD_BYTES={MAX_PAYLOAD_BYTES}")
    payload = _unpack(data, "payload")
    if not all(isinstance(key, str) for key in payload):
        raise FrameError("payload keys must be str")
    return payload


def encode_frame(fields: dict[str, Any]) -> bytes:
    """Length prefix + msgpack body of one pipe frame."""
    body = msgpack.packb(fields, use_bin_type=True)
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(f"frame is {len(body)} bytes, more than MAX_FRAME_BYTES={MAX_FRAME_BYTES}")
    return FRAME_HEADER.pack(len(body)) + body


def decode_frame(body: bytes) -> dict[str, Any]:
    """Decode the body of one pipe frame (the length prefix already checked); raises :class:`FrameError`."""
    return _unpack(body, "frame")


def frame_field(frame: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """``frame[name]``, checked to be of ``kind`` (never a bool where a number is expected)."""
    value = frame.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise FrameError(f"field {name!r} must be {getattr(kind, '__name__', kind)}, got {type(value).__name__}")
    return value


def _unpack(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises many types (ExtraData, FormatError, ValueError, ...) on garbage
        raise FrameError(f"{what} is not valid msgpack: {type(e).__name__}: {str(e)[:80]}") from None
    if not isinstance(value, dict):
        raise FrameError(f"{what} must be a msgpack map, got {type(value).__name__}")
    return value


class GossipClient:
    """Owner-side handle of one gossip sidecar process: start, subscribe, publish, receive, close.

    Methods are synchronous, thread-safe and bounded by ``timeout``. Messages arrive in a queue read by
    :meth:`receive`, or, if ``on_message`` is given, are handed to it in a dedicated thread (so the callback may
    call :meth:`publish`). The sidecar is stopped by :meth:`close`, on leaving a ``with`` block, at interpreter
    exit, and it also exits by itself when this process dies or closes the pipe.

    :param on_message: called with each :class:`GossipMessage` instead of queueing it
    :param max_queued: messages kept for :meth:`receive` before new ones are dropped
    """

    def __init__(self, *, on_message: Callable[[GossipMessage], None] | None = None,
                 max_queued: int = MAX_QUEUED_MESSAGES):
        self._on_message = on_message
        self._messages: queue.Queue[GossipMessage | None] = queue.Queue(maxsize=max_queued)
        self._proc: subprocess.Popen | ForkedSidecar | None = None
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._pending: dict[int, Future] = {}
        self._pending_lock = threading.Lock()
        self._request_ids = itertools.count(1)
        self._ready: Future[GossipInfo] = Future()
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()
        self._sidecar_gone = threading.Event()
        self._owner_pid = os.getpid()
        self.info: GossipInfo | None = None

    @property
    def pid(self) -> int | None:
        """Process id of the sidecar (None before :meth:`start`)."""
        return None if self._proc is None else self._proc.pid

    @property
    def peer_id(self) -> str:
        if self.info is None:
            raise GossipError("gossip client is not started")
        return self.info.peer_id

    def start(self, identity_path: str, *, listen_host: str = LOOPBACK_HOST, listen_port: int = 0,
              bootstrap: Iterable[str] = (), timeout: float = START_TIMEOUT, log_path: str | None = None,
              heartbeat_interval: float = GOSSIP_HEARTBEAT_INTERVAL, degree_high: int | None = None
              ) -> GossipInfo:
        """Start the sidecar, wait until it listens, connect it to ``bootstrap`` multiaddrs.

        :param identity_path: the peer's key file (libp2p protobuf RSA key, as written by swarm.net.identity)
        :param listen_port: TCP port, 0 = pick a free one
        :param bootstrap: multiaddrs with /p2p/<peer id>; unreachable ones are logged, all unreachable is an error
        :param log_path: append the sidecar's log here instead of this process's stderr
        :param degree_high: prune a topic's mesh above this many peers (None: the sidecar's default; for
          benchmarks that measure what it changes)
        :returns: the sidecar's peer id and multiaddrs
        """
        if self._proc is not None:
            raise GossipError("gossip client was already started")
        ours, theirs = socket.socketpair()
        flags = ["--identity", os.path.abspath(identity_path), "--listen-host", listen_host,
                 "--listen-port", str(int(listen_port)), "--heartbeat", repr(float(heartbeat_interval))]
        if degree_high is not None:
            flags += ["--degree-high", str(int(degree_high))]
        log_file = open(log_path, "ab") if log_path else None
        try:
            self._proc = _start_sidecar(flags, theirs, log_file)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            if log_file is not None:
                log_file.close()
        self._sock = ours
        atexit.register(self._close_at_exit)
        self._spawn(self._read_loop, "reader")
        if self._on_message is not None:
            self._spawn(self._callback_loop, "callback")
        try:
            self.info = self._ready.result(timeout)
        except TimeoutError:
            self.close()
            raise TimeoutError(f"gossip sidecar did not start within {timeout} s") from None
        except GossipError:
            self.close()
            raise
        logger.info("gossip sidecar pid %d is %s at %s", self._proc.pid, self.info.peer_id, self.info.maddrs)
        bootstrap, failures = list(bootstrap), []
        for attempt in range(BOOTSTRAP_ROUNDS if bootstrap else 0):
            if attempt:
                time.sleep(2.0)
            failures = []
            for maddr in bootstrap:
                try:
                    self.connect(maddr)
                except (GossipError, TimeoutError, FrameError) as e:
                    logger.warning("gossip bootstrap peer %s unreachable (try %d of %d): %s", maddr, attempt + 1,
                                   BOOTSTRAP_ROUNDS, e)
                    failures.append(maddr)
            if len(failures) < len(bootstrap):
                break
        if bootstrap and len(failures) == len(bootstrap):
            self.close()
            raise GossipError(f"could not reach any of the {len(bootstrap)} gossip bootstrap peers")
        return self.info

    def subscribe(self, topic: str, *, timeout: float = REQUEST_TIMEOUT) -> None:
        """Receive (and relay) messages of ``topic``; a no-op if already subscribed."""
        self._request("subscribe", timeout, topic=check_topic(topic))

    def unsubscribe(self, topic: str, *, timeout: float = REQUEST_TIMEOUT) -> None:
        self._request("unsubscribe", timeout, topic=check_topic(topic))

    def publish(self, topic: str, payload: dict[str, Any], *, timeout: float = REQUEST_TIMEOUT,
                wait: bool = True) -> Future | None:
        """Sign and gossip ``payload`` (a str-keyed dict, msgpack-encoded, at most MAX_PAYLOAD_BYTES) on ``topic``.

        :param wait: if False, return a Future of the sidecar's acknowledgement instead of waiting for it
        """
        future = self._request_future("publish", topic=check_topic(topic), payload=encode_payload(payload))
        return self._wait(future, "publish", timeout) if wait else future

    def connect(self, maddr: str, *, timeout: float = CONNECT_TIMEOUT) -> str:
        """Connect to a peer's sidecar at ``maddr`` (ending in /p2p/<peer id>); returns its peer id."""
        if not isinstance(maddr, str) or not 0 < len(maddr) <= MAX_ADDRESS_CHARS:
            raise FrameError(f"multiaddr must be a str of 1..{MAX_ADDRESS_CHARS} characters")
        return self._request("connect", timeout + 1.0, maddr=maddr, timeout=float(timeout))

    def connect_all(self, maddrs: Sequence[str], *, timeout: float = CONNECT_TIMEOUT) -> dict[str, str | None]:
        """Connect to the sidecars at ``maddrs`` at once (the sidecar dials them concurrently), each dial given
        ``timeout`` seconds: one silent peer (a frozen host answers nothing, a dead one's record outlives it) costs one
        timeout, not one each. Returns maddr -> the peer id connected, or None where the dial failed or timed out."""
        if not all(isinstance(m, str) and 0 < len(m) <= MAX_ADDRESS_CHARS for m in maddrs):
            raise FrameError(f"multiaddr must be a str of 1..{MAX_ADDRESS_CHARS} characters")
        futures = {m: self._request_future("connect", maddr=m, timeout=float(timeout)) for m in maddrs}
        linked: dict[str, str | None] = {}
        deadline = time.monotonic() + timeout + 1.0
        for maddr, future in futures.items():
            try:
                peer = self._wait(future, "connect", max(deadline - time.monotonic(), 0.0))
                linked[maddr] = peer if isinstance(peer, str) else None
            except (GossipError, TimeoutError) as e:
                logger.debug("gossip link to %s failed: %s", maddr, e)
                linked[maddr] = None
        return linked

    def status(self, *, timeout: float = REQUEST_TIMEOUT) -> dict[str, Any]:
        """``{"peer_id", "maddrs", "peers": [connected pubsub peers], "topics": {topic: {"subscribers", "mesh"}}}``."""
        return self._request("status", timeout)

    def wait_for_mesh(self, topic: str, min_peers: int = 1, *, timeout: float = REQUEST_TIMEOUT) -> list[str]:
        """Wait until our GossipSub mesh for ``topic`` holds ``min_peers`` peers; returns them.

        Messages published before a mesh exists reach nobody, so a publisher that must not lose its first
        messages waits here first.
        """
        deadline = time.monotonic() + timeout
        while True:
            mesh = self.status(timeout=max(deadline - time.monotonic(), 0.1))["topics"].get(topic, {}).get("mesh", [])
            if len(mesh) >= min_peers:
                return mesh
            if time.monotonic() > deadline:
                raise TimeoutError(f"gossip mesh of {topic!r} has {len(mesh)} peers after {timeout} s, "
                                   f"wanted {min_peers}")
            time.sleep(0.05)

    def receive(self, timeout: float | None = None) -> GossipMessage:
        """The next message; raises TimeoutError if none arrives within ``timeout`` seconds."""
        if self._on_message is not None:
            raise GossipError("messages go to on_message; receive() is for clients without a callback")
        try:
            message = self._messages.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no gossip message within {timeout} s") from None
        if message is None:
            self._put_message(None)  # keep waking later callers too
            raise GossipError("gossip client is closed or its sidecar exited")
        return message

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Stop the sidecar: ask it to leave, close the pipe, then terminate and kill it by pid if it lingers."""
        if self._proc is None or self._closed.is_set():
            return
        self._closed.set()
        atexit.unregister(self._close_at_exit)
        if not self._sidecar_gone.is_set():
            try:
                self._request("close", min(1.0, timeout), closing=True)
            except (GossipError, TimeoutError, OSError):
                pass
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        _stop_process(self._proc, timeout)
        self._put_message(None)  # wakes receive() and the callback thread
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout)

    def __enter__(self) -> GossipClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _close_at_exit(self) -> None:
        if os.getpid() == self._owner_pid:  # not in a forked child that inherited this object
            self.close(timeout=2.0)

    def _spawn(self, target: Callable[[], None], role: str) -> None:
        thread = threading.Thread(target=target, name=f"gossip-{role}-{self._proc.pid}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _request(self, op: str, timeout: float, /, *, closing: bool = False, **fields) -> Any:
        return self._wait(self._request_future(op, closing=closing, **fields), op, timeout)

    def _request_future(self, op: str, /, *, closing: bool = False, **fields) -> Future:
        if self._sock is None or (self._closed.is_set() and not closing) or self._sidecar_gone.is_set():
            raise GossipError("gossip sidecar is not running")
        request_id = next(self._request_ids)
        future: Future = Future()
        with self._pending_lock:
            self._pending[request_id] = future
        try:
            data = encode_frame({"op": op, "id": request_id, **fields})
            with self._send_lock:
                self._sock.sendall(data)
        except (OSError, FrameError) as e:
            with self._pending_lock:
                self._pending.pop(request_id, None)
            raise GossipError(f"cannot send {op!r} to the gossip sidecar: {e}") from e
        future.request_id = request_id
        return future

    def _wait(self, future: Future, op: str, timeout: float) -> Any:
        try:
            return future.result(timeout)
        except TimeoutError:
            raise TimeoutError(f"gossip sidecar did not answer {op!r} within {timeout} s") from None
        finally:
            with self._pending_lock:
                self._pending.pop(future.request_id, None)

    def _read_loop(self) -> None:
        sock, pid = self._sock, self._proc.pid
        try:
            while True:
                header = _recv_exactly(sock, FRAME_HEADER.size)
                if header is None:
                    break
                (length,) = FRAME_HEADER.unpack(header)
                if not 0 < length <= MAX_FRAME_BYTES:
                    logger.error("gossip sidecar %d sent a frame of %d bytes (limit %d): skipped", pid, length,
                                 MAX_FRAME_BYTES)
                    if not _skip_exactly(sock, length):
                        break
                    continue
                body = _recv_exactly(sock, length)
                if body is None:
                    break
                try:
                    self._dispatch(decode_frame(body))
                except FrameError as e:
                    logger.warning("dropped a frame from gossip sidecar %d: %s", pid, e)
        except OSError as e:
            if not self._closed.is_set():
                logger.warning("pipe to gossip sidecar %d failed: %s", pid, e)
        finally:
            self._sidecar_gone.set()
            error = GossipError(f"gossip sidecar {pid} exited (code {_exit_code(self._proc)}); see its log")
            if not self._ready.done():
                self._ready.set_exception(error)
            with self._pending_lock:
                pending, self._pending = list(self._pending.values()), {}
            for future in pending:
                if not future.done():
                    future.set_exception(error)
            if not self._closed.is_set():
                logger.warning("%s", error)
                self._put_message(None)

    def _dispatch(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind == "message":
            message = GossipMessage(topic=check_topic(frame.get("topic")), sender=frame_field(frame, "sender", str),
                                    seqno=frame_field(frame, "seqno", int),
                                    payload=decode_payload(frame.get("payload")))
            self._put_message(message)
        elif kind == "reply":
            with self._pending_lock:
                future = self._pending.pop(frame_field(frame, "id", int), None)
            if future is None or future.done():
                return  # the caller gave up waiting
            if frame.get("ok") is True:
                future.set_result(frame.get("result"))
            else:
                future.set_exception(GossipError(str(frame.get("error", "unknown error"))[:500]))
        elif kind == "ready":
            maddrs = frame_field(frame, "maddrs", list)
            if not all(isinstance(maddr, str) for maddr in maddrs):
                raise FrameError("field 'maddrs' must be a list of str")
            if not self._ready.done():
                self._ready.set_result(GossipInfo(frame_field(frame, "peer_id", str), tuple(maddrs)))
        elif kind == "error":
            logger.warning("gossip sidecar %d refused a frame: %s", self._proc.pid, str(frame.get("error"))[:500])
        else:
            raise FrameError(f"unknown frame type {kind!r:.40}")

    def _put_message(self, message: GossipMessage | None) -> None:
        try:
            self._messages.put_nowait(message)
        except queue.Full:
            if message is not None:
                logger.warning("gossip queue full (%d): dropped a message on %s from %s",
                               self._messages.maxsize, message.topic, message.sender)

    def _callback_loop(self) -> None:
        while (message := self._messages.get()) is not None:
            try:
                self._on_message(message)
            except Exception:
                logger.exception("gossip on_message callback failed on a message from %s", message.sender)


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _skip_exactly(sock: socket.socket, n: int) -> bool:
    while n > 0:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            return False
        n -= len(chunk)
    return True


def _start_sidecar(flags: list[str], theirs: socket.socket, log_file) -> subprocess.Popen | ForkedSidecar:
    """The sidecar, run with `flags` and talking over `theirs`: forked by the host's sidecar starter where one is
    named (`SIDECAR_STARTER_ENV`), else, or if it cannot, started cold."""
    starter = os.environ.get(SIDECAR_STARTER_ENV)
    if starter:
        try:
            return fork_sidecar(starter, flags, theirs, log_file.fileno() if log_file is not None else 2)
        except SidecarStarterError as e:
            logger.warning("%s: starting the gossip sidecar cold", e)
    cmd = [sys.executable, "-m", "swarm.control.gossip_sidecar", *flags, "--fd", str(theirs.fileno()),
           "--owner-pid", str(os.getpid())]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_REPO_ROOT, os.environ.get("PYTHONPATH")])))
    return subprocess.Popen(cmd, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=log_file, env=env)


def _exit_code(proc: subprocess.Popen | ForkedSidecar) -> int | None:
    try:
        return proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        return None


def _stop_process(proc: subprocess.Popen | ForkedSidecar, timeout: float) -> None:
    """Wait for ``proc`` to exit by itself, then terminate it, then kill it: only this pid, never a name."""
    try:
        proc.wait(timeout)
        return
    except subprocess.TimeoutExpired:
        logger.warning("gossip sidecar %d did not exit within %.1f s: terminating it", proc.pid, timeout)
    proc.terminate()
    try:
        proc.wait(2.0)
    except subprocess.TimeoutExpired:
        logger.warning("gossip sidecar %d ignored SIGTERM: killing it", proc.pid)
        proc.kill()
        proc.wait()
