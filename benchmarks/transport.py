"""Activation transfer between two peers (separate processes) on loopback, against raw asyncio TCP.

Each repetition sends one 4 MiB and one 32 MiB float32 activation with ``swarm.transport.Transport`` (hivemind
p2pd binary streams, header + raw bytes, acknowledged after the receiver queued it), and the same payloads over a
plain asyncio TCP connection (length prefix, 8-byte ack); the two are interleaved so both see the same machine
load. Reports median MB/s, the ratio to TCP, and the round trip of a 1 KiB message on each.

    .venv/bin/python benchmarks/transport.py [--reps 5] [--pings 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import time

SIZES = {"4MiB": 4 * 2**20, "32MiB": 32 * 2**20}
PING_BYTES = 1024


def receiver_peer(initial_peers: list[str], info_q: mp.Queue, stop_ev) -> None:
    import hivemind

    from swarm.transport import Transport

    dht = hivemind.DHT(initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    transport = Transport(dht, lambda sender, header, tensor: None, queue_size=2)
    info_q.put(transport.peer_id)
    stop_ev.wait(600)
    transport.shutdown()
    dht.shutdown()


def tcp_server(port_q: mp.Queue, stop_ev) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                n = int.from_bytes(await reader.readexactly(8), "big")
                data = await reader.readexactly(n)
                writer.write(len(data).to_bytes(8, "big"))
                await writer.drain()
        except asyncio.IncompleteReadError:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--pings", type=int, default=50)
    args = parser.parse_args()

    import hivemind
    import torch

    from swarm.transport import Transport
    from swarm.wire import Direction, HopHeader

    ctx = mp.get_context("spawn")
    stop_ev, info_q, port_q = ctx.Event(), ctx.Queue(), ctx.Queue()
    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    procs = [ctx.Process(target=receiver_peer, args=([str(m) for m in dht.get_visible_maddrs()], info_q, stop_ev)),
             ctx.Process(target=tcp_server, args=(port_q, stop_ev))]
    for p in procs:
        p.start()
    transport = tcp = None
    try:
        peer = info_q.get(timeout=120)
        tcp = TcpClient(port_q.get(timeout=60))
        transport = Transport(dht, lambda *msg: None)

        def header(shape: tuple[int, ...]) -> HopHeader:
            return HopHeader(run="bench", iteration=0, microbatch=0, route=(transport.peer_id, peer), hop=1,
                             direction=Direction.FORWARD, epoch=0, dtype="float32", shape=shape)

        tensors = {name: torch.randn(n // 4 // 1024, 1024) for name, n in SIZES.items()}
        payloads = {name: bytes(n) for name, n in SIZES.items()}
        for name in SIZES:  # warm-up: connections, allocator
            transport.send(peer, header(tensors[name].shape), tensors[name])
            tcp.send(payloads[name])
        times: dict[str, list[float]] = {f"{kind}_{name}": [] for kind in ("swarm", "tcp") for name in SIZES}
        for _ in range(args.reps):
            for name in SIZES:
                start = time.perf_counter()
                transport.send(peer, header(tensors[name].shape), tensors[name])
                times[f"swarm_{name}"].append(time.perf_counter() - start)
                times[f"tcp_{name}"].append(tcp.send(payloads[name]))
        small = torch.zeros(PING_BYTES // 4)
        pings = {"swarm": [], "tcp": []}
        for _ in range(args.pings):
            start = time.perf_counter()
            transport.send(peer, header(small.shape), small)
            pings["swarm"].append(time.perf_counter() - start)
            pings["tcp"].append(tcp.send(bytes(PING_BYTES)))
    finally:
        if transport is not None:
            transport.shutdown()
        if tcp is not None:
            tcp.close()
        stop_ev.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.terminate()
        dht.shutdown()

    report = {}
    print(f"{'payload':>8} {'swarm MB/s':>11} {'tcp MB/s':>9} {'ratio':>6}")
    for name, n in SIZES.items():
        swarm = n / statistics.median(times[f"swarm_{name}"]) / 1e6
        base = n / statistics.median(times[f"tcp_{name}"]) / 1e6
        report[name] = {"swarm_MBps": round(swarm, 1), "tcp_MBps": round(base, 1), "ratio": round(swarm / base, 2)}
        print(f"{name:>8} {swarm:>11.1f} {base:>9.1f} {swarm / base:>6.2f}")
    for kind in ("swarm", "tcp"):
        report[f"{kind}_1KiB_roundtrip_ms"] = {"median": round(statistics.median(pings[kind]) * 1e3, 2),
                                               "p90": round(sorted(pings[kind])[int(0.9 * len(pings[kind]))] * 1e3,
                                                            2)}
    print(f"1 KiB message round trip: swarm {report['swarm_1KiB_roundtrip_ms']} ms, "
          f"tcp {report['tcp_1KiB_roundtrip_ms']} ms")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
