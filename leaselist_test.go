package flightlock

import (
	"slices"
	"testing"
)

// The hold's lease list keeps its first lease inline (issue 17: memory per held lock): adding
// and removing in any order must keep exactly the leases added and not removed, since a lease
// missing from it is never told ErrLost, and a lease left in it is ended twice.
func TestLeaseListKeepsWhatWasAddedAndNotRemoved(t *testing.T) {
	leases := make([]*Lease, 5)
	for i := range leases {
		leases[i] = &Lease{fence: int64(i)}
	}
	contents := func(l *leaseList) []int64 {
		var out []int64
		if l.first != nil {
			out = append(out, l.first.fence)
		}
		if l.more != nil {
			for _, x := range *l.more {
				out = append(out, x.fence)
			}
		}
		slices.Sort(out)
		return out
	}
	for _, tc := range []struct {
		name   string
		add    []int
		remove []int
		want   []int64
	}{
		{"one", []int{0}, nil, []int64{0}},
		{"one removed", []int{0}, []int{0}, nil},
		{"first removed, a later one moves up", []int{0, 1, 2}, []int{0}, []int64{1, 2}},
		{"a later one removed", []int{0, 1, 2}, []int{1}, []int64{0, 2}},
		{"all removed, then added again", []int{0, 1, 2}, []int{2, 0, 1}, nil},
		{"removing one not there changes nothing", []int{0, 1}, []int{3}, []int64{0, 1}},
		{"removed twice", []int{0, 1, 2, 3, 4}, []int{3, 3, 0}, []int64{1, 2, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l leaseList
			for _, i := range tc.add {
				l.add(leases[i])
			}
			for _, i := range tc.remove {
				l.remove(leases[i])
			}
			if got := contents(&l); !slices.Equal(got, tc.want) {
				t.Errorf("list holds fences %v, want %v", got, tc.want)
			}
			l.add(leases[4])
			if got := contents(&l); !slices.Contains(got, 4) || len(got) != len(tc.want)+1 {
				t.Errorf("after one more add the list holds %v, want %v and 4", got, tc.want)
			}
		})
	}
}
