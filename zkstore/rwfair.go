package zkstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/flightlock/flightlock/lockstore"
)

// writerReserve is how long the last reader keeps a key for the writer that waited (releaseHold),
// to beat the readers it held back; at most this, a departed writer holds new readers back.
const writerReserve = time.Second

// Read holds (lockstore.ReadOwner): the key node's data is "~r ...", one hold "r-<hash>" per
// reader. A refused writer marks it (" ~"); readers refuse a marked node: writer preference.

// joinReaders adds read hold name of owner to readers' key node p (stat, kids), failing (again
// true) on a node the key got since or one a writer marked. The data names the last reader, so
// a refused writer is told of a holder (releaseHold clears it when a reader leaves others).
func (s *Store) joinReaders(ctx context.Context, p, owner, name string, data []byte, stat *zk.Stat, kids []string) (a lockstore.Acquisition, again bool, err error) {
	_, err = s.multi(ctx, s.giveBackIfTaken(p, owner, name),
		&zk.CheckVersionRequest{Path: p + "/" + kids[0], Version: -1},
		&zk.SetDataRequest{Path: p, Data: data, Version: stat.Version},
		&zk.CreateRequest{Path: p + "/" + name, Acl: s.acl, Flags: zk.FlagEphemeral})
	switch {
	case err == nil:
		s.remember(p, owner, name)
		return lockstore.Acquisition{Acquired: true, Fence: fence(stat.Czxid)}, false, nil
	case errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrNodeExists):
		return lockstore.Acquisition{}, true, nil
	}
	return lockstore.Acquisition{}, false, fmt.Errorf("join the readers of %s: %w", p, s.mayHaveMade(p, owner, name, err))
}

// acquireFair is Acquire of a fair request, whose arguments Acquire checked. A key's line
// (linePath) holds places: ephemeral sequential nodes, ranked by arrival rather than by Asked,
// that live as long as their session rather than Queue. The first in line takes a free key in
// a multi that also deletes its place.
func (s *Store) acquireFair(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	key, owner, meta, queue := req.Key, req.Owner, req.Meta, req.Queue
	if lockstore.IsReadOwner(owner) {
		return lockstore.Acquisition{}, fmt.Errorf("flightlock: fair acquire %q: read holds share and keep no line", key)
	}
	line := s.linePath(key)
	kids, err := s.children(ctx, line)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return lockstore.Acquisition{}, fmt.Errorf("flightlock: read the line of %q: %w", key, err)
	}
	place := s.placeOf(line, owner)
	if found := placeIn(line, place, kids); found != place {
		// Gone with an expired session or taken away: take another; or a lost reply's: owner's.
		s.forget(line, owner, place)
		if place = found; found != "" {
			s.remember(line, owner, found)
		}
	}
	if place == "" && queue > 0 {
		if place, err = s.takePlace(ctx, line, owner); err != nil {
			return lockstore.Acquisition{}, err
		}
		kids = append(kids, place[len(line)+1:])
	}
	slices.SortFunc(kids, func(a, b string) int { return strings.Compare(sequence(a), sequence(b)) })
	switch {
	case place == "" && len(kids) > 0:
		return lockstore.Acquisition{}, nil // a TryLock with others in line
	case place != "" && line+"/"+kids[0] != place:
		return lockstore.Acquisition{}, nil // others are first
	}
	return s.acquire(ctx, key, owner, meta, place)
}

// sequence is the sequence number that ends a sequential node's name.
func sequence(name string) string { return name[max(len(name)-10, 0):] }

// takePlace creates owner's place at the end of line.
func (s *Store) takePlace(ctx context.Context, line, owner string) (string, error) {
	start := line + "/" + placePre + ownerHash(owner) + "-" // of every place of owner's in line
	create := func() (string, error) {
		return s.conn.Create(start, nil, zk.FlagEphemeralSequential, s.acl)
	}
	late := func(path string, err error) {
		// The caller left: the place is nobody's. One a lost reply may have made is found by
		// owner's prefix (leave); a delete that fails is tried again (leaveLater).
		if err != nil {
			if !errors.Is(outcome(err), lockstore.ErrOutcomeUnknown) {
				return
			}
			path = start
		}
		s.remember(line, owner, path)
		ctx, cancel := context.WithTimeout(context.Background(), s.session)
		err = s.leave(ctx, line, owner, path)
		cancel()
		if err != nil {
			s.leaveLater(line, owner, path)
		}
	}
	path, err := call(ctx, create, late)
	if errors.Is(err, zk.ErrNoNode) {
		_, err = call(ctx, func() (string, error) { return s.conn.CreateContainer(line, nil, zk.FlagContainer, s.acl) }, nil)
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return "", fmt.Errorf("flightlock: create the line %s: %w", line, err)
		}
		path, err = call(ctx, create, late)
	}
	if err != nil {
		if err = outcome(err); errors.Is(err, lockstore.ErrOutcomeUnknown) {
			// The place may be in line under a name only the lost reply had: remembered by its
			// start, for LeaveQueue and the next acquisition (placeIn).
			s.remember(line, owner, start)
		}
		return "", fmt.Errorf("flightlock: take a place in %s: %w", line, err)
	}
	s.remember(line, owner, path)
	return path, nil
}

// placeIn returns the kid of line that place names: itself, or for a place remembered by its
// start (takePlace) the one it starts (sequence numbers have one length); "" for none.
func placeIn(line, place string, kids []string) string {
	for _, k := range kids {
		if p := line + "/" + k; place != "" && strings.HasPrefix(p, place) {
			return p
		}
	}
	return ""
}

// placeOf is owner's place in line, "" for none.
func (s *Store) placeOf(line, owner string) string {
	if places := s.holdsOf(line, owner); len(places) > 0 {
		return places[0]
	}
	return ""
}

// LeaveQueue implements lockstore.Store: deletes owner's place (seen within FairLookEvery); a
// place lives with its session, so a failed delete is retried (leaveLater).
func (s *Store) LeaveQueue(ctx context.Context, key, owner string) error {
	if err := lockstore.CheckArgs(key, owner, time.Second); err != nil { // any valid TTL: none is asked
		return err
	}
	line := s.linePath(key)
	place := s.placeOf(line, owner)
	if place == "" {
		return nil
	}
	err := s.leave(ctx, line, owner, place)
	if err != nil {
		go s.leaveLater(line, owner, place)
		return fmt.Errorf("flightlock: leave the line of %q: %w", key, err)
	}
	return nil
}

// leaveLater tries leave again, as releaseLater does a release, while place is owner's in line.
func (s *Store) leaveLater(line, owner, place string) {
	s.retry(func(ctx context.Context) bool {
		return s.placeOf(line, owner) != place || s.leave(ctx, line, owner, place) == nil
	})
}

// leave deletes owner's place in line, remembered as place, and forgets it.
func (s *Store) leave(ctx context.Context, line, owner, place string) error {
	target := place
	if strings.HasSuffix(place, "-") { // made by a request whose reply was lost, if at all (takePlace)
		// A sync brings the server read now up to the leader, which the create reached before
		// the session moved (the sync follows it) or never will (the old connection is refused).
		_, err := call(ctx, func() (string, error) { return s.conn.Sync(line) }, nil)
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return err
		}
		kids, err := s.children(ctx, line)
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return err
		}
		if target = placeIn(line, place, kids); target == "" {
			s.forget(line, owner, place)
			return nil
		}
	}
	if err := s.delete(ctx, target, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	s.forget(line, owner, place)
	return nil
}
