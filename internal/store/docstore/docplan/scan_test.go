package docplan

import "testing"

// span is a member as a test states it: key decoded, key and value as
// stored.
type span struct{ key, rawKey, value string }

func spans(o Object) []span {
	out := make([]span, len(o))
	for i, m := range o {
		out[i] = span{m.Key, string(m.rawKey), string(m.Value)}
	}
	return out
}

func TestParseObjectLocatesEveryMemberAsStored(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []span
	}{
		{"empty", `{}`, []span{}},
		{"empty with spaces", " {\t\r\n} ", []span{}},
		{"scalars", `{"n":-1.5e3,"t":true,"f":false,"z":null}`, []span{
			{"n", `"n"`, `-1.5e3`}, {"t", `"t"`, `true`}, {"f", `"f"`, `false`}, {"z", `"z"`, `null`}}},
		{"spacing kept inside values only", "{ \"a\" :\n[ 1 , 2 ] , \"b\":{ \"c\" : 3 } }", []span{
			{"a", `"a"`, `[ 1 , 2 ]`}, {"b", `"b"`, `{ "c" : 3 }`}}},
		{"brackets and quotes inside strings", `{"a":"}\"{","b":[1,{"c":"]\\"}],"d":"\\"}`, []span{
			{"a", `"a"`, `"}\"{"`}, {"b", `"b"`, `[1,{"c":"]\\"}]`}, {"d", `"d"`, `"\\"`}}},
		{"escaped key decoded, stored as is", `{"\u0061b":1,"\"q":2}`, []span{
			{"ab", `"\u0061b"`, `1`}, {`"q`, `"\"q"`, `2`}}},
		{"integers past 2^53 and escapes untouched", `{"big":12345678901234567890,"s":"\u00e9\/"}`, []span{
			{"big", `"big"`, `12345678901234567890`}, {"s", `"s"`, `"\u00e9\/"`}}},
		{"repeated key kept twice", `{"k":1,"k":2}`, []span{{"k", `"k"`, `1`}, {"k", `"k"`, `2`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseObject([]byte(tt.in))
			if err != nil {
				t.Fatalf("parseObject(%q): %v", tt.in, err)
			}
			got := spans(o)
			if len(got) != len(tt.want) {
				t.Fatalf("parseObject(%q) = %q, want %q", tt.in, got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("parseObject(%q) member %d = %q, want %q", tt.in, i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestParseObjectRefusesWhatIsNoObject(t *testing.T) {
	for _, in := range []string{``, `[]`, `"{}"`, `1`, `null`, ` `} {
		if o, err := parseObject([]byte(in)); err == nil {
			t.Errorf("parseObject(%q) = %q, nil; want an error", in, spans(o))
		}
	}
}

func TestObjectGetAnswersTheLastCopy(t *testing.T) {
	o, err := parseObject([]byte(`{"k":1,"j":"x","k":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(o.Get("k")); got != "2" {
		t.Errorf("Get(k) = %q, want the last copy 2", got)
	}
	if got := o.Get("absent"); got != nil {
		t.Errorf("Get(absent) = %q, want nil", got)
	}
}

func TestObjectSetDelAndBytesKeepEveryOtherMember(t *testing.T) {
	const in = `{ "k" : 1, "j":[ "x" ], "k":2 }`
	o, err := parseObject([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		got  Object
		want string
	}{
		{"unchanged", o, `{"k":1,"j":[ "x" ],"k":2}`},
		{"set replaces every copy in the first's place", o.set("k", []byte(`3`)), `{"k":3,"j":[ "x" ]}`},
		{"set appends a new key, escaped", o.set(`new"key`, []byte(`{}`)), `{"k":1,"j":[ "x" ],"k":2,"new\"key":{}}`},
		{"del removes every copy", o.del("k"), `{"j":[ "x" ]}`},
		{"del of an absent key", o.del("absent"), `{"k":1,"j":[ "x" ],"k":2}`},
		{"empty", Object(nil), `{}`},
	}
	for _, tt := range tests {
		if got := string(tt.got.bytes()); got != tt.want {
			t.Errorf("%s: bytes() = %s, want %s", tt.name, got, tt.want)
		}
	}
	if got := string(o.bytes()); got != `{"k":1,"j":[ "x" ],"k":2}` {
		t.Errorf("set and del changed the object they were called on: %s", got)
	}
}
