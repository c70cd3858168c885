package middleware

import (
	"context"
	"encoding/binary"

	"github.com/flightlock/flightlock"
	"google.golang.org/grpc/metadata"
)

// ownerMetadataKey carries one held lock per value: uvarint(len(key)) + key + owner. The -bin
// suffix makes gRPC base64 the value, since Redis keys may hold any byte.
const ownerMetadataKey = "flightlock-owner-bin"

// Bounds on what an inbound call may hand over.
const (
	maxHandedOwners = 64
	maxOwnerLen     = 128
)

// withOutgoingOwners adds every lease that ctx holds to the outgoing metadata of a call.
func withOutgoingOwners(ctx context.Context) context.Context {
	leases := flightlock.AllFromContext(ctx)
	if len(leases) == 0 {
		return ctx
	}
	kv := make([]string, 0, 2*len(leases))
	seen := make(map[string]bool, len(leases))
	for _, l := range leases {
		if seen[l.Key()] {
			continue // re-entered: the innermost lease of a key says it all
		}
		seen[l.Key()] = true
		kv = append(kv, ownerMetadataKey, encodeOwner(l.Key(), l.Owner()))
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

func encodeOwner(key, owner string) string {
	b := binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen64+len(key)+len(owner)), uint64(len(key)))
	b = append(b, key...)
	b = append(b, owner...)
	return string(b)
}

func decodeOwner(v string) (key, owner string, ok bool) {
	n, size := binary.Uvarint([]byte(v))
	if size <= 0 || n == 0 || n > flightlock.MaxKeyLen || uint64(len(v)-size) <= n {
		return "", "", false
	}
	key, owner = v[size:size+int(n)], v[size+int(n):]
	if len(owner) > maxOwnerLen {
		return "", "", false
	}
	for i := 0; i < len(owner); i++ {
		if c := owner[i]; c <= ' ' || c == 0x7f {
			return "", "", false // the store keeps owners as space-free text
		}
	}
	return key, owner, true
}

// withIncomingOwners hands the owners of an inbound call's metadata to the locks of ctx
// (flightlock.WithOwner), when the Middleware trusts them; otherwise ctx is returned as is.
// Malformed values are skipped.
func (m *Middleware) withIncomingOwners(ctx context.Context) context.Context {
	if !m.trustOwner {
		return ctx
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vs := md.Get(ownerMetadataKey)
	for i, v := range vs {
		if i == maxHandedOwners {
			break
		}
		if key, owner, ok := decodeOwner(v); ok {
			ctx = flightlock.WithOwner(ctx, key, owner)
		}
	}
	return ctx
}
