// Package cgroup2 finds where the cgroup v2 hierarchy is mounted.
package cgroup2
