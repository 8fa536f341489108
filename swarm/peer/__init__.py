"""A volunteer's process: `Peer` (join, serve, leave) over components with one job each.

- peer.py: Peer, the process: joins, follows the schedule's epochs, loops over iterations, drains and leaves
- options.py: PeerOptions, how a peer joins (the run itself is the coordinator's run spec)
- schedule_follower.py: ScheduleFollower, the epoch in use and the next one, commits, 'gone' and 'finished'
- departure.py: Departure, a peer asked to stop: drains while the scheduler plans without it, or leaves at once
- succession.py: Succession, the watch on the scheduler's heartbeat and the scheduler role its successor takes on
- stage_keeper.py: StageKeeper, which stage the peer serves with which state; moves, equipping and hand-over
- stage_session.py: StageSession, a stage's worker and averager (rebuilt on a move), and how one is equipped
- iteration_runner.py: IterationRunner, one iteration from the first microbatch to the optimizer step
- iteration_clock.py: IterationClock, measured iteration times and the deadlines derived from them
- pipeline.py: PipelineExecutor, one peer's part of one iteration, driven by the messages it receives
- inbound_checks.py: InboundChecks, what the peer expects to receive, told to its transport before any allocation
- members.py: Members, the peer's admission (its certificate) and which peers are members it takes input from
- run_spec.py: await_run_spec, the wait for the run spec of the one coordinator a joiner trusts
- faults.py: tamper, a peer misbehaving on purpose (--fault) to test a swarm's defences
- hop_check.py: hop_mismatch, whether a pipeline message fits the schedule (route, detour, hop, sender)
- awaited_backwards.py: AwaitedBackwards, forwards whose backward a peer waits for, and which are late
- mailbox.py: Inbox and Outbox, bounded: a slow stage slows the stages sending to it
- data_holder.py: DataHolder, a stage-0 peer's shards as the schedule assigns them
- reports.py: Reports, what the peer tells the scheduler (done, stuck, broken, unrecoverable, unreachable)
- link_watch.py: LinkWatch, the peer's link measurements, kept fresh in the background
- timeline.py: Timeline, a peer's compute and send spans, and the Chrome trace of a whole run
- console.py: iteration_line, the one line per iteration a volunteer's console shows
- host_share.py: ThreadShare, torch threads sized to this peer's share of its machine's cores
- reachability_notice.py: join_reachability, how the peer can be reached, and what it tells its volunteer
- activation_watch.py: ActivationWatch, forwards with non-finite values refused before they are computed with
"""
