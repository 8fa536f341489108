"""`Throttle`: a process that runs only part of the time (a volunteer's machine taken by its owner's job).

Emulation for tests and benchmarks: the process is stopped (SIGSTOP) for `stopped` seconds after every `running`
seconds it runs, from a thread, until the throttle is closed (then it runs on). Only that process is stopped, not
its helpers (its DHT, p2p daemon, gossip sidecar): it stays reachable and beats, as a peer whose compute is starved
does. The peer cannot tell it apart from a slow device, and it announced the speed it measured at its start.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

import psutil


class Throttle:
    """Runs process `pid` `running` seconds out of every `running + stopped` while open.

    :raises ValueError: for a duty cycle that is not two positive durations
    """

    def __init__(self, pid: int, *, running: float, stopped: float) -> None:
        if not (running > 0 and stopped > 0):
            raise ValueError(f"running and stopped must be > 0 s, got {running!r} and {stopped!r}")
        self.running, self.stopped = running, stopped
        self._process = psutil.Process(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._cycle, name=f"throttle-{pid}", daemon=True)

    @property
    def share(self) -> float:
        """The share of the time the process runs."""
        return self.running / (self.running + self.stopped)

    def start(self) -> Throttle:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop throttling; the process runs on (it is resumed whatever happened)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.stopped + self.running + 5)

    def __enter__(self) -> Throttle:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def _cycle(self) -> None:
        try:
            while not self._stop.is_set():
                self._process.suspend()
                self._stop.wait(self.stopped)
                self._process.resume()
                if not self._stop.is_set():
                    time.sleep(self.running)
        except psutil.NoSuchProcess:
            pass
        finally:
            try:
                self._process.resume()
            except psutil.NoSuchProcess:
                pass
