package config

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

// AnnotationPrefix marks per-target settings on a Deployment's pod template.
const AnnotationPrefix = "autoscaling.knative.dev/"

// RPSUtilization is the share of a pod's rps capacity the autoscaler aims
// for unless a target sets target-utilization-percentage: Knative's fixed
// 70 %; the ConfigMap's percentage is for concurrency only.
const RPSUtilization = 0.7

// Metrics a target can scale on: the requests the agents count, or, with
// the HPA class only, the resource metrics the HPA reads itself.
const (
	MetricConcurrency = "concurrency"
	MetricRPS         = "rps"
	MetricCPU         = "cpu"
	MetricMemory      = "memory"
)

// Autoscaler classes (the values of Knative's autoscaling.knative.dev/class).
const (
	ClassKPA      = string(v1alpha1.ClassKPA)
	ClassHPA      = string(v1alpha1.ClassHPA)
	ClassExternal = string(v1alpha1.ClassExternal)
)

// DefaultCPUUtilization is the HPA class's cpu target when the target sets
// none: the HorizontalPodAutoscaler's own default, 80 % of the requests.
const DefaultCPUUtilization = 80

// Aggregation algorithms of the metric windows.
const (
	AggregationLinear              = "linear"
	AggregationWeightedExponential = "weighted-exponential"
)

// Overrides are per-target settings; nil means "not set here". The
// PodAutoscaler spec and the annotations each give one.
type Overrides struct {
	Class                                             *string
	MinScale, MaxScale, InitialScale, ActivationScale *int32
	ScaleDownDelay                                    *time.Duration
	Metric                                            *string
	Target                                            *float64
	TargetUtilizationPercentage                       *float64
	TargetBurstCapacity                               *float64
	Window                                            *time.Duration
	PanicWindowPercentage                             *float64
	PanicThresholdPercentage                          *float64
	ScaleToZeroPodRetentionPeriod                     *time.Duration
	Aggregation                                       *string
}

// annotation parses one annotation into o.
type annotation struct {
	key   string
	parse func(o *Overrides, v string) error
}

func setCount(dst **int32) func(*Overrides, string) error {
	return func(_ *Overrides, v string) error {
		n, err := count(v)
		*dst = &n
		return err
	}
}

// annotations returns the parsers bound to o's fields.
func (o *Overrides) annotations() []annotation {
	return []annotation{
		{"class", func(o *Overrides, v string) error {
			if v != ClassKPA && v != ClassHPA && v != ClassExternal {
				return fmt.Errorf("must be %q, %q or %q", ClassKPA, ClassHPA, ClassExternal)
			}
			o.Class = &v
			return nil
		}},
		{"min-scale", setCount(&o.MinScale)},
		{"max-scale", setCount(&o.MaxScale)},
		{"initial-scale", setCount(&o.InitialScale)},
		{"activation-scale", func(o *Overrides, v string) error {
			n, err := count(v)
			if err == nil && n < 2 {
				err = errors.New("must be a whole number >= 2")
			}
			o.ActivationScale = &n
			return err
		}},
		{"scale-down-delay", func(o *Overrides, v string) error {
			d, err := scaleDownDelay(v)
			o.ScaleDownDelay = &d
			return err
		}},
		{"metric", func(o *Overrides, v string) error {
			if v != MetricConcurrency && v != MetricRPS && v != MetricCPU && v != MetricMemory {
				return fmt.Errorf("must be %q or %q (or, with class %s, %q or %q)", MetricConcurrency, MetricRPS, ClassHPA, MetricCPU, MetricMemory)
			}
			o.Metric = &v
			return nil
		}},
		{"target", func(o *Overrides, v string) error {
			f, err := floatIn(v, 0.01, math.Inf(1), "a number >= 0.01")
			o.Target = &f
			return err
		}},
		{"target-utilization-percentage", func(o *Overrides, v string) error {
			f, err := floatIn(v, 1, 100, "a percentage from 1 to 100")
			o.TargetUtilizationPercentage = &f
			return err
		}},
		{"target-burst-capacity", func(o *Overrides, v string) error {
			f, err := burstCapacity(v)
			o.TargetBurstCapacity = &f
			return err
		}},
		{"window", func(o *Overrides, v string) error {
			d, err := window(v)
			o.Window = &d
			return err
		}},
		{"panic-window-percentage", func(o *Overrides, v string) error {
			f, err := floatIn(v, 1, 100, "a percentage from 1 to 100")
			o.PanicWindowPercentage = &f
			return err
		}},
		{"panic-threshold-percentage", func(o *Overrides, v string) error {
			f, err := floatIn(v, 110, 1000, "a percentage from 110 to 1000")
			o.PanicThresholdPercentage = &f
			return err
		}},
		{"scale-to-zero-pod-retention-period", func(o *Overrides, v string) error {
			d, err := durationIn(v, 0, time.Hour, "a duration from 0s to 1h")
			o.ScaleToZeroPodRetentionPeriod = &d
			return err
		}},
		{"metric-aggregation-algorithm", func(o *Overrides, v string) error {
			if v != AggregationLinear && v != AggregationWeightedExponential {
				return fmt.Errorf("must be %q or %q", AggregationLinear, AggregationWeightedExponential)
			}
			o.Aggregation = &v
			return nil
		}},
	}
}

// ParseAnnotations reads the autoscaling.knative.dev/<key> annotations;
// other annotations are ignored, unknown keys under the prefix are errors.
func ParseAnnotations(annotations map[string]string) (*Overrides, error) {
	o := &Overrides{}
	parsers := o.annotations()
	byKey := make(map[string]annotation, len(parsers))
	for _, a := range parsers {
		byKey[a.key] = a
	}
	keys := make([]string, 0, len(annotations))
	for k := range annotations {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var errs []error
	for _, k := range keys {
		name, ok := strings.CutPrefix(k, AnnotationPrefix)
		if !ok {
			continue
		}
		a, ok := byKey[name]
		if !ok {
			known := make([]string, 0, len(parsers))
			for _, p := range parsers {
				known = append(known, p.key)
			}
			sort.Strings(known)
			errs = append(errs, fmt.Errorf("annotation %q is not a per-target setting; known keys after %s: %s", k, AnnotationPrefix, strings.Join(known, ", ")))
			continue
		}
		v := annotations[k]
		if err := a.parse(o, strings.TrimSpace(v)); err != nil {
			errs = append(errs, fmt.Errorf("annotation %q: value %q: %w", k, v, err))
		}
	}
	return o, errors.Join(errs...)
}

// Settings are one target's effective autoscaling settings.
type Settings struct {
	// Class is ClassKPA, ClassHPA or ClassExternal.
	Class  string
	Metric string
	// Total is one pod's capacity for the metric; TargetValue what the
	// autoscaler aims at per pod: max(0.01, Total * Utilization), where
	// Utilization is the target's target-utilization-percentage, else
	// the ConfigMap's container-concurrency-target-percentage for
	// concurrency and RPSUtilization (0.7) for rps. With metric cpu or
	// memory they are those of concurrency: the windows still average
	// the requests in flight, which tell when the target is idle.
	Total, Utilization, TargetValue float64
	// HPATarget is, with the HPA class, the HorizontalPodAutoscaler's
	// target per pod: TargetValue for concurrency and rps (the value the
	// KPA would aim at), a percentage of the CPU requests for cpu,
	// mebibytes for memory.
	HPATarget                     float64
	ContainerConcurrency          int32
	TargetBurstCapacity           float64
	StableWindow, PanicWindow     time.Duration
	PanicThreshold                float64
	MaxScaleUpRate                float64
	MaxScaleDownRate              float64
	MinScale, MaxScale            int32
	InitialScale                  int32
	ActivationScale               int32
	ScaleDownDelay                time.Duration
	EnableScaleToZero             bool
	ScaleToZeroGracePeriod        time.Duration
	ScaleToZeroPodRetentionPeriod time.Duration
	ActivatorCapacity             float64
	Aggregation                   string
}

// Effective merges, highest first, spec, annotations and the cluster
// config into one target's settings, and validates rules across keys.
// containerConcurrency is the target's hard limit (0: none).
func Effective(c *Config, containerConcurrency int32, annotations, spec *Overrides) (Settings, error) {
	s := Settings{
		Class:                         ClassKPA,
		Metric:                        MetricConcurrency,
		ContainerConcurrency:          containerConcurrency,
		TargetBurstCapacity:           c.TargetBurstCapacity,
		StableWindow:                  c.StableWindow,
		PanicThreshold:                c.PanicThreshold,
		MaxScaleUpRate:                c.MaxScaleUpRate,
		MaxScaleDownRate:              c.MaxScaleDownRate,
		MinScale:                      c.MinScale,
		MaxScale:                      c.MaxScale,
		InitialScale:                  c.InitialScale,
		ScaleDownDelay:                c.ScaleDownDelay,
		EnableScaleToZero:             c.EnableScaleToZero,
		ScaleToZeroGracePeriod:        c.ScaleToZeroGracePeriod,
		ScaleToZeroPodRetentionPeriod: c.ScaleToZeroPodRetentionPeriod,
		ActivatorCapacity:             c.ActivatorCapacity,
		Aggregation:                   AggregationLinear,
	}
	panicPct := c.PanicWindowPercentage
	var target, utilizationPct *float64
	var targetMin *int32 // min-scale set for the target (not the cluster's)
	// Lower precedence first, so spec values overwrite annotation values.
	metricSet := false
	for _, o := range []*Overrides{annotations, spec} {
		if o == nil {
			continue
		}
		setIf(&s.Class, o.Class)
		metricSet = metricSet || o.Metric != nil
		setIf(&s.MinScale, o.MinScale)
		if o.MinScale != nil {
			targetMin = o.MinScale
		}
		setIf(&s.MaxScale, o.MaxScale)
		setIf(&s.InitialScale, o.InitialScale)
		setIf(&s.ActivationScale, o.ActivationScale)
		setIf(&s.ScaleDownDelay, o.ScaleDownDelay)
		setIf(&s.Metric, o.Metric)
		setIf(&s.TargetBurstCapacity, o.TargetBurstCapacity)
		setIf(&s.StableWindow, o.Window)
		setIf(&panicPct, o.PanicWindowPercentage)
		setIf(&s.ScaleToZeroPodRetentionPeriod, o.ScaleToZeroPodRetentionPeriod)
		setIf(&s.Aggregation, o.Aggregation)
		if o.Target != nil {
			target = o.Target
		}
		if o.TargetUtilizationPercentage != nil {
			utilizationPct = o.TargetUtilizationPercentage
		}
		if o.PanicThresholdPercentage != nil {
			s.PanicThreshold = *o.PanicThresholdPercentage / 100
		}
	}

	// A pod's capacity and the share of it to aim at (docs/autoscaling.md,
	// "Target value"). The ConfigMap's
	// container-concurrency-target-percentage is the concurrency metric's
	// utilization only: rps aims at a fixed RPSUtilization, as in Knative,
	// unless the target sets its own target-utilization-percentage. Example: percentage 50 in the
	// ConfigMap, rps: 200 x 0.7 = 140, not 200 x 0.5 = 100.
	if s.Class == ClassHPA && !metricSet {
		s.Metric = MetricCPU // Knative's HPA class scales on cpu unless told
	}
	switch s.Metric {
	case MetricRPS:
		s.Utilization = RPSUtilization
		s.Total = c.RPSTargetDefault
		if target != nil {
			s.Total = *target
		}
	default:
		s.Utilization = c.Utilization
		s.Total = c.ConcurrencyTargetDefault
		if containerConcurrency > 0 {
			s.Total = float64(containerConcurrency)
		}
		if target != nil && s.Metric == MetricConcurrency { // cpu's and memory's target is the HPA's
			s.Total = *target
			if containerConcurrency > 0 {
				s.Total = math.Min(*target, float64(containerConcurrency))
			}
		}
	}
	if utilizationPct != nil {
		s.Utilization = *utilizationPct / 100
	}
	s.TargetValue = math.Max(0.01, s.Total*s.Utilization)

	// What the HPA class's HorizontalPodAutoscaler aims at per pod. cpu
	// and memory take the target as it is (Knative's HPA class applies no
	// utilization to them); their windows average concurrency as above,
	// for the scale to zero only.
	switch s.Metric {
	case MetricCPU:
		s.HPATarget = DefaultCPUUtilization
		if target != nil {
			s.HPATarget = math.Ceil(*target)
		}
	case MetricMemory:
		if target != nil {
			s.HPATarget = *target
		}
	default:
		s.HPATarget = s.TargetValue
	}
	if s.Class != ClassKPA {
		// The HPA class has no burst capacity to keep (as in Knative):
		// its pods take traffic directly whenever one is ready, and the
		// activator is in the path only at zero. With 0 the decider keeps
		// its excess burst capacity at 0, two activators serve the zero,
		// and the last pod goes only once a probe finds one in the path.
		s.TargetBurstCapacity = 0
		// Nor does it panic: the HPA sizes bursts. An infinite threshold
		// keeps the decider, which here only tells when the target is
		// idle, from logging panics that decide nothing. The same holds
		// for a target another autoscaler scales (ClassExternal), whose
		// decider decides nothing at all.
		s.PanicThreshold = math.Inf(1)
	}

	// The panic window: a whole number of seconds, at least one.
	// Example: 60s * 10% = 6s; 10s * 15% = 1.5s -> 2s.
	s.PanicWindow = max(time.Second, time.Duration(math.Round(s.StableWindow.Seconds()*panicPct/100))*time.Second)

	return s, s.validate(c, targetMin)
}

func setIf[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}

// validate checks rules across keys. targetMin is the min-scale the
// target itself sets, nil if it takes the cluster's.
func (s *Settings) validate(c *Config, targetMin *int32) error {
	var errs []error
	if s.ContainerConcurrency < 0 {
		errs = append(errs, fmt.Errorf("containerConcurrency %d: must be 0 (no limit) or more", s.ContainerConcurrency))
	}
	if s.MaxScale > 0 && s.MinScale > s.MaxScale {
		errs = append(errs, fmt.Errorf("min-scale %d is above max-scale %d", s.MinScale, s.MaxScale))
	}
	if c.MaxScaleLimit > 0 && (s.MaxScale == 0 || s.MaxScale > c.MaxScaleLimit) {
		errs = append(errs, fmt.Errorf("max-scale %d: the cluster's max-scale-limit %d allows 1 to %d", s.MaxScale, c.MaxScaleLimit, c.MaxScaleLimit))
	}
	if c.MaxScaleLimit > 0 && s.MinScale > c.MaxScaleLimit {
		errs = append(errs, fmt.Errorf("min-scale %d: the cluster's max-scale-limit %d allows at most %d", s.MinScale, c.MaxScaleLimit, c.MaxScaleLimit))
	}
	if s.ActivationScale > 0 && s.MaxScale > 0 && s.ActivationScale > s.MaxScale {
		errs = append(errs, fmt.Errorf("activation-scale %d is above max-scale %d", s.ActivationScale, s.MaxScale))
	}
	// Knative holds activation-scale within min..max, the min being the
	// target's own min-scale: a cluster-wide min-scale above a target's
	// activation scale is not the target's mistake (min-scale wins anyway).
	if s.ActivationScale > 0 && targetMin != nil && *targetMin > s.ActivationScale {
		errs = append(errs, fmt.Errorf("min-scale %d is above activation-scale %d", *targetMin, s.ActivationScale))
	}
	if s.Class != ClassHPA && (s.Metric == MetricCPU || s.Metric == MetricMemory) {
		errs = append(errs, fmt.Errorf("metric %s needs class %s: the KPA scales on %s or %s", s.Metric, ClassHPA, MetricConcurrency, MetricRPS))
	}
	if s.Class == ClassHPA && s.Metric == MetricMemory && s.HPATarget <= 0 {
		errs = append(errs, fmt.Errorf("metric %s needs a target (mebibytes per pod) with class %s", MetricMemory, ClassHPA))
	}
	if s.InitialScale == 0 && !c.AllowZeroInitialScale {
		errs = append(errs, errors.New("initial-scale 0 needs the cluster's allow-zero-initial-scale: true"))
	}
	return errors.Join(errs...)
}
