// Command autoscale is the test application of the autoscaling end-to-end
// tests, like Knative's autoscale test image: each request to / does the
// work its query asks for, so a load generator controls how long requests
// stay in flight (sleep), how much CPU (prime) and how much memory (bloat)
// they cost, and the answer names the pod that served it.
//
//	GET /?sleep=100         wait 100 ms (or sleep=1.5s: a Go duration)
//	GET /?prime=1000000     count the primes up to 1,000,000 (CPU)
//	GET /?bloat=50          allocate and touch 50 MB (memory)
//	GET /?sleep=100&prime=10000&bloat=5   all three, in one request
//	GET /healthz            readiness: 503 while starting and while draining
//
// Each answer to / carries X-In-Flight (the requests the pod had in
// flight, this one included) and X-Listening-For (microseconds since the
// app's listener opened: on a cold start's first answer, how long the
// request took to reach the new pod once it could be served). A bad value
// answers 400 naming the parameter, the value and what is allowed. On
// SIGTERM it stops being ready, keeps serving for --shutdown-delay, then
// drains requests in flight for up to --drain-timeout.
//
// With --grpc-port it also serves gRPC over h2c (HTTP/2 with prior
// knowledge, as gRPC servers in a cluster do) on that port: the Sleep
// service of internal/testutil/grpcsleep (/sockscale.test.Sleep/Call with
// a google.protobuf.StringValue such as "300ms" waits that long, then
// answers it; the header metadata x-pod and x-in-flight say as much as
// the HTTP answers do) and the standard health service, SERVING exactly
// when /healthz answers 200, for a kubelet gRPC probe. SIGTERM drains
// gRPC calls as it drains requests. The image's repository name is
// "autoscale".
package main
