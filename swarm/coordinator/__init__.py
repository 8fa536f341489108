"""The coordinator process and the scheduler role.

- coordinator.py: Coordinator, the process: DHT, run spec, heartbeat, and the scheduler role
- scheduler_role.py: SchedulerRole, the scheduler at work (DHT reads, publications, gossip, metrics file); the
  coordinator and a successor peer build it the same way
- scheduler.py: Scheduler, the decisions without I/O: first plan, re-plans on membership, reruns, commits
- first_plan.py: FirstPlan, when epoch 0 is planned (the swarm settled, its links measured) and from what
- replanner.py: Replanner, the plans themselves (first, saved, after churn: moves, hand-overs, shards)
- plan_job.py: PlanJob, one re-plan's inputs, made off the scheduler's loop; where it starts if commits went on
- plan_desk.py: PlanDesk, the re-plans from asked for to stored, one at a time (settled: rebased, redone, given up)
- gone_notices.py: GoneNotices, the peers told gone under each epoch, left out of the commits it runs
- liveness.py: Liveness, which peers are alive, from heartbeat records and corroborated reports
- commit_tracker.py: CommitTracker, holders' done reports into commits; the metrics line of an iteration
- holder_shares.py: HolderShares, the share of its microbatches a holder is given, from how often it was late
- benches.py: Benches, peers taken off the run's work for a while (slow for good), and until when
- slow_holders.py: SlowHolders, a commit's lateness into share re-plans and benches, said of the newest epoch
- slow_relays.py: SlowRelays, relays' own pace reports into verdicts: slow for good or not
- slow_peers.py: SlowPeers, holders' shares, relays' verdicts and the benches of both; who may be benched
- measured_speeds.py: MeasuredSpeeds, each peer's passes against its announced speed, for the plans
- link_drift.py: LinkDrift, the hops whose measured links moved away from those the newest epoch was planned on
- cost_drift.py: CostDrift, what drifted from the newest epoch's costs (speeds, links) and whether re-planning pays
- epochs.py: EpochHistory, the epochs published and which one runs an iteration
- overtaking.py: Overtaking, whether the run went on under a successor while the coordinator was away
- away_watch.py: AwayWatch, whether this process was not run at all for a while (its host frozen), not merely busy
- alive_beat.py: AliveBeat, the scheduler's beat on gossip, from a thread of its own while its loop is busy
- shard_assignment.py: which data holder draws from which of the run's shards, epoch after epoch
- admission_desk.py: AdmissionDesk, joiners admitted (certificates issued, renewed) or refused; members' records
- restart_reports.py: RestartReports, when 'stuck' and 'unrecoverable' reports are believed (corroboration)
- unreachable_reports.py: UnreachableReports, peers' "cannot reach X" reports, corroborated into an early verdict
"""
