package names

// ConditionReady is the Ready condition of PodAutoscalers and
// ServerlessServices alike.
const ConditionReady = "Ready"

// ReasonNotOwned is Ready's reason when an object sockscale would write
// (a ServerlessService, a private Service, an EndpointSlice) belongs to
// someone else.
const ReasonNotOwned = "NotOwned"

// PrivateServiceName is the Service that selects a target's pods.
func PrivateServiceName(public string) string { return public + "-private" }
