package postgres

import (
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgtype"
)

// valueOIDs are the value column types Fetch accepts.
var valueOIDs = map[uint32]bool{
	pgtype.TextOID: true, pgtype.VarcharOID: true, pgtype.BPCharOID: true,
	pgtype.JSONOID: true, pgtype.JSONBOID: true, pgtype.ByteaOID: true,
}

// jsonbVersion is the first byte of jsonb's binary format.
const jsonbVersion = 1

// decodeValue turns one raw value of a column of type oid, in wire format (pgx.TextFormatCode or
// pgx.BinaryFormatCode), into the bytes written to Redis. The format is the one the server actually used, which
// is not always the one asked for: in pgx's exec and simple_protocol modes every column comes back as text. So
// each type is decoded from both formats:
//
//   - text, varchar, char and json: the same bytes in both formats;
//   - jsonb: binary is a version byte (1) then the text; text is the text;
//   - bytea: binary is the raw bytes; text is the server's bytea_output form, hex (\x00ff) or escape (\000\377).
//
// raw must not be nil (NULL is handled by the caller). The result may alias raw.
func decodeValue(oid uint32, format int16, raw []byte) ([]byte, error) {
	if format != pgtype.TextFormatCode && format != pgtype.BinaryFormatCode {
		return nil, fmt.Errorf("unknown wire format code %d", format)
	}
	switch oid {
	case pgtype.JSONBOID:
		if format == pgtype.TextFormatCode {
			return raw, nil
		}
		if len(raw) == 0 || raw[0] != jsonbVersion {
			return nil, errors.New("jsonb value has an unknown binary version")
		}
		return raw[1:], nil
	case pgtype.ByteaOID:
		if format == pgtype.BinaryFormatCode {
			return raw, nil
		}
		return decodeByteaText(raw)
	}
	return raw, nil
}

// decodeByteaText decodes bytea's text output in either of PostgreSQL's bytea_output formats: hex ("\x" then two
// hex digits per byte) or escape (printable bytes as is, "\\" for a backslash, "\ooo" in octal for the rest).
// See https://www.postgresql.org/docs/current/datatype-binary.html.
func decodeByteaText(raw []byte) ([]byte, error) {
	if len(raw) >= 2 && raw[0] == '\\' && raw[1] == 'x' {
		out := make([]byte, hex.DecodedLen(len(raw)-2))
		if _, err := hex.Decode(out, raw[2:]); err != nil {
			return nil, fmt.Errorf("bytea value in hex format: %w", err)
		}
		return out, nil
	}
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		switch {
		case i+1 < len(raw) && raw[i+1] == '\\':
			out = append(out, '\\')
			i++
		case i+3 < len(raw) && isOctal(raw[i+1]) && raw[i+1] <= '3' && isOctal(raw[i+2]) && isOctal(raw[i+3]):
			out = append(out, (raw[i+1]-'0')<<6|(raw[i+2]-'0')<<3|(raw[i+3]-'0'))
			i += 3
		default:
			return nil, fmt.Errorf("bytea value in escape format: bad escape at byte %d", i)
		}
	}
	return out, nil
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }
