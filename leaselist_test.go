package flightlock

import (
	"slices"
	"testing"
)

// A hold keeps its first lease inline and the others in its rare part (memory per held lock):
// adding and removing in any order must keep exactly the leases added and not removed, since a
// lease missing from it is never told ErrLost, and a lease left in it is ended twice. The rare
// part made for a second lease keeps the hold's owner token as it was.
func TestHoldLeasesKeepWhatWasAddedAndNotRemoved(t *testing.T) {
	leases := make([]*Lease, 5)
	for i := range leases {
		leases[i] = &Lease{fence: int64(i)}
	}
	contents := func(h *hold) []int64 {
		var out []int64
		if h.first != nil {
			out = append(out, h.first.fence)
		}
		if e := h.ext.Load(); e != nil {
			for _, x := range e.more {
				out = append(out, x.fence)
			}
		}
		slices.Sort(out)
		return out
	}
	minted, foreign := newOwnerToken(), "an-owner-token-of-another-process"
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
		for _, owner := range []string{minted, foreign} {
			t.Run(tc.name, func(t *testing.T) {
				h := &hold{}
				h.setOwner(owner, "")
				for _, i := range tc.add {
					h.addLeaseLocked(leases[i])
				}
				for _, i := range tc.remove {
					h.removeLeaseLocked(leases[i])
				}
				if got := contents(h); !slices.Equal(got, tc.want) {
					t.Errorf("hold keeps leases of fences %v, want %v", got, tc.want)
				}
				h.addLeaseLocked(leases[4])
				if got := contents(h); !slices.Contains(got, 4) || len(got) != len(tc.want)+1 {
					t.Errorf("after one more add the hold keeps %v, want %v and 4", got, tc.want)
				}
				if h.owner() != owner {
					t.Errorf("owner token %q after the leases changed, want %q", h.owner(), owner)
				}
			})
		}
	}
}
