package stream

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Change is one row change of a feeding table. Old and New hold the row's columns as PostgreSQL's text output,
// for non-NULL values only: New for INSERT and UPDATE; Old for DELETE (the replica identity columns, or every
// column with REPLICA IDENTITY FULL) and for UPDATE when PostgreSQL sends the old row (REPLICA IDENTITY FULL, or
// a changed key). A column whose TOASTed value did not change is in neither.
type Change struct {
	Table    string // "schema.table"
	Op       byte   // 'I' insert, 'U' update, 'D' delete
	Old, New map[string]string
}

// Txn is one committed transaction's changes to feeding tables, in the order they were made.
type Txn struct {
	End    uint64    // the LSN just past the commit record: acknowledged once applied
	Commit time.Time // the commit time, on the primary's clock
	// Xid is the transaction's id (32 bits, as pgoutput's Begin message sends it): WaitVisible asks whether it is
	// visible to a new snapshot yet.
	Xid     uint32
	Changes []Change
	// Truncated lists the feeding tables the transaction truncated (Resync is called for them).
	Truncated []string
	// Overflowed is set when the transaction changed more rows than Config.MaxTxnChanges: Changes is
	// empty, and Resync was called for it (ResyncLargeTransaction).
	Overflowed bool
	// OldUnknown counts the UPDATEs of a feeding table whose old values of kept columns PostgreSQL did not send
	// (a kept column outside the table's replica identity, which is not FULL): if such an UPDATE moved the row
	// from one id to another, only the new id is known.
	OldUnknown int
	rows       int // row changes received, kept or not

	received time.Time
}

// ErrPgoutput is wrapped by every error of the pgoutput decoder: a message that is truncated, of an unknown
// type, or otherwise not what protocol version 1 sends.
var ErrPgoutput = errors.New("postgres: malformed pgoutput message")

// pgoutput message types of protocol version 1 (PostgreSQL docs, "Logical Replication Message Formats",
// https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html).
const (
	msgBegin    = 'B'
	msgCommit   = 'C'
	msgOrigin   = 'O'
	msgRelation = 'R'
	msgType     = 'Y'
	msgInsert   = 'I'
	msgUpdate   = 'U'
	msgDelete   = 'D'
	msgTruncate = 'T'
	msgMessage  = 'M' // pg_logical_emit_message; sent only with the "messages" option, which keepwarm does not set
)

// pgEpoch is PostgreSQL's timestamp epoch: timestamps count microseconds from 2000-01-01 00:00 UTC.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// decoder turns the pgoutput plugin's messages (protocol version 1, the one the stream asks for) into
// transactions. It is pure: no I/O and no clock. The stream hands it, in order, the WAL data of each XLogData
// message it receives, and gets back each transaction at its Commit. The decoder keeps the relations announced
// (a Relation message precedes a table's first change in each session, and again after its definition changed)
// and the transaction in progress.
//
// Of each row it keeps only the columns keep names for its table (all when keep has no entry for it), and of
// each transaction at most max changes (no cap when max <= 0): past that, the transaction's changes are dropped
// as they arrive and it is delivered with Overflowed set, so that memory stays bounded whatever one transaction
// changes.
type decoder struct {
	relations map[uint32]relation
	keep      map[string]map[string]bool // "schema.table" → columns kept; no entry: all
	// rename maps a partition ("schema.table") to the partitioned table it belongs to: with
	// publish_via_partition_root off, a partition's changes arrive under its own name.
	rename map[string]string
	// onRelation, when set, sees every Relation message decoded, after renaming.
	onRelation func(Relation)
	max        int
	cur        *Txn // the transaction in progress: between its Begin and its Commit
}

// relation is what the decoder keeps of a Relation message.
type relation struct {
	table   string   // "schema.table" (the namespace is empty for pg_catalog), after rename
	columns []string // column names, in the order of the row's columns in tuple data
	// oldGap: the table is a feeding table (keep has it), its replica identity is not FULL, and a kept column is
	// not part of it, so an UPDATE sends no old value of that column.
	oldGap bool
}

// Relation is what a pgoutput Relation message says of a table: sent before the table's first change of a
// session, and again after its definition changed (a column added, dropped or renamed, its replica identity
// altered).
type Relation struct {
	OID      uint32
	Table    string   // "schema.table", after renaming a partition to its partitioned table
	Sent     string   // "schema.table" as sent
	Identity byte     // REPLICA IDENTITY: 'd' default (primary key), 'f' full, 'i' index, 'n' nothing
	Columns  []string // the columns published, in order
	Key      []bool   // Key[i]: Columns[i] is part of the replica identity
}

// newDecoder returns a decoder keeping only columns (Config.Columns: table, qualified or not, → column
// names; nil keeps every column) and at most maxChanges row changes per transaction (<= 0: no cap).
func newDecoder(columns map[string][]string, maxChanges int) *decoder {
	keep := map[string]map[string]bool{}
	for t, cols := range columns {
		m := map[string]bool{}
		for _, c := range cols {
			m[c] = true
		}
		keep[QualifiedTable(t)] = m
	}
	return &decoder{relations: map[uint32]relation{}, keep: keep, max: maxChanges}
}

// inTxn reports whether a transaction is in progress (its Begin was decoded, not yet its Commit).
func (d *decoder) inTxn() bool { return d.cur != nil }

// decode decodes one pgoutput message, msg (its type byte first). It returns the transaction that msg commits,
// or nil when msg is not a Commit (or commits nothing: a Commit without a Begin is ignored). overflowed is true
// for the one change that took the transaction in progress past the cap, so that the caller can say so as it
// happens. Changes and truncates outside a transaction are ignored, and so are Origin, Type and Message
// messages. A change of a relation that was never announced is kept with an empty Table and no columns.
//
// The error wraps ErrPgoutput when msg is empty, truncated, of an unknown type, or carries a tuple or column
// kind that protocol version 1 does not have; the decoder's state is then as before the call. Bytes after a
// message's last field are ignored.
func (d *decoder) decode(msg []byte) (txn *Txn, overflowed bool, err error) {
	if len(msg) == 0 {
		return nil, false, fmt.Errorf("%w: empty message", ErrPgoutput)
	}
	r := &reader{b: msg[1:]}
	switch typ := msg[0]; typ {
	case msgBegin:
		r.u64() // the transaction's final LSN: its Commit carries the end LSN that is acknowledged
		commit := r.time()
		xid := r.u32()
		if r.err != nil {
			return nil, false, r.fail("Begin")
		}
		d.cur = &Txn{Commit: commit, Xid: xid}
	case msgCommit:
		r.u8()  // flags, unused
		r.u64() // the commit record's LSN
		end := r.u64()
		commit := r.time()
		if r.err != nil {
			return nil, false, r.fail("Commit")
		}
		if d.cur == nil {
			return nil, false, nil
		}
		txn, d.cur = d.cur, nil
		txn.End, txn.Commit = end, commit
		return txn, false, nil
	case msgRelation:
		id := r.u32()
		ns, name := r.str(), r.str()
		identity := r.u8()
		n := int(r.u16())
		var cols []string
		var key []bool
		for i := 0; i < n && r.err == nil; i++ {
			flags := r.u8() // 1 marks a key column
			cols = append(cols, r.str())
			key = append(key, flags&1 == 1)
			r.u32() // type OID
			r.u32() // type modifier
		}
		if r.err != nil {
			return nil, false, r.fail("Relation")
		}
		rel := Relation{OID: id, Sent: ns + "." + name, Table: ns + "." + name, Identity: identity, Columns: cols, Key: key}
		if root, ok := d.rename[rel.Sent]; ok {
			rel.Table = root
		}
		d.relations[id] = relation{table: rel.Table, columns: cols, oldGap: d.oldGap(rel)}
		if d.onRelation != nil {
			d.onRelation(rel)
		}
	case msgInsert:
		id := r.u32()
		r.expect('N')
		row := r.tuple()
		if r.err != nil {
			return nil, false, r.fail("Insert")
		}
		return nil, d.add(id, 'I', nil, row), nil
	case msgUpdate:
		id := r.u32()
		var old tupleRow // nil: the old row was not sent
		switch k := r.u8(); k {
		case 'K', 'O': // the old key (the replica identity changed) or the old row (REPLICA IDENTITY FULL)
			old = r.tuple()
			r.expect('N')
		case 'N':
		default:
			r.bad("tuple kind %q, want K, O or N", k)
		}
		row := r.tuple()
		if r.err != nil {
			return nil, false, r.fail("Update")
		}
		return nil, d.add(id, 'U', old, row), nil
	case msgDelete:
		id := r.u32()
		if k := r.u8(); k != 'K' && k != 'O' && r.err == nil {
			r.bad("tuple kind %q, want K or O", k)
		}
		old := r.tuple()
		if r.err != nil {
			return nil, false, r.fail("Delete")
		}
		return nil, d.add(id, 'D', old, nil), nil
	case msgTruncate:
		n := r.u32()
		r.u8() // options: CASCADE, RESTART IDENTITY
		if r.err == nil && uint64(n)*4 > uint64(len(r.b)) {
			r.bad("%d relations in %d bytes", n, len(r.b))
		}
		var ids []uint32
		for i := uint32(0); i < n && r.err == nil; i++ {
			ids = append(ids, r.u32())
		}
		if r.err != nil {
			return nil, false, r.fail("Truncate")
		}
		if d.cur == nil {
			return nil, false, nil
		}
		for _, id := range ids {
			if rel, ok := d.relations[id]; ok {
				d.cur.Truncated = append(d.cur.Truncated, rel.table)
			}
		}
	case msgOrigin, msgType, msgMessage:
		// Replication origins, type names (for types outside pg_catalog) and emitted messages carry nothing the
		// stream uses.
	default:
		return nil, false, fmt.Errorf("%w: unknown message type %q", ErrPgoutput, typ)
	}
	return nil, false, nil
}

// tupleRow is a row in tuple data: one entry per column, nil for a NULL, an unchanged TOASTed value or a value
// in binary format (keepwarm asks for text only), else the column's text output.
type tupleRow = [][]byte

// add records one row change in the transaction in progress (none: ignored), and reports whether it is the one
// that took the transaction past the cap.
func (d *decoder) add(id uint32, op byte, old, new tupleRow) (overflowed bool) {
	if d.cur == nil {
		return false
	}
	d.cur.rows++
	if d.cur.Overflowed {
		return false
	}
	if d.max > 0 && len(d.cur.Changes) >= d.max {
		d.cur.Changes, d.cur.Overflowed = nil, true
		return true
	}
	c := Change{Op: op}
	if rel, ok := d.relations[id]; ok {
		c.Table = rel.table
		keep := d.keep[c.Table]
		c.Old, c.New = rel.values(keep, old), rel.values(keep, new)
		if op == 'U' && old == nil && rel.oldGap {
			d.cur.OldUnknown++
		}
	}
	d.cur.Changes = append(d.cur.Changes, c)
	return false
}

// oldGap reports whether rel is a feeding table (keep names its columns) whose UPDATEs send no old value of some
// kept column: its replica identity is not FULL and the column is not part of it.
func (d *decoder) oldGap(rel Relation) bool {
	keep, ok := d.keep[rel.Table]
	if !ok || rel.Identity == 'f' {
		return false
	}
	for i, c := range rel.Columns {
		if keep[c] && !rel.Key[i] {
			return true
		}
	}
	return false
}

// values maps row's non-nil columns that keep names (all when keep is nil) to their values; nil for a nil row.
// Columns past the relation's own are dropped.
func (rel relation) values(keep map[string]bool, row tupleRow) map[string]string {
	if row == nil {
		return nil
	}
	n := len(row)
	if keep != nil {
		n = len(keep)
	}
	out := make(map[string]string, n)
	for i, v := range row {
		if v == nil || i >= len(rel.columns) {
			continue
		}
		if keep != nil && !keep[rel.columns[i]] {
			continue
		}
		out[rel.columns[i]] = string(v)
	}
	return out
}

// reader reads the big-endian fields of one message. The first failure sticks in err; later reads return
// zero values, so that a message is read through and checked once.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n > len(r.b) {
		r.err = fmt.Errorf("truncated: %d bytes left, want %d", len(r.b), n)
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) u8() byte {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if b := r.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

// time reads an Int64 timestamp: microseconds since 2000-01-01 UTC.
func (r *reader) time() time.Time {
	us := int64(r.u64())
	if r.err != nil {
		return time.Time{}
	}
	return pgEpoch.Add(time.Duration(us) * time.Microsecond).Local()
}

// str reads a NUL-terminated string.
func (r *reader) str() string {
	if r.err != nil {
		return ""
	}
	i := bytes.IndexByte(r.b, 0)
	if i < 0 {
		r.err = errors.New("truncated: a string has no terminating NUL")
		return ""
	}
	s := string(r.b[:i])
	r.b = r.b[i+1:]
	return s
}

// expect reads one byte that must be want.
func (r *reader) expect(want byte) {
	if got := r.u8(); r.err == nil && got != want {
		r.bad("tuple kind %q, want %q", got, want)
	}
}

func (r *reader) bad(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
}

// tuple reads TupleData: Int16 column count, then per column 'n' (NULL), 'u' (unchanged TOASTed value), or 't'
// (text) or 'b' (binary) followed by an Int32 length and that many bytes. Only text values are kept (see
// tupleRow). The returned row is never nil on success; values are copies, not views of the message.
func (r *reader) tuple() tupleRow {
	n := int(r.u16())
	if r.err != nil {
		return nil
	}
	row := make(tupleRow, n)
	for i := 0; i < n && r.err == nil; i++ {
		switch kind := r.u8(); kind {
		case 'n', 'u':
		case 't', 'b':
			size := r.u32()
			if r.err == nil && uint64(size) > uint64(len(r.b)) {
				r.bad("column %d: value of %d bytes, %d left", i, size, len(r.b))
				break
			}
			v := r.take(int(size))
			if kind == 't' && r.err == nil {
				row[i] = bytes.Clone(v)
				if row[i] == nil {
					row[i] = []byte{}
				}
			}
		default:
			if r.err == nil {
				r.bad("column %d: kind %q, want n, u, t or b", i, kind)
			}
		}
	}
	if r.err != nil {
		return nil
	}
	return row
}

// fail wraps the reader's error for a message of type name.
func (r *reader) fail(name string) error {
	return fmt.Errorf("%w: %s: %v", ErrPgoutput, name, r.err)
}
