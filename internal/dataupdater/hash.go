package dataupdater

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// ReportHash is an entry's "hash" in a report, as the Python client computes
// it (DataUpdater.calc_hash): the sha256 of json.dumps(data) with Python's
// defaults (", " and ": " separators, ensure_ascii, keys in document order,
// floats as Python's repr), or of the text itself when the body is stored as
// a string (is_json false). "" when the JSON does not decode.
func ReportHash(body []byte, asText bool) string {
	var b []byte
	if asText {
		b = body
	} else {
		d := json.NewDecoder(bytes.NewReader(body))
		d.UseNumber()
		v, err := pyValue(d)
		if err != nil {
			return ""
		}
		if v.kind == 's' && strings.HasPrefix(v.scalar, `"`) {
			// calc_hash hashes a str as it is, not its JSON.
			var str string
			_ = json.Unmarshal(body, &str)
			b = []byte(str)
		} else {
			var out strings.Builder
			v.write(&out)
			b = []byte(out.String())
		}
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// pyNode is a decoded JSON value that keeps the document's key order, and,
// as a Python dict does, a repeated key's first place with its last value.
type pyNode struct {
	scalar string // written as is
	keys   []string
	vals   map[string]*pyNode
	items  []*pyNode
	kind   byte // 's', 'o', 'a'
}

func pyValue(d *json.Decoder) (*pyNode, error) {
	t, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch x := t.(type) {
	case json.Delim:
		switch x {
		case '{':
			n := &pyNode{kind: 'o', vals: map[string]*pyNode{}}
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				v, err := pyValue(d)
				if err != nil {
					return nil, err
				}
				if _, seen := n.vals[k]; !seen {
					n.keys = append(n.keys, k)
				}
				n.vals[k] = v
			}
			_, err := d.Token()
			return n, err
		case '[':
			n := &pyNode{kind: 'a'}
			for d.More() {
				v, err := pyValue(d)
				if err != nil {
					return nil, err
				}
				n.items = append(n.items, v)
			}
			_, err := d.Token()
			return n, err
		}
		return nil, fmt.Errorf("unexpected %v", x)
	case string:
		return &pyNode{kind: 's', scalar: pyString(x)}, nil
	case json.Number:
		return &pyNode{kind: 's', scalar: pyNumber(string(x))}, nil
	case bool:
		if x {
			return &pyNode{kind: 's', scalar: "true"}, nil
		}
		return &pyNode{kind: 's', scalar: "false"}, nil
	case nil:
		return &pyNode{kind: 's', scalar: "null"}, nil
	}
	return nil, fmt.Errorf("unexpected token %v", t)
}

func (n *pyNode) write(out *strings.Builder) {
	switch n.kind {
	case 'o':
		out.WriteByte('{')
		for i, k := range n.keys {
			if i > 0 {
				out.WriteString(", ")
			}
			out.WriteString(pyString(k))
			out.WriteString(": ")
			n.vals[k].write(out)
		}
		out.WriteByte('}')
	case 'a':
		out.WriteByte('[')
		for i, v := range n.items {
			if i > 0 {
				out.WriteString(", ")
			}
			v.write(out)
		}
		out.WriteByte(']')
	default:
		out.WriteString(n.scalar)
	}
}

// pyString is a JSON string as json.dumps writes it with ensure_ascii.
func pyString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20 || r == utf8.RuneError:
				fmt.Fprintf(&b, `\u%04x`, r)
			case r < 0x7f:
				b.WriteRune(r)
			case r > 0xffff:
				r1, r2 := utf16.EncodeRune(r)
				fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
			default:
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// pyNumber is a JSON number as Python reads and writes it back: an integer
// literal stays exact, anything else is a float in repr form.
func pyNumber(s string) string {
	if !strings.ContainsAny(s, ".eE") {
		if s == "-0" {
			return "0"
		}
		return s
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !math.IsInf(f, 0) {
		return s
	}
	switch {
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return pyFloat(f)
}

// pyFloat is Python's repr of a float: the shortest digits that round-trip,
// in fixed notation when the exponent is in [-4, 16), else as d.ddde+XX.
func pyFloat(f float64) string {
	e := strconv.FormatFloat(f, 'e', -1, 64) // -d.ddde±XX
	neg := strings.HasPrefix(e, "-")
	e = strings.TrimPrefix(e, "-")
	mant, exps, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(exps)
	digits := strings.Replace(mant, ".", "", 1)
	var s string
	if exp >= -4 && exp < 16 {
		if exp >= 0 {
			if len(digits) <= exp+1 {
				s = digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
			} else {
				s = digits[:exp+1] + "." + digits[exp+1:]
			}
		} else {
			s = "0." + strings.Repeat("0", -exp-1) + digits
		}
	} else {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		sign := "+"
		if exp < 0 {
			sign, exp = "-", -exp
		}
		s = fmt.Sprintf("%se%s%02d", m, sign, exp)
	}
	if neg {
		s = "-" + s
	}
	return s
}
