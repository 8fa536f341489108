"""Everything that crosses a network, and the command line.

One sub-package per concern; imports point down this list only (`cli` may use everything below it, `net` nothing
above it):
- cli/: the `skippipe` and `skippipe-peer` click commands, each building options and calling one entry point
- local/: the local launcher (a coordinator and N peers as processes) and the emulated WAN
- coordinator/: the coordinator process and the scheduler role it shares with a successor peer
- peer/: the volunteer's process (join, serve, leave) and its per-iteration pipeline executor
- stage_group/: a stage group's gradient averaging (all-gather, hivemind) and stage state transfer
- control/: the signed DHT records and the gossip control plane (client and sidecar)
- net/: identity, the tensor transport, link probing, message jitter, the DHT's clean shutdown

Five leaf modules serve every sub-package:
- constants.py: network limits (header/tensor sizes, dtypes, timeouts, heartbeat, record lifetime); ports default to 0
- codec.py: WireError, msgpack without extensions, and the strict field readers every record and message uses
- wire.py: the msgpack wire records (TensorDescriptor, HopHeader, PeerRecord, RunSpec, ScheduleMsg, SignedRecord)
- run_config.py: RunConfig, a run as TOML data, and the signed run spec it becomes
- events.py: typed events (EventLog, `--events FILE`): what a process did, as JSON lines tests and tools read

Sub-packages re-export nothing: import from the module that defines a name (the gossip sidecar, for one, must
never import hivemind through a package `__init__`).
"""
