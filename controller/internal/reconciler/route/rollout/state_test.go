package rollout

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestEncodeDecode(t *testing.T) {
	in := &State{Groups: []Group{
		grp("hello", "", 55, Timing{StartUnixNano: 1764072010000000000, StepNanos: 30e9, StepPercent: 18, NextStepUnixNano: 1764072070000000000},
			rev("hello-00005", 36), rev("hello-00006", 19)),
		grp("hello", "latest", 100, Timing{}, rev("hello-00006", 100)),
	}}
	s, err := Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"groups":[{"configuration":"hello","percent":55,"revisions":[{"revisionName":"hello-00005","percent":36},{"revisionName":"hello-00006","percent":19}],` +
		`"timing":{"startUnixNano":1764072010000000000,"stepNanos":30000000000,"stepPercent":18,"nextStepUnixNano":1764072070000000000}},` +
		`{"configuration":"hello","tag":"latest","percent":100,"revisions":[{"revisionName":"hello-00006","percent":100}]}]}`
	if s != want {
		t.Errorf("Encode =\n%s\nwant\n%s", s, want)
	}
	got, err := Decode(s)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(in, got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if got, err := Decode(""); got != nil || err != nil {
		t.Errorf(`Decode("") = %v, %v; want nil, nil`, got, err)
	}
	if s, err := Encode(nil); s != "{}" || err != nil {
		t.Errorf("Encode(nil) = %q, %v; want {}", s, err)
	}
}

func TestDecodeSorts(t *testing.T) {
	got, err := Decode(`{"groups":[{"configuration":"b","tag":"x","percent":100,"revisions":[{"revisionName":"b1","percent":100}]},` +
		`{"configuration":"b","percent":50,"revisions":[{"revisionName":"b1","percent":50}]},` +
		`{"configuration":"a","percent":50,"revisions":[{"revisionName":"a1","percent":50}]}]}`)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, g := range got.Groups {
		order = append(order, g.Tag+"/"+g.Configuration)
	}
	if diff := cmp.Diff([]string{"/a", "/b", "x/b"}, order); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"not JSON", `{"groups":[`, "not JSON of a rollout state"},
		{"wrong type", `{"groups":{"a":1}}`, "not JSON of a rollout state"},
		{"group over 100 %", `{"groups":[{"configuration":"keith","percent":101,"revisions":[{"revisionName":"k","percent":101}]}]}`,
			`groups[0] (configuration "keith", tag ""): percent 101 is outside 0..100`},
		{"second group over 100 %", `{"groups":[{"configuration":"rob","percent":10,"revisions":[{"revisionName":"roy","percent":10}]},` +
			`{"configuration":"keith","tag":"richards","percent":101,"revisions":[{"revisionName":"k","percent":101}]}]}`,
			`groups[1] (configuration "keith", tag "richards"): percent 101 is outside 0..100`},
		{"step larger than the group", `{"groups":[{"configuration":"keith","percent":71,"revisions":[{"revisionName":"k","percent":71}],"timing":{"stepPercent":75}}]}`,
			"stepPercent 75 is outside 0..71"},
		{"negative step", `{"groups":[{"configuration":"keith","percent":71,"revisions":[{"revisionName":"k","percent":71}],"timing":{"stepPercent":-1}}]}`,
			"stepPercent -1 is outside 0..71"},
		{"revision more than the group", `{"groups":[{"configuration":"keith","percent":42,"revisions":[{"revisionName":"k","percent":43}]}]}`,
			"revisions sum to 43 %, not the group's 42 %"},
		{"revisions more than the group", `{"groups":[{"configuration":"keith","percent":42,"revisions":[{"revisionName":"k","percent":41},{"revisionName":"s","percent":3}]}]}`,
			"revisions sum to 44 %, not the group's 42 %"},
		{"negative revision", `{"groups":[{"configuration":"keith","percent":2,"revisions":[{"revisionName":"k","percent":3},{"revisionName":"s","percent":-1}]}]}`,
			`revisions[1] ("s"): percent -1 is outside 0..100`},
		{"no configuration", `{"groups":[{"percent":0}]}`, "configuration is empty"},
		{"no revision name", `{"groups":[{"configuration":"keith","percent":5,"revisions":[{"percent":5}]}]}`, "revisions[0]: revisionName is empty"},
		{"duplicate group", `{"groups":[{"configuration":"keith","percent":50,"revisions":[{"revisionName":"k","percent":50}]},` +
			`{"configuration":"keith","percent":50,"revisions":[{"revisionName":"k","percent":50}]}]}`, "a second group for the same configuration and tag"},
		{"negative time", `{"groups":[{"configuration":"keith","percent":5,"revisions":[{"revisionName":"k","percent":5}],"timing":{"stepNanos":-5}}]}`, "negative time"},
		{"rollout under 2 %", `{"groups":[{"configuration":"keith","percent":1,"revisions":[{"revisionName":"k","percent":1},{"revisionName":"s","percent":0}]}]}`,
			"a rollout needs at least 2 %"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode(tc.in)
			if err == nil {
				t.Fatalf("Decode = %+v, want an error", got)
			}
			if !errors.Is(err, ErrInvalidState) {
				t.Errorf("error %q does not wrap ErrInvalidState", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}
