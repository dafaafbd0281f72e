package kedascaler

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	pb "github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The metadata keys of a sockscale trigger, as the ScaledObject's author
// writes them:
//
//	triggers:
//	- type: external-push      # or external: KEDA then polls IsActive
//	  metadata:
//	    scalerAddress: ...     # KEDA's own, see kedaKeys
//	    deployment: web        # required
//	    metric: rps            # default concurrency
//	    target: "150"          # default 100 for concurrency, 200 for rps
//	    activationTarget: "2"  # default 0
//
// Each key may instead be written <key>FromEnv, naming an environment
// variable of the scale target's container: KEDA sends its value under
// that name.
const (
	// keyDeployment names the Deployment to read, in the ScaledObject's
	// namespace. Required: a ScaledObject's name often differs from its
	// target's, and a wrong name would read as a Deployment with no load.
	keyDeployment = "deployment"
	// keyMetric is what to scale on: concurrency (requests in flight,
	// the default) or rps (requests per second).
	keyMetric = "metric"
	// keyTarget is the value per pod to aim for (a number > 0): the HPA
	// that KEDA makes wants total / target pods.
	keyTarget = "target"
	// keyActivationTarget is the concurrency at or below which the
	// Deployment may rest at zero (a number >= 0, default 0). A request
	// held while it has no pod wakes it whatever this says.
	keyActivationTarget = "activationTarget"
	// keyNamespace is refused: the namespace is the ScaledObject's own,
	// which KEDA sends, so a tenant reads no other namespace's load.
	keyNamespace = "namespace"
	// fromEnv is the suffix of a key whose value KEDA read from the
	// scale target's environment.
	fromEnv = "FromEnv"
)

// ourKeys are the keys a sockscale trigger takes, in the order errors
// name them.
var ourKeys = []string{keyDeployment, keyMetric, keyTarget, keyActivationTarget}

// kedaKeys are the keys of the external trigger that KEDA reads itself
// and passes on with the rest: they are not the tenant's to misspell, so
// they pass. Any other key is refused, so a misspelled one (tagret) is
// an error rather than a default silently in force.
var kedaKeys = []string{"scalerAddress", "enableTLS", "unsafeSsl", "caCert", "tlsClientCert", "tlsClientKey"}

// metric is what a trigger scales on.
type metric string

const (
	metricConcurrency metric = "concurrency"
	metricRPS         metric = "rps"
)

// Knative's defaults: container-concurrency-target-default and
// requests-per-second-target-default.
const (
	defaultConcurrencyTarget = 100
	defaultRPSTarget         = 200
)

// trigger is one ScaledObject trigger's request, checked.
type trigger struct {
	namespace, deployment string
	metric                metric
	target                float64
	activationTarget      float64
}

// metricName is the trigger's metric as KEDA names it in the HPA (after a
// "s<trigger index>-" of its own): stable while the metadata is, and
// distinct for each metric and Deployment. A Deployment's name may hold
// dots, which a metric name, a path segment of the external metrics
// API, should not.
func (t trigger) metricName() string {
	return "sockscale-" + string(t.metric) + "-" + strings.ReplaceAll(t.deployment, ".", "-")
}

// value is the trigger's metric in load: the Deployment's total, which
// the HPA divides by target (KEDA's default metricType, AverageValue).
func (t trigger) value(l Load) float64 {
	if t.metric == metricRPS {
		return l.RPS
	}
	return l.Concurrency
}

// active decides IsActive from one reading of the Source; inFlightNow
// says WhenActive has fired. Worked examples:
//
//   - activationTarget 5, 2 pods, latest second 3: not active (a
//     Deployment at 1 pod may go to zero after KEDA's cooldown);
//   - activationTarget 5, no pod, one request held: active, or the held
//     request would wait until the activator gives up on it;
//   - activationTarget 0, 3 pods, latest second 0, a request started
//     this instant: active (at least 1 in flight now, > 0).
func (t trigger) active(l Load, inFlightNow bool) bool {
	concurrency := l.LatestConcurrency
	if inFlightNow {
		concurrency = max(concurrency, 1) // the request in flight now, which the last second may not have seen
	}
	held := l.Pods == 0 && concurrency > 0
	return held || concurrency > t.activationTarget
}

// parseTrigger checks a ScaledObjectRef: the namespace is KEDA's, the
// rest the tenant's metadata. Every problem is named in one
// InvalidArgument, so a tenant fixes them all in one go.
func parseTrigger(ref *pb.ScaledObjectRef) (trigger, error) {
	if ref.GetNamespace() == "" {
		return trigger{}, status.Error(codes.InvalidArgument, "scaledObjectRef has no namespace: KEDA sends the ScaledObject's own")
	}
	t := trigger{namespace: ref.GetNamespace(), metric: metricConcurrency}
	settings, problems := ourMetadata(ref.GetScalerMetadata(), t.namespace)

	if d, ok := settings[keyDeployment]; !ok {
		problems = append(problems, fmt.Sprintf("%s is required: the name of the Deployment to scale, in the ScaledObject's namespace %q", keyDeployment, t.namespace))
	} else if errs := validation.IsDNS1123Subdomain(d.value); len(errs) > 0 {
		problems = append(problems, fmt.Sprintf("%s %q: want a Deployment's name: %s", d.key, d.value, strings.Join(errs, "; ")))
	} else {
		t.deployment = d.value
	}

	if m, ok := settings[keyMetric]; ok {
		switch metric(m.value) {
		case metricConcurrency, metricRPS:
			t.metric = metric(m.value)
		default:
			problems = append(problems, fmt.Sprintf("%s %q: want %q (the default: requests in flight) or %q (requests per second)", m.key, m.value, metricConcurrency, metricRPS))
		}
	}

	t.target = defaultConcurrencyTarget
	if t.metric == metricRPS {
		t.target = defaultRPSTarget
	}
	if v, ok := settings[keyTarget]; ok {
		if f, err := strconv.ParseFloat(v.value, 64); err == nil && f > 0 && !math.IsInf(f, 1) {
			t.target = f
		} else {
			problems = append(problems, fmt.Sprintf("%s %q: want a number > 0, the %s per pod to aim for (default %d for %s, %d for %s)",
				v.key, v.value, t.metric.unit(), defaultConcurrencyTarget, metricConcurrency, defaultRPSTarget, metricRPS))
		}
	}

	if v, ok := settings[keyActivationTarget]; ok {
		if f, err := strconv.ParseFloat(v.value, 64); err == nil && f >= 0 && !math.IsInf(f, 1) {
			t.activationTarget = f
		} else {
			problems = append(problems, fmt.Sprintf("%s %q: want a number >= 0, the requests in flight at or below which the Deployment may rest at zero (default 0)", v.key, v.value))
		}
	}

	if len(problems) > 0 {
		return trigger{}, status.Error(codes.InvalidArgument, "sockscale trigger metadata: "+strings.Join(problems, "; "))
	}
	return t, nil
}

// unit says what m counts, for messages.
func (m metric) unit() string {
	if m == metricRPS {
		return "requests per second"
	}
	return "requests in flight"
}

// setting is one of our keys' value and the key it came under (target
// or targetFromEnv), for messages.
type setting struct{ key, value string }

// ourMetadata picks our keys out of the metadata, <key>FromEnv folded
// into <key>, and names every key it refuses: a namespace, an unknown
// key, a key given twice.
func ourMetadata(md map[string]string, namespace string) (map[string]setting, []string) {
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	slices.Sort(keys) // problems in a stable order
	ours := make(map[string]setting, len(ourKeys))
	var problems []string
	for _, k := range keys {
		base := strings.TrimSuffix(k, fromEnv)
		switch {
		case base == keyNamespace:
			problems = append(problems, fmt.Sprintf("%s %q: a trigger reads its ScaledObject's own namespace, %q; remove the key", k, md[k], namespace))
		case slices.Contains(ourKeys, base):
			if prev, twice := ours[base]; twice {
				problems = append(problems, fmt.Sprintf("%s and %s both given: keep one", prev.key, k))
				continue
			}
			ours[base] = setting{key: k, value: md[k]}
		case slices.Contains(kedaKeys, k):
		default:
			problems = append(problems, unknownKey(k))
		}
	}
	return ours, problems
}

// unknownKey says what is wrong with key k, and what it may have meant
// when it differs from one of ours only in case (Target, target).
func unknownKey(k string) string {
	base := strings.TrimSuffix(k, fromEnv)
	for _, ours := range ourKeys {
		if strings.EqualFold(base, ours) {
			return fmt.Sprintf("unknown key %q: did you mean %q?", k, ours+strings.TrimPrefix(k, base))
		}
	}
	return fmt.Sprintf("unknown key %q: a sockscale trigger takes %s (each also as <key>%s), besides KEDA's %s",
		k, strings.Join(ourKeys, ", "), fromEnv, strings.Join(kedaKeys, ", "))
}
