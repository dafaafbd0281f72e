package config

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Config is the cluster-wide autoscaler configuration (the ConfigMap).
type Config struct {
	// Utilization is the fraction of a pod's concurrency capacity the
	// autoscaler aims for (container-concurrency-target-percentage / 100).
	// It does not apply to the rps metric, which aims at RPSUtilization
	// (Knative's reading; docs/autoscaling.md, "Target value").
	Utilization float64
	// ConcurrencyTargetDefault is a pod's capacity in concurrent requests
	// when the target sets neither containerConcurrency nor target.
	ConcurrencyTargetDefault float64
	// RPSTargetDefault is a pod's capacity in requests per second.
	RPSTargetDefault float64
	// TargetBurstCapacity: 0 none, -1 activator always in the path.
	TargetBurstCapacity float64
	StableWindow        time.Duration
	// PanicWindowPercentage of the stable window (1..100).
	PanicWindowPercentage float64
	// PanicThreshold as a ratio (panic-threshold-percentage / 100).
	PanicThreshold                float64
	MaxScaleUpRate                float64
	MaxScaleDownRate              float64
	EnableScaleToZero             bool
	ScaleToZeroGracePeriod        time.Duration
	ScaleToZeroPodRetentionPeriod time.Duration
	ActivatorCapacity             float64
	InitialScale                  int32
	AllowZeroInitialScale         bool
	MinScale, MaxScale            int32
	ScaleDownDelay                time.Duration
	MaxScaleLimit                 int32
	// RolloutDuration moves a Route's traffic to a new latest Revision
	// gradually over this long (0: at once). Not an autoscaling key, but
	// cluster-wide like them; Services and Routes override it with the
	// serving.knative.dev/rollout-duration annotation.
	RolloutDuration time.Duration
	// Revision garbage collection (Knative's config-gc keys): see GC.
	GC GC
	// PodSpec: the Revision pod-spec fields allowed beyond the safe
	// default (Knative's config-features keys).
	PodSpec PodSpec
}

// Disabled is a GC setting turned off ("disabled" in the ConfigMap).
const Disabled = -1

// GC says when the serving API deletes a Service's old Revisions, those
// in routing state reserve (no Route sends them traffic) that are not the
// Service's latest created or ready and have no no-gc annotation.
// Sorted newest routed first, the first MinNonActive are kept; after
// those, one is deleted when it is older than RetainSinceCreate and has
// been reserve for longer than RetainSinceLastActive, and whatever is
// left beyond MaxNonActive is deleted oldest first. Disabled (-1) turns
// a time limit off (nothing is old enough) or MaxNonActive off (no cap).
type GC struct {
	RetainSinceCreate     time.Duration
	RetainSinceLastActive time.Duration
	MinNonActive          int32
	MaxNonActive          int32
}

// Defaults are the values users of Knative know.
func Defaults() *Config {
	return &Config{
		Utilization:                   0.7,
		ConcurrencyTargetDefault:      100,
		RPSTargetDefault:              200,
		TargetBurstCapacity:           211,
		StableWindow:                  60 * time.Second,
		PanicWindowPercentage:         10,
		PanicThreshold:                2,
		MaxScaleUpRate:                1000,
		MaxScaleDownRate:              2,
		EnableScaleToZero:             true,
		ScaleToZeroGracePeriod:        30 * time.Second,
		ScaleToZeroPodRetentionPeriod: 0,
		ActivatorCapacity:             100,
		GC:                            GC{RetainSinceCreate: 48 * time.Hour, RetainSinceLastActive: 15 * time.Hour, MinNonActive: 20, MaxNonActive: 1000},
		InitialScale:                  1,
		PodSpec:                       PodSpec{VolumesEmptyDir: true},
	}
}

// DefaultConfigMapData is the ConfigMap that parses to Defaults (the Helm
// chart ships it, and a test keeps the two in step).
func DefaultConfigMapData() map[string]string {
	return map[string]string{
		"container-concurrency-target-percentage": "70",
		"container-concurrency-target-default":    "100",
		"requests-per-second-target-default":      "200",
		"target-burst-capacity":                   "211",
		"stable-window":                           "60s",
		"panic-window-percentage":                 "10",
		"panic-threshold-percentage":              "200",
		"max-scale-up-rate":                       "1000",
		"max-scale-down-rate":                     "2",
		"enable-scale-to-zero":                    "true",
		"scale-to-zero-grace-period":              "30s",
		"scale-to-zero-pod-retention-period":      "0s",
		"activator-capacity":                      "100",
		"initial-scale":                           "1",
		"allow-zero-initial-scale":                "false",
		"min-scale":                               "0",
		"max-scale":                               "0",
		"scale-down-delay":                        "0s",
		"max-scale-limit":                         "0",
		"rollout-duration":                        "0s",
		"retain-since-create-time":                "48h",
		"retain-since-last-active-time":           "15h",
		"min-non-active-revisions":                "20",
		"max-non-active-revisions":                "1000",
		"podspec-volumes-emptydir":                "enabled",
		"podspec-volumes-hostpath":                "disabled",
		"podspec-persistent-volume-claim":         "disabled",
		"podspec-nodeselector":                    "disabled",
		"podspec-tolerations":                     "disabled",
		"podspec-securitycontext":                 "disabled",
		"containerspec-addcapabilities":           "disabled",
	}
}

// field parses one ConfigMap key into c.
type field struct {
	key   string
	parse func(c *Config, v string) error
}

var fields = append(autoscalerFields, podSpecFields...)

var autoscalerFields = []field{
	{"container-concurrency-target-percentage", func(c *Config, v string) error {
		p, err := percentage(v)
		c.Utilization = p / 100
		return err
	}},
	{"container-concurrency-target-default", func(c *Config, v string) (err error) {
		c.ConcurrencyTargetDefault, err = floatIn(v, 0.01, math.Inf(1), "a number >= 0.01")
		return err
	}},
	{"requests-per-second-target-default", func(c *Config, v string) (err error) {
		c.RPSTargetDefault, err = floatIn(v, 0.01, math.Inf(1), "a number >= 0.01")
		return err
	}},
	{"target-burst-capacity", func(c *Config, v string) (err error) {
		c.TargetBurstCapacity, err = burstCapacity(v)
		return err
	}},
	{"stable-window", func(c *Config, v string) (err error) {
		c.StableWindow, err = window(v)
		return err
	}},
	{"panic-window-percentage", func(c *Config, v string) (err error) {
		c.PanicWindowPercentage, err = floatIn(v, 1, 100, "a percentage from 1 to 100")
		return err
	}},
	{"panic-threshold-percentage", func(c *Config, v string) error {
		p, err := floatIn(v, 110, 1000, "a percentage from 110 to 1000")
		c.PanicThreshold = p / 100
		return err
	}},
	{"max-scale-up-rate", func(c *Config, v string) (err error) {
		c.MaxScaleUpRate, err = floatIn(v, math.Nextafter(1, 2), math.Inf(1), "a number > 1")
		return err
	}},
	{"max-scale-down-rate", func(c *Config, v string) (err error) {
		c.MaxScaleDownRate, err = floatIn(v, math.Nextafter(1, 2), math.Inf(1), "a number > 1")
		return err
	}},
	{"enable-scale-to-zero", func(c *Config, v string) (err error) {
		c.EnableScaleToZero, err = boolean(v)
		return err
	}},
	{"scale-to-zero-grace-period", func(c *Config, v string) (err error) {
		c.ScaleToZeroGracePeriod, err = durationIn(v, time.Second, time.Hour, "a duration from 1s to 1h")
		return err
	}},
	{"scale-to-zero-pod-retention-period", func(c *Config, v string) (err error) {
		c.ScaleToZeroPodRetentionPeriod, err = durationIn(v, 0, time.Hour, "a duration from 0s to 1h")
		return err
	}},
	{"activator-capacity", func(c *Config, v string) (err error) {
		c.ActivatorCapacity, err = floatIn(v, 1, math.Inf(1), "a number >= 1")
		return err
	}},
	{"initial-scale", func(c *Config, v string) (err error) {
		c.InitialScale, err = count(v)
		return err
	}},
	{"allow-zero-initial-scale", func(c *Config, v string) (err error) {
		c.AllowZeroInitialScale, err = boolean(v)
		return err
	}},
	{"min-scale", func(c *Config, v string) (err error) {
		c.MinScale, err = count(v)
		return err
	}},
	{"max-scale", func(c *Config, v string) (err error) {
		c.MaxScale, err = count(v)
		return err
	}},
	{"scale-down-delay", func(c *Config, v string) (err error) {
		c.ScaleDownDelay, err = scaleDownDelay(v)
		return err
	}},
	{"max-scale-limit", func(c *Config, v string) (err error) {
		c.MaxScaleLimit, err = count(v)
		return err
	}},
	{"rollout-duration", func(c *Config, v string) (err error) {
		c.RolloutDuration, err = ParseRolloutDuration(v)
		return err
	}},
	{"retain-since-create-time", func(c *Config, v string) (err error) {
		c.GC.RetainSinceCreate, err = durationOrDisabled(v)
		return err
	}},
	{"retain-since-last-active-time", func(c *Config, v string) (err error) {
		c.GC.RetainSinceLastActive, err = durationOrDisabled(v)
		return err
	}},
	{"min-non-active-revisions", func(c *Config, v string) (err error) {
		c.GC.MinNonActive, err = count(v)
		return err
	}},
	{"max-non-active-revisions", func(c *Config, v string) (err error) {
		if v == "disabled" {
			c.GC.MaxNonActive = Disabled
			return nil
		}
		n, err := count(v)
		if err != nil {
			return errors.New(`must be a whole number >= 0 or "disabled"`)
		}
		c.GC.MaxNonActive = n
		return nil
	}},
}

// durationOrDisabled reads a GC time limit: "disabled", or a duration >= 0.
func durationOrDisabled(v string) (time.Duration, error) {
	if v == "disabled" {
		return Disabled, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, errors.New(`must be a duration >= 0 (e.g. 48h) or "disabled"`)
	}
	return d, nil
}

// Parse reads a ConfigMap's data; missing keys keep their defaults. Every
// bad key is reported, each naming the key, the value and what is allowed.
// Keys it does not know are ignored, as Knative ignores them (its shipped
// example sets pod-autoscaler-class, which has no meaning here); the
// caller warns about them with UnknownKeys.
func Parse(data map[string]string) (*Config, error) {
	c := Defaults()
	var errs []error
	for _, f := range fields {
		v, ok := data[f.key]
		if !ok {
			continue
		}
		if err := f.parse(c, strings.TrimSpace(v)); err != nil {
			errs = append(errs, fmt.Errorf("key %q: value %q: %w", f.key, v, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// UnknownKeys lists, sorted, the keys of data that Parse ignores because
// they are no autoscaler setting ("_example" blocks, documentation, are
// not listed).
func UnknownKeys(data map[string]string) []string {
	known := make(map[string]bool, len(fields))
	for _, f := range fields {
		known[f.key] = true
	}
	var unknown []string
	for k := range data {
		if !known[k] && !strings.HasPrefix(k, "_") {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	return unknown
}

// Keys lists the ConfigMap keys, sorted.
func Keys() []string {
	keys := make([]string, 0, len(fields))
	for _, f := range fields {
		keys = append(keys, f.key)
	}
	sort.Strings(keys)
	return keys
}

// validate checks rules across keys.
func (c *Config) validate() error {
	var errs []error
	if c.MaxScale > 0 && c.MinScale > c.MaxScale {
		errs = append(errs, fmt.Errorf("min-scale %d is above max-scale %d", c.MinScale, c.MaxScale))
	}
	if c.MaxScaleLimit > 0 {
		if c.MaxScale == 0 || c.MaxScale > c.MaxScaleLimit {
			errs = append(errs, fmt.Errorf("max-scale %d: with max-scale-limit %d it must be from 1 to %d", c.MaxScale, c.MaxScaleLimit, c.MaxScaleLimit))
		}
	}
	if c.GC.MaxNonActive != Disabled && c.GC.MinNonActive > c.GC.MaxNonActive {
		errs = append(errs, fmt.Errorf("min-non-active-revisions %d is above max-non-active-revisions %d", c.GC.MinNonActive, c.GC.MaxNonActive))
	}
	if c.InitialScale == 0 && !c.AllowZeroInitialScale {
		errs = append(errs, errors.New("initial-scale 0 needs allow-zero-initial-scale: true"))
	}
	return errors.Join(errs...)
}

// percentage reads a utilization: 1..100, or a fraction in (0, 1].
func percentage(v string) (float64, error) {
	p, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(p) || p <= 0 || p > 100 {
		return 0, errors.New("must be a percentage in (0, 100], or a fraction in (0, 1]")
	}
	if p <= 1 {
		p *= 100 // 0.7 means 70 %
	}
	return p, nil
}

// floatIn reads a finite number from lo to hi: "Inf" is no number of
// pods or requests (a target of +Inf makes 0 x Inf = NaN activators).
func floatIn(v string, lo, hi float64, allowed string) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < lo || f > hi {
		return 0, fmt.Errorf("must be %s", allowed)
	}
	return f, nil
}

func burstCapacity(v string) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || (f < 0 && f != -1) {
		return 0, errors.New("must be -1 (activator always in the path), 0, or a positive number")
	}
	return f, nil
}

func window(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d < 6*time.Second || d > time.Hour || d%time.Second != 0 {
		return 0, errors.New("must be whole seconds from 6s to 1h")
	}
	return d, nil
}

// MaxRolloutDuration is the longest rollout-duration accepted: a day.
const MaxRolloutDuration = 24 * time.Hour

// ParseRolloutDuration reads a rollout-duration, of the ConfigMap or of
// the annotation: a Go duration ("90s", "2m") or whole seconds ("90"),
// whole seconds from 0s to 24h.
func ParseRolloutDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if n, nerr := strconv.ParseInt(v, 10, 64); nerr == nil && n >= 0 && n <= int64(MaxRolloutDuration/time.Second) {
		d, err = time.Duration(n)*time.Second, nil
	}
	if err != nil || d < 0 || d > MaxRolloutDuration || d%time.Second != 0 {
		return 0, errors.New(`must be whole seconds from 0s to 24h, as a duration ("90s", "2m") or a number of seconds ("90")`)
	}
	return d, nil
}

// scaleDownDelay reads a scale-down delay: whole seconds, as Knative
// requires ("61984ms" is refused, ConfigMap and annotation alike).
func scaleDownDelay(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > time.Hour || d%time.Second != 0 {
		return 0, errors.New("must be whole seconds from 0s to 1h")
	}
	return d, nil
}

func durationIn(v string, lo, hi time.Duration, allowed string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d < lo || d > hi {
		return 0, fmt.Errorf("must be %s", allowed)
	}
	return d, nil
}

func boolean(v string) (bool, error) {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errors.New("must be true or false")
	}
	return b, nil
}

func count(v string) (int32, error) {
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 0 {
		return 0, errors.New("must be a whole number >= 0")
	}
	return int32(n), nil
}
