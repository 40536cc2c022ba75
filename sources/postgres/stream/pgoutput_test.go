package stream

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"reflect"
	"testing"
	"time"
)

// Real pgoutput messages (protocol version 1), captured from the PostgreSQL of scripts/services with
// pg_logical_slot_peek_binary_changes(slot, NULL, NULL, 'proto_version', '1', 'publication_names', pub) after:
//
//	create table kwcap_a23.item (id int primary key, grp int, name text, blob text);  -- relation 0x158e3
//	alter table kwcap_a23.item replica identity full;
//	create table kwcap_a23.keyed (id int primary key, name text);                     -- relation 0x158ea
//	insert into kwcap_a23.item values (1, 0, 'one', null);
//	update kwcap_a23.item set grp = 2, name = '' where id = 1;
//	delete from kwcap_a23.item where id = 1;
//	insert into kwcap_a23.keyed values (7, 'seven');
//	update kwcap_a23.keyed set id = 8 where id = 7;
//	update kwcap_a23.keyed set name = 'eight' where id = 8;
//	delete from kwcap_a23.keyed where id = 8;
//	truncate kwcap_a23.item;
//
// Format: PostgreSQL docs, "Logical Replication Message Formats"
// (https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html).
const (
	capBegin1     = "4200000001592744000003049d577bf52d00060f90" // final LSN 1/59274400, xid 397200
	capRelItem    = "52000158e36b776361705f613233006974656d006600040169640000000017ffffffff016772700000000017ffffffff016e616d650000000019ffffffff01626c6f620000000019ffffffff"
	capInsertItem = "49000158e34e000474000000013174000000013074000000036f6e656e" // (1, 0, 'one', NULL)
	capCommit1    = "4300000000015927440000000001592744300003049d577bf52d"       // end LSN 1/59274430
	// REPLICA IDENTITY FULL: the old row ('O'), then the new one ('N'), whose name is the empty string.
	capUpdateItem = "55000158e34f000474000000013174000000013074000000036f6e656e4e000474000000013174000000013274000000006e"
	capDeleteItem = "44000158e34f000474000000013174000000013274000000006e"
	capRelKeyed   = "52000158ea6b776361705f613233006b65796564006400020169640000000017ffffffff006e616d650000000019ffffffff"
	capInsertKey  = "49000158ea4e00027400000001377400000005736576656e"
	// The key changed: the old key ('K', non-key columns NULL), then the new row.
	capUpdateKey  = "55000158ea4b00027400000001376e4e00027400000001387400000005736576656e"
	capUpdateKeyN = "55000158ea4e000274000000013874000000056569676874" // key unchanged: the new row only
	capDeleteKey  = "44000158ea4b00027400000001386e"
	capTruncate   = "540000000100000158e3" // one relation, no options
)

// commitTime1 is the commit time in capBegin1 and capCommit1: 0x3049d577bf52d µs after 2000-01-01 UTC.
var commitTime1 = pgEpoch.Add(0x3049d577bf52d * time.Microsecond)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

// Hand-encoded messages, for what the capture does not show (binary and unchanged-TOAST columns, other
// message types) and for commits of a chosen end LSN.

func be16(v uint16) []byte         { return binary.BigEndian.AppendUint16(nil, v) }
func be32(v uint32) []byte         { return binary.BigEndian.AppendUint32(nil, v) }
func be64(v uint64) []byte         { return binary.BigEndian.AppendUint64(nil, v) }
func cat(parts ...[]byte) []byte   { return bytes.Join(parts, nil) }
func hexOf(parts ...[]byte) string { return hex.EncodeToString(cat(parts...)) }

func encBegin() string { return hexOf([]byte{'B'}, be64(0x100), be64(0x3049d577bf52d), be32(9)) }
func encCommit(end uint64) string {
	return hexOf([]byte{'C', 0}, be64(end-0x30), be64(end), be64(0x3049d577bf52d))
}

// encCol encodes one TupleData column: kind 'n' or 'u' alone, 't' or 'b' with v.
func encCol(kind byte, v string) []byte {
	if kind == 'n' || kind == 'u' {
		return []byte{kind}
	}
	return cat([]byte{kind}, be32(uint32(len(v))), []byte(v))
}

func TestDecoder(t *testing.T) {
	t.Parallel()
	item := func(op byte, old, new map[string]string) Change {
		return Change{Table: "kwcap_a23.item", Op: op, Old: old, New: new}
	}
	keyed := func(op byte, old, new map[string]string) Change {
		return Change{Table: "kwcap_a23.keyed", Op: op, Old: old, New: new}
	}
	tests := []struct {
		name    string
		msgs    []string // hex
		columns map[string][]string
		rename  map[string]string
		max     int
		want    []Txn // the transactions committed, in order (rows and received are not compared)
		rows    []int // each transaction's row count, when the test checks it
	}{
		{
			name: "insert, with a NULL column absent",
			msgs: []string{capBegin1, capRelItem, capInsertItem, capCommit1},
			want: []Txn{{End: 0x159274430, Xid: 397200, Commit: commitTime1, Changes: []Change{
				item('I', nil, map[string]string{"id": "1", "grp": "0", "name": "one"})}}},
		},
		{
			name: "update with the old row (REPLICA IDENTITY FULL) and an empty string, then delete",
			msgs: []string{capRelItem, encBegin(), capUpdateItem, capDeleteItem, encCommit(0x2000)},
			want: []Txn{{End: 0x2000, Xid: 9, Commit: commitTime1, Changes: []Change{
				item('U', map[string]string{"id": "1", "grp": "0", "name": "one"}, map[string]string{"id": "1", "grp": "2", "name": ""}),
				item('D', map[string]string{"id": "1", "grp": "2", "name": ""}, nil)}}},
		},
		{
			name: "key changes: old key with NULL non-key columns; update without the old row has no Old",
			msgs: []string{capRelKeyed, encBegin(), capInsertKey, capUpdateKey, capUpdateKeyN, capDeleteKey, encCommit(0x3000)},
			want: []Txn{{End: 0x3000, Xid: 9, Commit: commitTime1, Changes: []Change{
				keyed('I', nil, map[string]string{"id": "7", "name": "seven"}),
				keyed('U', map[string]string{"id": "7"}, map[string]string{"id": "8", "name": "seven"}),
				keyed('U', nil, map[string]string{"id": "8", "name": "eight"}),
				keyed('D', map[string]string{"id": "8"}, nil)}}},
		},
		{
			name: "truncate names the table",
			msgs: []string{encBegin(), capRelItem, capTruncate, encCommit(0x4000)},
			want: []Txn{{End: 0x4000, Xid: 9, Commit: commitTime1, Truncated: []string{"kwcap_a23.item"}}},
		},
		{
			name: "truncate of an unknown relation names nothing",
			msgs: []string{encBegin(), capTruncate, encCommit(0x4000)},
			want: []Txn{{End: 0x4000, Xid: 9, Commit: commitTime1}},
		},
		{
			name:    "only the kept columns, the table given unqualified",
			msgs:    []string{capRelKeyed, encBegin(), capUpdateKey, encCommit(0x5000)},
			columns: map[string][]string{"kwcap_a23.keyed": {"id"}, "item": {"grp"}},
			want: []Txn{{End: 0x5000, Xid: 9, Commit: commitTime1, Changes: []Change{
				keyed('U', map[string]string{"id": "7"}, map[string]string{"id": "8"})}}},
		},
		{
			name: "unchanged TOAST and binary columns are in neither row",
			msgs: []string{capRelItem, encBegin(),
				hexOf([]byte{'U'}, be32(0x158e3), []byte{'N'}, be16(4), encCol('t', "1"), encCol('b', "\x00\x02"), encCol('t', "x"), encCol('u', "")),
				encCommit(0x6000)},
			want: []Txn{{End: 0x6000, Xid: 9, Commit: commitTime1, Changes: []Change{
				item('U', nil, map[string]string{"id": "1", "name": "x"})}}},
		},
		{
			name: "a row with more columns than its relation keeps the relation's",
			msgs: []string{capRelKeyed, encBegin(),
				hexOf([]byte{'I'}, be32(0x158ea), []byte{'N'}, be16(3), encCol('t', "1"), encCol('t', "a"), encCol('t', "extra")),
				encCommit(0x6000)},
			want: []Txn{{End: 0x6000, Xid: 9, Commit: commitTime1, Changes: []Change{
				keyed('I', nil, map[string]string{"id": "1", "name": "a"})}}},
		},
		{
			name: "a change of a relation never announced keeps its op only",
			msgs: []string{encBegin(), capInsertKey, encCommit(0x7000)},
			want: []Txn{{End: 0x7000, Xid: 9, Commit: commitTime1, Changes: []Change{{Op: 'I'}}}},
		},
		{
			name: "changes and commits outside a transaction are ignored",
			msgs: []string{capRelItem, capInsertItem, capTruncate, capCommit1},
		},
		{
			name: "origin, type and emitted messages are skipped",
			msgs: []string{encBegin(),
				hexOf([]byte{'O'}, be64(0x10), []byte("origin\x00")),
				hexOf([]byte{'Y'}, be32(16500), []byte("public\x00mood\x00")),
				hexOf([]byte{'M', 1}, be64(0x10), []byte("prefix\x00"), be32(2), []byte("hi")),
				capRelItem, capInsertItem, encCommit(0x8000)},
			want: []Txn{{End: 0x8000, Xid: 9, Commit: commitTime1, Changes: []Change{
				item('I', nil, map[string]string{"id": "1", "grp": "0", "name": "one"})}}},
		},
		{
			name: "two transactions",
			msgs: []string{capRelKeyed, encBegin(), capInsertKey, encCommit(0x9000), encBegin(), capDeleteKey, encCommit(0x9100)},
			want: []Txn{
				{End: 0x9000, Xid: 9, Commit: commitTime1, Changes: []Change{keyed('I', nil, map[string]string{"id": "7", "name": "seven"})}},
				{End: 0x9100, Xid: 9, Commit: commitTime1, Changes: []Change{keyed('D', map[string]string{"id": "8"}, nil)}},
			},
		},
		{
			name:    "a kept column outside a DEFAULT replica identity: an UPDATE without the old row is counted",
			msgs:    []string{capRelKeyed, encBegin(), capUpdateKey, capUpdateKeyN, encCommit(0xb000)},
			columns: map[string][]string{"kwcap_a23.keyed": {"id", "name"}},
			want: []Txn{{End: 0xb000, Xid: 9, Commit: commitTime1, OldUnknown: 1, Changes: []Change{
				keyed('U', map[string]string{"id": "7"}, map[string]string{"id": "8", "name": "seven"}),
				keyed('U', nil, map[string]string{"id": "8", "name": "eight"})}}},
		},
		{
			name:    "only key columns kept: nothing is unknown",
			msgs:    []string{capRelKeyed, encBegin(), capUpdateKeyN, encCommit(0xb100)},
			columns: map[string][]string{"kwcap_a23.keyed": {"id"}},
			want: []Txn{{End: 0xb100, Xid: 9, Commit: commitTime1, Changes: []Change{
				keyed('U', nil, map[string]string{"id": "8"})}}},
		},
		{
			name:    "a partition's changes under its partitioned table's name, with its kept columns",
			msgs:    []string{capRelKeyed, encBegin(), capInsertKey, encCommit(0xc000)},
			rename:  map[string]string{"kwcap_a23.keyed": "kwcap_a23.parent"},
			columns: map[string][]string{"kwcap_a23.parent": {"id"}},
			want: []Txn{{End: 0xc000, Xid: 9, Commit: commitTime1, Changes: []Change{
				{Table: "kwcap_a23.parent", Op: 'I', New: map[string]string{"id": "7"}}}}},
		},
		{
			name: "past the cap: no changes kept, every row counted",
			msgs: []string{capRelKeyed, encBegin(), capInsertKey, capUpdateKey, capUpdateKeyN, capDeleteKey, encCommit(0xa000),
				encBegin(), capInsertKey, capDeleteKey, encCommit(0xa100)},
			max: 2,
			want: []Txn{
				{End: 0xa000, Xid: 9, Commit: commitTime1, Overflowed: true},
				{End: 0xa100, Xid: 9, Commit: commitTime1, Changes: []Change{
					keyed('I', nil, map[string]string{"id": "7", "name": "seven"}),
					keyed('D', map[string]string{"id": "8"}, nil)}},
			},
			rows: []int{4, 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newDecoder(tt.columns, tt.max)
			d.rename = tt.rename
			var got []Txn
			var rows []int
			overflows := 0
			for i, m := range tt.msgs {
				txn, over, err := d.decode(unhex(t, m))
				if err != nil {
					t.Fatalf("message %d (%s): %v", i, m, err)
				}
				if over {
					overflows++
				}
				if txn != nil {
					rows = append(rows, txn.rows)
					txn.rows = 0
					got = append(got, *txn)
				}
			}
			if d.inTxn() {
				t.Errorf("inTxn after the last message: got true, want false")
			}
			for i := range got {
				if !got[i].Commit.Equal(commitTime1) {
					t.Errorf("txn %d: commit time %v, want %v", i, got[i].Commit, commitTime1)
				}
				got[i].Commit = commitTime1
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("transactions:\n got %+v\nwant %+v", got, tt.want)
			}
			if tt.rows != nil && !reflect.DeepEqual(rows, tt.rows) {
				t.Errorf("rows per transaction: got %v, want %v", rows, tt.rows)
			}
			wantOver := 0
			for _, w := range tt.want {
				if w.Overflowed {
					wantOver++
				}
			}
			if overflows != wantOver {
				t.Errorf("overflowed reported %d times, want %d (once per overflowing transaction)", overflows, wantOver)
			}
		})
	}
}

// TestDecoderRelation: a Relation message's replica identity and key columns reach onRelation, with the table's
// name after renaming a partition.
func TestDecoderRelation(t *testing.T) {
	t.Parallel()
	d := newDecoder(nil, 0)
	d.rename = map[string]string{"kwcap_a23.item": "kwcap_a23.parent"}
	var got []Relation
	d.onRelation = func(r Relation) { got = append(got, r) }
	for _, m := range []string{capRelItem, capRelKeyed} {
		if _, _, err := d.decode(unhex(t, m)); err != nil {
			t.Fatal(err)
		}
	}
	want := []Relation{
		{OID: 0x158e3, Table: "kwcap_a23.parent", Sent: "kwcap_a23.item", Identity: 'f',
			Columns: []string{"id", "grp", "name", "blob"}, Key: []bool{true, true, true, true}},
		{OID: 0x158ea, Table: "kwcap_a23.keyed", Sent: "kwcap_a23.keyed", Identity: 'd',
			Columns: []string{"id", "name"}, Key: []bool{true, false}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("relations:\n got %+v\nwant %+v", got, want)
	}
}

// TestDecoderMalformed: bad input is an error wrapping ErrPgoutput, never a panic, and leaves the decoder as it
// was: the transaction in progress and the relations known are unchanged.
func TestDecoderMalformed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		msg  []byte
	}{
		{"empty", nil},
		{"unknown type", []byte{'Z', 0, 0}},
		{"stream start (protocol version 2)", cat([]byte{'S'}, be32(1), []byte{1})},
		{"begin too short", unhex(t, capBegin1)[:20]},
		{"commit too short", unhex(t, capCommit1)[:25]},
		{"relation name without NUL", []byte("R\x00\x00\x00\x01public\x00item")},
		{"relation with more columns than sent", cat([]byte{'R'}, be32(1), []byte("public\x00item\x00\x00"), be16(3), []byte{1}, []byte("id\x00"), be32(23), be32(0xffffffff))},
		{"insert without N", cat([]byte{'I'}, be32(0x158ea), []byte{'X'}, be16(0))},
		{"update with a bad tuple kind", cat([]byte{'U'}, be32(0x158ea), []byte{'Q'}, be16(0))},
		{"update with old row but no N after it", cat([]byte{'U'}, be32(0x158ea), []byte{'O'}, be16(0), []byte{'X'}, be16(0))},
		{"delete with N", cat([]byte{'D'}, be32(0x158ea), []byte{'N'}, be16(0))},
		{"column of unknown kind", cat([]byte{'I'}, be32(0x158ea), []byte{'N'}, be16(1), []byte{'x'})},
		{"value longer than the message", cat([]byte{'I'}, be32(0x158ea), []byte{'N'}, be16(1), []byte{'t'}, be32(0xffffffff), []byte("ab"))},
		{"fewer columns than counted", cat([]byte{'I'}, be32(0x158ea), []byte{'N'}, be16(0xffff), encCol('t', "1"))},
		{"truncate of more relations than sent", cat([]byte{'T'}, be32(0xffffffff), []byte{0}, be32(1))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newDecoder(nil, 0)
			for _, m := range []string{capRelKeyed, encBegin(), capInsertKey} {
				if _, _, err := d.decode(unhex(t, m)); err != nil {
					t.Fatal(err)
				}
			}
			before := *d.cur
			txn, over, err := d.decode(tt.msg)
			if !errors.Is(err, ErrPgoutput) {
				t.Errorf("decode(%x): err %v, want one wrapping ErrPgoutput", tt.msg, err)
			}
			if txn != nil || over {
				t.Errorf("decode(%x): txn %v, overflowed %v; want neither with an error", tt.msg, txn, over)
			}
			if d.cur == nil || !reflect.DeepEqual(*d.cur, before) || len(d.relations) != 1 {
				t.Errorf("decoder state changed by a malformed message: txn %+v, %d relations", d.cur, len(d.relations))
			}
		})
	}
}

// TestDecoderTruncated: every strict prefix of every captured message is an error, not a panic and not a
// silently shorter message.
func TestDecoderTruncated(t *testing.T) {
	t.Parallel()
	for _, m := range []string{capBegin1, capRelItem, capInsertItem, capCommit1, capUpdateItem, capDeleteItem,
		capRelKeyed, capInsertKey, capUpdateKey, capUpdateKeyN, capDeleteKey, capTruncate} {
		full := unhex(t, m)
		for n := range len(full) {
			d := newDecoder(nil, 0)
			for _, setup := range []string{capRelItem, capRelKeyed, encBegin()} {
				if _, _, err := d.decode(unhex(t, setup)); err != nil {
					t.Fatal(err)
				}
			}
			if _, _, err := d.decode(full[:n]); !errors.Is(err, ErrPgoutput) {
				t.Errorf("the first %d of %d bytes of %c message %s: err %v, want ErrPgoutput", n, len(full), full[0], m, err)
			}
		}
	}
}

// FuzzDecoder: whatever the bytes, decode returns (maybe an error) and never panics. The seeds are the captured
// messages; `go test -fuzz FuzzDecoder` explores from them.
func FuzzDecoder(f *testing.F) {
	for _, m := range []string{capBegin1, capRelItem, capInsertItem, capCommit1, capUpdateItem, capDeleteItem,
		capRelKeyed, capInsertKey, capUpdateKey, capUpdateKeyN, capDeleteKey, capTruncate} {
		f.Add(unhex(f, m))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		d := newDecoder(map[string][]string{"kwcap_a23.item": {"id"}}, 1)
		for _, setup := range []string{capRelItem, capRelKeyed, encBegin()} {
			if _, _, err := d.decode(unhex(t, setup)); err != nil {
				t.Fatal(err)
			}
		}
		_, _, _ = d.decode(msg)
		_, _, _ = d.decode(msg) // twice: a second change may pass the cap of 1
	})
}
