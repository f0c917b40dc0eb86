"""The control plane's HTTP layer; `trueup.server.app.create_app` assembles it.

context.py     Api (the parts every route module gets), role dependencies, problems()
models.py      request bodies and the agent report
metrics.py     Prometheus metrics and the measuring middleware
watcher.py     RevisionWatcher: wakes the agents' long polls
routes/        one module per area: probes, devices, revisions, secrets, identity, agents
"""
