"""Activation transfer between two peers (separate processes) on loopback, against raw asyncio TCP.

Each repetition sends one 4 MiB and one 32 MiB float32 activation with ``swarm.net.transport.Transport`` (hivemind
p2pd binary streams, reused between messages, header + raw bytes, acknowledged after the receiver queued it), the
same payloads over a plain asyncio TCP connection (length prefix, 8-byte ack), and over one bare reused p2pd stream
between two other daemons (length prefix, 1 MiB writes, 3-byte ack: the floor any framing over p2pd can reach);
the three are interleaved, in a rotating order, so all see the same machine load. Reports median MB/s, the ratio to
TCP, the ratio to the bare p2pd stream, and the round trip of a 1 KiB message on each.

    .venv/bin/python benchmarks/transport.py [--reps 5] [--pings 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import threading
import time

SIZES = {"4MiB": 4 * 2**20, "32MiB": 32 * 2**20}
PING_BYTES = 1024
RAW_PROTOCOL = "bench.raw"
CHUNK = 2**20


def receiver_peer(initial_peers: list[str], info_q: mp.Queue, stop_ev) -> None:
    import hivemind

    from swarm.net.dht_shutdown import stop_dht
    from swarm.net.transport import Transport

    dht = hivemind.DHT(initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    transport = Transport(dht, lambda sender, header, tensor: None, queue_size=2)
    info_q.put(transport.peer_id)
    stop_ev.wait(600)
    transport.shutdown()
    stop_dht(dht)


def raw_p2p_server(info_q: mp.Queue, stop_ev) -> None:
    """A bare p2pd with a handler that reads length-prefixed payloads into a buffer and acks each."""
    from hivemind.p2p import P2P

    async def handle(_info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                n = int.from_bytes(await reader.readexactly(8), "big")
                view, pos = memoryview(bytearray(n)), 0
                while pos < n:
                    chunk = await reader.read(min(n - pos, CHUNK))
                    if not chunk:
                        raise asyncio.IncompleteReadError(b"", n)
                    view[pos : pos + len(chunk)] = chunk
                    pos += len(chunk)
                writer.write(b"\0\0\0")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):  # cancelled: at exit
            writer.close()

    async def main() -> None:
        p2p = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        await p2p.add_binary_stream_handler(RAW_PROTOCOL, handle)
        info_q.put(([str(m) for m in await p2p.get_visible_maddrs()], p2p.peer_id.to_base58()))
        await asyncio.get_running_loop().run_in_executor(None, stop_ev.wait, 600)
        await p2p.shutdown()

    asyncio.run(main())


def tcp_server(port_q: mp.Queue, stop_ev) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                n = int.from_bytes(await reader.readexactly(8), "big")
                data = await reader.readexactly(n)
                writer.write(len(data).to_bytes(8, "big"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):  # cancelled: at exit
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port_q.put(server.sockets[0].getsockname()[1])
        await asyncio.get_running_loop().run_in_executor(None, stop_ev.wait, 600)
        server.close()

    asyncio.run(main())


class TcpClient:
    def __init__(self, port: int):
        self.loop = asyncio.new_event_loop()
        self.reader, self.writer = self.loop.run_until_complete(asyncio.open_connection("127.0.0.1", port))

    def send(self, payload: bytes) -> float:
        async def go() -> float:
            start = time.perf_counter()
            self.writer.write(len(payload).to_bytes(8, "big"))
            self.writer.write(payload)
            await self.writer.drain()
            assert int.from_bytes(await self.reader.readexactly(8), "big") == len(payload)
            return time.perf_counter() - start

        return self.loop.run_until_complete(go())

    def close(self) -> None:
        self.writer.close()
        self.loop.close()


class RawP2PClient:
    """One bare p2pd stream, opened once and reused: the same framing cost as TCP, over p2pd."""

    def __init__(self, maddrs: list[str], peer_id: str):
        from hivemind.p2p import P2P, PeerID

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def start():
            self.p2p = await P2P.create(initial_peers=maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
            _, self.reader, self.writer = await self.p2p.call_binary_stream_handler(PeerID.from_base58(peer_id),
                                                                                   RAW_PROTOCOL)

        self._run(start())

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)

    def send(self, payload: bytes) -> float:
        async def go() -> float:
            start = time.perf_counter()
            view = memoryview(payload)
            self.writer.write(len(payload).to_bytes(8, "big"))
            for pos in range(0, len(view), CHUNK):
                self.writer.write(view[pos : pos + CHUNK])
                await self.writer.drain()
            await self.reader.readexactly(3)
            return time.perf_counter() - start

        return self._run(go())

    def close(self) -> None:
        async def stop():
            self.writer.close()
            await self.p2p.shutdown()

        self._run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--pings", type=int, default=50)
    args = parser.parse_args()

    import hivemind
    import torch

    from swarm.net.dht_shutdown import stop_dht
    from swarm.net.transport import Transport
    from swarm.wire import Direction, HopHeader

    ctx = mp.get_context("spawn")
    stop_ev, info_q, port_q, raw_q = ctx.Event(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    procs = [ctx.Process(target=receiver_peer, args=([str(m) for m in dht.get_visible_maddrs()], info_q, stop_ev)),
             ctx.Process(target=tcp_server, args=(port_q, stop_ev)),
             ctx.Process(target=raw_p2p_server, args=(raw_q, stop_ev))]
    for p in procs:
        p.start()
    transport = tcp = raw = None
    try:
        peer = info_q.get(timeout=120)
        tcp = TcpClient(port_q.get(timeout=60))
        raw = RawP2PClient(*raw_q.get(timeout=120))
        transport = Transport(dht, lambda *msg: None)

        def header(shape: tuple[int, ...]) -> HopHeader:
            return HopHeader(run="bench", iteration=0, microbatch=0, route=(transport.peer_id, peer), hop=1,
                             direction=Direction.FORWARD, epoch=0, dtype="float32", shape=shape)

        tensors = {name: torch.randn(n // 4 // 1024, 1024) for name, n in SIZES.items()}
        payloads = {name: bytes(n) for name, n in SIZES.items()}
        for name in SIZES:  # warm-up: connections, allocator
            transport.send(peer, header(tensors[name].shape), tensors[name])
            tcp.send(payloads[name])
            raw.send(payloads[name])
        kinds = ("swarm", "tcp", "p2pd")
        times: dict[str, list[float]] = {f"{kind}_{name}": [] for kind in kinds for name in SIZES}

        def swarm_send(payload: torch.Tensor) -> float:
            start = time.perf_counter()
            transport.send(peer, header(payload.shape), payload)
            return time.perf_counter() - start

        senders = {"swarm": lambda name: swarm_send(tensors[name]), "tcp": lambda name: tcp.send(payloads[name]),
                   "p2pd": lambda name: raw.send(payloads[name])}
        for rep in range(args.reps):
            for name in SIZES:
                for kind in kinds[rep % 3:] + kinds[: rep % 3]:  # rotate: no kind always follows a 32 MiB burst
                    times[f"{kind}_{name}"].append(senders[kind](name))
        small = torch.zeros(PING_BYTES // 4)
        pings: dict[str, list[float]] = {kind: [] for kind in kinds}
        for _ in range(args.pings):
            start = time.perf_counter()
            transport.send(peer, header(small.shape), small)
            pings["swarm"].append(time.perf_counter() - start)
            pings["tcp"].append(tcp.send(bytes(PING_BYTES)))
            pings["p2pd"].append(raw.send(bytes(PING_BYTES)))
        streams = transport.stats()["streams_opened"]
    finally:
        if transport is not None:
            transport.shutdown()
        if tcp is not None:
            tcp.close()
        if raw is not None:
            raw.close()
        stop_ev.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.terminate()
        stop_dht(dht)

    report: dict = {"streams_opened": streams}
    print(f"{'payload':>8} {'swarm MB/s':>11} {'tcp MB/s':>9} {'ratio':>6} {'p2pd MB/s':>10} {'vs p2pd':>8}")
    for name, n in SIZES.items():
        swarm, base, floor = (n / statistics.median(times[f"{kind}_{name}"]) / 1e6 for kind in kinds)
        report[name] = {"swarm_MBps": round(swarm, 1), "tcp_MBps": round(base, 1), "ratio": round(swarm / base, 2),
                        "p2pd_MBps": round(floor, 1), "ratio_to_p2pd": round(swarm / floor, 2)}
        print(f"{name:>8} {swarm:>11.1f} {base:>9.1f} {swarm / base:>6.2f} {floor:>10.1f} {swarm / floor:>8.2f}")
    for kind in kinds:
        ms = sorted(pings[kind])
        report[f"{kind}_1KiB_roundtrip_ms"] = {"median": round(statistics.median(ms) * 1e3, 2),
                                               "p90": round(ms[int(0.9 * len(ms))] * 1e3, 2)}
    print("1 KiB message round trip (ms): " + ", ".join(f"{kind} {report[f'{kind}_1KiB_roundtrip_ms']}"
                                                        for kind in kinds))
    print(f"streams opened by the sender: {streams} for {len(SIZES) * (args.reps + 1) + args.pings} messages")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
