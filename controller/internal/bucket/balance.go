package bucket

import (
	"context"

	"fmt"
	"hash/fnv"
	"slices"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// MemberLabel marks the member Leases: one per replica, renewed every
// RetryPeriod, which tell the replicas how many of them share the
// buckets (a replica that holds none, a new one, must be seen too).
const MemberLabel = "sockscale.dev/controller-member"

// staleMember is how long a member Lease may go unrenewed before any
// replica deletes it (a replica that died without deleting its own).
const staleMember = 10

// MemberLeaseName is the member Lease of the replica named identity
// (a hash: identities need not be valid object names).
func MemberLeaseName(identity string) string {
	h := fnv.New64a()
	h.Write([]byte(identity))
	return fmt.Sprintf("sockscale-controller-member-%016x", h.Sum64())
}

// assign is the buckets a replica should bid for: those the live
// members, sorted, take in turn (bucket i to members[i mod len]), so the
// shares differ by one bucket at most; and orphans, buckets no one has
// held for a LeaseDuration (their assignee may see the members
// otherwise), so that no bucket stays undecided. members includes self.
func assign(count int, members []string, self string, orphan []bool) []bool {
	want := make([]bool, count)
	for i := range count {
		want[i] = members[i%len(members)] == self || orphan[i]
	}
	return want
}

// balance renews this replica's member Lease, reads every Lease and
// starts or stops the bids that assign says.
func (s *Set) balance(ctx context.Context) error {
	if err := s.renewMember(ctx); err != nil {
		return err
	}
	list, err := s.opts.Leases.Leases(s.opts.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list Leases in %s: %w", s.opts.Namespace, err)
	}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	byName := make(map[string]*coordv1.Lease, len(list.Items))
	for i := range list.Items {
		l := &list.Items[i]
		byName[l.Name] = l
		if old, ok := s.seen[l.Name]; !ok || old.version != l.ResourceVersion {
			s.seen[l.Name] = seenLease{version: l.ResourceVersion, at: now}
		}
	}
	for name := range s.seen {
		if byName[name] == nil {
			delete(s.seen, name)
		}
	}
	members := []string{s.opts.Identity}
	var stale []string
	for name, l := range byName {
		if l.Labels[MemberLabel] == "" || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == s.opts.Identity {
			continue
		}
		switch quiet := now.Sub(s.seen[name].at); {
		case quiet < s.opts.LeaseDuration:
			members = append(members, *l.Spec.HolderIdentity)
		case quiet > staleMember*s.opts.LeaseDuration:
			stale = append(stale, name)
		}
	}
	slices.Sort(members)
	members = slices.Compact(members)
	if s.members != nil {
		s.members.Set(float64(len(members)))
	}
	orphan := make([]bool, s.opts.Count)
	for i := range s.opts.Count {
		name := LeaseName(i, s.opts.Count)
		l := byName[name]
		// Vacant: never made, released (no holder), or not renewed for
		// a LeaseDuration; an orphan once vacant for as long again.
		vacantFor := s.opts.LeaseDuration
		switch {
		case l == nil:
		case l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "":
			vacantFor = now.Sub(s.seen[name].at)
		default:
			vacantFor = now.Sub(s.seen[name].at) - s.opts.LeaseDuration
		}
		orphan[i] = vacantFor >= s.opts.LeaseDuration
	}
	for i, want := range assign(s.opts.Count, members, s.opts.Identity, orphan) {
		if want {
			s.startBid(ctx, i)
		} else if s.bids[i] != nil {
			s.opts.Log.Info("giving a bucket to the replica it is assigned to", "bucket", i, "of", s.opts.Count, "members", len(members))
			s.stopBid(i)
		}
	}
	for _, name := range stale {
		if err := s.opts.Leases.Leases(s.opts.Namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			s.opts.Log.Error(err, "delete a stale member Lease", "lease", name)
		}
	}
	return nil
}

// renewMember writes this replica's member Lease (a new resourceVersion
// is what the others see as alive).
func (s *Set) renewMember(ctx context.Context) error {
	leases := s.opts.Leases.Leases(s.opts.Namespace)
	name := MemberLeaseName(s.opts.Identity)
	now := metav1.NewMicroTime(s.clock.Now())
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{MemberLabel: "true"}},
			Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To(s.opts.Identity), RenewTime: &now,
				LeaseDurationSeconds: ptr.To(int32(s.opts.LeaseDuration / time.Second))},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create member Lease %s: %w", name, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("read member Lease %s: %w", name, err)
	}
	l.Spec.HolderIdentity, l.Spec.RenewTime = ptr.To(s.opts.Identity), &now
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("renew member Lease %s: %w", name, err)
	}
	return nil
}

// leaveMembers deletes this replica's member Lease, so that the others
// spread its buckets over themselves at their next balance.
func (s *Set) leaveMembers(ctx context.Context) error {
	err := s.opts.Leases.Leases(s.opts.Namespace).Delete(ctx, MemberLeaseName(s.opts.Identity), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}
