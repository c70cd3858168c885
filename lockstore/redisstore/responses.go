package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/lockstore"
)

// The middleware finds a store's name and response store through Describer, at run time.
var _ lockstore.Describer = (*RedisStore)(nil)

// Describe implements lockstore.Describer: "redis", the inspector (on a UniversalClient) and
// the response store, for keys under prefix.
func (s *RedisStore) Describe(prefix string) *lockstore.Backend {
	b := &lockstore.Backend{Name: "redis", Store: s, Prefix: prefix, Responses: &responses{client: s.client, prefix: prefix}}
	if uc, ok := s.client.(redis.UniversalClient); ok {
		b.Inspector = NewInspector(uc, prefix)
	}
	return b
}

// Scripts on the store's client: GET and SET through scripts work on every go-redis client.
var (
	responseGet = redis.NewScript(`return redis.call('GET', KEYS[1])`)
	responseSet = script("saveresponse.lua")
)

// saveBound bounds a save, which runs under the lock uncancelled: a slow Redis must not hold it.
const saveBound = time.Second

// responses keeps share rules' responses in Redis, on the lock store's client.
type responses struct {
	client Client
	prefix string
}

func (s *responses) Load(ctx context.Context, key string) ([]byte, error) {
	v, err := responseGet.Run(ctx, s.client, []string{s.prefix + key}).Text()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return []byte(v), nil
}

// Save stores record under key for ttl, in milliseconds.
func (s *responses) Save(ctx context.Context, key string, record []byte, fence int64, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, saveBound)
	defer cancel()
	return responseSet.Run(ctx, s.client, []string{s.prefix + key}, record, max(ttl.Milliseconds(), 1), fence).Err()
}
