package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Limits of one request's work. They keep a typo from pinning a node (a
// sieve up to 4e9 would allocate 500 MB and run for a minute) while leaving
// room for any load test: 40,000,000 is ~0.3 s of one core and 5 MB.
const (
	maxSleep   = 10 * time.Minute
	maxPrime   = 40_000_000
	maxBloatMB = 1024
)

// work is what one request asks for; the zero value does nothing.
type work struct {
	sleep   time.Duration
	prime   int // find the primes up to this number (CPU)
	bloatMB int // allocate and touch this many MiB (memory)
}

// paramError is a bad query parameter: the 400 names the parameter, the
// value and what is allowed, so a load test's typo is obvious in its log.
type paramError struct {
	param, value, allowed string
}

func (e *paramError) Error() string {
	return fmt.Sprintf("parameter %s=%q: want %s", e.param, e.value, e.allowed)
}

// parseWork reads sleep, prime and bloat from a query. Every bad parameter
// is reported (errors.Join of *paramError), not only the first. Unknown
// parameters are refused too: "slep=100" would otherwise return at once and
// make a scaling test measure nothing.
func parseWork(q url.Values) (work, error) {
	var w work
	var errs []error
	for name, vals := range q {
		v := vals[0]
		if len(vals) > 1 {
			errs = append(errs, &paramError{name, strings.Join(vals, ","), "a single value"})
			continue
		}
		var err error
		switch name {
		case "sleep":
			w.sleep, err = parseSleep(v)
		case "prime":
			w.prime, err = parseInt(name, v, maxPrime, "a whole number from 0 to 40000000")
		case "bloat":
			w.bloatMB, err = parseInt(name, v, maxBloatMB, "megabytes, a whole number from 0 to 1024")
		default:
			err = &paramError{name, v, "no such parameter (known: sleep, prime, bloat)"}
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return w, errors.Join(errs...)
}

// parseSleep takes milliseconds ("100", as Knative's autoscale app does) or
// a Go duration ("100ms", "1.5s").
func parseSleep(v string) (time.Duration, error) {
	bad := &paramError{"sleep", v, "milliseconds (e.g. 100) or a Go duration (e.g. 100ms) from 0 to 10m"}
	var d time.Duration
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
		if ms < 0 || ms > maxSleep.Milliseconds() {
			return 0, bad
		}
		d = time.Duration(ms) * time.Millisecond
	} else {
		d, err = time.ParseDuration(v)
		if err != nil || d < 0 || d > maxSleep {
			return 0, bad
		}
	}
	return d, nil
}

func parseInt(name, v string, limit int, allowed string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > limit {
		return 0, &paramError{name, v, allowed}
	}
	return n, nil
}

// sleep waits d, or less if the client goes away (its work is then moot).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// primes counts the primes up to n with a sieve of Eratosthenes over odd
// numbers, one bit each (n/16 bytes: 2.5 MB at the limit), so the cost is
// CPU, not memory. It returns the count and the largest prime (0 if none).
func primes(n int) (count, largest int) {
	if n < 2 {
		return 0, 0
	}
	// Bit i stands for the odd number 2i+1; a set bit means composite.
	composite := make([]uint64, (n/2)/64+1)
	count, largest = 1, 2 // 2, the only even prime
	for i := 1; 2*i+1 <= n; i++ {
		if composite[i/64]&(1<<(uint(i)%64)) != 0 {
			continue
		}
		p := 2*i + 1
		count, largest = count+1, p
		// Odd multiples from p*p on: smaller ones have a smaller factor.
		for m := p * p; m <= n; m += 2 * p {
			j := m / 2
			composite[j/64] |= 1 << (uint(j) % 64)
		}
	}
	return count, largest
}

// bloat allocates mb MiB and writes one byte in every 4 KiB page, so the
// memory is resident (an untouched allocation costs only address space).
// The caller keeps the result alive for as long as the memory should count.
func bloat(mb int) []byte {
	b := make([]byte, mb<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	return b
}
