// Package configwatch loads the autoscaler ConfigMap and re-reads it on a
// clock's ticks, keeping the last good configuration in force.
package configwatch
