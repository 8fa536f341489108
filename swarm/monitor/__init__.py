"""Watching a run from outside: `skippipe monitor`.

- observer.py: SwarmObserver, an onlooker in the DHT (client) and the run's gossip (listener) that keeps the view
- snapshot.py: swarm_snapshot, the view at one moment as JSON-ready data (peers, groups, schedule, progress, links)
- progress.py: ProgressLog, committed iterations rebuilt from the holders' reports and the scheduler's commits
- terminal.py: render_text, the view as a plain-text screen
- web.py: MonitorServer, the view as a read-only web page (page.html) and /snapshot.json
"""
