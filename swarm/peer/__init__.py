"""A volunteer's process.

- peer.py: Peer, one volunteer's process: join, announce, get placed, iterate, leave
- pipeline.py: PipelineExecutor, one peer's part of one iteration, driven by the messages it receives
- timeline.py: Timeline, a peer's compute and send spans, and the Chrome trace of a whole run
"""
