package redisstore

import (
	"cmp"
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/lockstore"
)

// acquirePermits is one acquire.lua call over Permits, or on a Cluster one per run in a slot
// (lockstore.PermitKey keeps them in one, unless the key has a "{" opening no hash tag).
func (s *RedisStore) acquirePermits(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	if err := lockstore.CheckPermits(req); err != nil {
		return lockstore.Acquisition{}, err
	}
	_, cluster := s.client.(*redis.ClusterClient)
	var busy lockstore.Acquisition
	for from := 0; from < len(req.Permits); {
		to := from + 1
		for to < len(req.Permits) && (!cluster || lockstore.KeySlot(req.Permits[to]) == lockstore.KeySlot(req.Permits[from])) {
			to++
		}
		res, err := s.acquireRun(ctx, req, req.Permits[from:to])
		res.Permit += from
		for i := range res.More {
			res.More[i].Permit += from
		}
		if err != nil || res.Acquired {
			res.Holder = cmp.Or(res.Holder, busy.Holder)
			return res, err
		}
		if from == 0 || res.HolderTTL < busy.HolderTTL {
			busy.HolderTTL, busy.Holder = res.HolderTTL, res.Holder
		}
		from = to
	}
	return busy, nil
}

// acquireRun is one acquire.lua call over permits, which share a hash slot.
func (s *RedisStore) acquireRun(ctx context.Context, req lockstore.Request, permits []string) (lockstore.Acquisition, error) {
	keys := make([]string, 0, 2*len(permits))
	for _, k := range permits {
		keys = append(keys, k, lockstore.FenceKey(k))
	}
	args := []any{req.Owner, ttlMillis(req.TTL), metaArg(req.Meta), max(req.Want, 1)}
	late := func(cmd *redis.Cmd) {
		// An orphan: whichever permits the call took go back.
		if code, first, more, _, err := permitReply(cmd, permits); err == nil && code != acquireBusy {
			s.giveUpWithin(context.Background(), permits, append([]lockstore.PermitGrant{first}, more...), req.Owner, "")
		}
	}
	return s.acquire(ctx, "acquire", acquireScript, keys, args, permits, req.Owner, "", late)
}

// permitReply reads acquire.lua's reply over permits: reply's for one, else {1 or 2, a value,
// then a fence and a place from 1 per permit taken or re-entered} or {0, pttl, value}. first
// is the first permit taken (a busy reply's pttl in its Fence), more the others; a grant's
// value is that of a busy permit it passed over.
func permitReply(cmd *redis.Cmd, permits []string) (code int64, first lockstore.PermitGrant, more []lockstore.PermitGrant, value string, err error) {
	if len(permits) == 1 {
		code, first.Fence, value, err = reply(cmd)
		return code, first, nil, value, err
	}
	r, err := cmd.Slice()
	if err != nil {
		return 0, first, nil, "", err
	}
	code, ok := r[0].(int64)
	if code == acquireBusy && ok && len(r) == 3 {
		first.Fence, _ = r[1].(int64)
		value, _ = r[2].(string)
		return code, first, nil, value, nil
	}
	if !ok || len(r) < 4 || len(r)%2 != 0 {
		return 0, first, nil, "", fmt.Errorf("unexpected reply %v", r)
	}
	value, _ = r[1].(string)
	var grants []lockstore.PermitGrant
	for j := 2; j < len(r); j += 2 {
		fence, ok1 := r[j].(int64)
		place, ok2 := r[j+1].(int64)
		if !ok1 || !ok2 || place < 1 || int(place) > len(permits) {
			return 0, first, nil, "", fmt.Errorf("unexpected permit reply %v of %d permits", r, len(permits))
		}
		grants = append(grants, lockstore.PermitGrant{Permit: int(place) - 1, Fence: fence})
	}
	return code, grants[0], grants[1:], value, nil
}
