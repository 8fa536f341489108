"""The coordinator process and the scheduler role.

- coordinator.py: Coordinator, plans from the live swarm, commits iterations, re-plans on churn (also the role a
  peer takes over when the coordinator dies)
- shard_assignment.py: which data holder draws from which of the run's shards, epoch after epoch
- unreachable_reports.py: UnreachableReports, peers' "cannot reach X" reports, corroborated into an early verdict
"""
