// Package stream is keepwarm's change stream: it follows PostgreSQL's logical replication (a permanent slot, the
// pgoutput plugin, through jackc/pglogrepl) and hands batches of committed transactions to an apply function,
// acknowledging an LSN only once everything up to it was applied. The warmer applies them (warmer.Changes, in
// warmer/streamapply.go); cmd/keepwarm wires the two (cmd/keepwarm/stream.go).
//
// One concept a file:
//
//   - stream.go: Stream, its Config and Status; Run's sessions; the receive loop and the applier (applyLoop);
//     Check, what `keepwarm validate --check-db` asks of the server.
//   - pgoutput.go: a pure decoder of pgoutput's messages (protocol version 1) into Txn and Change, with the
//     Relation messages' replica identity and the renaming of partitions to their partitioned table.
//   - publication.go: the publication, read at each session's start and every PublicationCheck, repaired where
//     keepwarm owns it, and every remaining gap a Problem.
//   - slot.go: the slot, created (a failover slot from PostgreSQL 17), recreated when invalidated or when the
//     publication was dropped and created again under it, taken over from a stale holder.
//   - resync.go: the resyncs the stream owes when it could not deliver changes, and the OwedStore that keeps them
//     across a crash; owed.go: that store in Redis (OwedResyncs), which also remembers that a slot was streamed
//     from (SlotHistory).
//   - lease.go: the fleet's stream lease in Redis (Lease): one daemon of a fleet streams.
//   - catalog.go: CheckFeeds, the fed_by tables and columns against the catalog.
//   - stream_metrics.go: keepwarm_stream_*.
//
// Delivery is at least once: a batch whose apply fails is retried, never acknowledged meanwhile, and a
// restarted stream resumes at the slot's confirmed LSN. What the stream cannot deliver (a lost slot, a
// truncate, a transaction above MaxTxnChanges, a publication gap) it resyncs (Config.Resync). How it is run and
// what each metric and problem means: docs/operations.md, "Change-driven refresh".
package stream
