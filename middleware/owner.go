package middleware

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"strings"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/handover"
	"google.golang.org/grpc/metadata"
)

// ownerMetadataKey carries one held lock per value: uvarint(len(key)) + key +
// uvarint(len(owner)) + owner + uvarint(fence), then a 16-byte HMAC when the services share an
// OwnerSecret. The -bin suffix makes gRPC base64 the value, since Redis keys may hold any byte.
const ownerMetadataKey = "flightlock-owner-bin"

// Bounds on what an inbound call may hand over.
const (
	maxHandedOwners = 64
	maxOwnerLen     = 128
	ownerMACLen     = 16 // truncated HMAC-SHA256: 128 bits, as strong as the token itself
)

// ownerPolicy says where owner tokens may go and which are believed. A token lets its bearer
// re-enter a held lock, so it goes only to PropagateTo, and is accepted only with TrustOwner
// and, with an OwnerSecret, signed with it.
type ownerPolicy struct {
	trust  bool
	to     []string // full methods, or services ending in '/'
	secret []byte   // empty: unsigned
}

func (p *ownerPolicy) propagates(method string) bool {
	return slices.ContainsFunc(p.to, func(t string) bool {
		return method == t || strings.HasSuffix(t, "/") && strings.HasPrefix(method, t)
	})
}

// withOwners returns the context of a call to method, with, when the policy sends owners there,
// the owner of each lock ctx holds (the innermost live lease of each key) in its metadata.
func (p *ownerPolicy) withOwners(ctx context.Context, method string) context.Context {
	if !p.propagates(method) {
		return ctx
	}
	leases := flightlock.AllFromContext(ctx)
	if len(leases) == 0 {
		return ctx
	}
	kv := make([]string, 0, 2*len(leases))
	for i, x := range leases {
		if slices.ContainsFunc(leases[:i], func(y *flightlock.Lease) bool { return y.Key() == x.Key() }) {
			continue // an outer lease of a key already sent
		}
		// "": released meanwhile (its lock may be another's), or a read lease, which is not handed
		// over: the downstream service takes its own read locks.
		if owner := x.Owner(); owner != "" {
			kv = append(kv, ownerMetadataKey, p.encode(x.Key(), owner, x.Fence()))
		}
	}
	if len(kv) == 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

func (p *ownerPolicy) encode(key, owner string, fence int64) string {
	b := make([]byte, 0, 3*binary.MaxVarintLen64+len(key)+len(owner)+ownerMACLen)
	b = append(binary.AppendUvarint(b, uint64(len(key))), key...)
	b = append(binary.AppendUvarint(b, uint64(len(owner))), owner...)
	b = binary.AppendUvarint(b, uint64(max(fence, 0)))
	if len(p.secret) > 0 {
		b = append(b, p.mac(b)...)
	}
	return string(b)
}

func (p *ownerPolicy) mac(signed []byte) []byte {
	m := hmac.New(sha256.New, p.secret)
	m.Write(signed)
	return m.Sum(nil)[:ownerMACLen]
}

// cutText cuts a uvarint length and that many bytes, 1 to maxLen, off the front of b.
func cutText(b []byte, maxLen int) (string, []byte, bool) {
	n, size := binary.Uvarint(b)
	if size <= 0 || n == 0 || n > uint64(maxLen) || uint64(len(b)-size) < n {
		return "", nil, false
	}
	return string(b[size : size+int(n)]), b[size+int(n):], true
}

func (p *ownerPolicy) decode(v string) (key, owner string, fence int64, ok bool) {
	key, b, ok := cutText([]byte(v), flightlock.MaxKeyLen)
	if ok {
		owner, b, ok = cutText(b, maxOwnerLen)
	}
	f, size := binary.Uvarint(b)
	if !ok || size <= 0 || f > 1<<62 {
		return "", "", 0, false
	}
	signed, rest := len(v)-len(b)+size, b[size:]
	if len(p.secret) > 0 {
		if len(rest) != ownerMACLen || !hmac.Equal(rest, p.mac([]byte(v[:signed]))) {
			return "", "", 0, false
		}
	} else if len(rest) != 0 && len(rest) != ownerMACLen {
		return "", "", 0, false
	}
	if strings.ContainsFunc(owner, func(c rune) bool { return c <= ' ' || c == 0x7f }) {
		return "", "", 0, false // the store keeps owners as space-free text
	}
	return key, owner, int64(f), true
}

// ownerRefusal says why an inbound call's owners were not honoured, for the refusal of a nested
// call they would have let in, which otherwise reads as if the caller sent no owner.
type ownerRefusal string

func (r ownerRefusal) Error() string { return string(r) }

// refusal returns why the policy turned down the owners the inbound call of ctx carried, or
// nil when it carried none a policy could honour. Only a refused nested call asks.
func (p *ownerPolicy) refusal(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	vs := md.Get(ownerMetadataKey)
	switch {
	case len(vs) == 0:
		return nil
	case !p.trust:
		return ownerRefusal("the call carried its caller's lock owners, which this service does not honour " +
			"without Lock.TrustOwner")
	case len(p.secret) == 0:
		return nil
	}
	unsigned := ownerPolicy{} // reads a value as it is laid out, signature unchecked
	for _, v := range vs[:min(len(vs), maxHandedOwners)] {
		if _, _, _, signed := p.decode(v); !signed {
			if _, _, _, ok := unsigned.decode(v); ok {
				return ownerRefusal("the call carried a lock owner that Lock.OwnerSecret does not verify: its " +
					"caller signs with another OwnerSecret, or with none; set the same on every service of the call chain")
			}
		}
	}
	return nil
}

// withIncomingOwners hands the owners in an inbound call's metadata to the locks of ctx
// (internal/handover) when the policy trusts them, skipping malformed or badly signed values.
// A handed-over owner only re-enters a lock it holds, never takes a free key.
func (p *ownerPolicy) withIncomingOwners(ctx context.Context) context.Context {
	if !p.trust {
		return ctx
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vs := md.Get(ownerMetadataKey)
	for _, v := range vs[:min(len(vs), maxHandedOwners)] {
		if key, owner, fence, ok := p.decode(v); ok {
			ctx = handover.With(ctx, handover.Owner{Key: key, Token: owner, Fence: fence})
		}
	}
	return ctx
}
