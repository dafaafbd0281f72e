package main

import (
	"math"
	"slices"
	"testing"
)

func TestMeanCI(t *testing.T) {
	tests := []struct {
		name           string
		vs             []float64
		mean, halfWant float64
	}{
		// sd = 1.5811, se = 0.7071, t(4) = 2.776: half = 1.963.
		{"five values", []float64{1, 2, 3, 4, 5}, 3, 1.963},
		// sd = 0, so no interval at all.
		{"constant", []float64{7, 7, 7}, 7, 0},
		// 40 alternating values: sd = 0.1013, se = 0.0160, t(39) = 2.023.
		{"beyond the table", alternating(40), 0.5, 0.0324},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mean, lo, hi := meanCI(tt.vs)
			if math.Abs(mean-tt.mean) > 1e-9 {
				t.Errorf("mean = %v, want %v", mean, tt.mean)
			}
			if half := (hi - lo) / 2; math.Abs(half-tt.halfWant) > 0.001 || math.Abs(mean-lo-half) > 1e-9 {
				t.Errorf("interval [%v, %v]: half width %v, want %v around the mean", lo, hi, half, tt.halfWant)
			}
		})
	}
}

// alternating is n values, 0.4 and 0.6 in turn.
func alternating(n int) []float64 {
	vs := make([]float64, n)
	for i := range vs {
		vs[i] = 0.4 + 0.2*float64(i%2)
	}
	return vs
}

func TestParseConcurrencies(t *testing.T) {
	got, err := parseConcurrencies("1, 16,64")
	if err != nil || !slices.Equal(got, []int{1, 16, 64}) {
		t.Errorf("parseConcurrencies(\"1, 16,64\") = %v, %v; want [1 16 64]", got, err)
	}
	for _, bad := range []string{"", "0", "1,,2", "-4", "x"} {
		if _, err := parseConcurrencies(bad); err == nil {
			t.Errorf("parseConcurrencies(%q): no error", bad)
		}
	}
}
