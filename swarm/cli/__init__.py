"""The command line: click commands only, each building options and calling one entry point.

- main.py: the `skippipe` and `skippipe-peer` click groups (entry points `main`, `peer_main`); each subcommand is
  imported only when it runs
- plan.py: `skippipe plan` and `skippipe simulate`
- demo.py: `skippipe demo`, the README's main job
- train.py: `skippipe swarm inprocess` and `skippipe eval`
- run.py: `skippipe coordinator start`, `skippipe-peer join` and `skippipe swarm local`
- stop_signal.py: stop_event, the SIGINT / SIGTERM handler long-running commands stop on (not inherited by forks)
"""
