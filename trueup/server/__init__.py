"""The trueup control plane.

Holds each device's desired state as numbered, immutable revisions; serves them
to agents (long poll); ingests agents' reports; derives fleet state; keeps
tenants apart; records every write in a hash-chained audit log.

Module map::

    tables.py     the schema (SQLAlchemy Core); migrations/ creates it
    db.py         engines for SQLite (WAL, serialised writes) and PostgreSQL
    tokens.py     token generation and hashing
    keys.py       the server key file, tenant data keys, the secret box (AEAD)
    audit.py      append to and verify the hash-chained audit log
    service.py    every write, shared by the HTTP API and the CLI
    fleet.py      fleet state derived from desired version and the last report
    ingest.py     batched, durable report ingest
    app.py        the FastAPI application

The server imports only `trueup.model` from the rest of trueup.
"""
