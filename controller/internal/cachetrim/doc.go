// Package cachetrim keeps of the objects the controller must watch
// cluster-wide only the fields it reads, so that its memory follows the
// targets it serves rather than everything else in the cluster.
package cachetrim
