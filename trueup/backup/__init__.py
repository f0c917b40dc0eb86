"""Backups: the archive format, creating archives, analysing one, and restoring it.

Public face (see docs/backup-restore.md):

* `trueup.backup.format` — `Manifest`, `Entry`, component names, `FORMAT_VERSION`;
* `trueup.backup.writer.ArchiveWriter` — builds an archive (streamed, atomic);
* `trueup.backup.reader` — `scan_archive` (every member checked) and
  `open_component(path, entry)` (one entry, verified while it streams);
* `trueup.backup.analysis.analyze(path, state, links, mappings) -> Analysis`;
* `trueup.backup.interfaces` — interface names in a document, `map_interfaces`;
* `trueup.backup.create.create_backup` — `trueup backup create`;
* `trueup.backup.restore` — `start_restore` / `resume`: `trueup restore apply`
  as a journaled state machine (record: `trueup.journal.restore`), with
  `leaseswap` (staging, a full restore's lease replacement) and
  `restorechecks` (verification).

Layering: above `trueup.reconcile` (the restore state machine applies
through the transaction engine), below `trueup.startup` (which resumes a
pending restore) and the agent.
"""
