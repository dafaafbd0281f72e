// Package e2etest holds the testing helpers the end-to-end test packages
// (test/e2e, test/e2e/lifecycle) share: the pinned helm's check, polling
// until a condition holds, and deploying the autoscale test app until its
// public Service answers.
package e2etest
