"""The trueup control plane.

Holds each device's desired state as numbered, immutable revisions; serves them
to agents (long poll); ingests agents' reports; derives fleet state; keeps
tenants apart; records every write in a hash-chained audit log.

Module map (top to bottom; import-linter keeps the order)::

    app.py        Settings and create_app: wires the parts, maps service errors to statuses
    api/          the HTTP layer: route modules per area, auth dependencies, metrics,
                  request models, the long-poll watcher
    service/      every operation, one unit per job (identity, auth, enrollment,
                  revisions, secrets, fleet view, audit trail) over a shared Store;
                  ControlPlane composes them for the API and the CLI
    ingest.py     batched, durable report ingest
    audit.py      append to and verify the hash-chained audit log
    fleet.py      fleet state derived from the desired revision, the last report, the clock
    keys.py       the server key file, tenant data keys, the secret box (AEAD)
    db.py         engines for SQLite (WAL, serialised writes) and PostgreSQL
    tables.py     the schema (SQLAlchemy Core); migrations/ creates it
    tokens.py     token generation; the hash is trueup.model.digests.token_hash

The server imports only `trueup.model` from the rest of trueup; the model
finds the sections of `spec` that subsystems own through its catalog, so the
control plane validates a document exactly as the agent does. Its libraries
(SQLAlchemy, Alembic, psycopg, cryptography) are the `server` extra.
"""
