"""Backups: the archive format, creating archives, and analysing one before any restore.

Public face (see docs/backup-restore.md):

* `trueup.backup.format` — `Manifest`, `Entry`, component names, `FORMAT_VERSION`;
* `trueup.backup.writer.ArchiveWriter` — builds an archive (streamed, atomic);
* `trueup.backup.reader` — `scan_archive` (every member checked) and
  `open_component(path, entry)` (one entry, verified while it streams);
* `trueup.backup.analysis.analyze(path, state, links, mappings) -> Analysis`;
* `trueup.backup.interfaces` — interface names in a document, `map_interfaces`;
* `trueup.backup.create.create_backup` — `trueup backup create`.

Layering: above `trueup.reconcile` (the restore state machine applies
through the transaction engine), below `trueup.startup` (which resumes a
pending restore) and the agent.
"""
