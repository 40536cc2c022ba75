package postgres

import (
	"bytes"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
)

// TestDecodeByteaText covers the text forms of bytea that the real-server tests cannot produce on demand: bad
// input must be an error, never a panic or a silent copy.
func TestDecodeByteaText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    []byte
		wantErr bool
	}{
		{`\x`, []byte{}, false},
		{`\x00ff`, []byte{0, 0xff}, false},
		{`\x0`, nil, true},
		{`\xzz`, nil, true},
		{``, []byte{}, false},
		{`ab\\c`, []byte(`ab\c`), false},
		{`\000\377 ab`, []byte{0, 0xff, ' ', 'a', 'b'}, false},
		{`\400`, nil, true},
		{`\0`, nil, true},
		{`trailing\`, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := decodeValue(pgtype.ByteaOID, pgtype.TextFormatCode, []byte(tt.in))
			if (err != nil) != tt.wantErr || (!tt.wantErr && !bytes.Equal(got, tt.want)) {
				t.Errorf("decodeValue(bytea, text, %q): got %q, %v; want %q (error %v)", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
	if _, err := decodeValue(pgtype.TextOID, 7, []byte("x")); err == nil {
		t.Error("decodeValue with format code 7: got no error, want one")
	}
	if _, err := decodeValue(pgtype.JSONBOID, pgtype.BinaryFormatCode, []byte{2, '{', '}'}); err == nil {
		t.Error("decodeValue of jsonb version 2: got no error, want one")
	}
}
